//! Envoy resources built from a proxycfg snapshot: clusters, endpoints, listeners and route
//! configurations for a connect-proxy (sidecar).
//!
//! Layout (names follow Consul's so tools and habits carry over; certificates over SDS):
//! - secrets `default` (the proxy's leaf certificate and key) and `ROOTCA` (the CA bundle),
//!   referenced by every TLS context and fetched by Envoy over the same ADS stream, so each
//!   proxy holds its certificates once rather than in every cluster and listener.
//! - `local_app`: static cluster to the local application.
//! - one EDS cluster per discovery-chain target, named by the target's SNI
//!   (`<service>.default.<dc>.internal.<trust-domain>`), with upstream mTLS: our leaf and the
//!   CA bundle (SDS), SNI, and a SAN match on the target service's SPIFFE id.
//! - `public_listener:<addr>:<port>`: inbound mTLS requiring a client certificate, intentions
//!   enforced by RBAC, then `local_app` (tcp_proxy, or HTTP connection manager for L7
//!   protocols).
//! - `<upstream>:<bind addr>:<bind port>`: one outbound listener per upstream (tcp_proxy, or
//!   HTTP connection manager with RDS for L7 protocols).
//! - route configurations named after the upstream for L7 upstreams.

mod clusters;
mod core;
mod gateways;
mod listeners;
pub mod proxyless;
mod rbac;
mod routes;
mod tls;

pub use tls::{LEAF_SECRET, ROOTS_SECRET};

use crate::content::Versioned;
use bounded_maps::SweptMap;
use envoy_types::pb::google::protobuf::Any;
use parking_lot::Mutex;
use proxycfg::ConfigSnapshot;
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use structs::CheckServiceNode;

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
}

/// The part of a build holding the proxy-wide resources (secrets, local_app, the public
/// listener).
pub const COMMON: &str = "";

/// What a build makes: the proxy-wide part or not, and which upstreams.
pub(crate) struct Scope<'a> {
    common: bool,
    upstream: &'a dyn Fn(&structs::UpstreamId) -> bool,
}

impl Scope<'_> {
    pub(crate) fn common(&self) -> bool {
        self.common
    }

    pub(crate) fn upstream(&self, id: &structs::UpstreamId) -> bool {
        (self.upstream)(id)
    }
}

const EVERYTHING: Scope<'static> = Scope {
    common: true,
    upstream: &|_| true,
};

impl Resources {
    /// Records that `part` could not be built and which of its resources keep their last
    /// good version.
    fn fail(&mut self, part: String, problem: String, keep: impl IntoIterator<Item = (&'static str, String)>) {
        for (t, name) in keep {
            self.keep.push((part.clone(), t, name));
        }
        self.problems.insert(part, problem);
    }

    fn insert(&mut self, type_url: &'static str, name: String, resource: Any) {
        self.by_type.entry(type_url).or_default().insert(name, resource);
    }

    fn insert_shared(&mut self, type_url: &'static str, name: String, resource: Arc<Versioned>) {
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

/// Builds every resource for a snapshot.
pub fn build(snapshot: &ConfigSnapshot) -> Result<Resources, BuildError> {
    build_shared(snapshot, None)
}

/// Builds every resource for a snapshot, taking resources that many proxies share (load
/// assignments of the same endpoints) from `shared`: built, encoded and hashed once.
pub fn build_shared(snapshot: &ConfigSnapshot, shared: Option<&SharedEncodings>) -> Result<Resources, BuildError> {
    build_scoped(snapshot, shared, &EVERYTHING)
}

/// Builds every load assignment, the proxy-wide resources if `scope` says so, and the
/// resources of the upstreams it names.
pub(crate) fn build_scoped(
    snapshot: &ConfigSnapshot,
    shared: Option<&SharedEncodings>,
    scope: &Scope<'_>,
) -> Result<Resources, BuildError> {
    let mut out = Resources::default();
    if scope.common() {
        tls::build_secrets(snapshot, &mut out)?;
    }
    match &snapshot.kind {
        proxycfg::KindSnapshot::ConnectProxy(cp) if snapshot.service.connect.native => {
            proxyless::build(snapshot, cp, &mut out)?;
            clusters::build_endpoints(snapshot, &mut out, shared)?;
            return Ok(out);
        }
        proxycfg::KindSnapshot::ConnectProxy(_) => {}
        proxycfg::KindSnapshot::IngressGateway(g) => {
            gateways::build_ingress(snapshot, g, &mut out)?;
            clusters::build_endpoints(snapshot, &mut out, shared)?;
            return Ok(out);
        }
        proxycfg::KindSnapshot::TerminatingGateway(g) => {
            gateways::build_terminating(snapshot, g, &mut out)?;
            return Ok(out);
        }
    }
    clusters::build(snapshot, &mut out, scope)?;
    clusters::build_endpoints(snapshot, &mut out, shared)?;
    listeners::build(snapshot, &mut out, scope)?;
    Ok(out)
}

/// Builds what differs from `previous` (built from `prev`): when every proxy-wide input is
/// the same, only the upstreams whose chain or position changed are built (with every load
/// assignment); the rest is taken from `previous`'s parts by the caller. `None`: a full
/// build is needed.
pub(crate) fn build_changed(
    snapshot: &ConfigSnapshot,
    prev: &ConfigSnapshot,
    shared: Option<&SharedEncodings>,
) -> Option<(Result<Resources, BuildError>, Vec<String>)> {
    // A proxyless client's build is small and all of a piece: always whole.
    if !same_proxy_wide(prev, snapshot) || snapshot.service.connect.native {
        return None;
    }
    let (Some(x), Some(y)) = (prev.connect_proxy(), snapshot.connect_proxy()) else {
        return None;
    };
    let reused: Vec<String> = y
        .upstreams
        .iter()
        .filter(|(id, u)| {
            x.upstreams
                .get(*id)
                .is_some_and(|p| p.index == u.index && same_arc(&p.chain, &u.chain))
        })
        .map(|(id, _)| id.to_string())
        .collect();
    let rebuild = |id: &structs::UpstreamId| !reused.contains(&id.to_string());
    let scope = Scope {
        common: false,
        upstream: &rebuild,
    };
    Some((build_scoped(snapshot, shared, &scope), reused))
}

/// Builds only the load assignments of a snapshot (see [`same_except_endpoints`]).
pub fn build_endpoints(snapshot: &ConfigSnapshot, shared: Option<&SharedEncodings>) -> Result<Resources, BuildError> {
    let mut out = Resources::default();
    clusters::build_endpoints(snapshot, &mut out, shared)?;
    Ok(out)
}

/// The resources (other than load assignments) that `part` of a build of `snap` makes:
/// [`COMMON`] for the proxy-wide ones, else an upstream's id. Derived from the snapshot
/// (the names the builders give), so a build holds no list of its own names.
pub(crate) fn part_names(snap: &ConfigSnapshot, part: &str) -> Vec<(&'static str, String)> {
    let Some(cp) = snap.connect_proxy() else {
        return Vec::new();
    };
    if part == COMMON {
        return vec![
            (SECRET, LEAF_SECRET.to_owned()),
            (SECRET, ROOTS_SECRET.to_owned()),
            (CLUSTER, clusters::LOCAL_APP.to_owned()),
            (LISTENER, listeners::public_listener_name(snap)),
        ];
    }
    let mut names = Vec::new();
    for (id, upstream) in cp.upstreams.iter() {
        if id.to_string() != part {
            continue;
        }
        let Some(chain) = &upstream.chain else { continue };
        for target in chain.targets.values() {
            names.push((CLUSTER, target.sni.clone()));
        }
        for node in chain.nodes.values() {
            if let Some(r) = &node.resolver
                && r.failover.is_some()
                && let Some(primary) = chain.targets.get(&r.target)
            {
                names.push((CLUSTER, clusters::failover_cluster_name(&primary.sni)));
            }
        }
        if let Some(config) = snap.upstream_config(upstream)
            && config.local_bind_port != 0
        {
            let (listener, route) = listeners::upstream_names(id, config);
            names.push((LISTENER, listener));
            if chain.protocol.is_http() {
                names.push((ROUTE, route));
            }
        }
    }
    names
}

/// Builds the load assignments of the targets whose endpoints differ (by `Arc` identity)
/// from `prev`'s; for a snapshot whose chains are `prev`'s (see [`same_except_endpoints`]).
pub fn build_endpoints_since(
    snapshot: &ConfigSnapshot,
    prev: &ConfigSnapshot,
    shared: Option<&SharedEncodings>,
) -> Result<Resources, BuildError> {
    let mut out = Resources::default();
    // An upstream whose snapshot is the very same `Arc` has the same endpoints: skipped
    // without looking at its targets (an endpoint change touches one upstream's entry).
    let unchanged: Vec<&structs::UpstreamId> = match (upstreams_of(snapshot), upstreams_of(prev)) {
        (Some(now), Some(before)) => now
            .iter()
            .filter(|(id, u)| before.get(*id).is_some_and(|p| Arc::ptr_eq(p, u)))
            .map(|(id, _)| &**id)
            .collect(),
        _ => Vec::new(),
    };
    clusters::build_endpoints_where(snapshot, &mut out, shared, |upstream, target, nodes| {
        if unchanged.iter().any(|u| std::ptr::eq(*u, upstream)) {
            return false;
        }
        let before = upstreams_of(prev)
            .and_then(|u| u.get(upstream))
            .and_then(|u| u.endpoints.get(target));
        !matches!((before, nodes), (Some(a), Some(b)) if Arc::ptr_eq(a, b))
    })?;
    Ok(out)
}

/// The upstreams followed through chains: a sidecar's, or the services an ingress gateway
/// exposes.
fn upstreams_of(snap: &ConfigSnapshot) -> Option<&BTreeMap<Arc<structs::UpstreamId>, Arc<proxycfg::UpstreamSnapshot>>> {
    match &snap.kind {
        proxycfg::KindSnapshot::ConnectProxy(cp) => Some(&cp.upstreams),
        proxycfg::KindSnapshot::IngressGateway(g) => Some(&g.upstreams),
        proxycfg::KindSnapshot::TerminatingGateway(_) => None,
    }
}

/// The same upstreams with the same chains (endpoints aside).
fn same_chains(
    x: &Arc<BTreeMap<Arc<structs::UpstreamId>, Arc<proxycfg::UpstreamSnapshot>>>,
    y: &Arc<BTreeMap<Arc<structs::UpstreamId>, Arc<proxycfg::UpstreamSnapshot>>>,
) -> bool {
    Arc::ptr_eq(x, y)
        || (x.len() == y.len()
            && x.iter()
                .zip(y.iter())
                .all(|((ka, ua), (kb, ub))| ka == kb && ua.index == ub.index && same_arc(&ua.chain, &ub.chain)))
}

fn same_known_entry(
    a: &Option<Option<Arc<structs::ConfigEntry>>>,
    b: &Option<Option<Arc<structs::ConfigEntry>>>,
) -> bool {
    match (a, b) {
        (Some(m), Some(n)) => same_arc(m, n),
        (None, None) => true,
        _ => false,
    }
}

fn same_arc<T: ?Sized>(a: &Option<Arc<T>>, b: &Option<Arc<T>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// True when every input the resource builders read, except the upstreams' endpoints, is
/// the same in both snapshots: then only load assignments can differ between their builds.
///
/// Inputs are compared by `Arc` identity (proxycfg keeps the `Arc` of an unchanged input
/// from one snapshot to the next), so this is cheap and never wrong: different `Arc`s with
/// equal content just mean a full build.
pub fn same_except_endpoints(a: &ConfigSnapshot, b: &ConfigSnapshot) -> bool {
    if let (Some(x), Some(y)) = (a.ingress_gateway(), b.ingress_gateway()) {
        return same_common(a, b)
            && same_arc(&x.leaf, &y.leaf)
            && same_known_entry(&x.entry, &y.entry)
            && same_known_entry(&x.mesh_config, &y.mesh_config)
            && same_arc(&x.services, &y.services)
            && same_chains(&x.upstreams, &y.upstreams);
    }
    let (Some(x), Some(y)) = (a.connect_proxy(), b.connect_proxy()) else {
        return false;
    };
    same_proxy_wide(a, b) && same_chains(&x.upstreams, &y.upstreams)
}

/// The inputs every kind's resources read: the proxy, its registration, datacenter, roots.
fn same_common(a: &ConfigSnapshot, b: &ConfigSnapshot) -> bool {
    a.proxy_id == b.proxy_id
        && Arc::ptr_eq(&a.service, &b.service)
        && a.datacenter == b.datacenter
        && same_arc(&a.roots, &b.roots)
}

/// True when every input other than the upstreams' chains and endpoints is the same (by
/// `Arc` identity): the proxy-wide resources, and the resources of an upstream whose chain
/// is the same, are then the same too.
fn same_proxy_wide(a: &ConfigSnapshot, b: &ConfigSnapshot) -> bool {
    let (Some(x), Some(y)) = (a.connect_proxy(), b.connect_proxy()) else {
        return false;
    };
    same_common(a, b)
        && same_arc(&x.leaf, &y.leaf)
        && same_arc(&x.intentions, &y.intentions)
        && same_known_entry(&x.mesh_config, &y.mesh_config)
        && same_arc(&x.resolved_config, &y.resolved_config)
        && Arc::ptr_eq(&x.http_checks, &y.http_checks)
}

/// Load assignment key: the cluster name and the identity of the shared endpoints result.
type ClaKey = (String, usize);

/// A resource by content: its type URL and the SHA-256 of its encoding.
type ContentKey = (&'static str, [u8; 32]);

/// The endpoints a load assignment was built from and the encoding (both weak: the cache
/// keeps nothing alive).
type ClaEntry = (Weak<Vec<CheckServiceNode>>, Weak<Versioned>);

/// Encoded resources shared between proxies, held weakly (the proxies' resource sets keep
/// them alive):
/// - load assignments by cluster name and endpoints: the data sources hand every proxy
///   watching a target the same endpoints `Arc`, so one build and encoding serves them all;
/// - every other resource by type and content hash: the cluster of an upstream, the CA
///   bundle secret, an outbound listener on the same port are byte-for-byte the same for many
///   proxies, and each such resource is then held once however many proxies have it.
#[derive(Default)]
pub struct SharedEncodings {
    load_assignments: Mutex<SweptMap<ClaKey, ClaEntry>>,
    interned: Mutex<SweptMap<ContentKey, Weak<Versioned>>>,
}

impl std::fmt::Debug for SharedEncodings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedEncodings")
            .field("load_assignments", &self.load_assignments.lock().len())
            .finish()
    }
}

impl SharedEncodings {
    /// The encoded load assignment of `cluster` for `endpoints`, built by `make` if needed.
    pub(crate) fn load_assignment(
        &self,
        cluster: &str,
        endpoints: &Arc<Vec<CheckServiceNode>>,
        make: impl FnOnce() -> Any,
    ) -> Arc<Versioned> {
        let key = (cluster.to_owned(), Arc::as_ptr(endpoints) as usize);
        if let Some((weak, v)) = self.load_assignments.lock().get(&key)
            && weak.upgrade().is_some_and(|e| Arc::ptr_eq(&e, endpoints))
            && let Some(v) = v.upgrade()
        {
            return v;
        }
        let versioned = self.intern(ENDPOINT, make());
        self.load_assignments.lock().insert(
            key,
            (Arc::downgrade(endpoints), Arc::downgrade(&versioned)),
            |_, (w, v)| w.strong_count() > 0 && v.strong_count() > 0,
        );
        versioned
    }

    /// The resource of `type_url` encoded as `resource`: the `Arc` another proxy already
    /// holds for the same encoding, else this one's, recorded for the next.
    pub(crate) fn intern(&self, type_url: &'static str, resource: Any) -> Arc<Versioned> {
        let digest = crate::content::digest_of(&resource);
        let key = (type_url, digest);
        if let Some(v) = self.interned.lock().get(&key).and_then(Weak::upgrade) {
            return v;
        }
        let versioned = Arc::new(Versioned::with_digest(resource, &digest));
        self.interned
            .lock()
            .insert(key, Arc::downgrade(&versioned), |_, w| w.strong_count() > 0);
        versioned
    }

    /// Distinct resources held by content (not counting load assignments).
    pub fn interned_len(&self) -> usize {
        self.interned.lock().values().filter(|w| w.strong_count() > 0).count()
    }

    /// Load assignments held now.
    pub fn len(&self) -> usize {
        self.load_assignments.lock().len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod type_tests {
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
