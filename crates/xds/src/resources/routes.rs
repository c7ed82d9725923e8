//! Route configurations from compiled discovery chains: the router's routes (first match
//! wins, the chain's catch-all last), splitters as weighted clusters, resolvers as clusters
//! (their aggregate cluster when they fail over), with each route's rewrite, timeouts,
//! retries, header changes and the resolver's hash policies.

use super::clusters::resolver_cluster;
use super::core::millis;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption, header_value_option};
use envoy_types::pb::envoy::config::route::v3::{
    HeaderMatcher, QueryParameterMatcher, RetryPolicy, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
    WeightedCluster, header_matcher, query_parameter_matcher, route, route_action, route_match, weighted_cluster,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{RegexMatcher, StringMatcher, string_matcher};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use structs::config_entry::{HashPolicy, HttpHeaderModifiers, LoadBalancer, ServiceRoute, ServiceRouteHttpMatch};
use structs::discovery_chain::{ChainNode, NodeType};
use structs::{CompiledDiscoveryChain, GoDuration};

/// Why a chain's routes cannot be built (the compiler's output is checked at write time, so
/// this names a chain that is inconsistent, never a user's mistake).
#[derive(Debug)]
pub(crate) struct RouteError(pub(crate) String);

/// The route configuration `name` of an HTTP upstream's chain.
pub(crate) fn route_config(name: &str, chain: &CompiledDiscoveryChain) -> Result<RouteConfiguration, RouteError> {
    let start = node(chain, &chain.start_node)?;
    let routes = match start.node_type {
        NodeType::Router => start
            .routes
            .iter()
            .map(|r| route(chain, &r.definition, node(chain, &r.next_node)?))
            .collect::<Result<Vec<_>, _>>()?,
        NodeType::Splitter | NodeType::Resolver => vec![route(chain, &ServiceRoute::default(), start)?],
    };
    Ok(RouteConfiguration {
        name: name.to_owned(),
        virtual_hosts: vec![VirtualHost {
            name: name.to_owned(),
            domains: vec!["*".into()],
            routes,
            ..Default::default()
        }],
        ..Default::default()
    })
}

/// The cluster a TCP upstream sends to: its chain's start node must be a resolver.
pub(crate) fn tcp_cluster(chain: &CompiledDiscoveryChain) -> Result<String, RouteError> {
    let start = node(chain, &chain.start_node)?;
    if start.node_type != NodeType::Resolver {
        return Err(RouteError(format!(
            "the chain of {:?} starts with a {:?} node, which a tcp upstream cannot follow",
            chain.service_name, start.node_type
        )));
    }
    resolver_cluster(chain, start)
        .ok_or_else(|| RouteError(format!("resolver {:?} names an unknown target", start.name)))
}

pub(crate) fn node<'c>(chain: &'c CompiledDiscoveryChain, name: &str) -> Result<&'c ChainNode, RouteError> {
    chain
        .nodes
        .get(name)
        .ok_or_else(|| RouteError(format!("chain of {:?} has no node {name:?}", chain.service_name)))
}

fn duration(d: &GoDuration) -> Option<PbDuration> {
    (!d.is_zero()).then(|| PbDuration {
        seconds: i64::try_from(d.0.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.0.subsec_nanos()).unwrap_or(0),
    })
}

/// One Envoy route: `definition`'s match and destination settings, sending to `next`.
fn route(chain: &CompiledDiscoveryChain, definition: &ServiceRoute, next: &ChainNode) -> Result<Route, RouteError> {
    let mut action = RouteAction::default();
    let mut resolver_timeout = None;
    match next.node_type {
        NodeType::Resolver => {
            let cluster = resolver_cluster(chain, next)
                .ok_or_else(|| RouteError(format!("resolver {:?} names an unknown target", next.name)))?;
            action.cluster_specifier = Some(route_action::ClusterSpecifier::Cluster(cluster));
            resolver_timeout = next.resolver.as_ref().map(|r| r.request_timeout);
        }
        NodeType::Splitter => {
            let mut clusters = Vec::with_capacity(next.splits.len());
            for split in &next.splits {
                let leg = node(chain, &split.next_node)?;
                let name = resolver_cluster(chain, leg)
                    .ok_or_else(|| RouteError(format!("split leg {:?} is not a resolver", split.next_node)))?;
                let weight = (f64::from(split.weight) * 100.0).round() as u32;
                if weight == 0 {
                    continue;
                }
                let (req_add, req_remove) = header_changes(split.definition.request_headers.as_ref());
                let (resp_add, resp_remove) = header_changes(split.definition.response_headers.as_ref());
                clusters.push(weighted_cluster::ClusterWeight {
                    name,
                    weight: Some(UInt32Value { value: weight }),
                    request_headers_to_add: req_add,
                    request_headers_to_remove: req_remove,
                    response_headers_to_add: resp_add,
                    response_headers_to_remove: resp_remove,
                    ..Default::default()
                });
            }
            if clusters.is_empty() {
                return Err(RouteError(format!("splitter {:?} has no leg with weight", next.name)));
            }
            action.cluster_specifier = Some(route_action::ClusterSpecifier::WeightedClusters(WeightedCluster {
                clusters,
                ..Default::default()
            }));
        }
        NodeType::Router => {
            return Err(RouteError(format!("route leads to router {:?}", next.name)));
        }
    }
    if let Some(lb) = hashing_load_balancer(chain, next) {
        action.hash_policy = lb.hash_policies.iter().map(hash_policy).collect();
    }
    Ok(finish_route(definition, action, resolver_timeout))
}

/// One Envoy route: `definition`'s match and destination settings (rewrite, timeouts,
/// retries, header changes) around `action`, which already names its clusters; the
/// resolver's request timeout applies when the destination sets none.
pub(crate) fn finish_route(
    definition: &ServiceRoute,
    mut action: RouteAction,
    resolver_timeout: Option<GoDuration>,
) -> Route {
    let http = definition.match_.as_ref().and_then(|m| m.http.as_ref());
    let dest = definition.destination.clone().unwrap_or_default();
    if !dest.prefix_rewrite.is_empty() {
        action.prefix_rewrite = dest.prefix_rewrite.clone();
    }
    let timeout = if dest.request_timeout.is_zero() {
        resolver_timeout.unwrap_or_default()
    } else {
        dest.request_timeout
    };
    action.timeout = duration(&timeout);
    action.idle_timeout = duration(&dest.idle_timeout);
    action.retry_policy = retry_policy(&dest);
    let (req_add, req_remove) = header_changes(dest.request_headers.as_ref());
    let (resp_add, resp_remove) = header_changes(dest.response_headers.as_ref());
    Route {
        r#match: Some(route_match(http)),
        action: Some(route::Action::Route(action)),
        request_headers_to_add: req_add,
        request_headers_to_remove: req_remove,
        response_headers_to_add: resp_add,
        response_headers_to_remove: resp_remove,
        ..Default::default()
    }
}

/// The load balancer whose hash policies the route to `next` carries: a resolver's own; for
/// a splitter, its own if it has one, else the first hash-based (ring_hash, maglev) one of
/// its legs' resolvers, as Consul does — one route action cannot hash two ways, and without
/// hash policies a hashing cluster picks hosts at random.
fn hashing_load_balancer<'c>(chain: &'c CompiledDiscoveryChain, next: &'c ChainNode) -> Option<&'c LoadBalancer> {
    let hashing = |lb: &&LoadBalancer| matches!(lb.policy.as_str(), "ring_hash" | "maglev");
    if let Some(lb) = next.load_balancer.as_ref() {
        return Some(lb).filter(hashing);
    }
    if next.node_type != NodeType::Splitter {
        return None;
    }
    next.splits
        .iter()
        .filter_map(|s| chain.nodes.get(&s.next_node))
        .filter_map(|leg| leg.load_balancer.as_ref())
        .find(hashing)
}

fn string_match(pattern: string_matcher::MatchPattern) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(pattern),
        ..Default::default()
    }
}

fn regex(r: &str) -> string_matcher::MatchPattern {
    string_matcher::MatchPattern::SafeRegex(RegexMatcher {
        regex: r.to_owned(),
        ..Default::default()
    })
}

/// Envoy's matcher for one header match of a route: exact, prefix, suffix, regex or
/// presence.
fn header_match(h: &structs::config_entry::ServiceRouteHttpMatchHeader) -> HeaderMatcher {
    let specifier = if !h.exact.is_empty() {
        header_matcher::HeaderMatchSpecifier::StringMatch(string_match(string_matcher::MatchPattern::Exact(
            h.exact.clone(),
        )))
    } else if !h.prefix.is_empty() {
        header_matcher::HeaderMatchSpecifier::StringMatch(string_match(string_matcher::MatchPattern::Prefix(
            h.prefix.clone(),
        )))
    } else if !h.suffix.is_empty() {
        header_matcher::HeaderMatchSpecifier::StringMatch(string_match(string_matcher::MatchPattern::Suffix(
            h.suffix.clone(),
        )))
    } else if !h.regex.is_empty() {
        header_matcher::HeaderMatchSpecifier::StringMatch(string_match(regex(&h.regex)))
    } else {
        header_matcher::HeaderMatchSpecifier::PresentMatch(true)
    };
    HeaderMatcher {
        name: h.name.clone(),
        header_match_specifier: Some(specifier),
        invert_match: h.invert,
        ..Default::default()
    }
}

fn route_match(http: Option<&ServiceRouteHttpMatch>) -> RouteMatch {
    let Some(http) = http else {
        return RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
            ..Default::default()
        };
    };
    let path_specifier = if !http.path_exact.is_empty() {
        route_match::PathSpecifier::Path(http.path_exact.clone())
    } else if !http.path_regex.is_empty() {
        route_match::PathSpecifier::SafeRegex(RegexMatcher {
            regex: http.path_regex.clone(),
            ..Default::default()
        })
    } else if !http.path_prefix.is_empty() {
        route_match::PathSpecifier::Prefix(http.path_prefix.clone())
    } else {
        route_match::PathSpecifier::Prefix("/".into())
    };
    let mut headers: Vec<HeaderMatcher> = http.header.iter().map(header_match).collect();
    if !http.methods.is_empty() {
        let methods: Vec<String> = http.methods.iter().map(|m| m.to_ascii_uppercase()).collect();
        headers.push(HeaderMatcher {
            name: ":method".into(),
            header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(string_match(regex(
                &methods.join("|"),
            )))),
            ..Default::default()
        });
    }
    let query_parameters = http
        .query_param
        .iter()
        .map(|q| {
            let specifier = if q.present {
                query_parameter_matcher::QueryParameterMatchSpecifier::PresentMatch(true)
            } else if !q.regex.is_empty() {
                query_parameter_matcher::QueryParameterMatchSpecifier::StringMatch(string_match(regex(&q.regex)))
            } else {
                query_parameter_matcher::QueryParameterMatchSpecifier::StringMatch(string_match(
                    string_matcher::MatchPattern::Exact(q.exact.clone()),
                ))
            };
            QueryParameterMatcher {
                name: q.name.clone(),
                query_parameter_match_specifier: Some(specifier),
            }
        })
        .collect();
    RouteMatch {
        path_specifier: Some(path_specifier),
        headers,
        query_parameters,
        ..Default::default()
    }
}

/// Retries as Consul configures them: a policy whenever a destination sets any retry field
/// (`NumRetries` alone bounds the retries the application asks for with
/// `x-envoy-retry-on`); conditions in Consul's order — `RetryOn` as written, then
/// `connect-failure` (unless named already), then `retriable-status-codes`.
fn retry_policy(dest: &structs::config_entry::ServiceRouteDestination) -> Option<RetryPolicy> {
    let mut on: Vec<&str> = Vec::new();
    for c in &dest.retry_on {
        if !on.contains(&c.as_str()) {
            on.push(c);
        }
    }
    if dest.retry_on_connect_failure && !on.contains(&"connect-failure") {
        on.push("connect-failure");
    }
    if !dest.retry_on_status_codes.is_empty() {
        on.push("retriable-status-codes");
    }
    if on.is_empty() && dest.num_retries == 0 {
        return None;
    }
    Some(RetryPolicy {
        retry_on: on.join(","),
        num_retries: (dest.num_retries != 0).then_some(UInt32Value {
            value: dest.num_retries,
        }),
        retriable_status_codes: dest.retry_on_status_codes.clone(),
        ..Default::default()
    })
}

/// (headers to add or set, headers to remove).
pub(crate) fn header_changes(m: Option<&HttpHeaderModifiers>) -> (Vec<HeaderValueOption>, Vec<String>) {
    let Some(m) = m else {
        return (Vec::new(), Vec::new());
    };
    let option =
        |(key, value): (&String, &String), action: header_value_option::HeaderAppendAction| HeaderValueOption {
            header: Some(HeaderValue {
                key: key.clone(),
                value: value.clone(),
                ..Default::default()
            }),
            append_action: action as i32,
            ..Default::default()
        };
    let mut add: Vec<HeaderValueOption> = m
        .add
        .iter()
        .map(|kv| option(kv, header_value_option::HeaderAppendAction::AppendIfExistsOrAdd))
        .collect();
    add.extend(
        m.set
            .iter()
            .map(|kv| option(kv, header_value_option::HeaderAppendAction::OverwriteIfExistsOrAdd)),
    );
    (add, m.remove.clone())
}

fn hash_policy(h: &HashPolicy) -> route_action::HashPolicy {
    use route_action::hash_policy::{ConnectionProperties, Cookie, Header, PolicySpecifier, QueryParameter};
    let specifier = if h.source_ip {
        PolicySpecifier::ConnectionProperties(ConnectionProperties { source_ip: true })
    } else {
        match h.field.as_str() {
            "cookie" => {
                let cfg = h.cookie_config.clone().unwrap_or_default();
                PolicySpecifier::Cookie(Cookie {
                    name: h.field_value.clone(),
                    // A session cookie has a TTL of zero; unset means "do not generate one".
                    ttl: if cfg.session { millis(0) } else { duration(&cfg.ttl) },
                    path: cfg.path,
                    ..Default::default()
                })
            }
            "query_parameter" => PolicySpecifier::QueryParameter(QueryParameter {
                name: h.field_value.clone(),
            }),
            _ => PolicySpecifier::Header(Header {
                header_name: h.field_value.clone(),
                ..Default::default()
            }),
        }
    };
    route_action::HashPolicy {
        policy_specifier: Some(specifier),
        terminal: h.terminal,
    }
}
