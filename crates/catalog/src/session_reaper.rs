//! Leader work: ending sessions. A session ends when its TTL runs out without a renewal,
//! or when its node goes or a check it is bound to goes or turns critical; its locks are
//! then released (or their keys deleted) in the same write. The reaper wakes on every node
//! or check change and when the next TTL or lock delay is due, and writes only when
//! something is due. With several servers over etcd only the leader writes (the others
//! would only race it); the embedded store's single server always does.

use crate::keys::IndexKey;
use crate::ops::Op;
use crate::session_ops::plan_invalidate;
use crate::store::Store;
use std::future::Future;
use std::time::{Duration, SystemTime};
use tracing::{info, warn};

/// The longest the reaper sleeps without looking (it also wakes on node and check changes).
pub const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Ends due sessions of `store` while this server leads.
pub struct SessionReaper {
    store: Store,
    /// The last failure logged: a failure that repeats every pass is logged once.
    last_failure: parking_lot::Mutex<Option<String>>,
}

impl SessionReaper {
    /// A reaper of `store`'s sessions on the wall clock.
    pub fn new(store: Store) -> Self {
        Self {
            store,
            last_failure: parking_lot::Mutex::new(None),
        }
    }

    fn leads(&self) -> bool {
        self.store.cluster().is_none_or(|c| *c.leading().borrow())
    }

    /// Ends what is due now, if this server leads; true if it wrote.
    pub async fn reap_once(&self) -> bool {
        if !self.leads() {
            return false;
        }
        let now = now_ms();
        if plan_invalidate(&self.store.read(), now).changes.is_empty() {
            return false;
        }
        match self.store.write(Op::SessionsInvalidate { now_ms: now }).await {
            Ok(outcome) => {
                info!(index = %outcome.index, "ended sessions whose TTL ran out or whose node or checks failed");
                *self.last_failure.lock() = None;
                true
            }
            Err(error) => {
                let text = error.to_string();
                let mut last = self.last_failure.lock();
                if last.as_deref() != Some(text.as_str()) {
                    warn!(%error, "cannot end due sessions; trying again at every change and every second");
                    *last = Some(text);
                }
                false
            }
        }
    }

    /// Looks at every node or check change and at least every [`LOOK_EVERY`] until `stop`
    /// completes.
    pub async fn run(&self, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            let state = self.store.read();
            let (nodes, checks) = (state.index_of(&IndexKey::Nodes), state.index_of(&IndexKey::Checks));
            drop(state);
            tokio::select! {
                () = &mut stop => return,
                _ = self.store.wait(&IndexKey::Nodes, nodes, LOOK_EVERY) => {}
                _ = self.store.wait(&IndexKey::Checks, checks, LOOK_EVERY) => {}
            }
            let mut wrote = false;
            // What one write could not hold goes in the next, at once.
            while self.reap_once().await {
                wrote = true;
            }
            if !wrote {
                // A failed or empty pass: do not spin on a burst of unrelated changes.
                tokio::select! {
                    () = &mut stop => return,
                    () = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
        }
    }
}
