//! What one datacenter tells the others (Consul's federation state): where its servers and
//! mesh gateways are.

use crate::CheckServiceNode;
use serde::{Deserialize, Serialize};

/// One datacenter's federation state, as `GET /v1/internal/federation-states` lists it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FederationState {
    /// The datacenter.
    #[serde(rename = "Datacenter")]
    pub datacenter: String,
    /// Its mesh gateways with their health: where other datacenters send its services'
    /// connections.
    #[serde(rename = "MeshGateways")]
    pub mesh_gateways: Vec<CheckServiceNode>,
    /// Its servers' HTTP API addresses (`host:port`): where requests for it (`?dc=`) go.
    /// meshd's own (Consul's servers find each other by gossip).
    #[serde(rename = "Servers")]
    pub servers: Vec<String>,
    /// When the datacenter last sent it (RFC 3339).
    #[serde(rename = "UpdatedAt")]
    pub updated_at: String,
}

impl FederationState {
    /// Refuses a state that cannot be used: no datacenter name, no server, an address that
    /// is not `host:port`.
    pub fn check(&self) -> Result<(), String> {
        if self.datacenter.is_empty() {
            return Err("Datacenter: missing".into());
        }
        if self.servers.is_empty() {
            return Err("Servers: at least one server address is needed".into());
        }
        for (i, server) in self.servers.iter().enumerate() {
            let address = server
                .strip_prefix("https://")
                .or_else(|| server.strip_prefix("http://"))
                .unwrap_or(server);
            let ok = !address.contains('/')
                && address
                    .rsplit_once(':')
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0));
            if !ok {
                return Err(format!(
                    "Servers[{i}]: {server:?} is not host:port (or https://host:port)"
                ));
            }
        }
        Ok(())
    }

    /// The same state but for when it was sent: what decides whether a datacenter's news
    /// changed anything.
    pub fn same_as(&self, other: &FederationState) -> bool {
        self.datacenter == other.datacenter
            && self.servers == other.servers
            && self.mesh_gateways == other.mesh_gateways
    }
}
