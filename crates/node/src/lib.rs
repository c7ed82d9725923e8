//! A meshd node, whatever its mode: what a server and an agent both are.
//!
//! - [`cli`]: the flags both modes share (listeners that may be `off`, TLS);
//! - [`tls`], [`conn_limit`], [`http_serve`], [`header_cap`]: the listeners — plain and TLS,
//!   per-client connection limits, header and body deadlines, capped headers;
//! - [`authz`]: authorization over [`acl::TokenResolver`] — the HTTP [`authz::Caller`],
//!   the CSDS guard, the xDS stream authorizer;
//! - [`engine`]: serving xDS (plain and TLS, keepalive, admission) and the engine's metrics;
//! - [`status`]: the engine's status views; [`metrics`]: `/v1/agent/metrics` over the
//!   engine's and the mode's metrics, in Prometheus text or Consul's JSON; [`version`]:
//!   `/v1/agent/version`;
//! - [`mode`]: the [`mode::Mode`] a server or an agent plugs in, and [`mode::serve`], which
//!   runs a node from bound listeners to a drained shutdown;
//! - [`shutdown`]: signals and the grace deadline.
//!
//! The Consul HTTP conventions themselves live in `http-kit`, which the modes' own APIs use
//! too.

pub mod authz;
pub mod cli;
pub mod conn_limit;
pub mod engine;
pub mod first_bytes;
pub mod header_cap;
pub mod host;
pub mod http_serve;
pub mod metrics;
pub mod mode;
pub mod monitor;
pub mod shutdown;
pub mod status;
pub mod tls;
pub mod troubleshoot;
pub mod troubleshoot_handshake;
pub mod troubleshoot_upstream;
pub mod version;

#[cfg(test)]
mod test_tokens;

pub use mode::{Bound, Engine, Listeners, Mode, ModeError, bind, serve};
pub use shutdown::shutdown_signal;

/// This host's name (the default node name of servers and agents, as Consul's), or
/// `localhost` when the kernel has none.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Installs the tracing subscriber: human-readable or JSON lines on stderr, at `level`, and
/// the feed of `/v1/agent/monitor` ([`monitor`]), at the level its watchers ask for.
pub fn init_logging(level: &str, json: bool) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let registry = tracing_subscriber::registry().with(monitor::MonitorLayer.with_filter(monitor::filter()));
    if json {
        registry.with(stderr.json().with_filter(filter)).init();
    } else {
        registry.with(stderr.with_filter(filter)).init();
    }
}
