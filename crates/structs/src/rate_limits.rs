//! Request rate limits on a service's instances: service-defaults `RateLimits`, Consul's
//! shape. Each instance's proxy enforces them on its inbound side (HTTP protocols only).

use crate::validate::{Problem, ValidationError};
use serde::{Deserialize, Serialize};

/// `RateLimits`: limits per instance of the service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimits {
    /// The limits every instance enforces.
    #[serde(rename = "InstanceLevel")]
    pub instance_level: InstanceLevelRateLimits,
}

/// `RateLimits.InstanceLevel`: a limit on every request, and limits for paths (the first
/// route matching a request's path applies instead).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InstanceLevelRateLimits {
    /// Average requests per second (0: no limit on paths no route matches).
    #[serde(rename = "RequestsPerSecond")]
    pub requests_per_second: u32,
    /// Requests allowed at once above the average (0: `RequestsPerSecond`).
    #[serde(rename = "RequestsMaxBurst")]
    pub requests_max_burst: u32,
    /// Limits for paths.
    #[serde(rename = "Routes", skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteRateLimit>,
}

/// One path's limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouteRateLimit {
    /// The path, exactly.
    #[serde(rename = "PathExact", skip_serializing_if = "String::is_empty")]
    pub path_exact: String,
    /// A path prefix.
    #[serde(rename = "PathPrefix", skip_serializing_if = "String::is_empty")]
    pub path_prefix: String,
    /// A regular expression the whole path matches (RE2).
    #[serde(rename = "PathRegex", skip_serializing_if = "String::is_empty")]
    pub path_regex: String,
    /// Average requests per second on this path (required).
    #[serde(rename = "RequestsPerSecond")]
    pub requests_per_second: u32,
    /// Requests allowed at once above the average (0: `RequestsPerSecond`).
    #[serde(rename = "RequestsMaxBurst")]
    pub requests_max_burst: u32,
}

/// The token bucket a limit stands for: `max_tokens` at once, `per_second` refilled each
/// second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// Tokens the bucket holds when full.
    pub max_tokens: u32,
    /// Tokens added each second.
    pub per_second: u32,
}

fn bucket(rps: u32, burst: u32) -> Bucket {
    Bucket {
        max_tokens: burst.max(rps),
        per_second: rps,
    }
}

impl InstanceLevelRateLimits {
    /// The bucket of requests no route matches, if any.
    pub fn bucket(&self) -> Option<Bucket> {
        (self.requests_per_second > 0).then(|| bucket(self.requests_per_second, self.requests_max_burst))
    }

    /// Whether any limit is set.
    pub fn is_set(&self) -> bool {
        self.requests_per_second > 0 || !self.routes.is_empty()
    }
}

impl RouteRateLimit {
    /// This route's bucket.
    pub fn bucket(&self) -> Bucket {
        bucket(self.requests_per_second, self.requests_max_burst)
    }
}

impl RateLimits {
    /// Checks the limits, naming the field under `at`: a burst needs a rate, and each route
    /// one path form, paths from `/`, a valid regular expression and a rate.
    pub fn check(&self, at: &str) -> Result<(), ValidationError> {
        let il = &self.instance_level;
        let at = format!("{at}.InstanceLevel");
        if il.requests_max_burst > 0 && il.requests_per_second == 0 {
            return Err(ValidationError::new(
                format!("{at}.RequestsMaxBurst"),
                Problem::Invalid("needs RequestsPerSecond".into()),
            ));
        }
        for (i, r) in il.routes.iter().enumerate() {
            let at = format!("{at}.Routes[{i}]");
            let forms = [&r.path_exact, &r.path_prefix, &r.path_regex]
                .iter()
                .filter(|p| !p.is_empty())
                .count();
            if forms != 1 {
                return Err(ValidationError::new(
                    format!("{at}.PathExact"),
                    Problem::Invalid("set exactly one of PathExact, PathPrefix and PathRegex".into()),
                ));
            }
            for (field, p) in [("PathExact", &r.path_exact), ("PathPrefix", &r.path_prefix)] {
                if !p.is_empty() && !p.starts_with('/') {
                    return Err(ValidationError::new(
                        format!("{at}.{field}"),
                        Problem::Invalid(format!("{p:?} must begin with '/'")),
                    ));
                }
            }
            crate::config_entry::check_regex(&format!("{at}.PathRegex"), &r.path_regex)?;
            if r.requests_per_second == 0 {
                return Err(ValidationError::new(
                    format!("{at}.RequestsPerSecond"),
                    Problem::Invalid("is required and must be above 0".into()),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(json: &str) -> Result<RateLimits, String> {
        let r: RateLimits = serde_json::from_str(json).map_err(|e| e.to_string())?;
        r.check("RateLimits").map_err(|e| e.to_string())?;
        Ok(r)
    }

    #[test]
    fn buckets_take_the_burst_or_the_rate() {
        let r = check(
            r#"{"InstanceLevel": {"RequestsPerSecond": 10, "RequestsMaxBurst": 25,
                         "Routes": [{"PathPrefix": "/api", "RequestsPerSecond": 5}]}}"#,
        )
        .unwrap();
        assert_eq!(
            r.instance_level.bucket(),
            Some(Bucket {
                max_tokens: 25,
                per_second: 10
            })
        );
        assert_eq!(
            r.instance_level.routes[0].bucket(),
            Bucket {
                max_tokens: 5,
                per_second: 5
            }
        );
        let only_routes =
            check(r#"{"InstanceLevel": {"Routes": [{"PathExact": "/a", "RequestsPerSecond": 1}]}}"#).unwrap();
        assert_eq!(only_routes.instance_level.bucket(), None);
        assert!(only_routes.instance_level.is_set());
    }

    #[test]
    fn bad_limits_name_the_field() {
        for (bad, says) in [
            (
                r#"{"RequestsMaxBurst": 5}"#,
                "RateLimits.InstanceLevel.RequestsMaxBurst",
            ),
            (
                r#"{"Routes": [{"RequestsPerSecond": 1}]}"#,
                "RateLimits.InstanceLevel.Routes[0].PathExact",
            ),
            (
                r#"{"Routes": [{"PathExact": "/a", "PathPrefix": "/b", "RequestsPerSecond": 1}]}"#,
                "Routes[0].PathExact",
            ),
            (
                r#"{"Routes": [{"PathPrefix": "api", "RequestsPerSecond": 1}]}"#,
                "Routes[0].PathPrefix",
            ),
            (
                r#"{"Routes": [{"PathRegex": "(", "RequestsPerSecond": 1}]}"#,
                "Routes[0].PathRegex",
            ),
            (r#"{"Routes": [{"PathExact": "/a"}]}"#, "Routes[0].RequestsPerSecond"),
        ] {
            let e = check(&format!(r#"{{"InstanceLevel": {bad}}}"#)).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let e = check(r#"{"InstanceLevel": {"RequestsPerSecnd": 5}}"#).unwrap_err();
        assert!(e.contains("RequestsPerSecnd"), "{e}");
    }
}
