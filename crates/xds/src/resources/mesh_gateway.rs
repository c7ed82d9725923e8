//! Resources of a mesh gateway, its local part: connections for this datacenter's services,
//! routed by the SNI their callers' sidecars set, never terminated (the mTLS is between the
//! two sidecars; the gateway holds no certificate and sees no request).
//!
//! - per service with connect instances, a cluster named by its SNI in the mesh
//!   (`<service>.default.<dc>.internal.<trust-domain>`) to those instances (its sidecars, or a
//!   terminating gateway standing for it), and one per subset of its resolver
//!   (`<subset>.<service>...`) to the instances the subset's filter selects;
//! - per other datacenter with mesh gateways, a cluster `<dc>.internal.<trust-domain>` to
//!   those gateways at their `wan` addresses (healthy ones);
//! - one listener `default:<address>:<port>` whose TLS inspector reads the SNI: a filter
//!   chain per other datacenter matching its names (`*.<dc>.internal.<trust-domain>`)
//!   proxies the connection to that datacenter's gateways; the last chain proxies it to the
//!   local cluster of the SNI's name (`sni_cluster`). A name no cluster has is closed, and
//!   Envoy counts it (`tcp.mesh_gateway_local...`).
//!
//! The listener changes only as datacenters come and go, not as services do.

use super::clusters::load_assignment;
use super::core::{ads, millis, socket, tls_inspector};
use super::listeners::{network_filter, public_bind, tcp_proxy};
use super::{BuildError, CLUSTER, ENDPOINT, LISTENER, Resources};
use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener};
use envoy_types::pb::envoy::extensions::filters::network::sni_cluster::v3::SniCluster;
use envoy_types::util::pack_any;
use proxycfg::{ConfigSnapshot, MeshGatewaySnapshot};
use structs::config_entry::ServiceResolver;
use structs::{CheckServiceNode, ServiceKind};

/// A cluster's connect timeout when its resolver sets none (Consul's).
const DEFAULT_CONNECT_TIMEOUT_MS: u32 = 5_000;

/// Builds a mesh gateway's clusters, load assignments and listener.
pub(crate) fn build(snap: &ConfigSnapshot, g: &MeshGatewaySnapshot, out: &mut Resources) -> Result<(), BuildError> {
    let roots = snap.roots.as_deref().ok_or(BuildError::Incomplete("CA roots"))?;
    for (service, nodes) in g.groups.iter() {
        let resolver = g.resolver(service);
        let timeout = resolver
            .map(|r| r.connect_timeout.0.as_millis())
            .filter(|ms| *ms > 0)
            .map_or(DEFAULT_CONNECT_TIMEOUT_MS, |ms| u32::try_from(ms).unwrap_or(u32::MAX));
        for (subset, endpoints) in resolver_targets("service", service, resolver, nodes, out) {
            let sni = structs::discovery_chain::target_sni(
                subset.unwrap_or(""),
                service,
                "default",
                &snap.datacenter,
                &roots.trust_domain,
            );
            out.insert(CLUSTER, sni.clone(), pack_any(cluster(&sni, timeout)));
            out.insert(ENDPOINT, sni.clone(), pack_any(load_assignment(&sni, &endpoints)));
        }
        // The names peers' sidecars reach it by, when it is exported to them: all of its
        // instances, the connection passed through (the service's sidecar verifies the
        // peer's caller against the peer's roots and intentions).
        for peer in exported_peers(g, service) {
            let sni = structs::peering::peered_service_sni(service, &peer, &roots.trust_domain);
            out.insert(CLUSTER, sni.clone(), pack_any(cluster(&sni, timeout)));
            out.insert(ENDPOINT, sni.clone(), pack_any(load_assignment(&sni, nodes)));
        }
    }
    peering_servers(snap, g, &roots.trust_domain, out);
    let mut chains = remote_chains(snap, g, &roots.trust_domain, out);
    chains.push(FilterChain {
        filters: vec![
            network_filter("envoy.filters.network.sni_cluster", pack_any(SniCluster::default())),
            // The cluster is the one the SNI names (set by the filter before it).
            tcp_proxy("mesh_gateway_local.default", ""),
        ],
        ..Default::default()
    });
    let bind = public_bind(snap);
    let name = format!("default:{bind}:{}", snap.service.port);
    let listener = Listener {
        name: name.clone(),
        address: socket(&bind, u32::from(snap.service.port)),
        listener_filters: vec![tls_inspector()],
        filter_chains: chains,
        traffic_direction: TrafficDirection::Inbound as i32,
        ..Default::default()
    };
    out.insert(LISTENER, name, pack_any(listener));
    Ok(())
}

/// Peering traffic leaving through the gateway, each name routed by the catch-all chain to
/// the cluster of that name, the TLS passed through (end to end):
/// - per service a peer exports here, its SNI to the peer's gateways: where this cluster's
///   sidecars in mesh gateway mode `local` send their connections to it;
/// - with the mesh entry's `Peering.PeerThroughMeshGateways`, the peering calls: this
///   cluster's servers' peering name (`server.<dc>.peering.<trust domain>`) to its servers,
///   and each dialed peer's server name to the addresses the peer gave (its own gateways).
///
/// What cannot be routed is in the gateway's status.
fn peering_servers(snap: &ConfigSnapshot, g: &MeshGatewaySnapshot, trust_domain: &str, out: &mut Resources) {
    let Some(servers) = g.peering_servers.as_deref() else {
        return;
    };
    for route in &servers.imported {
        route_to(&route.sni, &route.gateways, out);
    }
    let mesh = g.mesh_config.as_ref().and_then(|m| m.as_deref());
    if !mesh.is_some_and(|e| matches!(e, structs::ConfigEntry::Mesh(m) if m.peer_through_mesh_gateways())) {
        return;
    }
    let local = format!("server.{}.peering.{trust_domain}", snap.datacenter);
    if servers.local.is_empty() {
        out.problems.insert(
            format!("{PEERING_PROBLEM}{local}"),
            "peering through mesh gateways: no server of this cluster has a gRPC TLS address (-grpc-tls-addr) to route the peering calls to"
                .into(),
        );
    }
    route_to(&local, &servers.local, out);
    for dialed in &servers.dialed {
        route_to(&dialed.server_name, &dialed.addresses, out);
    }
}

/// A cluster named `name` (an SNI the catch-all chain routes to it) to `addresses`
/// (`IP:port`; any other is named in the status and left out).
fn route_to(name: &str, addresses: &[String], out: &mut Resources) {
    let mut endpoints = Vec::new();
    for address in addresses {
        match address.parse::<std::net::SocketAddr>() {
            Ok(at) => endpoints.push(CheckServiceNode {
                service: structs::NodeService {
                    address: at.ip().to_string(),
                    port: at.port(),
                    ..Default::default()
                },
                ..Default::default()
            }),
            Err(_) => {
                out.problems.insert(
                    format!("{PEERING_PROBLEM}{name}:{address}"),
                    format!("peering: {address:?} (for {name}) is not IP:port; it is not routed"),
                );
            }
        }
    }
    out.insert(
        CLUSTER,
        name.to_owned(),
        pack_any(cluster(name, DEFAULT_CONNECT_TIMEOUT_MS)),
    );
    out.insert(ENDPOINT, name.to_owned(), pack_any(load_assignment(name, &endpoints)));
}

/// Where the gateway's status names what the peering calls cannot be routed to.
const PEERING_PROBLEM: &str = "peering-servers:";

/// The peers `service` is exported to.
fn exported_peers(g: &MeshGatewaySnapshot, service: &str) -> std::collections::BTreeSet<String> {
    g.exports
        .iter()
        .filter_map(|e| match &**e {
            structs::ConfigEntry::ExportedServices(e) => Some(e.peers_of(service)),
            _ => None,
        })
        .flatten()
        .collect()
}

/// Per other datacenter with gateways: its cluster and load assignment (to its healthy
/// gateways, at their `wan` addresses), and the filter chain sending its names there.
fn remote_chains(
    snap: &ConfigSnapshot,
    g: &MeshGatewaySnapshot,
    trust_domain: &str,
    out: &mut Resources,
) -> Vec<FilterChain> {
    let mut chains = Vec::new();
    for (dc, gateways) in g.remote.iter().flat_map(|r| r.iter()) {
        if **dc == *snap.datacenter {
            continue;
        }
        let reachable: Vec<CheckServiceNode> = gateways
            .iter()
            .filter(|n| n.aggregate_status() != structs::HealthStatus::Critical)
            .map(CheckServiceNode::reached_from_afar)
            .collect();
        let name = format!("{dc}.internal.{trust_domain}");
        out.insert(
            CLUSTER,
            name.clone(),
            pack_any(cluster(&name, DEFAULT_CONNECT_TIMEOUT_MS)),
        );
        out.insert(ENDPOINT, name.clone(), pack_any(load_assignment(&name, &reachable)));
        chains.push(FilterChain {
            filter_chain_match: Some(FilterChainMatch {
                server_names: vec![format!("*.{name}")],
                ..Default::default()
            }),
            filters: vec![tcp_proxy(&format!("mesh_gateway_remote.{dc}"), &name)],
            ..Default::default()
        });
    }
    chains
}

/// An EDS cluster named `sni`, with no TLS of its own: the connection's bytes pass through.
fn cluster(sni: &str, timeout_ms: u32) -> Cluster {
    Cluster {
        name: sni.to_owned(),
        connect_timeout: millis(timeout_ms),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(cluster::EdsClusterConfig {
            eds_config: ads(),
            service_name: String::new(),
        }),
        ..Default::default()
    }
}

/// The targets a gateway serves for `service` (a mesh gateway's service, a terminating
/// gateway's linked one), each under its own SNI: the service itself (its resolver's default
/// subset's instances when it names one, else all), then each subset of its resolver (the
/// instances its filter selects, passing only when it says so), as Consul's gateways do. A
/// terminating gateway standing for the service serves every subset under its own name: it
/// is kept in each. A filter that cannot be read selects nothing, and the gateway's status
/// says so (under `<key>:<service>:subset:<name>`).
pub(crate) fn resolver_targets<'r>(
    key: &str,
    service: &str,
    resolver: Option<&'r ServiceResolver>,
    nodes: &[CheckServiceNode],
    out: &mut Resources,
) -> Vec<(Option<&'r str>, Vec<CheckServiceNode>)> {
    let Some(resolver) = resolver else {
        return vec![(None, nodes.to_vec())];
    };
    let mut selected = |name: &str, subset: &structs::config_entry::ServiceResolverSubset| match subset
        .filter
        .parse::<structs::filter::Filter>(
    ) {
        Ok(filter) => nodes
            .iter()
            .filter(|n| n.service.kind == ServiceKind::TerminatingGateway || filter.matches(n))
            .filter(|n| !subset.only_passing || n.aggregate_status() == structs::HealthStatus::Passing)
            .cloned()
            .collect(),
        Err(e) => {
            out.problems.insert(
                format!("{key}:{service}:subset:{name}"),
                format!("subset {name:?} of {service:?}: its filter cannot be read: {e}"),
            );
            Vec::new()
        }
    };
    let default = match resolver.subsets.get(&resolver.default_subset) {
        Some(subset) => selected(&resolver.default_subset, subset),
        None => nodes.to_vec(),
    };
    let mut targets = vec![(None, default)];
    for (name, subset) in &resolver.subsets {
        targets.push((Some(name.as_str()), selected(name, subset)));
    }
    targets
}
