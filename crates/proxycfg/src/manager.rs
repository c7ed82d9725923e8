//! The Manager: one State per registered proxy, and the snapshot watchers.
//!
//! Each proxy id has a slot holding its latest valid snapshot. Watchers read the slot (a
//! one-value channel: a slow watcher sees only the newest snapshot, and every watcher of a
//! proxy gets the same `Arc`). A slot exists while the proxy is registered or watched, so a
//! watch can start before registration. Registering starts a State that publishes into the
//! slot; a registration change that affects the proxy's config stops that State (waiting
//! until its watches are gone) and starts a fresh one; deregistration stops it and withdraws
//! the snapshot.

use crate::data_sources::DataSources;
use crate::handler::UnsupportedKind;
use crate::rate_limit::{RateLimit, RateLimiter};
use crate::registration::{ProxyRegistration, ProxySource, Registered};
use crate::snapshot::{ConfigSnapshot, ProxyId};
use crate::state::{self, Published, Slot, StateParams};
use crate::{Metrics, MetricsSnapshot};
use parking_lot::Mutex;
use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Weak},
    time::Duration,
};
use structs::ServiceKind;
use tokio::{sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// A registered proxy's status (see [`Manager::status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyStatus {
    /// Who registered it.
    pub source: ProxySource,
    /// Version of the last snapshot published (`None`: none yet, the data is incomplete).
    pub snapshot_version: Option<u64>,
    /// Watches failing now, by watch: their last good data stays in use, and what depends
    /// on data never received (an upstream whose chain cannot be compiled) is left out.
    pub errors: std::collections::BTreeMap<String, String>,
    /// The proxy runs in transparent mode.
    pub transparent: bool,
    /// Its upstreams in the last snapshot, by id: `true` for an implicit one (reached by
    /// intentions in transparent mode), `false` for a declared one.
    pub upstreams: std::collections::BTreeMap<String, bool>,
}

/// Manager settings.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// Datacenter the proxies live in.
    pub datacenter: String,
    /// A State publishes at most once per this window: the first snapshot after one window,
    /// then a change after a quiet window at once and changes within a window at its end.
    pub coalesce: Duration,
    /// Optional global limit on snapshot deliveries (off by default).
    pub rate_limit: Option<RateLimit>,
    /// Updates that can queue for one State before data sources wait.
    pub event_buffer: usize,
    /// What intentions decide when none matches: allow without ACLs, else the ACL default
    /// policy (Consul's rule). Carried in every snapshot.
    pub intention_default_allow: bool,
}

/// Consul waits a fixed 200 ms; changes here reach proxies an order of magnitude sooner.
pub const DEFAULT_COALESCE: Duration = Duration::from_millis(10);

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            datacenter: "dc1".into(),
            coalesce: DEFAULT_COALESCE,
            rate_limit: None,
            event_buffer: 64,
            intention_default_allow: true,
        }
    }
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// Another source owns this proxy and `overwrite` was not set.
    #[error("proxy {id} is already registered by the {existing} source")]
    SourceConflict {
        /// The proxy.
        id: ProxyId,
        /// Who registered it.
        existing: ProxySource,
    },
    /// The service is not a proxy or gateway.
    #[error("service {id} is not a proxy (kind {kind:?})")]
    NotAProxy {
        /// The service.
        id: ProxyId,
        /// Its kind.
        kind: ServiceKind,
    },
    /// No handler exists for the kind.
    #[error(transparent)]
    Unsupported(#[from] UnsupportedKind),
    /// The Manager has been shut down.
    #[error("the proxy config manager has shut down")]
    Closed,
}

struct SlotEntry {
    tx: Slot,
    registered: bool,
}

struct Running {
    registration: ProxyRegistration,
    source: ProxySource,
    cancel: CancellationToken,
    /// The State; `None` for a registration that was refused (its kind has no handler),
    /// kept so that its status and its watchers say why.
    task: Option<JoinHandle<()>>,
    errors: crate::watches::WatchErrors,
}

impl Running {
    async fn stop(self) {
        self.cancel.cancel();
        // The State only returns once its watches are gone; a panic there is already logged.
        if let Some(task) = self.task {
            let _ = task.await;
        }
    }
}

struct Inner {
    config: ManagerConfig,
    datacenter: Arc<str>,
    sources: DataSources,
    metrics: Arc<Metrics>,
    limiter: Option<Arc<RateLimiter>>,
    slots: Mutex<HashMap<ProxyId, SlotEntry>>,
    states: tokio::sync::Mutex<HashMap<ProxyId, Running>>,
    root: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // States are children of this token: dropping the last Manager handle stops them all.
        self.root.cancel();
    }
}

impl Inner {
    /// The parameters of a new State for `registration`, publishing into the proxy's slot
    /// (created on first registration, marked registered).
    fn state_params(&self, registration: ProxyRegistration, cancel: CancellationToken) -> StateParams {
        let slot = {
            let mut slots = self.slots.lock();
            let entry = slots.entry(registration.id.clone()).or_insert_with(|| SlotEntry {
                tx: watch::Sender::new(Published::Nothing),
                registered: false,
            });
            entry.registered = true;
            entry.tx.clone()
        };
        StateParams {
            registration,
            datacenter: Arc::clone(&self.datacenter),
            sources: self.sources.clone(),
            slot,
            coalesce: self.config.coalesce,
            limiter: self.limiter.clone(),
            event_buffer: self.config.event_buffer,
            intention_default_allow: self.config.intention_default_allow,
            metrics: Arc::clone(&self.metrics),
            cancel,
            errors: Arc::default(),
        }
    }
}

/// Keeps one State per registered proxy and hands out snapshot watchers. Cheap to clone.
#[derive(Clone)]
pub struct Manager {
    inner: Arc<Inner>,
}

impl fmt::Debug for Manager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Manager")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Manager {
    /// A Manager whose States get their data from `sources`.
    pub fn new(config: ManagerConfig, sources: DataSources) -> Self {
        let limiter = config.rate_limit.map(|l| Arc::new(RateLimiter::new(l)));
        Self {
            inner: Arc::new(Inner {
                datacenter: Arc::from(config.datacenter.as_str()),
                config,
                sources,
                metrics: Arc::new(Metrics::default()),
                limiter,
                slots: Mutex::new(HashMap::new()),
                states: tokio::sync::Mutex::new(HashMap::new()),
                root: CancellationToken::new(),
            }),
        }
    }

    /// Registers or updates a proxy from `source`. A proxy registered by another source is
    /// only taken over with `overwrite`. Returns once any previous State has fully stopped.
    pub async fn register(
        &self,
        registration: ProxyRegistration,
        source: ProxySource,
        overwrite: bool,
    ) -> Result<Registered, RegisterError> {
        let inner = &self.inner;
        if !registration.service.kind.is_proxy() {
            return Err(RegisterError::NotAProxy {
                id: registration.id,
                kind: registration.service.kind,
            });
        }
        let mut states = inner.states.lock().await;
        if inner.root.is_cancelled() {
            return Err(RegisterError::Closed);
        }
        let id = registration.id.clone();
        let mut outcome = Registered::Started;
        if let Some(existing) = states.get_mut(&id) {
            if existing.source != source && !overwrite {
                return Err(RegisterError::SourceConflict {
                    id,
                    existing: existing.source,
                });
            }
            // A refused registration is tried again (its kind may be served now): a
            // registration never stays refused without saying so again.
            if existing.task.is_some() && !existing.registration.needs_rebuild(&registration) {
                existing.registration = registration;
                existing.source = source;
                return Ok(Registered::Unchanged);
            }
            if let Some(old) = states.remove(&id) {
                old.stop().await;
            }
            outcome = Registered::Rebuilt;
        }

        let cancel = inner.root.child_token();
        let params = inner.state_params(registration.clone(), cancel.clone());
        let errors = Arc::clone(&params.errors);
        let task = match state::spawn(params) {
            Ok(task) => task,
            Err(err) => {
                // Kept as a refused registration: its status says why, its watchers are
                // told (an xDS stream ends with the reason instead of waiting for nothing),
                // and deregistration clears it as any other.
                let reason = err.to_string();
                warn!(proxy = %id, %source, error = %reason, "proxy registered but cannot be served");
                errors.lock().insert("kind".into(), reason.clone());
                if let Some(entry) = self.inner.slots.lock().get(&id) {
                    entry.tx.send_replace(Published::Refused(Arc::from(reason)));
                }
                states.insert(
                    id,
                    Running {
                        registration,
                        source,
                        cancel,
                        task: None,
                        errors,
                    },
                );
                return Err(err.into());
            }
        };
        info!(proxy = %id, %source, ?outcome, "proxy registered");
        states.insert(
            id,
            Running {
                registration,
                source,
                cancel,
                task: Some(task),
                errors,
            },
        );
        Ok(outcome)
    }

    /// Deregisters a proxy registered by `source`: stops its State (returning once every watch
    /// task is gone) and withdraws its snapshot. Returns false if it was not registered by
    /// that source.
    pub async fn deregister(&self, id: &ProxyId, source: ProxySource) -> bool {
        let mut states = self.inner.states.lock().await;
        match states.get(id) {
            Some(r) if r.source == source => {}
            _ => return false,
        }
        let Some(running) = states.remove(id) else { return false };
        running.stop().await;
        self.release_slot(id);
        info!(proxy = %id, %source, "proxy deregistered");
        true
    }

    /// Marks a slot unregistered, tells its watchers, and drops it if nobody watches.
    fn release_slot(&self, id: &ProxyId) {
        let mut slots = self.inner.slots.lock();
        if let Some(entry) = slots.get_mut(id) {
            entry.registered = false;
            if entry.tx.receiver_count() == 0 {
                slots.remove(id);
            } else {
                entry.tx.send_replace(Published::Nothing);
            }
        }
    }

    /// Watches a proxy's snapshots; works before it is registered.
    pub fn watch(&self, id: &ProxyId) -> Watcher {
        let rx = {
            let mut slots = self.inner.slots.lock();
            let entry = slots.entry(id.clone()).or_insert_with(|| SlotEntry {
                tx: watch::Sender::new(Published::Nothing),
                registered: false,
            });
            entry.tx.subscribe()
        };
        let mut rx = rx;
        if !matches!(*rx.borrow(), Published::Nothing) {
            rx.mark_changed();
        } else {
            rx.mark_unchanged();
        }
        self.inner.metrics.watcher_added();
        debug!(proxy = %id, "watcher added");
        Watcher {
            rx,
            id: id.clone(),
            manager: Arc::downgrade(&self.inner),
            metrics: Arc::clone(&self.inner.metrics),
        }
    }

    /// The data sources the proxies' States watch (for one-off questions asked as a proxy
    /// would ask them: [`crate::data_sources::first_update`]).
    pub fn data_sources(&self) -> &DataSources {
        &self.inner.sources
    }

    /// The last snapshot published for `id`, if any (without watching it).
    pub fn current(&self, id: &ProxyId) -> Option<Arc<ConfigSnapshot>> {
        let slots = self.inner.slots.lock();
        slots.get(id).and_then(|entry| entry.tx.borrow().snapshot().cloned())
    }

    /// The ids of every registered proxy, sorted.
    pub async fn registered(&self) -> Vec<ProxyId> {
        let mut ids: Vec<ProxyId> = self.inner.states.lock().await.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// The registration and source of a proxy, if registered.
    pub async fn registration(&self, id: &ProxyId) -> Option<(ProxyRegistration, ProxySource)> {
        self.inner
            .states
            .lock()
            .await
            .get(id)
            .map(|r| (r.registration.clone(), r.source))
    }

    /// What a proxy's State reports: who registered it, its last snapshot, and the watches
    /// failing now. `None` when it is not registered.
    pub async fn status(&self, id: &ProxyId) -> Option<ProxyStatus> {
        let (source, errors) = {
            let states = self.inner.states.lock().await;
            let running = states.get(id)?;
            (running.source, running.errors.lock().clone())
        };
        let snapshot = self
            .inner
            .slots
            .lock()
            .get(id)
            .and_then(|s| s.tx.borrow().snapshot().cloned());
        let cp = snapshot.as_ref().and_then(|s| s.connect_proxy());
        Some(ProxyStatus {
            source,
            snapshot_version: snapshot.as_ref().map(|s| s.version),
            errors,
            transparent: cp.is_some_and(|cp| cp.transparent),
            upstreams: cp
                .map(|cp| {
                    cp.upstreams
                        .iter()
                        .map(|(id, u)| (id.to_string(), crate::ConnectProxySnapshot::is_implicit(u)))
                        .collect()
                })
                .unwrap_or_default(),
        })
    }

    /// The engine's counters.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics.snapshot()
    }

    /// Registers the engine's exported metrics in `registry`.
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.inner.metrics.register(registry);
    }

    /// Stops every State and waits until all of them and their watches are gone. Later
    /// registrations are refused.
    pub async fn shutdown(&self) {
        let mut states = self.inner.states.lock().await;
        self.inner.root.cancel();
        let ids: Vec<ProxyId> = states.keys().cloned().collect();
        for id in ids {
            if let Some(running) = states.remove(&id) {
                running.stop().await;
            }
            self.release_slot(&id);
        }
    }
}

/// What a watcher sees next.
#[derive(Debug, Clone)]
pub enum WatchEvent {
    /// A new snapshot (the newest; intermediate ones a slow watcher missed are skipped).
    Snapshot(Arc<ConfigSnapshot>),
    /// The proxy was deregistered; it may be registered again later.
    Deregistered,
    /// The proxy is registered but cannot be served (a kind with no handler): why. Its
    /// status shows the same reason until it is deregistered or registered again.
    Refused(Arc<str>),
}

/// Receives one proxy's snapshots. Dropping it stops watching.
pub struct Watcher {
    rx: watch::Receiver<Published>,
    id: ProxyId,
    manager: Weak<Inner>,
    metrics: Arc<Metrics>,
}

impl fmt::Debug for Watcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watcher").field("id", &self.id).finish_non_exhaustive()
    }
}

impl Watcher {
    /// Waits for the next change: the current snapshot at once on the first call if one is
    /// published, then each newer one. `None` once the Manager is gone.
    pub async fn next(&mut self) -> Option<WatchEvent> {
        self.rx.changed().await.ok()?;
        Some(match self.rx.borrow_and_update().clone() {
            Published::Snapshot(snapshot) => WatchEvent::Snapshot(snapshot),
            Published::Nothing => WatchEvent::Deregistered,
            Published::Refused(why) => WatchEvent::Refused(why),
        })
    }

    /// The newest published snapshot, without waiting.
    pub fn current(&self) -> Option<Arc<ConfigSnapshot>> {
        self.rx.borrow().snapshot().cloned()
    }

    /// The proxy this watcher follows.
    pub fn proxy_id(&self) -> &ProxyId {
        &self.id
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.metrics.watcher_removed();
        let Some(inner) = self.manager.upgrade() else { return };
        let mut slots = inner.slots.lock();
        // This watcher's receiver is still alive here, so "only us" is a count of one.
        if let Some(entry) = slots.get(&self.id)
            && !entry.registered
            && entry.tx.receiver_count() <= 1
        {
            slots.remove(&self.id);
        }
    }
}
