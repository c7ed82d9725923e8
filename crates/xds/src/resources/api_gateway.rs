//! Resources of an API gateway (traffic from outside the mesh in, routed by http-routes and
//! tcp-routes bound to the gateway's listeners):
//! - secrets `default` (the gateway's leaf: its identity to the services it sends to) and
//!   `ROOTCA`, and per certificate a served listener names, `<kind>/<name>`: an
//!   inline-certificate's PEM, or a file-system-certificate's paths (Envoy reads the files
//!   and watches their directories, so a rotated certificate is served without a restart);
//! - per service a bound route sends to, the clusters and load assignments of its discovery
//!   chain, with mTLS to each target;
//! - per gateway listener with a route bound, listener `<name>:<address>:<port>`: for http,
//!   a connection manager with route configuration `<name>` holding one virtual host per
//!   host name the bound routes answer (their rules' matches in precedence order, each to
//!   its services' clusters by weight, a service's own splitter legs multiplied in); for
//!   tcp, a TCP proxy to its route's service; with certificates, TLS presenting the one the
//!   client's SNI selects.
//!
//! Which route is bound where comes from the same function that derives the entries' status
//! (`structs::config_entry::api_gateway_binding`). A listener nothing is bound to is not
//! served and says so in the proxy's problems (and in the gateway's status).

use super::clusters::{chain_clusters, resolver_cluster};
use super::core::{ads, socket};
use super::listeners::{hcm, public_bind, tcp_proxy};
use super::routes::{self, finish_route};
use super::{BuildError, LISTENER, ROUTE, Resources, SECRET, tls};
use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use envoy_types::pb::envoy::config::core::v3::{DataSource, TransportSocket, data_source};
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, Listener};
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, VirtualHost, WeightedCluster, route_action, weighted_cluster,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{Rds, http_connection_manager};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{Secret, TlsCertificate, secret};
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::util::pack_any;
use proxycfg::handler::api_gateway_backend_id;
use proxycfg::{ApiGatewaySnapshot, ConfigSnapshot};
use std::collections::BTreeMap;
use structs::CompiledDiscoveryChain;
use structs::config_entry::api_gateway_binding::BoundListener;
use structs::config_entry::{
    ApiGatewayListener, HttpFilters, HttpHeaderModifiers, HttpMatch, HttpResponseFilters, HttpRouteRule, HttpService,
    ServiceRoute, ServiceRouteDestination, ServiceRouteHttpMatch, ServiceRouteHttpMatchHeader,
    ServiceRouteHttpMatchQueryParam, ServiceRouteMatch,
};
use structs::discovery_chain::NodeType;
use structs::{ConfigEntry, ConfigEntryKind};

/// Builds an API gateway's clusters, listeners and routes (secrets and load assignments are
/// built by the common steps).
pub(crate) fn build(snap: &ConfigSnapshot, g: &ApiGatewaySnapshot, out: &mut Resources) -> Result<(), BuildError> {
    let roots = snap.roots.as_deref().ok_or(BuildError::Incomplete("CA roots"))?;
    let (Some(entry), Some(binding)) = (g.config(), g.binding()) else {
        out.problems.insert(
            "api-gateway".into(),
            format!(
                "no api-gateway config entry named {:?}: the gateway has no listeners",
                snap.service.service
            ),
        );
        return Ok(());
    };
    let mesh = g.mesh_config.as_ref().and_then(|m| m.as_deref());
    let outgoing = tls::mesh_params(snap, mesh, tls::Direction::Outgoing);
    for upstream in g.upstreams.values() {
        if let Some(chain) = &upstream.chain {
            chain_clusters(roots, chain, None, None, outgoing.as_ref(), out);
        }
    }
    let bind = public_bind(snap);
    for bound in &binding.listeners {
        let listener = &entry.listeners[bound.index];
        let name = format!("{}:{bind}:{}", listener.name, listener.port);
        let key = format!("listener:{}", listener.name);
        if bound.routes.is_empty() {
            out.problems.insert(
                key,
                format!(
                    "listener {name}: no route is bound to it, so it is not served (the gateway's and routes' status say why)"
                ),
            );
            continue;
        }
        let tls = match listener_tls(g, listener, bound, &name, out) {
            Ok(tls) => tls,
            Err(problem) => {
                out.fail(key, problem, [(LISTENER, name)]);
                continue;
            }
        };
        let result = if listener.is_http() {
            http_listener(g, listener, bound, &name, &bind, tls, out)
        } else {
            tcp_listener(g, listener, bound, &name, &bind, tls, out)
        };
        if let Err(problem) = result {
            out.fail(key, problem, [(LISTENER, name)]);
        }
    }
    Ok(())
}

/// The name of the secret holding certificate `kind`/`name`.
pub(crate) fn certificate_secret(kind: ConfigEntryKind, name: &str) -> String {
    format!("{kind}/{name}")
}

/// The listener's TLS server, if it names certificates: each existing one as a secret
/// (inline PEM, or the files Envoy reads and watches), chosen by SNI. `Err` when it names
/// certificates and none can be served: the listener is then not served in clear.
fn listener_tls(
    g: &ApiGatewaySnapshot,
    listener: &ApiGatewayListener,
    bound: &BoundListener,
    name: &str,
    out: &mut Resources,
) -> Result<Option<TransportSocket>, String> {
    if listener.tls.certificates.is_empty() {
        return Ok(None);
    }
    let mut configs = Vec::new();
    for cert in &bound.certificates {
        let Some(kind) = cert.kind_or(ConfigEntryKind::InlineCertificate) else {
            continue;
        };
        let Some(entry) = g.certificate(kind, &cert.name) else {
            continue;
        };
        let secret_name = certificate_secret(kind, &cert.name);
        let certificate = match &**entry {
            ConfigEntry::InlineCertificate(c) if c.private_key.is_empty() => {
                out.problems.insert(
                    format!("certificate:{secret_name}"),
                    format!(
                        "listener {name}: the private key of inline-certificate {:?} is not readable with this proxy's token, so it is not served",
                        c.name
                    ),
                );
                continue;
            }
            ConfigEntry::InlineCertificate(c) => TlsCertificate {
                certificate_chain: tls::inline(&c.certificate),
                private_key: tls::inline(&c.private_key),
                ..Default::default()
            },
            // Envoy reads the files and, the secret coming over SDS, watches their
            // directories: a rotated certificate is served without a restart.
            ConfigEntry::FileSystemCertificate(c) => TlsCertificate {
                certificate_chain: Some(file(&c.certificate)),
                private_key: Some(file(&c.private_key)),
                ..Default::default()
            },
            _ => continue,
        };
        out.insert(
            SECRET,
            secret_name.clone(),
            pack_any(Secret {
                name: secret_name.clone(),
                r#type: Some(secret::Type::TlsCertificate(certificate)),
            }),
        );
        configs.push(tls::sds(&secret_name));
    }
    if configs.is_empty() {
        return Err(format!(
            "listener {name}: none of the certificates it names can be served (the gateway's status says why)"
        ));
    }
    let t = &listener.tls;
    let params = tls::params(&t.min_version, &t.max_version, &t.cipher_suites);
    let alpn: &[&str] = if listener.is_http() { &["http/1.1"] } else { &[] };
    Ok(Some(tls::downstream_server_of(configs, params, alpn)))
}

fn file(path: &str) -> DataSource {
    DataSource {
        specifier: Some(data_source::Specifier::Filename(path.to_owned())),
        ..Default::default()
    }
}

fn chain_of<'g>(g: &'g ApiGatewaySnapshot, service: &str) -> Result<&'g CompiledDiscoveryChain, String> {
    g.upstreams
        .get(&api_gateway_backend_id(service))
        .and_then(|u| u.chain.as_ref())
        .map(|c| &**c)
        .ok_or_else(|| format!("the discovery chain of {service:?} is not known yet"))
}

fn tcp_listener(
    g: &ApiGatewaySnapshot,
    listener: &ApiGatewayListener,
    bound: &BoundListener,
    name: &str,
    bind: &str,
    tls: Option<TransportSocket>,
    out: &mut Resources,
) -> Result<(), String> {
    let Some(route) = bound.routes.first().and_then(|r| r.tcp()) else {
        return Err(format!("listener {name}: its bound route is not a tcp-route"));
    };
    let Some(service) = route.services.first() else {
        return Err(format!("listener {name}: tcp-route {:?} names no service", route.name));
    };
    let chain = chain_of(g, &service.name).map_err(|e| format!("listener {name}: {e}"))?;
    let cluster = routes::tcp_cluster(chain).map_err(|e| format!("listener {name}: {}", e.0))?;
    let l = Listener {
        name: name.to_owned(),
        address: socket(bind, u32::from(listener.port)),
        filter_chains: vec![FilterChain {
            filters: vec![tcp_proxy(
                &format!("api_gateway_{}_{}", listener.name, route.name),
                &cluster,
            )],
            transport_socket: tls,
            ..Default::default()
        }],
        traffic_direction: TrafficDirection::Outbound as i32,
        ..Default::default()
    };
    out.insert(LISTENER, name.to_owned(), pack_any(l));
    Ok(())
}

/// A route's rank among a virtual host's routes, as the Gateway API orders matches: exact
/// paths, then longer prefixes, then regular expressions; then a method, more headers and
/// more query conditions first. Ties keep the routes' order (by route name, then rule).
fn precedence(
    m: &HttpMatch,
) -> (
    u8,
    std::cmp::Reverse<usize>,
    bool,
    std::cmp::Reverse<usize>,
    std::cmp::Reverse<usize>,
) {
    let (class, len) = match m.path.match_.to_ascii_lowercase().as_str() {
        "exact" => (0, m.path.value.len()),
        "regex" => (2, 0),
        _ => (1, m.path.value.len().max(1)),
    };
    (
        class,
        std::cmp::Reverse(len),
        m.method.is_empty(),
        std::cmp::Reverse(m.headers.len()),
        std::cmp::Reverse(m.query.len()),
    )
}

/// The virtual hosts of an http listener: one per host name its routes answer, holding
/// those routes' rules in precedence order. A rule that cannot be built yet is left out
/// (and reported); the others are served.
fn virtual_hosts(
    g: &ApiGatewaySnapshot,
    listener: &ApiGatewayListener,
    bound: &BoundListener,
    name: &str,
    out: &mut Resources,
) -> Vec<VirtualHost> {
    type Ranked = (
        (
            u8,
            std::cmp::Reverse<usize>,
            bool,
            std::cmp::Reverse<usize>,
            std::cmp::Reverse<usize>,
        ),
        usize,
        Route,
    );
    let mut hosts: BTreeMap<String, Vec<Ranked>> = BTreeMap::new();
    let mut order = 0usize;
    for (route, route_hosts) in bound.routes.iter().filter_map(|r| r.http()) {
        for (i, rule) in route.rules.iter().enumerate() {
            let action = match rule_action(g, rule) {
                Ok(a) => a,
                Err(problem) => {
                    // The route's other rules, and every other route, are still served.
                    out.problems.insert(
                        format!("route:{}:{}:{i}", listener.name, route.name),
                        format!("listener {name}, http-route {:?} rule {i}: {problem}", route.name),
                    );
                    continue;
                }
            };
            let matches = if rule.matches.is_empty() {
                vec![HttpMatch::default()]
            } else {
                rule.matches.clone()
            };
            for m in &matches {
                let envoy_route = finish_route(&definition(m, rule), action.clone(), None);
                for host in route_hosts {
                    hosts
                        .entry(host.clone())
                        .or_default()
                        .push((precedence(m), order, envoy_route.clone()));
                }
                order += 1;
            }
        }
    }
    // Envoy picks one virtual host per request, the most specific: a host's own routes
    // come first, then those of the wildcard hosts covering it, longer wildcards first (as
    // the Gateway API ranks intersecting hostnames).
    let covers = |w: &str, host: &str| {
        w != host && (w == "*" || w.strip_prefix('*').is_some_and(|suffix| host.ends_with(suffix)))
    };
    let names: Vec<String> = hosts.keys().cloned().collect();
    names
        .iter()
        .map(|host| {
            let mut wider: Vec<&String> = names.iter().filter(|w| covers(w, host)).collect();
            wider.sort_by_key(|w| std::cmp::Reverse(w.len()));
            let mut ranked: Vec<(usize, Ranked)> = hosts[host].iter().map(|r| (0, r.clone())).collect();
            for (i, w) in wider.into_iter().enumerate() {
                ranked.extend(hosts[w].iter().map(|r| (i + 1, r.clone())));
            }
            ranked.sort_by_key(|(rank, r)| (*rank, r.0, r.1));
            let ranked: Vec<Ranked> = ranked.into_iter().map(|(_, r)| r).collect();
            let domains = if host == "*" {
                vec!["*".to_owned()]
            } else {
                structs::config_entry::host_domains(host, listener.port)
            };
            VirtualHost {
                name: format!("{}:{host}", listener.name),
                domains,
                routes: ranked.into_iter().map(|(_, _, r)| r).collect(),
                ..Default::default()
            }
        })
        .collect()
}

fn http_listener(
    g: &ApiGatewaySnapshot,
    listener: &ApiGatewayListener,
    bound: &BoundListener,
    name: &str,
    bind: &str,
    tls: Option<TransportSocket>,
    out: &mut Resources,
) -> Result<(), String> {
    let virtual_hosts = virtual_hosts(g, listener, bound, name, out);
    if virtual_hosts.is_empty() {
        return Err(format!("listener {name}: none of its routes can be served yet"));
    }
    let route_name = listener.name.clone();
    out.insert(
        ROUTE,
        route_name.clone(),
        pack_any(RouteConfiguration {
            name: route_name.clone(),
            virtual_hosts,
            validate_clusters: Some(envoy_types::pb::google::protobuf::BoolValue { value: false }),
            ..Default::default()
        }),
    );
    let filter = hcm(
        &format!("api_gateway_{}", listener.name),
        http_connection_manager::RouteSpecifier::Rds(Rds {
            config_source: ads(),
            route_config_name: route_name,
        }),
        Vec::new(),
        None,
    );
    let l = Listener {
        name: name.to_owned(),
        address: socket(bind, u32::from(listener.port)),
        filter_chains: vec![FilterChain {
            filters: vec![filter],
            transport_socket: tls,
            ..Default::default()
        }],
        traffic_direction: TrafficDirection::Outbound as i32,
        ..Default::default()
    };
    out.insert(LISTENER, name.to_owned(), pack_any(l));
    Ok(())
}

/// Every header change of `filters` as one set of modifiers.
fn merged_headers(filters: &[HttpHeaderModifiers]) -> Option<HttpHeaderModifiers> {
    let mut m = HttpHeaderModifiers::default();
    for f in filters {
        m.add.extend(f.add.clone());
        m.set.extend(f.set.clone());
        m.remove.extend(f.remove.iter().cloned());
    }
    (!m.is_empty()).then_some(m)
}

/// A rule's match and filters in the shape of a service-router route.
fn definition(m: &HttpMatch, rule: &HttpRouteRule) -> ServiceRoute {
    let mut http = ServiceRouteHttpMatch::default();
    match m.path.match_.to_ascii_lowercase().as_str() {
        "exact" => http.path_exact = m.path.value.clone(),
        "regex" => http.path_regex = m.path.value.clone(),
        _ => http.path_prefix = m.path.value.clone(),
    }
    http.header = m
        .headers
        .iter()
        .map(|h| {
            let mut out = ServiceRouteHttpMatchHeader {
                name: h.name.clone(),
                ..Default::default()
            };
            match h.match_.to_ascii_lowercase().as_str() {
                "prefix" => out.prefix = h.value.clone(),
                "suffix" => out.suffix = h.value.clone(),
                "regex" => out.regex = h.value.clone(),
                "present" => out.present = true,
                _ => out.exact = h.value.clone(),
            }
            out
        })
        .collect();
    http.query_param = m
        .query
        .iter()
        .map(|q| {
            let mut out = ServiceRouteHttpMatchQueryParam {
                name: q.name.clone(),
                ..Default::default()
            };
            match q.match_.to_ascii_lowercase().as_str() {
                "present" => out.present = true,
                "regex" => out.regex = q.value.clone(),
                _ => out.exact = q.value.clone(),
            }
            out
        })
        .collect();
    if !m.method.is_empty() {
        http.methods = vec![m.method.to_ascii_uppercase()];
    }
    let f: &HttpFilters = &rule.filters;
    let retry = f.retry_filter.clone().unwrap_or_default();
    let timeouts = f.timeout_filter.clone().unwrap_or_default();
    ServiceRoute {
        match_: Some(ServiceRouteMatch { http: Some(http) }),
        destination: Some(ServiceRouteDestination {
            prefix_rewrite: f.url_rewrite.as_ref().map(|r| r.path.clone()).unwrap_or_default(),
            request_timeout: timeouts.request_timeout,
            idle_timeout: timeouts.idle_timeout,
            num_retries: retry.num_retries,
            retry_on_connect_failure: retry.retry_on_connect_failure,
            retry_on_status_codes: retry.retry_on_status_codes,
            retry_on: retry.retry_on,
            request_headers: merged_headers(&f.headers),
            response_headers: merged_headers(&rule.response_filters.headers),
            ..Default::default()
        }),
    }
}

/// One weighted cluster of a rule.
struct Leg {
    cluster: String,
    weight: u64,
    request: Option<HttpHeaderModifiers>,
    response: Option<HttpHeaderModifiers>,
}

/// The legs of one service of a rule: its chain's resolver, or its splitter's legs with
/// their weights multiplied in (a router of the service is not followed: the rule is the
/// route; its catch-all destination is).
fn service_legs(g: &ApiGatewaySnapshot, svc: &HttpService, out: &mut Vec<Leg>) -> Result<(), String> {
    let chain = chain_of(g, &svc.name)?;
    let bad = |e: routes::RouteError| e.0;
    let mut node = routes::node(chain, &chain.start_node).map_err(bad)?;
    if node.node_type == NodeType::Router {
        let last = node
            .routes
            .last()
            .ok_or_else(|| format!("the router of {:?} has no routes", svc.name))?;
        node = routes::node(chain, &last.next_node).map_err(bad)?;
    }
    let own = |extra: Option<&HttpHeaderModifiers>, filters: &[HttpHeaderModifiers]| {
        let mut all: Vec<HttpHeaderModifiers> = filters.to_vec();
        all.extend(extra.cloned());
        merged_headers(&all)
    };
    let response_filters: &HttpResponseFilters = &svc.response_filters;
    match node.node_type {
        NodeType::Resolver => out.push(Leg {
            cluster: resolver_cluster(chain, node)
                .ok_or_else(|| format!("resolver {:?} names an unknown target", node.name))?,
            weight: u64::from(svc.weight()) * 10_000,
            request: own(None, &svc.filters.headers),
            response: own(None, &response_filters.headers),
        }),
        NodeType::Splitter => {
            for split in &node.splits {
                let leg = routes::node(chain, &split.next_node).map_err(bad)?;
                let cluster = resolver_cluster(chain, leg)
                    .ok_or_else(|| format!("split leg {:?} is not a resolver", split.next_node))?;
                let share = (f64::from(split.weight) * 100.0).round() as u64;
                if share == 0 {
                    continue;
                }
                out.push(Leg {
                    cluster,
                    weight: u64::from(svc.weight()) * share,
                    request: own(split.definition.request_headers.as_ref(), &svc.filters.headers),
                    response: own(split.definition.response_headers.as_ref(), &response_filters.headers),
                });
            }
        }
        NodeType::Router => return Err(format!("the router of {:?} leads to another router", svc.name)),
    }
    Ok(())
}

/// The action of a rule: its services' clusters, weighted.
fn rule_action(g: &ApiGatewaySnapshot, rule: &HttpRouteRule) -> Result<RouteAction, String> {
    let mut legs = Vec::new();
    for svc in &rule.services {
        service_legs(g, svc, &mut legs)?;
    }
    let specifier = match legs.as_slice() {
        [] => return Err("no service with weight".into()),
        [one] if one.request.is_none() && one.response.is_none() => {
            route_action::ClusterSpecifier::Cluster(one.cluster.clone())
        }
        _ => {
            // Envoy's weights are 32-bit: scaled down together when they would not fit.
            let total: u64 = legs.iter().map(|l| l.weight).sum();
            let scale = total.div_ceil(u64::from(u32::MAX)).max(1);
            let clusters = legs
                .into_iter()
                .map(|l| {
                    let (req_add, req_remove) = routes::header_changes(l.request.as_ref());
                    let (resp_add, resp_remove) = routes::header_changes(l.response.as_ref());
                    weighted_cluster::ClusterWeight {
                        name: l.cluster,
                        weight: Some(UInt32Value {
                            value: u32::try_from((l.weight / scale).max(1)).unwrap_or(u32::MAX),
                        }),
                        request_headers_to_add: req_add,
                        request_headers_to_remove: req_remove,
                        response_headers_to_add: resp_add,
                        response_headers_to_remove: resp_remove,
                        ..Default::default()
                    }
                })
                .collect();
            route_action::ClusterSpecifier::WeightedClusters(WeightedCluster {
                clusters,
                ..Default::default()
            })
        }
    };
    Ok(RouteAction {
        cluster_specifier: Some(specifier),
        ..Default::default()
    })
}
