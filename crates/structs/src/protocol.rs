//! The application protocols the mesh understands, and the proxy config keys meshd reads
//! from the opaque `Proxy.Config` and `Upstreams[].Config` maps, parsed in one place.

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use serde_json::{Map, Value};
use std::{fmt, str::FromStr};

/// Opaque, user-owned configuration (`Proxy.Config`, `Upstreams[].Config`): keys are kept as
/// given and in order.
pub type OpaqueConfig = Map<String, Value>;

/// An application protocol (Consul's `Protocol` values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// Opaque TCP (the default).
    #[default]
    Tcp,
    /// HTTP/1.1.
    Http,
    /// HTTP/2.
    Http2,
    /// gRPC (HTTP/2).
    Grpc,
}

/// A protocol the mesh does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported protocol {0:?}: expected tcp, http, http2 or grpc")]
pub struct UnknownProtocol(pub String);

impl Protocol {
    /// Consul's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Http => "http",
            Protocol::Http2 => "http2",
            Protocol::Grpc => "grpc",
        }
    }

    /// True for the protocols Envoy handles at L7 (HTTP connection manager, routes).
    pub fn is_http(self) -> bool {
        !matches!(self, Protocol::Tcp)
    }

    /// True when the upstream connection must speak HTTP/2.
    pub fn is_http2(self) -> bool {
        matches!(self, Protocol::Http2 | Protocol::Grpc)
    }
}

impl FromStr for Protocol {
    type Err = UnknownProtocol;
    fn from_str(s: &str) -> Result<Self, UnknownProtocol> {
        Ok(match s {
            "tcp" => Protocol::Tcp,
            "http" => Protocol::Http,
            "http2" => Protocol::Http2,
            "grpc" => Protocol::Grpc,
            _ => return Err(UnknownProtocol(s.to_owned())),
        })
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Protocol {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Protocol {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

/// The keys of an opaque proxy or upstream config map that meshd acts on, typed. The map
/// itself stays as the user wrote it (other keys are kept and shown untouched); this is the
/// one place its keys are named and read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyOptions {
    /// `protocol`: the application protocol (unset or unknown: `None`).
    pub protocol: Option<Protocol>,
    /// `bind_address`: the address the public listener binds.
    pub bind_address: Option<String>,
    /// `connect_timeout_ms`: an upstream's connect timeout.
    pub connect_timeout_ms: Option<u32>,
    /// `limits`: an upstream's circuit breakers.
    pub limits: Option<UpstreamLimits>,
    /// `passive_health_check`: an upstream's outlier detection.
    pub passive_health_check: Option<PassiveHealthCheck>,
    /// `envoy_dns_discovery_type`: how a gateway resolves services registered by host name.
    pub dns_discovery_type: Option<DnsDiscoveryType>,
}

/// How Envoy resolves a cluster of host names (`envoy_dns_discovery_type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DnsDiscoveryType {
    /// `LOGICAL_DNS` (the default): one host name, connections to the first address it
    /// resolves to.
    #[default]
    Logical,
    /// `STRICT_DNS`: every host name, balanced over every address each resolves to.
    Strict,
}

impl DnsDiscoveryType {
    /// The value in a config map (any case), or `None` when it is neither.
    pub fn parse(value: &str) -> Option<Self> {
        if value.eq_ignore_ascii_case("LOGICAL_DNS") {
            Some(Self::Logical)
        } else if value.eq_ignore_ascii_case("STRICT_DNS") {
            Some(Self::Strict)
        } else {
            None
        }
    }
}

/// Circuit breakers of an upstream (Envoy's defaults where unset).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamLimits {
    /// Most connections to all instances.
    #[serde(
        rename = "MaxConnections",
        alias = "max_connections",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_connections: Option<u32>,
    /// Most requests waiting for a connection.
    #[serde(
        rename = "MaxPendingRequests",
        alias = "max_pending_requests",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_pending_requests: Option<u32>,
    /// Most requests in flight.
    #[serde(
        rename = "MaxConcurrentRequests",
        alias = "max_concurrent_requests",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_concurrent_requests: Option<u32>,
}

/// Outlier detection of an upstream: instances that keep failing are ejected for a while.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PassiveHealthCheck {
    /// Time between ejection sweeps.
    #[serde(
        rename = "Interval",
        alias = "interval",
        skip_serializing_if = "crate::GoDuration::is_zero"
    )]
    pub interval: crate::GoDuration,
    /// Consecutive 5xx (or connect failures) before an instance is ejected.
    #[serde(
        rename = "MaxFailures",
        alias = "max_failures",
        skip_serializing_if = "crate::json::ser::is_default"
    )]
    pub max_failures: u32,
    /// Percent chance an ejection on consecutive 5xx is enforced (default 100).
    #[serde(
        rename = "EnforcingConsecutive5xx",
        alias = "enforcing_consecutive_5xx",
        skip_serializing_if = "Option::is_none"
    )]
    pub enforcing_consecutive_5xx: Option<u32>,
    /// Most instances ejected at once, percent.
    #[serde(
        rename = "MaxEjectionPercent",
        alias = "max_ejection_percent",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_ejection_percent: Option<u32>,
    /// Base ejection time (multiplied by the ejection count).
    #[serde(
        rename = "BaseEjectionTime",
        alias = "base_ejection_time",
        skip_serializing_if = "Option::is_none"
    )]
    pub base_ejection_time: Option<crate::GoDuration>,
}

impl PassiveHealthCheck {
    /// Checks the percentages, naming fields under `at`.
    pub fn check(&self, at: &str) -> Result<(), crate::ValidationError> {
        for (field, v) in [
            ("EnforcingConsecutive5xx", self.enforcing_consecutive_5xx),
            ("MaxEjectionPercent", self.max_ejection_percent),
        ] {
            if v.is_some_and(|v| v > 100) {
                return Err(crate::ValidationError::new(
                    format!("{at}.{field}"),
                    crate::Problem::OutOfRange { min: 0, max: 100 },
                ));
            }
        }
        Ok(())
    }
}

/// Key of the protocol in opaque config maps.
pub const PROTOCOL_KEY: &str = "protocol";
/// Key of the public listener's bind address.
pub const BIND_ADDRESS_KEY: &str = "bind_address";
/// Key of an upstream's connect timeout, milliseconds.
pub const CONNECT_TIMEOUT_MS_KEY: &str = "connect_timeout_ms";
/// Key of an upstream's circuit breakers.
pub const LIMITS_KEY: &str = "limits";
/// Key of an upstream's outlier detection.
pub const PASSIVE_HEALTH_CHECK_KEY: &str = "passive_health_check";
/// Key of a gateway's DNS discovery type for services registered by host name.
pub const DNS_DISCOVERY_TYPE_KEY: &str = "envoy_dns_discovery_type";

/// The whole-number keys of a sidecar's inbound side ([`InboundOptions`]).
const INBOUND_NUMBERS: [&str; 4] = [
    "local_connect_timeout_ms",
    "local_request_timeout_ms",
    "local_idle_timeout_ms",
    "max_inbound_connections",
];
/// Key of the public listener's connection balancing.
const BALANCE_INBOUND_KEY: &str = "balance_inbound_connections";

/// A sidecar's inbound settings, Consul's `Config` keys: the proxy's own over
/// `proxy-defaults`'. Zero or absent means Envoy's (or meshd's) default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InboundOptions {
    /// `local_connect_timeout_ms`: connecting to the local application (default 5 s).
    pub local_connect_timeout_ms: Option<u32>,
    /// `local_request_timeout_ms`: a request to the local application (HTTP only; Envoy's
    /// default 15 s, 0 none).
    pub local_request_timeout_ms: Option<u32>,
    /// `local_idle_timeout_ms`: a stream (HTTP) or connection (TCP) to the local
    /// application with nothing sent.
    pub local_idle_timeout_ms: Option<u32>,
    /// `max_inbound_connections`: connections to the local application at once.
    pub max_inbound_connections: Option<u32>,
    /// `balance_inbound_connections = "exact_balance"`: the public listener spreads
    /// connections evenly over Envoy's worker threads.
    pub exact_balance: bool,
}

impl InboundOptions {
    /// The settings `own` (a proxy's `Config`) gives, else `defaults` (proxy-defaults').
    pub fn parse(own: &OpaqueConfig, defaults: &OpaqueConfig) -> Self {
        let get = |key: &str| own.get(key).or_else(|| defaults.get(key));
        let number = |key: &str| get(key).and_then(|v| v.as_u64()).and_then(|v| u32::try_from(v).ok());
        Self {
            local_connect_timeout_ms: number(INBOUND_NUMBERS[0]),
            local_request_timeout_ms: number(INBOUND_NUMBERS[1]),
            local_idle_timeout_ms: number(INBOUND_NUMBERS[2]),
            max_inbound_connections: number(INBOUND_NUMBERS[3]).filter(|n| *n > 0),
            exact_balance: get(BALANCE_INBOUND_KEY).and_then(|v| v.as_str()) == Some("exact_balance"),
        }
    }

    /// Checks the inbound keys of a `Config`, naming the field.
    fn check(config: &OpaqueConfig) -> Result<(), crate::ValidationError> {
        for key in INBOUND_NUMBERS {
            if let Some(v) = config.get(key)
                && v.as_u64().is_none_or(|v| u32::try_from(v).is_err())
            {
                return Err(crate::ValidationError::new(
                    format!("Config.{key}"),
                    crate::Problem::Invalid(format!("{v} is not a whole number (at most {})", u32::MAX)),
                ));
            }
        }
        if let Some(v) = config.get(BALANCE_INBOUND_KEY)
            && !matches!(v.as_str(), Some("" | "exact_balance"))
        {
            return Err(crate::ValidationError::new(
                format!("Config.{BALANCE_INBOUND_KEY}"),
                crate::Problem::Invalid(format!("{v} is not supported: the one balancing is \"exact_balance\"")),
            ));
        }
        Ok(())
    }
}

impl ProxyOptions {
    /// Reads the keys meshd acts on from `config` (values of the wrong type are ignored here;
    /// validation refuses them at write time).
    pub fn parse(config: &OpaqueConfig) -> Self {
        Self {
            protocol: config
                .get(PROTOCOL_KEY)
                .and_then(|v| v.as_str())
                .and_then(|s| s.parse().ok()),
            bind_address: config
                .get(BIND_ADDRESS_KEY)
                .and_then(|v| v.as_str())
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
            connect_timeout_ms: config
                .get(CONNECT_TIMEOUT_MS_KEY)
                .and_then(|v| v.as_u64())
                .and_then(|v| u32::try_from(v).ok()),
            limits: config.get(LIMITS_KEY).and_then(|v| UpstreamLimits::deserialize(v).ok()),
            passive_health_check: config
                .get(PASSIVE_HEALTH_CHECK_KEY)
                .and_then(|v| PassiveHealthCheck::deserialize(v).ok()),
            dns_discovery_type: config
                .get(DNS_DISCOVERY_TYPE_KEY)
                .and_then(|v| v.as_str())
                .and_then(DnsDiscoveryType::parse),
        }
    }

    /// Checks the typed keys of a proxy's (or `proxy-defaults`') `Config`, naming the field.
    pub fn check_proxy(config: &OpaqueConfig) -> Result<(), crate::ValidationError> {
        InboundOptions::check(config)?;
        crate::bootstrap::BootstrapOptions::check(config)?;
        if let Some(v) = config.get(DNS_DISCOVERY_TYPE_KEY)
            && v.as_str().and_then(DnsDiscoveryType::parse).is_none()
        {
            return Err(crate::ValidationError::new(
                format!("Config.{DNS_DISCOVERY_TYPE_KEY}"),
                crate::Problem::Invalid(format!("{v} is not LOGICAL_DNS or STRICT_DNS")),
            ));
        }
        Ok(())
    }

    /// Checks the typed keys of an upstream's `Config`, naming the field.
    pub fn check_upstream(config: &OpaqueConfig) -> Result<(), crate::ValidationError> {
        crate::bootstrap::check_escape_hatch(config, crate::bootstrap::UPSTREAM_LISTENER_KEY, envoy_json::LISTENER)?;
        crate::bootstrap::check_escape_hatch(config, crate::bootstrap::UPSTREAM_CLUSTER_KEY, envoy_json::CLUSTER)?;
        if let Some(v) = config.get(LIMITS_KEY) {
            UpstreamLimits::deserialize(v)
                .map_err(|e| crate::ValidationError::new("Config.limits", crate::Problem::Invalid(e.to_string())))?;
        }
        if let Some(v) = config.get(PASSIVE_HEALTH_CHECK_KEY) {
            PassiveHealthCheck::deserialize(v)
                .map_err(|e| {
                    crate::ValidationError::new("Config.passive_health_check", crate::Problem::Invalid(e.to_string()))
                })?
                .check("Config.passive_health_check")?;
        }
        if let Some(v) = config.get(CONNECT_TIMEOUT_MS_KEY)
            && v.as_u64().is_none_or(|v| u32::try_from(v).is_err())
        {
            return Err(crate::ValidationError::new(
                "Config.connect_timeout_ms",
                crate::Problem::Invalid("must be a whole number of milliseconds".into()),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn protocols_parse_print_and_classify() {
        for p in [Protocol::Tcp, Protocol::Http, Protocol::Http2, Protocol::Grpc] {
            assert_eq!(p.as_str().parse::<Protocol>(), Ok(p));
            assert_eq!(serde_json::to_value(p).ok(), Some(json!(p.as_str())));
        }
        assert!(Protocol::Grpc.is_http2() && Protocol::Grpc.is_http() && !Protocol::Tcp.is_http());
        assert_eq!("udp".parse::<Protocol>(), Err(UnknownProtocol("udp".into())));
    }

    #[test]
    fn options_read_the_known_keys_and_ignore_the_rest() {
        let config: OpaqueConfig = serde_json::from_value(json!({
            "protocol": "http2", "bind_address": "0.0.0.0", "connect_timeout_ms": 250,
            "envoy_stats_flush_interval": "5s"
        }))
        .unwrap_or_default();
        let o = ProxyOptions::parse(&config);
        assert_eq!(o.protocol, Some(Protocol::Http2));
        assert_eq!(o.bind_address.as_deref(), Some("0.0.0.0"));
        assert_eq!(o.connect_timeout_ms, Some(250));
        assert_eq!(ProxyOptions::parse(&OpaqueConfig::default()), ProxyOptions::default());
    }

    #[test]
    fn the_dns_discovery_type_is_read_in_any_case_and_checked() {
        let config = |v: serde_json::Value| -> OpaqueConfig {
            serde_json::from_value(json!({ "envoy_dns_discovery_type": v })).unwrap_or_default()
        };
        assert_eq!(
            ProxyOptions::parse(&config(json!("strict_dns"))).dns_discovery_type,
            Some(DnsDiscoveryType::Strict)
        );
        assert_eq!(
            ProxyOptions::parse(&config(json!("LOGICAL_DNS"))).dns_discovery_type,
            Some(DnsDiscoveryType::Logical)
        );
        assert!(ProxyOptions::check_proxy(&config(json!("STRICT_DNS"))).is_ok());
        for bad in [json!("EDS"), json!(1)] {
            let err = ProxyOptions::check_proxy(&config(bad)).unwrap_err().to_string();
            assert!(err.starts_with("Config.envoy_dns_discovery_type: "), "{err}");
        }
    }
}

#[cfg(test)]
mod inbound_tests {
    use super::*;
    use serde_json::json;

    fn config(v: serde_json::Value) -> OpaqueConfig {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn inbound_settings_take_the_proxys_own_over_the_defaults_and_refuse_bad_values() {
        let own = config(json!({"local_request_timeout_ms": 0, "balance_inbound_connections": "exact_balance"}));
        let defaults = config(
            json!({"local_request_timeout_ms": 9000, "local_connect_timeout_ms": 250,
                                     "max_inbound_connections": 10}),
        );
        let o = InboundOptions::parse(&own, &defaults);
        assert_eq!(
            o.local_request_timeout_ms,
            Some(0),
            "the proxy's own 0 (no timeout) wins"
        );
        assert_eq!(o.local_connect_timeout_ms, Some(250));
        assert_eq!(o.max_inbound_connections, Some(10));
        assert!(o.exact_balance);
        for (bad, field) in [
            (json!({"local_idle_timeout_ms": "5s"}), "Config.local_idle_timeout_ms"),
            (json!({"max_inbound_connections": -1}), "Config.max_inbound_connections"),
            (
                json!({"balance_inbound_connections": "round_robin"}),
                "Config.balance_inbound_connections",
            ),
        ] {
            let e = ProxyOptions::check_proxy(&config(bad)).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }
}
