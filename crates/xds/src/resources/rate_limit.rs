//! Service-defaults `RateLimits` on a sidecar's inbound side: Envoy's local rate limit
//! filter on the public listener, its bucket for every request, and a route per limited path
//! (the first whose path matches applies instead, as Consul does) carrying that path's bucket.
//! A request beyond its bucket is answered 429 without reaching the application.

use super::core::millis;
use envoy_types::pb::envoy::config::core::v3::RuntimeFractionalPercent;
use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration, RouteMatch, route_match};
use envoy_types::pb::envoy::extensions::filters::http::local_ratelimit::v3::LocalRateLimit;
use envoy_types::pb::envoy::r#type::matcher::v3::RegexMatcher;
use envoy_types::pb::envoy::r#type::v3::{FractionalPercent, TokenBucket, fractional_percent};
use envoy_types::pb::google::protobuf::{Any, UInt32Value};
use envoy_types::util::pack_any;
use structs::rate_limits::{Bucket, InstanceLevelRateLimits, RouteRateLimit};

/// The filter's name, also the key of each route's own limit.
pub(crate) const FILTER: &str = "envoy.filters.http.local_ratelimit";

/// All requests, enabled and enforced (Envoy's default for both is none).
fn everything(key: &str) -> Option<RuntimeFractionalPercent> {
    Some(RuntimeFractionalPercent {
        default_value: Some(FractionalPercent {
            numerator: 100,
            denominator: fractional_percent::DenominatorType::Hundred as i32,
        }),
        runtime_key: key.to_owned(),
    })
}

/// The filter's config: enforcing `bucket`, or (none) passing requests no route limits.
fn config(bucket: Option<Bucket>) -> LocalRateLimit {
    let Some(b) = bucket else {
        return LocalRateLimit {
            stat_prefix: "inbound_rate_limit".into(),
            ..Default::default()
        };
    };
    LocalRateLimit {
        stat_prefix: "inbound_rate_limit".into(),
        token_bucket: Some(TokenBucket {
            max_tokens: b.max_tokens,
            tokens_per_fill: Some(UInt32Value { value: b.per_second }),
            fill_interval: millis(1000),
        }),
        filter_enabled: everything("local_rate_limit_enabled"),
        filter_enforced: everything("local_rate_limit_enforced"),
        ..Default::default()
    }
}

/// The config of the HTTP filter (named [`FILTER`]) limiting every request (paths a route
/// limits have their own bucket).
pub(crate) fn filter_config(limits: &InstanceLevelRateLimits) -> Any {
    pack_any(config(limits.bucket()))
}

fn path(r: &RouteRateLimit) -> route_match::PathSpecifier {
    if !r.path_exact.is_empty() {
        route_match::PathSpecifier::Path(r.path_exact.clone())
    } else if !r.path_prefix.is_empty() {
        route_match::PathSpecifier::Prefix(r.path_prefix.clone())
    } else {
        route_match::PathSpecifier::SafeRegex(RegexMatcher {
            regex: r.path_regex.clone(),
            ..Default::default()
        })
    }
}

/// Puts a route per limited path in front of each virtual host's catch-all route to the
/// local application: the same action, the path's bucket.
pub(crate) fn add_routes(route: &mut RouteConfiguration, limits: &InstanceLevelRateLimits) {
    for vhost in &mut route.virtual_hosts {
        let Some(catch_all) = vhost.routes.last().cloned() else {
            continue;
        };
        let limited = limits.routes.iter().map(|r| {
            let mut out = Route {
                r#match: Some(RouteMatch {
                    path_specifier: Some(path(r)),
                    ..Default::default()
                }),
                action: catch_all.action.clone(),
                ..Default::default()
            };
            out.typed_per_filter_config
                .insert(FILTER.to_owned(), pack_any(config(Some(r.bucket()))));
            out
        });
        let mut routes: Vec<Route> = limited.collect();
        routes.append(&mut vhost.routes);
        vhost.routes = routes;
    }
}
