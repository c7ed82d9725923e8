//! `proxy-defaults` and `service-defaults`.

use super::{ConfigEntryKind, check_entry_name};
use crate::proxy::OpaqueConfig;
use crate::validate::{Problem, Validate, ValidationError};
use crate::{ExposeConfig, Index, MeshGatewayConfig, ProxyMode, TransparentProxyConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Defaults for every proxy in the mesh (the single entry named `global`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyDefaults {
    /// Always `global`.
    #[serde(rename = "Name")]
    pub name: String,
    /// Opaque proxy config merged under each proxy's own; keys untouched. `null` when
    /// empty, as Consul writes it.
    #[serde(
        rename = "Config",
        serialize_with = "crate::json::ser::null_if_empty",
        deserialize_with = "crate::json::read::null_as_default"
    )]
    pub config: OpaqueConfig,
    /// Default proxy mode.
    #[serde(rename = "Mode", skip_serializing_if = "crate::json::ser::is_default")]
    pub mode: ProxyMode,
    /// Default transparent-proxy settings.
    #[serde(rename = "TransparentProxy")]
    pub transparent_proxy: TransparentProxyConfig,
    /// Default mesh gateway mode.
    #[serde(rename = "MeshGateway")]
    pub mesh_gateway: MeshGatewayConfig,
    /// Paths exposed without mTLS on every proxy.
    #[serde(rename = "Expose")]
    pub expose: ExposeConfig,
    /// Envoy access logs of every proxy, sidecars and gateways.
    #[serde(rename = "AccessLogs", skip_serializing_if = "AccessLogsConfig::is_off")]
    pub access_logs: AccessLogsConfig,
    /// Envoy extensions of every sidecar (before each service's own).
    #[serde(rename = "EnvoyExtensions", skip_serializing_if = "Vec::is_empty")]
    pub envoy_extensions: Vec<super::EnvoyExtension>,
    /// Consul's `MutualTLSMode`: only `strict` (see [`super::DefaultOnly`]).
    #[serde(rename = "MutualTLSMode", skip_serializing_if = "Option::is_none")]
    pub mutual_tls_mode: super::DefaultOnly,
    /// Consul's `FailoverPolicy`: not supported (failover is each resolver's).
    #[serde(rename = "FailoverPolicy", skip_serializing_if = "Option::is_none")]
    pub failover_policy: super::DefaultOnly,
    /// Consul's `PrioritizeByLocality`: only `none`.
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

impl Validate for ProxyDefaults {
    fn validate(&self) -> Result<(), ValidationError> {
        check_entry_name(ConfigEntryKind::ProxyDefaults, &self.name)?;
        if let Some(p) = self.config.get(crate::protocol::PROTOCOL_KEY) {
            check_protocol("Config.protocol", p.as_str().unwrap_or("<not a string>"))?;
        }
        crate::ProxyOptions::check_proxy(&self.config)?;
        crate::proxy::refuse_central_expose_checks(&self.expose)?;
        super::extensions::check_all(&self.envoy_extensions)?;
        super::check_mutual_tls_mode(&self.mutual_tls_mode)?;
        super::check_prioritize_by_locality(&self.prioritize_by_locality)?;
        super::check_default_only(
            "FailoverPolicy",
            &self.failover_policy,
            &[serde_json::json!({"Mode": "default"})],
            "failover follows each service-resolver's Failover (only Mode \"default\")",
        )?;
        self.access_logs.check("AccessLogs")
    }
}

/// Where access logs go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum AccessLogType {
    /// Envoy's standard output (the default).
    #[default]
    #[serde(rename = "stdout")]
    Stdout,
    /// Envoy's standard error.
    #[serde(rename = "stderr")]
    Stderr,
    /// A file (`Path`).
    #[serde(rename = "file")]
    File,
}

/// `proxy-defaults`' `AccessLogs`: Envoy access logs on every listener of every proxy, and
/// (unless `DisableListenerLogs`) one per connection no filter chain accepted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AccessLogsConfig {
    /// Log at all.
    #[serde(rename = "Enabled")]
    pub enabled: bool,
    /// No listener-level log for connections no filter chain accepted.
    #[serde(rename = "DisableListenerLogs")]
    pub disable_listener_logs: bool,
    /// Where: `stdout` (default), `stderr` or `file`.
    #[serde(rename = "Type")]
    pub log_type: AccessLogType,
    /// The file, with `Type: file` (Envoy's process writes it).
    #[serde(rename = "Path", skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// A JSON object of Envoy command operators, as text (one JSON line per request).
    #[serde(rename = "JSONFormat", skip_serializing_if = "String::is_empty")]
    pub json_format: String,
    /// Envoy's text format string.
    #[serde(rename = "TextFormat", skip_serializing_if = "String::is_empty")]
    pub text_format: String,
}

impl AccessLogsConfig {
    /// Nothing set: not written back.
    pub fn is_off(&self) -> bool {
        *self == Self::default()
    }

    /// The JSON format's fields, once checked: `None` without one.
    pub fn json_fields(&self) -> Option<serde_json::Map<String, serde_json::Value>> {
        serde_json::from_str(&self.json_format).ok()
    }

    /// Checks the settings, naming fields under `at`.
    pub fn check(&self, at: &str) -> Result<(), ValidationError> {
        let invalid = |field: &str, why: String| ValidationError::new(format!("{at}.{field}"), Problem::Invalid(why));
        match (self.log_type, self.path.is_empty()) {
            (AccessLogType::File, true) => return Err(invalid("Path", "is required with Type \"file\"".into())),
            (AccessLogType::Stdout | AccessLogType::Stderr, false) => {
                return Err(invalid("Path", "is only for Type \"file\"".into()));
            }
            _ => {}
        }
        if !self.json_format.is_empty() && !self.text_format.is_empty() {
            return Err(invalid("TextFormat", "JSONFormat and TextFormat are exclusive".into()));
        }
        if !self.json_format.is_empty() {
            let fields: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&self.json_format)
                .map_err(|e| invalid("JSONFormat", format!("is not a JSON object: {e}")))?;
            if fields.is_empty() {
                return Err(invalid("JSONFormat", "names no field".into()));
            }
            if let Some((k, _)) = fields.iter().find(|(_, v)| !(v.is_string() || v.is_object())) {
                return Err(invalid(
                    "JSONFormat",
                    format!("field {k:?}: a value is a format string or an object of them"),
                ));
            }
        }
        Ok(())
    }
}

/// Config applied to upstream connections, per destination or as defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Destination this override applies to (empty in `Defaults`).
    #[serde(rename = "Name", skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Protocol of the upstream.
    #[serde(rename = "Protocol", skip_serializing_if = "String::is_empty")]
    pub protocol: String,
    /// Connect timeout in milliseconds.
    #[serde(rename = "ConnectTimeoutMs", skip_serializing_if = "crate::json::ser::is_default")]
    pub connect_timeout_ms: u32,
    /// Mesh gateway mode for this upstream.
    #[serde(rename = "MeshGateway")]
    pub mesh_gateway: MeshGatewayConfig,
    /// Circuit breakers.
    #[serde(rename = "Limits", skip_serializing_if = "Option::is_none")]
    pub limits: Option<crate::protocol::UpstreamLimits>,
    /// Outlier detection.
    #[serde(rename = "PassiveHealthCheck", skip_serializing_if = "Option::is_none")]
    pub passive_health_check: Option<crate::protocol::PassiveHealthCheck>,
}

/// Upstream config of a service: per-destination overrides and defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamConfigs {
    /// Per-destination settings.
    #[serde(rename = "Overrides", skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<UpstreamConfig>,
    /// Settings for every other upstream.
    #[serde(rename = "Defaults", skip_serializing_if = "Option::is_none")]
    pub defaults: Option<UpstreamConfig>,
}

/// Defaults for one service: protocol, mode, upstream settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceDefaults {
    /// Service name.
    #[serde(rename = "Name")]
    pub name: String,
    /// `tcp` (default), `http`, `http2` or `grpc`.
    #[serde(rename = "Protocol")]
    pub protocol: String,
    /// Proxy mode.
    #[serde(rename = "Mode", skip_serializing_if = "crate::json::ser::is_default")]
    pub mode: ProxyMode,
    /// Transparent-proxy settings.
    #[serde(rename = "TransparentProxy")]
    pub transparent_proxy: TransparentProxyConfig,
    /// Mesh gateway mode.
    #[serde(rename = "MeshGateway")]
    pub mesh_gateway: MeshGatewayConfig,
    /// Paths exposed without mTLS.
    #[serde(rename = "Expose")]
    pub expose: ExposeConfig,
    /// SNI of an external (non-mesh) service.
    #[serde(rename = "ExternalSNI", skip_serializing_if = "String::is_empty")]
    pub external_sni: String,
    /// Settings for this service's upstreams.
    #[serde(rename = "UpstreamConfig", skip_serializing_if = "Option::is_none")]
    pub upstream_config: Option<UpstreamConfigs>,
    /// The service is outside the mesh at these addresses: transparent sidecars reach it
    /// through a terminating gateway that links it.
    #[serde(rename = "Destination", skip_serializing_if = "Option::is_none")]
    pub destination: Option<DestinationConfig>,
    /// Inbound connection limit (0 = none).
    #[serde(
        rename = "MaxInboundConnections",
        skip_serializing_if = "crate::json::ser::is_default"
    )]
    pub max_inbound_connections: u32,
    /// Connect timeout to the local application, ms.
    #[serde(
        rename = "LocalConnectTimeoutMs",
        skip_serializing_if = "crate::json::ser::is_default"
    )]
    pub local_connect_timeout_ms: u32,
    /// Request timeout to the local application, ms.
    #[serde(
        rename = "LocalRequestTimeoutMs",
        skip_serializing_if = "crate::json::ser::is_default"
    )]
    pub local_request_timeout_ms: u32,
    /// `exact_balance`: the public listener spreads connections evenly over Envoy's worker
    /// threads.
    #[serde(rename = "BalanceInboundConnections", skip_serializing_if = "String::is_empty")]
    pub balance_inbound_connections: String,
    /// Request rate limits on the service's instances (HTTP protocols).
    #[serde(rename = "RateLimits", skip_serializing_if = "Option::is_none")]
    pub rate_limits: Option<crate::RateLimits>,
    /// Envoy extensions of the service's sidecars (after proxy-defaults').
    #[serde(rename = "EnvoyExtensions", skip_serializing_if = "Vec::is_empty")]
    pub envoy_extensions: Vec<super::EnvoyExtension>,
    /// Consul's `MutualTLSMode`: only `strict` (see [`super::DefaultOnly`]).
    #[serde(rename = "MutualTLSMode", skip_serializing_if = "Option::is_none")]
    pub mutual_tls_mode: super::DefaultOnly,
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

impl ServiceDefaults {
    /// The inbound settings this entry sets, as the proxy `Config` keys they stand for (the
    /// proxy's own `Config` still wins over them).
    pub fn inbound_settings(&self) -> Vec<(&'static str, serde_json::Value)> {
        let mut out = Vec::new();
        for (key, n) in [
            ("max_inbound_connections", self.max_inbound_connections),
            ("local_connect_timeout_ms", self.local_connect_timeout_ms),
            ("local_request_timeout_ms", self.local_request_timeout_ms),
        ] {
            if n != 0 {
                out.push((key, serde_json::Value::from(n)));
            }
        }
        if !self.balance_inbound_connections.is_empty() {
            out.push((
                "balance_inbound_connections",
                serde_json::Value::from(self.balance_inbound_connections.clone()),
            ));
        }
        out
    }
}

impl Validate for ServiceDefaults {
    fn validate(&self) -> Result<(), ValidationError> {
        check_entry_name(ConfigEntryKind::ServiceDefaults, &self.name)?;
        super::check_mutual_tls_mode(&self.mutual_tls_mode)?;
        if !self.protocol.is_empty() {
            check_protocol("Protocol", &self.protocol)?;
        }
        crate::proxy::refuse_central_expose_checks(&self.expose)?;
        if !self.external_sni.is_empty() {
            return Err(ValidationError::new(
                "ExternalSNI",
                Problem::Invalid("is not supported by meshd yet (it would be ignored); remove it".into()),
            ));
        }
        if !matches!(self.balance_inbound_connections.as_str(), "" | "exact_balance") {
            return Err(ValidationError::new(
                "BalanceInboundConnections",
                Problem::Invalid(format!(
                    "{:?} is not a balance type (the only one is \"exact_balance\")",
                    self.balance_inbound_connections
                )),
            ));
        }
        if let Some(r) = &self.rate_limits {
            r.check("RateLimits")?;
        }
        super::extensions::check_all(&self.envoy_extensions)?;
        if let Some(d) = &self.destination {
            if self.upstream_config.is_some() {
                return Err(ValidationError::new(
                    "Destination",
                    Problem::NotAllowed("with UpstreamConfig: a destination outside the mesh has no upstreams"),
                ));
            }
            d.check("Destination")?;
        }
        if let Some(uc) = &self.upstream_config {
            for (i, o) in uc.overrides.iter().enumerate() {
                let at = format!("UpstreamConfig.Overrides[{i}]");
                crate::validate::check_name(&format!("{at}.Name"), &o.name, "")?;
                if !o.protocol.is_empty() {
                    check_protocol(&format!("{at}.Protocol"), &o.protocol)?;
                }
                if let Some(p) = &o.passive_health_check {
                    p.check(&format!("{at}.PassiveHealthCheck"))?;
                }
            }
            if let Some(d) = &uc.defaults {
                if !d.name.is_empty() {
                    return Err(ValidationError::new(
                        "UpstreamConfig.Defaults.Name",
                        Problem::NotAllowed("in Defaults: it applies to every upstream"),
                    ));
                }
                if !d.protocol.is_empty() {
                    check_protocol("UpstreamConfig.Defaults.Protocol", &d.protocol)?;
                }
                if let Some(p) = &d.passive_health_check {
                    p.check("UpstreamConfig.Defaults.PassiveHealthCheck")?;
                }
            }
        }
        Ok(())
    }
}

/// A service outside the mesh (service-defaults `Destination`): its addresses (IPs or DNS
/// names) and its port.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DestinationConfig {
    /// IP addresses (v4 or v6) or DNS names.
    #[serde(rename = "Addresses")]
    pub addresses: Vec<String>,
    /// The port the service listens on at each address.
    #[serde(rename = "Port")]
    pub port: u16,
}

impl DestinationConfig {
    /// Checks the addresses (at least one; each an IP or a DNS name, no wildcard, none
    /// twice) and the port (set), errors naming the field under `at`.
    pub fn check(&self, at: &str) -> Result<(), ValidationError> {
        if self.addresses.is_empty() {
            return Err(ValidationError::new(
                format!("{at}.Addresses"),
                Problem::Required("(at least one IP address or host name)"),
            ));
        }
        for (i, address) in self.addresses.iter().enumerate() {
            let field = format!("{at}.Addresses[{i}]");
            if address.parse::<std::net::IpAddr>().is_err() && !is_dns_name(address) {
                return Err(ValidationError::new(
                    field,
                    Problem::Invalid(format!(
                        "{address:?} is neither an IP address nor a host name (letters, digits and '-' in dot-separated labels; no wildcards)"
                    )),
                ));
            }
            if self.addresses[..i].contains(address) {
                return Err(ValidationError::new(
                    field,
                    Problem::Duplicate(format!("{address:?} is listed twice")),
                ));
            }
        }
        crate::validate::check_port(
            &format!("{at}.Port"),
            self.port,
            "(the port the destination listens on)",
        )
    }

    /// True when `address` (one of the addresses) is an IP address, not a name.
    pub fn is_ip(address: &str) -> bool {
        address.parse::<std::net::IpAddr>().is_ok()
    }
}

/// A DNS host name: dot-separated labels of letters, digits and inner hyphens, each 1 to 63
/// characters, 253 in all; a trailing dot allowed.
fn is_dns_name(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

pub(crate) fn check_protocol(field: &str, protocol: &str) -> Result<(), ValidationError> {
    protocol
        .parse::<crate::Protocol>()
        .map(drop)
        .map_err(|e| ValidationError::new(field, Problem::Invalid(e.to_string())))
}

#[cfg(test)]
mod access_log_tests {
    use super::*;

    fn entry(json: &str) -> Result<(), String> {
        let pd: ProxyDefaults = serde_json::from_str(json).map_err(|e| e.to_string())?;
        pd.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn access_logs_are_checked_naming_the_field() {
        assert!(entry(r#"{"Name": "global", "AccessLogs": {"Enabled": true}}"#).is_ok());
        assert!(
            entry(
                r#"{"Name": "global", "AccessLogs": {"Enabled": true, "Type": "file", "Path": "/tmp/a.log",
                                                         "JSONFormat": "{\"path\": \"%REQ(:PATH)%\"}"}}"#
            )
            .is_ok()
        );
        for (bad, says) in [
            (r#"{"Type": "file"}"#, "AccessLogs.Path"),
            (r#"{"Type": "stdout", "Path": "/x"}"#, "AccessLogs.Path"),
            (
                r#"{"JSONFormat": "{\"a\": \"%START_TIME%\"}", "TextFormat": "%START_TIME%"}"#,
                "AccessLogs.TextFormat",
            ),
            (r#"{"JSONFormat": "not json"}"#, "AccessLogs.JSONFormat"),
            (r#"{"JSONFormat": "{\"a\": 1}"}"#, "AccessLogs.JSONFormat"),
        ] {
            let e = entry(&format!(r#"{{"Name": "global", "AccessLogs": {bad}}}"#)).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let e = entry(r#"{"Name": "global", "AccessLogs": {"Type": "syslog"}}"#).unwrap_err();
        assert!(e.contains("syslog"), "{e}");
    }
}
