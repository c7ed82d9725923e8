//! The agent cache's core: typed entries keyed by request, one background fetcher per key
//! shared by every watcher of it, and the rules Consul's agent cache follows for blocking
//! queries against the servers.
//!
//! - A [`CacheType`] fetches one kind of value (roots, a service's health, ...): given the
//!   index the cache holds, it blocks at a server until the value passes it.
//! - The first [`Cache::watch`] of a request starts its fetcher; later watches share it. An
//!   entry nobody watches is kept for [`CacheConfig::ttl`] (a proxy that restarts finds it
//!   warm), then its fetcher stops and the entry is dropped.
//! - Indexes: one that goes backwards (a server restored from a snapshot, another server
//!   behind) resets the entry to 0 so the next fetch answers at once (as the first fetch of an
//!   entry does: index 0 never blocks); an answer at index 0 is kept as 1, since a
//!   blocking query at 0 never blocks.
//! - Errors back off exponentially to [`CacheConfig::max_backoff`]; the last good value keeps
//!   being served while no server answers (unless its type says it went stale, see
//!   [`CacheType::stale`]: then the failure is reported). Fetches of one key are at least
//!   [`CacheConfig::min_interval`] apart.
//!
//! Nothing here knows HTTP: the cache types in front of the servers' API do.

use bounded_maps::SweptMap;
use parking_lot::Mutex;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};

/// Why a fetch failed (the entry keeps its last good value). The kind travels to whoever
/// shows it: a proxy whose token the servers refuse says "permission denied", not
/// "unavailable".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The servers refused the request's token (a 403): it lacks a permission, or they do
    /// not know it. The text names the request and the servers' reason.
    #[error("{0}")]
    PermissionDenied(String),
    /// The servers could not answer, or answered something unusable.
    #[error("{0}")]
    Unavailable(String),
    /// The agent's caches are stopping: the fetch ends, nothing failed.
    #[error("the agent cache is shutting down")]
    ShuttingDown,
}

impl FetchError {
    /// A failed request to the servers, with what was asked (`GET /v1/...`) in front.
    pub fn api(asked: &str, error: &api_client::ApiError) -> Self {
        let text = format!("{asked}: {error}");
        if error.is_permission_denied() {
            Self::PermissionDenied(text)
        } else {
            Self::Unavailable(text)
        }
    }

    /// The text, whatever the kind.
    pub fn message(&self) -> &str {
        match self {
            Self::PermissionDenied(m) | Self::Unavailable(m) => m,
            Self::ShuttingDown => "the agent cache is shutting down",
        }
    }
}

/// A value fetched at a catalog index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched<V> {
    /// The value.
    pub value: V,
    /// The index the servers answered it at.
    pub index: u64,
}

/// One kind of cached value and how to fetch it.
pub trait CacheType: Send + Sync + 'static {
    /// What identifies one entry (the request).
    type Request: Clone + Eq + Hash + Debug + Send + Sync + 'static;
    /// The value of an entry.
    type Value: Clone + Send + Sync + 'static;

    /// The value of `request` once the servers' index passes `min_index` (a blocking query;
    /// at 0, the current value at once).
    fn fetch(
        &self,
        request: &Self::Request,
        min_index: u64,
    ) -> impl Future<Output = Result<Fetched<Self::Value>, FetchError>> + Send;

    /// True when `value` can no longer stand in for a fresh one (a certificate about to
    /// expire): a failed fetch is then reported to watchers even though a value exists.
    fn stale(&self, _value: &Self::Value) -> bool {
        false
    }
}

/// Settings of a cache.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// How long an entry nobody watches is kept.
    pub ttl: Duration,
    /// The least time between two fetches of one key.
    pub min_interval: Duration,
    /// The first wait after a failed fetch; it doubles per failure.
    pub first_backoff: Duration,
    /// The longest wait after failed fetches.
    pub max_backoff: Duration,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(3 * 24 * 3600),
            min_interval: Duration::ZERO,
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
        }
    }
}

/// Counters of a cache.
#[derive(Debug, Default)]
pub struct CacheMetrics {
    /// Watches served by an entry that already existed.
    pub hits: AtomicU64,
    /// Fetches made.
    pub fetches: AtomicU64,
    /// Fetches that failed.
    pub errors: AtomicU64,
    /// Entries held now.
    pub entries: AtomicU64,
}

/// What watchers of an entry see: the latest good value, or the error of a first fetch that
/// has not succeeded yet (`None` until the first fetch ends).
type Latest<V> = Option<Result<Fetched<V>, FetchError>>;

/// One key's shared state: the channel its fetcher publishes on, and the token that stops it.
struct Entry<V> {
    tx: watch::Sender<Latest<V>>,
    stop: CancellationToken,
}

/// The cache of one [`CacheType`]. Cheap to clone.
pub struct Cache<T: CacheType> {
    inner: Arc<Inner<T>>,
}

impl<T: CacheType> Clone for Cache<T> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

/// Entries by request; stopped ones are swept as the map grows.
type Entries<T> = SweptMap<<T as CacheType>::Request, Arc<Entry<<T as CacheType>::Value>>>;

struct Inner<T: CacheType> {
    ty: T,
    config: CacheConfig,
    entries: Mutex<Entries<T>>,
    metrics: CacheMetrics,
    tasks: TaskTracker,
    cancel: CancellationToken,
}

/// A watcher of one entry: the latest value, and every change after it.
pub struct CacheWatch<V> {
    rx: watch::Receiver<Latest<V>>,
}

impl<V: Clone> CacheWatch<V> {
    /// The next value (the current one first, once there is one). A failed first fetch is
    /// reported; after that, failures keep the last good value and are not reported. `None`
    /// once the cache has shut down.
    pub async fn next(&mut self) -> Option<Result<Fetched<V>, FetchError>> {
        loop {
            self.rx.changed().await.ok()?;
            if let Some(latest) = self.rx.borrow_and_update().clone() {
                return Some(latest);
            }
        }
    }
}

impl<T: CacheType> Cache<T> {
    /// A cache of `ty`'s values; its fetchers end with `cancel` (or [`Cache::shutdown`]).
    pub fn new(ty: T, config: CacheConfig, cancel: CancellationToken) -> Self {
        Self {
            inner: Arc::new(Inner {
                ty,
                config,
                entries: Mutex::new(SweptMap::default()),
                metrics: CacheMetrics::default(),
                tasks: TaskTracker::new(),
                cancel,
            }),
        }
    }

    /// The cache's counters.
    pub fn metrics(&self) -> &CacheMetrics {
        &self.inner.metrics
    }

    /// Watches `request`'s value, starting its fetcher if no one watches it yet.
    pub fn watch(&self, request: &T::Request) -> CacheWatch<T::Value> {
        let mut entries = self.inner.entries.lock();
        if let Some(entry) = entries.get(request)
            && !entry.stop.is_cancelled()
        {
            self.inner.metrics.hits.fetch_add(1, Relaxed);
            let mut rx = entry.tx.subscribe();
            rx.mark_changed();
            return CacheWatch { rx };
        }
        let (tx, mut rx) = watch::channel(None);
        rx.mark_changed();
        let entry = Arc::new(Entry {
            tx,
            stop: self.inner.cancel.child_token(),
        });
        entries.insert(request.clone(), Arc::clone(&entry), |_, e| !e.stop.is_cancelled());
        self.inner.metrics.entries.fetch_add(1, Relaxed);
        let span = info_span!("cache_fetcher", request = ?request);
        let inner = Arc::clone(&self.inner);
        let request = request.clone();
        self.inner
            .tasks
            .spawn(async move { inner.follow(request, entry).await }.instrument(span));
        CacheWatch { rx }
    }

    /// Stops every fetcher and waits for them.
    pub async fn shutdown(&self) {
        self.inner.cancel.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }
}

impl<T: CacheType> Inner<T> {
    /// The fetcher of one entry: fetch, publish, repeat, until the entry has had no watcher
    /// for the TTL or the cache stops.
    async fn follow(&self, request: T::Request, entry: Arc<Entry<T::Value>>) {
        let schedule = backoff_schedule::Schedule {
            immediate: 0,
            first: self.config.first_backoff,
            max: self.config.max_backoff,
        };
        let mut index = 0u64;
        let mut failures = 0u32;
        let mut unwatched_since: Option<Instant> = None;
        let mut last_fetch: Option<Instant> = None;
        loop {
            if entry.tx.receiver_count() == 0 {
                let since = *unwatched_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= self.config.ttl && self.retire(&request, &entry) {
                    break;
                }
            } else {
                unwatched_since = None;
            }
            if let Some(at) = last_fetch {
                let next = at + self.config.min_interval;
                tokio::select! {
                    () = entry.stop.cancelled() => break,
                    () = tokio::time::sleep_until(next) => {}
                }
            }
            last_fetch = Some(Instant::now());
            self.metrics.fetches.fetch_add(1, Relaxed);
            let fetched = tokio::select! {
                () = entry.stop.cancelled() => break,
                // An entry nobody watches ends its TTL even while a blocking query is parked.
                () = expiry(&entry, unwatched_since, self.config.ttl) => continue,
                fetched = self.ty.fetch(&request, index) => fetched,
            };
            match fetched {
                Ok(f) => {
                    if failures > 0 {
                        info!(after = failures, "cache fetch succeeded again");
                    }
                    failures = 0;
                    // A server behind, or restored from a snapshot: start over at once.
                    // An answer at 0 is kept as 1: asking again at 0 would never block.
                    index = if f.index < index { 0 } else { f.index.max(1) };
                    let same = matches!(&*entry.tx.borrow(), Some(Ok(old)) if old.index == f.index);
                    if !same {
                        entry.tx.send_replace(Some(Ok(f)));
                    }
                }
                Err(FetchError::ShuttingDown) => break,
                Err(e) => {
                    self.metrics.errors.fetch_add(1, Relaxed);
                    failures = failures.saturating_add(1);
                    let wait = schedule.delay(failures);
                    // One line per streak of failures (then debug), one when it ends.
                    if failures == 1 {
                        warn!(error = %e, ?wait, "cache fetch failed; serving the last good value and retrying");
                    } else {
                        debug!(error = %e, ?wait, failures, "cache fetch failed again");
                    }
                    // Watchers learn of a failure only while there is no usable value, and of
                    // the same failure once.
                    let news = match &*entry.tx.borrow() {
                        None => true,
                        Some(Err(old)) => *old != e,
                        Some(Ok(good)) => self.ty.stale(&good.value),
                    };
                    if news {
                        entry.tx.send_replace(Some(Err(e)));
                    }
                    tokio::select! {
                        () = entry.stop.cancelled() => break,
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
        // Stopped by the cache (or retired above): make sure no new watcher joins it.
        self.retire(&request, &entry);
        debug!("cache entry dropped");
        self.metrics.entries.fetch_sub(1, Relaxed);
    }

    /// Stops `entry` and removes it from the map unless a watcher has joined it meanwhile
    /// (checked under the map's lock, which `watch` also holds: a watcher never joins a
    /// stopped entry). True when it was stopped.
    fn retire(&self, request: &T::Request, entry: &Arc<Entry<T::Value>>) -> bool {
        let mut entries = self.entries.lock();
        if entry.tx.receiver_count() > 0 && !entry.stop.is_cancelled() {
            return false;
        }
        entry.stop.cancel();
        if entries.get(request).is_some_and(|e| Arc::ptr_eq(e, entry)) {
            entries.remove(request);
        }
        true
    }
}

/// Completes when an unwatched entry's TTL runs out (never while it is watched).
async fn expiry<V>(entry: &Entry<V>, unwatched_since: Option<Instant>, ttl: Duration) {
    match unwatched_since {
        Some(since) => tokio::time::sleep_until(since + ttl).await,
        // Watched now: wake when the last watcher leaves, to start the TTL.
        None => entry.tx.closed().await,
    }
}

#[cfg(test)]
mod tests;
