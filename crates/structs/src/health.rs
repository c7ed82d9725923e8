//! Health checks and the service-instance view that carries them.

use crate::validate::{Problem, Validate, ValidationError, check_name};
use crate::{GoDuration, Index, Node, NodeService};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod status;

pub use status::HealthStatus;

/// How a check is run (what the agent needs to run it again).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HealthCheckDefinition {
    /// URL for an HTTP check.
    #[serde(rename = "HTTP", skip_serializing_if = "String::is_empty")]
    pub http: String,
    /// Method for an HTTP check.
    #[serde(rename = "Method", skip_serializing_if = "String::is_empty")]
    pub method: String,
    /// Headers for an HTTP check; keys are the user's.
    #[serde(rename = "Header", skip_serializing_if = "BTreeMap::is_empty")]
    pub header: BTreeMap<String, Vec<String>>,
    /// Skip TLS verification for an HTTP check.
    #[serde(rename = "TLSSkipVerify", skip_serializing_if = "std::ops::Not::not")]
    pub tls_skip_verify: bool,
    /// Address for a TCP check.
    #[serde(rename = "TCP", skip_serializing_if = "String::is_empty")]
    pub tcp: String,
    /// Target for a gRPC check.
    #[serde(rename = "GRPC", skip_serializing_if = "String::is_empty")]
    pub grpc: String,
    /// How often it runs.
    #[serde(rename = "Interval", skip_serializing_if = "GoDuration::is_zero")]
    pub interval: GoDuration,
    /// How long one run may take.
    #[serde(rename = "Timeout", skip_serializing_if = "GoDuration::is_zero")]
    pub timeout: GoDuration,
    /// Deregister the service after it has been critical this long.
    #[serde(
        rename = "DeregisterCriticalServiceAfter",
        skip_serializing_if = "GoDuration::is_zero"
    )]
    pub deregister_critical_service_after: GoDuration,
}

/// A health check of a node or of one service instance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HealthCheck {
    /// Node the check runs on.
    #[serde(rename = "Node")]
    pub node: String,
    /// Check id, unique on the node.
    #[serde(rename = "CheckID")]
    pub check_id: String,
    /// Human name.
    #[serde(rename = "Name")]
    pub name: String,
    /// Current state.
    #[serde(rename = "Status")]
    pub status: HealthStatus,
    /// Human notes.
    #[serde(rename = "Notes")]
    pub notes: String,
    /// Output of the last run.
    #[serde(rename = "Output")]
    pub output: String,
    /// Instance id of the service it checks; empty for a node check.
    #[serde(rename = "ServiceID")]
    pub service_id: String,
    /// Name of the service it checks.
    #[serde(rename = "ServiceName")]
    pub service_name: String,
    /// Tags of the service it checks.
    #[serde(rename = "ServiceTags")]
    pub service_tags: Vec<String>,
    /// `http`, `tcp`, `ttl`, `grpc`, `alias`, ... (informational).
    #[serde(rename = "Type")]
    pub check_type: String,
    /// How often it runs, as Consul shows it beside the definition (`10s`; `""`: not a
    /// periodic check).
    #[serde(rename = "Interval")]
    pub interval: String,
    /// How long one run may take (`""`: the default).
    #[serde(rename = "Timeout")]
    pub timeout: String,
    /// The proxy port an exposed check is reached through (0: not exposed).
    #[serde(rename = "ExposedPort")]
    pub exposed_port: u16,
    /// How it is run.
    #[serde(rename = "Definition")]
    pub definition: HealthCheckDefinition,
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

impl HealthCheck {
    /// True for a check of the whole node rather than one service.
    pub fn is_node_check(&self) -> bool {
        self.service_id.is_empty()
    }
}

impl Validate for HealthCheck {
    fn validate(&self) -> Result<(), ValidationError> {
        if !self.peer_name.is_empty() {
            return Err(ValidationError::new(
                "PeerName",
                Problem::NotAllowed("(only checks imported from a peer have one)"),
            ));
        }
        if self.check_id.is_empty() && self.name.is_empty() {
            return Err(ValidationError::new("CheckID", Problem::Required("(or Name)")));
        }
        if !self.node.is_empty() {
            check_name("Node", &self.node, "")?;
        }
        Ok(())
    }
}

/// A service instance with its node and every check that applies to it: the unit health
/// queries and endpoint discovery return.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CheckServiceNode {
    /// The node the instance runs on.
    #[serde(rename = "Node")]
    pub node: Node,
    /// The instance.
    #[serde(rename = "Service")]
    pub service: NodeService,
    /// Node checks and the instance's own checks.
    #[serde(rename = "Checks")]
    pub checks: Vec<HealthCheck>,
}

impl CheckServiceNode {
    /// This instance as another datacenter reaches it: at its service's `wan` tagged
    /// address (a mesh gateway's `-wan-address`), else where it is.
    pub fn reached_from_afar(&self) -> CheckServiceNode {
        let mut node = self.clone();
        if let Some(wan) = node
            .service
            .tagged_addresses
            .get("wan")
            .filter(|a| !a.address.is_empty())
        {
            let (address, port) = (wan.address.clone(), wan.port);
            node.service.address = address;
            if port != 0 {
                node.service.port = port;
            }
        }
        node
    }

    /// The worst status among all checks (passing when there are none).
    pub fn aggregate_status(&self) -> HealthStatus {
        self.checks
            .iter()
            .map(|c| c.status)
            .max()
            .unwrap_or(HealthStatus::Passing)
    }

    /// The address to reach the instance at: its own, else its node's.
    pub fn address(&self) -> &str {
        if self.service.address.is_empty() {
            &self.node.address
        } else {
            &self.service.address
        }
    }

    /// [`CheckServiceNode::address`] with its port, `host:port` (`[v6]:port`).
    pub fn address_with_port(&self) -> String {
        let host = self.address();
        if host.contains(':') {
            format!("[{host}]:{}", self.service.port)
        } else {
            format!("{host}:{}", self.service.port)
        }
    }
}
