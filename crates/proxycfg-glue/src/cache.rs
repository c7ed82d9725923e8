//! `Cache*` data sources: proxycfg watches answered from the agent cache. Used by agents for
//! the proxies on their host. Every watch of the same thing shares one cache entry (one
//! blocking query at a server); the derivations (chains, resolved config, filtered health)
//! are the ones the `Server*` family uses (`resolve`).

use crate::resolve::{self, ChainInputs};
use agent_cache::AgentCaches;
use agent_cache::cache::CacheWatch;
use agent_cache::leaf::LeafKey;
use agent_cache::types::{
    ConfigEntryKey, DatacentersKey, GatewayServicesKey, HealthKey, IntentionsKey, RootsKey, ServicesKey,
};
use async_trait::async_trait;
use proxycfg::data_sources::*;
use proxycfg::forward::{self, Step, ToState, Updates};
use proxycfg::{CorrelationId, DataSource, DataSourceError, DataSources, EventSender};
use std::sync::Arc;
use structs::{
    CheckServiceNode, CompiledDiscoveryChain, ConfigEntry, ConfigEntryKind, HealthCheck, IndexedCaRoots, Intention,
    IssuedCert, ResolvedServiceConfig,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The agent's own checks, for the HTTP-checks source (what the agent runs for a local
/// service; the servers' copy may lag).
pub trait LocalChecks: Send + Sync + 'static {
    /// The HTTP (and gRPC) checks of local service instance `service_id`.
    fn http_checks(&self, service_id: &str) -> Vec<HealthCheck>;
    /// Changes whenever the local checks may have changed.
    fn subscribe(&self) -> watch::Receiver<u64>;
}

/// What every cache data source shares.
struct Shared {
    caches: AgentCaches,
    local: Arc<dyn LocalChecks>,
}

impl Shared {
    fn check_dc(&self, dc: &str) -> Result<(), DataSourceError> {
        resolve::check_dc(dc, self.caches.datacenter())
    }
}

/// Builds the agent-mode [`DataSources`] over the agent's caches and its local checks.
pub fn cache_data_sources(caches: AgentCaches, local: Arc<dyn LocalChecks>) -> DataSources {
    let shared = Arc::new(Shared { caches, local });
    DataSources {
        ca_roots: Arc::new(CacheCaRoots(Arc::clone(&shared))),
        leaf: Arc::new(CacheLeaf(Arc::clone(&shared))),
        intentions: Arc::new(CacheIntentions(Arc::clone(&shared))),
        health: Arc::new(CacheHealth(Arc::clone(&shared))),
        discovery_chain: Arc::new(CacheDiscoveryChain(Arc::clone(&shared))),
        config_entry: Arc::new(CacheConfigEntry(Arc::clone(&shared))),
        config_entry_list: Arc::new(CacheConfigEntryList(Arc::clone(&shared))),
        resolved_service_config: Arc::new(CacheResolvedServiceConfig(Arc::clone(&shared))),
        service_list: Arc::new(CacheServiceList(Arc::clone(&shared))),
        datacenters: Arc::new(CacheDatacenters(Arc::clone(&shared))),
        gateway_services: Arc::new(CacheGatewayServices(Arc::clone(&shared))),
        http_checks: Arc::new(CacheHttpChecks(shared)),
        prepared_query: Arc::new(crate::common::PreparedQueriesUnsupported),
    }
}

/// One cache entry's values, each mapped to what the watch delivers (`None`: nothing to
/// deliver for this value).
struct FromCache<V, F> {
    watch: CacheWatch<V>,
    map: F,
}

impl<V, T, F> Updates<T> for FromCache<V, F>
where
    V: Clone + Send + Sync,
    F: FnMut(V) -> Option<Result<T, DataSourceError>> + Send,
{
    async fn next(&mut self) -> Step<T> {
        // The cache shut down: the watch ends.
        match self.watch.next().await? {
            Ok(fetched) => Some((self.map)(fetched.value)),
            Err(e) => Some(Some(Err(source_error(e)))),
        }
    }
}

/// A failed fetch as a State shows it: the servers' 403 stays "permission denied".
fn source_error(e: agent_cache::cache::FetchError) -> DataSourceError {
    match e {
        agent_cache::cache::FetchError::PermissionDenied(m) => DataSourceError::PermissionDenied(m),
        agent_cache::cache::FetchError::Unavailable(m) => DataSourceError::Unavailable(m),
    }
}

/// Forwards one cache entry to a State until cancelled.
async fn run<V, T, F>(
    watch: CacheWatch<V>,
    id: CorrelationId,
    tx: EventSender<T>,
    cancel: CancellationToken,
    map: F,
) -> Result<(), DataSourceError>
where
    V: Clone + Send + Sync,
    T: Into<UpdatePayload> + Send,
    F: FnMut(V) -> Option<Result<T, DataSourceError>> + Send,
{
    forward::forward(cancel, FromCache { watch, map }, ToState { id, tx }).await;
    Ok(())
}

/// One input of a derived value: its watch and the latest value it gave.
struct Input<V> {
    watch: CacheWatch<V>,
    latest: Option<V>,
}

impl<V: Clone> Input<V> {
    fn new(watch: CacheWatch<V>) -> Self {
        Self { watch, latest: None }
    }

    /// Waits for this input's next value. `None` once the cache has shut down.
    async fn update(&mut self) -> Option<Result<(), DataSourceError>> {
        match self.watch.next().await? {
            Ok(fetched) => {
                self.latest = Some(fetched.value);
                Some(Ok(()))
            }
            Err(e) => Some(Err(source_error(e))),
        }
    }
}

/// CA roots.
pub struct CacheCaRoots(Arc<Shared>);

#[async_trait]
impl DataSource<CaRootsRequest> for CacheCaRoots {
    async fn notify(
        self: Arc<Self>,
        req: CaRootsRequest,
        id: CorrelationId,
        tx: EventSender<Arc<IndexedCaRoots>>,
        cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        if let Err(e) = self.0.check_dc(&req.datacenter) {
            return forward::refuse(id, tx, e, cancel).await;
        }
        run(self.0.caches.roots.watch(&RootsKey), id, tx, cancel, |v| Some(Ok(v))).await
    }
}

/// Leaf certificates: signed from keys this agent generated, renewed before expiry and when
/// the active root changes.
pub struct CacheLeaf(Arc<Shared>);

#[async_trait]
impl DataSource<LeafRequest> for CacheLeaf {
    async fn notify(
        self: Arc<Self>,
        req: LeafRequest,
        id: CorrelationId,
        tx: EventSender<Arc<IssuedCert>>,
        cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        if let Err(e) = self.0.check_dc(&req.datacenter) {
            return forward::refuse(id, tx, e, cancel).await;
        }
        let mut dns_sans = req.dns_sans;
        dns_sans.sort();
        dns_sans.dedup();
        let key = LeafKey {
            service: req.service,
            dns_sans,
            token: req.token,
        };
        run(self.0.caches.leaf.watch(&key), id, tx, cancel, |v| Some(Ok(v))).await
    }
}

/// Intentions by destination.
pub struct CacheIntentions(Arc<Shared>);

#[async_trait]
impl DataSource<IntentionsRequest> for CacheIntentions {
    async fn notify(
        self: Arc<Self>,
        req: IntentionsRequest,
        id: CorrelationId,
        tx: EventSender<Arc<Vec<Intention>>>,
        cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        if let Err(e) = self.0.check_dc(&req.datacenter) {
            return forward::refuse(id, tx, e, cancel).await;
        }
        let key = IntentionsKey {
            destination: req.destination,
        };
        run(self.0.caches.intentions.watch(&key), id, tx, cancel, |v| Some(Ok(v))).await
    }
}

/// Service health: one cache entry per (service, connect, passing), the kind filtered here.
pub struct CacheHealth(Arc<Shared>);

#[async_trait]
impl DataSource<HealthRequest> for CacheHealth {
    async fn notify(
        self: Arc<Self>,
        req: HealthRequest,
        id: CorrelationId,
        tx: EventSender<Arc<Vec<CheckServiceNode>>>,
        cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        if let Err(e) = self.0.check_dc(&req.datacenter) {
            return forward::refuse(id, tx, e, cancel).await;
        }
        let filter = match resolve::subset_filter(&req) {
            Ok(f) => f,
            Err(e) => return forward::refuse(id, tx, e, cancel).await,
        };
        let key = HealthKey {
            service: req.service.clone(),
            connect: req.connect,
            passing: req.passing_only,
            token: req.token.clone(),
        };
        let watch = self.0.caches.health.watch(&key);
        run(watch, id, tx, cancel, move |all: Arc<Vec<CheckServiceNode>>| {
            if resolve::health_is_filtered(&req) {
                Some(Ok(Arc::new(resolve::filter_health(&all, &req, &filter))))
            } else {
                Some(Ok(all))
            }
        })
        .await
    }
}

/// One config entry.
pub struct CacheConfigEntry(Arc<Shared>);

#[async_trait]
impl DataSource<ConfigEntryRequest> for CacheConfigEntry {
    async fn notify(
        self: Arc<Self>,
        req: ConfigEntryRequest,
        id: CorrelationId,
        tx: EventSender<Option<Arc<ConfigEntry>>>,
        cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        let key = ConfigEntryKey {
            kind: req.kind,
            name: req.name,
        };
        run(self.0.caches.config_entry.watch(&key), id, tx, cancel, |v| Some(Ok(v))).await
    }
}

/// Config entries of a kind.
pub struct CacheConfigEntryList(Arc<Shared>);

#[async_trait]
impl DataSource<ConfigEntryListRequest> for CacheConfigEntryList {
    async fn notify(
        self: Arc<Self>,
        req: ConfigEntryListRequest,
        id: CorrelationId,
        tx: EventSender<Arc<Vec<Arc<ConfigEntry>>>>,
        cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        run(self.0.caches.config_entries.watch(&req.kind), id, tx, cancel, |v| {
            Some(Ok(v))
        })
        .await
    }
}

/// The global proxy-defaults entry and every service-defaults entry, as central config is
/// resolved from them.
struct Defaults {
    proxy: Input<Option<Arc<ConfigEntry>>>,
    services: Input<Arc<Vec<Arc<ConfigEntry>>>>,
}

impl Defaults {
    fn watch(caches: &AgentCaches) -> Self {
        Self {
            proxy: Input::new(caches.config_entry.watch(&ConfigEntryKey {
                kind: ConfigEntryKind::ProxyDefaults,
                name: "global".into(),
            })),
            services: Input::new(caches.config_entries.watch(&ConfigEntryKind::ServiceDefaults)),
        }
    }
}

/// Central config resolved for a service and its upstreams.
pub struct CacheResolvedServiceConfig(Arc<Shared>);

/// The inputs of a resolved service config.
struct ResolvedInputs {
    req: ResolvedServiceConfigRequest,
    defaults: Defaults,
}

impl Updates<Arc<ResolvedServiceConfig>> for ResolvedInputs {
    async fn next(&mut self) -> Step<Arc<ResolvedServiceConfig>> {
        let d = &mut self.defaults;
        let changed = tokio::select! {
            r = d.proxy.update() => r,
            r = d.services.update() => r,
        }?;
        if let Err(e) = changed {
            return Some(Some(Err(e)));
        }
        let (Some(proxy), Some(services)) = (&d.proxy.latest, &d.services.latest) else {
            return Some(None);
        };
        Some(Some(Ok(Arc::new(resolve::resolved_config(
            &self.req,
            proxy.as_ref(),
            services,
        )))))
    }
}

#[async_trait]
impl DataSource<ResolvedServiceConfigRequest> for CacheResolvedServiceConfig {
    async fn notify(
        self: Arc<Self>,
        req: ResolvedServiceConfigRequest,
        id: CorrelationId,
        tx: EventSender<Arc<ResolvedServiceConfig>>,
        cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        if let Err(e) = self.0.check_dc(&req.datacenter) {
            return forward::refuse(id, tx, e, cancel).await;
        }
        let inputs = ResolvedInputs {
            req,
            defaults: Defaults::watch(&self.0.caches),
        };
        forward::forward(cancel, inputs, ToState { id, tx }).await;
        Ok(())
    }
}

/// Discovery chains, compiled here from the cached config entries by the compiler the
/// servers use (`discovery_chain`, via `resolve`).
///
/// Every chain reads the resolver, router and splitter entries from the lists of their kinds
/// (three cache entries for all chains of the agent, rather than three blocking queries per
/// upstream name); a change to any of them recompiles the agent's chains, which is cheap.
pub struct CacheDiscoveryChain(Arc<Shared>);

/// The inputs of one chain.
struct ChainWatch {
    req: DiscoveryChainRequest,
    defaults: Defaults,
    roots: Input<Arc<IndexedCaRoots>>,
    resolvers: Input<Arc<Vec<Arc<ConfigEntry>>>>,
    routers: Input<Arc<Vec<Arc<ConfigEntry>>>>,
    splitters: Input<Arc<Vec<Arc<ConfigEntry>>>>,
    /// The chain sent last.
    last: Option<Arc<CompiledDiscoveryChain>>,
}

impl Updates<Arc<CompiledDiscoveryChain>> for ChainWatch {
    async fn next(&mut self) -> Step<Arc<CompiledDiscoveryChain>> {
        let changed = tokio::select! {
            r = self.defaults.proxy.update() => r,
            r = self.defaults.services.update() => r,
            r = self.roots.update() => r,
            r = self.resolvers.update() => r,
            r = self.routers.update() => r,
            r = self.splitters.update() => r,
        }?;
        if let Err(e) = changed {
            return Some(Some(Err(e)));
        }
        let (Some(proxy), Some(services), Some(roots), Some(resolvers), Some(routers), Some(splitters)) = (
            &self.defaults.proxy.latest,
            &self.defaults.services.latest,
            &self.roots.latest,
            &self.resolvers.latest,
            &self.routers.latest,
            &self.splitters.latest,
        ) else {
            return Some(None);
        };
        let inputs = ChainInputs {
            proxy_defaults: proxy.as_ref(),
            service_defaults: services,
            trust_domain: &roots.trust_domain,
            resolvers,
            routers,
            splitters,
        };
        match inputs.compile(&self.req) {
            // Another service's entry changed: this chain is what it was, nothing to send.
            Ok(chain) if self.last.as_deref() == Some(&chain) => Some(None),
            Ok(chain) => {
                let chain = Arc::new(chain);
                self.last = Some(Arc::clone(&chain));
                Some(Some(Ok(chain)))
            }
            Err(e) => {
                self.last = None;
                Some(Some(Err(e)))
            }
        }
    }
}

#[async_trait]
impl DataSource<DiscoveryChainRequest> for CacheDiscoveryChain {
    async fn notify(
        self: Arc<Self>,
        req: DiscoveryChainRequest,
        id: CorrelationId,
        tx: EventSender<Arc<CompiledDiscoveryChain>>,
        cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        if let Err(e) = self.0.check_dc(&req.datacenter) {
            return forward::refuse(id, tx, e, cancel).await;
        }
        let caches = &self.0.caches;
        let kind = |kind| Input::new(caches.config_entries.watch(&kind));
        let inputs = ChainWatch {
            defaults: Defaults::watch(caches),
            roots: Input::new(caches.roots.watch(&RootsKey)),
            resolvers: kind(ConfigEntryKind::ServiceResolver),
            routers: kind(ConfigEntryKind::ServiceRouter),
            splitters: kind(ConfigEntryKind::ServiceSplitter),
            last: None,
            req,
        };
        forward::forward(cancel, inputs, ToState { id, tx }).await;
        Ok(())
    }
}

/// Service names.
pub struct CacheServiceList(Arc<Shared>);

#[async_trait]
impl DataSource<ServiceListRequest> for CacheServiceList {
    async fn notify(
        self: Arc<Self>,
        req: ServiceListRequest,
        id: CorrelationId,
        tx: EventSender<ServiceNames>,
        cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        if let Err(e) = self.0.check_dc(&req.datacenter) {
            return forward::refuse(id, tx, e, cancel).await;
        }
        run(self.0.caches.services.watch(&ServicesKey), id, tx, cancel, |v| {
            Some(Ok(ServiceNames(v)))
        })
        .await
    }
}

/// The services a gateway fronts, from the servers (`/v1/catalog/gateway-services/:gateway`);
/// a value equal to the last one sent is not sent again.
pub struct CacheGatewayServices(Arc<Shared>);

#[async_trait]
impl DataSource<GatewayServicesRequest> for CacheGatewayServices {
    async fn notify(
        self: Arc<Self>,
        req: GatewayServicesRequest,
        id: CorrelationId,
        tx: EventSender<Arc<Vec<structs::GatewayService>>>,
        cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        if let Err(e) = self.0.check_dc(&req.datacenter) {
            return forward::refuse(id, tx, e, cancel).await;
        }
        let key = GatewayServicesKey { gateway: req.gateway };
        let mut last: Option<Arc<Vec<structs::GatewayService>>> = None;
        run(self.0.caches.gateway_services.watch(&key), id, tx, cancel, move |v| {
            crate::common::unless_unchanged(&mut last, &v).map(Ok)
        })
        .await
    }
}

/// Datacenter names.
pub struct CacheDatacenters(Arc<Shared>);

#[async_trait]
impl DataSource<DatacentersRequest> for CacheDatacenters {
    async fn notify(
        self: Arc<Self>,
        _req: DatacentersRequest,
        id: CorrelationId,
        tx: EventSender<DatacenterNames>,
        cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        run(self.0.caches.datacenters.watch(&DatacentersKey), id, tx, cancel, |v| {
            Some(Ok(DatacenterNames(v)))
        })
        .await
    }
}

/// HTTP checks of a local service instance, from the agent's own checks.
pub struct CacheHttpChecks(Arc<Shared>);

/// The agent's checks of one instance, delivered when they change.
struct LocalHttpChecks {
    local: Arc<dyn LocalChecks>,
    changes: watch::Receiver<u64>,
    service_id: String,
    last: Option<Arc<Vec<HealthCheck>>>,
}

impl Updates<Arc<Vec<HealthCheck>>> for LocalHttpChecks {
    async fn next(&mut self) -> Step<Arc<Vec<HealthCheck>>> {
        // The agent stopped: the watch ends.
        self.changes.changed().await.ok()?;
        let now = self.local.http_checks(&self.service_id);
        if self.last.as_deref() == Some(&now) {
            return Some(None);
        }
        let now = Arc::new(now);
        self.last = Some(Arc::clone(&now));
        Some(Some(Ok(now)))
    }
}

#[async_trait]
impl DataSource<HttpChecksRequest> for CacheHttpChecks {
    async fn notify(
        self: Arc<Self>,
        req: HttpChecksRequest,
        id: CorrelationId,
        tx: EventSender<Arc<Vec<HealthCheck>>>,
        cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        let mut changes = self.0.local.subscribe();
        changes.mark_changed();
        let updates = LocalHttpChecks {
            local: Arc::clone(&self.0.local),
            changes,
            service_id: req.service_id,
            last: None,
        };
        forward::forward(cancel, updates, ToState { id, tx }).await;
        Ok(())
    }
}
