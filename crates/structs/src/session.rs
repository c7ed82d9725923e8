//! Sessions, as Consul's API shows them: what a lock in the KV store is held by. A session
//! is bound to a node and to health checks; it ends when it is destroyed, when its TTL runs
//! out without a renewal, or when its node goes or one of its checks turns critical, and
//! then the locks it held are released (or their keys deleted).

use crate::{GoDuration, Index};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The longest lock delay a session may ask for (Consul's cap).
pub const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);
/// The lock delay when none is given.
pub const DEFAULT_LOCK_DELAY: Duration = Duration::from_secs(15);
/// The shortest TTL.
pub const MIN_TTL: Duration = Duration::from_secs(10);
/// The longest TTL.
pub const MAX_TTL: Duration = Duration::from_secs(86_400);
/// The check a session is bound to when it names none: the node's liveness.
pub const DEFAULT_CHECK: &str = "serfHealth";

/// What happens to the keys a session holds when it ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Behavior {
    /// The lock is released; the key stays.
    #[default]
    Release,
    /// The key is deleted.
    Delete,
}

/// A service check a session is bound to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceCheck {
    /// The check's id.
    #[serde(rename = "ID")]
    pub id: String,
    /// Namespace (Consul Enterprise; kept as given).
    #[serde(default)]
    pub namespace: String,
}

/// One session as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Session {
    /// Its id (a UUID).
    #[serde(rename = "ID")]
    pub id: String,
    /// A name for people.
    #[serde(default)]
    pub name: String,
    /// The node it is bound to.
    pub node: String,
    /// After the session ends, its keys cannot be locked again for this long.
    #[serde(default)]
    pub lock_delay: GoDuration,
    /// What happens to its keys when it ends.
    #[serde(default)]
    pub behavior: Behavior,
    /// Renewal deadline ("" for none): it ends when not renewed within twice this.
    #[serde(default, rename = "TTL")]
    pub ttl: String,
    /// Node checks it is bound to.
    #[serde(default)]
    pub node_checks: Vec<String>,
    /// Service checks it is bound to.
    #[serde(default)]
    pub service_checks: Vec<ServiceCheck>,
    /// When it was created or last renewed (milliseconds since the epoch; not in the API).
    #[serde(default)]
    pub renewed_at_ms: u64,
    /// The write that created it.
    #[serde(default)]
    pub create_index: Index,
    /// The write that changed it last.
    #[serde(default)]
    pub modify_index: Index,
}

impl Session {
    /// The TTL, if it has one (validated when created).
    pub fn ttl(&self) -> Option<Duration> {
        if self.ttl.is_empty() {
            return None;
        }
        GoDuration::parse(&self.ttl).ok().map(|d| d.0).filter(|d| !d.is_zero())
    }

    /// When it ends for want of a renewal (milliseconds since the epoch), if it has a TTL:
    /// twice the TTL after the last renewal, as Consul.
    pub fn expires_at_ms(&self) -> Option<u64> {
        self.ttl().map(|ttl| {
            let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
            self.renewed_at_ms.saturating_add(ttl_ms.saturating_mul(2))
        })
    }

    /// The session as Consul's API shows it.
    pub fn to_api(&self) -> serde_json::Value {
        serde_json::json!({
            "ID": self.id,
            "Name": self.name,
            "Node": self.node,
            "LockDelay": u64::try_from(self.lock_delay.0.as_nanos()).unwrap_or(u64::MAX),
            "Behavior": self.behavior,
            "TTL": self.ttl,
            "NodeChecks": self.node_checks,
            "ServiceChecks": self.service_checks,
            "CreateIndex": self.create_index,
            "ModifyIndex": self.modify_index,
        })
    }
}

/// `PUT /v1/session/create`'s body.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CreateRequest {
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Node (default: the node of the agent or server asked).
    #[serde(default)]
    pub node: String,
    /// Lock delay (a duration string, or nanoseconds); default 15 s, at most 60 s.
    #[serde(default)]
    pub lock_delay: Option<GoDuration>,
    /// `release` (default) or `delete`.
    #[serde(default)]
    pub behavior: Option<String>,
    /// TTL, between 10 s and 24 h, or none.
    #[serde(default, rename = "TTL")]
    pub ttl: Option<String>,
    /// Consul's older name for node checks.
    #[serde(default)]
    pub checks: Option<Vec<String>>,
    /// Node checks.
    #[serde(default)]
    pub node_checks: Option<Vec<String>>,
    /// Service checks.
    #[serde(default)]
    pub service_checks: Option<Vec<ServiceCheck>>,
}

/// A session request that cannot be honoured, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SessionError {
    /// The field at fault.
    pub field: &'static str,
    /// What is wrong.
    pub message: String,
}

impl CreateRequest {
    /// The session this asks for, with `id`, on `default_node` when it names none, created
    /// at `now_ms`; the node and checks are checked against the catalog when written.
    pub fn into_session(self, id: String, default_node: &str, now_ms: u64) -> Result<Session, SessionError> {
        let bad = |field, message: String| SessionError { field, message };
        let ttl = self.ttl.unwrap_or_default();
        if !ttl.is_empty() {
            let parsed = GoDuration::parse(&ttl).map_err(|e| bad("TTL", e.to_string()))?;
            if parsed.0 != Duration::ZERO && !(MIN_TTL..=MAX_TTL).contains(&parsed.0) {
                return Err(bad(
                    "TTL",
                    format!("Invalid Session TTL '{ttl}', must be between [10s=24h0m0s]"),
                ));
            }
        }
        let behavior = match self.behavior.as_deref().unwrap_or("") {
            "" | "release" => Behavior::Release,
            "delete" => Behavior::Delete,
            other => return Err(bad("Behavior", format!("Invalid Behavior setting '{other}'"))),
        };
        let lock_delay = self.lock_delay.map_or(DEFAULT_LOCK_DELAY, |d| d.0).min(MAX_LOCK_DELAY);
        let node = if self.node.is_empty() {
            default_node.to_owned()
        } else {
            self.node
        };
        // No checks named at all: bound to the node's liveness, as Consul.
        let none_named = self.checks.is_none() && self.node_checks.is_none() && self.service_checks.is_none();
        let mut node_checks = self.node_checks.unwrap_or_default();
        for check in self.checks.unwrap_or_default() {
            if !node_checks.contains(&check) {
                node_checks.push(check);
            }
        }
        if none_named {
            node_checks.push(DEFAULT_CHECK.to_owned());
        }
        Ok(Session {
            id,
            name: self.name,
            node,
            lock_delay: GoDuration(lock_delay),
            behavior,
            ttl,
            node_checks,
            service_checks: self.service_checks.unwrap_or_default(),
            renewed_at_ms: now_ms,
            ..Session::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(json: &str) -> CreateRequest {
        crate::json::from_slice(json.as_bytes()).unwrap()
    }

    #[test]
    fn defaults_and_limits_as_consul() {
        let s = req("{}").into_session("id".into(), "n1", 5).unwrap();
        assert_eq!(s.node, "n1");
        assert_eq!(s.node_checks, ["serfHealth"]);
        assert_eq!(s.lock_delay.0, DEFAULT_LOCK_DELAY);
        assert_eq!(s.behavior, Behavior::Release);
        assert_eq!(s.expires_at_ms(), None);
        let s = req(r#"{"Checks": [], "LockDelay": "90s", "TTL": "10s", "Behavior": "delete", "Node": "n2"}"#)
            .into_session("id".into(), "n1", 1_000)
            .unwrap();
        assert!(s.node_checks.is_empty());
        assert_eq!(s.lock_delay.0, MAX_LOCK_DELAY);
        assert_eq!((s.node.as_str(), s.behavior), ("n2", Behavior::Delete));
        assert_eq!(s.expires_at_ms(), Some(21_000));
        let s = req(r#"{"LockDelay": 1000000000}"#)
            .into_session("id".into(), "n1", 0)
            .unwrap();
        assert_eq!(s.lock_delay.0, Duration::from_secs(1));
        let e = req(r#"{"TTL": "5s"}"#).into_session("id".into(), "n1", 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "TTL: Invalid Session TTL '5s', must be between [10s=24h0m0s]"
        );
        let e = req(r#"{"Behavior": "keep"}"#)
            .into_session("id".into(), "n1", 0)
            .unwrap_err();
        assert_eq!(e.field, "Behavior");
        let api = s.to_api();
        assert_eq!(api["LockDelay"], 1_000_000_000u64);
        assert!(api.get("RenewedAtMs").is_none());
    }
}
