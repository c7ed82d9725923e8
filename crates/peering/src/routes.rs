//! Where the peering calls go. Directly to the servers by default; through the mesh
//! gateways when the `mesh` entry sets `Peering.PeerThroughMeshGateways` (Consul's): the
//! accepting cluster's tokens and stream then name its mesh gateways (which route the
//! servers' peering name to them, `server.<dc>.peering.<trust domain>` by SNI), and the
//! dialing cluster's servers dial their own mesh gateways, which route the peer's server
//! name to the addresses the peer gave. TLS stays end to end between the servers.

use crate::exports;
use catalog::State;
use structs::{CheckServiceNode, ConfigEntry, ConfigEntryKind};

/// Whether this cluster's peering calls cross its mesh gateways.
pub fn through_gateways(state: &State) -> bool {
    state
        .config_entry(ConfigEntryKind::Mesh, "mesh")
        .is_some_and(|e| matches!(&*e, ConfigEntry::Mesh(m) if m.peer_through_mesh_gateways()))
}

/// What peers dial to reach this cluster: its mesh gateways at their WAN addresses when the
/// calls cross them, else its servers' peering addresses (`servers`).
pub fn advertised(state: &State, servers: &dyn Fn() -> Vec<String>) -> Vec<String> {
    if through_gateways(state) {
        exports::mesh_gateways(state)
            .iter()
            .map(CheckServiceNode::address_with_port)
            .collect()
    } else {
        servers()
    }
}

/// This cluster's healthy mesh gateways at their local (LAN) addresses: where its servers
/// dial their peers through when the calls cross the gateways.
pub fn local_gateways(state: &State) -> Vec<String> {
    exports::healthy_gateways(state)
        .iter()
        .map(CheckServiceNode::address_with_port)
        .collect()
}

/// Where the peering calls of a peering this cluster dials go: its own gateways, or the
/// peer's servers (`peer` is the stored `PeerServerAddresses`).
pub fn dial_addresses(state: &State, peer: &[String]) -> Result<Vec<String>, String> {
    if !through_gateways(state) {
        return Ok(peer.to_vec());
    }
    let gateways = local_gateways(state);
    if gateways.is_empty() {
        return Err(NO_GATEWAY.into());
    }
    Ok(gateways)
}

/// Why the calls cannot go through the gateways.
pub const NO_GATEWAY: &str = "the mesh entry sends the peering calls through mesh gateways (Peering.PeerThroughMeshGateways) \
     and this cluster has no healthy mesh gateway";
