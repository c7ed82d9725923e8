//! Listeners (public and one per upstream) and route configurations.

use super::clusters::LOCAL_APP;
use super::core::{ads, millis, socket};
use super::{BuildError, LISTENER, ROUTE, Resources, escape_hatch, jwt, rate_limit, rbac, routes, tls};
use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter, listener};
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route, route_action, route_match,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager, http_filter,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use envoy_types::pb::google::protobuf::{Any, BoolValue};
use envoy_types::util::pack_any;
use proxycfg::ConfigSnapshot;
use structs::ConfigEntry;
use structs::config_entry::RequestNormalization;

pub(crate) fn network_filter(name: &str, config: Any) -> Filter {
    Filter {
        name: name.to_owned(),
        config_type: Some(filter::ConfigType::TypedConfig(config)),
    }
}

pub(crate) fn http_filter(name: &str, config: Any) -> HttpFilter {
    HttpFilter {
        name: name.to_owned(),
        config_type: Some(http_filter::ConfigType::TypedConfig(config)),
        ..Default::default()
    }
}

fn router() -> HttpFilter {
    http_filter("envoy.filters.http.router", pack_any(Router::default()))
}

pub(crate) fn tcp_proxy(stat_prefix: &str, cluster: &str) -> Filter {
    let cfg = TcpProxy {
        stat_prefix: stat_prefix.to_owned(),
        cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster(cluster.to_owned())),
        ..Default::default()
    };
    network_filter("envoy.filters.network.tcp_proxy", pack_any(cfg))
}

pub(crate) fn route_to(name: &str, cluster: &str) -> RouteConfiguration {
    RouteConfiguration {
        name: name.to_owned(),
        virtual_hosts: vec![VirtualHost {
            name: name.to_owned(),
            domains: vec!["*".into()],
            routes: vec![everything_to(cluster)],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// A route sending every request (path prefix `/`) to `cluster`.
pub(crate) fn everything_to(cluster: &str) -> Route {
    Route {
        r#match: Some(RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
            ..Default::default()
        }),
        action: Some(route::Action::Route(RouteAction {
            cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(cluster.to_owned())),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// Consul's normalization of inbound requests when the `mesh` entry sets none: the path
/// normalized, nothing else.
static DEFAULT_NORMALIZATION: RequestNormalization = RequestNormalization {
    insecure_disable_path_normalization: false,
    merge_slashes: false,
    path_with_escaped_slashes_action: String::new(),
    headers_with_underscores_action: String::new(),
};

/// How inbound HTTP requests are normalized: the `mesh` entry's
/// `HTTP.Incoming.RequestNormalization`, else Consul's defaults.
pub(crate) fn inbound_http(mesh: Option<&ConfigEntry>) -> Inbound<'_> {
    match mesh {
        Some(ConfigEntry::Mesh(m)) => Inbound {
            normalization: m.request_normalization().unwrap_or(&DEFAULT_NORMALIZATION),
            sanitize_xfcc: m.http.as_ref().is_some_and(|h| h.sanitize_x_forwarded_client_cert),
        },
        _ => Inbound {
            normalization: &DEFAULT_NORMALIZATION,
            sanitize_xfcc: false,
        },
    }
}

/// What the `mesh` entry says about requests coming into the mesh's HTTP listeners.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Inbound<'a> {
    /// How requests are normalized.
    pub(crate) normalization: &'a RequestNormalization,
    /// `HTTP.SanitizeXForwardedClientCert`: drop the caller's `x-forwarded-client-cert`
    /// instead of passing on the calling proxy's certificate details in it (Consul's
    /// default).
    pub(crate) sanitize_xfcc: bool,
}

/// An HTTP connection manager. With `inbound` (a public listener, a terminating gateway's
/// chain) the caller's certificate is forwarded to the application (see
/// [`forward_client_cert`]) and the request is normalized as it says before any HTTP filter
/// sees it, so the intentions' RBAC and the application judge the same path and headers: by
/// default the path per RFC 3986 (`%61` is `a`, `/./` and `/../` resolved, `\` is `/`);
/// merging slashes, unescaping `%2F` and `%5C`, and dropping or refusing headers with
/// underscores only when the entry asks. Outbound, requests are passed on as they are.
pub(crate) fn hcm(
    stat_prefix: &str,
    route: http_connection_manager::RouteSpecifier,
    mut filters: Vec<HttpFilter>,
    inbound: Option<Inbound<'_>>,
) -> Filter {
    filters.push(router());
    let mut cfg = HttpConnectionManager {
        stat_prefix: stat_prefix.to_owned(),
        route_specifier: Some(route),
        http_filters: filters,
        tracing: Some(trace_when_asked()),
        ..Default::default()
    };
    if let Some(inbound) = inbound {
        normalize(&mut cfg, inbound.normalization);
        forward_client_cert(&mut cfg, inbound.sanitize_xfcc);
    }
    network_filter("envoy.filters.network.http_connection_manager", pack_any(cfg))
}

/// Tracing as Consul sets it on every HTTP connection manager: no request is sampled at
/// random, so spans are made only for requests whose caller asks (`x-client-trace-id`,
/// `x-envoy-force-trace`, a propagated sampling decision) and only when the bootstrap names
/// a tracer (`envoy_tracing_json`); without one this costs nothing.
fn trace_when_asked() -> http_connection_manager::Tracing {
    http_connection_manager::Tracing {
        random_sampling: Some(envoy_types::pb::envoy::r#type::v3::Percent { value: 0.0 }),
        ..Default::default()
    }
}

/// Consul's `x-forwarded-client-cert` handling on inbound listeners: the application learns
/// who called (the calling proxy's certificate subject, URI, DNS names, certificate and
/// chain, appended to what the caller sent), unless the mesh sanitizes the header.
fn forward_client_cert(cfg: &mut HttpConnectionManager, sanitize: bool) {
    use http_connection_manager::{ForwardClientCertDetails, SetCurrentClientCertDetails};
    if sanitize {
        cfg.forward_client_cert_details = ForwardClientCertDetails::Sanitize as i32;
        return;
    }
    cfg.forward_client_cert_details = ForwardClientCertDetails::AppendForward as i32;
    cfg.set_current_client_cert_details = Some(SetCurrentClientCertDetails {
        subject: Some(BoolValue { value: true }),
        cert: true,
        chain: true,
        dns: true,
        uri: true,
        ..Default::default()
    });
}

/// Sets an HTTP connection manager's normalization options (values validated at write time;
/// an unknown one would be Envoy's default).
fn normalize(cfg: &mut HttpConnectionManager, rn: &RequestNormalization) {
    use envoy_types::pb::envoy::config::core::v3::{HttpProtocolOptions, http_protocol_options};
    use http_connection_manager::PathWithEscapedSlashesAction;
    cfg.normalize_path = Some(BoolValue {
        value: !rn.insecure_disable_path_normalization,
    });
    cfg.merge_slashes = rn.merge_slashes;
    cfg.path_with_escaped_slashes_action =
        PathWithEscapedSlashesAction::from_str_name(&rn.path_with_escaped_slashes_action).unwrap_or_default() as i32;
    let underscores =
        http_protocol_options::HeadersWithUnderscoresAction::from_str_name(&rn.headers_with_underscores_action)
            .unwrap_or_default();
    if underscores != http_protocol_options::HeadersWithUnderscoresAction::Allow {
        cfg.common_http_protocol_options = Some(HttpProtocolOptions {
            headers_with_underscores_action: underscores as i32,
            ..Default::default()
        });
    }
}

pub(crate) fn build(snap: &ConfigSnapshot, out: &mut Resources, scope: &super::Scope<'_>) -> Result<(), BuildError> {
    let cp = snap
        .connect_proxy()
        .ok_or(BuildError::Incomplete("not a connect-proxy"))?;
    let intentions = cp.intentions.as_deref().ok_or(BuildError::Incomplete("intentions"))?;
    let resolved = cp
        .resolved_config
        .as_deref()
        .ok_or(BuildError::Incomplete("resolved service config"))?;
    if scope.common() {
        let mesh = cp.mesh_config.as_ref().and_then(|m| m.as_deref());
        public_listener(
            snap,
            intentions,
            resolved,
            tls::mesh_params(snap, mesh, tls::Direction::Incoming),
            inbound_http(mesh),
            out,
        );
    }
    // Outbound, one listener per upstream.
    for (id, upstream) in cp.upstreams.iter() {
        if !scope.upstream(id) {
            continue;
        }
        let Some(config) = snap.upstream_config(upstream) else {
            continue;
        };
        if !config.destination_peer.is_empty() {
            peered_problems(id, config, upstream.chain.is_none(), out);
        }
        let Some(chain) = &upstream.chain else { continue };
        if config.local_bind_port == 0 {
            continue;
        }
        let (listener_name, route_name) = upstream_names(id, config);
        if let Err(e) = upstream_listener(id, config, chain, out) {
            // The upstream keeps what it had (the caller copies its last good listener and
            // route); the problem is counted, logged once and shown in the proxy's status.
            out.fail(
                id.to_string(),
                format!("upstream {id}: {}", e.0),
                [(LISTENER, listener_name.clone()), (ROUTE, route_name)],
            );
        }
        upstream_escape_hatch(id, config, &listener_name, out);
    }
    Ok(())
}

/// What the proxy's status says of an upstream a peer exports: that it has no listener while
/// the peer does not export it (or the peering is not active).
fn peered_problems(id: &structs::UpstreamId, config: &structs::Upstream, missing: bool, out: &mut Resources) {
    if missing {
        out.problems.insert(
            id.to_string(),
            format!(
                "upstream {id}: the peer {:?} does not export {:?} to this cluster, or the peering is not active: it has no listener",
                config.destination_peer, config.destination_name
            ),
        );
    }
}

/// The upstream's own listener (`envoy_listener_json`) in place of meshd's (`listener_name`);
/// its routes (for an RDS of the user's) are still meshd's.
fn upstream_escape_hatch(
    id: &structs::UpstreamId,
    config: &structs::Upstream,
    listener_name: &str,
    out: &mut Resources,
) {
    let key = structs::bootstrap::UPSTREAM_LISTENER_KEY;
    let Some(json) = config
        .config
        .get(key)
        .and_then(|v| v.as_str())
        .filter(|s| !s.trim().is_empty())
    else {
        return;
    };
    match escape_hatch::decode::<Listener>(key, envoy_json::LISTENER, json) {
        Ok(mut user) => {
            if let Some(listeners) = out.by_type.get_mut(LISTENER) {
                listeners.remove(listener_name);
            }
            if user.name.is_empty() {
                user.name = listener_name.to_owned();
            }
            out.insert(LISTENER, user.name.clone(), pack_any(user));
        }
        Err(e) => {
            out.problems
                .insert(format!("{id}:{key}"), format!("upstream {id}: {e}"));
        }
    }
}

/// The address the public listener (and a gateway's listeners) bind: the proxy's
/// `bind_address`, else its registered address, else every address.
pub(crate) fn public_bind(snap: &ConfigSnapshot) -> String {
    let svc = &snap.service;
    svc.proxy.options().bind_address.unwrap_or_else(|| {
        if svc.address.is_empty() {
            "0.0.0.0".to_owned()
        } else {
            svc.address.clone()
        }
    })
}

/// The name of the public listener.
pub(crate) fn public_listener_name(snap: &ConfigSnapshot) -> String {
    format!("public_listener:{}:{}", public_bind(snap), snap.service.port)
}

/// The names of an upstream's listener and route configuration.
pub(crate) fn upstream_names(id: &structs::UpstreamId, config: &structs::Upstream) -> (String, String) {
    let addr = if config.local_bind_address.is_empty() {
        "127.0.0.1"
    } else {
        &config.local_bind_address
    };
    // The route configuration is named after the service; an upstream of the same name in
    // another datacenter or peer has its own (`api?peer=cluster-a`).
    let route = if id.datacenter.is_empty() && id.peer.is_empty() {
        id.name.clone()
    } else {
        id.to_string()
    };
    (format!("{id}:{addr}:{}", config.local_bind_port), route)
}

/// The inbound listener: mTLS from the mesh, intentions enforced (RBAC), then the local app.
fn public_listener(
    snap: &ConfigSnapshot,
    intentions: &[structs::Intention],
    resolved: &structs::ResolvedServiceConfig,
    tls_params: Option<envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::TlsParameters>,
    inbound: Inbound<'_>,
    out: &mut Resources,
) {
    let svc = &snap.service;
    let options = svc.proxy.options();
    let protocol = options.protocol.unwrap_or(resolved.protocol());
    let settings = structs::InboundOptions::parse(&svc.proxy.config, &resolved.proxy_config);
    let name = public_listener_name(snap);
    // The user's listener, else (with the problem in the proxy's status) meshd's own.
    let user = escape_hatch::public_listener(snap)
        .map(|l| l.and_then(|l| user_public_listener(snap, l, intentions, tls_params.clone(), &name)));
    match user {
        Some(Ok(listener)) => {
            jwt_not_checked(intentions, "its public listener is envoy_public_listener_json's", out);
            out.insert(LISTENER, listener.name.clone(), pack_any(listener));
            return;
        }
        Some(Err(e)) => {
            out.problems.insert("envoy_public_listener_json".into(), e);
        }
        None => {}
    }
    let bind = public_bind(snap);
    let rate_limits = resolved
        .rate_limits
        .as_ref()
        .map(|r| &r.instance_level)
        .filter(|r| r.is_set());
    if rate_limits.is_some() && !protocol.is_http() {
        out.problems.insert(
            "rate-limits".into(),
            format!(
                "service-defaults RateLimits of {:?} are not enforced: its protocol is {}, and rate limits apply to HTTP protocols only",
                svc.proxy.destination_service_name,
                protocol.as_str()
            ),
        );
    }
    let jwt = if protocol.is_http() {
        snap.connect_proxy().and_then(|cp| jwt::build(cp, intentions, out))
    } else {
        jwt_not_checked(intentions, &format!("its protocol is {}", protocol.as_str()), out);
        None
    };
    // The peers this service is exported to: their callers are accepted, each verified
    // with its own roots and matched by intentions naming that peer.
    let peers = snap
        .connect_proxy()
        .and_then(|cp| cp.peer_bundles.as_deref())
        .filter(|p| !p.is_empty());
    let local_domain = snap.roots.as_deref().map_or("", |r| r.trust_domain.as_str());
    let peer_domains: std::collections::BTreeMap<String, String> = peers
        .into_iter()
        .flatten()
        .filter(|b| b.trust_domain != local_domain)
        .map(|b| (b.peer.clone(), b.trust_domain.clone()))
        .collect();
    let trust = rbac::Trust {
        local: snap.roots.as_deref().map_or("", |r| r.trust_domain.as_str()),
        peers: Some(&peer_domains),
    };
    let to_app = Public {
        protocol,
        intentions,
        trust,
        default_allow: snap.intention_default_allow,
        inbound,
        settings,
        rate_limits,
        jwt,
    };
    let public = Listener {
        name: name.clone(),
        address: socket(&bind, u32::from(svc.port)),
        filter_chains: vec![FilterChain {
            filters: public_filters(&to_app),
            transport_socket: Some(match (peers, snap.roots.as_deref()) {
                (Some(peers), Some(roots)) if !peers.is_empty() => tls::downstream_trusting(tls_params, roots, peers),
                _ => tls::downstream(tls_params),
            }),
            ..Default::default()
        }],
        traffic_direction: TrafficDirection::Inbound as i32,
        connection_balance_config: settings.exact_balance.then_some(listener::ConnectionBalanceConfig {
            balance_type: Some(listener::connection_balance_config::BalanceType::ExactBalance(
                listener::connection_balance_config::ExactBalance {},
            )),
        }),
        ..Default::default()
    };
    out.insert(LISTENER, name, pack_any(public));
}

/// Shows in the proxy's status that intentions requiring tokens refuse their sources
/// outright, because this listener cannot check tokens (`why`).
fn jwt_not_checked(intentions: &[structs::Intention], why: &str, out: &mut Resources) {
    if !jwt::required(intentions).is_empty() {
        out.problems.insert(
            "jwt".into(),
            format!(
                "intentions require JWTs, which only HTTP listeners check, and {why}: the sources they name are refused"
            ),
        );
    }
}

/// The user's public listener (`envoy_public_listener_json`) with the mesh put back in:
/// each filter chain terminates the mesh's mTLS (replacing any transport socket it sets) and
/// starts with the intentions' L4 RBAC, as Consul does. A listener without filter
/// chains is refused (there would be nothing to put them on).
fn user_public_listener(
    snap: &ConfigSnapshot,
    mut user: Listener,
    intentions: &[structs::Intention],
    tls_params: Option<envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::TlsParameters>,
    name: &str,
) -> Result<Listener, String> {
    if user.filter_chains.is_empty() {
        return Err(
            "Config.envoy_public_listener_json has no filter chains to put the mesh's TLS and intentions on: meshd's own public listener is served instead".into(),
        );
    }
    if user.name.is_empty() {
        user.name = name.to_owned();
    }
    let rbac = rbac::rules_l4(intentions, snap.intention_default_allow).map(|rules| {
        network_filter(
            "envoy.filters.network.rbac",
            rbac::network_filter_config(rules, "connect_authz"),
        )
    });
    for chain in &mut user.filter_chains {
        // Always the mesh's: a transport socket of the user's could drop the client
        // certificate the intentions judge by.
        chain.transport_socket = Some(tls::downstream(tls_params.clone()));
        if let Some(f) = &rbac {
            chain.filters.insert(0, f.clone());
        }
    }
    Ok(user)
}

/// What the public listener's filters are made of.
struct Public<'a> {
    protocol: structs::Protocol,
    intentions: &'a [structs::Intention],
    /// Whose callers the listener accepts (this cluster's, and peers').
    trust: rbac::Trust<'a>,
    default_allow: bool,
    inbound: Inbound<'a>,
    /// `local_request_timeout_ms`, `local_idle_timeout_ms` and the rest.
    settings: structs::InboundOptions,
    /// Service-defaults' `RateLimits.InstanceLevel`, when it sets a limit.
    rate_limits: Option<&'a structs::rate_limits::InstanceLevelRateLimits>,
    /// The `jwt_authn` filter's configuration, when intentions require tokens.
    jwt: Option<envoy_types::pb::google::protobuf::Any>,
}

/// The public listener's filters: the JWT check of the tokens intentions require (HTTP), the
/// intentions' RBAC (per request for HTTP protocols, per
/// connection otherwise) then the service's rate limits (so a caller the intentions refuse
/// spends none of the others' budget) in front of the route or TCP proxy to the local app,
/// with the proxy's request and idle timeouts to it.
fn public_filters(p: &Public<'_>) -> Vec<Filter> {
    let idle = p.settings.local_idle_timeout_ms.and_then(millis);
    if p.protocol.is_http() {
        let mut http_filters = Vec::new();
        if let Some(config) = &p.jwt {
            http_filters.push(http_filter(jwt::FILTER, config.clone()));
        }
        if let Some(rules) = rbac::rules_http_trusting(p.intentions, p.default_allow, p.trust) {
            http_filters.push(http_filter("envoy.filters.http.rbac", rbac::http_filter_config(rules)));
        }
        let mut route = route_to(LOCAL_APP, LOCAL_APP);
        if let Some(limits) = p.rate_limits {
            http_filters.push(http_filter(rate_limit::FILTER, rate_limit::filter_config(limits)));
            rate_limit::add_routes(&mut route, limits);
        }
        for vhost in &mut route.virtual_hosts {
            for r in &mut vhost.routes {
                if let Some(route::Action::Route(action)) = &mut r.action {
                    action.timeout = p.settings.local_request_timeout_ms.and_then(millis);
                    action.idle_timeout = idle;
                }
            }
        }
        vec![hcm(
            "public_listener",
            http_connection_manager::RouteSpecifier::RouteConfig(route),
            http_filters,
            Some(p.inbound),
        )]
    } else {
        let mut filters = Vec::new();
        if let Some(rules) = rbac::rules_l4_trusting(p.intentions, p.default_allow, p.trust) {
            filters.push(network_filter(
                "envoy.filters.network.rbac",
                rbac::network_filter_config(rules, "connect_authz"),
            ));
        }
        let mut to_app = TcpProxy {
            stat_prefix: "public_listener".to_owned(),
            cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster(LOCAL_APP.to_owned())),
            ..Default::default()
        };
        to_app.idle_timeout = idle;
        filters.push(network_filter("envoy.filters.network.tcp_proxy", pack_any(to_app)));
        filters
    }
}

/// The outbound listener of one upstream (and its route configuration, for HTTP protocols)
/// following its compiled chain.
/// The filter that carries a connection of upstream `id` into `chain`: tcp_proxy to its
/// cluster, or (an HTTP chain) a connection manager with its routes, added to `out` as
/// `route_name` and fetched over RDS. An upstream's own listener and a transparent proxy's
/// outbound listener both use it.
pub(crate) fn chain_filter(
    id: &structs::UpstreamId,
    route_name: String,
    chain: &structs::CompiledDiscoveryChain,
    out: &mut Resources,
) -> Result<Filter, routes::RouteError> {
    let stat_prefix = format!("upstream.{id}");
    if chain.protocol.is_http() {
        let route = routes::route_config(&route_name, chain)?;
        out.insert(ROUTE, route_name.clone(), pack_any(route));
        Ok(hcm(
            &stat_prefix,
            http_connection_manager::RouteSpecifier::Rds(Rds {
                config_source: ads(),
                route_config_name: route_name,
            }),
            Vec::new(),
            None,
        ))
    } else {
        Ok(tcp_proxy(&stat_prefix, &routes::tcp_cluster(chain)?))
    }
}

fn upstream_listener(
    id: &structs::UpstreamId,
    config: &structs::Upstream,
    chain: &structs::CompiledDiscoveryChain,
    out: &mut Resources,
) -> Result<(), routes::RouteError> {
    let (name, route_name) = upstream_names(id, config);
    let addr = if config.local_bind_address.is_empty() {
        "127.0.0.1"
    } else {
        &config.local_bind_address
    };
    let filter = chain_filter(id, route_name, chain, out)?;
    let listener = Listener {
        name: name.clone(),
        address: socket(addr, u32::from(config.local_bind_port)),
        filter_chains: vec![FilterChain {
            filters: vec![filter],
            ..Default::default()
        }],
        traffic_direction: TrafficDirection::Outbound as i32,
        ..Default::default()
    };
    out.insert(LISTENER, name, pack_any(listener));
    Ok(())
}
