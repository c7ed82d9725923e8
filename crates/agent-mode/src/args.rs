//! `meshd agent` flags.

use clap::Args;
use node::cli::{DnsArgs, TlsArgs};
use std::net::SocketAddr;
use std::path::PathBuf;

/// `meshd agent` flags. Unset flags fall back to the config files, then to the defaults.
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// Node name (default: the host name).
    #[arg(long = "node", value_name = "NAME")]
    pub node: Option<String>,
    /// Directory for persisted registrations (required unless -dev).
    #[arg(long = "data-dir", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Keep registrations in memory only.
    #[arg(long = "dev")]
    pub dev: bool,
    /// A server's HTTP address, or several comma-separated (repeatable; the agent fails over
    /// between them in order).
    #[arg(long = "retry-join", value_name = "ADDR")]
    pub retry_join: Vec<String>,
    /// Address of the agent's HTTP API (default 127.0.0.1:8500).
    #[arg(long = "http-addr", value_name = "ADDR")]
    pub http_addr: Option<SocketAddr>,
    /// Address of the agent's gRPC (xDS) server (default 127.0.0.1:8502; served from part 2).
    #[arg(long = "grpc-addr", value_name = "ADDR")]
    pub grpc_addr: Option<SocketAddr>,
    /// Datacenter (default dc1).
    #[arg(long = "datacenter", value_name = "DC")]
    pub datacenter: Option<String>,
    /// The node's address in the catalog (default: the first private IP, else 127.0.0.1).
    #[arg(long = "advertise", value_name = "ADDR")]
    pub advertise: Option<String>,
    /// The node's id in the catalog, a UUID (default: the one kept in the data dir, made at
    /// the first start; with `-dev`, a new one each start).
    #[arg(long = "node-id", value_name = "UUID")]
    pub node_id: Option<String>,
    /// Node metadata in the catalog, `KEY:VALUE` (repeatable).
    #[arg(long = "node-meta", value_name = "KEY:VALUE")]
    pub node_meta: Vec<String>,
    /// A JSON config file: settings plus `services` and `checks` (repeatable; re-read on SIGHUP).
    #[arg(long = "config-file", value_name = "PATH")]
    pub config_file: Vec<PathBuf>,
    /// Log level filter (default info).
    #[arg(long = "log-level", value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Write logs as JSON lines.
    #[arg(long = "log-json")]
    pub log_json: bool,
    /// Longest time between anti-entropy full syncs (jittered down by up to a quarter).
    #[arg(long = "sync-interval", value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration)]
    pub sync_interval: std::time::Duration,
    /// Deregister the node from the catalog on SIGINT/SIGTERM (default true).
    #[arg(long = "leave-on-terminate", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub leave_on_terminate: Option<bool>,
    /// Most xDS streams open at once; more are refused with RESOURCE_EXHAUSTED.
    #[arg(long = "xds-max-streams", value_name = "N", default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub xds_max_streams: u32,
    /// New xDS streams set up per second (a second's worth at once); a reconnect storm is
    /// paced to it.
    #[arg(long = "xds-setup-rate", value_name = "N", default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub xds_setup_rate: u32,
    /// HTTP connections one client address may hold open (0: no limit); past it a new one
    /// gets a 429 and is closed (Consul's `http_max_conns_per_client`).
    #[arg(long = "http-max-conns-per-client", value_name = "N", default_value_t = 200)]
    pub http_max_conns_per_client: u32,
    /// Run the sidecars of `Connect.SidecarService` registrations as managed proxies (Consul
    /// 1.4's `Connect.Proxy` registrations always are).
    #[arg(long = "managed-sidecars")]
    pub managed_sidecars: bool,
    /// Run managed proxies even when the agent runs as root.
    #[arg(long = "allow-managed-root")]
    pub allow_managed_root: bool,
    /// Accept a managed proxy's `Connect.Proxy.Command` from the HTTP API (anyone who can
    /// reach the API could otherwise make the agent run a program); config files may always
    /// set one.
    #[arg(long = "allow-managed-api-registration")]
    pub allow_managed_api_registration: bool,
    /// The Envoy binary managed proxies run (default: `envoy` from `PATH`).
    #[arg(long = "envoy-binary", value_name = "PATH")]
    pub envoy_binary: Option<PathBuf>,
    /// CIDR blocks that HTTP and TCP checks registered through the API may probe besides
    /// their service's own address and port, comma-separated (repeatable; default none).
    #[arg(long = "check-allowed-targets", value_name = "CIDR[,CIDR]")]
    pub check_allowed_targets: Vec<String>,
    /// Lowest port a sidecar or managed proxy registered without one gets (default 21000).
    /// Agents sharing a host each need a range of their own.
    #[arg(long = "sidecar-min-port", value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub sidecar_min_port: Option<u16>,
    /// Highest such port (default 21255).
    #[arg(long = "sidecar-max-port", value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub sidecar_max_port: Option<u16>,
    /// Lowest port a sidecar's exposed check listener gets (`Expose.Checks`; default 21500).
    /// Agents sharing a host each need a range of their own.
    #[arg(long = "expose-min-port", value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub expose_min_port: Option<u16>,
    /// Highest such port (default 21755).
    #[arg(long = "expose-max-port", value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub expose_max_port: Option<u16>,
    /// Enforce ACLs on this agent's endpoints and xDS streams (as its servers do).
    #[arg(long = "acl-enabled")]
    pub acl_enabled: bool,
    /// With ACLs on, what no rule decides: allow or deny (set it as the servers do).
    #[arg(long = "acl-default-policy", value_name = "POLICY", default_value = "allow", value_parser = ["allow", "deny"])]
    pub acl_default_policy: String,
    /// A file holding the agent's own token (anti-entropy of the node, its reads).
    #[arg(long = "acl-agent-token-file", value_name = "PATH")]
    pub acl_agent_token_file: Option<PathBuf>,
    /// A file holding the token of requests that name none.
    #[arg(long = "acl-default-token-file", value_name = "PATH")]
    pub acl_default_token_file: Option<PathBuf>,
    /// HTTPS and xDS over TLS; the CA also verifies `https://` servers of -retry-join.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// The DNS interface.
    #[command(flatten)]
    pub dns: DnsArgs,
}
