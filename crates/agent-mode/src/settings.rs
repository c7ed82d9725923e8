//! The agent's settings: flags and config files merged, a flag winning over a file, a file
//! over the default.

use crate::AgentArgs;
use crate::error::StartError;
use ::agent::AgentConfig;
use ::agent::config_file::FileConfig;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Returns a [`StartError::Flags`] with the formatted text.
macro_rules! bail {
    ($($t:tt)*) => {
        return Err(StartError::Flags(format!($($t)*)))
    };
}

fn default_advertise() -> String {
    supervisor::node::private_ips_now()
        .and_then(|ips| ips.into_iter().find(std::net::IpAddr::is_ipv4))
        .map_or_else(|| "127.0.0.1".to_owned(), |ip| ip.to_string())
}

/// A token from a file (an empty file: none). Tokens never come from the command line.
fn read_token(path: Option<&std::path::Path>, flag: &str) -> Result<Option<acl::Token>, StartError> {
    let Some(p) = path else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(p)
        .map_err(|e| StartError::Flags(format!("{flag}: cannot read {}: {e}", p.display())))?;
    Ok(acl::Token::new(text.trim()))
}

/// The servers to join, in order: each `-retry-join` (or config file `retry_join`) value is
/// one address or several, comma-separated.
fn server_list<'a>(values: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    values
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The config files' node metadata with each `-node-meta KEY:VALUE` over it.
fn node_meta(args: &AgentArgs, file: &FileConfig) -> Result<std::collections::BTreeMap<String, String>, StartError> {
    let mut node_meta = file.node_meta.clone();
    for kv in &args.node_meta {
        let Some((k, v)) = kv.split_once(':') else {
            bail!("-node-meta {kv:?}: expected KEY:VALUE");
        };
        node_meta.insert(k.to_owned(), v.to_owned());
    }
    Ok(node_meta)
}

/// The ports sidecars and managed proxies registered without one get: `-sidecar-min-port`
/// and `-sidecar-max-port`, else the config files' `ports`, else Consul's 21000-21255.
fn sidecar_ports(args: &AgentArgs, file: &FileConfig) -> Result<std::ops::RangeInclusive<u16>, StartError> {
    port_range(
        "sidecar",
        (args.sidecar_min_port, args.sidecar_max_port),
        (file.ports.sidecar_min_port, file.ports.sidecar_max_port),
        21000..=21255,
    )
}

/// The ports exposed check listeners get (`Expose.Checks`): `-expose-min-port` and
/// `-expose-max-port`, else the config files' `ports`, else Consul's 21500-21755.
fn expose_ports(args: &AgentArgs, file: &FileConfig) -> Result<std::ops::RangeInclusive<u16>, StartError> {
    port_range(
        "expose",
        (args.expose_min_port, args.expose_max_port),
        (file.ports.expose_min_port, file.ports.expose_max_port),
        agent::expose::EXPOSE_PORTS,
    )
}

/// A port range from `-<what>-min-port`/`-<what>-max-port`, else the files' `ports`, else
/// `default`: not empty, not from 0.
fn port_range(
    what: &str,
    flags: (Option<u16>, Option<u16>),
    file: (Option<u16>, Option<u16>),
    default: std::ops::RangeInclusive<u16>,
) -> Result<std::ops::RangeInclusive<u16>, StartError> {
    let min = flags.0.or(file.0).unwrap_or(*default.start());
    let max = flags.1.or(file.1).unwrap_or(*default.end());
    if min == 0 {
        bail!("-{what}-min-port (config file ports.{what}_min_port) must be a port, not 0");
    }
    if min > max {
        bail!(
            "-{what}-min-port {min} is above -{what}-max-port {max} (or config file ports.{what}_min_port/{what}_max_port): the {what} port range is empty"
        );
    }
    Ok(min..=max)
}

/// Flags and files merged: a flag wins over a file, a file over the default.
pub(crate) struct Settings {
    pub(crate) agent: AgentConfig,
    pub(crate) http_addr: SocketAddr,
    pub(crate) grpc_addr: SocketAddr,
    pub(crate) leave_on_terminate: bool,
    pub(crate) allow_managed_root: bool,
    pub(crate) envoy_binary: Option<PathBuf>,
    pub(crate) file: FileConfig,
}

pub(crate) fn settings(args: &AgentArgs) -> Result<Settings, StartError> {
    let file = FileConfig::load(&args.config_file).map_err(|e| StartError::Flags(::agent::servers::chain(&e)))?;
    let dev = args.dev || file.dev.unwrap_or(false);
    let data_dir: Option<PathBuf> = args.data_dir.clone().or_else(|| file.data_dir.clone());
    match (&data_dir, dev) {
        (None, false) => bail!("one of -data-dir or -dev is required"),
        (Some(_), true) => bail!("-data-dir and -dev exclude each other: -dev keeps state in memory"),
        _ => {}
    }
    let parse_addr =
        |flag: Option<SocketAddr>, from_file: &Option<String>, name: &str, default: &str| match (flag, from_file) {
            (Some(a), _) => Ok(a),
            (None, Some(s)) => s
                .parse()
                .map_err(|_| StartError::Flags(format!("config file {name}: {s:?} is not an address"))),
            (None, None) => default
                .parse()
                .map_err(|e| StartError::Flags(format!("default address {default:?}: {e}"))),
        };
    let http_addr = parse_addr(args.http_addr, &file.http_addr, "http_addr", "127.0.0.1:8500")?;
    let grpc_addr = parse_addr(args.grpc_addr, &file.grpc_addr, "grpc_addr", "127.0.0.1:8502")?;
    let servers = server_list(args.retry_join.iter().chain(&file.retry_join));
    if servers.is_empty() {
        bail!("no server to join: give -retry-join ADDR (a server's HTTP address)");
    }
    let check_allowed_targets = allowed_targets(args, &file)?;
    let agent = AgentConfig {
        node_meta: node_meta(args, &file)?,
        node_id: args.node_id.clone().or_else(|| file.node_id.clone()),
        node: args
            .node
            .clone()
            .or_else(|| file.node.clone())
            .unwrap_or_else(node::host_name),
        datacenter: args
            .datacenter
            .clone()
            .or_else(|| file.datacenter.clone())
            .unwrap_or_else(|| "dc1".into()),
        advertise: args
            .advertise
            .clone()
            .or_else(|| file.advertise.clone())
            .unwrap_or_else(default_advertise),
        data_dir: if dev { None } else { data_dir },
        servers,
        sync: ::agent::SyncConfig {
            full_interval: args.sync_interval,
            ..::agent::SyncConfig::default()
        },
        managed_sidecars: args.managed_sidecars || file.managed_sidecars.unwrap_or(false),
        allow_managed_api_registration: args.allow_managed_api_registration
            || file.allow_managed_api_registration.unwrap_or(false),
        acl: ::agent::acl::AclConfig {
            enabled: args.acl_enabled,
            default_allow: args.acl_default_policy == "allow",
            agent_token: read_token(args.acl_agent_token_file.as_deref(), "-acl-agent-token-file")?,
            default_token: read_token(args.acl_default_token_file.as_deref(), "-acl-default-token-file")?,
        },
        check_allowed_targets,
        sidecar_ports: sidecar_ports(args, &file)?,
        expose_ports: expose_ports(args, &file)?,
        ..AgentConfig::default()
    };
    if args.sync_interval.is_zero() {
        bail!("-sync-interval must be above zero");
    }
    Ok(Settings {
        agent,
        http_addr,
        grpc_addr,
        leave_on_terminate: args.leave_on_terminate.or(file.leave_on_terminate).unwrap_or(true),
        allow_managed_root: args.allow_managed_root || file.allow_managed_root.unwrap_or(false),
        envoy_binary: args.envoy_binary.clone().or_else(|| file.envoy_binary.clone()),
        file,
    })
}

/// `-check-allowed-targets` and the files' `check_allowed_targets`, together.
fn allowed_targets(args: &AgentArgs, file: &FileConfig) -> Result<Vec<::agent::check_targets::Cidr>, StartError> {
    let mut out = Vec::new();
    for list in args.check_allowed_targets.iter().chain(&file.check_allowed_targets) {
        out.extend(
            ::agent::check_targets::Cidr::parse_list(list)
                .map_err(|e| StartError::Flags(format!("-check-allowed-targets: {e}")))?,
        );
    }
    Ok(out)
}
