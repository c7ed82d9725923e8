//! Config snapshots: everything one proxy needs, immutable once published.
//!
//! A snapshot is a tree of `Arc`s. Publishing wraps the working copy in a new `Arc` after a
//! shallow clone (a handful of pointer copies); a later change clones only the path from the
//! root to what changed (`Arc::make_mut`), so an endpoint change touches one upstream entry and
//! shares everything else with the previous snapshot, and results shared by many proxies (the
//! same health result, the same roots) are stored once.

use std::{collections::BTreeMap, fmt, sync::Arc};
use structs::{
    CheckServiceNode, CompiledDiscoveryChain, ConfigEntry, GatewayService, HealthCheck, IndexedCaRoots, Intention,
    IssuedCert, NodeService, ResolvedServiceConfig, ServiceKind, TargetId, Upstream, UpstreamId,
};

/// Identifies a proxy: the node it is registered on and its service instance id. Agent-local
/// proxies may leave the node empty.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProxyId {
    /// Node name (empty for the agent's own node).
    pub node: String,
    /// Service instance id of the proxy.
    pub service_id: String,
}

impl ProxyId {
    /// A proxy on `node` with instance id `service_id`.
    pub fn new(node: impl Into<String>, service_id: impl Into<String>) -> Self {
        Self {
            node: node.into(),
            service_id: service_id.into(),
        }
    }
}

impl fmt::Display for ProxyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.node.is_empty() {
            f.write_str(&self.service_id)
        } else {
            write!(f, "{}/{}", self.node, self.service_id)
        }
    }
}

/// A value a watch has delivered at least once; `None` until then.
pub type Known<T> = Option<T>;

/// A proxy's complete configuration at one moment.
#[derive(Debug, Clone)]
pub struct ConfigSnapshot {
    /// Which proxy.
    pub proxy_id: Arc<ProxyId>,
    /// The registration it was built from (kind, address, port, proxy config).
    pub service: Arc<NodeService>,
    /// Datacenter of the proxy.
    pub datacenter: Arc<str>,
    /// Increases by one with every snapshot published for this proxy's current State.
    pub version: u64,
    /// CA trust bundle.
    pub roots: Known<Arc<IndexedCaRoots>>,
    /// The `proxy-defaults` entry (`None` inside: there is none), once known: its access
    /// logs apply to every kind.
    pub proxy_defaults: Known<Option<Arc<ConfigEntry>>>,
    /// What the intentions decide when none matches (the ACL default policy with ACLs on).
    pub intention_default_allow: bool,
    /// Kind-specific data.
    pub kind: KindSnapshot,
}

/// Data only some proxy kinds have.
#[derive(Debug, Clone)]
pub enum KindSnapshot {
    /// A sidecar.
    ConnectProxy(ConnectProxySnapshot),
    /// An ingress gateway: traffic from outside the mesh to the services it exposes.
    IngressGateway(IngressGatewaySnapshot),
    /// A terminating gateway: traffic from the mesh to services outside it.
    TerminatingGateway(TerminatingGatewaySnapshot),
    /// A mesh gateway: mTLS connections routed by SNI, never terminated.
    MeshGateway(MeshGatewaySnapshot),
    /// An API gateway: listeners with the http and tcp routes bound to them.
    ApiGateway(ApiGatewaySnapshot),
}

impl ConfigSnapshot {
    /// The proxy's kind.
    pub fn service_kind(&self) -> ServiceKind {
        self.service.kind
    }

    /// True once everything needed to configure the proxy is known.
    pub fn is_valid(&self) -> bool {
        self.roots.is_some()
            && match &self.kind {
                KindSnapshot::ConnectProxy(c) => c.is_valid(),
                KindSnapshot::IngressGateway(g) => g.is_valid(),
                KindSnapshot::TerminatingGateway(g) => g.is_valid(),
                KindSnapshot::MeshGateway(g) => g.is_valid(),
                KindSnapshot::ApiGateway(g) => g.is_valid(),
            }
    }

    /// The connect-proxy part, if this is a sidecar.
    pub fn connect_proxy(&self) -> Option<&ConnectProxySnapshot> {
        match &self.kind {
            KindSnapshot::ConnectProxy(c) => Some(c),
            _ => None,
        }
    }

    /// The ingress-gateway part, if this is one.
    pub fn ingress_gateway(&self) -> Option<&IngressGatewaySnapshot> {
        match &self.kind {
            KindSnapshot::IngressGateway(g) => Some(g),
            _ => None,
        }
    }

    /// The terminating-gateway part, if this is one.
    pub fn terminating_gateway(&self) -> Option<&TerminatingGatewaySnapshot> {
        match &self.kind {
            KindSnapshot::TerminatingGateway(g) => Some(g),
            _ => None,
        }
    }

    /// The API-gateway part, if this is one.
    pub fn api_gateway(&self) -> Option<&ApiGatewaySnapshot> {
        match &self.kind {
            KindSnapshot::ApiGateway(g) => Some(g),
            _ => None,
        }
    }

    /// The mesh-gateway part, if this is one.
    pub fn mesh_gateway(&self) -> Option<&MeshGatewaySnapshot> {
        match &self.kind {
            KindSnapshot::MeshGateway(g) => Some(g),
            _ => None,
        }
    }
}

/// What an ingress gateway needs beyond the common part.
#[derive(Debug, Clone, Default)]
pub struct IngressGatewaySnapshot {
    /// The gateway's leaf certificate: its identity to upstreams, and (with the hosts it
    /// serves as DNS names) its certificate when a listener serves TLS from the mesh CA.
    pub leaf: Known<Arc<IssuedCert>>,
    /// Its `ingress-gateway` config entry (`Some(None)`: known not to exist).
    pub entry: Known<Option<Arc<ConfigEntry>>>,
    /// The `mesh` config entry.
    pub mesh_config: Known<Option<Arc<ConfigEntry>>>,
    /// The services it exposes, one per listener and service (wildcards expanded).
    pub services: Known<Arc<Vec<GatewayService>>>,
    /// Per exposed service (by name): its chain and the endpoints of its targets.
    pub upstreams: Arc<BTreeMap<Arc<UpstreamId>, Arc<UpstreamSnapshot>>>,
}

impl IngressGatewaySnapshot {
    /// Roots aside, a gateway needs its leaf, its entry, the mesh config and its services.
    pub fn is_valid(&self) -> bool {
        self.leaf.is_some() && self.entry.is_some() && self.mesh_config.is_some() && self.services.is_some()
    }

    /// The gateway's entry, if it exists.
    pub fn config(&self) -> Option<&structs::config_entry::IngressGateway> {
        match self.entry.as_ref()?.as_deref()? {
            ConfigEntry::IngressGateway(e) => Some(e),
            _ => None,
        }
    }
}

/// What an API gateway needs beyond the common part. Which routes are bound to which
/// listener is decided when resources are built, by the same function that derives the
/// entries' status (`structs::config_entry::api_gateway_binding::bind`).
#[derive(Debug, Clone, Default)]
pub struct ApiGatewaySnapshot {
    /// The gateway's leaf certificate: its identity to the services it sends to.
    pub leaf: Known<Arc<IssuedCert>>,
    /// Its `api-gateway` config entry (`Some(None)`: known not to exist).
    pub entry: Known<Option<Arc<ConfigEntry>>>,
    /// The `mesh` config entry.
    pub mesh_config: Known<Option<Arc<ConfigEntry>>>,
    /// Every http-route and tcp-route entry, by kind (those naming the gateway bind).
    pub routes: BTreeMap<structs::ConfigEntryKind, Arc<Vec<Arc<ConfigEntry>>>>,
    /// Every certificate entry, by kind (those its listeners name are served).
    pub certificates: BTreeMap<structs::ConfigEntryKind, Arc<Vec<Arc<ConfigEntry>>>>,
    /// Per service a bound route sends to (by name): its chain and the endpoints of its
    /// targets.
    pub upstreams: Arc<BTreeMap<Arc<UpstreamId>, Arc<UpstreamSnapshot>>>,
}

/// The route kinds an API gateway binds.
pub const API_GATEWAY_ROUTE_KINDS: [structs::ConfigEntryKind; 2] =
    [structs::ConfigEntryKind::HttpRoute, structs::ConfigEntryKind::TcpRoute];

impl ApiGatewaySnapshot {
    /// Roots aside, an API gateway needs its leaf, its entry, the mesh config, the routes
    /// and the certificates.
    pub fn is_valid(&self) -> bool {
        self.leaf.is_some()
            && self.entry.is_some()
            && self.mesh_config.is_some()
            && self.routes.len() == API_GATEWAY_ROUTE_KINDS.len()
            && self.certificates.len() == structs::config_entry::CERTIFICATE_KINDS.len()
    }

    /// The gateway's entry, if it exists.
    pub fn config(&self) -> Option<&structs::config_entry::ApiGateway> {
        match self.entry.as_ref()?.as_deref()? {
            ConfigEntry::ApiGateway(e) => Some(e),
            _ => None,
        }
    }

    /// Every route entry it knows of (both kinds).
    pub fn all_routes(&self) -> Vec<Arc<ConfigEntry>> {
        self.routes.values().flat_map(|l| l.iter().cloned()).collect()
    }

    /// The certificate entry `kind`/`name`, if it exists.
    pub fn certificate(&self, kind: structs::ConfigEntryKind, name: &str) -> Option<&Arc<ConfigEntry>> {
        self.certificates.get(&kind)?.iter().find(|e| e.name() == name)
    }

    /// How the routes it knows of bind to its listeners (`None` without its entry).
    pub fn binding(&self) -> Option<structs::config_entry::api_gateway_binding::Binding> {
        let entry = self.config()?;
        Some(structs::config_entry::api_gateway_binding::bind(
            entry,
            &self.all_routes(),
            |kind, name| self.certificate(kind, name).is_some(),
        ))
    }
}

/// What a mesh gateway needs beyond the common part: the datacenter's services that have
/// connect instances, with those instances, and the resolvers (whose subsets each get a name
/// of their own). It holds no certificate: it routes by the SNI of connections it never
/// terminates.
#[derive(Debug, Clone, Default)]
pub struct MeshGatewaySnapshot {
    /// The `mesh` config entry.
    pub mesh_config: Known<Option<Arc<ConfigEntry>>>,
    /// Every service with a typical instance: the services whose connect instances it watches.
    pub services: Known<Arc<Vec<String>>>,
    /// Every `service-resolver` entry.
    pub resolvers: Known<Arc<Vec<Arc<ConfigEntry>>>>,
    /// Per service with connect instances (by name): its healthy connect instances (sidecars,
    /// or the service itself if native). Services without any are absent.
    pub groups: Arc<BTreeMap<String, Arc<Vec<CheckServiceNode>>>>,
    /// Every datacenter's mesh gateways, by datacenter: where the other datacenters' SNIs
    /// go. Not needed to serve the local part (`None` until known, and while the source
    /// fails).
    pub remote: Known<Arc<BTreeMap<String, Arc<Vec<CheckServiceNode>>>>>,
    /// The `exported-services` entry (a list of at most one): the peers each service is
    /// exported to, whose SNIs for it the gateway routes to its instances.
    pub exports: Arc<Vec<Arc<ConfigEntry>>>,
    /// Where the peering calls go (this cluster's servers, the dialed peers'): routed by
    /// their server names when the mesh entry's `Peering.PeerThroughMeshGateways` is set.
    /// Not needed to serve the rest (`None` until known, and while the source fails).
    pub peering_servers: Known<Arc<structs::peering::PeeringServers>>,
}

impl MeshGatewaySnapshot {
    /// Roots aside, a mesh gateway needs the mesh config, the service list and the resolvers;
    /// a service is served once its instances are known.
    pub fn is_valid(&self) -> bool {
        self.mesh_config.is_some() && self.services.is_some() && self.resolvers.is_some()
    }

    /// The resolver entry of `service`, if it has one.
    pub fn resolver(&self, service: &str) -> Option<&structs::config_entry::ServiceResolver> {
        self.resolvers.as_ref()?.iter().find_map(|e| match &**e {
            ConfigEntry::ServiceResolver(r) if r.name == service => Some(r),
            _ => None,
        })
    }
}

/// What a terminating gateway needs beyond the common part.
#[derive(Debug, Clone, Default)]
pub struct TerminatingGatewaySnapshot {
    /// The `mesh` config entry.
    pub mesh_config: Known<Option<Arc<ConfigEntry>>>,
    /// The services it represents (wildcards expanded).
    pub services: Known<Arc<Vec<GatewayService>>>,
    /// Per represented service (by name): what the gateway needs to act for it.
    pub linked: Arc<BTreeMap<String, Arc<LinkedServiceSnapshot>>>,
}

impl TerminatingGatewaySnapshot {
    /// Roots aside, a terminating gateway needs the mesh config and its services; a linked
    /// service is served once its own parts are known ([`LinkedServiceSnapshot::is_ready`]).
    pub fn is_valid(&self) -> bool {
        self.mesh_config.is_some() && self.services.is_some()
    }
}

/// One service a terminating gateway represents.
#[derive(Debug, Clone)]
pub struct LinkedServiceSnapshot {
    /// How it is linked (TLS files, SNI).
    pub link: GatewayService,
    /// The leaf certificate of the service: the gateway presents it to callers in the mesh.
    pub leaf: Known<Arc<IssuedCert>>,
    /// Intentions to the service: the gateway enforces them.
    pub intentions: Known<Arc<Vec<Intention>>>,
    /// Its central config (its protocol).
    pub config: Known<Arc<ResolvedServiceConfig>>,
    /// Its instances (outside the mesh) with their health.
    pub endpoints: Known<Arc<Vec<CheckServiceNode>>>,
    /// Its `service-resolver`, if any: the gateway serves each of its subsets.
    pub resolver: Known<Option<Arc<ConfigEntry>>>,
}

impl LinkedServiceSnapshot {
    /// A linked service nothing is known about yet.
    pub fn new(link: GatewayService) -> Self {
        Self {
            link,
            leaf: None,
            intentions: None,
            config: None,
            endpoints: None,
            resolver: None,
        }
    }

    /// True once the gateway can act for it.
    pub fn is_ready(&self) -> bool {
        self.leaf.is_some()
            && self.intentions.is_some()
            && self.config.is_some()
            && self.endpoints.is_some()
            && self.resolver.is_some()
    }

    /// The service's resolver entry, if it has one.
    pub fn resolver(&self) -> Option<&structs::config_entry::ServiceResolver> {
        match self.resolver.as_ref()?.as_deref()? {
            ConfigEntry::ServiceResolver(r) => Some(r),
            _ => None,
        }
    }
}

/// What a sidecar needs beyond the common part.
#[derive(Debug, Clone, Default)]
pub struct ConnectProxySnapshot {
    /// Its leaf certificate.
    pub leaf: Known<Arc<IssuedCert>>,
    /// Intentions for the proxied service, in evaluation order.
    pub intentions: Known<Arc<Vec<Intention>>>,
    /// The `mesh` config entry (`Some(None)`: known not to exist).
    pub mesh_config: Known<Option<Arc<ConfigEntry>>>,
    /// Central config for the proxied service.
    pub resolved_config: Known<Arc<ResolvedServiceConfig>>,
    /// HTTP checks of the proxied service (when checks are exposed).
    pub http_checks: Arc<Vec<HealthCheck>>,
    /// Upstreams by id.
    pub upstreams: Arc<BTreeMap<Arc<UpstreamId>, Arc<UpstreamSnapshot>>>,
    /// Every `jwt-provider` entry, watched while some intention requires a token (`None`
    /// while none does, or until the first result).
    pub jwt_providers: Known<Arc<Vec<Arc<ConfigEntry>>>>,
    /// The proxy runs in transparent mode (its registration's `Mode`, central config
    /// merged): its upstreams also include every service its intentions let it reach.
    pub transparent: bool,
    /// In transparent mode, the services it may reach by intentions (the implicit
    /// upstreams, whether or not also declared), once the services and intentions are
    /// known; `None` otherwise.
    pub intention_upstreams: Known<Arc<Vec<String>>>,
    /// In transparent mode, the services outside the mesh (service-defaults `Destination`)
    /// its intentions let it reach, by name. The `Arc` changes only when they do.
    pub destinations: Arc<BTreeMap<String, Arc<DestinationUpstream>>>,
    /// The healthy instances of each terminating gateway linking one of `destinations`, by
    /// gateway name, as they become known.
    pub destination_gateways: Arc<BTreeMap<String, Arc<Vec<CheckServiceNode>>>>,
    /// Every datacenter's mesh gateways, while some upstream's chain has a target in another
    /// datacenter (its connections go through them).
    pub mesh_gateways: Known<Arc<BTreeMap<String, Arc<Vec<CheckServiceNode>>>>>,
    /// What peers export for the upstreams with `DestinationPeer`, by upstream, as known:
    /// the value the upstream's chain was built from (a change of only the exporter's
    /// gateways updates the upstream's endpoints, not this entry).
    pub peered: Arc<BTreeMap<Arc<UpstreamId>, Arc<structs::peering::PeeredUpstream>>>,
    /// What peers export for the peer targets of upstreams' chains (resolvers failing over
    /// to a peer), by upstream and target, as known.
    pub peer_targets: Arc<PeerTargets>,
    /// The trust bundles of the peers the proxied service is exported to (their callers
    /// are accepted, as intentions allow).
    pub peer_bundles: Known<Arc<Vec<structs::peering::PeerTrustBundle>>>,
}

/// What peers export for the peer targets of upstreams' chains, by upstream and target.
pub type PeerTargets = BTreeMap<(Arc<UpstreamId>, structs::TargetId), Arc<structs::peering::PeeredUpstream>>;

/// A service outside the mesh a transparent proxy may reach: through the terminating
/// gateways that link it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationUpstream {
    /// Its addresses and port (its service-defaults `Destination`).
    pub destination: structs::config_entry::DestinationConfig,
    /// Its service-defaults `Protocol` (`tcp` when unset).
    pub protocol: structs::Protocol,
    /// The terminating gateways whose config entry links it (by name or `*`).
    pub gateways: Vec<String>,
}

impl ConnectProxySnapshot {
    /// Roots aside (common), a sidecar needs its leaf, intentions and config, and the JWT
    /// providers when an intention requires a token.
    pub fn is_valid(&self) -> bool {
        self.leaf.is_some()
            && self.mesh_config.is_some()
            && self.resolved_config.is_some()
            && (!self.transparent || self.intention_upstreams.is_some())
            && self
                .intentions
                .as_ref()
                .is_some_and(|ixns| self.jwt_providers.is_some() || !requires_jwt(ixns))
    }

    /// True when `upstream` is implicit: reached through the transparent outbound listener
    /// because intentions allow it, not declared in the registration.
    pub fn is_implicit(upstream: &UpstreamSnapshot) -> bool {
        upstream.index == UpstreamSnapshot::IMPLICIT
    }

    /// The `jwt-provider` entry named `name`, if known.
    pub fn jwt_provider(&self, name: &str) -> Option<&structs::config_entry::JwtProvider> {
        self.jwt_providers.as_ref()?.iter().find_map(|e| match e.as_ref() {
            ConfigEntry::JwtProvider(p) if p.name == name => Some(p),
            _ => None,
        })
    }
}

/// Whether any of `intentions` requires a token (the entry's `JWT` or a permission's).
pub fn requires_jwt(intentions: &[Intention]) -> bool {
    intentions
        .iter()
        .any(|i| i.jwt.is_some() || i.permissions.iter().any(|p| p.jwt.is_some()))
}

/// One upstream: its chain and the healthy endpoints of each chain target.
#[derive(Debug, Clone)]
pub struct UpstreamSnapshot {
    /// Position of the upstream in the registration's `Proxy.Upstreams` (see
    /// [`ConfigSnapshot::upstream_config`]); the registration is not copied per snapshot.
    pub index: usize,
    /// Its compiled discovery chain, once known (service upstreams).
    pub chain: Known<Arc<CompiledDiscoveryChain>>,
    /// Healthy instances per chain target (a prepared query has one synthetic target).
    pub endpoints: TargetEndpoints,
}

impl UpstreamSnapshot {
    /// The index of an upstream no registration declares (a transparent proxy's implicit
    /// upstream, a gateway's service).
    pub const IMPLICIT: usize = usize::MAX;

    /// An upstream nothing is known about yet.
    pub fn new(index: usize) -> Self {
        Self {
            index,
            chain: None,
            endpoints: TargetEndpoints::default(),
        }
    }
}

impl ConfigSnapshot {
    /// The registered config of an upstream of this snapshot.
    pub fn upstream_config(&self, upstream: &UpstreamSnapshot) -> Option<&Upstream> {
        self.service.proxy.upstreams.get(upstream.index)
    }
}

/// Healthy instances per chain target. A chain names few targets (usually one), so this is a
/// sorted vector rather than a tree: one small allocation per upstream.
#[derive(Debug, Clone, Default)]
pub struct TargetEndpoints(Vec<(TargetId, Arc<Vec<CheckServiceNode>>)>);

impl TargetEndpoints {
    fn position(&self, target: &TargetId) -> Result<usize, usize> {
        self.0.binary_search_by(|(t, _)| t.cmp(target))
    }

    /// The instances of `target`, if known.
    pub fn get(&self, target: &TargetId) -> Option<&Arc<Vec<CheckServiceNode>>> {
        self.position(target).ok().map(|i| &self.0[i].1)
    }

    /// True if instances of `target` are known.
    pub fn contains_key(&self, target: &TargetId) -> bool {
        self.position(target).is_ok()
    }

    /// Sets the instances of `target`.
    pub fn insert(&mut self, target: TargetId, nodes: Arc<Vec<CheckServiceNode>>) {
        match self.position(&target) {
            Ok(i) => self.0[i].1 = nodes,
            Err(i) => self.0.insert(i, (target, nodes)),
        }
    }

    /// Forgets `target`.
    pub fn remove(&mut self, target: &TargetId) -> Option<Arc<Vec<CheckServiceNode>>> {
        self.position(target).ok().map(|i| self.0.remove(i).1)
    }

    /// Keeps only the targets `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&TargetId, &Arc<Vec<CheckServiceNode>>) -> bool) {
        self.0.retain(|(t, n)| keep(t, n));
    }

    /// Targets and instances, in target order.
    pub fn iter(&self) -> impl Iterator<Item = (&TargetId, &Arc<Vec<CheckServiceNode>>)> {
        self.0.iter().map(|(t, n)| (t, n))
    }

    /// Targets, in order.
    pub fn keys(&self) -> impl Iterator<Item = &TargetId> {
        self.0.iter().map(|(t, _)| t)
    }

    /// Instances, in target order.
    pub fn values(&self) -> impl Iterator<Item = &Arc<Vec<CheckServiceNode>>> {
        self.0.iter().map(|(_, n)| n)
    }

    /// Number of targets with known instances.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when no target has known instances.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::ops::Index<&TargetId> for TargetEndpoints {
    type Output = Arc<Vec<CheckServiceNode>>;

    fn index(&self, target: &TargetId) -> &Self::Output {
        match self.get(target) {
            Some(nodes) => nodes,
            None => panic!("no endpoints for target {target}"),
        }
    }
}
