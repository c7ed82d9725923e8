//! Destinations: services outside the mesh that a `service-defaults` entry's `Destination`
//! names by address (IPs or host names) and port, reached through a terminating gateway
//! that links the service.
//!
//! - A transparent sidecar whose intentions allow the service gets, per address, a cluster
//!   `destination.<address>.<service SNI>` to the gateway's instances over mTLS (SNI that
//!   name, the service's SPIFFE id checked: the gateway answers as the service), and a
//!   filter chain on its outbound listener: for TCP, the address (an IP, or a host name as
//!   the TLS SNI the application sends) and the port; for HTTP, the port (and the IPs, when
//!   every HTTP destination on that port is an IP), with one virtual host per address.
//! - The terminating gateway matches that SNI, terminates mTLS with the service's leaf,
//!   applies the intentions to it, and proxies to the address: a `STATIC` cluster for an
//!   IP, `LOGICAL_DNS` for a host name, TLS originated when the link gives a `CAFile`.

use super::core::{ads, millis, socket};
use super::listeners::{everything_to, hcm, tcp_proxy};
use super::{CLUSTER, ENDPOINT, Resources, tls};
use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::envoy::config::listener::v3::{
    FilterChain, FilterChainMatch, ListenerFilter, ListenerFilterChainMatchPredicate,
};
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::TlsParameters;
use envoy_types::pb::envoy::r#type::v3::Int32Range;
use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};
use envoy_types::util::pack_any;
use proxycfg::{ConfigSnapshot, ConnectProxySnapshot, DestinationUpstream};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use structs::config_entry::DestinationConfig;
use structs::{CheckServiceNode, GatewayService, SpiffeIdService};

/// How long a connection to a destination (sidecar to gateway, gateway to the address)
/// may take to open.
const CONNECT_TIMEOUT_MS: u32 = 5_000;

/// The cluster name (and SNI) of `address` of destination `service` in `snap`'s datacenter.
pub(crate) fn cluster_name(snap: &ConfigSnapshot, trust_domain: &str, service: &str, address: &str) -> String {
    structs::discovery_chain::destination_sni(address, service, "default", &snap.datacenter, trust_domain)
}

/// The instances of the gateways linking `d` (each address and port once).
fn gateway_instances(cp: &ConnectProxySnapshot, d: &DestinationUpstream) -> Vec<CheckServiceNode> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for gateway in &d.gateways {
        for node in cp.destination_gateways.get(gateway).into_iter().flat_map(|n| n.iter()) {
            if seen.insert((node.address().to_owned(), node.service.port)) {
                out.push(node.clone());
            }
        }
    }
    out
}

/// The names of the clusters and load assignments [`sidecar_chains`] builds for `cp`.
pub(crate) fn names(snap: &ConfigSnapshot, cp: &ConnectProxySnapshot) -> Vec<(&'static str, String)> {
    let Some(roots) = snap.roots.as_deref() else {
        return Vec::new();
    };
    let mut names = Vec::new();
    for (service, d) in cp.destinations.iter() {
        for address in &d.destination.addresses {
            let name = cluster_name(snap, &roots.trust_domain, service, address);
            names.push((CLUSTER, name.clone()));
            names.push((ENDPOINT, name));
        }
    }
    names
}

/// The outbound listener's chains for a proxy's destinations.
pub(crate) struct OutboundChains {
    /// The chains, in order.
    pub(crate) chains: Vec<FilterChain>,
    /// The ports of the chains that match a TLS server name: the listener needs the TLS
    /// inspector on connections to them (and only to them: a protocol where the server
    /// speaks first would wait for the inspector's timeout).
    pub(crate) server_name_ports: BTreeSet<u16>,
}

impl OutboundChains {
    /// The TLS inspector, run only on connections to the ports that need it.
    pub(crate) fn tls_inspector(&self) -> Option<ListenerFilter> {
        use envoy_types::pb::envoy::config::listener::v3::listener_filter_chain_match_predicate::{MatchSet, Rule};
        if self.server_name_ports.is_empty() {
            return None;
        }
        let mut ports: Vec<ListenerFilterChainMatchPredicate> = self
            .server_name_ports
            .iter()
            .map(|p| ListenerFilterChainMatchPredicate {
                rule: Some(Rule::DestinationPortRange(Int32Range {
                    start: i32::from(*p),
                    end: i32::from(*p) + 1,
                })),
            })
            .collect();
        // A set has at least two members.
        let needed = if ports.len() == 1 {
            ports.remove(0)
        } else {
            ListenerFilterChainMatchPredicate {
                rule: Some(Rule::OrMatch(MatchSet { rules: ports })),
            }
        };
        let mut filter = super::core::tls_inspector();
        filter.filter_disabled = Some(ListenerFilterChainMatchPredicate {
            rule: Some(Rule::NotMatch(Box::new(needed))),
        });
        Some(filter)
    }
}

/// Builds a transparent sidecar's clusters and load assignments to its destinations, and
/// returns the outbound listener's chains for them. Problems (no gateway links a
/// destination, an address and port claimed twice) go to the proxy's status under
/// `problem_prefix`.
pub(crate) fn sidecar_chains(
    snap: &ConfigSnapshot,
    cp: &ConnectProxySnapshot,
    trust_domain: &str,
    outgoing: Option<&TlsParameters>,
    problem_prefix: &str,
    out: &mut Resources,
) -> OutboundChains {
    let mut chains = Vec::new();
    let mut server_name_ports = BTreeSet::new();
    // (address, port) -> destination: Envoy refuses a listener where two chains match alike.
    let mut claimed: BTreeMap<(String, u16), &str> = BTreeMap::new();
    // HTTP destinations share one chain per port: (service, address, cluster) each.
    let mut http: BTreeMap<u16, Vec<(&str, &str, String)>> = BTreeMap::new();
    for (service, d) in cp.destinations.iter() {
        let instances = gateway_instances(cp, d);
        if d.gateways.is_empty() {
            out.problems.insert(
                format!("{problem_prefix} destination:{service}"),
                format!(
                    "destination {service:?}: no terminating-gateway config entry links it: connections to it are closed"
                ),
            );
        } else if instances.is_empty() && d.gateways.iter().all(|g| cp.destination_gateways.contains_key(g)) {
            out.problems.insert(
                format!("{problem_prefix} destination:{service}"),
                format!(
                    "destination {service:?}: no healthy instance of its terminating gateway(s) {}",
                    d.gateways.join(", ")
                ),
            );
        }
        let spiffe = SpiffeIdService {
            trust_domain: trust_domain.to_owned(),
            namespace: "default".to_owned(),
            datacenter: snap.datacenter.to_string(),
            service: service.clone(),
        }
        .to_string();
        let port = d.destination.port;
        for address in &d.destination.addresses {
            if let Some(owner) = claimed.get(&(address.clone(), port)) {
                out.problems.insert(
                    format!("{problem_prefix} destination:{service}"),
                    format!("destination {service:?}: {address}:{port} is already destination {owner:?}'s; not matched again"),
                );
                continue;
            }
            claimed.insert((address.clone(), port), service);
            let name = cluster_name(snap, trust_domain, service, address);
            let mut cluster = Cluster {
                name: name.clone(),
                cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::Eds as i32)),
                eds_cluster_config: Some(cluster::EdsClusterConfig {
                    eds_config: ads(),
                    service_name: String::new(),
                }),
                connect_timeout: millis(CONNECT_TIMEOUT_MS),
                transport_socket: Some(tls::upstream(&name, &spiffe, outgoing.cloned())),
                ..Default::default()
            };
            if d.protocol.is_http2() {
                cluster.typed_extension_protocol_options = super::clusters::http2_options();
            }
            out.insert(CLUSTER, name.clone(), pack_any(cluster));
            out.insert(
                ENDPOINT,
                name.clone(),
                pack_any(super::clusters::load_assignment(&name, &instances)),
            );
            if d.protocol.is_http() {
                http.entry(port).or_default().push((service, address, name));
                continue;
            }
            let mut m = FilterChainMatch {
                destination_port: Some(UInt32Value { value: u32::from(port) }),
                ..Default::default()
            };
            match address.parse::<IpAddr>() {
                Ok(ip) => m.prefix_ranges = vec![super::core::cidr(ip)],
                Err(_) => {
                    m.server_names = vec![address.trim_end_matches('.').to_owned()];
                    server_name_ports.insert(port);
                }
            }
            chains.push(FilterChain {
                filter_chain_match: Some(m),
                filters: vec![tcp_proxy(&format!("upstream.destination.{service}"), &name)],
                ..Default::default()
            });
        }
    }
    for (port, entries) in http {
        chains.push(http_chain(port, &entries));
    }
    OutboundChains {
        chains,
        server_name_ports,
    }
}

/// The chain of the HTTP destinations on `port`: matched on the port (and on their IPs when
/// all are IPs: a host name's IP is not known, so then every connection to the port that
/// no more specific chain takes), routed by the request's host to each address's cluster.
fn http_chain(port: u16, entries: &[(&str, &str, String)]) -> FilterChain {
    let ips: Option<Vec<IpAddr>> = entries.iter().map(|(_, a, _)| a.parse::<IpAddr>().ok()).collect();
    let virtual_hosts = entries
        .iter()
        .map(|(service, address, cluster)| {
            let host = match address.parse::<IpAddr>() {
                Ok(IpAddr::V6(ip)) => format!("[{ip}]"),
                _ => address.trim_end_matches('.').to_owned(),
            };
            VirtualHost {
                name: format!("{service}.{host}"),
                domains: vec![host.clone(), format!("{host}:{port}")],
                routes: vec![everything_to(cluster)],
                ..Default::default()
            }
        })
        .collect();
    let route = RouteConfiguration {
        name: format!("destination.{port}"),
        virtual_hosts,
        // Built with its clusters, sent beside them: never refused for arriving first.
        validate_clusters: Some(BoolValue { value: false }),
        ..Default::default()
    };
    FilterChain {
        filter_chain_match: Some(FilterChainMatch {
            destination_port: Some(UInt32Value { value: u32::from(port) }),
            prefix_ranges: ips.unwrap_or_default().into_iter().map(super::core::cidr).collect(),
            ..Default::default()
        }),
        filters: vec![hcm(
            &format!("upstream.destination.http.{port}"),
            http_connection_manager::RouteSpecifier::RouteConfig(route),
            Vec::new(),
            None,
        )],
        ..Default::default()
    }
}

/// The cluster of a terminating gateway to one address of a destination: `STATIC` for an
/// IP, `LOGICAL_DNS` (IPv4 answers) for a host name; TLS originated when the link gives a
/// `CAFile` (SNI the link's, else the host name).
pub(crate) fn gateway_cluster(
    name: &str,
    address: &str,
    port: u16,
    link: &GatewayService,
    protocol: structs::Protocol,
) -> Cluster {
    let ip = DestinationConfig::is_ip(address);
    let host = address.trim_end_matches('.');
    let kind = if ip {
        cluster::DiscoveryType::Static
    } else {
        cluster::DiscoveryType::LogicalDns
    };
    let sni = if !link.sni.is_empty() {
        link.sni.as_str()
    } else if ip {
        ""
    } else {
        host
    };
    let mut cluster = Cluster {
        name: name.to_owned(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(kind as i32)),
        dns_lookup_family: if ip {
            cluster::DnsLookupFamily::Auto as i32
        } else {
            cluster::DnsLookupFamily::V4Only as i32
        },
        connect_timeout: millis(CONNECT_TIMEOUT_MS),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: name.to_owned(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                        address: socket(host, u32::from(port)),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        transport_socket: (!link.ca_file.is_empty())
            .then(|| tls::upstream_external(&link.ca_file, &link.cert_file, &link.key_file, sni)),
        ..Default::default()
    };
    if protocol.is_http2() {
        cluster.typed_extension_protocol_options = super::clusters::http2_options();
    }
    cluster
}
