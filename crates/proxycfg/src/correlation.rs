//! Typed correlation ids: which watch an update belongs to.

use std::{fmt, sync::Arc};
use structs::{ConfigEntryKind, TargetId, UpstreamId};

/// Names one watch of one proxy (kept small: it is stored per watch and sent with every
/// update, so upstream ids are shared `Arc`s). Every update carries the id of the watch that produced it,
/// so a kind handler knows where the data goes; chained watches embed their parent's key
/// (an upstream target names its upstream) so a parent change can cancel exactly its children.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CorrelationId {
    /// The CA trust bundle.
    Roots,
    /// The proxy's own leaf certificate.
    Leaf,
    /// Intentions whose destination is the proxied service.
    Intentions,
    /// The `mesh` config entry.
    MeshConfig,
    /// The `proxy-defaults` entry (`global`): what every kind reads of it (access logs).
    ProxyDefaults,
    /// Central config resolved for the proxied service.
    ResolvedServiceConfig,
    /// HTTP checks of the proxied service (for exposed check paths).
    ServiceHttpChecks,
    /// The compiled discovery chain of one upstream.
    DiscoveryChain(Arc<UpstreamId>),
    /// Healthy instances of one target of an upstream's chain.
    UpstreamTarget {
        /// The upstream whose chain named the target.
        upstream: Arc<UpstreamId>,
        /// The target.
        target: TargetId,
    },
    /// Results of a prepared-query upstream.
    PreparedQuery(Arc<UpstreamId>),
    /// The service a peer exports for an upstream with `DestinationPeer`.
    PeeredUpstream(Arc<UpstreamId>),
    /// The trust bundles of the peers the proxied service is exported to.
    PeerTrustBundles,
    /// Where the peering calls go (a mesh gateway).
    PeeringServers,
    /// What a peer exports for a target of an upstream's chain (a resolver's failover to
    /// the peer).
    PeerTarget {
        /// The upstream whose chain named the target.
        upstream: Arc<UpstreamId>,
        /// The target.
        target: TargetId,
    },
    /// Every service name in the datacenter (gateways).
    ServiceList,
    /// Every known datacenter (mesh gateways).
    Datacenters,
    /// Services fronted by this gateway.
    GatewayServices,
    /// Mesh gateways of one datacenter.
    MeshGateways {
        /// The datacenter.
        datacenter: String,
    },
    /// The mesh gateways of every datacenter.
    MeshGatewaysByDc,
    /// Healthy instances of a service a gateway fronts.
    GatewayServiceHealth {
        /// The service.
        service: String,
    },
    /// The leaf certificate of a service a terminating gateway represents.
    GatewayServiceLeaf {
        /// The service.
        service: String,
    },
    /// Intentions to a service a terminating gateway represents.
    GatewayServiceIntentions {
        /// The service.
        service: String,
    },
    /// The `service-resolver` of a service a terminating gateway represents (its subsets).
    GatewayServiceResolver {
        /// The service.
        service: String,
    },
    /// Central config of a service a terminating gateway represents.
    GatewayServiceConfig {
        /// The service.
        service: String,
    },
    /// The gateway's own config entry.
    GatewayConfig,
    /// Every config entry of one kind.
    ConfigEntryList(ConfigEntryKind),
    /// Healthy instances of a terminating gateway that links a destination a transparent
    /// proxy may reach.
    DestinationGateway(String),
}

impl CorrelationId {
    /// The upstream this watch serves, if any.
    pub fn upstream(&self) -> Option<&UpstreamId> {
        match self {
            CorrelationId::DiscoveryChain(u)
            | CorrelationId::PreparedQuery(u)
            | CorrelationId::PeeredUpstream(u)
            | CorrelationId::PeerTarget { upstream: u, .. }
            | CorrelationId::UpstreamTarget { upstream: u, .. } => Some(u),
            _ => None,
        }
    }
}

impl fmt::Display for CorrelationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CorrelationId::Roots => f.write_str("roots"),
            CorrelationId::Leaf => f.write_str("leaf"),
            CorrelationId::Intentions => f.write_str("intentions"),
            CorrelationId::MeshConfig => f.write_str("mesh"),
            CorrelationId::ProxyDefaults => f.write_str("proxy-defaults"),
            CorrelationId::ResolvedServiceConfig => f.write_str("resolved-service-config"),
            CorrelationId::ServiceHttpChecks => f.write_str("service-http-checks"),
            CorrelationId::DiscoveryChain(u) => write!(f, "discovery-chain:{u}"),
            CorrelationId::UpstreamTarget { upstream, target } => write!(f, "upstream-target:{target}:{upstream}"),
            CorrelationId::PreparedQuery(u) => write!(f, "prepared-query:{u}"),
            CorrelationId::PeeredUpstream(u) => write!(f, "peered-upstream:{u}"),
            CorrelationId::PeerTrustBundles => f.write_str("peer-trust-bundles"),
            CorrelationId::PeeringServers => f.write_str("peering-servers"),
            CorrelationId::PeerTarget { upstream, target } => write!(f, "peer-target:{target}:{upstream}"),
            CorrelationId::ServiceList => f.write_str("service-list"),
            CorrelationId::Datacenters => f.write_str("datacenters"),
            CorrelationId::GatewayServices => f.write_str("gateway-services"),
            CorrelationId::MeshGateways { datacenter } => write!(f, "mesh-gateway:{datacenter}"),
            CorrelationId::MeshGatewaysByDc => f.write_str("mesh-gateways"),
            CorrelationId::GatewayServiceHealth { service } => write!(f, "gateway-service-health:{service}"),
            CorrelationId::GatewayServiceLeaf { service } => write!(f, "gateway-service-leaf:{service}"),
            CorrelationId::GatewayServiceIntentions { service } => write!(f, "gateway-service-intentions:{service}"),
            CorrelationId::GatewayServiceResolver { service } => write!(f, "gateway-service-resolver:{service}"),
            CorrelationId::GatewayServiceConfig { service } => write!(f, "gateway-service-config:{service}"),
            CorrelationId::GatewayConfig => f.write_str("gateway-config"),
            CorrelationId::ConfigEntryList(kind) => write!(f, "config-entries:{kind}"),
            CorrelationId::DestinationGateway(gateway) => write!(f, "destination-gateway:{gateway}"),
        }
    }
}
