//! Resources of gateways.
//!
//! Ingress gateway (traffic from outside the mesh in):
//! - secrets `default` (the gateway's leaf: its identity to upstreams, and its server
//!   certificate when a listener serves TLS from the mesh CA) and `ROOTCA`;
//! - per exposed service, the clusters and load assignments of its discovery chain, with
//!   mTLS to each target and the service's limits;
//! - per entry listener `<protocol>:<address>:<port>`: a TCP proxy to its one service, or an
//!   HTTP connection manager with route configuration `<port>` holding a virtual host per
//!   service (its hosts, else `<service>.ingress.*`) with the service's chain routes and
//!   header changes. A service with its own SDS certificate gets a filter chain matching its
//!   hosts by SNI and route configuration `<port>_<service>`.
//!
//! Terminating gateway (traffic from the mesh out):
//! - secrets `ROOTCA` and, per represented service, `<service>` holding its leaf;
//! - per represented service, a cluster named by the service's SNI in the mesh (what its
//!   callers' sidecars send) to its instances (EDS for IP addresses, DNS otherwise), with
//!   TLS to it when the link sets a `CAFile`;
//! - one listener `default:<address>:<port>` with a filter chain per service matching that
//!   SNI, presenting the service's leaf, requiring a mesh client certificate, and enforcing
//!   the intentions to the service before proxying (per request for HTTP protocols).

use super::clusters::{chain_clusters, http2_options, load_assignment};
use super::core::{ads, millis, socket, tls_inspector};
use super::listeners::{Inbound, hcm, http_filter, inbound_http, network_filter, public_bind, route_to, tcp_proxy};
use super::{BuildError, CLUSTER, ENDPOINT, LISTENER, ROUTE, Resources, SECRET, rbac, routes, tls};
use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener};
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{Rds, http_connection_manager};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{SdsSecretConfig, TlsParameters};
use envoy_types::util::pack_any;
use proxycfg::handler::{ingress_service_hosts, ingress_upstream_id};
use proxycfg::{ConfigSnapshot, IngressGatewaySnapshot, TerminatingGatewaySnapshot};
use structs::config_entry::{GatewayTlsConfig, IngressGateway, IngressListener, IngressService};
use structs::protocol::UpstreamLimits;
use structs::{GatewayService, Protocol};

/// Builds an ingress gateway's clusters, listeners and routes (secrets and load assignments
/// are built by the common steps).
pub(crate) fn build_ingress(
    snap: &ConfigSnapshot,
    g: &IngressGatewaySnapshot,
    out: &mut Resources,
) -> Result<(), BuildError> {
    let roots = snap.roots.as_deref().ok_or(BuildError::Incomplete("CA roots"))?;
    let services = g
        .services
        .as_deref()
        .ok_or(BuildError::Incomplete("gateway services"))?;
    let Some(entry) = g.config() else {
        out.problems.insert(
            "ingress-gateway".into(),
            format!(
                "no ingress-gateway config entry named {:?}: the gateway has no listeners",
                snap.service.service
            ),
        );
        return Ok(());
    };
    let mesh = g.mesh_config.as_ref().and_then(|m| m.as_deref());
    let outgoing = tls::mesh_params(snap, mesh, tls::Direction::Outgoing);

    // Clusters: each exposed service's chain, with that service's limits.
    for (id, upstream) in g.upstreams.iter() {
        let Some(chain) = &upstream.chain else { continue };
        let (limits, phc) = service_limits(entry, &id.name);
        chain_clusters(roots, chain, limits.as_ref(), phc, outgoing.as_ref(), out);
    }

    let bind = public_bind(snap);
    for listener in &entry.listeners {
        let on_port: Vec<&GatewayService> = services.iter().filter(|s| s.port == listener.port).collect();
        let protocol: Protocol = listener.protocol().parse().unwrap_or_default();
        let name = format!("{}:{bind}:{}", listener.protocol(), listener.port);
        if on_port.is_empty() {
            out.problems.insert(
                format!("listener:{}", listener.port),
                format!("listener {name}: no service it names is known yet, so it is not served"),
            );
            continue;
        }
        let tls_cfg = listener.tls.as_ref().unwrap_or(&entry.tls);
        let default_tls = listener_tls(tls_cfg);
        let result = if protocol.is_http() {
            http_listener(g, entry, listener, &on_port, &name, &bind, default_tls, out)
        } else {
            tcp_listener(g, &on_port, &name, &bind, listener.port, default_tls, out)
        };
        if let Err(problem) = result {
            out.fail(format!("listener:{}", listener.port), problem, [(LISTENER, name)]);
        }
    }
    Ok(())
}

/// The server certificate a listener's TLS settings ask for, if any.
fn listener_tls(cfg: &GatewayTlsConfig) -> Option<(SdsSecretConfig, Option<TlsParameters>)> {
    let certificate = match &cfg.sds {
        Some(sds) => tls::external_sds(&sds.cluster_name, &sds.cert_resource),
        None if cfg.enabled => tls::leaf_sds(),
        None => return None,
    };
    Some((certificate, tls::gateway_params(cfg)))
}

fn alpn(protocol: Protocol) -> &'static [&'static str] {
    if protocol.is_http2() {
        &["h2", "http/1.1"]
    } else if protocol.is_http() {
        &["http/1.1"]
    } else {
        &[]
    }
}

/// The entry's config of an exposed service: its own entry on a listener, else the
/// listener's `*` entry.
fn service_config<'e>(entry: &'e IngressGateway, service: &str, port: Option<u16>) -> Option<&'e IngressService> {
    let listeners = || entry.listeners.iter().filter(move |l| port.is_none_or(|p| l.port == p));
    listeners()
        .flat_map(|l| &l.services)
        .find(|s| s.name == service)
        .or_else(|| listeners().flat_map(|l| &l.services).find(|s| s.name == "*"))
}

/// The limits and outlier detection of an exposed service: its own, else the entry's
/// defaults.
fn service_limits<'e>(
    entry: &'e IngressGateway,
    service: &str,
) -> (
    Option<UpstreamLimits>,
    Option<&'e structs::protocol::PassiveHealthCheck>,
) {
    let own = service_config(entry, service, None);
    let defaults = entry.defaults.as_ref();
    let pick = |own: u32, default: Option<u32>| -> Option<u32> {
        if own != 0 {
            Some(own)
        } else {
            default.filter(|d| *d != 0)
        }
    };
    let limits = UpstreamLimits {
        max_connections: pick(
            own.map_or(0, |s| s.max_connections),
            defaults.map(|d| d.max_connections),
        ),
        max_pending_requests: pick(
            own.map_or(0, |s| s.max_pending_requests),
            defaults.map(|d| d.max_pending_requests),
        ),
        max_concurrent_requests: pick(
            own.map_or(0, |s| s.max_concurrent_requests),
            defaults.map(|d| d.max_concurrent_requests),
        ),
    };
    let any = limits.max_connections.is_some()
        || limits.max_pending_requests.is_some()
        || limits.max_concurrent_requests.is_some();
    let phc = own
        .and_then(|s| s.passive_health_check.as_ref())
        .or_else(|| defaults.and_then(|d| d.passive_health_check.as_ref()));
    (any.then_some(limits), phc)
}

fn tcp_listener(
    g: &IngressGatewaySnapshot,
    on_port: &[&GatewayService],
    name: &str,
    bind: &str,
    port: u16,
    tls: Option<(SdsSecretConfig, Option<TlsParameters>)>,
    out: &mut Resources,
) -> Result<(), String> {
    let [service] = on_port else {
        return Err(format!(
            "listener {name}: a tcp listener exposes exactly one service, not {}",
            on_port.len()
        ));
    };
    let id = ingress_upstream_id(&service.service);
    let Some(chain) = g.upstreams.get(&id).and_then(|u| u.chain.as_ref()) else {
        return Err(format!(
            "listener {name}: the discovery chain of {:?} is not known yet",
            service.service
        ));
    };
    let cluster = routes::tcp_cluster(chain).map_err(|e| format!("listener {name}: {}", e.0))?;
    let listener = Listener {
        name: name.to_owned(),
        address: socket(bind, u32::from(port)),
        filter_chains: vec![FilterChain {
            filters: vec![tcp_proxy(&format!("ingress_upstream.{}", service.service), &cluster)],
            transport_socket: tls.map(|(cert, params)| tls::downstream_server(cert, params, &[])),
            ..Default::default()
        }],
        traffic_direction: TrafficDirection::Outbound as i32,
        ..Default::default()
    };
    out.insert(LISTENER, name.to_owned(), pack_any(listener));
    Ok(())
}

/// The virtual host of one exposed service on an HTTP listener.
fn virtual_host(
    g: &IngressGatewaySnapshot,
    entry: &IngressGateway,
    service: &GatewayService,
    port: u16,
) -> Result<VirtualHost, String> {
    let id = ingress_upstream_id(&service.service);
    let chain = g
        .upstreams
        .get(&id)
        .and_then(|u| u.chain.as_ref())
        .ok_or_else(|| format!("the discovery chain of {:?} is not known yet", service.service))?;
    let mut config = routes::route_config(&service.service, chain).map_err(|e| e.0)?;
    let mut vhost = config.virtual_hosts.pop().unwrap_or_default();
    let mut domains = Vec::new();
    for host in ingress_service_hosts(service) {
        // Clients may send the port in the Host header; a host naming a port matches it.
        domains.extend(structs::config_entry::host_domains(&host, port));
    }
    if domains.iter().any(|d| d == "*") {
        domains = vec!["*".into()];
    }
    vhost.name = format!("{}:{port}", service.service);
    vhost.domains = domains;
    if let Some(cfg) = service_config(entry, &service.service, Some(port)) {
        let (add, remove) = routes::header_changes(cfg.request_headers.as_ref());
        vhost.request_headers_to_add = add;
        vhost.request_headers_to_remove = remove;
        let (add, remove) = routes::header_changes(cfg.response_headers.as_ref());
        vhost.response_headers_to_add = add;
        vhost.response_headers_to_remove = remove;
    }
    Ok(vhost)
}

fn http_route_filter(stat_prefix: &str, route_name: &str) -> envoy_types::pb::envoy::config::listener::v3::Filter {
    hcm(
        stat_prefix,
        http_connection_manager::RouteSpecifier::Rds(Rds {
            config_source: ads(),
            route_config_name: route_name.to_owned(),
        }),
        Vec::new(),
        None,
    )
}

#[allow(clippy::too_many_arguments)]
fn http_listener(
    g: &IngressGatewaySnapshot,
    entry: &IngressGateway,
    listener: &IngressListener,
    on_port: &[&GatewayService],
    name: &str,
    bind: &str,
    tls: Option<(SdsSecretConfig, Option<TlsParameters>)>,
    out: &mut Resources,
) -> Result<(), String> {
    let port = listener.port;
    let protocol: Protocol = listener.protocol().parse().unwrap_or_default();
    let route_name = port.to_string();
    let mut vhosts = Vec::new();
    let mut own_chains = Vec::new();
    for service in on_port {
        let vhost = match virtual_host(g, entry, service, port) {
            Ok(v) => v,
            Err(problem) => {
                // The other services of the listener are still served.
                out.problems.insert(
                    format!("listener:{port}:{}", service.service),
                    format!("listener {name}, service {:?}: {problem}", service.service),
                );
                continue;
            }
        };
        if let Some(chain) = own_certificate_chain(entry, listener, service, &vhost, name, protocol, out) {
            own_chains.push(chain);
        }
        vhosts.push(vhost);
    }
    if vhosts.is_empty() {
        return Err(format!("listener {name}: none of its services can be routed yet"));
    }
    out.insert(
        ROUTE,
        route_name.clone(),
        pack_any(RouteConfiguration {
            name: route_name.clone(),
            virtual_hosts: vhosts,
            // Host matching is the routing: a Host no service answers to is a 404.
            validate_clusters: Some(envoy_types::pb::google::protobuf::BoolValue { value: false }),
            ..Default::default()
        }),
    );
    let has_own = !own_chains.is_empty();
    let mut chains = own_chains;
    chains.push(FilterChain {
        filters: vec![http_route_filter(&format!("ingress_upstream_{port}"), &route_name)],
        transport_socket: tls.map(|(cert, params)| tls::downstream_server(cert, params, alpn(protocol))),
        ..Default::default()
    });
    let listener = Listener {
        name: name.to_owned(),
        address: socket(bind, u32::from(port)),
        listener_filters: if has_own { vec![tls_inspector()] } else { Vec::new() },
        filter_chains: chains,
        traffic_direction: TrafficDirection::Outbound as i32,
        ..Default::default()
    };
    out.insert(LISTENER, name.to_owned(), pack_any(listener));
    Ok(())
}

/// The filter chain of a service on an HTTP listener that has a certificate of its own:
/// selected by SNI on the service's hosts, with a route configuration `<port>_<service>` of
/// its own. `None` without such a certificate, or when no host can be selected by SNI (a
/// problem says so, and the listener's certificate is used).
fn own_certificate_chain(
    entry: &IngressGateway,
    listener: &IngressListener,
    service: &GatewayService,
    vhost: &VirtualHost,
    name: &str,
    protocol: Protocol,
    out: &mut Resources,
) -> Option<FilterChain> {
    let port = listener.port;
    let own_sds = service_config(entry, &service.service, Some(port))
        .and_then(|s| s.tls.as_ref())
        .and_then(|t| t.sds.as_ref())?;
    // SNI names a host exactly or under a leading `*.`: other patterns cannot select.
    let mut hosts: Vec<String> = Vec::new();
    for host in ingress_service_hosts(service) {
        // SNI names a host, not a port.
        let name = structs::config_entry::host_name(&host);
        if name != "*" && !name.ends_with(".*") && !hosts.iter().any(|h| h == name) {
            hosts.push(name.to_owned());
        }
    }
    if hosts.is_empty() {
        out.problems.insert(
            format!("listener:{port}:{}:tls", service.service),
            format!(
                "listener {name}, service {:?}: its own certificate needs hosts to be selected by SNI; the listener's is used",
                service.service
            ),
        );
        return None;
    }
    let own_route = format!("{port}_{}", service.service);
    out.insert(
        ROUTE,
        own_route.clone(),
        pack_any(RouteConfiguration {
            name: own_route.clone(),
            virtual_hosts: vec![vhost.clone()],
            ..Default::default()
        }),
    );
    let params = listener.tls.as_ref().or(Some(&entry.tls)).and_then(tls::gateway_params);
    Some(FilterChain {
        filter_chain_match: Some(FilterChainMatch {
            server_names: hosts,
            ..Default::default()
        }),
        filters: vec![http_route_filter(
            &format!("ingress_upstream_{port}_{}", service.service),
            &own_route,
        )],
        transport_socket: Some(tls::downstream_server(
            tls::external_sds(&own_sds.cluster_name, &own_sds.cert_resource),
            params,
            alpn(protocol),
        )),
        ..Default::default()
    })
}

/// Builds a terminating gateway's secrets per service, clusters, load assignments and its
/// listener (the roots secret is built by the common step).
pub(crate) fn build_terminating(
    snap: &ConfigSnapshot,
    g: &TerminatingGatewaySnapshot,
    out: &mut Resources,
) -> Result<(), BuildError> {
    let roots = snap.roots.as_deref().ok_or(BuildError::Incomplete("CA roots"))?;
    let mesh = g.mesh_config.as_ref().and_then(|m| m.as_deref());
    let incoming = tls::mesh_params(snap, mesh, tls::Direction::Incoming);
    let inbound = inbound_http(mesh);
    let bind = public_bind(snap);
    let name = format!("default:{bind}:{}", snap.service.port);
    let mut chains = Vec::new();
    let mut waiting = Vec::new();
    for (service, linked) in g.linked.iter() {
        let (Some(leaf), Some(intentions), Some(config), Some(endpoints), Some(_)) = (
            &linked.leaf,
            &linked.intentions,
            &linked.config,
            &linked.endpoints,
            &linked.resolver,
        ) else {
            waiting.push(service.as_str());
            continue;
        };
        let secret = service.clone();
        out.insert(SECRET, secret.clone(), pack_any(tls::leaf_secret(&secret, leaf)));
        let protocol = config.protocol();
        let dns = snap.service.proxy.options().dns_discovery_type.unwrap_or_default();
        jwt_not_checked(service, intentions, out);
        if let Some(destination) = &config.destination {
            let linking = Linking {
                service,
                link: &linked.link,
                protocol,
                intentions,
                secret: &secret,
            };
            destination_chains(snap, &roots.trust_domain, &linking, destination, &mut chains, out);
            continue;
        }
        let resolver = linked.resolver();
        for (subset, endpoints) in
            super::mesh_gateway::resolver_targets("linked-service", service, resolver, endpoints, out)
        {
            // The name its callers' sidecars use for this target: their cluster name and SNI.
            let sni = structs::discovery_chain::target_sni(
                subset.unwrap_or(""),
                service,
                "default",
                &snap.datacenter,
                &roots.trust_domain,
            );
            let cluster = linked_cluster(&sni, &linked.link, protocol, dns, &endpoints, out);
            out.insert(CLUSTER, sni.clone(), pack_any(cluster));
            let filters = linked_filters(
                service,
                &sni,
                protocol,
                intentions,
                snap.intention_default_allow,
                inbound,
            );
            chains.push(FilterChain {
                filter_chain_match: Some(FilterChainMatch {
                    server_names: vec![sni.clone()],
                    ..Default::default()
                }),
                filters,
                transport_socket: Some(tls::downstream_as(&secret, incoming.clone())),
                ..Default::default()
            });
        }
    }
    report_unserved(snap, g, &waiting, out);
    // Last, a chain for connections no service's SNI matched: they are closed (its TCP
    // proxy names no cluster), and the listener exists, so the gateway is ready and its
    // port answers health checks before any service is linked, as Consul's.
    chains.push(FilterChain {
        filters: vec![tcp_proxy("terminating_gateway.no_match", "")],
        ..Default::default()
    });
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

/// Names in the gateway's status the linked services still `waiting` for parts, or that
/// none is linked.
fn report_unserved(snap: &ConfigSnapshot, g: &TerminatingGatewaySnapshot, waiting: &[&str], out: &mut Resources) {
    if !waiting.is_empty() {
        out.problems.insert(
            "linked-services".into(),
            format!(
                "waiting for the certificate, intentions, config or instances of: {}",
                waiting.join(", ")
            ),
        );
    }
    if g.linked.is_empty() {
        out.problems.insert(
            "linked-services".into(),
            format!(
                "no services linked: no terminating-gateway config entry named {:?} links a service yet (the listener matches nothing)",
                snap.service.service
            ),
        );
    }
}

/// What a terminating gateway's chains for one linked service are built from.
struct Linking<'a> {
    service: &'a str,
    link: &'a GatewayService,
    protocol: Protocol,
    intentions: &'a [structs::Intention],
    /// The name of the service's leaf secret.
    secret: &'a str,
}

/// A terminating gateway's chains and clusters for a linked destination: one per address,
/// matched on its destination name, guarded by the intentions, to the address itself.
fn destination_chains(
    snap: &ConfigSnapshot,
    trust_domain: &str,
    l: &Linking<'_>,
    destination: &structs::config_entry::DestinationConfig,
    chains: &mut Vec<FilterChain>,
    out: &mut Resources,
) {
    let mesh = snap
        .terminating_gateway()
        .and_then(|g| g.mesh_config.as_ref())
        .and_then(|m| m.as_deref());
    let incoming = tls::mesh_params(snap, mesh, tls::Direction::Incoming);
    for address in &destination.addresses {
        let name = super::destinations::cluster_name(snap, trust_domain, l.service, address);
        let cluster = super::destinations::gateway_cluster(&name, address, destination.port, l.link, l.protocol);
        out.insert(CLUSTER, name.clone(), pack_any(cluster));
        chains.push(FilterChain {
            filter_chain_match: Some(FilterChainMatch {
                server_names: vec![name.clone()],
                ..Default::default()
            }),
            filters: linked_filters(
                l.service,
                &name,
                l.protocol,
                l.intentions,
                snap.intention_default_allow,
                inbound_http(mesh),
            ),
            transport_socket: Some(tls::downstream_as(l.secret, incoming.clone())),
            ..Default::default()
        });
    }
}

/// The cluster of a terminating gateway's linked service, named `sni`: to its instances
/// by EDS when all are IP addresses (their load assignment goes to `out`), else by DNS as
/// `dns` says (IPv4 answers only, as Consul's: a host name such as `localhost` resolving to
/// `::1` first would fail against a service listening on IPv4); with TLS to them when the
/// link sets a `CAFile`.
fn linked_cluster(
    sni: &str,
    link: &GatewayService,
    protocol: Protocol,
    dns: structs::DnsDiscoveryType,
    endpoints: &[structs::CheckServiceNode],
    out: &mut Resources,
) -> Cluster {
    let all_ips = endpoints
        .iter()
        .all(|n| n.address().parse::<std::net::IpAddr>().is_ok());
    let mut cluster = Cluster {
        name: sni.to_owned(),
        connect_timeout: millis(5000),
        transport_socket: (!link.ca_file.is_empty())
            .then(|| tls::upstream_external(&link.ca_file, &link.cert_file, &link.key_file, &link.sni)),
        ..Default::default()
    };
    if all_ips {
        cluster.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::Eds as i32));
        cluster.eds_cluster_config = Some(cluster::EdsClusterConfig {
            eds_config: ads(),
            service_name: String::new(),
        });
        out.insert(ENDPOINT, sni.to_owned(), pack_any(load_assignment(sni, endpoints)));
    } else {
        // Host names are resolved by Envoy (and re-resolved as DNS changes).
        cluster.dns_lookup_family = cluster::DnsLookupFamily::V4Only as i32;
        let (kind, endpoints) = match dns {
            structs::DnsDiscoveryType::Strict => (cluster::DiscoveryType::StrictDns, endpoints.to_vec()),
            structs::DnsDiscoveryType::Logical => (
                cluster::DiscoveryType::LogicalDns,
                logical_dns_endpoint(&link.service, endpoints, out),
            ),
        };
        cluster.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::Type(kind as i32));
        cluster.load_assignment = Some(load_assignment(sni, &endpoints));
    }
    if protocol.is_http2() {
        cluster.typed_extension_protocol_options = http2_options();
    }
    cluster
}

/// The one endpoint a `LOGICAL_DNS` cluster may have: the first passing instance's (else the
/// first's). Instances at other hosts are left out, and the proxy's status says so.
fn logical_dns_endpoint(
    service: &str,
    endpoints: &[structs::CheckServiceNode],
    out: &mut Resources,
) -> Vec<structs::CheckServiceNode> {
    let Some(chosen) = endpoints
        .iter()
        .find(|n| n.aggregate_status() == structs::HealthStatus::Passing)
        .or_else(|| endpoints.first())
    else {
        return Vec::new();
    };
    let others: std::collections::BTreeSet<(&str, u16)> = endpoints
        .iter()
        .map(|n| (n.address(), n.service.port))
        .filter(|a| *a != (chosen.address(), chosen.service.port))
        .collect();
    if !others.is_empty() {
        out.problems.insert(
            format!("linked-service:{service}:dns"),
            format!(
                "service {service:?} has instances at {} addresses; with LOGICAL_DNS only {}:{} is used (set envoy_dns_discovery_type = STRICT_DNS to use all)",
                others.len() + 1,
                chosen.address(),
                chosen.service.port
            ),
        );
    }
    vec![chosen.clone()]
}

/// Shows in the gateway's status that intentions to `service` requiring JWTs refuse their
/// sources: tokens are checked by sidecars only, and the RBAC fails closed on them.
fn jwt_not_checked(service: &str, intentions: &[structs::Intention], out: &mut Resources) {
    if !super::jwt::required(intentions).is_empty() {
        out.problems.insert(
            format!("linked-service:{service}:jwt"),
            format!(
                "intentions to {service:?} require JWTs, which a terminating gateway does not check: the sources they name are refused"
            ),
        );
    }
}

/// The filters of a terminating gateway's chain for `service`: the intentions to it (per
/// request for HTTP protocols, after the request is normalized as `inbound` says),
/// then the proxy to its cluster `sni`.
fn linked_filters(
    service: &str,
    sni: &str,
    protocol: Protocol,
    intentions: &[structs::Intention],
    default_allow: bool,
    inbound: Inbound<'_>,
) -> Vec<envoy_types::pb::envoy::config::listener::v3::Filter> {
    if protocol.is_http() {
        let mut http_filters = Vec::new();
        if let Some(rules) = rbac::rules_http(intentions, default_allow) {
            http_filters.push(http_filter("envoy.filters.http.rbac", rbac::http_filter_config(rules)));
        }
        // The route names the cluster sent beside this listener: Envoy must not refuse the
        // listener when it gets there before the cluster does (a service linked, or a subset
        // added, at the same time); until then requests get a 503.
        let mut route = route_to(sni, sni);
        route.validate_clusters = Some(envoy_types::pb::google::protobuf::BoolValue { value: false });
        vec![hcm(
            &format!("terminating_gateway.{service}"),
            http_connection_manager::RouteSpecifier::RouteConfig(route),
            http_filters,
            Some(inbound),
        )]
    } else {
        let mut filters = Vec::new();
        if let Some(rules) = rbac::rules_l4(intentions, default_allow) {
            filters.push(network_filter(
                "envoy.filters.network.rbac",
                rbac::network_filter_config(rules, &format!("terminating_gateway.{service}")),
            ));
        }
        filters.push(tcp_proxy(&format!("terminating_gateway.{service}"), sni));
        filters
    }
}
