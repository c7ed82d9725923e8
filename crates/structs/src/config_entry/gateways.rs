//! `ingress-gateway` and `terminating-gateway`: what a gateway lets into the mesh and what it
//! lets out of it.

use super::HttpHeaderModifiers;
use crate::Index;
use crate::protocol::PassiveHealthCheck;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A certificate an external SDS server provides (the cluster is in Envoy's bootstrap).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayTlsSdsConfig {
    /// The bootstrap cluster of the SDS server.
    #[serde(rename = "ClusterName", skip_serializing_if = "String::is_empty")]
    pub cluster_name: String,
    /// The certificate's name on that server.
    #[serde(rename = "CertResource", skip_serializing_if = "String::is_empty")]
    pub cert_resource: String,
}

/// TLS on a gateway or on one of its listeners.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayTlsConfig {
    /// Serve TLS with a certificate from the mesh CA (the gateway's leaf, with the listener's
    /// hosts as DNS SANs).
    #[serde(rename = "Enabled")]
    pub enabled: bool,
    /// Serve TLS with a certificate from an external SDS server instead.
    #[serde(rename = "SDS", skip_serializing_if = "Option::is_none")]
    pub sds: Option<GatewayTlsSdsConfig>,
    /// `TLSv1_0` .. `TLSv1_3`, or empty for Envoy's default.
    #[serde(rename = "TLSMinVersion", skip_serializing_if = "String::is_empty")]
    pub tls_min_version: String,
    /// `TLSv1_0` .. `TLSv1_3`, or empty for Envoy's default.
    #[serde(rename = "TLSMaxVersion", skip_serializing_if = "String::is_empty")]
    pub tls_max_version: String,
    /// Cipher suites (TLS 1.2 and below).
    #[serde(rename = "CipherSuites", skip_serializing_if = "Vec::is_empty")]
    pub cipher_suites: Vec<String>,
}

/// TLS of one service on an ingress listener (a certificate of its own, over SDS).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayServiceTlsConfig {
    /// The service's certificate from an external SDS server.
    #[serde(rename = "SDS", skip_serializing_if = "Option::is_none")]
    pub sds: Option<GatewayTlsSdsConfig>,
}

/// Limits applied to the upstream cluster of an ingress service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IngressServiceConfig {
    /// Most connections to all instances (0: Envoy's default).
    #[serde(rename = "MaxConnections")]
    pub max_connections: u32,
    /// Most requests waiting for a connection (0: Envoy's default).
    #[serde(rename = "MaxPendingRequests")]
    pub max_pending_requests: u32,
    /// Most requests in flight (0: Envoy's default).
    #[serde(rename = "MaxConcurrentRequests")]
    pub max_concurrent_requests: u32,
    /// Outlier detection.
    #[serde(rename = "PassiveHealthCheck", skip_serializing_if = "Option::is_none")]
    pub passive_health_check: Option<PassiveHealthCheck>,
}

/// A service exposed on an ingress listener.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IngressService {
    /// Service name, or `*` for every service of the listener's protocol (http listeners).
    #[serde(rename = "Name")]
    pub name: String,
    /// Only `default` (or empty).
    #[serde(rename = "Namespace", skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Only `default` (or empty).
    #[serde(rename = "Partition", skip_serializing_if = "String::is_empty")]
    pub partition: String,
    /// Host names routed to the service (http listeners); empty: `<name>.ingress.*`.
    #[serde(
        rename = "Hosts",
        serialize_with = "crate::json::ser::null_if_empty",
        deserialize_with = "crate::json::read::null_as_default"
    )]
    pub hosts: Vec<String>,
    /// The service's own certificate.
    #[serde(rename = "TLS", skip_serializing_if = "Option::is_none")]
    pub tls: Option<GatewayServiceTlsConfig>,
    /// Changes to requests before they go to the service.
    #[serde(rename = "RequestHeaders", skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<HttpHeaderModifiers>,
    /// Changes to responses before they go to the caller.
    #[serde(rename = "ResponseHeaders", skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<HttpHeaderModifiers>,
    /// Most connections (0: the entry's default).
    #[serde(rename = "MaxConnections", skip_serializing_if = "crate::json::ser::is_default")]
    pub max_connections: u32,
    /// Most pending requests (0: the entry's default).
    #[serde(rename = "MaxPendingRequests", skip_serializing_if = "crate::json::ser::is_default")]
    pub max_pending_requests: u32,
    /// Most concurrent requests (0: the entry's default).
    #[serde(
        rename = "MaxConcurrentRequests",
        skip_serializing_if = "crate::json::ser::is_default"
    )]
    pub max_concurrent_requests: u32,
    /// Outlier detection (`None`: the entry's default).
    #[serde(rename = "PassiveHealthCheck", skip_serializing_if = "Option::is_none")]
    pub passive_health_check: Option<PassiveHealthCheck>,
    /// User metadata.
    #[serde(rename = "Meta", skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
}

/// One port of an ingress gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IngressListener {
    /// The port the gateway listens on.
    #[serde(rename = "Port")]
    pub port: u16,
    /// `tcp` (default), `http`, `http2` or `grpc`.
    #[serde(rename = "Protocol", skip_serializing_if = "String::is_empty")]
    pub protocol: String,
    /// TLS for this listener (overrides the gateway's).
    #[serde(rename = "TLS", skip_serializing_if = "Option::is_none")]
    pub tls: Option<GatewayTlsConfig>,
    /// The services reached through it.
    #[serde(rename = "Services")]
    pub services: Vec<IngressService>,
}

impl IngressListener {
    /// The listener's protocol (tcp when unset).
    pub fn protocol(&self) -> &str {
        if self.protocol.is_empty() {
            "tcp"
        } else {
            &self.protocol
        }
    }
}

/// The `ingress-gateway` config entry (named after the gateway service).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IngressGateway {
    /// The gateway service's name.
    #[serde(rename = "Name")]
    pub name: String,
    /// TLS for every listener.
    #[serde(rename = "TLS")]
    pub tls: GatewayTlsConfig,
    /// Listeners by port.
    #[serde(
        rename = "Listeners",
        serialize_with = "crate::json::ser::null_if_empty",
        deserialize_with = "crate::json::read::null_as_default"
    )]
    pub listeners: Vec<IngressListener>,
    /// Limits for services that set none.
    #[serde(rename = "Defaults", skip_serializing_if = "Option::is_none")]
    pub defaults: Option<IngressServiceConfig>,
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

/// The DNS domain of ingress gateways' default hosts (`<service>.ingress.<domain>`), as
/// Consul's.
pub const INGRESS_DOMAIN: &str = "consul";

impl IngressGateway {
    /// Whether the gateway's certificate may carry `name` as a DNS SAN: a host one of its
    /// listeners' services answers to, or a default `<service>.ingress.<domain>` or
    /// `<service>.ingress.<datacenter>.<domain>` of a service it lists (any service with `*`).
    /// A CSR asking for anything else is refused: a gateway claims only its own names.
    pub fn may_claim_dns_name(&self, name: &str, datacenter: &str) -> bool {
        let domain = INGRESS_DOMAIN;
        let default_of = |service: &str| {
            let Some((label, rest)) = name.split_once('.') else {
                return false;
            };
            let under_ingress = rest == format!("ingress.{domain}") || rest == format!("ingress.{datacenter}.{domain}");
            under_ingress && (service == "*" && !label.contains('*') || label == service)
        };
        self.listeners
            .iter()
            .flat_map(|l| &l.services)
            .any(|s| s.hosts.iter().any(|h| h == name) || default_of(&s.name))
    }
}

/// A service outside the mesh that a terminating gateway represents.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinkedService {
    /// Service name, or `*` for every service.
    #[serde(rename = "Name")]
    pub name: String,
    /// Only `default` (or empty).
    #[serde(rename = "Namespace", skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Only `default` (or empty).
    #[serde(rename = "Partition", skip_serializing_if = "String::is_empty")]
    pub partition: String,
    /// CA bundle (a file on the gateway's host) to verify the service; set: TLS is originated.
    #[serde(rename = "CAFile", skip_serializing_if = "String::is_empty")]
    pub ca_file: String,
    /// Client certificate (file) to present to the service.
    #[serde(rename = "CertFile", skip_serializing_if = "String::is_empty")]
    pub cert_file: String,
    /// Its key (file).
    #[serde(rename = "KeyFile", skip_serializing_if = "String::is_empty")]
    pub key_file: String,
    /// Server name to send (and verify).
    #[serde(rename = "SNI", skip_serializing_if = "String::is_empty")]
    pub sni: String,
}

/// The `terminating-gateway` config entry (named after the gateway service).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TerminatingGateway {
    /// The gateway service's name.
    #[serde(rename = "Name")]
    pub name: String,
    /// The services it represents.
    #[serde(
        rename = "Services",
        serialize_with = "crate::json::ser::null_if_empty",
        deserialize_with = "crate::json::read::null_as_default"
    )]
    pub services: Vec<LinkedService>,
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
