//! Catalog nodes.

use crate::Index;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A machine (or virtual node) that hosts services.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Node {
    /// Node UUID, optional.
    #[serde(rename = "ID")]
    pub id: String,
    /// Node name, unique in the datacenter.
    #[serde(rename = "Node")]
    pub node: String,
    /// Address other nodes reach it at.
    #[serde(rename = "Address")]
    pub address: String,
    /// Datacenter it belongs to.
    #[serde(rename = "Datacenter")]
    pub datacenter: String,
    /// Extra addresses by name (`lan`, `wan`, ...); keys are the user's. `null` when empty,
    /// as Consul writes it.
    #[serde(
        rename = "TaggedAddresses",
        serialize_with = "crate::json::ser::null_if_empty",
        deserialize_with = "crate::json::read::null_as_default"
    )]
    pub tagged_addresses: BTreeMap<String, String>,
    /// User metadata; keys are the user's. `null` when empty, as Consul writes it.
    #[serde(
        rename = "Meta",
        serialize_with = "crate::json::ser::null_if_empty",
        deserialize_with = "crate::json::read::null_as_default"
    )]
    pub meta: BTreeMap<String, String>,
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
