//! `Server*` data sources: proxycfg watches answered from the catalog's event publisher.
//! Used by servers for agentless proxies. Values derived from the catalog are materialized
//! once per change and shared by every proxy watching the same thing.

use crate::fanout::{Entry, Fanout, Publisher};
use crate::follow::Follower;
use crate::resolve;
use crate::views::Views;
use async_trait::async_trait;
use catalog::{Payload, Store, Topic};
use leaf::LeafWatch;
use proxycfg::data_sources::*;
use proxycfg::forward;
use proxycfg::{CorrelationId, DataSource, DataSourceError, DataSources, EventSender, Subscription, WatchFuture};
use std::sync::Arc;
use structs::{CheckServiceNode, CompiledDiscoveryChain, ConfigEntry, ConfigEntryKind, ResolvedServiceConfig};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod leaf;

/// What every server data source shares.
struct Shared {
    store: Store,
    resolved: Views<ResolvedServiceConfigRequest, ResolvedServiceConfig>,
    /// One follower per distinct request for the watches every proxy repeats.
    roots_followers: Fanout<CaRootsRequest, Arc<structs::IndexedCaRoots>>,
    /// One config entry, by kind and name (every sidecar watches the `mesh` entry).
    entry_followers: Fanout<(ConfigEntryKind, String), Option<Arc<ConfigEntry>>>,
    /// The proxy and service defaults every resolved config starts from.
    defaults_followers: Fanout<(), Arc<Defaults>>,
    health_followers: Fanout<HealthRequest, Arc<Vec<CheckServiceNode>>>,
    chain_followers: Fanout<DiscoveryChainRequest, Arc<CompiledDiscoveryChain>>,
}

impl Shared {
    fn check_dc(&self, dc: &str) -> Result<(), DataSourceError> {
        resolve::check_dc(dc, self.store.datacenter())
    }
}

/// Builds the server-mode [`DataSources`] over a catalog store (shared followers untracked:
/// each ends with its last watch or when the store closes).
pub fn server_data_sources(store: Store) -> DataSources {
    server_data_sources_tracked(store, &TaskTracker::new())
}

/// Builds the server-mode [`DataSources`]; every shared follower task they start is tracked
/// by `tasks`, so the owner can wait for them after its proxies stopped.
pub fn server_data_sources_tracked(store: Store, tasks: &TaskTracker) -> DataSources {
    let shared = Arc::new(Shared {
        store,
        resolved: Views::default(),
        roots_followers: Fanout::new("ca_roots", tasks.clone()),
        entry_followers: Fanout::new("config_entry", tasks.clone()),
        defaults_followers: Fanout::new("defaults", tasks.clone()),
        health_followers: Fanout::new("health", tasks.clone()),
        chain_followers: Fanout::new("discovery_chain", tasks.clone()),
    });
    DataSources {
        ca_roots: Arc::new(ServerCaRoots(Arc::clone(&shared))),
        leaf: Arc::new(ServerLeaf(Arc::clone(&shared))),
        intentions: Arc::new(ServerIntentions(Arc::clone(&shared))),
        health: Arc::new(ServerHealth(Arc::clone(&shared))),
        discovery_chain: Arc::new(ServerDiscoveryChain(Arc::clone(&shared))),
        config_entry: Arc::new(ServerConfigEntry(Arc::clone(&shared))),
        config_entry_list: Arc::new(ServerConfigEntryList(Arc::clone(&shared))),
        resolved_service_config: Arc::new(ServerResolvedServiceConfig(Arc::clone(&shared))),
        service_list: Arc::new(ServerServiceList(Arc::clone(&shared))),
        datacenters: Arc::new(ServerDatacenters(Arc::clone(&shared))),
        gateway_services: Arc::new(ServerGatewayServices(Arc::clone(&shared))),
        http_checks: Arc::new(ServerHttpChecks),
        prepared_query: Arc::new(crate::common::PreparedQueriesUnsupported),
    }
}

/// Runs `follower` until cancelled or the store closes, sending what `derive` makes of each
/// change (`None`: nothing to send yet).
fn run<T: Into<UpdatePayload> + Clone + Send>(
    follower: Follower,
    id: CorrelationId,
    tx: EventSender<T>,
    cancel: CancellationToken,
    derive: impl FnMut(&Follower) -> Option<Result<T, DataSourceError>> + Send,
) -> impl Future<Output = Result<(), DataSourceError>> + Send {
    let updates = Derived { follower, derive };
    futures_util::FutureExt::map(forward::forward(cancel, updates, forward::ToState { id, tx }), Ok)
}

/// Like [`run`] for a shared follower: publishes what `derive` makes of each change on
/// `publish` (every proxy's watch subscribes to it) until stopped or the store closes.
async fn publish_from<T: Clone + Send + Sync + 'static>(
    follower: Follower,
    publish: Publisher<T>,
    stop: CancellationToken,
    derive: impl FnMut(&Follower) -> Option<Result<T, DataSourceError>> + Send,
) {
    forward::forward(stop, Derived { follower, derive }, publish).await;
}

/// A catalog follower and what each of its changes means for one watch.
struct Derived<F> {
    follower: Follower,
    derive: F,
}

impl<T, F> forward::Updates<T> for Derived<F>
where
    F: FnMut(&Follower) -> Option<Result<T, DataSourceError>> + Send,
{
    async fn next(&mut self) -> forward::Step<T> {
        // The store closed: the watch ends.
        self.follower.changed().await.ok()?;
        Some((self.derive)(&self.follower))
    }
}

/// CA roots.
pub struct ServerCaRoots(Arc<Shared>);

impl DataSource<CaRootsRequest> for ServerCaRoots {
    fn notify<'w>(
        self: Arc<Self>,
        req: CaRootsRequest,
        id: CorrelationId,
        tx: EventSender<Arc<structs::IndexedCaRoots>>,
        cancel: CancellationToken,
    ) -> WatchFuture<'w>
    where
        Self: 'w,
    {
        crate::fanout::watch(self.follow(&req), id, tx, cancel)
    }

    fn subscribe(&self, req: &CaRootsRequest) -> Option<Box<dyn Subscription>> {
        Some(crate::fanout::subscribe(self.follow(req)))
    }
}

impl ServerCaRoots {
    fn follow(&self, req: &CaRootsRequest) -> Result<Arc<Entry<Arc<structs::IndexedCaRoots>>>, DataSourceError> {
        self.0.follow_roots(req)
    }
}

impl Shared {
    /// The shared follower of the CA roots.
    fn follow_roots(&self, req: &CaRootsRequest) -> Result<Arc<Entry<Arc<structs::IndexedCaRoots>>>, DataSourceError> {
        self.check_dc(&req.datacenter)?;
        Ok(self.roots_followers.follow(req, |publish, stop| {
            let follower = Follower::new(&self.store, vec![Topic::CaRoots]);
            publish_from(follower, publish, stop, |f| match f.get(0) {
                Some(Payload::CaRoots(roots)) => Some(Ok(Arc::clone(roots))),
                _ => None,
            })
        }))
    }
}

/// Leaf certificates, reissued when the CA changes and refreshed before they expire.
pub struct ServerLeaf(Arc<Shared>);

impl DataSource<LeafRequest> for ServerLeaf {
    fn notify<'w>(
        self: Arc<Self>,
        req: LeafRequest,
        id: CorrelationId,
        tx: EventSender<Arc<structs::IssuedCert>>,
        cancel: CancellationToken,
    ) -> WatchFuture<'w>
    where
        Self: 'w,
    {
        crate::fanout::watch_updates(LeafWatch::new(&self.0, req), id, tx, cancel)
    }

    fn subscribe(&self, req: &LeafRequest) -> Option<Box<dyn Subscription>> {
        Some(crate::fanout::boxed(LeafWatch::new(&self.0, req.clone())))
    }
}

/// Intentions by destination.
pub struct ServerIntentions(Arc<Shared>);

#[async_trait]
impl DataSource<IntentionsRequest> for ServerIntentions {
    async fn notify(
        self: Arc<Self>,
        req: IntentionsRequest,
        id: CorrelationId,
        tx: EventSender<Arc<Vec<structs::Intention>>>,
        cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        if let Err(e) = self.0.check_dc(&req.datacenter) {
            return forward::refuse(id, tx, e, cancel).await;
        }
        let follower = Follower::new(&self.0.store, vec![Topic::Intentions(req.destination.clone())]);
        run(follower, id, tx, cancel, |f| match f.get(0) {
            Some(Payload::Intentions(ixns)) => Some(Ok(Arc::clone(ixns))),
            _ => None,
        })
        .await
    }
}

/// Service health, optionally connect instances, passing only and of one kind. The filtered
/// result is shared by every watch asking the same question.
pub struct ServerHealth(Arc<Shared>);

impl DataSource<HealthRequest> for ServerHealth {
    fn notify<'w>(
        self: Arc<Self>,
        req: HealthRequest,
        id: CorrelationId,
        tx: EventSender<Arc<Vec<CheckServiceNode>>>,
        cancel: CancellationToken,
    ) -> WatchFuture<'w>
    where
        Self: 'w,
    {
        crate::fanout::watch(self.follow(req), id, tx, cancel)
    }

    fn subscribe(&self, req: &HealthRequest) -> Option<Box<dyn Subscription>> {
        Some(crate::fanout::subscribe(self.follow(req.clone())))
    }
}

impl ServerHealth {
    /// The shared follower answering `req`.
    fn follow(&self, mut req: HealthRequest) -> Result<Arc<Entry<Arc<Vec<CheckServiceNode>>>>, DataSourceError> {
        self.0.check_dc(&req.datacenter)?;
        // A server reads its own state: the answer does not depend on the proxy's token (its
        // stream is authorized apart), so proxies with different tokens share one follower.
        req.token.clear();
        let filter = resolve::subset_filter(&req)?;
        let topic = if req.connect {
            Topic::ServiceHealthConnect(req.service.clone())
        } else {
            Topic::ServiceHealth(req.service.clone())
        };
        // One follower per distinct request (the fanout): its filtered result is computed
        // once per change and shared by every watch asking the same.
        Ok(self.0.health_followers.follow(&req.clone(), |publish, stop| {
            let follower = Follower::new(&self.0.store, vec![topic]);
            let mut last: Option<Arc<Vec<CheckServiceNode>>> = None;
            publish_from(follower, publish, stop, move |f| {
                let Some(Payload::Health(all)) = f.get(0) else {
                    return None;
                };
                if !resolve::health_is_filtered(&req) {
                    return Some(Ok(Arc::clone(all)));
                }
                let filtered = resolve::filter_health(all, &req, &filter);
                // A change the filter does not see (another subset's instance, a check of an
                // instance that stays out) is not sent: no snapshot, no rebuild.
                if last.as_deref() == Some(&filtered) {
                    return None;
                }
                let filtered = Arc::new(filtered);
                last = Some(Arc::clone(&filtered));
                Some(Ok(filtered))
            })
        }))
    }
}

/// One config entry: one shared follower per kind and name.
pub struct ServerConfigEntry(Arc<Shared>);

impl DataSource<ConfigEntryRequest> for ServerConfigEntry {
    fn notify<'w>(
        self: Arc<Self>,
        req: ConfigEntryRequest,
        id: CorrelationId,
        tx: EventSender<Option<Arc<ConfigEntry>>>,
        cancel: CancellationToken,
    ) -> WatchFuture<'w>
    where
        Self: 'w,
    {
        crate::fanout::watch(Ok(self.follow(&req)), id, tx, cancel)
    }

    fn subscribe(&self, req: &ConfigEntryRequest) -> Option<Box<dyn Subscription>> {
        Some(crate::fanout::subscribe(Ok(self.follow(req))))
    }
}

impl ServerConfigEntry {
    fn follow(&self, req: &ConfigEntryRequest) -> Arc<Entry<Option<Arc<ConfigEntry>>>> {
        let key = (req.kind, req.name.clone());
        self.0.entry_followers.follow(&key, |publish, stop| {
            let follower = Follower::new(&self.0.store, vec![Topic::ConfigEntry(req.kind, req.name.clone())]);
            publish_from(follower, publish, stop, |f| match f.get(0) {
                Some(Payload::ConfigEntry(entry)) => Some(Ok(entry.clone())),
                _ => None,
            })
        })
    }
}

/// Config entries of a kind.
pub struct ServerConfigEntryList(Arc<Shared>);

#[async_trait]
impl DataSource<ConfigEntryListRequest> for ServerConfigEntryList {
    async fn notify(
        self: Arc<Self>,
        req: ConfigEntryListRequest,
        id: CorrelationId,
        tx: EventSender<Arc<Vec<Arc<ConfigEntry>>>>,
        cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        let follower = Follower::new(&self.0.store, vec![Topic::ConfigEntries(req.kind)]);
        run(follower, id, tx, cancel, |f| match f.get(0) {
            Some(Payload::ConfigEntries(entries)) => Some(Ok(Arc::clone(entries))),
            _ => None,
        })
        .await
    }
}

fn defaults_topics() -> Vec<Topic> {
    vec![
        Topic::ConfigEntry(ConfigEntryKind::ProxyDefaults, "global".into()),
        Topic::ConfigEntries(ConfigEntryKind::ServiceDefaults),
    ]
}

/// The inputs every resolved service config is made from: the global proxy defaults and every
/// service's defaults, with the indexes they were read at.
struct Defaults {
    proxy: Option<Arc<ConfigEntry>>,
    services: Arc<Vec<Arc<ConfigEntry>>>,
    versions: Vec<u64>,
}

/// Central config resolved for a service and its upstreams: each watch derives its own from
/// the defaults one shared follower reads (the derived value itself shared through the views
/// when another proxy asks the same).
pub struct ServerResolvedServiceConfig(Arc<Shared>);

impl DataSource<ResolvedServiceConfigRequest> for ServerResolvedServiceConfig {
    fn notify<'w>(
        self: Arc<Self>,
        req: ResolvedServiceConfigRequest,
        id: CorrelationId,
        tx: EventSender<Arc<ResolvedServiceConfig>>,
        cancel: CancellationToken,
    ) -> WatchFuture<'w>
    where
        Self: 'w,
    {
        crate::fanout::watch_updates(resolved_watch(&self.0, req), id, tx, cancel)
    }

    fn subscribe(&self, req: &ResolvedServiceConfigRequest) -> Option<Box<dyn Subscription>> {
        Some(crate::fanout::boxed(resolved_watch(&self.0, req.clone())))
    }
}

type ResolvedWatch = crate::fanout::Derived<
    Arc<Defaults>,
    Box<dyn FnMut(Arc<Defaults>) -> Option<Result<Arc<ResolvedServiceConfig>, DataSourceError>> + Send>,
>;

/// The watch of `req`: the shared defaults, resolved for it.
fn resolved_watch(shared: &Arc<Shared>, req: ResolvedServiceConfigRequest) -> Result<ResolvedWatch, DataSourceError> {
    shared.check_dc(&req.datacenter)?;
    let defaults = shared.defaults_followers.follow(&(), |publish, stop| {
        let follower = Follower::new(&shared.store, defaults_topics());
        publish_from(follower, publish, stop, |f| {
            let (Some(Payload::ConfigEntry(proxy)), Some(Payload::ConfigEntries(services))) = (f.get(0), f.get(1))
            else {
                return None;
            };
            Some(Ok(Arc::new(Defaults {
                proxy: proxy.clone(),
                services: Arc::clone(services),
                versions: f.versions(),
            })))
        })
    });
    let shared = Arc::clone(shared);
    let derive = move |d: Arc<Defaults>| {
        Some(Ok(shared.resolved.get_or_make(&req, &d.versions, || {
            resolve::resolved_config(&req, d.proxy.as_ref(), &d.services)
        })))
    };
    Ok(crate::fanout::Derived::new(defaults, Box::new(derive)))
}

/// Discovery chains, compiled from the routing entries (`discovery_chain`). A chain reads
/// every resolver, router and splitter (it may lead through other services' entries), so a
/// change to any of them recompiles it; an unchanged result is not sent again.
pub struct ServerDiscoveryChain(Arc<Shared>);

impl DataSource<DiscoveryChainRequest> for ServerDiscoveryChain {
    fn notify<'w>(
        self: Arc<Self>,
        req: DiscoveryChainRequest,
        id: CorrelationId,
        tx: EventSender<Arc<CompiledDiscoveryChain>>,
        cancel: CancellationToken,
    ) -> WatchFuture<'w>
    where
        Self: 'w,
    {
        crate::fanout::watch(self.follow(req), id, tx, cancel)
    }

    fn subscribe(&self, req: &DiscoveryChainRequest) -> Option<Box<dyn Subscription>> {
        Some(crate::fanout::subscribe(self.follow(req.clone())))
    }
}

impl ServerDiscoveryChain {
    /// The shared follower compiling the chain `req` asks for.
    fn follow(&self, req: DiscoveryChainRequest) -> Result<Arc<Entry<Arc<CompiledDiscoveryChain>>>, DataSourceError> {
        self.0.check_dc(&req.datacenter)?;
        let mut topics = defaults_topics();
        topics.push(Topic::CaRoots);
        topics.push(Topic::ConfigEntries(ConfigEntryKind::ServiceResolver));
        topics.push(Topic::ConfigEntries(ConfigEntryKind::ServiceRouter));
        topics.push(Topic::ConfigEntries(ConfigEntryKind::ServiceSplitter));
        let key = req.clone();
        Ok(self.0.chain_followers.follow(&key, |publish, stop| {
            let follower = Follower::new(&self.0.store, topics);
            let mut last: Option<Arc<CompiledDiscoveryChain>> = None;
            publish_from(follower, publish, stop, move |f| {
                let (
                    Some(Payload::ConfigEntry(proxy)),
                    Some(Payload::ConfigEntries(services)),
                    Some(Payload::CaRoots(roots)),
                    Some(Payload::ConfigEntries(resolvers)),
                    Some(Payload::ConfigEntries(routers)),
                    Some(Payload::ConfigEntries(splitters)),
                ) = (f.get(0), f.get(1), f.get(2), f.get(3), f.get(4), f.get(5))
                else {
                    return None;
                };
                let inputs = resolve::ChainInputs {
                    proxy_defaults: proxy.as_ref(),
                    service_defaults: services,
                    trust_domain: &roots.trust_domain,
                    resolvers,
                    routers,
                    splitters,
                };
                match inputs.compile(&req) {
                    // Another service's entry changed: this chain is what it was.
                    Ok(chain) if last.as_deref() == Some(&chain) => None,
                    Ok(chain) => {
                        let chain = Arc::new(chain);
                        last = Some(Arc::clone(&chain));
                        Some(Ok(chain))
                    }
                    Err(e) => {
                        last = None;
                        Some(Err(e))
                    }
                }
            })
        }))
    }
}

/// Service names.
pub struct ServerServiceList(Arc<Shared>);

#[async_trait]
impl DataSource<ServiceListRequest> for ServerServiceList {
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
        let follower = Follower::new(&self.0.store, vec![Topic::ServiceList]);
        run(follower, id, tx, cancel, |f| match f.get(0) {
            Some(Payload::ServiceList(names)) => Some(Ok(ServiceNames(Arc::clone(names)))),
            _ => None,
        })
        .await
    }
}

/// The services a gateway fronts (`*` expanded), as the catalog derives them; a value equal
/// to the last one sent (a service write that did not change what `*` means) is not sent.
pub struct ServerGatewayServices(Arc<Shared>);

#[async_trait]
impl DataSource<GatewayServicesRequest> for ServerGatewayServices {
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
        let follower = Follower::new(&self.0.store, vec![Topic::GatewayServices(req.gateway.clone())]);
        let mut last: Option<Arc<Vec<structs::GatewayService>>> = None;
        run(follower, id, tx, cancel, move |f| match f.get(0) {
            Some(Payload::GatewayServices(list)) => crate::common::unless_unchanged(&mut last, list).map(Ok),
            _ => None,
        })
        .await
    }
}

/// Datacenters: this server knows its own only.
pub struct ServerDatacenters(Arc<Shared>);

#[async_trait]
impl DataSource<DatacentersRequest> for ServerDatacenters {
    async fn notify(
        self: Arc<Self>,
        _req: DatacentersRequest,
        id: CorrelationId,
        tx: EventSender<DatacenterNames>,
        cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        let names = DatacenterNames(Arc::new(vec![self.0.store.datacenter().to_owned()]));
        if tx.send(id, Ok(names)).await.is_ok() {
            cancel.cancelled().await;
        }
        Ok(())
    }
}

/// HTTP checks: an agentless proxy has no local agent running its service's checks, so the
/// list is empty (as on Consul servers).
pub struct ServerHttpChecks;

#[async_trait]
impl DataSource<HttpChecksRequest> for ServerHttpChecks {
    async fn notify(
        self: Arc<Self>,
        _req: HttpChecksRequest,
        id: CorrelationId,
        tx: EventSender<Arc<Vec<structs::HealthCheck>>>,
        cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        if tx.send(id, Ok(Arc::new(Vec::new()))).await.is_ok() {
            cancel.cancelled().await;
        }
        Ok(())
    }
}
