//! Where an instance runs and which ports it serves (Consul's `Locality` and 1.22's `Ports`),
//! kept as registered.

use serde::{Deserialize, Serialize};

/// Where an instance runs: a cloud region and zone (Consul's `Locality`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct Locality {
    /// Region.
    #[serde(rename = "Region", skip_serializing_if = "String::is_empty")]
    pub region: String,
    /// Zone within the region.
    #[serde(rename = "Zone", skip_serializing_if = "String::is_empty")]
    pub zone: String,
}

/// One named port of a multi-port service (Consul 1.22's `Ports`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct ServicePort {
    /// Its name.
    #[serde(rename = "Name")]
    pub name: String,
    /// The port.
    #[serde(rename = "Port")]
    pub port: u16,
    /// Whether it is the service's default port.
    #[serde(rename = "Default", skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
}
