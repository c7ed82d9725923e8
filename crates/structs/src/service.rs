//! Services registered in the catalog, including proxies and gateways.

use crate::validate::{Problem, Validate, ValidationError, check_name, check_port};
use crate::{ConnectProxyConfig, Index};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod address;
mod kind;
pub mod placement;

pub use crate::agent::ServiceConnect;
pub use address::{ServiceAddress, Weights};
pub use kind::{ServiceKind, UnknownKind};
pub use placement::{Locality, ServicePort};

/// The tagged address (Consul's `consul-virtual`) a connect instance shows its service's
/// virtual IP as: the address transparent proxies match the service's connections on.
pub const TAGGED_ADDRESS_VIRTUAL_IP: &str = "consul-virtual";

/// One service instance on a node, as the catalog stores it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeService {
    /// What the service is.
    #[serde(rename = "Kind", skip_serializing_if = "crate::json::ser::is_default")]
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
    #[serde(rename = "TaggedAddresses", skip_serializing_if = "BTreeMap::is_empty")]
    pub tagged_addresses: BTreeMap<String, ServiceAddress>,
    /// User metadata; keys are the user's.
    #[serde(rename = "Meta")]
    pub meta: BTreeMap<String, String>,
    /// Port (omitted when 0, as Consul's catalog does; the agent's view always shows it).
    #[serde(rename = "Port", skip_serializing_if = "crate::json::ser::is_default")]
    pub port: u16,
    /// Unix socket path, instead of address and port.
    #[serde(rename = "SocketPath", skip_serializing_if = "String::is_empty")]
    pub socket_path: String,
    /// Where the instance runs (Consul's `Locality`), kept as given.
    #[serde(rename = "Locality", skip_serializing_if = "Option::is_none")]
    pub locality: Option<Locality>,
    /// Consul 1.22's named ports of a multi-port service, kept as given.
    #[serde(rename = "Ports", skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ServicePort>,
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
    /// The peer it was imported from (empty: this cluster's own).
    #[serde(rename = "PeerName", skip_serializing_if = "String::is_empty")]
    pub peer_name: String,
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

/// `Ports`: each named once, with a port, at most one the default.
fn check_ports(ports: &[ServicePort]) -> Result<(), ValidationError> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        check_name(&format!("Ports[{i}].Name"), &p.name, "")?;
        check_port(&format!("Ports[{i}].Port"), p.port, "")?;
        if !seen.insert(p.name.as_str()) {
            return Err(ValidationError::new(
                format!("Ports[{i}].Name"),
                Problem::Duplicate(format!("{:?} is listed twice", p.name)),
            ));
        }
    }
    if ports.iter().filter(|p| p.default).count() > 1 {
        return Err(ValidationError::new(
            "Ports",
            Problem::Invalid("at most one port is the Default".into()),
        ));
    }
    Ok(())
}

impl Validate for NodeService {
    fn validate(&self) -> Result<(), ValidationError> {
        check_name("Service", &self.service, "")?;
        check_ports(&self.ports)?;
        if !self.peer_name.is_empty() {
            return Err(ValidationError::new(
                "PeerName",
                Problem::NotAllowed("(only services imported from a peer have one)"),
            ));
        }
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
