//! What the manager is asked to keep running.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use structs::Token;

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
    /// ACL token, given as `CONNECT_PROXY_TOKEN` (none: that is empty; written `""`).
    #[serde(default, with = "structs::token::opt")]
    pub token: Option<Token>,
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
            .field("token", &self.token)
            .field("sidecar_for", &self.sidecar_for)
            .finish()
    }
}

/// The desired daemons by proxy id.
pub type DesiredSet = BTreeMap<String, DaemonSpec>;

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(token: &str) -> DaemonSpec {
        DaemonSpec {
            command: "/bin/true".into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            token: Token::new(token),
            sidecar_for: "web".into(),
        }
    }

    #[test]
    fn the_snapshot_shape_of_a_spec_keeps_its_token_as_a_string() {
        let none = serde_json::to_string(&spec("")).unwrap();
        assert_eq!(
            none,
            r#"{"command":"/bin/true","args":[],"env":{},"token":"","sidecar_for":"web"}"#
        );
        assert_eq!(serde_json::from_str::<DaemonSpec>(&none).unwrap(), spec(""));
        let some = serde_json::to_string(&spec("s3cr3t")).unwrap();
        assert!(some.contains(r#""token":"s3cr3t""#), "{some}");
        assert_eq!(serde_json::from_str::<DaemonSpec>(&some).unwrap(), spec("s3cr3t"));
        let old = r#"{"command":"/bin/true","sidecar_for":"web"}"#;
        assert_eq!(serde_json::from_str::<DaemonSpec>(old).unwrap(), spec(""));
        assert!(!format!("{:?}", spec("s3cr3t")).contains("s3cr3t"));
    }
}
