//! `Expose.Paths` of a sidecar: plain-HTTP listeners (no mTLS, no intentions) for the listed
//! paths of the local application, such as health and metrics endpoints that something
//! outside the mesh must reach. Each path gets a listener on the public listener's address at
//! its `ListenerPort` routing that path exactly to a cluster of the application's
//! `LocalPathPort`; any other path is a 404. A path the agent added for one of the service's
//! checks (`ParsedFromCheck`, from `Expose.Checks`) accepts connections from this host's
//! loopback and the node's address only, as Consul.

use super::clusters::http2_options;
use super::core::{millis, socket};
use super::listeners::{hcm, public_bind};
use super::{CLUSTER, LISTENER, Resources};
use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{CidrRange, TrafficDirection};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener};
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route, route_action, route_match,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager;
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::util::pack_any;
use proxycfg::{ConfigSnapshot, ConnectProxySnapshot};
use std::collections::BTreeSet;
use structs::{ExposeConfig, ExposePath};

/// The exposed paths of the sidecar: its own `Expose`, else central config's.
pub(crate) fn paths<'a>(snap: &'a ConfigSnapshot, cp: &'a ConnectProxySnapshot) -> &'a ExposeConfig {
    let own = &snap.service.proxy.expose;
    if own.paths.is_empty()
        && let Some(resolved) = cp.resolved_config.as_deref()
    {
        return &resolved.expose;
    }
    own
}

/// The cluster of the application's port `port`.
pub(crate) fn cluster_name(port: u16) -> String {
    format!("exposed_cluster_{port}")
}

/// The listener of `path`: `exposed_path_` and the path's letters and digits, then (when
/// two paths would share it) the listener port.
fn listener_name(path: &ExposePath, taken: &mut BTreeSet<String>) -> String {
    let stripped: String = path.path.chars().filter(char::is_ascii_alphanumeric).collect();
    let name = format!("exposed_path_{stripped}");
    if taken.insert(name.clone()) {
        return name;
    }
    let name = format!("{name}_{}", path.listener_port);
    taken.insert(name.clone());
    name
}

/// The names of the resources [`build`] makes.
pub(crate) fn names(snap: &ConfigSnapshot, cp: &ConnectProxySnapshot) -> Vec<(&'static str, String)> {
    let mut taken = BTreeSet::new();
    let mut out = Vec::new();
    for path in &paths(snap, cp).paths {
        out.push((CLUSTER, cluster_name(path.local_path_port)));
        out.push((LISTENER, listener_name(path, &mut taken)));
    }
    out
}

/// Adds each exposed path's listener and each local port's cluster.
pub(crate) fn build(snap: &ConfigSnapshot, cp: &ConnectProxySnapshot, out: &mut Resources) {
    let expose = paths(snap, cp);
    if expose.paths.is_empty() {
        return;
    }
    let proxy = &snap.service.proxy;
    let local_addr = if proxy.local_service_address.is_empty() {
        "127.0.0.1"
    } else {
        &proxy.local_service_address
    };
    let bind = public_bind(snap);
    let mut names = BTreeSet::new();
    for path in &expose.paths {
        let cluster = cluster_name(path.local_path_port);
        out.insert(
            CLUSTER,
            cluster.clone(),
            pack_any(local_cluster(&cluster, local_addr, path)),
        );
        let name = listener_name(path, &mut names);
        let route = RouteConfiguration {
            name: name.clone(),
            virtual_hosts: vec![VirtualHost {
                name: name.clone(),
                domains: vec!["*".into()],
                routes: vec![Route {
                    r#match: Some(RouteMatch {
                        path_specifier: Some(route_match::PathSpecifier::Path(path.path.clone())),
                        ..Default::default()
                    }),
                    action: Some(route::Action::Route(RouteAction {
                        cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(cluster)),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let filter = hcm(
            &name,
            http_connection_manager::RouteSpecifier::RouteConfig(route),
            Vec::new(),
            None,
        );
        let filter_chain_match = path.parsed_from_check.then(|| FilterChainMatch {
            source_prefix_ranges: check_sources(&snap.service.address),
            ..Default::default()
        });
        let listener = Listener {
            name: name.clone(),
            address: socket(&bind, u32::from(path.listener_port)),
            filter_chains: vec![FilterChain {
                filter_chain_match,
                filters: vec![filter],
                ..Default::default()
            }],
            traffic_direction: TrafficDirection::Inbound as i32,
            ..Default::default()
        };
        out.insert(LISTENER, name, pack_any(listener));
    }
}

/// Who may reach a check's exposed path: this host's loopback, and the node's address
/// (where the agent runs its checks from).
fn check_sources(address: &str) -> Vec<CidrRange> {
    let mut out = vec![cidr("127.0.0.1", 32), cidr("::1", 128)];
    if let Ok(ip) = address.parse::<std::net::IpAddr>()
        && !ip.is_loopback()
    {
        out.push(cidr(&ip.to_string(), if ip.is_ipv4() { 32 } else { 128 }));
    }
    out
}

fn cidr(address: &str, len: u32) -> CidrRange {
    CidrRange {
        address_prefix: address.into(),
        prefix_len: Some(UInt32Value { value: len }),
    }
}

/// The static cluster of the application's `LocalPathPort`, over HTTP/2 for `http2`.
fn local_cluster(name: &str, local_addr: &str, path: &ExposePath) -> Cluster {
    let mut c = Cluster {
        name: name.to_owned(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Static as i32,
        )),
        connect_timeout: millis(5000),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: name.to_owned(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                        address: socket(local_addr, u32::from(path.local_path_port)),
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
    if path.protocol == "http2" {
        c.typed_extension_protocol_options = http2_options();
    }
    c
}
