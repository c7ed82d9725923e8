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
    #[serde(rename = "Header")]
    pub header: Vec<ServiceRouteHttpMatchHeader>,
    /// Query conditions.
    #[serde(rename = "QueryParam")]
    pub query_param: Vec<ServiceRouteHttpMatchQueryParam>,
    /// Methods.
    #[serde(rename = "Methods")]
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
    #[serde(rename = "RetryOnStatusCodes")]
    pub retry_on_status_codes: Vec<u32>,
}

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
    #[serde(rename = "Routes")]
    pub routes: Vec<ServiceRoute>,
    /// User metadata; keys untouched.
    #[serde(rename = "Meta")]
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
            if let Some(http) = r.match_.as_ref().and_then(|m| m.http.as_ref()) {
                let set = [&http.path_exact, &http.path_prefix, &http.path_regex]
                    .iter()
                    .filter(|p| !p.is_empty())
                    .count();
                if set > 1 {
                    return Err(ValidationError::new(
                        format!("{at}.Match.HTTP.PathExact"),
                        Problem::Invalid("set at most one of PathExact, PathPrefix and PathRegex".into()),
                    ));
                }
                for (field, p) in [("PathExact", &http.path_exact), ("PathPrefix", &http.path_prefix)] {
                    if !p.is_empty() && !p.starts_with('/') {
                        return Err(ValidationError::new(
                            format!("{at}.Match.HTTP.{field}"),
                            Problem::Invalid(format!("{p:?} must begin with '/'")),
                        ));
                    }
                }
                for (j, h) in http.header.iter().enumerate() {
                    if h.name.is_empty() {
                        return Err(ValidationError::new(
                            format!("{at}.Match.HTTP.Header[{j}].Name"),
                            Problem::Required(""),
                        ));
                    }
                }
            }
            if let Some(d) = &r.destination {
                if !d.prefix_rewrite.is_empty()
                    && r.match_
                        .as_ref()
                        .and_then(|m| m.http.as_ref())
                        .is_none_or(|h| h.path_prefix.is_empty() && h.path_exact.is_empty())
                {
                    return Err(ValidationError::new(
                        format!("{at}.Destination.PrefixRewrite"),
                        Problem::NotAllowed("without a PathPrefix or PathExact match"),
                    ));
                }
                if !d.service.is_empty() {
                    check_name(&format!("{at}.Destination.Service"), &d.service, "")?;
                }
            }
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
    #[serde(rename = "Meta")]
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
    #[serde(rename = "Filter")]
    pub filter: String,
    /// Only passing instances (warning excluded).
    #[serde(rename = "OnlyPassing")]
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
    #[serde(rename = "Datacenters")]
    pub datacenters: Vec<String>,
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
    #[serde(rename = "Subsets")]
    pub subsets: BTreeMap<String, ServiceResolverSubset>,
    /// Redirect everything elsewhere.
    #[serde(rename = "Redirect", skip_serializing_if = "Option::is_none")]
    pub redirect: Option<ServiceResolverRedirect>,
    /// Failover by subset name (`*` for all).
    #[serde(rename = "Failover")]
    pub failover: BTreeMap<String, ServiceResolverFailover>,
    /// Connect timeout.
    #[serde(rename = "ConnectTimeout", skip_serializing_if = "GoDuration::is_zero")]
    pub connect_timeout: GoDuration,
    /// Request timeout.
    #[serde(rename = "RequestTimeout", skip_serializing_if = "GoDuration::is_zero")]
    pub request_timeout: GoDuration,
    /// User metadata; keys untouched.
    #[serde(rename = "Meta")]
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
            if !self.subsets.is_empty() {
                return Err(ValidationError::new(
                    "Redirect",
                    Problem::NotAllowed("together with Subsets"),
                ));
            }
            if r.service.is_empty() && r.service_subset.is_empty() && r.datacenter.is_empty() {
                return Err(ValidationError::new(
                    "Redirect",
                    Problem::Invalid("must name a Service, ServiceSubset or Datacenter".into()),
                ));
            }
            if !r.service_subset.is_empty() && r.service.is_empty() {
                return Err(ValidationError::new(
                    "Redirect.Service",
                    Problem::Required("with ServiceSubset"),
                ));
            }
        }
        for (key, f) in &self.failover {
            if key != "*" && !self.subsets.contains_key(key) {
                return Err(ValidationError::new(
                    format!("Failover[{key:?}]"),
                    Problem::Invalid("must be \"*\" or the name of a subset".into()),
                ));
            }
            if f.service.is_empty() && f.service_subset.is_empty() && f.datacenters.is_empty() {
                return Err(ValidationError::new(
                    format!("Failover[{key:?}]"),
                    Problem::Invalid("must name a Service, ServiceSubset or Datacenters".into()),
                ));
            }
        }
        Ok(())
    }
}
