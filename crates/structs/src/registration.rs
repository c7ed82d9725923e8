//! Catalog write requests, in Consul's shapes (`/v1/catalog/register`, `/deregister`).

use crate::validate::{Problem, Validate, ValidationError, check_name};
use crate::{HealthCheck, NodeService};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Registers a node, optionally with one service and checks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RegisterRequest {
    /// Node UUID, optional.
    #[serde(rename = "ID")]
    pub id: String,
    /// Node name.
    #[serde(rename = "Node")]
    pub node: String,
    /// Node address.
    #[serde(rename = "Address")]
    pub address: String,
    /// Datacenter (empty: the server's).
    #[serde(rename = "Datacenter")]
    pub datacenter: String,
    /// Extra node addresses; keys are the user's.
    #[serde(rename = "TaggedAddresses")]
    pub tagged_addresses: BTreeMap<String, String>,
    /// Node metadata; keys are the user's.
    #[serde(rename = "NodeMeta")]
    pub node_meta: BTreeMap<String, String>,
    /// A service to register on the node.
    #[serde(rename = "Service", skip_serializing_if = "Option::is_none")]
    pub service: Option<NodeService>,
    /// One check to register.
    #[serde(rename = "Check", skip_serializing_if = "Option::is_none")]
    pub check: Option<HealthCheck>,
    /// More checks to register.
    #[serde(rename = "Checks")]
    pub checks: Vec<HealthCheck>,
    /// Leave the node's own fields as they are if it exists.
    #[serde(rename = "SkipNodeUpdate")]
    pub skip_node_update: bool,
}

impl RegisterRequest {
    /// Every check of the request (`Check` and `Checks`).
    pub fn all_checks(&self) -> impl Iterator<Item = &HealthCheck> {
        self.check.iter().chain(self.checks.iter())
    }
}

impl Validate for RegisterRequest {
    fn validate(&self) -> Result<(), ValidationError> {
        check_name("Node", &self.node, "")?;
        // With SkipNodeUpdate the node is left as it is: it needs no address (the catalog
        // refuses the write when the node does not exist).
        if self.address.is_empty() && !self.skip_node_update {
            return Err(ValidationError::new(
                "Address",
                Problem::Required("(unless SkipNodeUpdate)"),
            ));
        }
        if let Some(svc) = &self.service {
            svc.validate().map_err(|e| e.within("Service"))?;
        }
        for (i, check) in self.all_checks().enumerate() {
            let at = if self.check.is_some() && i == 0 {
                "Check".to_owned()
            } else {
                format!("Checks[{i}]")
            };
            check.validate().map_err(|e| e.within(&at))?;
            if !check.node.is_empty() && check.node != self.node {
                return Err(ValidationError::new(
                    format!("{at}.Node"),
                    Problem::Invalid(format!(
                        "{:?} does not match the registered node {:?}",
                        check.node, self.node
                    )),
                ));
            }
        }
        Ok(())
    }
}

/// Removes a node, one of its services, or one of its checks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeregisterRequest {
    /// Node name.
    #[serde(rename = "Node")]
    pub node: String,
    /// Datacenter (empty: the server's).
    #[serde(rename = "Datacenter")]
    pub datacenter: String,
    /// Service instance to remove (with its checks).
    #[serde(rename = "ServiceID")]
    pub service_id: String,
    /// Check to remove.
    #[serde(rename = "CheckID")]
    pub check_id: String,
}

impl Validate for DeregisterRequest {
    fn validate(&self) -> Result<(), ValidationError> {
        check_name("Node", &self.node, "")?;
        if !self.service_id.is_empty() && !self.check_id.is_empty() {
            return Err(ValidationError::new(
                "CheckID",
                Problem::NotAllowed("together with ServiceID"),
            ));
        }
        Ok(())
    }
}
