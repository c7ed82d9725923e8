//! Data sources: where a proxy's watches get their data.
//!
//! Every resource has one request type and one response type, and every data source has the
//! same shape: [`DataSource::notify`] runs a watch for one request, sending an
//! [`UpdateEvent`] tagged with the caller's [`CorrelationId`] whenever the result changes,
//! until its cancellation token fires or the receiver goes away. Agent mode (over the agent
//! cache) and server mode (over the catalog's event publisher) plug different
//! implementations into [`DataSources`]; `fake` has in-memory ones for tests.

use crate::CorrelationId;
use async_trait::async_trait;
use std::{fmt, hash::Hash, marker::PhantomData, sync::Arc};
use structs::{
    CheckServiceNode, CompiledDiscoveryChain, ConfigEntry, ConfigEntryKind, GatewayService, HealthCheck,
    IndexedCaRoots, Intention, IssuedCert, MeshGatewayMode, ResolvedServiceConfig, ServiceKind, Token, UpstreamId,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Why a data source could not deliver a result. The State logs it and keeps the last good
/// data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataSourceError {
    /// The backing store or server could not be reached or answered with an error.
    #[error("data source unavailable: {0}")]
    Unavailable(String),
    /// The token lacks permission for this resource.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The request itself is invalid (a bug or bad registration).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

/// A watch request: identifies what to watch and fixes the type of its results.
pub trait WatchRequest: Clone + Eq + Hash + fmt::Debug + Send + Sync + 'static {
    /// What the watch delivers.
    type Response: Clone + Send + Sync + 'static + Into<UpdatePayload>;
}

/// The data one update carries. Payloads are `Arc`s so one result can be shared by every
/// proxy that watches the same thing.
#[derive(Debug, Clone)]
pub enum UpdatePayload {
    /// The trust bundle.
    CaRoots(Arc<IndexedCaRoots>),
    /// A leaf certificate.
    Leaf(Arc<IssuedCert>),
    /// Intentions for a destination, in evaluation order.
    Intentions(Arc<Vec<Intention>>),
    /// Service instances with their checks.
    Health(Arc<Vec<CheckServiceNode>>),
    /// A compiled discovery chain.
    DiscoveryChain(Arc<CompiledDiscoveryChain>),
    /// One config entry, or `None` when it does not exist.
    ConfigEntry(Option<Arc<ConfigEntry>>),
    /// Every config entry of a kind.
    ConfigEntryList(Arc<Vec<Arc<ConfigEntry>>>),
    /// Central config resolved for a service.
    ResolvedServiceConfig(Arc<ResolvedServiceConfig>),
    /// Service names.
    ServiceList(Arc<Vec<String>>),
    /// Datacenter names.
    Datacenters(Arc<Vec<String>>),
    /// Every datacenter's mesh gateways, by datacenter.
    MeshGateways(Arc<std::collections::BTreeMap<String, Arc<Vec<CheckServiceNode>>>>),
    /// Services fronted by a gateway.
    GatewayServices(Arc<Vec<GatewayService>>),
    /// Health checks of a service.
    HttpChecks(Arc<Vec<HealthCheck>>),
    /// A service a peer exports here, with the peer's roots.
    PeeredUpstream(Arc<structs::peering::PeeredUpstream>),
    /// The trust bundles of the peers a service is exported to.
    PeerTrustBundles(Arc<Vec<structs::peering::PeerTrustBundle>>),
    /// Where the peering calls go.
    PeeringServers(Arc<structs::peering::PeeringServers>),
}

macro_rules! payload_from {
    ($($variant:ident($ty:ty)),* $(,)?) => {$(
        impl From<$ty> for UpdatePayload {
            fn from(v: $ty) -> Self { UpdatePayload::$variant(v) }
        }
    )*};
}

payload_from! {
    CaRoots(Arc<IndexedCaRoots>),
    Leaf(Arc<IssuedCert>),
    Intentions(Arc<Vec<Intention>>),
    Health(Arc<Vec<CheckServiceNode>>),
    DiscoveryChain(Arc<CompiledDiscoveryChain>),
    ConfigEntry(Option<Arc<ConfigEntry>>),
    ConfigEntryList(Arc<Vec<Arc<ConfigEntry>>>),
    ResolvedServiceConfig(Arc<ResolvedServiceConfig>),
    GatewayServices(Arc<Vec<GatewayService>>),
    HttpChecks(Arc<Vec<HealthCheck>>),
    PeeredUpstream(Arc<structs::peering::PeeredUpstream>),
    PeerTrustBundles(Arc<Vec<structs::peering::PeerTrustBundle>>),
    PeeringServers(Arc<structs::peering::PeeringServers>),
}

/// One change from one watch.
#[derive(Debug, Clone)]
pub struct UpdateEvent {
    /// Which watch it came from.
    pub correlation_id: CorrelationId,
    /// The new data, or why there is none.
    pub result: Result<UpdatePayload, DataSourceError>,
    /// Which start of that watch sent it; updates from a cancelled start are dropped.
    pub(crate) generation: u64,
}

/// The channel a running watch sends its results into. Typed by the response, so a data
/// source can only send what its request promises.
pub struct EventSender<T> {
    tx: mpsc::Sender<Box<UpdateEvent>>,
    generation: u64,
    _response: PhantomData<fn(T)>,
}

impl<T> Clone for EventSender<T> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            generation: self.generation,
            _response: PhantomData,
        }
    }
}

/// The receiving State has gone away; the watch should end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the proxy state that started this watch has stopped")]
pub struct ReceiverGone;

impl<T: Into<UpdatePayload>> EventSender<T> {
    pub(crate) fn new(tx: mpsc::Sender<Box<UpdateEvent>>, generation: u64) -> Self {
        Self {
            tx,
            generation,
            _response: PhantomData,
        }
    }

    /// Delivers one result for `correlation_id`; waits while the State is busy.
    pub async fn send(
        &self,
        correlation_id: CorrelationId,
        result: Result<T, DataSourceError>,
    ) -> Result<(), ReceiverGone> {
        // Boxed: the State's queue then holds pointers, and its buffer stays small.
        let event = Box::new(UpdateEvent {
            correlation_id,
            result: result.map(Into::into),
            generation: self.generation,
        });
        match self.tx.try_send(event) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(ReceiverGone),
            // The rare slow path is boxed so that every watch future stays small.
            Err(mpsc::error::TrySendError::Full(event)) => {
                Box::pin(self.tx.send(event)).await.map_err(|_| ReceiverGone)
            }
        }
    }

    /// True once the State has stopped listening.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// The first result a watch of `req` on `source` delivers, within `within`; the watch then
/// ends. For one-off questions asked of the sources the proxies watch (`meshd
/// troubleshoot`'s intentions), answered as a proxy's watch would be. `correlation_id` tags
/// the watch as a proxy's would be tagged.
pub async fn first_update<R: WatchRequest>(
    source: Arc<dyn DataSource<R>>,
    req: R,
    correlation_id: CorrelationId,
    within: std::time::Duration,
) -> Result<UpdatePayload, String> {
    let fetch = async {
        if let Some(mut subscription) = source.subscribe(&req) {
            return match std::future::poll_fn(|cx| subscription.poll_next(cx)).await {
                Some(result) => result.map_err(|e| e.to_string()),
                None => Err("the source has ended".to_owned()),
            };
        }
        let (tx, mut rx) = mpsc::channel(1);
        let cancel = CancellationToken::new();
        let _stop = cancel.clone().drop_guard();
        let watch = source.notify(req, correlation_id, EventSender::new(tx, 0), cancel);
        tokio::select! {
            event = rx.recv() => match event {
                Some(event) => event.result.map_err(|e| e.to_string()),
                None => Err("the watch ended without a result".to_owned()),
            },
            ended = watch => Err(match ended {
                Err(e) => e.to_string(),
                Ok(()) => "the watch ended without a result".to_owned(),
            }),
        }
    };
    tokio::time::timeout(within, fetch)
        .await
        .map_err(|_| format!("no answer within {within:?}"))?
}

/// The future of one running watch (what [`DataSource::notify`] returns once `async_trait`
/// has boxed it).
pub type WatchFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), DataSourceError>> + Send + 'a>>;

/// A source of one kind of watched data. Sources are shared (`Arc`), and each watch's
/// future owns a reference, so it runs independently of whoever started it.
///
/// Implement it with `#[async_trait]`, or, where many watches run at once and their size
/// matters, as `fn notify<'w>(..) -> WatchFuture<'w> where Self: 'w`: work done before
/// boxing is not part of the future that lives as long as the watch.
#[async_trait]
pub trait DataSource<R: WatchRequest>: Send + Sync {
    /// Runs one watch: sends the current result (once known) and every change after it to
    /// `tx`, tagged `correlation_id`, until `cancel` fires or `tx` is closed. Returns `Ok` when
    /// stopped that way, `Err` if the watch cannot run at all. The returned future may also
    /// simply be dropped (a single watch is cancelled that way); implementations release what
    /// they hold on drop.
    async fn notify(
        self: Arc<Self>,
        req: R,
        correlation_id: CorrelationId,
        tx: EventSender<R::Response>,
        cancel: CancellationToken,
    ) -> Result<(), DataSourceError>;

    /// A subscription to `req` that the State polls itself, if this source can give one
    /// (`None` by default: the watch runs [`DataSource::notify`]'s future). A source whose
    /// values are shared by many watches (a follower per distinct request, publishing its
    /// latest value) answers here: such a watch then costs a few words and a waker slot, not a
    /// future, a task node and an abort handle of its own. Dropping it ends the watch.
    fn subscribe(&self, _req: &R) -> Option<Box<dyn Subscription>> {
        None
    }
}

/// A watch polled by its State's own task (see [`DataSource::subscribe`]): the latest result
/// it has not yet yielded, once there is one.
pub trait Subscription: Send {
    /// `Ready(Some(result))` for a result not yielded before; `Pending` (with `cx`'s waker
    /// registered) until there is one; `Ready(None)` once the source has ended (the store
    /// closed), after which it is not polled again.
    fn poll_next(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<UpdatePayload, DataSourceError>>>;
}

/// Trust bundle of a datacenter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CaRootsRequest {
    /// Datacenter.
    pub datacenter: String,
}

/// Leaf certificate for a service identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeafRequest {
    /// Datacenter.
    pub datacenter: String,
    /// Service name the certificate identifies.
    pub service: String,
    /// DNS names the certificate also carries (an ingress gateway's hosts when it serves
    /// TLS from the mesh CA); empty for most proxies.
    pub dns_sans: Vec<String>,
    /// Token to authorize the signing request (none: the data source's own).
    pub token: Option<Token>,
}

/// Intentions that apply to a destination service (exact and wildcard).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IntentionsRequest {
    /// Datacenter.
    pub datacenter: String,
    /// Destination service name.
    pub destination: String,
}

/// Instances of a service with their health.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HealthRequest {
    /// Datacenter.
    pub datacenter: String,
    /// Service name.
    pub service: String,
    /// Return the service's connect-capable instances (its sidecars, or itself if native)
    /// rather than the service instances.
    pub connect: bool,
    /// Only instances whose every check passes.
    pub passing_only: bool,
    /// Only instances with no check critical or in maintenance (warning ones stay, as Consul
    /// sends traffic to them unless a subset says `OnlyPassing`).
    pub healthy_only: bool,
    /// Subset filter expression (empty: all).
    pub filter: String,
    /// Only instances of this kind (gateways); `None`: any kind.
    pub kind: Option<ServiceKind>,
    /// The proxy's token: the servers filter instances by what it may read (none: the
    /// reader's own).
    pub token: Option<Token>,
}

/// Compiled discovery chain of one upstream name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DiscoveryChainRequest {
    /// Datacenter the chain is evaluated in.
    pub datacenter: String,
    /// Upstream service name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Protocol set on the upstream itself (overrides service-defaults).
    pub override_protocol: Option<structs::Protocol>,
    /// Connect timeout set on the upstream itself, ms (0 = none).
    pub override_connect_timeout_ms: u32,
    /// Mesh gateway mode set on the upstream or proxy.
    pub override_mesh_gateway: MeshGatewayMode,
}

/// One config entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConfigEntryRequest {
    /// Kind.
    pub kind: ConfigEntryKind,
    /// Name.
    pub name: String,
}

/// Every config entry of a kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConfigEntryListRequest {
    /// Kind.
    pub kind: ConfigEntryKind,
    /// The reader's token, for kinds whose reading takes more than `service:read` (none:
    /// the agent's, one watch shared by every proxy of the agent). A server reads its own
    /// state and ignores it (the proxy's stream is authorized apart).
    pub token: Option<Token>,
}

impl ConfigEntryListRequest {
    /// Every entry of `kind`, as the proxy holding `token` reads them: with its token where
    /// the kind needs more than `service:read`
    /// ([`ConfigEntryKind::read_beyond_services`]), else shared.
    pub fn for_proxy(kind: ConfigEntryKind, token: Option<&Token>) -> Self {
        Self {
            kind,
            token: token.filter(|_| kind.read_beyond_services()).cloned(),
        }
    }

    /// Every entry of `kind`, read with the agent's token (one watch shared by every proxy).
    pub fn shared(kind: ConfigEntryKind) -> Self {
        Self { kind, token: None }
    }
}

/// Central config resolved for a service and its upstreams.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResolvedServiceConfigRequest {
    /// Datacenter.
    pub datacenter: String,
    /// Service name.
    pub name: String,
    /// Upstreams to resolve settings for.
    pub upstreams: Vec<UpstreamId>,
}

/// Every service name in a datacenter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceListRequest {
    /// Datacenter.
    pub datacenter: String,
    /// Only services with a typical instance (not proxies or gateways): a transparent
    /// proxy's candidate upstreams.
    pub typical_only: bool,
}

/// Every known datacenter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DatacentersRequest;

/// The mesh gateways of every datacenter, this one's too, as the federation states say: a
/// mesh gateway routes other datacenters' SNIs to theirs, a sidecar sends connections for
/// another datacenter through this one's (mode `local`) or theirs (`remote`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MeshGatewaysRequest {
    /// This proxy's datacenter.
    pub datacenter: String,
}

/// Services fronted by a gateway.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GatewayServicesRequest {
    /// Datacenter.
    pub datacenter: String,
    /// Gateway service name.
    pub gateway: String,
}

/// HTTP (and gRPC) checks of a local service instance.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HttpChecksRequest {
    /// Instance id.
    pub service_id: String,
}

/// Results of executing a prepared query.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PreparedQueryRequest {
    /// Datacenter.
    pub datacenter: String,
    /// Query name or id.
    pub query: String,
}

/// A service a peer exports here (an upstream with `DestinationPeer`), with the peer's
/// trust bundle.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeeredUpstreamRequest {
    /// The peer, by the name this cluster gives it.
    pub peer: String,
    /// The service.
    pub service: String,
    /// The proxy's token (`service:read` on the service).
    pub token: Option<Token>,
}

/// The trust bundles of the peers a service is exported to: whose callers its sidecar
/// accepts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerTrustBundlesRequest {
    /// The exported service.
    pub service: String,
    /// The proxy's token (`service:write` on the service).
    pub token: Option<Token>,
}

/// Where the peering calls go: this cluster's servers and the servers of the peers it
/// dials (a mesh gateway carrying them, `Peering.PeerThroughMeshGateways`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PeeringServersRequest {}

macro_rules! requests {
    ($($req:ty => $resp:ty),* $(,)?) => {$(
        impl WatchRequest for $req { type Response = $resp; }
    )*};
}

requests! {
    CaRootsRequest => Arc<IndexedCaRoots>,
    LeafRequest => Arc<IssuedCert>,
    IntentionsRequest => Arc<Vec<Intention>>,
    HealthRequest => Arc<Vec<CheckServiceNode>>,
    DiscoveryChainRequest => Arc<CompiledDiscoveryChain>,
    ConfigEntryRequest => Option<Arc<ConfigEntry>>,
    ConfigEntryListRequest => Arc<Vec<Arc<ConfigEntry>>>,
    ResolvedServiceConfigRequest => Arc<ResolvedServiceConfig>,
    ServiceListRequest => ServiceNames,
    DatacentersRequest => DatacenterNames,
    MeshGatewaysRequest => MeshGatewaysByDc,
    GatewayServicesRequest => Arc<Vec<GatewayService>>,
    HttpChecksRequest => Arc<Vec<HealthCheck>>,
    PreparedQueryRequest => PreparedQueryResult,
    PeeredUpstreamRequest => Arc<structs::peering::PeeredUpstream>,
    PeerTrustBundlesRequest => Arc<Vec<structs::peering::PeerTrustBundle>>,
    PeeringServersRequest => Arc<structs::peering::PeeringServers>,
}

/// Service names of a datacenter (distinct from datacenter names so the types cannot mix).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceNames(pub Arc<Vec<String>>);

/// Datacenter names.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DatacenterNames(pub Arc<Vec<String>>);

/// Every datacenter's mesh gateways, by datacenter (as the federation states say).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MeshGatewaysByDc(pub Arc<std::collections::BTreeMap<String, Arc<Vec<CheckServiceNode>>>>);

/// Instances a prepared query returned.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PreparedQueryResult(pub Arc<Vec<CheckServiceNode>>);

impl From<ServiceNames> for UpdatePayload {
    fn from(v: ServiceNames) -> Self {
        UpdatePayload::ServiceList(v.0)
    }
}

impl From<DatacenterNames> for UpdatePayload {
    fn from(v: DatacenterNames) -> Self {
        UpdatePayload::Datacenters(v.0)
    }
}

impl From<MeshGatewaysByDc> for UpdatePayload {
    fn from(v: MeshGatewaysByDc) -> Self {
        UpdatePayload::MeshGateways(v.0)
    }
}

impl From<PreparedQueryResult> for UpdatePayload {
    fn from(v: PreparedQueryResult) -> Self {
        UpdatePayload::Health(v.0)
    }
}

/// One implementation of every data source; the Manager's only way to get data.
#[derive(Clone)]
pub struct DataSources {
    /// CA roots.
    pub ca_roots: Arc<dyn DataSource<CaRootsRequest>>,
    /// Leaf certificates.
    pub leaf: Arc<dyn DataSource<LeafRequest>>,
    /// Intentions by destination.
    pub intentions: Arc<dyn DataSource<IntentionsRequest>>,
    /// Service health.
    pub health: Arc<dyn DataSource<HealthRequest>>,
    /// Compiled discovery chains.
    pub discovery_chain: Arc<dyn DataSource<DiscoveryChainRequest>>,
    /// Single config entries.
    pub config_entry: Arc<dyn DataSource<ConfigEntryRequest>>,
    /// Config entries by kind.
    pub config_entry_list: Arc<dyn DataSource<ConfigEntryListRequest>>,
    /// Resolved service config.
    pub resolved_service_config: Arc<dyn DataSource<ResolvedServiceConfigRequest>>,
    /// Service names.
    pub service_list: Arc<dyn DataSource<ServiceListRequest>>,
    /// Datacenter names.
    pub datacenters: Arc<dyn DataSource<DatacentersRequest>>,
    /// Every datacenter's mesh gateways.
    pub mesh_gateways: Arc<dyn DataSource<MeshGatewaysRequest>>,
    /// Services behind a gateway.
    pub gateway_services: Arc<dyn DataSource<GatewayServicesRequest>>,
    /// HTTP checks of a local service.
    pub http_checks: Arc<dyn DataSource<HttpChecksRequest>>,
    /// Prepared query results.
    pub prepared_query: Arc<dyn DataSource<PreparedQueryRequest>>,
    /// Services peers export here.
    pub peered_upstream: Arc<dyn DataSource<PeeredUpstreamRequest>>,
    /// Peers' trust bundles.
    pub peer_trust_bundles: Arc<dyn DataSource<PeerTrustBundlesRequest>>,
    /// Where the peering calls go.
    pub peering_servers: Arc<dyn DataSource<PeeringServersRequest>>,
}

impl fmt::Debug for DataSources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataSources").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fake::FakeSource;
    use std::time::Duration;

    fn req(destination: &str) -> IntentionsRequest {
        IntentionsRequest {
            datacenter: "dc1".into(),
            destination: destination.into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn first_update_answers_the_current_value_then_ends_its_watch() {
        let source = Arc::new(FakeSource::<IntentionsRequest>::default());
        let intention = Intention {
            source_name: "web".into(),
            destination_name: "api".into(),
            ..Intention::default()
        };
        source.set(&req("api"), Arc::new(vec![intention.clone()]));
        let dyn_source: Arc<dyn DataSource<IntentionsRequest>> = source.clone();
        let got = first_update(
            Arc::clone(&dyn_source),
            req("api"),
            CorrelationId::Intentions,
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert!(matches!(got, UpdatePayload::Intentions(list) if *list == vec![intention]));
        assert_eq!(source.active(), 0, "the watch ended with the answer");
        // Nothing known: the question ends at its deadline, its watch with it.
        let late = first_update(dyn_source, req("db"), CorrelationId::Intentions, Duration::from_secs(5)).await;
        assert_eq!(late.unwrap_err(), "no answer within 5s");
        assert_eq!(source.active(), 0);
    }
}
