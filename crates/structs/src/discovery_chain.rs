//! The compiled discovery chain: how an upstream name resolves to concrete targets.

use serde::{Deserialize, Serialize};
use std::{collections::BTreeMap, fmt, sync::Arc};

/// Identifies one chain target: `[subset.]service.namespace.datacenter`. Shared, since every
/// proxy watching a target holds its id.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TargetId(pub Arc<str>);

impl TargetId {
    /// The id of `service` (optionally a subset) in `namespace` and `datacenter`.
    pub fn new(subset: &str, service: &str, namespace: &str, datacenter: &str) -> Self {
        if subset.is_empty() {
            TargetId(format!("{service}.{namespace}.{datacenter}").into())
        } else {
            TargetId(format!("{subset}.{service}.{namespace}.{datacenter}").into())
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
    /// Datacenter.
    #[serde(rename = "Datacenter")]
    pub datacenter: String,
    /// Instance selection.
    #[serde(rename = "Subset")]
    pub subset: TargetSubset,
    /// TLS SNI (and Envoy cluster name) of the target.
    #[serde(rename = "SNI")]
    pub sni: String,
    /// Connect timeout in milliseconds.
    #[serde(rename = "ConnectTimeoutMs")]
    pub connect_timeout_ms: u32,
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

/// How traffic for one node of the chain is split or resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "Type")]
pub enum ChainNode {
    /// L7 routes to other nodes.
    #[serde(rename = "router")]
    Router {
        /// Node name.
        #[serde(rename = "Name")]
        name: String,
        /// (route index in the router entry, next node) pairs.
        #[serde(rename = "Routes")]
        routes: Vec<(usize, String)>,
    },
    /// Weighted legs to other nodes.
    #[serde(rename = "splitter")]
    Splitter {
        /// Node name.
        #[serde(rename = "Name")]
        name: String,
        /// (weight, next node) pairs.
        #[serde(rename = "Splits")]
        splits: Vec<(f32, String)>,
    },
    /// A target with its failover targets.
    #[serde(rename = "resolver")]
    Resolver {
        /// Node name.
        #[serde(rename = "Name")]
        name: String,
        /// Primary target.
        #[serde(rename = "Target")]
        target: TargetId,
        /// Failover targets, in order.
        #[serde(rename = "Failover")]
        failover: Vec<TargetId>,
        /// Connect timeout in milliseconds.
        #[serde(rename = "ConnectTimeoutMs")]
        connect_timeout_ms: u32,
    },
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

impl CompiledDiscoveryChain {
    /// The chain of a service no config entry shapes: one resolver node, one target.
    pub fn default_for(service: &str, datacenter: &str, trust_domain: &str, protocol: crate::Protocol) -> Self {
        let id = TargetId::new("", service, "default", datacenter);
        let target = DiscoveryTarget {
            id: id.clone(),
            service: service.to_owned(),
            service_subset: String::new(),
            namespace: "default".to_owned(),
            datacenter: datacenter.to_owned(),
            subset: TargetSubset::default(),
            sni: target_sni("", service, "default", datacenter, trust_domain),
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
        };
        let node_name = format!("resolver:{id}");
        let node = ChainNode::Resolver {
            name: node_name.clone(),
            target: id.clone(),
            failover: Vec::new(),
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
        };
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
}
