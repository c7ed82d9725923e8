//! What the manager is asked to keep running.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One proxy daemon to keep running.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonSpec {
    /// The program.
    pub command: PathBuf,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment (on top of the supervisor's).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// ACL token, given as `CONNECT_PROXY_TOKEN`.
    #[serde(default)]
    pub token: String,
    /// The service this proxy is a sidecar for, given as `CONNECT_SIDECAR_FOR`.
    #[serde(default)]
    pub sidecar_for: String,
}

impl std::fmt::Debug for DaemonSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaemonSpec")
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("token", &if self.token.is_empty() { "" } else { "<redacted>" })
            .field("sidecar_for", &self.sidecar_for)
            .finish()
    }
}

/// The desired daemons by proxy id.
pub type DesiredSet = BTreeMap<String, DaemonSpec>;
