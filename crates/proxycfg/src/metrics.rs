//! Counters of the proxycfg engine: prometheus-client counters and gauges (single atomic
//! adds), read as a consistent-enough copy for logs and tests, and registered for export.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Live counters shared by the Manager, its States and their watches.
#[derive(Debug, Default)]
pub struct Metrics {
    snapshots_built: Counter,
    states_started: Counter,
    updates: Counter,
    stale_updates: Counter,
    data_source_errors: Counter,
    live_watches: Gauge,
    live_states: Gauge,
    watchers: Gauge,
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
            snapshots_built: self.snapshots_built.get(),
            states_started: self.states_started.get(),
            updates: self.updates.get(),
            stale_updates: self.stale_updates.get(),
            data_source_errors: self.data_source_errors.get(),
            live_watches: self.live_watches.get(),
            live_states: self.live_states.get(),
            watchers: self.watchers.get(),
        }
    }

    /// Registers the exported metrics in `registry` (sharing their values with `self`): the
    /// snapshots built, the data-source errors and the live watches. Help texts have no final period and the counter
    /// no `_total`: prometheus-client adds both.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "meshd_proxycfg_snapshots",
            "Proxy snapshots built",
            self.snapshots_built.clone(),
        );
        registry.register(
            "meshd_proxycfg_data_source_errors",
            "Error results from data sources (the proxy keeps its last good data)",
            self.data_source_errors.clone(),
        );
        registry.register(
            "meshd_proxycfg_watches",
            "Live proxycfg watches",
            self.live_watches.clone(),
        );
    }

    pub(crate) fn snapshot_built(&self) {
        self.snapshots_built.inc();
    }
    pub(crate) fn update(&self) {
        self.updates.inc();
    }
    pub(crate) fn stale_update(&self) {
        self.stale_updates.inc();
    }
    pub(crate) fn data_source_error(&self) {
        self.data_source_errors.inc();
    }
    pub(crate) fn watch_started(&self) {
        self.live_watches.inc();
    }
    pub(crate) fn watch_stopped(&self) {
        self.live_watches.dec();
    }
    pub(crate) fn state_started(&self) {
        self.states_started.inc();
        self.live_states.inc();
    }
    pub(crate) fn state_stopped(&self) {
        self.live_states.dec();
    }
    pub(crate) fn watcher_added(&self) {
        self.watchers.inc();
    }
    pub(crate) fn watcher_removed(&self) {
        self.watchers.dec();
    }
}
