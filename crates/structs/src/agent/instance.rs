//! A service definition as the catalog instance it describes: the conversion, and the
//! validation that checks a definition in that form (so a definition and the instance made
//! from it are refused for the same reasons).

use super::ServiceDefinition;
use crate::service::ServiceConnect;
use crate::validate::{Problem, Validate, ValidationError, check_name};
use crate::{NodeService, ServiceKind};

impl ServiceDefinition {
    /// The catalog instance this definition describes, without its sidecar and checks.
    pub fn node_service(&self) -> NodeService {
        NodeService {
            kind: self.kind,
            id: self.instance_id().to_owned(),
            service: self.name.clone(),
            tags: self.tags.clone(),
            address: self.address.clone(),
            tagged_addresses: self.tagged_addresses.clone(),
            meta: self.meta.clone(),
            port: self.port,
            socket_path: self.socket_path.clone(),
            locality: self.locality.clone(),
            ports: self.ports.clone(),
            weights: self.weights.clone(),
            enable_tag_override: self.enable_tag_override,
            proxy: self.proxy.clone(),
            connect: ServiceConnect {
                native: self.connect.native,
                sidecar_service: None,
                proxy: None,
            },
            ..NodeService::default()
        }
    }
}

/// Names `NodeService`'s fields as the definition spells them (`Service` is `Name` here).
fn definition_field(e: ValidationError) -> ValidationError {
    if e.field == "Service" {
        ValidationError {
            field: "Name".into(),
            ..e
        }
    } else {
        e
    }
}

impl Validate for ServiceDefinition {
    fn validate(&self) -> Result<(), ValidationError> {
        for (field, value) in [("Namespace", &self.namespace), ("Partition", &self.partition)] {
            if !matches!(value.as_str(), "" | "default") {
                return Err(ValidationError::new(
                    field,
                    Problem::Invalid(format!("{value:?}: only \"default\" exists in meshd")),
                ));
            }
        }
        if !self.id.is_empty() {
            check_name("ID", &self.id, "")?;
        }
        if let Some(sidecar) = &self.connect.sidecar_service {
            if self.kind != ServiceKind::Typical {
                return Err(ValidationError::new(
                    "Connect.SidecarService",
                    Problem::NotAllowed("for proxies and gateways"),
                ));
            }
            if self.connect.native {
                return Err(ValidationError::new(
                    "Connect.SidecarService",
                    Problem::NotAllowed("together with Connect.Native"),
                ));
            }
            validate_sidecar(sidecar).map_err(|e| e.within("Connect.SidecarService"))?;
        }
        if let Some(managed) = &self.connect.proxy {
            let conflict = if self.kind != ServiceKind::Typical {
                Some("for proxies and gateways")
            } else if self.connect.native {
                Some("together with Connect.Native")
            } else if self.connect.sidecar_service.is_some() {
                Some("together with Connect.SidecarService")
            } else {
                None
            };
            if let Some(why) = conflict {
                return Err(ValidationError::new("Connect.Proxy", Problem::NotAllowed(why)));
            }
            managed.validate().map_err(|e| e.within("Connect.Proxy"))?;
        }
        self.node_service().validate().map_err(definition_field)?;
        for (at, check) in self.all_checks() {
            check.kind().map_err(|e| e.within(&at))?;
        }
        Ok(())
    }
}

/// A sidecar is filled in from its parent, so only what it states itself is checked here;
/// the expanded proxy is validated as a whole by the agent.
fn validate_sidecar(sidecar: &ServiceDefinition) -> Result<(), ValidationError> {
    if sidecar.connect.sidecar_service.is_some() {
        return Err(ValidationError::new(
            "Connect.SidecarService",
            Problem::NotAllowed("inside a sidecar"),
        ));
    }
    if !matches!(sidecar.kind, ServiceKind::Typical | ServiceKind::ConnectProxy) {
        return Err(ValidationError::new(
            "Kind",
            Problem::Invalid(format!(
                "{:?}: a sidecar is always connect-proxy",
                sidecar.kind.as_str()
            )),
        ));
    }
    if sidecar.connect.native {
        return Err(ValidationError::new(
            "Connect.Native",
            Problem::NotAllowed("for a sidecar"),
        ));
    }
    if !sidecar.id.is_empty() {
        check_name("ID", &sidecar.id, "")?;
    }
    if !sidecar.name.is_empty() {
        check_name("Name", &sidecar.name, "")?;
    }
    for (at, check) in sidecar.all_checks() {
        check.kind().map_err(|e| e.within(&at))?;
    }
    sidecar.proxy.validate().map_err(|e| e.within("Proxy"))
}
