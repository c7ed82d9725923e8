//! Ending a node: the signals that start the shutdown, a second signal that ends the
//! process at once, and the grace deadline that bounds the drain.

use std::future::Future;
use std::time::Duration;

/// How long a node may take to drain (streams ended, proxies stopped, requests finished)
/// after the signal, before it gives up and exits.
pub const GRACE: Duration = Duration::from_secs(30);

/// Completes on SIGINT or SIGTERM. The handlers are installed when this is called (inside
/// the runtime), not when the future is first polled: a node polls it only after its ready
/// line, and a signal sent in between must end it cleanly, not by the signal's default
/// action.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
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

/// Completes on the next SIGINT or SIGTERM from now: during a drain, an operator who will
/// not wait for it sends a second signal, and the node stops draining and returns an error
/// (the binary exits non-zero).
pub(crate) fn second_signal() -> impl Future<Output = ()> + Send + 'static {
    shutdown_signal()
}
