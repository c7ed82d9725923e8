//! Leader work: removing rotated-out CA roots once no leaf they signed can still be valid.
//!
//! A rotation keeps the previous root, inactive, so that leaves it signed still verify
//! ([`crate::ca::StoredRoot::keep_until`]: the rotation time + the leaf TTL). Once that time
//! and [`crate::ca::ROOT_PRUNE_MARGIN`] have passed, one write removes it: the roots' index
//! moves, so every blocking query and subscription on the roots gets the smaller bundle.
//! With several servers over etcd only the leader writes it (the others would only race
//! it); the embedded store's single server always does.

use crate::ops::Op;
use crate::store::Store;
use std::future::Future;
use std::time::{Duration, SystemTime};
use tracing::{info, warn};

/// How often the roots are looked at, at most: a root's removal is due hours after its
/// rotation (the leaf TTL is at least an hour), so a minute late is nothing.
pub const CHECK_EVERY: Duration = Duration::from_secs(60);

/// Removes rotated-out roots when they are due, while this server leads (always with the
/// embedded store).
pub struct RootPruner {
    store: Store,
    every: Duration,
    clock: Box<dyn Fn() -> SystemTime + Send + Sync>,
}

impl RootPruner {
    /// A pruner of `store`'s roots on the wall clock, looking every [`CHECK_EVERY`].
    pub fn new(store: Store) -> Self {
        Self {
            store,
            every: CHECK_EVERY,
            clock: Box::new(SystemTime::now),
        }
    }

    /// The same, looking every `every` and reading the time from `clock` (tests).
    pub fn with_clock(store: Store, every: Duration, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        Self {
            store,
            every,
            clock: Box::new(clock),
        }
    }

    /// Whether this server does the leader's work now.
    fn leads(&self) -> bool {
        self.store.cluster().is_none_or(|c| *c.leading().borrow())
    }

    /// Removes the roots due now, if this server leads; true if it removed some.
    pub async fn prune_once(&self) -> bool {
        if !self.leads() {
            return false;
        }
        let now = (self.clock)();
        let due = self
            .store
            .read()
            .ca()
            .and_then(|ca| ca.next_prune_at())
            .is_some_and(|at| at <= now);
        if !due {
            return false;
        }
        match self.store.write(Op::CaPruneRoots { now }).await {
            Ok(outcome) => {
                info!(index = %outcome.index, "removed rotated-out CA roots whose last leaf has expired");
                true
            }
            Err(error) => {
                warn!(%error, "cannot remove rotated-out CA roots; trying again later");
                false
            }
        }
    }

    /// Looks every check interval (sooner when a root is due sooner) until `stop` completes.
    pub async fn run(&self, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            let wait = self
                .store
                .read()
                .ca()
                .and_then(|ca| ca.next_prune_at())
                .map_or(self.every, |at| {
                    at.duration_since((self.clock)()).unwrap_or_default().min(self.every)
                });
            tokio::select! {
                () = &mut stop => return,
                // At least a second apart, should a write keep failing.
                () = tokio::time::sleep(wait.max(Duration::from_secs(1))) => {}
            }
            self.prune_once().await;
        }
    }
}

#[cfg(test)]
mod tests;
