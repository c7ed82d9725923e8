//! Services registered in the catalog, including proxies and gateways.

use crate::validate::{Problem, Validate, ValidationError, check_name, check_port};
use crate::{ConnectProxyConfig, Index};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use std::{collections::BTreeMap, fmt, str::FromStr};

/// What a service is: an application, or one of the mesh's proxies and gateways.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServiceKind {
    /// An ordinary application service (Consul writes it as `""`).
    #[default]
    Typical,
    /// A sidecar proxy for one service instance.
    ConnectProxy,
    /// A gateway between datacenters or partitions.
    MeshGateway,
    /// A gateway from the mesh to services outside it.
    TerminatingGateway,
    /// A gateway from outside into the mesh.
    IngressGateway,
    /// An API gateway (Consul's `api-gateway`).
    ApiGateway,
}

impl ServiceKind {
    /// Consul's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceKind::Typical => "",
            ServiceKind::ConnectProxy => "connect-proxy",
            ServiceKind::MeshGateway => "mesh-gateway",
            ServiceKind::TerminatingGateway => "terminating-gateway",
            ServiceKind::IngressGateway => "ingress-gateway",
            ServiceKind::ApiGateway => "api-gateway",
        }
    }

    /// True for every kind that runs a proxy configured by meshd.
    pub fn is_proxy(self) -> bool {
        !matches!(self, ServiceKind::Typical)
    }
}

/// An unknown service kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown service kind {0:?}: expected \"\", connect-proxy, mesh-gateway, terminating-gateway, ingress-gateway or api-gateway"
)]
pub struct UnknownKind(pub String);

impl FromStr for ServiceKind {
    type Err = UnknownKind;
    fn from_str(s: &str) -> Result<Self, UnknownKind> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "" | "typical" => ServiceKind::Typical,
            "connect-proxy" => ServiceKind::ConnectProxy,
            "mesh-gateway" => ServiceKind::MeshGateway,
            "terminating-gateway" => ServiceKind::TerminatingGateway,
            "ingress-gateway" => ServiceKind::IngressGateway,
            "api-gateway" => ServiceKind::ApiGateway,
            _ => return Err(UnknownKind(s.to_owned())),
        })
    }
}

impl fmt::Display for ServiceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ServiceKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ServiceKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = Option::<String>::deserialize(d)?.unwrap_or_default();
        s.parse().map_err(de::Error::custom)
    }
}

/// An address and port a service can also be reached at (`TaggedAddresses` values).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServiceAddress {
    /// Host or IP.
    #[serde(rename = "Address")]
    pub address: String,
    /// Port.
    #[serde(rename = "Port")]
    pub port: u16,
}

/// DNS weights by health.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Weights {
    /// Weight while passing.
    #[serde(rename = "Passing")]
    pub passing: u32,
    /// Weight while warning.
    #[serde(rename = "Warning")]
    pub warning: u32,
}

impl Default for Weights {
    fn default() -> Self {
        Self { passing: 1, warning: 1 }
    }
}

/// Connect settings of an application service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServiceConnect {
    /// The application speaks mTLS itself and needs no sidecar.
    #[serde(rename = "Native")]
    pub native: bool,
    /// A sidecar proxy to register along with the service (agent registrations only; the
    /// agent expands it into its own `connect-proxy` instance, see
    /// [`crate::agent::ServiceDefinition`]).
    #[serde(rename = "SidecarService", skip_serializing_if = "Option::is_none")]
    pub sidecar_service: Option<Box<crate::agent::ServiceDefinition>>,
    /// A proxy the agent registers (`<id>-proxy`) and runs itself, in Consul 1.4's shape
    /// (agent registrations only; see [`crate::agent::ManagedProxyDefinition`]).
    #[serde(rename = "Proxy", skip_serializing_if = "Option::is_none")]
    pub proxy: Option<Box<crate::agent::ManagedProxyDefinition>>,
}

/// One service instance on a node, as the catalog stores it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeService {
    /// What the service is.
    #[serde(rename = "Kind")]
    pub kind: ServiceKind,
    /// Instance id, unique on its node; defaults to the name.
    #[serde(rename = "ID")]
    pub id: String,
    /// Service name.
    #[serde(rename = "Service")]
    pub service: String,
    /// Tags.
    #[serde(rename = "Tags")]
    pub tags: Vec<String>,
    /// Address, if it differs from the node's.
    #[serde(rename = "Address")]
    pub address: String,
    /// Extra addresses by name; keys are the user's.
    #[serde(rename = "TaggedAddresses")]
    pub tagged_addresses: BTreeMap<String, ServiceAddress>,
    /// User metadata; keys are the user's.
    #[serde(rename = "Meta")]
    pub meta: BTreeMap<String, String>,
    /// Port.
    #[serde(rename = "Port")]
    pub port: u16,
    /// Unix socket path, instead of address and port.
    #[serde(rename = "SocketPath", skip_serializing_if = "String::is_empty")]
    pub socket_path: String,
    /// DNS weights.
    #[serde(rename = "Weights")]
    pub weights: Weights,
    /// Let anti-entropy keep tags changed in the catalog.
    #[serde(rename = "EnableTagOverride")]
    pub enable_tag_override: bool,
    /// Proxy settings; meaningful for proxy and gateway kinds.
    #[serde(rename = "Proxy")]
    pub proxy: ConnectProxyConfig,
    /// Connect settings of an application.
    #[serde(rename = "Connect")]
    pub connect: ServiceConnect,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

impl NodeService {
    /// The instance id, falling back to the service name as Consul does.
    pub fn instance_id(&self) -> &str {
        if self.id.is_empty() { &self.service } else { &self.id }
    }

    /// Fills the defaults Consul applies on registration (id from name).
    pub fn normalize(&mut self) {
        if self.id.is_empty() {
            self.id.clone_from(&self.service);
        }
    }
}

impl Validate for NodeService {
    fn validate(&self) -> Result<(), ValidationError> {
        check_name("Service", &self.service, "")?;
        if self.kind == ServiceKind::Typical {
            if self.proxy != ConnectProxyConfig::default() {
                return Err(ValidationError::new(
                    "Proxy",
                    Problem::NotAllowed("for a typical service: register a connect-proxy"),
                ));
            }
            return Ok(());
        }
        if self.connect.native {
            return Err(ValidationError::new(
                "Connect.Native",
                Problem::NotAllowed("for proxies and gateways"),
            ));
        }
        if self.kind == ServiceKind::ConnectProxy {
            if self.socket_path.is_empty() {
                check_port("Port", self.port, "for kind connect-proxy")?;
            }
            check_name(
                "Proxy.DestinationServiceName",
                &self.proxy.destination_service_name,
                "for kind connect-proxy",
            )?;
        } else if self.socket_path.is_empty()
            && matches!(self.kind, ServiceKind::MeshGateway | ServiceKind::TerminatingGateway)
        {
            check_port("Port", self.port, "for gateways")?;
        }
        self.proxy.validate().map_err(|e| e.within("Proxy"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::from_value;
    use serde_json::json;

    fn validate(v: serde_json::Value) -> Result<(), String> {
        let svc: NodeService = from_value(v).map_err(|e| e.to_string())?;
        svc.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn validation_errors_name_the_field() {
        assert_eq!(
            validate(json!({"Kind": "connect-proxy", "Service": "web-proxy", "Port": 21000})).unwrap_err(),
            "Proxy.DestinationServiceName: required for kind connect-proxy"
        );
        assert_eq!(
            validate(
                json!({"Kind": "connect-proxy", "Service": "web-proxy", "Proxy": {"DestinationServiceName": "web"}})
            )
            .unwrap_err(),
            "Port: required for kind connect-proxy"
        );
        assert_eq!(validate(json!({"Service": ""})).unwrap_err(), "Service: required");
        assert_eq!(
            validate(json!({"Service": "bad name"})).unwrap_err(),
            "Service: invalid character ' ': use letters, digits, '-', '_' or '.'"
        );
        assert_eq!(
            validate(json!({"Kind": "connect-proxy", "Service": "p", "Port": 1, "Proxy": {"DestinationServiceName": "web",
                "Upstreams": [{"DestinationName": "api", "LocalBindPort": 9000}, {"DestinationName": "db", "LocalBindPort": 9000}]}}))
            .unwrap_err(),
            "Proxy.Upstreams[1].LocalBindPort: duplicate bind address 127.0.0.1:9000"
        );
        assert_eq!(
            validate(
                json!({"Kind": "connect-proxy", "Service": "p", "Port": 1, "Proxy": {"DestinationServiceName": "web",
                "Upstreams": [{"DestinationName": "api"}]}})
            )
            .unwrap_err(),
            "Proxy.Upstreams[0].LocalBindPort: required unless LocalBindSocketPath is set"
        );
        assert_eq!(
            validate(json!({"Service": "web", "Proxy": {"DestinationServiceName": "x"}})).unwrap_err(),
            "Proxy: not allowed for a typical service: register a connect-proxy"
        );
        validate(
            json!({"Kind": "connect-proxy", "Service": "p", "Port": 1, "Proxy": {"DestinationServiceName": "web",
            "Upstreams": [{"DestinationName": "api", "LocalBindPort": 9000}]}}),
        )
        .unwrap();
    }
}
