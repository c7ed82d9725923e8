//! The meshd binary's wiring: command line, logging and the mode runners. All logic lives
//! in the library crates; this crate only connects them.

pub mod acl_cli;
#[cfg(feature = "agent")]
pub mod agent;
#[cfg(feature = "server")]
mod balance;
pub mod cli;
#[cfg(any(feature = "server", feature = "agent"))]
pub mod conn_limit;
pub mod connect;
pub mod connect_gateway;
#[cfg(feature = "xds-engine")]
pub mod engine;
#[cfg(feature = "server")]
pub mod forward;
pub mod grpc_bootstrap;
#[cfg(any(feature = "server", feature = "agent"))]
pub mod header_cap;
#[cfg(feature = "tls-listeners")]
pub mod http_serve;
#[cfg(feature = "server")]
pub mod server;
pub mod tls;

/// This host's name (the default node name of servers and agents, as Consul's), or
/// `localhost` when the kernel has none.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Installs the tracing subscriber: human-readable or JSON lines on stderr.
pub fn init_logging(level: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Completes on SIGINT or SIGTERM. The handlers are installed when this is called (inside
/// the runtime), not when the future is first polled: a server polls it only after its ready
/// line, and a signal sent in between must end it cleanly, not by the signal's default
/// action (exit status -15: seen under load by `cargo xtask stress`).
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
    async move {
        let (Ok(mut term), Ok(mut int)) = handlers else {
            // Without signal handlers the process can only be killed; run until then.
            std::future::pending::<()>().await;
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
}
