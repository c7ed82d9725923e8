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

/// A service fronted by a terminating or ingress gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GatewayService {
    /// Gateway service name.
    #[serde(rename = "Gateway")]
    pub gateway: String,
    /// Fronted service name.
    #[serde(rename = "Service")]
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
    /// Hosts the service answers to (ingress).
    #[serde(rename = "Hosts")]
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
