//! Command line: Consul-style flags (`-data-dir`, single dash) as well as `--data-dir`.

#[cfg(feature = "agent")]
pub use agent_mode::AgentArgs;
use clap::{Args, Parser, Subcommand};
pub use node::cli::{Listen, TlsArgs};
#[cfg(feature = "server")]
pub use server_mode::ServerArgs;
use std::{net::SocketAddr, path::PathBuf};

/// A token flag's value: none when empty.
fn flag_token(value: &str) -> Result<Option<structs::Token>, std::convert::Infallible> {
    Ok(structs::Token::new(value))
}

/// meshd: a service-mesh control plane.
#[derive(Debug, Parser)]
#[command(name = "meshd", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a server: the catalog, the built-in CA, the HTTP API and the xDS server.
    #[cfg(feature = "server")]
    Server(Box<ServerArgs>),
    /// Run an agent: local services and checks, synced to the servers; the local HTTP API; xDS and managed proxies for this host.
    #[cfg(feature = "agent")]
    Agent(Box<AgentArgs>),
    /// Connect proxies to the mesh.
    #[command(subcommand)]
    Connect(ConnectCommand),
    /// Make a CA and certificates for the HTTPS API and xDS over TLS.
    #[command(subcommand)]
    Tls(TlsCommand),
    /// Bootstrap ACLs, create policies and tokens (over the HTTP API).
    #[command(subcommand)]
    Acl(AclCommand),
    /// Save the whole catalog to a snapshot archive, restore one, or inspect one.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Write or delete config entries, or see first what a write would change (`-dry-run`).
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Find what is wrong with a proxy.
    #[command(subcommand)]
    Troubleshoot(TroubleshootCommand),
    /// Peer with another cluster: generate a token, establish with one, list, read, delete.
    #[command(subcommand)]
    Peering(PeeringCommand),
}

/// `meshd peering` subcommands.
#[derive(Debug, Subcommand)]
pub enum PeeringCommand {
    /// Generate a token another cluster establishes a peering with (printed on stdout, or
    /// written to `-out` with mode 0600: it holds a secret).
    GenerateToken(PeeringTokenArgs),
    /// Establish a peering with the token another cluster generated (read from a file, never
    /// from the command line).
    Establish(PeeringEstablishArgs),
    /// List the peerings.
    List(PeeringListArgs),
    /// Show one peering.
    Read(PeeringNameArgs),
    /// Delete a peering (the peer is told; what it exported is removed).
    Delete(PeeringNameArgs),
}

/// `meshd peering generate-token` flags.
#[derive(Debug, Clone, Args)]
pub struct PeeringTokenArgs {
    /// The API and the token to act with (`peering:write`).
    #[command(flatten)]
    pub api: ApiArgs,
    /// The name this cluster gives the peer.
    #[arg(long = "name", value_name = "NAME")]
    pub name: String,
    /// Metadata of the peering (`KEY=VALUE`), repeated.
    #[arg(long = "meta", value_name = "KEY=VALUE")]
    pub meta: Vec<String>,
    /// Addresses (`host:port`) the peer dials instead of the servers' own, comma-separated or
    /// repeated.
    #[arg(long = "server-external-addresses", value_name = "ADDR", value_delimiter = ',')]
    pub server_external_addresses: Vec<String>,
    /// Write the token to this file (mode 0600) instead of stdout.
    #[arg(long = "out", value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// `meshd peering establish` flags.
#[derive(Debug, Clone, Args)]
pub struct PeeringEstablishArgs {
    /// The API and the token to act with (`peering:write`).
    #[command(flatten)]
    pub api: ApiArgs,
    /// The name this cluster gives the peer.
    #[arg(long = "name", value_name = "NAME")]
    pub name: String,
    /// A file holding the peer's peering token (`-` for stdin).
    #[arg(long = "peering-token-file", value_name = "FILE")]
    pub peering_token_file: PathBuf,
    /// Metadata of the peering (`KEY=VALUE`), repeated.
    #[arg(long = "meta", value_name = "KEY=VALUE")]
    pub meta: Vec<String>,
}

/// `meshd peering list` flags.
#[derive(Debug, Clone, Args)]
pub struct PeeringListArgs {
    /// The API and the token to act with (`peering:read`).
    #[command(flatten)]
    pub api: ApiArgs,
    /// Print JSON (Consul's shape).
    #[arg(long = "json")]
    pub json: bool,
}

/// `meshd peering read|delete` flags.
#[derive(Debug, Clone, Args)]
pub struct PeeringNameArgs {
    /// The API and the token to act with (`peering:read` to read, `peering:write` to delete).
    #[command(flatten)]
    pub api: ApiArgs,
    /// The peering's name.
    #[arg(long = "name", value_name = "NAME")]
    pub name: String,
    /// Print JSON (Consul's shape; `read` only).
    #[arg(long = "json")]
    pub json: bool,
}

/// `meshd troubleshoot` subcommands.
#[derive(Debug, Subcommand)]
pub enum TroubleshootCommand {
    /// Compare what an Envoy runs with what meshd sent it: rejected or stale configuration,
    /// clusters with no healthy endpoint, certificates about to expire; what is wrong first.
    Proxy(TroubleshootProxyArgs),
    /// Walk a request as a proxy would carry it to an upstream — listener, route, split,
    /// target, healthy instances, certificates, the intention at the destination — and say
    /// at which step it fails.
    Upstream(TroubleshootUpstreamArgs),
}

/// `meshd troubleshoot upstream` flags.
#[derive(Debug, Clone, Args)]
pub struct TroubleshootUpstreamArgs {
    /// The meshd (agent or server) serving the proxy, and the token to ask it with
    /// (`operator:read`, and `intentions:read` on the destination).
    #[command(flatten)]
    pub api: ApiArgs,
    /// The proxy's id (`web-sidecar-proxy`).
    #[arg(long = "proxy-id", value_name = "ID")]
    pub proxy_id: String,
    /// The upstream (its destination name).
    #[arg(long = "upstream", value_name = "NAME")]
    pub upstream: String,
    /// The request's path (HTTP upstreams).
    #[arg(long = "path", value_name = "PATH", default_value = "/")]
    pub path: String,
    /// The request's method.
    #[arg(long = "method", value_name = "METHOD", default_value = "GET")]
    pub method: String,
    /// A request header (`NAME=VALUE`), repeated.
    #[arg(long = "header", value_name = "NAME=VALUE")]
    pub header: Vec<String>,
    /// Print the walk as JSON.
    #[arg(long = "json")]
    pub json: bool,
}

/// `meshd troubleshoot proxy` flags.
#[derive(Debug, Clone, Args)]
pub struct TroubleshootProxyArgs {
    /// The meshd (agent or server) serving the proxy, and the token to ask it with
    /// (`operator:read`).
    #[command(flatten)]
    pub api: ApiArgs,
    /// The Envoy's admin address (`host:port`).
    #[arg(long = "envoy-admin", value_name = "ADDR")]
    pub envoy_admin: String,
    /// The proxy's id (default: the node id Envoy reports).
    #[arg(long = "proxy-id", value_name = "ID")]
    pub proxy_id: Option<String>,
    /// Print the findings as JSON.
    #[arg(long = "json")]
    pub json: bool,
}

/// `meshd config` subcommands.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Write the config entry in FILE (JSON).
    Write(ConfigWriteArgs),
    /// Delete a config entry.
    Delete(ConfigDeleteArgs),
}

/// `meshd config write` flags.
#[derive(Debug, Clone, Args)]
pub struct ConfigWriteArgs {
    /// The API and the token to act with.
    #[command(flatten)]
    pub api: ApiArgs,
    /// Write nothing: check the entry as the write would and print the proxies whose
    /// resources would change, and how.
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    /// Print a dry run's answer as the API's JSON.
    #[arg(long = "json")]
    pub json: bool,
    /// Only if the entry's ModifyIndex is this (0: only if it does not exist).
    #[arg(long = "cas", value_name = "INDEX")]
    pub cas: Option<u64>,
    /// The entry (JSON; `-` reads standard input).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

/// `meshd config delete` flags.
#[derive(Debug, Clone, Args)]
pub struct ConfigDeleteArgs {
    /// The API and the token to act with.
    #[command(flatten)]
    pub api: ApiArgs,
    /// The entry's kind.
    #[arg(long = "kind", value_name = "KIND")]
    pub kind: String,
    /// The entry's name.
    #[arg(long = "name", value_name = "NAME")]
    pub name: String,
    /// Delete nothing: print the proxies whose resources would change, and how.
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    /// Print a dry run's answer as the API's JSON.
    #[arg(long = "json")]
    pub json: bool,
}

/// `meshd snapshot` subcommands.
#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Save a snapshot of the servers' state to FILE (mode 0600: it holds private keys).
    Save(SnapshotSaveArgs),
    /// Restore the servers' state from the snapshot in FILE (verified first).
    Restore(SnapshotFileArgs),
    /// Verify the snapshot in FILE and print what it holds (no server needed).
    Inspect(SnapshotInspectArgs),
}

/// `meshd snapshot save` flags.
#[derive(Debug, Clone, Args)]
pub struct SnapshotSaveArgs {
    /// The API and the token to act with.
    #[command(flatten)]
    pub api: ApiArgs,
    /// Take the answering server's state without catching up with the others first.
    #[arg(long = "stale")]
    pub stale: bool,
    /// Where to write the archive.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

/// `meshd snapshot restore` flags.
#[derive(Debug, Clone, Args)]
pub struct SnapshotFileArgs {
    /// The API and the token to act with.
    #[command(flatten)]
    pub api: ApiArgs,
    /// The archive.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

/// `meshd snapshot inspect` flags.
#[derive(Debug, Clone, Args)]
pub struct SnapshotInspectArgs {
    /// The archive.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

/// `meshd acl` subcommands.
#[derive(Debug, Subcommand)]
pub enum AclCommand {
    /// The first management token (once): prints its AccessorID and SecretID.
    Bootstrap(ApiArgs),
    /// Policies.
    #[command(subcommand)]
    Policy(AclPolicyCommand),
    /// Tokens.
    #[command(subcommand)]
    Token(AclTokenCommand),
}

/// What every command over the HTTP API (`meshd acl`, `meshd snapshot`) takes.
#[derive(Debug, Clone, Args)]
pub struct ApiArgs {
    /// The HTTP API (`host:port`, `http://` or `https://`).
    #[arg(long = "http-addr", value_name = "ADDR", default_value = "127.0.0.1:8500")]
    pub http_addr: String,
    /// The token to act with, from this file (default: `CONSUL_HTTP_TOKEN`).
    #[arg(long = "token-file", value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// The CA that verifies an `https://` API.
    #[arg(long = "ca-file", value_name = "PATH")]
    pub ca_file: Option<PathBuf>,
}

/// `meshd acl policy` subcommands.
#[derive(Debug, Subcommand)]
pub enum AclPolicyCommand {
    /// Create a policy.
    Create(AclPolicyCreateArgs),
}

/// `meshd acl policy create` flags.
#[derive(Debug, Clone, Args)]
pub struct AclPolicyCreateArgs {
    /// The API and the token to act with.
    #[command(flatten)]
    pub common: ApiArgs,
    /// The policy's name.
    #[arg(long = "name", value_name = "NAME", default_value = "")]
    pub name: String,
    /// Its description.
    #[arg(long = "description", value_name = "TEXT", default_value = "")]
    pub description: String,
    /// Its rules (HCL or JSON), or `@PATH` to read them from a file.
    #[arg(long = "rules", value_name = "RULES", default_value = "")]
    pub rules: String,
}

/// `meshd acl token` subcommands.
#[derive(Debug, Subcommand)]
pub enum AclTokenCommand {
    /// Create a token: prints its AccessorID and SecretID.
    Create(AclTokenCreateArgs),
}

/// `meshd acl token create` flags.
#[derive(Debug, Clone, Args)]
pub struct AclTokenCreateArgs {
    /// The API and the token to act with.
    #[command(flatten)]
    pub common: ApiArgs,
    /// A policy to link, by name; repeatable.
    #[arg(long = "policy-name", value_name = "NAME")]
    pub policy_name: Vec<String>,
    /// A role to link, by name; repeatable.
    #[arg(long = "role-name", value_name = "NAME")]
    pub role_name: Vec<String>,
    /// A service identity; repeatable.
    #[arg(long = "service-identity", value_name = "SERVICE")]
    pub service_identity: Vec<String>,
    /// A node identity, `NODE:DATACENTER`; repeatable.
    #[arg(long = "node-identity", value_name = "NODE:DC")]
    pub node_identity: Vec<String>,
    /// Its description.
    #[arg(long = "description", value_name = "TEXT", default_value = "")]
    pub description: String,
    /// How long it lives (1m to 24h; default: until deleted).
    #[arg(long = "expires-ttl", value_name = "DURATION")]
    pub expires_ttl: Option<String>,
}

/// `meshd connect` subcommands.
#[derive(Debug, Subcommand)]
pub enum ConnectCommand {
    /// Run Envoy for a proxy and keep it running (hot restart on SIGHUP when the bootstrap
    /// changed, drain on SIGTERM); `-exec` replaces this process instead, `-bootstrap` prints.
    Envoy(Box<EnvoyArgs>),
    /// Print the xDS bootstrap of a proxyless gRPC client (`GRPC_XDS_BOOTSTRAP`) of a
    /// connect-native service and write its certificates (to -cert-dir, or a private
    /// directory under the temp dir); with -watch keep them current.
    GrpcBootstrap(Box<GrpcBootstrapArgs>),
    /// Install (or with -remove delete) the NAT rules that send a network namespace's TCP
    /// traffic through its transparent sidecar: an nftables table, written over netlink.
    RedirectTraffic(Box<RedirectTrafficArgs>),
}

/// `meshd connect redirect-traffic` flags (Consul's names).
#[derive(Debug, Clone, Args)]
pub struct RedirectTrafficArgs {
    /// The agent's API and the token to read the sidecar's registration with.
    #[command(flatten)]
    pub api: ApiArgs,
    /// The sidecar whose ports to use (its registration at the agent).
    #[arg(long = "proxy-id", value_name = "ID")]
    pub proxy_id: Option<String>,
    /// The user the proxy runs as: its traffic is never redirected.
    #[arg(long = "proxy-uid", value_name = "UID")]
    pub proxy_uid: Option<u32>,
    /// The proxy's public listener port, instead of the registration's.
    #[arg(long = "proxy-inbound-port", value_name = "PORT")]
    pub proxy_inbound_port: Option<u16>,
    /// The proxy's outbound listener port (default: the registration's, else 15001).
    #[arg(long = "proxy-outbound-port", value_name = "PORT")]
    pub proxy_outbound_port: Option<u16>,
    /// An inbound port to leave alone (repeatable).
    #[arg(long = "exclude-inbound-port", value_name = "PORT")]
    pub exclude_inbound_ports: Vec<u16>,
    /// An outbound destination port to leave alone (repeatable).
    #[arg(long = "exclude-outbound-port", value_name = "PORT")]
    pub exclude_outbound_ports: Vec<u16>,
    /// An outbound destination network to leave alone, `A.B.C.D/N` (repeatable).
    #[arg(long = "exclude-outbound-cidr", value_name = "CIDR")]
    pub exclude_outbound_cidrs: Vec<redirect::Ipv4Cidr>,
    /// A user whose traffic to leave alone (repeatable).
    #[arg(long = "exclude-uid", value_name = "UID")]
    pub exclude_uids: Vec<u32>,
    /// Send DNS (port 53) to meshd's DNS interface at this address.
    #[arg(long = "consul-dns-ip", value_name = "IP")]
    pub dns_ip: Option<std::net::Ipv4Addr>,
    /// The port of meshd's DNS interface.
    #[arg(long = "consul-dns-port", value_name = "PORT", default_value_t = 8600)]
    pub dns_port: u16,
    /// The network namespace to act in (`/var/run/netns/NAME`, `/proc/PID/ns/net`).
    #[arg(long = "netns", value_name = "PATH")]
    pub netns: Option<PathBuf>,
    /// Remove the rules instead.
    #[arg(long = "remove")]
    pub remove: bool,
}

/// `meshd connect grpc-bootstrap` flags.
#[derive(Debug, Clone, Args)]
pub struct GrpcBootstrapArgs {
    /// The connect-native service whose instance the client is.
    #[arg(long = "service", value_name = "NAME")]
    pub service: String,
    /// The instance's id, when the service has several connect-native instances.
    #[arg(long = "service-id", value_name = "ID")]
    pub service_id: Option<String>,
    /// The instance's catalog node, when the service has instances on several nodes.
    #[arg(long = "node", value_name = "NAME", default_value = "")]
    pub node: String,
    /// HTTP API of the local agent, or of a server.
    #[arg(long = "http-addr", value_name = "ADDR", default_value = "127.0.0.1:8500")]
    pub http_addr: SocketAddr,
    /// xDS servers the client connects to (comma-separated or repeated).
    #[arg(
        long = "grpc-addr",
        value_name = "ADDR",
        default_value = "127.0.0.1:8502",
        value_delimiter = ','
    )]
    pub grpc_addr: Vec<String>,
    /// A file holding the client's ACL token (it goes into the bootstrap's node metadata).
    #[arg(long = "token-file", value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// Where the service's leaf certificate, key and the CA bundle are written; the
    /// bootstrap's certificate provider reads them (every cluster meshd sends names it, and
    /// gRPC refuses clusters naming a provider its bootstrap lacks). Default:
    /// `$TMPDIR/meshd-grpc-<uid>/<instance id>` (each level mode 0700, this user's only).
    #[arg(long = "cert-dir", value_name = "DIR")]
    pub cert_dir: Option<PathBuf>,
    /// Keep running and rewrite the files of -cert-dir when the leaf or the roots change.
    #[arg(long = "watch")]
    pub watch: bool,
    /// Write the bootstrap to this file (mode 0600) instead of stdout.
    #[arg(long = "output", value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Log level filter (with -watch).
    #[arg(long = "log-level", value_name = "LEVEL", default_value = "info")]
    pub log_level: String,
}

/// `meshd connect envoy` flags.
#[derive(Debug, Clone, Args)]
pub struct EnvoyArgs {
    /// The proxy's service instance id.
    #[arg(long = "proxy-id", value_name = "ID", conflicts_with = "sidecar_for")]
    pub proxy_id: Option<String>,
    /// Find the sidecar proxy registered for this service.
    #[arg(long = "sidecar-for", value_name = "SERVICE", conflicts_with = "gateway")]
    pub sidecar_for: Option<String>,
    /// Run a gateway of this kind (`ingress`, `terminating`, `mesh` or `api`) instead of a
    /// sidecar; the gateway service is named by -service (for `mesh`, `mesh-gateway` by
    /// default).
    #[arg(long = "gateway", value_name = "KIND", value_parser = ["ingress", "terminating", "mesh", "api"])]
    pub gateway: Option<String>,
    /// The gateway service's name (and, without -proxy-id, its id).
    #[arg(long = "service", value_name = "NAME", requires = "gateway")]
    pub service: Option<String>,
    /// Register the gateway service first (with the agent at -http-addr, or in the catalog of
    /// the server there on -node).
    #[arg(long = "register", requires = "gateway")]
    pub register: bool,
    /// The gateway's address for -register, `HOST:PORT`.
    #[arg(long = "address", value_name = "HOST:PORT", requires = "register")]
    pub address: Option<String>,
    /// A mesh gateway's address as other datacenters reach it, `HOST:PORT`, for -register
    /// (its `wan` tagged address; default: -address).
    #[arg(long = "wan-address", value_name = "HOST:PORT", requires = "register")]
    pub wan_address: Option<String>,
    /// The catalog node of the proxy (found through the API when -sidecar-for is used).
    #[arg(long = "node", value_name = "NAME", default_value = "")]
    pub node: String,
    /// HTTP API of the local agent, or of a server (to look the proxy up).
    #[arg(long = "http-addr", value_name = "ADDR", default_value = "127.0.0.1:8500")]
    pub http_addr: SocketAddr,
    /// xDS address Envoy connects to: `host:port` (plaintext), or `https://host:port` for
    /// xDS over TLS (with -grpc-ca-file). Several servers: comma-separated or the flag
    /// repeated, all plaintext or all `https://`; Envoy moves to another when one fails.
    #[arg(
        long = "grpc-addr",
        value_name = "ADDR",
        default_value = "127.0.0.1:8502",
        value_delimiter = ','
    )]
    pub grpc_addr: Vec<GrpcAddr>,
    /// The CA (PEM) Envoy trusts for xDS over TLS; it is put in the bootstrap.
    #[arg(long = "grpc-ca-file", value_name = "PATH")]
    pub grpc_ca_file: Option<PathBuf>,
    /// Serve Envoy's metrics in Prometheus' format at `http://ADDR/metrics` (Consul's
    /// `envoy_prometheus_bind_addr`), forwarded from the admin interface (with -admin-bind,
    /// a fixed port).
    #[arg(long = "prometheus-bind", value_name = "ADDR")]
    pub prometheus_bind: Option<SocketAddr>,
    /// Put Envoy's admin interface on TCP at this address, for debugging or tools that need
    /// it: whoever reaches it can stop Envoy (`POST /quitquitquit`) or read its config. By
    /// default it is a Unix socket only this user can use, `admin.sock` in -run-dir.
    #[arg(long = "admin-bind", value_name = "ADDR")]
    pub admin_bind: Option<SocketAddr>,
    /// ACL token for the proxy's xDS stream (default, and for `-token ""`:
    /// `CONNECT_PROXY_TOKEN` from the environment, as a managed proxy gets it).
    // Spelled out so clap treats it as a value (`""` is none), not as an optional flag.
    #[arg(
        long = "token",
        value_name = "TOKEN",
        default_value = "",
        value_parser = flag_token,
        conflicts_with = "token_file"
    )]
    pub token: ::std::option::Option<structs::Token>,
    /// Read the token from this file (re-read when it changes, and on SIGHUP).
    #[arg(long = "token-file", value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// Print the bootstrap and exit instead of running Envoy.
    #[arg(long = "bootstrap")]
    pub bootstrap: bool,
    /// Replace this process with Envoy instead of supervising it.
    #[arg(long = "exec", conflicts_with = "bootstrap")]
    pub exec: bool,
    /// Hot restart base id (default: derived from the proxy id and admin address).
    #[arg(long = "base-id", value_name = "N")]
    pub base_id: Option<u32>,
    /// How long Envoy drains on SIGTERM and during a hot restart.
    #[arg(long = "drain-time", value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
    pub drain_time: std::time::Duration,
    /// When the parent of a hot restart is told to exit.
    #[arg(long = "parent-shutdown-time", value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub parent_shutdown_time: std::time::Duration,
    /// Directory for Envoy's admin socket, hot-restart sockets, bootstraps and admin address
    /// files (default: a private temporary directory, removed on exit when supervised; at
    /// most 63 bytes long).
    #[arg(long = "run-dir", value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// Log level filter for the supervisor.
    #[arg(long = "log-level", value_name = "LEVEL", default_value = "info")]
    pub log_level: String,
    /// The Envoy binary to run: a path, or a name looked up in `PATH`.
    #[arg(long = "envoy-binary", value_name = "PATH", default_value = "envoy")]
    pub envoy_binary: PathBuf,
    /// Envoy's log level (its `-l`); an `-l` or `--log-level` among the arguments after `--`
    /// wins.
    #[arg(long = "envoy-log-level", value_name = "LEVEL", default_value = "warn",
          value_parser = ["trace", "debug", "info", "warn", "warning", "error", "critical", "off"])]
    pub envoy_log_level: String,
    /// Extra arguments for Envoy (after `--`).
    #[arg(last = true, value_name = "ENVOY_ARGS")]
    pub envoy_args: Vec<String>,
}

/// Where Envoy reaches xDS: `host:port` or `http://host:port` (plaintext), `https://host:port`
/// (TLS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcAddr {
    /// Over TLS.
    pub tls: bool,
    /// Host name or IP address (without brackets).
    pub host: String,
    /// Port.
    pub port: u16,
}

impl std::str::FromStr for GrpcAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (tls, rest) = if let Some(rest) = s.strip_prefix("https://") {
            (true, rest)
        } else {
            (false, s.strip_prefix("http://").unwrap_or(s))
        };
        let rest = rest.trim_end_matches('/');
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| format!("{s:?}: expected host:port or https://host:port"))?;
        let port: u16 = port.parse().map_err(|_| format!("{s:?}: {port:?} is not a port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || host.contains(['/', '@', '?', '#']) {
            return Err(format!("{s:?}: expected host:port or https://host:port"));
        }
        Ok(Self {
            tls,
            host: host.to_owned(),
            port,
        })
    }
}

impl std::fmt::Display for GrpcAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "https://" } else { "" };
        if self.host.contains(':') {
            write!(f, "{scheme}[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{scheme}{}:{}", self.host, self.port)
        }
    }
}

/// `meshd tls` subcommands (after `consul tls`).
#[derive(Debug, Subcommand)]
pub enum TlsCommand {
    /// The certificate authority.
    #[command(subcommand)]
    Ca(TlsCaCommand),
    /// Server and client certificates signed by the CA.
    #[command(subcommand)]
    Cert(TlsCertCommand),
}

/// `meshd tls ca` subcommands.
#[derive(Debug, Subcommand)]
pub enum TlsCaCommand {
    /// Create a CA: `<domain>-agent-ca.pem` and `<domain>-agent-ca-key.pem`.
    Create(TlsCaCreateArgs),
}

/// `meshd tls cert` subcommands.
#[derive(Debug, Subcommand)]
pub enum TlsCertCommand {
    /// Create a certificate signed by the CA: `<dc>-server-<domain>-N.pem` (or `client`) and
    /// its `-key.pem`, N the first free index.
    Create(TlsCertCreateArgs),
}

/// `meshd tls ca create` flags.
#[derive(Debug, Clone, Args)]
pub struct TlsCaCreateArgs {
    /// Directory the files are written to.
    #[arg(long = "dir", value_name = "DIR", default_value = ".")]
    pub dir: PathBuf,
    /// Domain of the certificates (file names, the CA's name).
    #[arg(long = "domain", value_name = "DOMAIN", default_value = "meshd")]
    pub domain: String,
    /// Days the CA is valid.
    #[arg(long = "days", value_name = "N", default_value_t = 1825, value_parser = clap::value_parser!(u32).range(1..))]
    pub days: u32,
}

/// `meshd tls cert create` flags.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("kind").required(true).args(["server", "client"])))]
pub struct TlsCertCreateArgs {
    /// A server certificate: names `server.<dc>.<domain>`, `localhost`, `127.0.0.1`.
    #[arg(long = "server")]
    pub server: bool,
    /// A client certificate: names `client.<dc>.<domain>`, `localhost`, `127.0.0.1`.
    #[arg(long = "client")]
    pub client: bool,
    /// Datacenter.
    #[arg(long = "dc", value_name = "DC", default_value = "dc1")]
    pub dc: String,
    /// Domain (as in the CA's file names).
    #[arg(long = "domain", value_name = "DOMAIN", default_value = "meshd")]
    pub domain: String,
    /// The CA certificate (default: `<domain>-agent-ca.pem` in -dir).
    #[arg(long = "ca", value_name = "PATH")]
    pub ca: Option<PathBuf>,
    /// The CA's key (default: `<domain>-agent-ca-key.pem` in -dir).
    #[arg(long = "key", value_name = "PATH")]
    pub key: Option<PathBuf>,
    /// Another DNS name in the certificate (repeatable).
    #[arg(long = "additional-dnsname", value_name = "NAME")]
    pub additional_dnsname: Vec<String>,
    /// Another IP address in the certificate (repeatable).
    #[arg(long = "additional-ipaddress", value_name = "IP")]
    pub additional_ipaddress: Vec<std::net::IpAddr>,
    /// Days the certificate is valid.
    #[arg(long = "days", value_name = "N", default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..))]
    pub days: u32,
    /// Directory the files are written to.
    #[arg(long = "dir", value_name = "DIR", default_value = ".")]
    pub dir: PathBuf,
}

/// Rewrites Consul's single-dash long flags (`-data-dir=x`, `-dev`) to clap's `--` form.
/// Single letters, `--flag`, bare `-` and values (anything not starting with `-`) are left
/// alone; so is everything after a `--` separator.
pub fn normalize_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut passthrough = false;
    for arg in args {
        if passthrough || arg == "--" {
            passthrough = true;
            out.push(arg);
            continue;
        }
        let is_single_dash_long = arg.starts_with('-')
            && !arg.starts_with("--")
            && arg.len() > 2
            && arg.as_bytes().get(1).is_some_and(u8::is_ascii_alphabetic);
        out.push(if is_single_dash_long { format!("-{arg}") } else { arg });
    }
    out
}

#[cfg(test)]
mod tests;
