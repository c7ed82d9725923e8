//! Intentions: the flat, per-source view of `service-intentions` entries, with Consul's
//! precedence and matching.

use crate::config_entry::{IntentionAction, IntentionJwtRequirement, IntentionPermission, ServiceIntentions};
use crate::{Index, Timestamp};
use serde::{Deserialize, Serialize};
use std::{cmp::Ordering, collections::BTreeMap};

/// The wildcard that matches any service name.
pub const WILDCARD: &str = "*";

/// One source → destination rule.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Intention {
    /// Legacy id (empty for intentions that only exist as config entries).
    #[serde(rename = "ID")]
    pub id: String,
    /// Human description.
    #[serde(rename = "Description")]
    pub description: String,
    /// Source namespace.
    #[serde(rename = "SourceNS")]
    pub source_ns: String,
    /// Source service name or `*`.
    #[serde(rename = "SourceName")]
    pub source_name: String,
    /// The peer the source is in (cluster peering); empty: this cluster.
    #[serde(rename = "SourcePeer", skip_serializing_if = "String::is_empty")]
    pub source_peer: String,
    /// Destination namespace.
    #[serde(rename = "DestinationNS")]
    pub destination_ns: String,
    /// Destination service name or `*`.
    #[serde(rename = "DestinationName")]
    pub destination_name: String,
    /// `consul`.
    #[serde(rename = "SourceType")]
    pub source_type: String,
    /// L4 action; empty when `Permissions` decide.
    #[serde(rename = "Action", skip_serializing_if = "Option::is_none")]
    pub action: Option<IntentionAction>,
    /// L7 rules.
    #[serde(rename = "Permissions")]
    pub permissions: Vec<IntentionPermission>,
    /// The token every request to the destination must carry (the entry's `JWT`).
    #[serde(rename = "JWT", skip_serializing_if = "Option::is_none")]
    pub jwt: Option<IntentionJwtRequirement>,
    /// Higher wins; computed from how exact source and destination are.
    #[serde(rename = "Precedence")]
    pub precedence: u32,
    /// Metadata; keys untouched.
    #[serde(rename = "Meta")]
    pub meta: BTreeMap<String, String>,
    /// Creation time (legacy intentions).
    #[serde(rename = "CreatedAt", skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Timestamp>,
    /// Update time (legacy intentions).
    #[serde(rename = "UpdatedAt", skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<Timestamp>,
    /// Index of the write that created the entry.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed the entry.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

/// Consul's precedence table: the destination's exactness sets the band (9, 6 or 3 with
/// namespace and name exact, namespace exact only, neither), then each wildcard in the source
/// takes one off.
pub fn precedence(source_ns: &str, source_name: &str, dest_ns: &str, dest_name: &str) -> u32 {
    let exact = |ns: &str, name: &str| -> u32 {
        match (ns != WILDCARD, name != WILDCARD) {
            (true, true) => 2,
            (true, false) => 1,
            (false, _) => 0,
        }
    };
    let band = match exact(dest_ns, dest_name) {
        2 => 9,
        1 => 6,
        _ => 3,
    };
    band - (2 - exact(source_ns, source_name))
}

impl Intention {
    /// Recomputes `precedence` from the names.
    pub fn update_precedence(&mut self) {
        self.precedence = precedence(
            &self.source_ns,
            &self.source_name,
            &self.destination_ns,
            &self.destination_name,
        );
    }

    /// True when this intention's source covers `source` of this cluster.
    pub fn matches_source(&self, source: &str) -> bool {
        self.matches_peer_source("", source)
    }

    /// True when this intention's source covers `source` of `peer` (empty: this cluster's).
    pub fn matches_peer_source(&self, peer: &str, source: &str) -> bool {
        self.source_peer == peer && (self.source_name == WILDCARD || self.source_name == source)
    }

    /// True when this intention's destination covers `destination`.
    pub fn matches_destination(&self, destination: &str) -> bool {
        self.destination_name == WILDCARD || self.destination_name == destination
    }

    /// The order intentions are evaluated in: precedence first, then names for determinism.
    pub fn evaluation_order(a: &Intention, b: &Intention) -> Ordering {
        b.precedence
            .cmp(&a.precedence)
            .then_with(|| a.source_ns.cmp(&b.source_ns))
            .then_with(|| a.source_name.cmp(&b.source_name))
            .then_with(|| a.source_peer.cmp(&b.source_peer))
            .then_with(|| a.destination_ns.cmp(&b.destination_ns))
            .then_with(|| a.destination_name.cmp(&b.destination_name))
    }
}

/// Flattens a `service-intentions` entry into one intention per source, with precedence.
pub fn from_config_entry(entry: &ServiceIntentions) -> Vec<Intention> {
    entry
        .sources
        .iter()
        .map(|src| {
            let mut ixn = Intention {
                id: src.legacy_id.clone(),
                description: src.description.clone(),
                source_ns: if src.namespace.is_empty() {
                    "default".into()
                } else {
                    src.namespace.clone()
                },
                source_name: src.name.clone(),
                source_peer: src.peer.clone(),
                destination_ns: "default".into(),
                destination_name: entry.name.clone(),
                source_type: if src.source_type.is_empty() {
                    "consul".into()
                } else {
                    src.source_type.clone()
                },
                action: src.action,
                permissions: src.permissions.clone(),
                jwt: entry.jwt.clone(),
                precedence: 0,
                meta: src.legacy_meta.clone(),
                created_at: src.legacy_create_time,
                updated_at: src.legacy_update_time,
                create_index: entry.create_index,
                modify_index: entry.modify_index,
            };
            ixn.update_precedence();
            ixn
        })
        .collect()
}

/// The outcome of evaluating intentions for one source → destination pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntentionDecision {
    /// Whether a connection is allowed at L4.
    pub allowed: bool,
    /// The deciding intention has L7 permissions (so L4 alone cannot allow).
    pub has_permissions: bool,
    /// An intention matched (otherwise the default decided).
    pub matched: bool,
}

impl IntentionDecision {
    /// Why, in one line (as `/v1/agent/connect/authorize` and `meshd troubleshoot` say it).
    pub fn reason(&self, source: &str, destination: &str) -> String {
        match (self.matched, self.has_permissions) {
            (true, true) => format!(
                "Matched an intention {source} => {destination} with L7 permissions: it is decided per request by the proxy, not here"
            ),
            (true, false) => format!(
                "Matched L4 intention {source} => {destination}: {}",
                if self.allowed { "allow" } else { "deny" }
            ),
            (false, _) => "No intention matched: the default, which follows the ACL default policy".into(),
        }
    }
}

/// Evaluates `intentions` (any order) for `source` → `destination`: the highest-precedence
/// match decides; with none, `default_allow` does.
pub fn decide(intentions: &[Intention], source: &str, destination: &str, default_allow: bool) -> IntentionDecision {
    let best = intentions
        .iter()
        .filter(|i| i.matches_source(source) && i.matches_destination(destination))
        .min_by(|a, b| Intention::evaluation_order(a, b));
    match best {
        Some(i) if !i.permissions.is_empty() => IntentionDecision {
            allowed: false,
            has_permissions: true,
            matched: true,
        },
        Some(i) => IntentionDecision {
            allowed: i.action == Some(IntentionAction::Allow),
            has_permissions: false,
            matched: true,
        },
        None => IntentionDecision {
            allowed: default_allow,
            has_permissions: false,
            matched: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ixn(src: &str, dst: &str, action: IntentionAction) -> Intention {
        let mut i = Intention {
            source_ns: "default".into(),
            source_name: src.into(),
            destination_ns: "default".into(),
            destination_name: dst.into(),
            action: Some(action),
            ..Default::default()
        };
        i.update_precedence();
        i
    }

    #[test]
    fn precedence_table() {
        assert_eq!(precedence("default", "web", "default", "api"), 9);
        assert_eq!(precedence("default", "*", "default", "api"), 8);
        assert_eq!(precedence("*", "*", "default", "api"), 7);
        assert_eq!(precedence("default", "web", "default", "*"), 6);
        assert_eq!(precedence("default", "*", "default", "*"), 5);
        assert_eq!(precedence("*", "*", "default", "*"), 4);
        assert_eq!(precedence("default", "web", "*", "*"), 3);
        assert_eq!(precedence("*", "*", "*", "*"), 1);
    }

    #[test]
    fn most_precise_match_decides() {
        let set = vec![
            ixn("*", "*", IntentionAction::Deny),
            ixn("web", "api", IntentionAction::Allow),
            ixn("*", "api", IntentionAction::Deny),
        ];
        assert!(decide(&set, "web", "api", false).allowed);
        assert!(!decide(&set, "db", "api", true).allowed);
        assert!(!decide(&set, "db", "other", true).allowed);
        let none = decide(&[], "a", "b", true);
        assert!(none.allowed && !none.matched);
    }
}
