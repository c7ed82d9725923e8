//! Where else an instance can be reached, and its DNS weights.

use serde::{Deserialize, Serialize};

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
