//! Clusters and their load assignments.

use super::core::{ads, millis, socket};
use super::{BuildError, CLUSTER, ENDPOINT, Resources, tls};
use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{HealthStatus, Http2ProtocolOptions};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{HttpProtocolOptions, http_protocol_options};
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::util::pack_any;
use proxycfg::ConfigSnapshot;
use structs::{CheckServiceNode, SpiffeIdService};

/// The cluster of the local application.
pub(crate) const LOCAL_APP: &str = "local_app";

/// `typed_extension_protocol_options` that make a cluster speak HTTP/2 upstream.
fn http2_options() -> std::collections::HashMap<String, envoy_types::pb::google::protobuf::Any> {
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

/// One locality holding every instance, with a locality weight (proxyless gRPC clients skip
/// localities without one).
pub(crate) fn load_assignment(cluster_name: &str, nodes: &[CheckServiceNode]) -> ClusterLoadAssignment {
    let endpoints = if nodes.is_empty() {
        Vec::new()
    } else {
        vec![LocalityLbEndpoints {
            lb_endpoints: nodes.iter().map(lb_endpoint).collect(),
            load_balancing_weight: Some(UInt32Value { value: 1 }),
            ..Default::default()
        }]
    };
    ClusterLoadAssignment {
        cluster_name: cluster_name.to_owned(),
        endpoints,
        ..Default::default()
    }
}

pub(crate) fn build(snap: &ConfigSnapshot, out: &mut Resources) -> Result<(), BuildError> {
    let cp = snap
        .connect_proxy()
        .ok_or(BuildError::Incomplete("not a connect-proxy"))?;
    let roots = snap.roots.as_deref().ok_or(BuildError::Incomplete("CA roots"))?;
    let proxy = &snap.service.proxy;

    let local_addr = if proxy.local_service_address.is_empty() {
        "127.0.0.1"
    } else {
        &proxy.local_service_address
    };
    let local = Cluster {
        name: LOCAL_APP.into(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Static as i32,
        )),
        connect_timeout: millis(5000),
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
    out.insert(CLUSTER, LOCAL_APP.into(), pack_any(local));

    for upstream in cp.upstreams.values() {
        let Some(chain) = &upstream.chain else { continue };
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
                transport_socket: Some(tls::upstream(&target.sni, &spiffe.to_string())),
                ..Default::default()
            };
            if chain.protocol.is_http2() {
                cluster.typed_extension_protocol_options = http2_options();
            }
            out.insert(CLUSTER, target.sni.clone(), pack_any(cluster));
        }
    }
    Ok(())
}

/// The load assignment of every chain target: the only resources an endpoints change
/// touches, so an endpoints-only snapshot change rebuilds just these.
pub(crate) fn build_endpoints(
    snap: &ConfigSnapshot,
    out: &mut Resources,
    shared: Option<&super::SharedEncodings>,
) -> Result<(), BuildError> {
    let cp = snap
        .connect_proxy()
        .ok_or(BuildError::Incomplete("not a connect-proxy"))?;
    for upstream in cp.upstreams.values() {
        let Some(chain) = &upstream.chain else { continue };
        for (target_id, target) in &chain.targets {
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
