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

/// The resources of one type by name.
pub type TypeResources = BTreeMap<String, Arc<Versioned>>;

/// Every resource of a snapshot by type URL then name, with versions. Built once per
/// snapshot and shared by every stream of the proxy.
#[derive(Debug, Clone, Default)]
pub struct VersionedResources {
    /// type URL → name → resource. Each type's map is shared (`Arc`): a build that reuses a
    /// type from the previous one shares the very map, which tells a stream's protocol state
    /// that nothing of that type can have changed.
    pub by_type: BTreeMap<&'static str, Arc<TypeResources>>,
    /// The snapshot these were built from (when built from one): the next build of the same
    /// proxy compares its inputs with it to reuse what cannot have changed.
    pub snapshot: Option<Arc<ConfigSnapshot>>,
}

/// SHA-256 of a resource's encoding.
pub(crate) fn digest_of(any: &Any) -> [u8; 32] {
    Sha256::digest(&any.value).into()
}

impl Versioned {
    /// A resource with its content version.
    pub fn new(resource: Any) -> Self {
        let digest = digest_of(&resource);
        Self::with_digest(resource, &digest)
    }

    /// A resource whose encoding hashes to `digest`.
    pub(crate) fn with_digest(resource: Any, digest: &[u8; 32]) -> Self {
        Self {
            // `hex::encode` collects an exact-size iterator: one allocation of the final
            // length, as the hand-written encoder it replaced did.
            version: hex::encode(digest),
            resource,
        }
    }
}

impl VersionedResources {
    /// Hashes every resource of `resources`; with `shared`, a resource some other proxy
    /// already has (same type and encoding) is that proxy's very `Arc`, stored once.
    pub fn from_resources(resources: Resources, shared: Option<&resources::SharedEncodings>) -> Self {
        let mut by_type: BTreeMap<&'static str, TypeResources> = resources
            .by_type
            .into_iter()
            .map(|(t, m)| {
                (
                    t,
                    m.into_iter()
                        .map(|(name, resource)| {
                            let v = match shared {
                                Some(shared) => shared.intern(t, resource),
                                None => Arc::new(Versioned::new(resource)),
                            };
                            (name, v)
                        })
                        .collect(),
                )
            })
            .collect();
        for (t, m) in resources.shared {
            by_type.entry(t).or_default().extend(m);
        }
        Self {
            by_type: by_type.into_iter().map(|(t, m)| (t, Arc::new(m))).collect(),
            snapshot: None,
        }
    }

    /// Builds and hashes the resources of a snapshot; shared resources come from `shared`.
    pub fn build(
        snapshot: &ConfigSnapshot,
        shared: Option<&resources::SharedEncodings>,
    ) -> Result<Self, resources::BuildError> {
        resources::build_shared(snapshot, shared).map(|r| Self::from_resources(r, shared))
    }

    /// Like [`Self::build`], but when `previous` was built from a snapshot of the same proxy
    /// that differs only in endpoints, reuses its clusters, listeners and routes (no build,
    /// encode or hash) and builds only the load assignments. The result equals a full build.
    pub fn build_after(
        snapshot: &Arc<ConfigSnapshot>,
        shared: Option<&resources::SharedEncodings>,
        previous: Option<&VersionedResources>,
    ) -> Result<Self, resources::BuildError> {
        let reusable = previous.filter(|p| {
            p.snapshot
                .as_ref()
                .is_some_and(|prev| resources::same_except_endpoints(prev, snapshot))
        });
        let mut built = match reusable {
            Some(prev) => {
                let mut by_type = prev.by_type.clone();
                by_type.remove(resources::ENDPOINT);
                let endpoints = Self::from_resources(resources::build_endpoints(snapshot, shared)?, shared);
                by_type.extend(endpoints.by_type);
                Self {
                    by_type,
                    snapshot: None,
                }
            }
            None => Self::build(snapshot, shared)?,
        };
        built.snapshot = Some(Arc::clone(snapshot));
        Ok(built)
    }

    /// The shared map of one type's resources.
    pub fn map(&self, type_url: &str) -> Option<&Arc<TypeResources>> {
        self.by_type.get(type_url)
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

/// Test resources from `(type URL, name, encoded body)` triples.
#[cfg(test)]
pub(crate) fn test_resources(items: &[(&'static str, &str, &[u8])]) -> VersionedResources {
    let mut r = Resources::default();
    for (t, name, body) in items {
        r.by_type.entry(t).or_default().insert(
            (*name).to_owned(),
            Any {
                type_url: (*t).to_owned(),
                value: body.to_vec(),
            },
        );
    }
    VersionedResources::from_resources(r, None)
}
