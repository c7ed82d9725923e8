//! In-memory data sources for tests and benchmarks.
//!
//! A [`FakeSource`] keeps one value per request. Tests set (or fail) a request's value and
//! every watch of that request receives it, the current value first. It counts the watches
//! running on it, so a test can prove that none survive a proxy. Values are shared `Arc`s:
//! one `set` feeds every watching proxy the same allocation, as a real materialized view does.

use crate::CorrelationId;
use crate::data_sources::*;
use parking_lot::Mutex;
use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

type Value<R> = Option<Result<<R as WatchRequest>::Response, DataSourceError>>;
type Fallback<R> = Box<dyn Fn(&R) -> Option<<R as WatchRequest>::Response> + Send + Sync>;

/// A settable data source for one request type.
pub struct FakeSource<R: WatchRequest> {
    values: Mutex<HashMap<R, watch::Sender<Value<R>>>>,
    fallback: Mutex<Option<Fallback<R>>>,
    active: Arc<AtomicUsize>,
    started: AtomicU64,
}

impl<R: WatchRequest> Default for FakeSource<R> {
    fn default() -> Self {
        Self {
            values: Mutex::default(),
            fallback: Mutex::new(None),
            active: Arc::default(),
            started: AtomicU64::new(0),
        }
    }
}

struct ActiveGuard(Arc<AtomicUsize>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<R: WatchRequest> FakeSource<R> {
    fn sender(&self, req: &R) -> watch::Sender<Value<R>> {
        let mut values = self.values.lock();
        if let Some(tx) = values.get(req) {
            return tx.clone();
        }
        let initial = self.fallback.lock().as_ref().and_then(|f| f(req)).map(Ok);
        let tx = watch::Sender::new(initial);
        values.insert(req.clone(), tx.clone());
        tx
    }

    /// Sets the value of `req`; every watch of it receives the value.
    pub fn set(&self, req: &R, value: R::Response) {
        self.sender(req).send_replace(Some(Ok(value)));
    }

    /// Makes every watch of `req` receive an error.
    pub fn fail(&self, req: &R, err: DataSourceError) {
        self.sender(req).send_replace(Some(Err(err)));
    }

    /// Computes the value of any request that was never set.
    pub fn set_fallback(&self, f: impl Fn(&R) -> Option<R::Response> + Send + Sync + 'static) {
        *self.fallback.lock() = Some(Box::new(f));
    }

    /// Watches running now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// Watches of `req` running now.
    pub fn active_for(&self, req: &R) -> usize {
        self.values.lock().get(req).map_or(0, |tx| tx.receiver_count())
    }

    /// Watches ever started.
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }

    /// Requests with at least one running watch.
    pub fn watched_requests(&self) -> Vec<R> {
        self.values
            .lock()
            .iter()
            .filter(|(_, tx)| tx.receiver_count() > 0)
            .map(|(r, _)| r.clone())
            .collect()
    }
}

/// The scripted values of one request, counted as an active watch while held.
struct Watched<T> {
    rx: watch::Receiver<Option<Result<T, DataSourceError>>>,
    _active: ActiveGuard,
}

impl<T: Clone + Send + Sync> crate::forward::Updates<T> for Watched<T> {
    fn next(&mut self) -> impl std::future::Future<Output = crate::forward::Step<T>> + Send {
        crate::forward::Updates::next(&mut self.rx)
    }
}

/// Like the real sources, the watch future is the shared forward loop itself (no boxed
/// async wrapper around it), so benchmarks over fakes measure what production watches cost.
impl<R: WatchRequest> DataSource<R> for FakeSource<R> {
    fn notify<'w>(
        self: Arc<Self>,
        req: R,
        correlation_id: CorrelationId,
        tx: EventSender<R::Response>,
        cancel: CancellationToken,
    ) -> crate::WatchFuture<'w>
    where
        Self: 'w,
    {
        self.active.fetch_add(1, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::SeqCst);
        let mut rx = self.sender(&req).subscribe();
        rx.mark_changed();
        let updates = Watched {
            rx,
            _active: ActiveGuard(Arc::clone(&self.active)),
        };
        let sink = crate::forward::ToState { id: correlation_id, tx };
        Box::pin(futures_util::FutureExt::map(
            crate::forward::forward(cancel, updates, sink),
            Ok,
        ))
    }
}

/// One fake per data source, and the [`DataSources`] that use them.
#[derive(Default)]
pub struct FakeDataSources {
    /// CA roots.
    pub ca_roots: Arc<FakeSource<CaRootsRequest>>,
    /// Leaf certificates.
    pub leaf: Arc<FakeSource<LeafRequest>>,
    /// Intentions.
    pub intentions: Arc<FakeSource<IntentionsRequest>>,
    /// Health.
    pub health: Arc<FakeSource<HealthRequest>>,
    /// Discovery chains.
    pub discovery_chain: Arc<FakeSource<DiscoveryChainRequest>>,
    /// Config entries.
    pub config_entry: Arc<FakeSource<ConfigEntryRequest>>,
    /// Config entry lists.
    pub config_entry_list: Arc<FakeSource<ConfigEntryListRequest>>,
    /// Resolved service config.
    pub resolved_service_config: Arc<FakeSource<ResolvedServiceConfigRequest>>,
    /// Service lists.
    pub service_list: Arc<FakeSource<ServiceListRequest>>,
    /// Datacenters.
    pub datacenters: Arc<FakeSource<DatacentersRequest>>,
    /// Every datacenter's mesh gateways.
    pub mesh_gateways: Arc<FakeSource<MeshGatewaysRequest>>,
    /// Gateway services.
    pub gateway_services: Arc<FakeSource<GatewayServicesRequest>>,
    /// HTTP checks.
    pub http_checks: Arc<FakeSource<HttpChecksRequest>>,
    /// Prepared queries.
    pub prepared_query: Arc<FakeSource<PreparedQueryRequest>>,
    /// Services peers export here.
    pub peered_upstream: Arc<FakeSource<PeeredUpstreamRequest>>,
    /// Peers' trust bundles.
    pub peer_trust_bundles: Arc<FakeSource<PeerTrustBundlesRequest>>,
    /// Where the peering calls go.
    pub peering_servers: Arc<FakeSource<PeeringServersRequest>>,
}

impl FakeDataSources {
    /// Fakes where every watch a connect-proxy starts has a valid value at once: roots for
    /// `trust_domain`, a leaf for the requested service, no intentions, no mesh entry, an
    /// empty resolved config, each upstream's default chain, and no instances. Tests then set
    /// only what they are about.
    pub fn with_defaults(trust_domain: &str) -> Self {
        let fakes = Self::default();
        let td = trust_domain.to_owned();
        fakes.ca_roots.set_fallback(move |_| {
            Some(Arc::new(structs::IndexedCaRoots {
                active_root_id: "root-1".into(),
                trust_domain: td.clone(),
                ..Default::default()
            }))
        });
        fakes.leaf.set_fallback(|r| {
            Some(Arc::new(structs::IssuedCert {
                service: r.service.clone(),
                ..Default::default()
            }))
        });
        fakes.intentions.set_fallback(|_| Some(Arc::new(Vec::new())));
        fakes.config_entry.set_fallback(|_| Some(None));
        fakes
            .resolved_service_config
            .set_fallback(|_| Some(Arc::new(structs::ResolvedServiceConfig::default())));
        let td = trust_domain.to_owned();
        fakes.discovery_chain.set_fallback(move |r| {
            Some(Arc::new(structs::CompiledDiscoveryChain::default_for(
                &r.name,
                &r.datacenter,
                &td,
                r.override_protocol.unwrap_or_default(),
            )))
        });
        fakes.health.set_fallback(|_| Some(Arc::new(Vec::new())));
        fakes.peer_trust_bundles.set_fallback(|_| Some(Arc::new(Vec::new())));
        fakes.peering_servers.set_fallback(|_| Some(Arc::default()));
        fakes
    }

    /// The [`DataSources`] backed by these fakes.
    pub fn data_sources(&self) -> DataSources {
        DataSources {
            ca_roots: self.ca_roots.clone(),
            leaf: self.leaf.clone(),
            intentions: self.intentions.clone(),
            health: self.health.clone(),
            discovery_chain: self.discovery_chain.clone(),
            config_entry: self.config_entry.clone(),
            config_entry_list: self.config_entry_list.clone(),
            resolved_service_config: self.resolved_service_config.clone(),
            service_list: self.service_list.clone(),
            datacenters: self.datacenters.clone(),
            mesh_gateways: self.mesh_gateways.clone(),
            gateway_services: self.gateway_services.clone(),
            http_checks: self.http_checks.clone(),
            prepared_query: self.prepared_query.clone(),
            peered_upstream: self.peered_upstream.clone(),
            peer_trust_bundles: self.peer_trust_bundles.clone(),
            peering_servers: self.peering_servers.clone(),
        }
    }

    /// Watches running on all the fakes together.
    pub fn active(&self) -> usize {
        self.ca_roots.active()
            + self.leaf.active()
            + self.intentions.active()
            + self.health.active()
            + self.discovery_chain.active()
            + self.config_entry.active()
            + self.config_entry_list.active()
            + self.resolved_service_config.active()
            + self.service_list.active()
            + self.datacenters.active()
            + self.mesh_gateways.active()
            + self.gateway_services.active()
            + self.http_checks.active()
            + self.prepared_query.active()
            + self.peered_upstream.active()
            + self.peer_trust_bundles.active()
            + self.peering_servers.active()
    }
}

/// A sender to drive one data source directly (outside a State), and the receiving end of
/// what it sends.
pub fn event_channel<T: Into<UpdatePayload>>(
    buffer: usize,
) -> (EventSender<T>, tokio::sync::mpsc::Receiver<Box<crate::UpdateEvent>>) {
    let (tx, rx) = tokio::sync::mpsc::channel(buffer.max(1));
    (EventSender::new(tx, 1), rx)
}
