//! What a build produces: the resources of one snapshot by type, the type URLs served, the
//! parts a build may be limited to, and why a build fails.

use crate::content::Versioned;
use envoy_types::pb::google::protobuf::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Type URL of clusters.
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Type URL of endpoints.
pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// Type URL of listeners.
pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
/// Type URL of route configurations.
pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";

/// Type URL of secrets (SDS over ADS: the proxy's leaf and the CA roots).
pub const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

/// The resource types in make-before-break order (secrets first: a rotated certificate is in
/// place before anything that could need it).
pub const TYPES: [&str; 5] = [SECRET, CLUSTER, ENDPOINT, LISTENER, ROUTE];

/// A resource type meshd serves; its discriminant is its position in [`TYPES`], so
/// per-type state lives in fixed arrays indexed by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResourceType {
    /// Secrets (SDS).
    Secret = 0,
    /// Clusters (CDS).
    Cluster = 1,
    /// Load assignments (EDS).
    Endpoint = 2,
    /// Listeners (LDS).
    Listener = 3,
    /// Route configurations (RDS).
    Route = 4,
}

impl ResourceType {
    /// Every type, in make-before-break order.
    pub const ALL: [ResourceType; 5] = [
        ResourceType::Secret,
        ResourceType::Cluster,
        ResourceType::Endpoint,
        ResourceType::Listener,
        ResourceType::Route,
    ];

    /// The type of `type_url`, if meshd serves it.
    pub fn from_url(type_url: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.url() == type_url)
    }

    /// The type URL.
    pub fn url(self) -> &'static str {
        TYPES[self.index()]
    }

    /// Its position in [`TYPES`] (and in per-type arrays).
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Every resource of one snapshot, by type URL then name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resources {
    /// type URL → (name → resource).
    pub by_type: BTreeMap<&'static str, BTreeMap<String, Any>>,
    /// Resources taken already encoded and versioned from a [`SharedEncodings`] cache.
    pub shared: BTreeMap<&'static str, BTreeMap<String, Arc<Versioned>>>,
    /// Parts that could not be built, by what failed (an upstream): the problem.
    pub problems: BTreeMap<String, String>,
    /// Resources the failed parts keep from the last good build (part, type URL, name).
    pub keep: Vec<(String, &'static str, String)>,
    /// The shared outbound part (a transparent proxy's) this build took, its resources among
    /// `shared`: what the proxy's next build replaces when it builds that part again.
    pub outbound_part: Option<Arc<Resources>>,
}

/// The part of a build holding the proxy-wide resources (secrets, local_app, the public
/// listener).
pub const COMMON: &str = "";

/// The part of a build holding a transparent proxy's outbound listener, the passthrough
/// clusters and the routes only it uses (not a possible upstream id).
pub const OUTBOUND: &str = ":outbound";

/// What a build makes: the proxy-wide part or not, and which upstreams.
pub(crate) struct Scope<'a> {
    pub(super) common: bool,
    /// A transparent proxy's outbound listener (and what only it uses).
    pub(super) outbound: bool,
    /// The snapshot and shared outbound part of the proxy's previous build, when this one
    /// builds the outbound part again: another proxy that went from the same part through
    /// the same change may have found the next one already.
    pub(super) outbound_from: Option<(&'a proxycfg::ConfigSnapshot, &'a Arc<Resources>)>,
    pub(super) upstream: &'a dyn Fn(&structs::UpstreamId) -> bool,
    /// The upstreams whose load assignments a sidecar's build makes (the others are taken
    /// from the previous build by the caller).
    pub(super) endpoints: &'a dyn Fn(&structs::UpstreamId) -> bool,
}

impl Scope<'_> {
    pub(crate) fn common(&self) -> bool {
        self.common
    }

    pub(crate) fn upstream(&self, id: &structs::UpstreamId) -> bool {
        (self.upstream)(id)
    }
}

pub(super) const EVERYTHING: Scope<'static> = Scope {
    common: true,
    outbound: true,
    outbound_from: None,
    upstream: &|_| true,
    endpoints: &|_| true,
};

impl Resources {
    /// Records that `part` could not be built and which of its resources keep their last
    /// good version.
    pub(super) fn fail(
        &mut self,
        part: String,
        problem: String,
        keep: impl IntoIterator<Item = (&'static str, String)>,
    ) {
        for (t, name) in keep {
            self.keep.push((part.clone(), t, name));
        }
        self.problems.insert(part, problem);
    }

    pub(super) fn insert(&mut self, type_url: &'static str, name: String, resource: Any) {
        self.by_type.entry(type_url).or_default().insert(name, resource);
    }

    /// Adds (a copy of) everything `part` holds: its resources, problems and kept names.
    pub(super) fn extend_from(&mut self, part: &Resources) {
        for (type_url, resources) in &part.by_type {
            let mine = self.by_type.entry(type_url).or_default();
            mine.extend(resources.iter().map(|(n, r)| (n.clone(), r.clone())));
        }
        for (type_url, resources) in &part.shared {
            let mine = self.shared.entry(type_url).or_default();
            mine.extend(resources.iter().map(|(n, r)| (n.clone(), Arc::clone(r))));
        }
        self.problems
            .extend(part.problems.iter().map(|(k, v)| (k.clone(), v.clone())));
        self.keep.extend(part.keep.iter().cloned());
    }

    pub(super) fn insert_shared(&mut self, type_url: &'static str, name: String, resource: Arc<Versioned>) {
        self.shared.entry(type_url).or_default().insert(name, resource);
    }

    /// The resources of one type.
    pub fn of(&self, type_url: &str) -> Option<&BTreeMap<String, Any>> {
        self.by_type.get(type_url)
    }
}

/// Why a snapshot could not be turned into resources.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The snapshot is missing something a valid snapshot has.
    #[error("snapshot incomplete: {0}")]
    Incomplete(&'static str),
    /// The proxy's configuration cannot be expressed.
    #[error("{0}")]
    Invalid(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_types_round_trip_through_their_urls_in_order() {
        for (i, t) in ResourceType::ALL.into_iter().enumerate() {
            assert_eq!(t.index(), i);
            assert_eq!(ResourceType::from_url(t.url()), Some(t));
        }
        assert_eq!(ResourceType::from_url("type.googleapis.com/other"), None);
    }
}
