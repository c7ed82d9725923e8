//! One follower per distinct request, however many proxies watch it.
//!
//! Many proxies watch the same things (every sidecar with an upstream `api` watches the same
//! discovery chain and the same health). Instead of one catalog follower per proxy and watch,
//! the first watch of a request starts one shared task that follows the catalog and publishes
//! each derived value on a `watch` channel; every proxy's watch forwards from that channel.
//! The shared task is owned by the entry all those watches hold: when the last one ends, the
//! entry drops and its guard cancels the task.

use bounded_maps::SweptMap;
use parking_lot::Mutex;
use proxycfg::forward;
use proxycfg::{CorrelationId, DataSourceError, EventSender, UpdatePayload};
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Weak};
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// A derived value: `None` until the follower has every input.
pub(crate) type Value<T> = Option<Result<T, DataSourceError>>;

/// One shared follower: its latest value, and the guard that stops it.
pub(crate) struct Entry<T> {
    rx: watch::Receiver<Value<T>>,
    _stop: DropGuard,
}

/// Shared followers by request.
pub(crate) struct Fanout<K, T> {
    entries: Mutex<SweptMap<K, Weak<Entry<T>>>>,
    /// What the followers are (their span's name).
    name: &'static str,
    /// Tracks every follower task so an owner can wait for them at shutdown.
    tasks: TaskTracker,
}

impl<K, T> Fanout<K, T> {
    /// Followers named `name`, tracked by `tasks`.
    pub(crate) fn new(name: &'static str, tasks: TaskTracker) -> Self {
        Self {
            entries: Mutex::new(SweptMap::default()),
            name,
            tasks,
        }
    }
}

impl<K: Hash + Eq + Clone, T: Clone + Send + Sync + 'static> Fanout<K, T> {
    /// The shared follower for `key`, started with `start(publish, stop)` if there is none.
    pub(crate) fn follow<F>(
        &self,
        key: &K,
        start: impl FnOnce(watch::Sender<Value<T>>, CancellationToken) -> F,
    ) -> Arc<Entry<T>>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let mut entries = self.entries.lock();
        if let Some(entry) = entries.get(key).and_then(Weak::upgrade) {
            return entry;
        }
        let (publish, rx) = watch::channel(None);
        let stop = CancellationToken::new();
        let span = tracing::info_span!("fanout_follower", what = self.name);
        self.tasks.spawn(start(publish, stop.clone()).instrument(span));
        let entry = Arc::new(Entry {
            rx,
            _stop: stop.drop_guard(),
        });
        entries.insert(key.clone(), Arc::downgrade(&entry), |_, e| e.strong_count() > 0);
        entry
    }
}

/// The watch future of a fanout data source: forwards from `entry`, or reports the error
/// that kept it from following.
pub(crate) fn watch<'w, T: Into<UpdatePayload> + Clone + Send + Sync + 'static>(
    entry: Result<Arc<Entry<T>>, DataSourceError>,
    id: CorrelationId,
    tx: EventSender<T>,
    cancel: CancellationToken,
) -> proxycfg::WatchFuture<'w> {
    match entry {
        Ok(entry) => Box::pin(forward(entry, id, tx, cancel)),
        Err(e) => Box::pin(proxycfg::forward::refuse(id, tx, e, cancel)),
    }
}

/// Forwards a shared follower's values (the current one first) to one proxy's watch until
/// the watch is cancelled or the proxy stops listening (or the shared follower ends: the
/// store closed). The watch holds `entry`, which keeps the follower running.
pub(crate) fn forward<T: Into<UpdatePayload> + Clone + Send + Sync + 'static>(
    entry: Arc<Entry<T>>,
    id: CorrelationId,
    tx: EventSender<T>,
    cancel: CancellationToken,
) -> impl Future<Output = Result<(), DataSourceError>> + Send {
    let mut rx = entry.rx.clone();
    rx.mark_changed();
    let updates = Held { rx, _entry: entry };
    futures_util::FutureExt::map(forward::forward(cancel, updates, forward::ToState { id, tx }), Ok)
}

/// A shared follower's channel, and the entry that keeps the follower alive.
struct Held<T> {
    rx: watch::Receiver<Value<T>>,
    _entry: Arc<Entry<T>>,
}

impl<T: Clone + Send + Sync> forward::Updates<T> for Held<T> {
    fn next(&mut self) -> impl Future<Output = forward::Step<T>> + Send {
        self.rx.next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn one_task_per_key_stopped_when_its_last_watcher_goes() {
        let fanout: Fanout<&str, u32> = Fanout::new("test", TaskTracker::new());
        let started = Arc::new(AtomicUsize::new(0));
        let (stopped_tx, mut stopped_rx) = tokio::sync::mpsc::unbounded_channel();
        let follow = |key: &'static str| {
            let (started, stopped_tx) = (Arc::clone(&started), stopped_tx.clone());
            fanout.follow(&key, move |publish, stop| {
                started.fetch_add(1, Ordering::SeqCst);
                async move {
                    publish.send_replace(Some(Ok(7)));
                    stop.cancelled().await;
                    let _ = stopped_tx.send(key);
                }
            })
        };
        let (a1, a2, b) = (follow("a"), follow("a"), follow("b"));
        assert_eq!(started.load(Ordering::SeqCst), 2, "one task for \"a\", one for \"b\"");
        drop(a1);
        tokio::task::yield_now().await;
        assert!(stopped_rx.try_recv().is_err(), "\"a\" still has a watcher");
        drop(a2);
        assert_eq!(stopped_rx.recv().await, Some("a"));
        // A later watch of "a" starts a fresh task.
        let a3 = follow("a");
        assert_eq!(started.load(Ordering::SeqCst), 3);
        let mut rx = a3.rx.clone();
        assert_eq!(*rx.wait_for(Option::is_some).await.unwrap(), Some(Ok(7)));
        drop((a3, b));
    }
}
