//! meshd's agent cache: what an agent knows of the servers' state, fetched once per key with
//! blocking queries and shared by every proxy on the host.
//!
//! - [`cache`]: the generic core (entries by request, one fetcher per key, TTL, index rules,
//!   back-off, minimum interval, counters).
//! - [`types`]: the cache types in front of the servers' HTTP API.
//! - [`leaf`]: leaf certificates from keys generated here and signed by a server.
//! - [`AgentCaches`]: one cache of each type, as an agent runs them.

pub mod cache;
pub mod leaf;
pub mod types;

use cache::{Cache, CacheConfig, CacheMetrics};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use types::{
    ConfigEntries, ConfigEntryType, Datacenters, GatewayServices, Health, Http, Intentions, MeshGateways,
    PeerTrustBundles, PeeredUpstream, PeeringServers, PreparedQuery, Roots, ServiceList,
};

/// Settings of the agent's caches.
#[derive(Debug, Clone)]
pub struct CachesConfig {
    /// The datacenter whose leaves are requested.
    pub datacenter: String,
    /// The core settings, shared by every type.
    pub cache: CacheConfig,
    /// How long a blocking query waits at a server.
    pub blocking_wait: Duration,
}

impl Default for CachesConfig {
    fn default() -> Self {
        Self {
            datacenter: "dc1".into(),
            cache: CacheConfig {
                // A server that answers at once without a new index would otherwise be asked
                // again in a loop; a change still arrives at once after a long wait.
                min_interval: Duration::from_millis(100),
                first_backoff: Duration::from_millis(500),
                max_backoff: Duration::from_secs(15),
                ..CacheConfig::default()
            },
            blocking_wait: types::BLOCKING_WAIT,
        }
    }
}

/// One cache per type, over one set of servers. Cheap to clone.
#[derive(Clone)]
pub struct AgentCaches {
    /// CA roots.
    pub roots: Cache<Roots>,
    /// Leaf certificates.
    pub leaf: Cache<leaf::Leaf>,
    /// Service health.
    pub health: Cache<Health>,
    /// Intentions by destination.
    pub intentions: Cache<Intentions>,
    /// Single config entries.
    pub config_entry: Cache<ConfigEntryType>,
    /// Config entries by kind.
    pub config_entries: Cache<ConfigEntries>,
    /// Service names.
    pub services: Cache<ServiceList>,
    /// Datacenter names.
    pub datacenters: Cache<Datacenters>,
    /// Every datacenter's mesh gateways.
    pub mesh_gateways: Cache<MeshGateways>,
    /// The services of each gateway.
    pub gateway_services: Cache<GatewayServices>,
    /// Prepared queries' connect-capable instances.
    pub prepared_query: Cache<PreparedQuery>,
    /// Services peers export here.
    pub peered_upstream: Cache<PeeredUpstream>,
    /// Trust bundles of the peers each service is exported to.
    pub peer_trust_bundles: Cache<PeerTrustBundles>,
    /// Where the peering calls go.
    pub peering_servers: Cache<PeeringServers>,
    datacenter: Arc<str>,
    cancel: CancellationToken,
}

impl AgentCaches {
    /// The caches over `servers`; every fetcher stops with `cancel` (or [`Self::shutdown`]).
    pub fn new(servers: Arc<api_client::Servers>, config: CachesConfig, cancel: CancellationToken) -> Self {
        let http = Http::new(servers, config.blocking_wait);
        let roots = Cache::new(Roots(http.clone()), config.cache.clone(), cancel.child_token());
        Self {
            leaf: Cache::new(
                leaf::Leaf::new(http.clone(), roots.clone(), config.datacenter.clone()),
                config.cache.clone(),
                cancel.child_token(),
            ),
            roots,
            health: Cache::new(Health(http.clone()), config.cache.clone(), cancel.child_token()),
            intentions: Cache::new(Intentions(http.clone()), config.cache.clone(), cancel.child_token()),
            config_entry: Cache::new(
                ConfigEntryType(http.clone()),
                config.cache.clone(),
                cancel.child_token(),
            ),
            config_entries: Cache::new(ConfigEntries(http.clone()), config.cache.clone(), cancel.child_token()),
            services: Cache::new(ServiceList(http.clone()), config.cache.clone(), cancel.child_token()),
            gateway_services: Cache::new(
                GatewayServices(http.clone()),
                config.cache.clone(),
                cancel.child_token(),
            ),
            prepared_query: Cache::new(PreparedQuery(http.clone()), config.cache.clone(), cancel.child_token()),
            peered_upstream: Cache::new(PeeredUpstream(http.clone()), config.cache.clone(), cancel.child_token()),
            peer_trust_bundles: Cache::new(
                PeerTrustBundles(http.clone()),
                config.cache.clone(),
                cancel.child_token(),
            ),
            peering_servers: Cache::new(PeeringServers(http.clone()), config.cache.clone(), cancel.child_token()),
            mesh_gateways: Cache::new(MeshGateways(http.clone()), config.cache.clone(), cancel.child_token()),
            datacenters: Cache::new(Datacenters::new(http), config.cache.clone(), cancel.child_token()),
            datacenter: config.datacenter.into(),
            cancel,
        }
    }

    /// The datacenter these caches serve.
    pub fn datacenter(&self) -> &str {
        &self.datacenter
    }

    /// Every type's counters, by type name.
    pub fn metrics(&self) -> [(&'static str, &CacheMetrics); 14] {
        [
            ("roots", self.roots.metrics()),
            ("leaf", self.leaf.metrics()),
            ("health", self.health.metrics()),
            ("intentions", self.intentions.metrics()),
            ("config_entry", self.config_entry.metrics()),
            ("config_entries", self.config_entries.metrics()),
            ("services", self.services.metrics()),
            ("datacenters", self.datacenters.metrics()),
            ("mesh_gateways", self.mesh_gateways.metrics()),
            ("gateway_services", self.gateway_services.metrics()),
            ("prepared_query", self.prepared_query.metrics()),
            ("peered_upstream", self.peered_upstream.metrics()),
            ("peer_trust_bundles", self.peer_trust_bundles.metrics()),
            ("peering_servers", self.peering_servers.metrics()),
        ]
    }

    /// Registers the counters (`meshd_agent_cache_*{type=...}`) with `registry`.
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register_collector(Box::new(MetricsCollector(self.clone())));
    }

    /// Stops every fetcher and waits for them.
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        self.leaf.shutdown().await;
        self.roots.shutdown().await;
        self.health.shutdown().await;
        self.intentions.shutdown().await;
        self.config_entry.shutdown().await;
        self.config_entries.shutdown().await;
        self.services.shutdown().await;
        self.datacenters.shutdown().await;
        self.gateway_services.shutdown().await;
        self.prepared_query.shutdown().await;
        self.peered_upstream.shutdown().await;
        self.peer_trust_bundles.shutdown().await;
        self.peering_servers.shutdown().await;
    }
}

impl std::fmt::Debug for AgentCaches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentCaches")
            .field("datacenter", &self.datacenter)
            .finish_non_exhaustive()
    }
}

/// Encodes the caches' counters at scrape time.
#[derive(Debug)]
struct MetricsCollector(AgentCaches);

impl Collector for MetricsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        type Read = fn(&CacheMetrics) -> u64;
        let counters: [(&str, &str, Read); 3] = [
            (
                "meshd_agent_cache_hits",
                "Watches served by a cache entry that already existed",
                |m| m.hits.load(Relaxed),
            ),
            ("meshd_agent_cache_fetches", "Fetches made by the agent cache", |m| {
                m.fetches.load(Relaxed)
            }),
            (
                "meshd_agent_cache_fetch_errors",
                "Agent cache fetches that failed",
                |m| m.errors.load(Relaxed),
            ),
        ];
        for (name, help, read) in counters {
            let mut family =
                encoder.encode_descriptor(name, help, None, prometheus_client::metrics::MetricType::Counter)?;
            for (ty, metrics) in self.0.metrics() {
                let labels = [("type", ty)];
                ConstCounter::new(read(metrics)).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "meshd_agent_cache_entries",
            "Entries the agent cache holds",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (ty, metrics) in self.0.metrics() {
            let labels = [("type", ty)];
            let n = i64::try_from(metrics.entries.load(Relaxed)).unwrap_or(i64::MAX);
            ConstGauge::new(n).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
