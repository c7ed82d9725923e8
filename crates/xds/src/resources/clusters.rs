//! Clusters and their load assignments.

use super::core::{ads, millis, socket};
use super::{BuildError, CLUSTER, ENDPOINT, Resources, tls};
use envoy_types::pb::envoy::config::cluster::v3::{
    CircuitBreakers, Cluster, OutlierDetection, circuit_breakers, cluster,
};
use envoy_types::pb::envoy::config::core::v3::{HealthStatus, Http2ProtocolOptions, Locality};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig as AggregateClusterConfig;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::TlsParameters;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{HttpProtocolOptions, http_protocol_options};
use envoy_types::pb::google::protobuf::{UInt32Value, UInt64Value};
use envoy_types::util::pack_any;
use proxycfg::{ConfigSnapshot, KindSnapshot};
use std::sync::Arc;
use structs::config_entry::LoadBalancer;
use structs::protocol::{PassiveHealthCheck, UpstreamLimits};
use structs::{CheckServiceNode, SpiffeIdService};

/// The cluster of the local application.
pub(crate) const LOCAL_APP: &str = "local_app";

/// `typed_extension_protocol_options` that make a cluster speak HTTP/2 upstream.
pub(crate) fn http2_options() -> std::collections::HashMap<String, envoy_types::pb::google::protobuf::Any> {
    let opts = HttpProtocolOptions {
        upstream_protocol_options: Some(http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
            http_protocol_options::ExplicitHttpConfig {
                protocol_config: Some(
                    http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                        Http2ProtocolOptions::default(),
                    ),
                ),
            },
        )),
        ..Default::default()
    };
    [(
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".to_owned(),
        pack_any(opts),
    )]
    .into_iter()
    .collect()
}

fn lb_endpoint(node: &CheckServiceNode) -> LbEndpoint {
    LbEndpoint {
        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
            address: socket(node.address(), u32::from(node.service.port)),
            ..Default::default()
        })),
        health_status: HealthStatus::Healthy as i32,
        load_balancing_weight: Some(UInt32Value {
            value: node.service.weights.passing.max(1),
        }),
        ..Default::default()
    }
}

/// One locality holding every instance, with a locality weight and a (blank) locality:
/// proxyless gRPC clients skip localities without a weight and refuse them without one.
pub(crate) fn load_assignment(cluster_name: &str, nodes: &[CheckServiceNode]) -> ClusterLoadAssignment {
    let endpoints = if nodes.is_empty() {
        Vec::new()
    } else {
        vec![LocalityLbEndpoints {
            lb_endpoints: nodes.iter().map(lb_endpoint).collect(),
            load_balancing_weight: Some(UInt32Value { value: 1 }),
            locality: Some(Locality::default()),
            ..Default::default()
        }]
    };
    ClusterLoadAssignment {
        cluster_name: cluster_name.to_owned(),
        endpoints,
        ..Default::default()
    }
}

pub(crate) fn build(
    snap: &ConfigSnapshot,
    out: &mut Resources,
    scope: &super::Scope<'_>,
    shared: Option<&super::SharedEncodings>,
) -> Result<(), BuildError> {
    let cp = snap
        .connect_proxy()
        .ok_or(BuildError::Incomplete("not a connect-proxy"))?;
    let roots = snap.roots.as_deref().ok_or(BuildError::Incomplete("CA roots"))?;
    if scope.common() {
        local_app(snap, cp, out);
    }
    let mesh = cp.mesh_config.as_ref().and_then(|m| m.as_deref());
    let outgoing = tls::mesh_params(snap, mesh, tls::Direction::Outgoing);
    for (id, upstream) in cp.upstreams.iter() {
        if !scope.upstream(id) {
            continue;
        }
        upstream_clusters(snap, roots, upstream, outgoing.as_ref(), shared, out);
    }
    Ok(())
}

fn local_app(snap: &ConfigSnapshot, cp: &proxycfg::ConnectProxySnapshot, out: &mut Resources) {
    const KEY: &str = "envoy_local_cluster_json";
    if let Some(json) = super::escape_hatch::value(snap, KEY) {
        match super::escape_hatch::decode::<Cluster>(KEY, envoy_json::CLUSTER, json) {
            Ok(mut user) => {
                if user.name.is_empty() {
                    user.name = LOCAL_APP.into();
                }
                out.insert(CLUSTER, user.name.clone(), pack_any(user));
                return;
            }
            Err(e) => {
                out.problems.insert(KEY.into(), e);
            }
        }
    }
    let proxy = &snap.service.proxy;
    let empty = structs::protocol::OpaqueConfig::new();
    let defaults = cp.resolved_config.as_deref().map_or(&empty, |r| &r.proxy_config);
    let inbound = structs::InboundOptions::parse(&proxy.config, defaults);
    let local_addr = if proxy.local_service_address.is_empty() {
        "127.0.0.1"
    } else {
        &proxy.local_service_address
    };
    let mut local = Cluster {
        name: LOCAL_APP.into(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Static as i32,
        )),
        connect_timeout: millis(inbound.local_connect_timeout_ms.filter(|ms| *ms > 0).unwrap_or(5000)),
        // `max_inbound_connections`: connections to the application at once.
        circuit_breakers: inbound.max_inbound_connections.map(|max| {
            circuit_breakers(&UpstreamLimits {
                max_connections: Some(max),
                ..UpstreamLimits::default()
            })
        }),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: LOCAL_APP.into(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                        address: socket(local_addr, u32::from(proxy.local_service_port)),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let local_protocol = proxy
        .options()
        .protocol
        .or_else(|| cp.resolved_config.as_deref().map(|r| r.protocol()))
        .unwrap_or_default();
    if local_protocol.is_http2() {
        local.typed_extension_protocol_options = http2_options();
    }
    out.insert(CLUSTER, LOCAL_APP.into(), pack_any(local));
}

/// The clusters of one upstream's chain: one per target, and an aggregate cluster per
/// resolver with failover.
fn upstream_clusters(
    snap: &ConfigSnapshot,
    roots: &structs::IndexedCaRoots,
    upstream: &proxycfg::UpstreamSnapshot,
    outgoing: Option<&TlsParameters>,
    shared: Option<&super::SharedEncodings>,
    out: &mut Resources,
) {
    let Some(chain) = &upstream.chain else { return };
    let config = snap.upstream_config(upstream);
    let options = config.map(|u| u.options()).unwrap_or_default();
    let escape_hatch = config.is_some_and(|c| c.config.contains_key(structs::bootstrap::UPSTREAM_CLUSTER_KEY));
    match (shared, &snap.roots) {
        // The escape hatch edits the clusters it is given: built for this proxy alone.
        (Some(shared), Some(roots)) if !escape_hatch => {
            let inputs = ChainClusterInputs {
                chain: Arc::clone(chain),
                roots: Arc::clone(roots),
                limits: options.limits.clone(),
                passive_health_check: options.passive_health_check.clone(),
                outgoing: outgoing.cloned(),
            };
            let part = shared.part(inputs.key(), inputs, ChainClusterInputs::still_used, || {
                let mut part = Resources::default();
                chain_clusters(
                    roots,
                    chain,
                    options.limits.as_ref(),
                    options.passive_health_check.as_ref(),
                    outgoing,
                    &mut part,
                );
                Ok(shared.interned(part))
            });
            // The build above cannot fail.
            if let Ok(part) = part {
                out.extend_from(&part);
            }
        }
        _ => chain_clusters(
            roots,
            chain,
            options.limits.as_ref(),
            options.passive_health_check.as_ref(),
            outgoing,
            out,
        ),
    }
    if let Some(config) = config {
        upstream_escape_hatch(config, chain, out);
    }
}

/// Everything [`chain_clusters`] reads for a sidecar's upstream: its chain and the CA roots
/// (by identity), the upstream's limits and outlier detection, the mesh's TLS parameters.
/// Proxies with equal inputs (every proxy reaching a service with default options) have
/// the very same clusters: they are built, encoded and hashed once.
struct ChainClusterInputs {
    chain: Arc<structs::CompiledDiscoveryChain>,
    roots: Arc<structs::IndexedCaRoots>,
    limits: Option<UpstreamLimits>,
    passive_health_check: Option<PassiveHealthCheck>,
    outgoing: Option<TlsParameters>,
}

impl PartialEq for ChainClusterInputs {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.chain, &other.chain)
            && Arc::ptr_eq(&self.roots, &other.roots)
            && self.limits == other.limits
            && self.passive_health_check == other.passive_health_check
            && self.outgoing == other.outgoing
    }
}

impl ChainClusterInputs {
    /// A hash of the chain and roots by address (inputs differing only in options share a
    /// key: the last built is kept).
    fn key(&self) -> u64 {
        use std::hash::{BuildHasher, Hash, Hasher};
        let mut h = foldhash::fast::FixedState::default().build_hasher();
        "chain clusters".hash(&mut h);
        Arc::as_ptr(&self.chain).hash(&mut h);
        Arc::as_ptr(&self.roots).hash(&mut h);
        h.finish()
    }

    /// True while some proxy besides holds the chain.
    fn still_used(inputs: &(dyn std::any::Any + Send + Sync)) -> bool {
        inputs
            .downcast_ref::<Self>()
            .is_some_and(|i| Arc::strong_count(&i.chain) > 1)
    }
}

/// The upstream's own cluster (`envoy_cluster_json`) in place of its target's, named after
/// it unless the user names it. Only an upstream whose chain is the default one (a single
/// target) has a cluster to replace, as in Consul; for any other, and for a cluster Envoy's
/// JSON does not decode, the proxy's status says so and meshd's clusters stay.
fn upstream_escape_hatch(config: &structs::Upstream, chain: &structs::CompiledDiscoveryChain, out: &mut Resources) {
    let key = structs::bootstrap::UPSTREAM_CLUSTER_KEY;
    let Some(json) = config
        .config
        .get(key)
        .and_then(|v| v.as_str())
        .filter(|s| !s.trim().is_empty())
    else {
        return;
    };
    let id = config.id();
    let problem = format!("{id}:{key}");
    let target = match chain.targets.values().next() {
        Some(t) if chain.default && chain.targets.len() == 1 => t,
        _ => {
            out.problems.insert(
                problem,
                format!(
                    "upstream {id}: Config.{key} applies only to an upstream whose discovery chain is the default one (no router, splitter or resolver redirect, subsets or failover): meshd's clusters are served instead"
                ),
            );
            return;
        }
    };
    match super::escape_hatch::decode::<Cluster>(key, envoy_json::CLUSTER, json) {
        Ok(mut user) => {
            if let Some(clusters) = out.by_type.get_mut(CLUSTER) {
                clusters.remove(&target.sni);
            }
            if user.name.is_empty() {
                user.name = target.sni.clone();
            }
            out.insert(CLUSTER, user.name.clone(), pack_any(user));
        }
        Err(e) => {
            out.problems.insert(problem, format!("upstream {id}: {e}"));
        }
    }
}

/// The name of the upstream's own cluster (`envoy_cluster_json`) when it names one.
pub(crate) fn escape_hatch_name(config: &structs::Upstream) -> Option<String> {
    let json = config.config.get(structs::bootstrap::UPSTREAM_CLUSTER_KEY)?.as_str()?;
    let value: serde_json::Value = serde_json::from_str(json).ok()?;
    value
        .get("name")
        .and_then(|n| n.as_str())
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
}

/// The clusters of a compiled chain (a sidecar's upstream, a service an ingress gateway
/// exposes): one per target with mTLS to it, and an aggregate cluster per resolver with
/// failover.
pub(crate) fn chain_clusters(
    roots: &structs::IndexedCaRoots,
    chain: &structs::CompiledDiscoveryChain,
    limits: Option<&UpstreamLimits>,
    passive_health_check: Option<&PassiveHealthCheck>,
    outgoing: Option<&TlsParameters>,
    out: &mut Resources,
) {
    {
        for target in chain.targets.values() {
            let spiffe = SpiffeIdService {
                trust_domain: roots.trust_domain.clone(),
                namespace: target.namespace.clone(),
                datacenter: target.datacenter.clone(),
                service: target.service.clone(),
            };
            let mut cluster = Cluster {
                name: target.sni.clone(),
                cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::Eds as i32)),
                eds_cluster_config: Some(cluster::EdsClusterConfig {
                    eds_config: ads(),
                    service_name: String::new(),
                }),
                connect_timeout: millis(target.connect_timeout_ms),
                transport_socket: Some(if target.peer.is_empty() {
                    tls::upstream(&target.sni, &spiffe.to_string(), outgoing.cloned())
                } else {
                    tls::upstream_peer(&target.sni, &target.spiffe_ids, &target.peer, outgoing.cloned())
                }),
                circuit_breakers: limits.map(circuit_breakers),
                // As Consul: outlier detection is always on (Envoy's defaults unless the
                // upstream's passive_health_check says otherwise).
                outlier_detection: Some(passive_health_check.map(outlier_detection).unwrap_or_default()),
                ..Default::default()
            };
            if let Some(lb) = &target.load_balancer {
                load_balancer(&mut cluster, lb);
            }
            if chain.protocol.is_http2() {
                cluster.typed_extension_protocol_options = http2_options();
            }
            out.insert(CLUSTER, target.sni.clone(), pack_any(cluster));
        }
        failover_clusters(chain, cluster::LbPolicy::ClusterProvided, out);
    }
}

/// The aggregate cluster of each resolver of `chain` with failover targets, trying the
/// primary first and each failover target once the ones before it have no healthy instance
/// (priority levels across the member clusters). Envoy wants `CLUSTER_PROVIDED` as an
/// aggregate cluster's policy; gRPC accepts only the policies it implements there.
pub(crate) fn failover_clusters(
    chain: &structs::CompiledDiscoveryChain,
    lb_policy: cluster::LbPolicy,
    out: &mut Resources,
) {
    for node in chain.nodes.values() {
        let Some(resolver) = &node.resolver else { continue };
        let Some(failover) = &resolver.failover else { continue };
        let members: Vec<String> = std::iter::once(&resolver.target)
            .chain(&failover.targets)
            .filter_map(|t| chain.targets.get(t).map(|t| t.sni.clone()))
            .collect();
        let Some(primary) = chain.targets.get(&resolver.target) else {
            continue;
        };
        let name = failover_cluster_name(&primary.sni);
        let aggregate = Cluster {
            name: name.clone(),
            cluster_discovery_type: Some(cluster::ClusterDiscoveryType::ClusterType(cluster::CustomClusterType {
                name: "envoy.clusters.aggregate".into(),
                typed_config: Some(pack_any(AggregateClusterConfig { clusters: members })),
            })),
            connect_timeout: millis(primary.connect_timeout_ms),
            lb_policy: lb_policy as i32,
            ..Default::default()
        };
        out.insert(CLUSTER, name, pack_any(aggregate));
    }
}

/// Name of the aggregate cluster of a resolver with failover, after its primary target.
pub(crate) fn failover_cluster_name(primary_sni: &str) -> String {
    format!("failover~{primary_sni}")
}

/// The cluster a route or TCP proxy sends to for a resolver node: its aggregate cluster
/// when it has failover, else its target's cluster.
pub(crate) fn resolver_cluster(
    chain: &structs::CompiledDiscoveryChain,
    node: &structs::discovery_chain::ChainNode,
) -> Option<String> {
    let resolver = node.resolver.as_ref()?;
    let primary = chain.targets.get(&resolver.target)?;
    Some(if resolver.failover.is_some() {
        failover_cluster_name(&primary.sni)
    } else {
        primary.sni.clone()
    })
}

pub(crate) fn circuit_breakers(limits: &UpstreamLimits) -> CircuitBreakers {
    let value = |v: Option<u32>| v.map(|value| UInt32Value { value });
    CircuitBreakers {
        thresholds: vec![circuit_breakers::Thresholds {
            max_connections: value(limits.max_connections),
            max_pending_requests: value(limits.max_pending_requests),
            max_requests: value(limits.max_concurrent_requests),
            ..Default::default()
        }],
        ..Default::default()
    }
}

pub(crate) fn outlier_detection(p: &PassiveHealthCheck) -> OutlierDetection {
    let duration = |d: &structs::GoDuration| {
        (!d.is_zero()).then(|| envoy_types::pb::google::protobuf::Duration {
            seconds: i64::try_from(d.0.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(d.0.subsec_nanos()).unwrap_or(0),
        })
    };
    let value = |v: Option<u32>| v.map(|value| UInt32Value { value });
    OutlierDetection {
        consecutive_5xx: (p.max_failures != 0).then_some(UInt32Value { value: p.max_failures }),
        interval: duration(&p.interval),
        enforcing_consecutive_5xx: value(p.enforcing_consecutive_5xx),
        max_ejection_percent: value(p.max_ejection_percent),
        base_ejection_time: p.base_ejection_time.as_ref().and_then(duration),
        ..Default::default()
    }
}

/// Envoy's bound on both ring sizes of a ring_hash cluster.
const MAX_RING_SIZE: u64 = 8_388_608;
/// Envoy's default minimum ring size.
const DEFAULT_MIN_RING_SIZE: u64 = 1024;

/// The resolver's load-balancing policy on a target's cluster (hash policies go on routes).
///
/// Values Envoy would refuse — refusing the whole cluster update, every cluster of the proxy
/// with it — are brought within its bounds: a choice count below 2 (Envoy's minimum) is left
/// to Envoy's default of 2, ring sizes above 8388608 are capped, and a maximum ring size
/// below the default minimum (1024) without a minimum becomes the minimum too.
fn load_balancer(cluster: &mut Cluster, lb: &LoadBalancer) {
    let u64_value = |v: u64| (v != 0).then_some(UInt64Value { value: v });
    match lb.policy.as_str() {
        "least_request" => {
            cluster.lb_policy = cluster::LbPolicy::LeastRequest as i32;
            if let Some(c) = lb.least_request_config.as_ref().filter(|c| c.choice_count >= 2) {
                cluster.lb_config = Some(cluster::LbConfig::LeastRequestLbConfig(cluster::LeastRequestLbConfig {
                    choice_count: Some(UInt32Value { value: c.choice_count }),
                    ..Default::default()
                }));
            }
        }
        "ring_hash" => {
            cluster.lb_policy = cluster::LbPolicy::RingHash as i32;
            if let Some(r) = &lb.ring_hash_config {
                let max = r.maximum_ring_size.min(MAX_RING_SIZE);
                let mut min = r.minimum_ring_size.min(MAX_RING_SIZE);
                if min == 0 && max != 0 && max < DEFAULT_MIN_RING_SIZE {
                    min = max;
                }
                cluster.lb_config = Some(cluster::LbConfig::RingHashLbConfig(cluster::RingHashLbConfig {
                    minimum_ring_size: u64_value(min),
                    maximum_ring_size: u64_value(max),
                    ..Default::default()
                }));
            }
        }
        "maglev" => cluster.lb_policy = cluster::LbPolicy::Maglev as i32,
        "random" => cluster.lb_policy = cluster::LbPolicy::Random as i32,
        // round_robin and unset: Envoy's default.
        _ => {}
    }
}

/// The load assignment of every chain target: the only resources an endpoints change
/// touches, so an endpoints-only snapshot change rebuilds just these.
pub(crate) fn build_endpoints(
    snap: &ConfigSnapshot,
    out: &mut Resources,
    shared: Option<&super::SharedEncodings>,
) -> Result<(), BuildError> {
    build_endpoints_where(snap, out, shared, |_| true, |_, _, _| true)
}

/// The load assignments of the chain targets `wanted` picks (by upstream, target and its
/// endpoints) of the upstreams `upstream_wanted` picks (asked first, once per upstream).
pub(crate) fn build_endpoints_where(
    snap: &ConfigSnapshot,
    out: &mut Resources,
    shared: Option<&super::SharedEncodings>,
    upstream_wanted: impl Fn(&structs::UpstreamId) -> bool,
    wanted: impl Fn(&structs::UpstreamId, &structs::TargetId, Option<&std::sync::Arc<Vec<CheckServiceNode>>>) -> bool,
) -> Result<(), BuildError> {
    let upstreams = match &snap.kind {
        KindSnapshot::ConnectProxy(cp) => &cp.upstreams,
        KindSnapshot::IngressGateway(g) => &g.upstreams,
        KindSnapshot::ApiGateway(g) => &g.upstreams,
        KindSnapshot::TerminatingGateway(_) | KindSnapshot::MeshGateway(_) => return Ok(()),
    };
    for (upstream_id, upstream) in upstreams.iter() {
        let Some(chain) = upstream.chain.as_ref().filter(|_| upstream_wanted(upstream_id)) else {
            continue;
        };
        for (target_id, target) in &chain.targets {
            if !wanted(upstream_id, target_id, upstream.endpoints.get(target_id)) {
                continue;
            }
            match (shared, upstream.endpoints.get(target_id)) {
                (Some(shared), Some(nodes)) => {
                    let cla =
                        shared.load_assignment(&target.sni, nodes, || pack_any(load_assignment(&target.sni, nodes)));
                    out.insert_shared(ENDPOINT, target.sni.clone(), cla);
                }
                (_, nodes) => {
                    let nodes = nodes.map(|n| n.as_slice()).unwrap_or(&[]);
                    out.insert(
                        ENDPOINT,
                        target.sni.clone(),
                        pack_any(load_assignment(&target.sni, nodes)),
                    );
                }
            }
        }
    }
    Ok(())
}
