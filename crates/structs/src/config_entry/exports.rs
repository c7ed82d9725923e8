//! `exported-services`: which services each peer may import.

use super::check_entry_name;
use crate::Index;
use crate::validate::{Problem, Validate, ValidationError};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The services this cluster exports, and to which peers. One entry, named `default` (the
/// partition's name; meshd has only the default partition).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExportedServices {
    /// `default`.
    #[serde(rename = "Name")]
    pub name: String,
    /// The exported services.
    #[serde(rename = "Services", skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ExportedService>,
    /// User metadata; keys untouched.
    #[serde(rename = "Meta", skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

/// One service (or `*`, every service) and who may import it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExportedService {
    /// The service, or `*`.
    #[serde(rename = "Name")]
    pub name: String,
    /// Only `default`.
    #[serde(rename = "Namespace", skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Who imports it.
    #[serde(rename = "Consumers", skip_serializing_if = "Vec::is_empty")]
    pub consumers: Vec<ServiceConsumer>,
}

/// One importer of an exported service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceConsumer {
    /// A peer, by the name this cluster gives it.
    #[serde(rename = "Peer", skip_serializing_if = "String::is_empty")]
    pub peer: String,
    /// A partition (only peers are supported).
    #[serde(rename = "Partition", skip_serializing_if = "String::is_empty")]
    pub partition: String,
    /// A sameness group (not supported).
    #[serde(rename = "SamenessGroup", skip_serializing_if = "String::is_empty")]
    pub sameness_group: String,
}

impl ExportedServices {
    /// The services exported to `peer`, among `registered` (what `*` expands to), sorted:
    /// a name is exported when it is listed (exactly, or by `*`) with the peer as a consumer.
    pub fn exported_to<'a>(&'a self, peer: &str, registered: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
        let to_peer = |s: &ExportedService| s.consumers.iter().any(|c| c.peer == peer);
        let mut out: BTreeSet<String> = self
            .services
            .iter()
            .filter(|s| s.name != "*" && to_peer(s))
            .map(|s| s.name.clone())
            .collect();
        if self.services.iter().any(|s| s.name == "*" && to_peer(s)) {
            out.extend(registered.into_iter().map(str::to_owned));
        }
        out
    }

    /// The peers `service` is exported to.
    pub fn peers_of(&self, service: &str) -> BTreeSet<String> {
        self.services
            .iter()
            .filter(|s| s.name == service || s.name == "*")
            .flat_map(|s| s.consumers.iter().map(|c| c.peer.clone()))
            .filter(|p| !p.is_empty())
            .collect()
    }
}

impl Validate for ExportedServices {
    fn validate(&self) -> Result<(), ValidationError> {
        check_entry_name(super::ConfigEntryKind::ExportedServices, &self.name)?;
        let mut seen = BTreeSet::new();
        for (i, service) in self.services.iter().enumerate() {
            let at = format!("Services[{i}]");
            if service.name.is_empty() {
                return Err(ValidationError::new(format!("{at}.Name"), Problem::Required("")));
            }
            if service.name != "*" {
                crate::validate::check_name(&format!("{at}.Name"), &service.name, "")?;
            }
            if !(service.namespace.is_empty() || service.namespace == "default") {
                return Err(ValidationError::new(
                    format!("{at}.Namespace"),
                    Problem::Invalid(format!("only \"default\" is supported, got {:?}", service.namespace)),
                ));
            }
            if !seen.insert(service.name.as_str()) {
                return Err(ValidationError::new(
                    format!("{at}.Name"),
                    Problem::Duplicate(format!("service {:?}", service.name)),
                ));
            }
            if service.consumers.is_empty() {
                return Err(ValidationError::new(
                    format!("{at}.Consumers"),
                    Problem::Required("(at least one peer)"),
                ));
            }
            check_consumers(&at, &service.consumers)?;
        }
        Ok(())
    }
}

fn check_consumers(at: &str, consumers: &[ServiceConsumer]) -> Result<(), ValidationError> {
    let mut peers = BTreeSet::new();
    for (j, consumer) in consumers.iter().enumerate() {
        let at = format!("{at}.Consumers[{j}]");
        if !consumer.sameness_group.is_empty() {
            return Err(ValidationError::new(
                format!("{at}.SamenessGroup"),
                Problem::Invalid("sameness groups are not supported: name a Peer".into()),
            ));
        }
        if !consumer.partition.is_empty() {
            return Err(ValidationError::new(
                format!("{at}.Partition"),
                Problem::Invalid("admin partitions are not supported: name a Peer".into()),
            ));
        }
        if consumer.peer == "*" {
            return Err(ValidationError::new(
                format!("{at}.Peer"),
                Problem::Invalid("a wildcard peer is not supported: name each peer".into()),
            ));
        }
        crate::validate::check_peer_name(&format!("{at}.Peer"), &consumer.peer)?;
        if !peers.insert(consumer.peer.as_str()) {
            return Err(ValidationError::new(
                format!("{at}.Peer"),
                Problem::Duplicate(format!("peer {:?}", consumer.peer)),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ConfigEntry;

    fn entry(json: serde_json::Value) -> Result<ConfigEntry, String> {
        let entry = ConfigEntry::from_json(json).map_err(|e| e.to_string())?;
        entry.validate().map_err(|e| e.to_string())?;
        Ok(entry)
    }

    #[test]
    fn consul_json_is_read_and_wildcards_expand() {
        let e = entry(serde_json::json!({
            "Kind": "exported-services", "Name": "default",
            "Services": [
                {"Name": "api", "Consumers": [{"Peer": "cluster-b"}]},
                {"Name": "*", "Namespace": "default", "Consumers": [{"Peer": "cluster-c"}]}
            ]
        }))
        .expect("valid");
        let ConfigEntry::ExportedServices(e) = e else {
            panic!("kind")
        };
        assert_eq!(
            e.exported_to("cluster-b", ["api", "web"])
                .into_iter()
                .collect::<Vec<_>>(),
            ["api"]
        );
        assert_eq!(e.exported_to("cluster-c", ["api", "web"]).len(), 2);
        assert!(e.exported_to("cluster-d", ["api"]).is_empty());
        assert_eq!(e.peers_of("web").into_iter().collect::<Vec<_>>(), ["cluster-c"]);
        assert_eq!(e.peers_of("api").len(), 2);
    }

    #[test]
    fn bad_entries_name_the_field() {
        let cases = [
            (
                serde_json::json!({"Kind": "exported-services", "Name": "other", "Services": []}),
                "Name",
            ),
            (
                serde_json::json!({"Kind": "exported-services", "Name": "default", "Services": [{"Name": "api"}]}),
                "Services[0].Consumers: required",
            ),
            (
                serde_json::json!({"Kind": "exported-services", "Name": "default",
                    "Services": [{"Name": "api", "Consumers": [{"Partition": "p"}]}]}),
                "Services[0].Consumers[0].Partition",
            ),
            (
                serde_json::json!({"Kind": "exported-services", "Name": "default",
                    "Services": [{"Name": "api", "Consumers": [{"Peer": "B"}]}]}),
                "Services[0].Consumers[0].Peer",
            ),
            (
                serde_json::json!({"Kind": "exported-services", "Name": "default",
                    "Services": [{"Name": "api", "Consumers": [{"Peer": "b"}]},
                                 {"Name": "api", "Consumers": [{"Peer": "c"}]}]}),
                "Services[1].Name: duplicate",
            ),
        ];
        for (json, want) in cases {
            let err = entry(json).expect_err(want);
            assert!(err.contains(want), "{err} lacks {want}");
        }
    }
}
