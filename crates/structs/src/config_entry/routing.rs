//! `service-router`, `service-splitter` and `service-resolver`: the discovery chain's inputs.

use super::{ConfigEntryKind, check_entry_name};
use crate::validate::{Problem, Validate, ValidationError, check_name};
use crate::{GoDuration, Index};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A header condition of a route.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceRouteHttpMatchHeader {
    /// Header name.
    #[serde(rename = "Name")]
    pub name: String,
    /// Header present.
    #[serde(rename = "Present", skip_serializing_if = "std::ops::Not::not")]
    pub present: bool,
    /// Exact value.
    #[serde(rename = "Exact", skip_serializing_if = "String::is_empty")]
    pub exact: String,
    /// Value prefix.
    #[serde(rename = "Prefix", skip_serializing_if = "String::is_empty")]
    pub prefix: String,
    /// Value suffix.
    #[serde(rename = "Suffix", skip_serializing_if = "String::is_empty")]
    pub suffix: String,
    /// Value regex.
    #[serde(rename = "Regex", skip_serializing_if = "String::is_empty")]
    pub regex: String,
    /// Negate the match.
    #[serde(rename = "Invert", skip_serializing_if = "std::ops::Not::not")]
    pub invert: bool,
}

/// A query-parameter condition of a route.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceRouteHttpMatchQueryParam {
    /// Parameter name.
    #[serde(rename = "Name")]
    pub name: String,
    /// Parameter present.
    #[serde(rename = "Present", skip_serializing_if = "std::ops::Not::not")]
    pub present: bool,
    /// Exact value.
    #[serde(rename = "Exact", skip_serializing_if = "String::is_empty")]
    pub exact: String,
    /// Value regex.
    #[serde(rename = "Regex", skip_serializing_if = "String::is_empty")]
    pub regex: String,
}

/// HTTP conditions of a route.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceRouteHttpMatch {
    /// Exact path.
    #[serde(rename = "PathExact", skip_serializing_if = "String::is_empty")]
    pub path_exact: String,
    /// Path prefix.
    #[serde(rename = "PathPrefix", skip_serializing_if = "String::is_empty")]
    pub path_prefix: String,
    /// Path regex.
    #[serde(rename = "PathRegex", skip_serializing_if = "String::is_empty")]
    pub path_regex: String,
    /// Header conditions.
    #[serde(rename = "Header", skip_serializing_if = "Vec::is_empty")]
    pub header: Vec<ServiceRouteHttpMatchHeader>,
    /// Query conditions.
    #[serde(rename = "QueryParam", skip_serializing_if = "Vec::is_empty")]
    pub query_param: Vec<ServiceRouteHttpMatchQueryParam>,
    /// Methods.
    #[serde(rename = "Methods", skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
}

/// When a route applies.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceRouteMatch {
    /// HTTP conditions.
    #[serde(rename = "HTTP", skip_serializing_if = "Option::is_none")]
    pub http: Option<ServiceRouteHttpMatch>,
}

/// Headers to add, set or remove on a request or response.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpHeaderModifiers {
    /// Append these values (keeping any already there).
    #[serde(rename = "Add", skip_serializing_if = "BTreeMap::is_empty")]
    pub add: BTreeMap<String, String>,
    /// Replace any value with these.
    #[serde(rename = "Set", skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, String>,
    /// Remove these headers.
    #[serde(rename = "Remove", skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

impl HttpHeaderModifiers {
    /// True when nothing is changed.
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.set.is_empty() && self.remove.is_empty()
    }

    /// Checks every header name; `at` is the field path of the modifiers.
    pub(crate) fn validate(&self, at: &str) -> Result<(), ValidationError> {
        for (op, names) in [
            ("Add", self.add.keys().collect::<Vec<_>>()),
            ("Set", self.set.keys().collect()),
            ("Remove", self.remove.iter().collect()),
        ] {
            for name in names {
                if name.is_empty() || name.bytes().any(|b| b <= b' ' || b == b':' || b >= 0x7f) {
                    return Err(ValidationError::new(
                        format!("{at}.{op}"),
                        Problem::Invalid(format!("{name:?} is not a valid header name")),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Where a matching request goes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceRouteDestination {
    /// Service (default: the router's own).
    #[serde(rename = "Service", skip_serializing_if = "String::is_empty")]
    pub service: String,
    /// Subset of it.
    #[serde(rename = "ServiceSubset", skip_serializing_if = "String::is_empty")]
    pub service_subset: String,
    /// Namespace.
    #[serde(rename = "Namespace", skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Replace the matched path prefix with this.
    #[serde(rename = "PrefixRewrite", skip_serializing_if = "String::is_empty")]
    pub prefix_rewrite: String,
    /// Request timeout.
    #[serde(rename = "RequestTimeout", skip_serializing_if = "GoDuration::is_zero")]
    pub request_timeout: GoDuration,
    /// Idle timeout.
    #[serde(rename = "IdleTimeout", skip_serializing_if = "GoDuration::is_zero")]
    pub idle_timeout: GoDuration,
    /// Retries.
    #[serde(rename = "NumRetries", skip_serializing_if = "crate::json::ser::is_default")]
    pub num_retries: u32,
    /// Retry on connect failure.
    #[serde(rename = "RetryOnConnectFailure", skip_serializing_if = "std::ops::Not::not")]
    pub retry_on_connect_failure: bool,
    /// Retry on these status codes.
    #[serde(rename = "RetryOnStatusCodes", skip_serializing_if = "Vec::is_empty")]
    pub retry_on_status_codes: Vec<u32>,
    /// Envoy retry conditions (`5xx`, `gateway-error`, `reset`, `connect-failure`, ...).
    #[serde(rename = "RetryOn", skip_serializing_if = "Vec::is_empty")]
    pub retry_on: Vec<String>,
    /// Request header changes.
    #[serde(rename = "RequestHeaders", skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<HttpHeaderModifiers>,
    /// Response header changes.
    #[serde(rename = "ResponseHeaders", skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<HttpHeaderModifiers>,
}

/// The retry conditions Envoy's router accepts in `retry_on` that a route may name.
pub const RETRY_ON_CONDITIONS: [&str; 12] = [
    "5xx",
    "gateway-error",
    "reset",
    "connect-failure",
    "envoy-ratelimited",
    "retriable-4xx",
    "refused-stream",
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
];

/// One route of a router.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceRoute {
    /// Conditions; none matches everything.
    #[serde(rename = "Match", skip_serializing_if = "Option::is_none")]
    pub match_: Option<ServiceRouteMatch>,
    /// Destination.
    #[serde(rename = "Destination", skip_serializing_if = "Option::is_none")]
    pub destination: Option<ServiceRouteDestination>,
}

/// L7 routes for a service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceRouter {
    /// Service name.
    #[serde(rename = "Name")]
    pub name: String,
    /// Routes, first match wins.
    #[serde(
        rename = "Routes",
        serialize_with = "crate::json::ser::null_if_empty",
        deserialize_with = "crate::json::read::null_as_default"
    )]
    pub routes: Vec<ServiceRoute>,
    /// User metadata; keys untouched.
    #[serde(rename = "Meta", skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

impl Validate for ServiceRouter {
    fn validate(&self) -> Result<(), ValidationError> {
        check_entry_name(ConfigEntryKind::ServiceRouter, &self.name)?;
        for (i, r) in self.routes.iter().enumerate() {
            let at = format!("Routes[{i}]");
            let http = r.match_.as_ref().and_then(|m| m.http.as_ref());
            if let Some(http) = http {
                http.validate(&at)?;
            }
            if let Some(d) = &r.destination {
                d.validate(&at, http)?;
            }
        }
        Ok(())
    }
}

impl ServiceRouteHttpMatch {
    /// Checks the match of route `at`: one path form at most, paths from `/`, regular
    /// expressions, header and query matches, methods once each.
    fn validate(&self, at: &str) -> Result<(), ValidationError> {
        let set = [&self.path_exact, &self.path_prefix, &self.path_regex]
            .iter()
            .filter(|p| !p.is_empty())
            .count();
        if set > 1 {
            return Err(ValidationError::new(
                format!("{at}.Match.HTTP.PathExact"),
                Problem::Invalid("set at most one of PathExact, PathPrefix and PathRegex".into()),
            ));
        }
        for (field, p) in [("PathExact", &self.path_exact), ("PathPrefix", &self.path_prefix)] {
            if !p.is_empty() && !p.starts_with('/') {
                return Err(ValidationError::new(
                    format!("{at}.Match.HTTP.{field}"),
                    Problem::Invalid(format!("{p:?} must begin with '/'")),
                ));
            }
        }
        check_regex(&format!("{at}.Match.HTTP.PathRegex"), &self.path_regex)?;
        for (j, h) in self.header.iter().enumerate() {
            check_header_match(
                &format!("{at}.Match.HTTP.Header[{j}]"),
                &h.name,
                &[
                    ("Present", h.present),
                    ("Exact", !h.exact.is_empty()),
                    ("Prefix", !h.prefix.is_empty()),
                    ("Suffix", !h.suffix.is_empty()),
                ],
                &h.regex,
            )?;
        }
        for (j, q) in self.query_param.iter().enumerate() {
            let qat = format!("{at}.Match.HTTP.QueryParam[{j}]");
            if q.name.is_empty() {
                return Err(ValidationError::new(format!("{qat}.Name"), Problem::Required("")));
            }
            let set = [q.present, !q.exact.is_empty(), !q.regex.is_empty()]
                .iter()
                .filter(|b| **b)
                .count();
            if set != 1 {
                return Err(ValidationError::new(
                    qat,
                    Problem::Invalid("set exactly one of Present, Exact and Regex".into()),
                ));
            }
            check_regex(&format!("{qat}.Regex"), &q.regex)?;
        }
        for (j, m) in self.methods.iter().enumerate() {
            check_method(&format!("{at}.Match.HTTP.Methods[{j}]"), m)?;
            if self.methods[..j].iter().any(|o| o.eq_ignore_ascii_case(m)) {
                return Err(ValidationError::new(
                    format!("{at}.Match.HTTP.Methods[{j}]"),
                    Problem::Duplicate(format!("method {m:?}")),
                ));
            }
        }
        Ok(())
    }
}

impl ServiceRouteDestination {
    /// Checks the destination of route `at`, whose HTTP match is `http`.
    fn validate(&self, at: &str, http: Option<&ServiceRouteHttpMatch>) -> Result<(), ValidationError> {
        if !self.prefix_rewrite.is_empty() && http.is_none_or(|h| h.path_prefix.is_empty() && h.path_exact.is_empty()) {
            return Err(ValidationError::new(
                format!("{at}.Destination.PrefixRewrite"),
                Problem::NotAllowed("without a PathPrefix or PathExact match"),
            ));
        }
        if !self.service.is_empty() {
            check_name(&format!("{at}.Destination.Service"), &self.service, "")?;
        }
        check_namespace(&format!("{at}.Destination.Namespace"), &self.namespace)?;
        for (j, c) in self.retry_on.iter().enumerate() {
            if !RETRY_ON_CONDITIONS.contains(&c.as_str()) {
                return Err(ValidationError::new(
                    format!("{at}.Destination.RetryOn[{j}]"),
                    Problem::Invalid(format!("{c:?} is not one of {}", RETRY_ON_CONDITIONS.join(", "))),
                ));
            }
        }
        for (j, code) in self.retry_on_status_codes.iter().enumerate() {
            if !(100..=599).contains(code) {
                return Err(ValidationError::new(
                    format!("{at}.Destination.RetryOnStatusCodes[{j}]"),
                    Problem::OutOfRange { min: 100, max: 599 },
                ));
            }
        }
        if let Some(h) = &self.request_headers {
            h.validate(&format!("{at}.Destination.RequestHeaders"))?;
        }
        if let Some(h) = &self.response_headers {
            h.validate(&format!("{at}.Destination.ResponseHeaders"))?;
        }
        Ok(())
    }
}

/// One weighted leg of a split.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceSplit {
    /// Percentage of traffic, 0..=100, up to two decimals.
    #[serde(rename = "Weight")]
    pub weight: f32,
    /// Service (default: the splitter's own).
    #[serde(rename = "Service", skip_serializing_if = "String::is_empty")]
    pub service: String,
    /// Subset of it.
    #[serde(rename = "ServiceSubset", skip_serializing_if = "String::is_empty")]
    pub service_subset: String,
    /// Namespace.
    #[serde(rename = "Namespace", skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Request header changes for this leg.
    #[serde(rename = "RequestHeaders", skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<HttpHeaderModifiers>,
    /// Response header changes for this leg.
    #[serde(rename = "ResponseHeaders", skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<HttpHeaderModifiers>,
}

impl Eq for ServiceSplit {}

/// Weighted traffic splits for a service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceSplitter {
    /// Service name.
    #[serde(rename = "Name")]
    pub name: String,
    /// Legs; weights add up to 100.
    #[serde(rename = "Splits")]
    pub splits: Vec<ServiceSplit>,
    /// User metadata; keys untouched.
    #[serde(rename = "Meta", skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

impl Validate for ServiceSplitter {
    fn validate(&self) -> Result<(), ValidationError> {
        check_entry_name(ConfigEntryKind::ServiceSplitter, &self.name)?;
        if self.splits.is_empty() {
            return Err(ValidationError::new(
                "Splits",
                Problem::Required("(at least one split)"),
            ));
        }
        let mut total_hundredths: i64 = 0;
        for (i, s) in self.splits.iter().enumerate() {
            if !(0.0..=100.0).contains(&s.weight) {
                return Err(ValidationError::new(
                    format!("Splits[{i}].Weight"),
                    Problem::OutOfRange { min: 0, max: 100 },
                ));
            }
            total_hundredths += (f64::from(s.weight) * 100.0).round() as i64;
            if let Some(h) = &s.request_headers {
                h.validate(&format!("Splits[{i}].RequestHeaders"))?;
            }
            if let Some(h) = &s.response_headers {
                h.validate(&format!("Splits[{i}].ResponseHeaders"))?;
            }
            if !s.service.is_empty() {
                check_name(&format!("Splits[{i}].Service"), &s.service, "")?;
            }
            check_namespace(&format!("Splits[{i}].Namespace"), &s.namespace)?;
        }
        if total_hundredths != 10_000 {
            return Err(ValidationError::new(
                "Splits",
                Problem::Invalid(format!(
                    "weights must add up to 100, they add up to {}",
                    total_hundredths as f64 / 100.0
                )),
            ));
        }
        Ok(())
    }
}

/// A named subset of a service's instances.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceResolverSubset {
    /// Filter expression over the instance (`Service.Meta.version == v2`).
    #[serde(rename = "Filter", skip_serializing_if = "String::is_empty")]
    pub filter: String,
    /// Only passing instances (warning excluded).
    #[serde(rename = "OnlyPassing", skip_serializing_if = "std::ops::Not::not")]
    pub only_passing: bool,
}

/// Send all traffic for a service elsewhere.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceResolverRedirect {
    /// Service.
    #[serde(rename = "Service", skip_serializing_if = "String::is_empty")]
    pub service: String,
    /// Subset.
    #[serde(rename = "ServiceSubset", skip_serializing_if = "String::is_empty")]
    pub service_subset: String,
    /// Namespace.
    #[serde(rename = "Namespace", skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Datacenter.
    #[serde(rename = "Datacenter", skip_serializing_if = "String::is_empty")]
    pub datacenter: String,
    /// A cluster peer: the service (this one, or `Service`) as that peer exports it.
    #[serde(rename = "Peer", skip_serializing_if = "String::is_empty")]
    pub peer: String,
}

/// Where traffic goes when the primary target has no healthy instance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceResolverFailover {
    /// Service.
    #[serde(rename = "Service", skip_serializing_if = "String::is_empty")]
    pub service: String,
    /// Subset.
    #[serde(rename = "ServiceSubset", skip_serializing_if = "String::is_empty")]
    pub service_subset: String,
    /// Namespace.
    #[serde(rename = "Namespace", skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Datacenters to try, in order.
    #[serde(rename = "Datacenters", skip_serializing_if = "Vec::is_empty")]
    pub datacenters: Vec<String>,
    /// Targets to try, in order (exclusive with the fields above).
    #[serde(rename = "Targets", skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<ServiceResolverFailoverTarget>,
    /// Consul's sameness group: not supported (see [`super::DefaultOnly`]).
    #[serde(rename = "SamenessGroup", skip_serializing_if = "Option::is_none")]
    pub sameness_group: super::DefaultOnly,
    /// Consul's failover policy: only `default` (the order given).
    #[serde(rename = "Policy", skip_serializing_if = "Option::is_none")]
    pub policy: super::DefaultOnly,
}

/// One failover target.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceResolverFailoverTarget {
    /// Service (default: the resolver's own).
    #[serde(rename = "Service", skip_serializing_if = "String::is_empty")]
    pub service: String,
    /// Subset.
    #[serde(rename = "ServiceSubset", skip_serializing_if = "String::is_empty")]
    pub service_subset: String,
    /// Namespace.
    #[serde(rename = "Namespace", skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Datacenter.
    #[serde(rename = "Datacenter", skip_serializing_if = "String::is_empty")]
    pub datacenter: String,
    /// A peer exporting the service (cluster peering).
    #[serde(rename = "Peer", skip_serializing_if = "String::is_empty")]
    pub peer: String,
    /// Consul's admin partition: only `default`.
    #[serde(rename = "Partition", skip_serializing_if = "Option::is_none")]
    pub partition: super::DefaultOnly,
}

/// Ring-hash sizes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RingHashConfig {
    /// Minimum ring size (0: Envoy's default).
    #[serde(rename = "MinimumRingSize", skip_serializing_if = "crate::json::ser::is_default")]
    pub minimum_ring_size: u64,
    /// Maximum ring size (0: Envoy's default).
    #[serde(rename = "MaximumRingSize", skip_serializing_if = "crate::json::ser::is_default")]
    pub maximum_ring_size: u64,
}

/// Least-request settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeastRequestConfig {
    /// Hosts sampled per pick (0: Envoy's default of 2).
    #[serde(rename = "ChoiceCount", skip_serializing_if = "crate::json::ser::is_default")]
    pub choice_count: u32,
}

/// Cookie settings of a cookie hash policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CookieConfig {
    /// A session cookie (no expiry).
    #[serde(rename = "Session", skip_serializing_if = "std::ops::Not::not")]
    pub session: bool,
    /// Lifetime of a generated cookie.
    #[serde(rename = "TTL", skip_serializing_if = "GoDuration::is_zero")]
    pub ttl: GoDuration,
    /// Path of a generated cookie.
    #[serde(rename = "Path", skip_serializing_if = "String::is_empty")]
    pub path: String,
}

/// What a consistent-hash load balancer hashes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HashPolicy {
    /// `header`, `cookie` or `query_parameter` (empty with `SourceIP`).
    #[serde(rename = "Field", skip_serializing_if = "String::is_empty")]
    pub field: String,
    /// Name of the header, cookie or parameter.
    #[serde(rename = "FieldValue", skip_serializing_if = "String::is_empty")]
    pub field_value: String,
    /// Cookie settings.
    #[serde(rename = "CookieConfig", skip_serializing_if = "Option::is_none")]
    pub cookie_config: Option<CookieConfig>,
    /// Hash the source address.
    #[serde(rename = "SourceIP", skip_serializing_if = "std::ops::Not::not")]
    pub source_ip: bool,
    /// Stop at this policy when it produced a hash.
    #[serde(rename = "Terminal", skip_serializing_if = "std::ops::Not::not")]
    pub terminal: bool,
}

/// Load balancing of a service's instances.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoadBalancer {
    /// `round_robin` (default), `least_request`, `ring_hash`, `maglev` or `random`.
    #[serde(rename = "Policy", skip_serializing_if = "String::is_empty")]
    pub policy: String,
    /// Ring-hash sizes.
    #[serde(rename = "RingHashConfig", skip_serializing_if = "Option::is_none")]
    pub ring_hash_config: Option<RingHashConfig>,
    /// Least-request settings.
    #[serde(rename = "LeastRequestConfig", skip_serializing_if = "Option::is_none")]
    pub least_request_config: Option<LeastRequestConfig>,
    /// Hash policies (ring_hash and maglev only).
    #[serde(rename = "HashPolicies", skip_serializing_if = "Vec::is_empty")]
    pub hash_policies: Vec<HashPolicy>,
}

/// Envoy's bound on both ring sizes.
const MAX_RING_SIZE: u64 = 8_388_608;
/// Envoy's default minimum ring size.
const DEFAULT_MIN_RING_SIZE: u64 = 1024;

/// The load-balancer policies a resolver may name.
pub const LB_POLICIES: [&str; 5] = ["round_robin", "least_request", "ring_hash", "maglev", "random"];

impl LoadBalancer {
    fn validate(&self) -> Result<(), ValidationError> {
        if !self.policy.is_empty() && !LB_POLICIES.contains(&self.policy.as_str()) {
            return Err(ValidationError::new(
                "LoadBalancer.Policy",
                Problem::Invalid(format!("{:?} is not one of {}", self.policy, LB_POLICIES.join(", "))),
            ));
        }
        let hashing = matches!(self.policy.as_str(), "ring_hash" | "maglev");
        if self.ring_hash_config.is_some() && self.policy != "ring_hash" {
            return Err(ValidationError::new(
                "LoadBalancer.RingHashConfig",
                Problem::NotAllowed("unless Policy is ring_hash"),
            ));
        }
        if self.least_request_config.is_some() && self.policy != "least_request" {
            return Err(ValidationError::new(
                "LoadBalancer.LeastRequestConfig",
                Problem::NotAllowed("unless Policy is least_request"),
            ));
        }
        if let Some(c) = &self.least_request_config
            && c.choice_count == 1
        {
            return Err(ValidationError::new(
                "LoadBalancer.LeastRequestConfig.ChoiceCount",
                Problem::Invalid("must be at least 2 (or 0 for the default of 2)".into()),
            ));
        }
        if let Some(r) = &self.ring_hash_config {
            r.validate()?;
        }
        if !self.hash_policies.is_empty() && !hashing {
            return Err(ValidationError::new(
                "LoadBalancer.HashPolicies",
                Problem::NotAllowed("unless Policy is ring_hash or maglev"),
            ));
        }
        for (i, h) in self.hash_policies.iter().enumerate() {
            h.validate(&format!("LoadBalancer.HashPolicies[{i}]"))?;
        }
        Ok(())
    }
}

impl RingHashConfig {
    /// Checks the ring sizes against Envoy's bounds and each other.
    fn validate(&self) -> Result<(), ValidationError> {
        for (field, v) in [
            ("MinimumRingSize", self.minimum_ring_size),
            ("MaximumRingSize", self.maximum_ring_size),
        ] {
            if v > MAX_RING_SIZE {
                return Err(ValidationError::new(
                    format!("LoadBalancer.RingHashConfig.{field}"),
                    Problem::OutOfRange {
                        min: 0,
                        max: MAX_RING_SIZE,
                    },
                ));
            }
        }
        if self.minimum_ring_size == 0 && self.maximum_ring_size != 0 && self.maximum_ring_size < DEFAULT_MIN_RING_SIZE
        {
            return Err(ValidationError::new(
                "LoadBalancer.RingHashConfig.MaximumRingSize",
                Problem::Invalid(format!(
                    "{} is below the default MinimumRingSize of {DEFAULT_MIN_RING_SIZE}: set MinimumRingSize too",
                    self.maximum_ring_size
                )),
            ));
        }
        if self.maximum_ring_size != 0 && self.minimum_ring_size > self.maximum_ring_size {
            return Err(ValidationError::new(
                "LoadBalancer.RingHashConfig.MinimumRingSize",
                Problem::Invalid("must not exceed MaximumRingSize".into()),
            ));
        }
        Ok(())
    }
}

impl HashPolicy {
    /// Checks one hash policy at `at`: the source IP, or a field and its value.
    fn validate(&self, at: &str) -> Result<(), ValidationError> {
        if self.source_ip {
            if !self.field.is_empty() || !self.field_value.is_empty() {
                return Err(ValidationError::new(
                    format!("{at}.SourceIP"),
                    Problem::NotAllowed("together with Field or FieldValue"),
                ));
            }
            return Ok(());
        }
        if !matches!(self.field.as_str(), "header" | "cookie" | "query_parameter") {
            return Err(ValidationError::new(
                format!("{at}.Field"),
                Problem::Invalid(format!(
                    "{:?} is not one of header, cookie, query_parameter (or set SourceIP)",
                    self.field
                )),
            ));
        }
        if self.field_value.is_empty() {
            return Err(ValidationError::new(
                format!("{at}.FieldValue"),
                Problem::Required("with Field"),
            ));
        }
        if self.cookie_config.is_some() && self.field != "cookie" {
            return Err(ValidationError::new(
                format!("{at}.CookieConfig"),
                Problem::NotAllowed("unless Field is cookie"),
            ));
        }
        if let Some(c) = &self.cookie_config
            && c.session
            && !c.ttl.is_zero()
        {
            return Err(ValidationError::new(
                format!("{at}.CookieConfig.TTL"),
                Problem::NotAllowed("for a session cookie"),
            ));
        }
        Ok(())
    }
}

/// Subsets, redirect and failover for a service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceResolver {
    /// Service name.
    #[serde(rename = "Name")]
    pub name: String,
    /// Subset used when none is named.
    #[serde(rename = "DefaultSubset", skip_serializing_if = "String::is_empty")]
    pub default_subset: String,
    /// Subsets by name; names are the user's.
    #[serde(rename = "Subsets", skip_serializing_if = "BTreeMap::is_empty")]
    pub subsets: BTreeMap<String, ServiceResolverSubset>,
    /// Redirect everything elsewhere.
    #[serde(rename = "Redirect", skip_serializing_if = "Option::is_none")]
    pub redirect: Option<ServiceResolverRedirect>,
    /// Failover by subset name (`*` for all).
    #[serde(rename = "Failover", skip_serializing_if = "BTreeMap::is_empty")]
    pub failover: BTreeMap<String, ServiceResolverFailover>,
    /// Connect timeout.
    #[serde(rename = "ConnectTimeout", skip_serializing_if = "GoDuration::is_zero")]
    pub connect_timeout: GoDuration,
    /// Request timeout.
    #[serde(rename = "RequestTimeout", skip_serializing_if = "GoDuration::is_zero")]
    pub request_timeout: GoDuration,
    /// Load balancing of the service's instances.
    #[serde(rename = "LoadBalancer", skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancer>,
    /// Consul's `PrioritizeByLocality`: only `none` (see [`super::DefaultOnly`]).
    #[serde(rename = "PrioritizeByLocality", skip_serializing_if = "Option::is_none")]
    pub prioritize_by_locality: super::DefaultOnly,
    /// User metadata; keys untouched.
    #[serde(rename = "Meta", skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

impl Validate for ServiceResolver {
    fn validate(&self) -> Result<(), ValidationError> {
        check_entry_name(ConfigEntryKind::ServiceResolver, &self.name)?;
        super::check_prioritize_by_locality(&self.prioritize_by_locality)?;
        for name in self.subsets.keys() {
            check_name(&format!("Subsets[{name:?}]"), name, "")?;
        }
        if !self.default_subset.is_empty() && !self.subsets.contains_key(&self.default_subset) {
            return Err(ValidationError::new(
                "DefaultSubset",
                Problem::Invalid(format!("{:?} is not one of the Subsets", self.default_subset)),
            ));
        }
        if let Some(r) = &self.redirect {
            check_namespace("Redirect.Namespace", &r.namespace)?;
            if !self.subsets.is_empty() {
                return Err(ValidationError::new(
                    "Redirect",
                    Problem::NotAllowed("together with Subsets"),
                ));
            }
            if r.service.is_empty() && r.service_subset.is_empty() && r.datacenter.is_empty() && r.peer.is_empty() {
                return Err(ValidationError::new(
                    "Redirect",
                    Problem::Invalid("must name a Service, ServiceSubset, Datacenter or Peer".into()),
                ));
            }
            if !r.peer.is_empty() {
                crate::validate::check_peer_name("Redirect.Peer", &r.peer)?;
                if !r.service_subset.is_empty() || !r.datacenter.is_empty() {
                    return Err(ValidationError::new(
                        "Redirect.Peer",
                        Problem::NotAllowed("together with ServiceSubset or Datacenter"),
                    ));
                }
            }
            if !r.service_subset.is_empty() && r.service.is_empty() {
                return Err(ValidationError::new(
                    "Redirect.Service",
                    Problem::Required("with ServiceSubset"),
                ));
            }
        }
        for (key, f) in &self.failover {
            check_failover(self, key, f)?;
        }
        for (name, subset) in &self.subsets {
            if let Err(e) = subset.filter.parse::<crate::filter::Filter>() {
                return Err(ValidationError::new(
                    format!("Subsets[{name:?}].Filter"),
                    Problem::Invalid(e.to_string()),
                ));
            }
        }
        if let Some(lb) = &self.load_balancer {
            lb.validate()?;
        }
        Ok(())
    }
}

/// One `Failover` entry of a resolver (`key`: the subset it is for, or `*`).
fn check_failover(resolver: &ServiceResolver, key: &str, f: &ServiceResolverFailover) -> Result<(), ValidationError> {
    super::check_default_only(
        &format!("Failover[{key:?}].SamenessGroup"),
        &f.sameness_group,
        &[],
        "sameness groups are not supported; list the Targets",
    )?;
    super::check_default_only(
        &format!("Failover[{key:?}].Policy"),
        &f.policy,
        &[serde_json::json!({"Mode": "default"})],
        "targets are tried in the order given (only Mode \"default\")",
    )?;
    if key != "*" && !resolver.subsets.contains_key(key) {
        return Err(ValidationError::new(
            format!("Failover[{key:?}]"),
            Problem::Invalid("must be \"*\" or the name of a subset".into()),
        ));
    }
    let classic = !f.service.is_empty() || !f.service_subset.is_empty() || !f.datacenters.is_empty();
    if classic && !f.targets.is_empty() {
        return Err(ValidationError::new(
            format!("Failover[{key:?}].Targets"),
            Problem::NotAllowed("together with Service, ServiceSubset or Datacenters"),
        ));
    }
    if !classic && f.targets.is_empty() {
        return Err(ValidationError::new(
            format!("Failover[{key:?}]"),
            Problem::Invalid("must name Targets, or a Service, ServiceSubset or Datacenters".into()),
        ));
    }
    check_namespace(&format!("Failover[{key:?}].Namespace"), &f.namespace)?;
    for (i, t) in f.targets.iter().enumerate() {
        let at = format!("Failover[{key:?}].Targets[{i}]");
        check_namespace(&format!("{at}.Namespace"), &t.namespace)?;
        super::check_default_only(
            &format!("{at}.Partition"),
            &t.partition,
            &[serde_json::json!("default")],
            "admin partitions are Consul Enterprise's (only \"default\")",
        )?;
        if t.service.is_empty() && t.service_subset.is_empty() && t.datacenter.is_empty() && t.peer.is_empty() {
            return Err(ValidationError::new(
                at,
                Problem::Invalid("must name a Service, ServiceSubset, Datacenter or Peer".into()),
            ));
        }
        if !t.peer.is_empty() {
            crate::validate::check_peer_name(&format!("{at}.Peer"), &t.peer)?;
            if !t.service_subset.is_empty() || !t.datacenter.is_empty() {
                return Err(ValidationError::new(
                    format!("{at}.Peer"),
                    Problem::NotAllowed("together with ServiceSubset or Datacenter"),
                ));
            }
        }
    }
    Ok(())
}

/// A header condition of a route or an L7 permission at `at`: a name, at most one of the
/// value `conditions` (by name: Present, Exact, Prefix, Suffix, and Contains for an
/// intention) and Regex, and a regex that compiles.
pub(super) fn check_header_match(
    at: &str,
    name: &str,
    conditions: &[(&str, bool)],
    regex: &str,
) -> Result<(), ValidationError> {
    if name.is_empty() {
        return Err(ValidationError::new(format!("{at}.Name"), Problem::Required("")));
    }
    if conditions.iter().filter(|(_, set)| *set).count() + usize::from(!regex.is_empty()) > 1 {
        let names: Vec<&str> = conditions.iter().map(|(name, _)| *name).collect();
        return Err(ValidationError::new(
            at,
            Problem::Invalid(format!("set at most one of {} and Regex", names.join(", "))),
        ));
    }
    check_regex(&format!("{at}.Regex"), regex)
}

/// The HTTP methods a route or permission may name, as Envoy sees them in `:method`.
pub(crate) const HTTP_METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE",
];

/// A method of a route or an L7 permission: one of [`HTTP_METHODS`], upper-case (Envoy
/// compares `:method` exactly, so `get` would never match).
pub(super) fn check_method(field: &str, method: &str) -> Result<(), ValidationError> {
    if HTTP_METHODS.contains(&method) {
        return Ok(());
    }
    Err(ValidationError::new(
        field,
        Problem::Invalid(format!("{method:?} is not one of {}", HTTP_METHODS.join(", "))),
    ))
}

/// A namespace named inside an entry: only `default` is served (every target is in it), so
/// another is refused rather than ignored.
fn check_namespace(field: &str, namespace: &str) -> Result<(), ValidationError> {
    if namespace.is_empty() || namespace == "default" {
        return Ok(());
    }
    Err(ValidationError::new(
        field,
        Problem::Invalid(format!("namespace {namespace:?} is not served: only \"default\" is")),
    ))
}

/// A regex Envoy will be given (RE2 syntax, which the `regex` crate shares): refused at write
/// time when it does not compile, so Envoy never rejects the resources built from it.
pub(crate) fn check_regex(field: &str, regex: &str) -> Result<(), ValidationError> {
    if regex.is_empty() {
        return Ok(());
    }
    regex::Regex::new(regex)
        .map(drop)
        .map_err(|e| ValidationError::new(field, Problem::Invalid(format!("invalid regex: {e}"))))
}
