//! The compiled discovery chain: how an upstream name resolves to concrete targets.

use crate::GoDuration;
use crate::config_entry::{LoadBalancer, ServiceRoute, ServiceSplit};
use serde::{Deserialize, Serialize};
use std::{collections::BTreeMap, fmt, sync::Arc, time::Duration};

/// Identifies one chain target: `[subset.]service.namespace.partition.datacenter`, as Consul
/// (1.11 and later) names them (the partition is always `default`). Shared, since every
/// proxy watching a target holds its id.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TargetId(pub Arc<str>);

impl TargetId {
    /// The id of `service` (optionally a subset) in `namespace` (of the default partition)
    /// and `datacenter`.
    pub fn new(subset: &str, service: &str, namespace: &str, datacenter: &str) -> Self {
        if subset.is_empty() {
            TargetId(format!("{service}.{namespace}.default.{datacenter}").into())
        } else {
            TargetId(format!("{subset}.{service}.{namespace}.default.{datacenter}").into())
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TargetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which instances a target selects.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct TargetSubset {
    /// Filter expression (empty selects all).
    #[serde(rename = "Filter")]
    pub filter: String,
    /// Only passing instances.
    #[serde(rename = "OnlyPassing")]
    pub only_passing: bool,
}

/// A concrete set of instances the chain can send traffic to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct DiscoveryTarget {
    /// Target id.
    #[serde(rename = "ID")]
    pub id: TargetId,
    /// Service.
    #[serde(rename = "Service")]
    pub service: String,
    /// Subset name.
    #[serde(rename = "ServiceSubset")]
    pub service_subset: String,
    /// Namespace.
    #[serde(rename = "Namespace")]
    pub namespace: String,
    /// Admin partition (always `default`).
    #[serde(rename = "Partition")]
    pub partition: String,
    /// Datacenter.
    #[serde(rename = "Datacenter")]
    pub datacenter: String,
    /// Instance selection.
    #[serde(rename = "Subset")]
    pub subset: TargetSubset,
    /// TLS SNI (and Envoy cluster name) of the target.
    #[serde(rename = "SNI")]
    pub sni: String,
    /// Name of the target's Envoy cluster (its SNI).
    #[serde(rename = "Name")]
    pub name: String,
    /// Connect timeout in milliseconds (a Go duration in JSON, as Consul's
    /// `ConnectTimeout`).
    #[serde(rename = "ConnectTimeout", with = "millis_as_duration")]
    pub connect_timeout_ms: u32,
    /// Load balancing of its instances (from its service's resolver).
    #[serde(rename = "LoadBalancer", skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancer>,
    /// The peer exporting the target (cluster peering); empty: this cluster's.
    #[serde(rename = "Peer", skip_serializing_if = "String::is_empty")]
    pub peer: String,
    /// A peer's target: the SPIFFE ids its instances present (verified with the peer's
    /// roots).
    #[serde(rename = "SpiffeIDs", skip_serializing_if = "Vec::is_empty")]
    pub spiffe_ids: Vec<String>,
}

/// Milliseconds written and read as a Go duration (`"5s"`).
mod millis_as_duration {
    use crate::GoDuration;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(ms: &u32, s: S) -> Result<S::Ok, S::Error> {
        GoDuration(Duration::from_millis(u64::from(*ms))).serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        let d = GoDuration::deserialize(d)?;
        Ok(u32::try_from(d.0.as_millis()).unwrap_or(u32::MAX))
    }
}

/// The SNI (and cluster name) of a service target:
/// `[subset.]service.namespace.datacenter.internal.trust-domain`.
pub fn target_sni(subset: &str, service: &str, namespace: &str, datacenter: &str, trust_domain: &str) -> String {
    let prefix = if subset.is_empty() {
        String::new()
    } else {
        format!("{subset}.")
    };
    format!("{prefix}{service}.{namespace}.{datacenter}.internal.{trust_domain}")
}

/// The cluster name and SNI of one address of a destination outside the mesh
/// (service-defaults `Destination`), the same in a transparent sidecar and in the
/// terminating gateway linking it: `destination.<address>.<service SNI>`, the address's
/// dots and colons written as dashes (`destination.192-0-2-10.ext.default.dc1.internal.<td>`).
pub fn destination_sni(address: &str, service: &str, namespace: &str, datacenter: &str, trust_domain: &str) -> String {
    let address: String = address
        .trim_end_matches('.')
        .chars()
        .map(|c| if c == '.' || c == ':' { '-' } else { c })
        .collect();
    format!(
        "destination.{address}.{}",
        target_sni("", service, namespace, datacenter, trust_domain)
    )
}

/// What a chain node does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeType {
    /// L7 routes to other nodes.
    #[serde(rename = "router")]
    Router,
    /// Weighted legs to other nodes.
    #[serde(rename = "splitter")]
    Splitter,
    /// One target (with its failover targets).
    #[serde(rename = "resolver")]
    Resolver,
}

/// One route of a router node: the route as written (with the router's default catch-all
/// appended by the compiler) and the node it leads to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainRoute {
    /// The route.
    #[serde(rename = "Definition")]
    pub definition: ServiceRoute,
    /// Name of the next node (a splitter or resolver).
    #[serde(rename = "NextNode")]
    pub next_node: String,
}

/// One leg of a splitter node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChainSplit {
    /// Percentage of traffic (two decimals).
    #[serde(rename = "Weight")]
    pub weight: f32,
    /// Name of the next node (always a resolver: nested splitters are flattened).
    #[serde(rename = "NextNode")]
    pub next_node: String,
    /// The split as written (header changes apply to this leg).
    #[serde(rename = "Definition")]
    pub definition: ServiceSplit,
}

impl Eq for ChainSplit {}

/// Failover of a resolver node: targets tried in order when the primary has no healthy
/// instance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainFailover {
    /// Targets, in order.
    #[serde(rename = "Targets")]
    pub targets: Vec<TargetId>,
}

/// What a resolver node resolves to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainResolver {
    /// True when no service-resolver entry shaped it.
    #[serde(rename = "Default")]
    pub default: bool,
    /// Connect timeout to its targets.
    #[serde(rename = "ConnectTimeout")]
    pub connect_timeout: GoDuration,
    /// Request timeout of routes to it (unless the route sets one).
    #[serde(rename = "RequestTimeout", skip_serializing_if = "GoDuration::is_zero")]
    pub request_timeout: GoDuration,
    /// Primary target.
    #[serde(rename = "Target")]
    pub target: TargetId,
    /// Failover targets.
    #[serde(rename = "Failover", skip_serializing_if = "Option::is_none")]
    pub failover: Option<ChainFailover>,
}

/// One node of a compiled chain: a router, a splitter or a resolver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainNode {
    /// What it does.
    #[serde(rename = "Type")]
    pub node_type: NodeType,
    /// Its name (the key in [`CompiledDiscoveryChain::nodes`] without the type prefix).
    #[serde(rename = "Name")]
    pub name: String,
    /// Routes (routers).
    #[serde(rename = "Routes", skip_serializing_if = "Vec::is_empty", default)]
    pub routes: Vec<ChainRoute>,
    /// Legs (splitters).
    #[serde(rename = "Splits", skip_serializing_if = "Vec::is_empty", default)]
    pub splits: Vec<ChainSplit>,
    /// Resolution (resolvers).
    #[serde(rename = "Resolver", skip_serializing_if = "Option::is_none", default)]
    pub resolver: Option<ChainResolver>,
    /// Load balancing of the resolver's targets.
    #[serde(rename = "LoadBalancer", skip_serializing_if = "Option::is_none", default)]
    pub load_balancer: Option<LoadBalancer>,
}

impl ChainNode {
    /// A resolver node.
    pub fn resolver(name: String, resolver: ChainResolver, load_balancer: Option<LoadBalancer>) -> Self {
        Self {
            node_type: NodeType::Resolver,
            name,
            routes: Vec::new(),
            splits: Vec::new(),
            resolver: Some(resolver),
            load_balancer,
        }
    }
}

/// A discovery chain compiled for one upstream name in one datacenter.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CompiledDiscoveryChain {
    /// Upstream service name.
    #[serde(rename = "ServiceName")]
    pub service_name: String,
    /// Namespace.
    #[serde(rename = "Namespace")]
    pub namespace: String,
    /// Datacenter it was compiled for.
    #[serde(rename = "Datacenter")]
    pub datacenter: String,
    /// `tcp`, `http`, `http2` or `grpc`.
    #[serde(rename = "Protocol")]
    pub protocol: crate::Protocol,
    /// Name of the first node.
    #[serde(rename = "StartNode")]
    pub start_node: String,
    /// Nodes by name.
    #[serde(rename = "Nodes")]
    pub nodes: BTreeMap<String, ChainNode>,
    /// Targets by id.
    #[serde(rename = "Targets")]
    pub targets: BTreeMap<TargetId, DiscoveryTarget>,
    /// True when no router, splitter or resolver entry shaped it.
    #[serde(rename = "Default")]
    pub default: bool,
}

impl Eq for CompiledDiscoveryChain {}

/// Default connect timeout of a target, as Consul's.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u32 = 5_000;

/// Name of the resolver node of `target` in a chain's nodes.
pub fn resolver_node_name(target: &TargetId) -> String {
    format!("resolver:{target}")
}

/// The SNI (and cluster name) of a prepared query's instances:
/// `query.namespace.datacenter.query.trust-domain`, apart from any service's.
pub fn query_sni(query: &str, datacenter: &str, trust_domain: &str) -> String {
    format!("{query}.default.{datacenter}.query.{trust_domain}")
}

impl CompiledDiscoveryChain {
    /// The chain of a service no config entry shapes: one resolver node, one target.
    pub fn default_for(service: &str, datacenter: &str, trust_domain: &str, protocol: crate::Protocol) -> Self {
        let id = TargetId::new("", service, "default", datacenter);
        let sni = target_sni("", service, "default", datacenter, trust_domain);
        Self::one_target(id, service, sni, datacenter, protocol, DEFAULT_CONNECT_TIMEOUT_MS)
    }

    /// The chain of a prepared-query upstream: one resolver node, one target `id` (under
    /// which the proxy keeps the query's instances) whose cluster and SNI are the query's
    /// ([`query_sni`]), so it never shares a cluster with an upstream of the service itself;
    /// `service` is the service the instances are, whose identity they must present.
    pub fn for_prepared_query(
        id: TargetId,
        query: &str,
        service: &str,
        datacenter: &str,
        trust_domain: &str,
        protocol: crate::Protocol,
        connect_timeout_ms: u32,
    ) -> Self {
        let sni = query_sni(query, datacenter, trust_domain);
        Self::one_target(id, service, sni, datacenter, protocol, connect_timeout_ms)
    }

    /// The chain of an upstream a peer exports: one target, the peer's service reached by
    /// the SNI the peer's gateways route and verified as one of `spiffe_ids`.
    pub fn for_peer(
        service: &crate::peering::ImportedService,
        peer: &str,
        datacenter: &str,
        protocol: crate::Protocol,
        connect_timeout_ms: u32,
    ) -> Self {
        let id = TargetId(service.sni.clone().into());
        let mut chain = Self::one_target(
            id.clone(),
            &service.name,
            service.sni.clone(),
            datacenter,
            protocol,
            connect_timeout_ms,
        );
        if let Some(target) = chain.targets.get_mut(&id) {
            target.peer = peer.to_owned();
            target.spiffe_ids = service.spiffe_ids.clone();
        }
        chain
    }

    fn one_target(
        id: TargetId,
        service: &str,
        sni: String,
        datacenter: &str,
        protocol: crate::Protocol,
        connect_timeout_ms: u32,
    ) -> Self {
        let target = DiscoveryTarget {
            id: id.clone(),
            service: service.to_owned(),
            service_subset: String::new(),
            namespace: "default".to_owned(),
            partition: "default".to_owned(),
            datacenter: datacenter.to_owned(),
            subset: TargetSubset::default(),
            name: sni.clone(),
            sni,
            connect_timeout_ms,
            load_balancer: None,
            peer: String::new(),
            spiffe_ids: Vec::new(),
        };
        let node_name = resolver_node_name(&id);
        let node = ChainNode::resolver(
            id.to_string(),
            ChainResolver {
                default: true,
                connect_timeout: GoDuration(Duration::from_millis(u64::from(connect_timeout_ms))),
                request_timeout: GoDuration::default(),
                target: id.clone(),
                failover: None,
            },
            None,
        );
        Self {
            service_name: service.to_owned(),
            namespace: "default".to_owned(),
            datacenter: datacenter.to_owned(),
            protocol,
            start_node: node_name.clone(),
            nodes: BTreeMap::from([(node_name, node)]),
            targets: BTreeMap::from([(id, target)]),
            default: true,
        }
    }

    /// The first node.
    pub fn start(&self) -> Option<&ChainNode> {
        self.nodes.get(&self.start_node)
    }

    /// True when the chain does more than send everything to one target.
    pub fn is_routed(&self) -> bool {
        self.start().is_some_and(|n| n.node_type != NodeType::Resolver)
    }
}
