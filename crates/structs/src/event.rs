//! User events (`/v1/event/*`), as Consul's API shows them. Consul spreads them by gossip
//! to the agents their filters select; meshd has no gossip: servers keep the most recent
//! events in the catalog and agents read them with blocking queries.

use serde::{Deserialize, Serialize};

/// The largest payload an event may carry (Consul's limit, set by its gossip messages).
pub const MAX_PAYLOAD: usize = 512;
/// How many events the catalog keeps; older ones are dropped as new ones are fired.
pub const KEPT: usize = 256;

/// One event.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct UserEvent {
    /// Its id (a UUID).
    #[serde(rename = "ID")]
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its payload: base64 in JSON, `null` when empty.
    #[serde(
        default,
        serialize_with = "crate::kv::value_out",
        deserialize_with = "crate::kv::value_in"
    )]
    pub payload: Vec<u8>,
    /// A regular expression of the node names it is for ("" for all).
    #[serde(default)]
    pub node_filter: String,
    /// A regular expression of the service names it is for ("" for all).
    #[serde(default)]
    pub service_filter: String,
    /// A regular expression of the tags it is for (with a service filter; "" for all).
    #[serde(default)]
    pub tag_filter: String,
    /// Consul's event format version.
    #[serde(default)]
    pub version: u32,
    /// Its place among the events (a Lamport time in Consul; here the order fired).
    #[serde(default, rename = "LTime")]
    pub ltime: u64,
}

impl UserEvent {
    /// Checks the filters are regular expressions, naming the one that is not.
    pub fn validate(&self) -> Result<(), crate::ValidationError> {
        for (field, re) in [
            ("node", &self.node_filter),
            ("service", &self.service_filter),
            ("tag", &self.tag_filter),
        ] {
            if let Err(e) = regex::Regex::new(re) {
                return Err(crate::ValidationError::new(
                    field,
                    crate::Problem::Invalid(format!("not a regular expression: {e}")),
                ));
            }
        }
        if !self.tag_filter.is_empty() && self.service_filter.is_empty() {
            return Err(crate::ValidationError::new(
                "tag",
                crate::Problem::Invalid("a tag filter needs a service filter".into()),
            ));
        }
        Ok(())
    }

    /// Whether the event is for a node named `node` running `services` (name and tags), as
    /// Consul's agents decide which events they keep.
    pub fn is_for<'a>(&self, node: &str, services: impl IntoIterator<Item = (&'a str, &'a [String])>) -> bool {
        let matches = |re: &str, text: &str| re.is_empty() || regex::Regex::new(re).is_ok_and(|r| r.is_match(text));
        if !matches(&self.node_filter, node) {
            return false;
        }
        if self.service_filter.is_empty() {
            return true;
        }
        services.into_iter().any(|(name, tags)| {
            matches(&self.service_filter, name)
                && (self.tag_filter.is_empty() || tags.iter().any(|t| matches(&self.tag_filter, t)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_select_nodes_services_and_tags() {
        let e = UserEvent {
            node_filter: "^web-".into(),
            service_filter: "api".into(),
            tag_filter: "v2".into(),
            ..UserEvent::default()
        };
        let tags = vec!["v2".to_owned()];
        assert!(e.is_for("web-1", [("api", tags.as_slice())]));
        assert!(!e.is_for("db-1", [("api", tags.as_slice())]));
        assert!(!e.is_for("web-1", [("api", &[][..])]));
        assert!(!e.is_for("web-1", []));
        assert!(UserEvent::default().is_for("any", []));
        let bad = UserEvent {
            node_filter: "(".into(),
            ..UserEvent::default()
        };
        assert_eq!(bad.validate().unwrap_err().field, "node");
        let json = serde_json::to_value(UserEvent {
            payload: b"hi".to_vec(),
            ..UserEvent::default()
        })
        .unwrap();
        assert_eq!(json["Payload"], "aGk=");
        assert_eq!(json["LTime"], 0);
    }
}
