//! Resources with content versions: what a stream diffs against what the proxy has.

use crate::resources::{self, Resources};
use envoy_types::pb::google::protobuf::Any;
use proxycfg::ConfigSnapshot;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One resource and the hash of its encoding.
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned {
    /// Hex SHA-256 of the encoded resource: equal content, equal version.
    pub version: String,
    /// The encoded resource.
    pub resource: Any,
}

/// Every resource of a snapshot by type URL then name, with versions. Built once per
/// snapshot and shared by every stream of the proxy.
#[derive(Debug, Clone, Default)]
pub struct VersionedResources {
    /// type URL → name → resource.
    pub by_type: BTreeMap<&'static str, BTreeMap<String, Arc<Versioned>>>,
}

fn version_of(any: &Any) -> String {
    let digest = Sha256::digest(&any.value);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

impl Versioned {
    /// A resource with its content version.
    pub fn new(resource: Any) -> Self {
        Self {
            version: version_of(&resource),
            resource,
        }
    }
}

impl VersionedResources {
    /// Hashes every resource of `resources`.
    pub fn from_resources(resources: Resources) -> Self {
        let mut by_type: BTreeMap<&'static str, BTreeMap<String, Arc<Versioned>>> = resources
            .by_type
            .into_iter()
            .map(|(t, m)| {
                (
                    t,
                    m.into_iter()
                        .map(|(name, resource)| (name, Arc::new(Versioned::new(resource))))
                        .collect(),
                )
            })
            .collect();
        for (t, m) in resources.shared {
            by_type.entry(t).or_default().extend(m);
        }
        Self { by_type }
    }

    /// Builds and hashes the resources of a snapshot; shared resources come from `shared`.
    pub fn build(
        snapshot: &ConfigSnapshot,
        shared: Option<&resources::SharedEncodings>,
    ) -> Result<Self, resources::BuildError> {
        resources::build_shared(snapshot, shared).map(Self::from_resources)
    }

    /// The resources of one type (empty if none).
    pub fn of(&self, type_url: &str) -> impl Iterator<Item = (&String, &Arc<Versioned>)> {
        self.by_type.get(type_url).into_iter().flat_map(|m| m.iter())
    }

    /// One resource.
    pub fn get(&self, type_url: &str, name: &str) -> Option<&Arc<Versioned>> {
        self.by_type.get(type_url).and_then(|m| m.get(name))
    }
}
