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

mod access_logs;
mod api_gateway;
mod changed;
mod clusters;
mod core;
mod destinations;
mod diff;
mod escape_hatch;
mod expose;
mod extensions;
mod gateways;
mod jwt;
mod listeners;
mod mesh_gateway;
pub mod proxyless;
mod rate_limit;
mod rbac;
mod routes;
mod set;
mod shared;
mod tls;
mod transparent;
mod upstreams;

pub(crate) use changed::{Changed, build_changed};
pub use diff::{FieldDiff, ResourceDiff, diff};
use set::EVERYTHING;
pub(crate) use set::Scope;
pub use set::{
    BuildError, CLUSTER, COMMON, ENDPOINT, LISTENER, OUTBOUND, ROUTE, ResourceType, Resources, SECRET, TYPES,
};
pub use shared::SharedEncodings;
pub use tls::{LEAF_SECRET, ROOTS_SECRET};

use proxycfg::ConfigSnapshot;
use std::collections::BTreeMap;
use std::sync::Arc;

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
    let mut out = build_kind(snapshot, shared, scope)?;
    report_other_datacenters(snapshot, &mut out);
    escape_hatch::apply_tracing(snapshot, &mut out)?;
    access_logs::apply(snapshot, &mut out)?;
    extensions::apply(snapshot, &mut out);
    Ok(out)
}

/// Names in the proxy's status each upstream with a target in another datacenter reached
/// through mesh gateways that has no way there: no healthy mesh gateway where the mode says. Built on every build (never carried by a
/// part: its key names no part).
fn report_other_datacenters(snap: &ConfigSnapshot, out: &mut Resources) {
    let Some(upstreams) = upstreams_of(snap) else { return };
    for (id, upstream) in upstreams.iter() {
        let Some(chain) = &upstream.chain else { continue };
        let mode = snap.service.proxy.upstream_mesh_gateway_mode(upstream.index);
        let ingress = matches!(snap.kind, proxycfg::KindSnapshot::IngressGateway(_));
        // A target in a peer in mode local goes through this datacenter's gateways.
        for (target_id, target) in chain.targets.iter().filter(|(_, t)| !t.peer.is_empty()) {
            if mode == structs::MeshGatewayMode::Local && upstream.endpoints.get(target_id).is_none_or(|e| e.is_empty())
            {
                out.problems.insert(
                    format!("{DATACENTER_PROBLEM}{id}:{target_id}"),
                    format!(
                        "upstream {id}: target {target_id} is in the peer {:?}: no healthy mesh gateway is known in datacenter {:?} (MeshGateway.Mode local)",
                        target.peer, snap.datacenter
                    ),
                );
            }
        }
        let elsewhere = |t: &&structs::DiscoveryTarget| t.peer.is_empty() && *t.datacenter != *snap.datacenter;
        for (target_id, target) in chain.targets.iter().filter(|(_, t)| elsewhere(t)) {
            let why = match mode {
                structs::MeshGatewayMode::Local | structs::MeshGatewayMode::Remote if ingress => format!(
                    "an ingress gateway reaches other datacenters' instances directly only (MeshGateway.Mode none); \
                     through mesh gateways (mode {}) is not built",
                    mode.as_str()
                ),
                structs::MeshGatewayMode::Local | structs::MeshGatewayMode::Remote => {
                    if upstream.endpoints.get(target_id).is_some_and(|e| !e.is_empty()) {
                        continue;
                    }
                    let at = if mode == structs::MeshGatewayMode::Local {
                        snap.datacenter.to_string()
                    } else {
                        target.datacenter.clone()
                    };
                    format!(
                        "no healthy mesh gateway is known in datacenter {at:?} (MeshGateway.Mode {})",
                        mode.as_str()
                    )
                }
                // Mode none: its instances, dialled directly, are watched as a local target's
                // are (a failure to learn them is the watch's error in the proxy's status).
                _ => continue,
            };
            out.problems.insert(
                format!("{DATACENTER_PROBLEM}{id}:{target_id}"),
                format!(
                    "upstream {id}: target {target_id} is in datacenter {:?}: {why}",
                    target.datacenter
                ),
            );
        }
    }
}

/// The problems of `problems` about other datacenters made again for `snap` (a build that
/// reuses everything but the load assignments: a gateway appearing changes only those).
pub(crate) fn refresh_datacenter_problems(snap: &ConfigSnapshot, problems: &mut BTreeMap<String, String>) {
    problems.retain(|key, _| !key.starts_with(DATACENTER_PROBLEM));
    let mut fresh = Resources::default();
    report_other_datacenters(snap, &mut fresh);
    problems.extend(fresh.problems);
}

/// The key prefix of [`report_other_datacenters`]'s problems.
const DATACENTER_PROBLEM: &str = "datacenter:";

/// What [`build_scoped`] builds before the access logs are added.
fn build_kind(
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
        proxycfg::KindSnapshot::ConnectProxy(cp) => {
            if scope.common() {
                expose::build(snapshot, cp, &mut out);
            }
        }
        proxycfg::KindSnapshot::IngressGateway(g) => {
            gateways::build_ingress(snapshot, g, &mut out)?;
            clusters::build_endpoints(snapshot, &mut out, shared)?;
            return Ok(out);
        }
        proxycfg::KindSnapshot::TerminatingGateway(g) => {
            gateways::build_terminating(snapshot, g, &mut out)?;
            return Ok(out);
        }
        proxycfg::KindSnapshot::ApiGateway(g) => {
            api_gateway::build(snapshot, g, &mut out)?;
            clusters::build_endpoints(snapshot, &mut out, shared)?;
            return Ok(out);
        }
        proxycfg::KindSnapshot::MeshGateway(g) => {
            mesh_gateway::build(snapshot, g, &mut out)?;
            return Ok(out);
        }
    }
    clusters::build(snapshot, &mut out, scope, shared)?;
    clusters::build_endpoints_where(snapshot, &mut out, shared, scope.endpoints, |_, _, _| true)?;
    listeners::build(snapshot, &mut out, scope)?;
    // It reads every upstream: built whole whenever what it matches on changed.
    if scope.outbound {
        transparent::build(snapshot, &mut out, shared, scope.outbound_from)?;
    }
    Ok(out)
}

/// The resources that change from a sidecar's snapshot `old` to `new`, what a dry run
/// answers: only the parts that differ are built (the proxy-wide ones when its intentions
/// or service config differ, and the upstreams whose snapshot was replaced), both times
/// alike, at most `max_fields` fields per resource.
pub fn diff_snapshots(
    old: &ConfigSnapshot,
    new: &ConfigSnapshot,
    max_fields: usize,
) -> Result<Vec<ResourceDiff>, BuildError> {
    let (Some(a), Some(b)) = (old.connect_proxy(), new.connect_proxy()) else {
        return Ok(diff(&build(old)?, &build(new)?, max_fields));
    };
    let common = a.intentions != b.intentions || a.resolved_config != b.resolved_config;
    let changed = |id: &structs::UpstreamId| match (a.upstreams.get(id), b.upstreams.get(id)) {
        (Some(x), Some(y)) => !Arc::ptr_eq(x, y),
        _ => true,
    };
    let outbound = b.transparent && b.upstreams.keys().any(|id| changed(id));
    let scope = Scope {
        common,
        outbound,
        outbound_from: None,
        upstream: &changed,
        endpoints: &|_| true,
    };
    Ok(diff(
        &build_scoped(old, None, &scope)?,
        &build_scoped(new, None, &scope)?,
        max_fields,
    ))
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
        let mut names = vec![
            (SECRET, LEAF_SECRET.to_owned()),
            (SECRET, ROOTS_SECRET.to_owned()),
            (CLUSTER, clusters::LOCAL_APP.to_owned()),
            (LISTENER, listeners::public_listener_name(snap)),
        ];
        names.extend(expose::names(snap, cp));
        names.extend(jwt::cluster_names(cp).into_iter().map(|n| (CLUSTER, n)));
        return names;
    }
    if part == OUTBOUND {
        return transparent::part_names(snap, cp);
    }
    let mut names = Vec::new();
    for (id, upstream) in cp.upstreams.iter() {
        // The name first: formatting every id for every part is quadratic in upstreams.
        if part.contains(id.name.as_str()) && id.to_string() == part {
            upstream_part_names(snap, id, upstream, &mut names);
        }
    }
    names
}

/// The resources of every part in `parts` (see [`part_names`]), the upstreams' in one walk
/// of them.
pub(crate) fn parts_names(snap: &ConfigSnapshot, parts: &[String]) -> Vec<(&'static str, String)> {
    let Some(cp) = snap.connect_proxy() else {
        return Vec::new();
    };
    let mut names = Vec::new();
    let mut upstreams = std::collections::HashSet::new();
    for part in parts {
        if part == COMMON || part == OUTBOUND {
            names.extend(part_names(snap, part));
        } else {
            upstreams.insert(part.as_str());
        }
    }
    if !upstreams.is_empty() {
        for (id, upstream) in cp.upstreams.iter() {
            if upstreams.contains(id.to_string().as_str()) {
                upstream_part_names(snap, id, upstream, &mut names);
            }
        }
    }
    names
}

/// The resources of upstream `id`'s part, added to `names`.
pub(super) fn upstream_part_names(
    snap: &ConfigSnapshot,
    id: &structs::UpstreamId,
    upstream: &proxycfg::UpstreamSnapshot,
    names: &mut Vec<(&'static str, String)>,
) {
    let Some(chain) = &upstream.chain else { return };
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
    if let Some(name) = snap.upstream_config(upstream).and_then(clusters::escape_hatch_name) {
        names.push((CLUSTER, name));
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
    let changed = |upstream: &structs::UpstreamId| !unchanged.iter().any(|u| std::ptr::eq(*u, upstream));
    clusters::build_endpoints_where(snapshot, &mut out, shared, changed, |upstream, target, nodes| {
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
        proxycfg::KindSnapshot::ApiGateway(g) => Some(&g.upstreams),
        proxycfg::KindSnapshot::TerminatingGateway(_) | proxycfg::KindSnapshot::MeshGateway(_) => None,
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
    if let (Some(x), Some(y)) = (a.api_gateway(), b.api_gateway()) {
        let same_lists =
            |p: &BTreeMap<structs::ConfigEntryKind, Arc<Vec<Arc<structs::ConfigEntry>>>>,
             q: &BTreeMap<structs::ConfigEntryKind, Arc<Vec<Arc<structs::ConfigEntry>>>>| {
                p.len() == q.len() && p.iter().zip(q).all(|((k, l), (j, m))| k == j && Arc::ptr_eq(l, m))
            };
        return same_common(a, b)
            && same_arc(&x.leaf, &y.leaf)
            && same_known_entry(&x.entry, &y.entry)
            && same_known_entry(&x.mesh_config, &y.mesh_config)
            && same_lists(&x.routes, &y.routes)
            && same_lists(&x.certificates, &y.certificates)
            && same_chains(&x.upstreams, &y.upstreams);
    }
    let (Some(x), Some(y)) = (a.connect_proxy(), b.connect_proxy()) else {
        return false;
    };
    // A transparent proxy's outbound listener matches on addresses its upstreams'
    // endpoints carry (virtual IPs, instances dialed directly): they must not have changed.
    same_proxy_wide(a, b)
        && same_chains(&x.upstreams, &y.upstreams)
        && (!y.transparent || transparent::same_matches(a, b))
}

/// The inputs every kind's resources read: the proxy, its registration, datacenter, roots,
/// and `proxy-defaults` (its access logs).
fn same_common(a: &ConfigSnapshot, b: &ConfigSnapshot) -> bool {
    a.proxy_id == b.proxy_id
        && Arc::ptr_eq(&a.service, &b.service)
        && a.datacenter == b.datacenter
        && same_arc(&a.roots, &b.roots)
        && same_known_entry(&a.proxy_defaults, &b.proxy_defaults)
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
        && same_arc(&x.jwt_providers, &y.jwt_providers)
        && Arc::ptr_eq(&x.destinations, &y.destinations)
        && Arc::ptr_eq(&x.destination_gateways, &y.destination_gateways)
        && same_arc(&x.peer_bundles, &y.peer_bundles)
        && Arc::ptr_eq(&x.peered, &y.peered)
        && Arc::ptr_eq(&x.peer_targets, &y.peer_targets)
}
