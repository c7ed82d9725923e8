//! `meshd server` flags.

use clap::Args;
use node::cli::{DnsArgs, Listen, TlsArgs};
use std::path::PathBuf;

/// `meshd server` flags.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// Directory for durable state (required unless -dev or -store etcd).
    #[arg(long = "data-dir", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Where the catalog lives: `embedded` (a log in -data-dir, one server) or `etcd`
    /// (shared by every server on the same etcd and -etcd-prefix).
    #[arg(long = "store", value_name = "KIND", default_value = "embedded", value_parser = store_kind)]
    pub store: String,
    /// etcd client URLs, comma-separated (`-store etcd`).
    #[arg(long = "etcd-endpoints", value_name = "URL[,URL...]", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,
    /// A JSON config file of `services` and `checks` to register on this server's node, as on
    /// an agent (repeatable; re-read on SIGHUP and `PUT /v1/agent/reload`). A server's
    /// settings are flags: any other key is refused.
    #[arg(long = "config-file", value_name = "PATH")]
    pub config_file: Vec<PathBuf>,
    /// Every key meshd keeps in etcd starts with this.
    #[arg(long = "etcd-prefix", value_name = "PREFIX", default_value = "/meshd/")]
    pub etcd_prefix: String,
    /// Lease of this server's registration and leadership in etcd: a dead server's leader
    /// duties move to another within about this long.
    #[arg(long = "etcd-lease-ttl", value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub etcd_lease_ttl: std::time::Duration,
    /// A write etcd has not committed within this long fails (HTTP 500).
    #[arg(long = "etcd-request-timeout", value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
    pub etcd_request_timeout: std::time::Duration,
    /// Operations per etcd transaction at most: etcd's own `--max-txn-ops` (128 unless the
    /// cluster raised it). Larger batches commit more writes per transaction.
    #[arg(long = "etcd-max-txn-ops", value_name = "N", default_value_t = 128, value_parser = clap::value_parser!(u32).range(2..))]
    pub etcd_max_txn_ops: u32,
    /// Address of the plain HTTP API, or `off` (then -https-addr serves the API).
    #[arg(long = "http-addr", value_name = "ADDR|off", default_value = "127.0.0.1:8500")]
    pub http_addr: Listen,
    /// Address of the plain xDS (gRPC) server, or `off` (then -grpc-tls-addr serves xDS).
    #[arg(long = "grpc-addr", value_name = "ADDR|off", default_value = "127.0.0.1:8502")]
    pub grpc_addr: Listen,
    /// Datacenter name.
    #[arg(long = "datacenter", value_name = "DC", default_value = "dc1")]
    pub datacenter: String,
    /// The primary datacenter of a federation (default: this one). A server of another
    /// datacenter sends its state to the primary's servers and copies their list of every
    /// datacenter.
    #[arg(long = "primary-datacenter", value_name = "DC")]
    pub primary_datacenter: Option<String>,
    /// HTTP API addresses (`host:port`) of servers of other datacenters to join through
    /// (any federated server: each knows the primary's servers); comma-separated or
    /// repeated. Needed by a server outside the primary datacenter.
    #[arg(long = "retry-join-wan", value_name = "ADDR", value_delimiter = ',')]
    pub retry_join_wan: Vec<String>,
    /// This server's HTTP API address as other datacenters reach it (`host:port`; default:
    /// the address -http-addr bound).
    #[arg(long = "advertise-wan", value_name = "ADDR")]
    pub advertise_wan: Option<String>,
    /// A file holding the token this server presents to the primary datacenter's servers
    /// (with ACLs there: `operator:write`, to send its state). Secrets are never taken on
    /// the command line.
    #[arg(long = "acl-replication-token-file", value_name = "PATH")]
    pub acl_replication_token_file: Option<PathBuf>,
    /// Keep all state in memory (nothing survives a restart).
    #[arg(long = "dev")]
    pub dev: bool,
    /// This server's node name.
    #[arg(long = "node", value_name = "NAME", default_value_t = node::host_name())]
    pub node: String,
    /// The CA's cluster id (a UUID) when this server creates the CA: the SPIFFE trust
    /// domain is `<id>.consul` (default: a random UUID). A CA that exists with another id is
    /// an error at start: the id cannot change under issued certificates.
    #[arg(long = "ca-cluster-id", value_name = "UUID", value_parser = parse_uuid)]
    pub ca_cluster_id: Option<String>,
    /// This server's node id (a UUID; default: kept in `<data-dir>/node-id`, made at the
    /// first start; a new one every start with `-dev`).
    #[arg(long = "node-id", value_name = "UUID")]
    pub node_id: Option<String>,
    /// Write logs as JSON lines.
    #[arg(long = "log-json")]
    pub log_json: bool,
    /// Log level filter (error, warn, info, debug, trace, or a tracing directive).
    #[arg(long = "log-level", value_name = "LEVEL", default_value = "info")]
    pub log_level: String,
    /// Most xDS streams open at once; more are refused with RESOURCE_EXHAUSTED.
    #[arg(long = "xds-max-streams", value_name = "N", default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub xds_max_streams: u32,
    /// New xDS streams set up per second (a second's worth at once); a reconnect storm is
    /// paced to it.
    #[arg(long = "xds-setup-rate", value_name = "N", default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub xds_setup_rate: u32,
    /// HTTP connections one client address may hold open (0, the default: no limit); past
    /// it a new one gets a 429 and is closed. Off by default on servers: an agent holds one
    /// connection per blocking query it runs, so a busy host needs many.
    #[arg(long = "http-max-conns-per-client", value_name = "N", default_value_t = 0)]
    pub http_max_conns_per_client: u32,
    /// Track each xDS stream's sync status (`/v1/internal/xds-status`, CSDS, stuck-stream
    /// detection); `false` turns it off (to measure its cost).
    #[arg(long = "xds-status-tracking", value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub xds_status_tracking: bool,
    /// A node whose agent sent no heartbeat for this long turns critical (its liveness check).
    #[arg(long = "node-liveness-timeout", value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub node_liveness_timeout: std::time::Duration,
    /// A node critical for this long is removed from the catalog.
    #[arg(long = "node-reap-after", value_name = "DURATION", default_value = "72h", value_parser = humantime::parse_duration)]
    pub node_reap_after: std::time::Duration,
    /// Enforce ACLs: every API request and xDS stream needs a token holding the permission
    /// Consul asks for. Bootstrap the first token with `PUT /v1/acl/bootstrap`.
    #[arg(long = "acl-enabled")]
    pub acl_enabled: bool,
    /// With ACLs on, what no rule decides: allow or deny. Deny is the production setting;
    /// intentions default to it too.
    #[arg(long = "acl-default-policy", value_name = "POLICY", default_value = "allow", value_parser = ["allow", "deny"])]
    pub acl_default_policy: String,
    /// A file holding the secret of a management token to create at start if missing
    /// (Consul's initial management token). Secrets are never taken on the command line.
    #[arg(long = "acl-initial-management-token-file", value_name = "PATH")]
    pub acl_initial_management_token_file: Option<PathBuf>,
    /// Audit records the catalog keeps of accepted write requests, and apart of refused
    /// ones (`docs/audit.md`); past it the oldest of the class go. 0 turns the audit log off.
    #[arg(long = "audit-retention", value_name = "N", default_value_t = structs::audit::DEFAULT_RETENTION)]
    pub audit_retention: usize,
    /// Also append every audit record this server takes to this file (JSON lines, made
    /// durable before the request is answered).
    #[arg(long = "audit-file", value_name = "PATH")]
    pub audit_file: Option<PathBuf>,
    /// The audit file is rotated (`PATH` → `PATH.1` → ...) before it passes this size.
    #[arg(long = "audit-file-rotate-bytes", value_name = "N", default_value_t = 64 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1024..))]
    pub audit_file_rotate_bytes: u64,
    /// Rotated audit files kept (the oldest is deleted).
    #[arg(long = "audit-file-rotate-max-files", value_name = "N", default_value_t = 5)]
    pub audit_file_rotate_max_files: usize,
    /// HTTPS and xDS over TLS.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// The DNS interface.
    #[command(flatten)]
    pub dns: DnsArgs,
}

/// `-store`: `embedded`, or `etcd` in a build with the `etcd` feature (a build without it
/// says so rather than failing later).
fn store_kind(kind: &str) -> Result<String, String> {
    match kind {
        "embedded" => Ok(kind.to_owned()),
        "etcd" if cfg!(feature = "etcd") => Ok(kind.to_owned()),
        "etcd" => Err("this meshd was built without the `etcd` feature (cargo build --features etcd)".to_owned()),
        _ => Err("expected embedded or etcd".to_owned()),
    }
}

/// A UUID flag value, lowercased.
fn parse_uuid(s: &str) -> Result<String, String> {
    uuid::Uuid::parse_str(s)
        .map(|_| s.to_ascii_lowercase())
        .map_err(|_| format!("{s:?} is not a UUID"))
}
