//! The audit log's records (`GET /v1/internal/audit`, the audit file): one per write a
//! server accepted or refused, saying who asked, from where, what, and what came of it.

use crate::Index;
use serde::{Deserialize, Serialize};

/// How many records a server keeps unless told otherwise (`-audit-retention`).
pub const DEFAULT_RETENTION: usize = 10_000;

/// One audited request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AuditRecord {
    /// Its place in the log (1, 2, ...): given when committed, never reused.
    #[serde(default)]
    pub seq: u64,
    /// The index the write produced; for a refused write, the index its record was kept at.
    #[serde(default)]
    pub index: Index,
    /// When the server took the request (RFC 3339, milliseconds, UTC).
    pub time: String,
    /// Whether the write was accepted (committed).
    pub accepted: bool,
    /// What it wrote: `catalog`, `agent`, `config`, `intention`, `acl`, `ca`, `kv`,
    /// `session`, `query`, `event`, `txn`, `snapshot` or `operator`.
    pub kind: String,
    /// The accessor id of the request's token ("" with ACLs off or an unknown token); never
    /// the secret.
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    /// The address the request came from.
    pub remote_addr: String,
    /// The server that took it (its node name).
    pub server: String,
    /// The HTTP method.
    pub method: String,
    /// The path.
    pub path: String,
    /// The query string, without any token.
    #[serde(default)]
    pub query: String,
    /// The request body, secrets redacted (JSON bodies), or `{"Bytes": n}` for a body that
    /// is not JSON (a KV value, a snapshot archive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<serde_json::Value>,
    /// The answer's status code.
    pub status: u16,
    /// Why it was refused ("" when accepted).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

impl AuditRecord {
    /// The record's time in milliseconds since the epoch (0 if unreadable).
    pub fn time_ms(&self) -> u64 {
        parse_time_ms(&self.time).unwrap_or(0)
    }
}

/// A time as records show it (RFC 3339, milliseconds, UTC).
pub fn format_time(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Reads a time as records show it (or any RFC 3339 time) in milliseconds since the epoch.
pub fn parse_time_ms(text: &str) -> Option<u64> {
    let t = humantime::parse_rfc3339_weak(text).ok()?;
    let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
    u64::try_from(d.as_millis()).ok()
}

/// The value a secret is replaced with in a recorded body.
pub const REDACTED: &str = "<redacted>";

/// Fields of a JSON body whose values are never recorded (compared without case): tokens'
/// secrets, the CA's private key, passwords, check headers (which may carry credentials),
/// KV values in transactions, a login's bearer token and an auth method's reviewer token.
const SECRET_FIELDS: &[&str] = &[
    "secretid",
    "token",
    "privatekey",
    "password",
    "secret",
    "clientsecret",
    "header",
    "authorization",
    "value",
    "bootstrapsecret",
    "peeringtoken",
    "establishmentsecret",
    "bearertoken",
    "serviceaccountjwt",
];

/// Replaces the value of every secret field (at any depth) of a JSON body with
/// [`REDACTED`].
pub fn redact(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                let lower = key.to_ascii_lowercase();
                if SECRET_FIELDS.contains(&lower.as_str()) {
                    if !v.is_null() {
                        *v = serde_json::Value::String(REDACTED.into());
                    }
                } else {
                    redact(v);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

/// The query string with every `token` parameter removed.
pub fn redact_query(query: &str) -> String {
    query
        .split('&')
        .filter(|pair| {
            let name = pair.split('=').next().unwrap_or_default();
            !name.eq_ignore_ascii_case("token") && !pair.is_empty()
        })
        .collect::<Vec<_>>()
        .join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_at_any_depth_and_in_the_query() {
        let mut body = serde_json::json!({
            "SecretID": "s1",
            "Description": "d",
            "Config": {"PrivateKey": "k", "LeafCertTTL": "72h"},
            "Checks": [{"HTTP": "http://x", "Header": {"Authorization": ["Bearer t"]}}],
            "Ops": [{"KV": {"Verb": "set", "Key": "a", "Value": "c2VjcmV0"}}],
            "Token": null,
            "PeeringToken": "eyJwZWVy",
            "BearerToken": "eyJiZWFyZXI",
            "Method": {"Config": {"ServiceAccountJWT": "eyJyZXZpZXdlcg"}},
        });
        redact(&mut body);
        let text = body.to_string();
        for secret in [
            "s1",
            "\"k\"",
            "Bearer t",
            "c2VjcmV0",
            "eyJwZWVy",
            "eyJiZWFyZXI",
            "eyJyZXZpZXdlcg",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(text.contains("LeafCertTTL") && text.contains("\"Description\":\"d\""));
        assert_eq!(body["Token"], serde_json::Value::Null);
        assert_eq!(redact_query("cas=3&token=abc&dc=dc1&TOKEN=x"), "cas=3&dc=dc1");
        assert_eq!(redact_query(""), "");
    }

    #[test]
    fn time_is_read_back_in_milliseconds() {
        let r = AuditRecord {
            time: "2026-01-02T03:04:05.678Z".into(),
            ..Default::default()
        };
        assert_eq!(r.time_ms(), 1_767_323_045_678);
    }
}
