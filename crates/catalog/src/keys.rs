//! What a write can change, as seen by readers: index keys for blocking queries, and topics
//! for the event publisher.

use serde::{Deserialize, Serialize};
use structs::ConfigEntryKind;

/// A slice of the catalog that blocking queries wait on. Every write bumps the keys it
/// touches to its index; a query returns (and waits past) the index of its key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum IndexKey {
    /// The node list.
    Nodes,
    /// One node and what runs on it.
    Node(String),
    /// The service-name list (and tags).
    Services,
    /// Instances of one service name, their nodes and checks.
    Service(String),
    /// Connect-capable instances for one service name (its sidecars, or itself if native).
    ServiceConnect(String),
    /// Every check.
    Checks,
    /// Every config entry of a kind.
    ConfigKind(ConfigEntryKind),
    /// One config entry.
    ConfigEntry(ConfigEntryKind, String),
    /// Every config entry, of any kind (what a secondary datacenter replicates).
    ConfigEntries,
    /// Intentions (any `service-intentions` entry).
    Intentions,
    /// The services one ingress or terminating gateway fronts (its entry, and for `*` the
    /// services registered and their protocols).
    GatewayServices(String),
    /// Every ingress gateway: its services and its instances (with their health), what
    /// `/v1/health/ingress/:service` follows.
    IngressGateways,
    /// The CA: configuration and roots.
    Ca,
    /// ACL tokens.
    AclTokens,
    /// ACL policies.
    AclPolicies,
    /// ACL roles.
    AclRoles,
    /// ACL auth methods.
    AclAuthMethods,
    /// ACL binding rules.
    AclBindingRules,
    /// Anything of the ACL system (tokens, policies, roles, bootstrap): what resolution
    /// caches and authorized streams watch.
    Acl,
    /// The KV store: every write to a key bumps it (the KV table's index).
    Kvs,
    /// One KV key; once the key is gone it answers with [`IndexKey::Kvs`].
    KvKey(String),
    /// Every KV key under a prefix (a recursive read or a key listing). Never stored: its
    /// index is computed ([`crate::State::kv_prefix_index`]), and a write wakes the waiters
    /// of the prefixes of the keys it changes, and only those.
    KvPrefix(String),
    /// Sessions.
    Sessions,
    /// User events.
    Events,
    /// The audit log.
    Audit,
    /// Prepared queries.
    Queries,
    /// Every service's virtual IP.
    VirtualIps,
    /// Peerings (any change of any of them).
    Peerings,
    /// The services one peer exports here (the list).
    PeerServices(String),
    /// One service one peer exports here.
    PeerService(String, String),
    /// Where this cluster's mesh gateways send peering traffic: its servers, the servers
    /// of the peers it dials, and per service a peer exports here its SNI and the peer's
    /// gateways (any peering change, gateways-only ones included, and any import).
    PeeringRoutes,
}

/// A stream of values the event publisher serves: first a snapshot, then a new value after
/// every write that changes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Topic {
    /// Every instance of a service with its node and checks.
    ServiceHealth(String),
    /// The connect-capable instances for a service.
    ServiceHealthConnect(String),
    /// One config entry (or its absence).
    ConfigEntry(ConfigEntryKind, String),
    /// Every config entry of a kind.
    ConfigEntries(ConfigEntryKind),
    /// The CA trust bundle.
    CaRoots,
    /// Intentions whose destination matches a service (exact or `*`), in evaluation order.
    Intentions(String),
    /// Every service name.
    ServiceList,
    /// The name of every service with a typical instance (not a proxy or gateway): what a
    /// transparent proxy may have as an upstream.
    TypicalServices,
    /// The services a gateway fronts.
    GatewayServices(String),
    /// A service a peer exports here, with the peer's trust bundle (peer, service).
    PeeredService(String, String),
    /// The trust bundles of the live peerings a service is exported to.
    PeerTrustBundles(String),
    /// Where the peering calls go (this cluster's servers, the dialed peers').
    PeeringServers,
}

impl Topic {
    /// The index key whose bump means this topic may have changed.
    pub fn index_key(&self) -> IndexKey {
        match self {
            Topic::ServiceHealth(name) => IndexKey::Service(name.clone()),
            Topic::ServiceHealthConnect(name) => IndexKey::ServiceConnect(name.clone()),
            Topic::ConfigEntry(kind, name) => IndexKey::ConfigEntry(*kind, name.clone()),
            Topic::ConfigEntries(kind) => IndexKey::ConfigKind(*kind),
            Topic::CaRoots => IndexKey::Ca,
            Topic::Intentions(_) => IndexKey::Intentions,
            Topic::ServiceList | Topic::TypicalServices => IndexKey::Services,
            Topic::GatewayServices(name) => IndexKey::GatewayServices(name.clone()),
            Topic::PeeredService(peer, service) => IndexKey::PeerService(peer.clone(), service.clone()),
            Topic::PeerTrustBundles(_) => IndexKey::Peerings,
            Topic::PeeringServers => IndexKey::PeeringRoutes,
        }
    }
}
