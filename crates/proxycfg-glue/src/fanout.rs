//! One follower per distinct request, however many proxies watch it.
//!
//! Many proxies watch the same things (every sidecar with an upstream `api` watches the same
//! discovery chain and the same health). Instead of one follower per proxy and watch, the
//! first watch of a request starts one shared task that follows the request's inputs (catalog
//! topics or agent-cache entries) and publishes each derived value in a [`Latest`] slot;
//! every proxy's watch is a [`Subscriber`] of it, which its State polls directly
//! ([`proxycfg::DataSource::subscribe`]): a subscriber is a few words and a waker slot in the
//! shared slot, with no future or task of its own. The shared task is owned by the entry all
//! those watches hold: when the last one ends, the entry drops and its guard cancels the task.

use bounded_maps::SweptMap;
use parking_lot::Mutex;
use proxycfg::forward;
use proxycfg::{CorrelationId, DataSourceError, EventSender, Subscription, UpdatePayload};
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// A derived value: `None` until the follower has every input.
pub(crate) type Value<T> = Option<Result<T, DataSourceError>>;

/// The latest value of one shared follower, and the wakers of the subscribers waiting for the
/// next one.
pub(crate) struct Latest<T> {
    inner: Mutex<LatestInner<T>>,
    /// Bumped (under the lock) whenever the wakers are taken (a value published, or the
    /// follower closed): a subscriber that registered its waker at this epoch knows, without
    /// the lock, that its waker is still there and nothing new has come.
    epoch: AtomicU64,
}

struct LatestInner<T> {
    /// Counts the values published: a subscriber has seen the value once it has seen this.
    version: u64,
    value: Value<T>,
    /// The follower has ended (the store closed): no value will come.
    closed: bool,
    /// One slot per subscriber (a subscriber keeps its slot for its life); a waiting
    /// subscriber's waker is in its slot.
    wakers: Vec<Option<Waker>>,
    /// Slots of subscribers that have gone.
    free: Vec<usize>,
}

impl<T> Latest<T> {
    fn new() -> Self {
        Self {
            inner: Mutex::new(LatestInner {
                version: 0,
                value: None,
                closed: false,
                wakers: Vec::new(),
                free: Vec::new(),
            }),
            epoch: AtomicU64::new(0),
        }
    }

    /// Replaces the value and wakes every waiting subscriber.
    fn publish(&self, value: Result<T, DataSourceError>) {
        let mut inner = self.inner.lock();
        inner.version += 1;
        inner.value = Some(value);
        self.wake_all(inner);
    }

    /// Wakes every waiting subscriber; no further value will come.
    fn close(&self) {
        let mut inner = self.inner.lock();
        inner.closed = true;
        self.wake_all(inner);
    }

    fn wake_all(&self, mut inner: parking_lot::MutexGuard<'_, LatestInner<T>>) {
        self.epoch.fetch_add(1, Ordering::Release);
        let wakers: Vec<Waker> = inner.wakers.iter_mut().filter_map(Option::take).collect();
        drop(inner);
        for waker in wakers {
            waker.wake();
        }
    }
}

/// What a shared follower publishes through: its slot, closed when the follower ends however
/// it ends.
pub(crate) struct Publisher<T>(Arc<Latest<T>>);

impl<T> Drop for Publisher<T> {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl<T: Send + Sync> forward::Deliver<T> for Publisher<T> {
    async fn deliver(&mut self, result: Result<T, DataSourceError>) -> bool {
        self.0.publish(result);
        true
    }
}

/// One shared follower: its latest value, and the guard that stops it.
pub(crate) struct Entry<T> {
    latest: Arc<Latest<T>>,
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

impl<K: Hash + Eq + Clone + std::fmt::Debug, T: Clone + Send + Sync + 'static> Fanout<K, T> {
    /// The shared follower for `key`, started with `start(publish, stop)` if there is none.
    pub(crate) fn follow<F>(&self, key: &K, start: impl FnOnce(Publisher<T>, CancellationToken) -> F) -> Arc<Entry<T>>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let mut entries = self.entries.lock();
        if let Some(entry) = entries.get(key).and_then(Weak::upgrade) {
            return entry;
        }
        let latest = Arc::new(Latest::new());
        let stop = CancellationToken::new();
        let span = tracing::info_span!("fanout_follower", what = self.name, request = ?key);
        self.tasks
            .spawn(start(Publisher(Arc::clone(&latest)), stop.clone()).instrument(span));
        let entry = Arc::new(Entry {
            latest,
            _stop: stop.drop_guard(),
        });
        entries.insert(key.clone(), Arc::downgrade(&entry), |_, e| e.strong_count() > 0);
        entry
    }

    /// [`Fanout::follow`] of a follower that forwards what `updates()` yields (made only
    /// when the follower starts: a watch joining a running follower opens no input).
    pub(crate) fn follow_updates<U>(&self, key: &K, updates: impl FnOnce() -> U) -> Arc<Entry<T>>
    where
        U: forward::Updates<T> + 'static,
    {
        self.follow(key, |publish, stop| forward::forward(stop, updates(), publish))
    }
}

/// One watch of a shared follower: yields its value (the current one first), then each later
/// one, the latest only. Holds `entry`, which keeps the follower running; its waker slot goes
/// back when it drops.
pub(crate) struct Subscriber<T> {
    entry: Arc<Entry<T>>,
    /// The version of the last value yielded (0: none yet).
    seen: u64,
    slot: usize,
    /// The waker left in the slot and the epoch it was left at: polled again by the same
    /// task before the epoch moves, there is nothing to look at (the State polls every
    /// subscription whichever woke it).
    armed: Option<(u64, Waker)>,
}

impl<T: Clone> Subscriber<T> {
    pub(crate) fn new(entry: Arc<Entry<T>>) -> Self {
        let slot = {
            let mut inner = entry.latest.inner.lock();
            match inner.free.pop() {
                Some(slot) => slot,
                None => {
                    inner.wakers.push(None);
                    inner.wakers.len() - 1
                }
            }
        };
        Self {
            entry,
            seen: 0,
            slot,
            armed: None,
        }
    }

    /// The next value not yielded yet; `Ready(None)` once the follower has ended.
    pub(crate) fn poll_value(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<T, DataSourceError>>> {
        let latest = &self.entry.latest;
        if let Some((epoch, waker)) = &self.armed
            && latest.epoch.load(Ordering::Acquire) == *epoch
            && waker.will_wake(cx.waker())
        {
            return Poll::Pending;
        }
        let mut inner = latest.inner.lock();
        if inner.version != self.seen
            && let Some(value) = &inner.value
        {
            let value = value.clone();
            self.seen = inner.version;
            // `armed` stays: a value new to this subscriber was published after it armed,
            // so the epoch has moved past it.
            return Poll::Ready(Some(value));
        }
        if inner.closed {
            return Poll::Ready(None);
        }
        let slot = &mut inner.wakers[self.slot];
        if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *slot = Some(cx.waker().clone());
        }
        // Read under the lock: the epoch at which the waker is in the slot.
        let epoch = latest.epoch.load(Ordering::Relaxed);
        match &mut self.armed {
            Some((at, waker)) if waker.will_wake(cx.waker()) => *at = epoch,
            armed => *armed = Some((epoch, cx.waker().clone())),
        }
        Poll::Pending
    }
}

impl<T> Drop for Subscriber<T> {
    fn drop(&mut self) {
        let mut inner = self.entry.latest.inner.lock();
        inner.wakers[self.slot] = None;
        inner.free.push(self.slot);
    }
}

impl<T: Into<UpdatePayload> + Clone + Send + Sync> Follow for Subscriber<T> {
    type Item = T;

    fn poll_follow(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<T, DataSourceError>>> {
        self.poll_value(cx)
    }
}

/// A watch its owner polls for its next result: a shared follower's [`Subscriber`], or a
/// value of its own made from one. [`Watch`] makes it a [`Subscription`] (its State polls
/// it) or [`forward::Updates`] (forwarded into a sender outside a State, by `notify`).
pub(crate) trait Follow: Send {
    /// What it yields.
    type Item: Into<UpdatePayload> + Send;

    /// The next result not yielded yet (`Pending`, with `cx`'s waker registered, until there
    /// is one); `Ready(None)` once its follower has ended.
    fn poll_follow(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Self::Item, DataSourceError>>>;
}

/// A [`Follow`] as a watch.
pub(crate) struct Watch<F>(F);

impl<F: Follow> Subscription for Watch<F> {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<UpdatePayload, DataSourceError>>> {
        self.0
            .poll_follow(cx)
            .map(|value| value.map(|result| result.map(Into::into)))
    }
}

impl<F: Follow> forward::Updates<F::Item> for Watch<F> {
    fn next(&mut self) -> impl Future<Output = forward::Step<F::Item>> + Send {
        std::future::poll_fn(|cx| self.0.poll_follow(cx).map(|value| value.map(Some)))
    }
}

/// A watch of a shared follower whose values it turns into its own (one proxy's resolved
/// config from the shared defaults, say): `derive` of each value, unless it makes nothing
/// (`None`: nothing to send for this one). Errors pass through.
pub(crate) struct Mapped<T, F> {
    sub: Subscriber<T>,
    derive: F,
}

impl<T: Clone, F> Mapped<T, F> {
    pub(crate) fn new(entry: Arc<Entry<T>>, derive: F) -> Self {
        Self {
            sub: Subscriber::new(entry),
            derive,
        }
    }
}

impl<T, U, F> Follow for Mapped<T, F>
where
    T: Clone + Send + Sync,
    U: Into<UpdatePayload> + Send,
    F: FnMut(T) -> Option<Result<U, DataSourceError>> + Send,
{
    type Item = U;

    fn poll_follow(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<U, DataSourceError>>> {
        loop {
            match std::task::ready!(self.sub.poll_value(cx)) {
                None => return Poll::Ready(None),
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                Some(Ok(value)) => {
                    if let Some(result) = (self.derive)(value) {
                        return Poll::Ready(Some(result));
                    }
                    // Nothing for this watch: wait for the next value (polling registers).
                }
            }
        }
    }
}

/// `follow` as a subscription, or one that reports why there is none.
pub(crate) fn boxed<F: Follow + 'static>(follow: Result<F, DataSourceError>) -> Box<dyn Subscription> {
    match follow {
        Ok(follow) => Box::new(Watch(follow)),
        Err(e) => Box::new(Refused(Some(e))),
    }
}

/// A watch that could not follow: its error, once.
struct Refused(Option<DataSourceError>);

impl Subscription for Refused {
    fn poll_next(&mut self, _cx: &mut Context<'_>) -> Poll<Option<Result<UpdatePayload, DataSourceError>>> {
        match self.0.take() {
            Some(e) => Poll::Ready(Some(Err(e))),
            // Nothing more: its watch is cancelled or replaced when the request changes.
            None => Poll::Pending,
        }
    }
}

/// The watch future of a fanout data source run outside a State (its `notify`): forwards
/// what `follow` yields, or reports the error that kept it from following.
pub(crate) fn watch_updates<'w, F: Follow + 'w>(
    follow: Result<F, DataSourceError>,
    id: CorrelationId,
    tx: EventSender<F::Item>,
    cancel: CancellationToken,
) -> proxycfg::WatchFuture<'w> {
    match follow {
        Ok(follow) => {
            let sink = forward::ToState { id, tx };
            Box::pin(futures_util::FutureExt::map(
                forward::forward(cancel, Watch(follow), sink),
                Ok,
            ))
        }
        Err(e) => Box::pin(proxycfg::forward::refuse(id, tx, e, cancel)),
    }
}

/// Implements `DataSource<$req>` for `$source` as a subscription its State polls itself:
/// `|$this, $r| $follow` (with `$this: &$source`, `$r: &$req`) gives what the watch follows
/// (a [`Subscriber`] of a shared follower, or a [`Follow`] made from one), or the error that
/// keeps it from following. Outside a State, `notify` forwards the same into the sender.
macro_rules! followed_source {
    ($source:ty, $req:ty, |$this:ident, $r:ident| $follow:expr) => {
        impl proxycfg::DataSource<$req> for $source {
            fn notify<'w>(
                self: std::sync::Arc<Self>,
                req: $req,
                id: proxycfg::CorrelationId,
                tx: proxycfg::EventSender<<$req as proxycfg::data_sources::WatchRequest>::Response>,
                cancel: tokio_util::sync::CancellationToken,
            ) -> proxycfg::WatchFuture<'w>
            where
                Self: 'w,
            {
                let $this: &$source = &self;
                let $r: &$req = &req;
                $crate::fanout::watch_updates($follow, id, tx, cancel)
            }

            fn subscribe(&self, $r: &$req) -> Option<Box<dyn proxycfg::Subscription>> {
                let $this: &$source = self;
                Some($crate::fanout::boxed($follow))
            }
        }
    };
}
pub(crate) use followed_source;

#[cfg(test)]
mod tests;
