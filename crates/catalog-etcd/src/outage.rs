//! What the etcd tasks share while they retry: one log line when something starts failing
//! and one when it works again, and a sleep that ends with the store.

use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Logs a connection to etcd that keeps failing once when it starts failing (a warning)
/// and once when it works again, not at every retry.
#[derive(Default)]
pub(crate) struct Outage {
    since: Option<std::time::Instant>,
}

impl Outage {
    /// A try failed: warns the first time.
    pub(crate) fn failed(&mut self, what: &str, error: &dyn std::fmt::Display) {
        if self.since.is_none() {
            self.since = Some(std::time::Instant::now());
            warn!(%error, "{what} (reads serve the last applied state; logged again once it works)");
        } else {
            tracing::debug!(%error, "{what}: still failing");
        }
    }

    /// A try worked: says so if it had been failing.
    pub(crate) fn worked(&mut self, what: &str) {
        if let Some(since) = self.since.take() {
            info!(after = ?since.elapsed(), "{what}; working again");
        }
    }
}

/// Sleeps `delay`; true if the store stopped meanwhile.
pub(crate) async fn sleep_or_stop(stop: &CancellationToken, delay: Duration) -> bool {
    tokio::select! {
        () = stop.cancelled() => true,
        () = tokio::time::sleep(delay) => false,
    }
}

/// Maps etcd's error to the store's, saying what was being done.
pub(crate) fn etcd_err(what: impl Into<String>) -> impl FnOnce(etcd_client::Error) -> catalog::StoreError {
    let what = what.into();
    move |source| catalog::StoreError::Etcd {
        what,
        source: Box::new(source),
    }
}
