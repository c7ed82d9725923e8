//! Results computed by the catalog for proxies: a service's resolved config, and the
//! services a gateway fronts.

use crate::proxy::OpaqueConfig;
use crate::{ExposeConfig, MeshGatewayConfig, ProxyMode, ServiceKind, TransparentProxyConfig};
use serde::{Deserialize, Serialize};

/// Central config resolved for one service: proxy-defaults merged with service-defaults,
/// plus per-upstream settings (Consul's `ServiceConfigResponse`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ResolvedServiceConfig {
    /// Proxy config from proxy-defaults, with `protocol` from service-defaults.
    #[serde(rename = "ProxyConfig")]
    pub proxy_config: OpaqueConfig,
    /// Config per upstream destination name (defaults merged with overrides).
    #[serde(rename = "UpstreamConfigs")]
    pub upstream_configs: Vec<ResolvedUpstreamConfig>,
    /// Mesh gateway mode.
    #[serde(rename = "MeshGateway")]
    pub mesh_gateway: MeshGatewayConfig,
    /// Exposed paths.
    #[serde(rename = "Expose")]
    pub expose: ExposeConfig,
    /// Transparent-proxy settings.
    #[serde(rename = "TransparentProxy")]
    pub transparent_proxy: TransparentProxyConfig,
    /// Proxy mode.
    #[serde(rename = "Mode")]
    pub mode: ProxyMode,
    /// Request rate limits (service-defaults `RateLimits`).
    #[serde(rename = "RateLimits", skip_serializing_if = "Option::is_none")]
    pub rate_limits: Option<crate::RateLimits>,
    /// Envoy extensions: proxy-defaults' then service-defaults'.
    #[serde(rename = "EnvoyExtensions", skip_serializing_if = "Vec::is_empty")]
    pub envoy_extensions: Vec<crate::config_entry::EnvoyExtension>,
    /// The service's addresses outside the mesh (service-defaults `Destination`): a
    /// terminating gateway linking it proxies to them.
    #[serde(rename = "Destination", skip_serializing_if = "Option::is_none")]
    pub destination: Option<crate::config_entry::DestinationConfig>,
}

impl ResolvedServiceConfig {
    /// The resolved protocol of the service (tcp when unset).
    pub fn protocol(&self) -> crate::Protocol {
        crate::ProxyOptions::parse(&self.proxy_config)
            .protocol
            .unwrap_or_default()
    }
}

/// Resolved config for one upstream destination.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ResolvedUpstreamConfig {
    /// Destination service name.
    #[serde(rename = "Upstream")]
    pub upstream: String,
    /// Opaque config (`protocol`, `connect_timeout_ms`).
    #[serde(rename = "Config")]
    pub config: OpaqueConfig,
}

/// A service fronted by a terminating or ingress gateway. On the wire, in Consul's shape:
/// `Gateway` and `Service` are `{"Name": ...}` objects (a plain string is accepted too) and
/// every field is present.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GatewayService {
    /// Gateway service name.
    #[serde(rename = "Gateway", with = "compound_name")]
    pub gateway: String,
    /// Fronted service name.
    #[serde(rename = "Service", with = "compound_name")]
    pub service: String,
    /// Kind of the gateway.
    #[serde(rename = "GatewayKind")]
    pub gateway_kind: ServiceKind,
    /// Listener port (ingress).
    #[serde(rename = "Port", skip_serializing_if = "crate::json::ser::is_default")]
    pub port: u16,
    /// Listener protocol (ingress).
    #[serde(rename = "Protocol", skip_serializing_if = "String::is_empty")]
    pub protocol: String,
    /// Hosts the service answers to (ingress); empty: consumers use `<service>.ingress.*`.
    #[serde(rename = "Hosts", skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// CA bundle to verify the external service (terminating).
    #[serde(rename = "CAFile", skip_serializing_if = "String::is_empty")]
    pub ca_file: String,
    /// Client certificate (terminating).
    #[serde(rename = "CertFile", skip_serializing_if = "String::is_empty")]
    pub cert_file: String,
    /// Client key (terminating).
    #[serde(rename = "KeyFile", skip_serializing_if = "String::is_empty")]
    pub key_file: String,
    /// SNI to send (terminating).
    #[serde(rename = "SNI", skip_serializing_if = "String::is_empty")]
    pub sni: String,
    /// Added by a `*` entry rather than by name.
    #[serde(rename = "FromWildcard", skip_serializing_if = "std::ops::Not::not")]
    pub from_wildcard: bool,
}

/// Consul's `CompoundServiceName` (`{"Name": "web"}`) for a plain service name; decoding also
/// takes a bare string.
mod compound_name {
    use serde::de::{self, MapAccess, Visitor};
    use serde::ser::SerializeMap;
    use serde::{Deserializer, Serializer};
    use std::fmt;

    pub(super) fn serialize<S: Serializer>(name: &str, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        map.serialize_entry("Name", name)?;
        map.end()
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        struct NameVisitor;
        impl<'de> Visitor<'de> for NameVisitor {
            type Value = String;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a service name or an object with a Name")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
                Ok(v.to_owned())
            }
            fn visit_unit<E: de::Error>(self) -> Result<String, E> {
                Ok(String::new())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
                let mut name = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key.eq_ignore_ascii_case("name") {
                        name = Some(map.next_value::<String>()?);
                    } else {
                        map.next_value::<de::IgnoredAny>()?;
                    }
                }
                name.ok_or_else(|| de::Error::missing_field("Name"))
            }
        }
        d.deserialize_any(NameVisitor)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn gateway_services_use_consuls_wire_shape() {
        let g = GatewayService {
            gateway: "ing".into(),
            service: "web".into(),
            gateway_kind: ServiceKind::IngressGateway,
            port: 8080,
            protocol: "http".into(),
            ..GatewayService::default()
        };
        let out = serde_json::to_value(&g).unwrap();
        assert_eq!(out["Gateway"], json!({"Name": "ing"}));
        assert_eq!(out["Service"], json!({"Name": "web"}));
        assert_eq!(out["GatewayKind"], "ingress-gateway");
        // Empty fields omitted, as Consul's `omitempty` does.
        for key in ["Hosts", "SNI", "FromWildcard", "CAFile"] {
            assert_eq!(out.get(key), None, "{key}");
        }
        assert_eq!(crate::json::from_value::<GatewayService>(out).unwrap(), g);
        let lenient: GatewayService = crate::json::from_value(
            json!({"gateway": "ing", "service": {"name": "web", "Namespace": "default"}, "GatewayKind": "ingress-gateway"}),
        )
        .unwrap();
        assert_eq!((lenient.gateway.as_str(), lenient.service.as_str()), ("ing", "web"));
    }
}
