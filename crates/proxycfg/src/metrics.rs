//! Counters of the proxycfg engine, kept as atomics and read as a consistent-enough copy for
//! export (Prometheus or logs).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// Live counters shared by the Manager, its States and their watches.
#[derive(Debug, Default)]
pub struct Metrics {
    snapshots_built: AtomicU64,
    states_started: AtomicU64,
    updates: AtomicU64,
    stale_updates: AtomicU64,
    data_source_errors: AtomicU64,
    live_watches: AtomicI64,
    live_states: AtomicI64,
    watchers: AtomicI64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// Snapshots published, all proxies.
    pub snapshots_built: u64,
    /// States started (first registrations and rebuilds).
    pub states_started: u64,
    /// Updates folded into a snapshot.
    pub updates: u64,
    /// Updates dropped because their watch had been cancelled or restarted.
    pub stale_updates: u64,
    /// Error results from data sources.
    pub data_source_errors: u64,
    /// Watch tasks alive now.
    pub live_watches: i64,
    /// Proxy States alive now.
    pub live_states: i64,
    /// Snapshot watchers alive now.
    pub watchers: i64,
}

impl Metrics {
    /// Reads every counter.
    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            snapshots_built: self.snapshots_built.load(Relaxed),
            states_started: self.states_started.load(Relaxed),
            updates: self.updates.load(Relaxed),
            stale_updates: self.stale_updates.load(Relaxed),
            data_source_errors: self.data_source_errors.load(Relaxed),
            live_watches: self.live_watches.load(Relaxed),
            live_states: self.live_states.load(Relaxed),
            watchers: self.watchers.load(Relaxed),
        }
    }

    pub(crate) fn snapshot_built(&self) {
        self.snapshots_built.fetch_add(1, Relaxed);
    }
    pub(crate) fn update(&self) {
        self.updates.fetch_add(1, Relaxed);
    }
    pub(crate) fn stale_update(&self) {
        self.stale_updates.fetch_add(1, Relaxed);
    }
    pub(crate) fn data_source_error(&self) {
        self.data_source_errors.fetch_add(1, Relaxed);
    }
    pub(crate) fn watch_started(&self) {
        self.live_watches.fetch_add(1, Relaxed);
    }
    pub(crate) fn watch_stopped(&self) {
        self.live_watches.fetch_sub(1, Relaxed);
    }
    pub(crate) fn state_started(&self) {
        self.states_started.fetch_add(1, Relaxed);
        self.live_states.fetch_add(1, Relaxed);
    }
    pub(crate) fn state_stopped(&self) {
        self.live_states.fetch_sub(1, Relaxed);
    }
    pub(crate) fn watcher_added(&self) {
        self.watchers.fetch_add(1, Relaxed);
    }
    pub(crate) fn watcher_removed(&self) {
        self.watchers.fetch_sub(1, Relaxed);
    }
}
