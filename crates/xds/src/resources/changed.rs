//! Incremental sidecar builds: what differs between two snapshots of one proxy, and the
//! build of only that.

use super::{BuildError, COMMON, ENDPOINT, OUTBOUND, Resources, Scope, SharedEncodings, transparent};
use itertools::EitherOrBoth;
use proxycfg::{ConfigSnapshot, UpstreamSnapshot};
use std::sync::Arc;
use structs::UpstreamId;

/// What [`build_changed`] left to the previous build, and what its build replaces.
pub(crate) struct Changed<'s, 'p> {
    /// The upstreams with the same chain and position as before: their resources other than
    /// load assignments are the previous build's.
    kept: Vec<&'s UpstreamId>,
    /// Of those, the ones whose snapshot is the previous one's very `Arc`: their load
    /// assignments are the previous build's too.
    untouched: Vec<&'s UpstreamSnapshot>,
    /// The previous snapshot's upstreams whose resources this build replaces (their chain
    /// or position changed) or drops (they are gone).
    superseded: Vec<(&'p UpstreamId, &'p UpstreamSnapshot)>,
    /// The outbound part (a transparent proxy's) was built again.
    pub(crate) outbound: bool,
    transparent: bool,
}

impl<'s> Changed<'s, '_> {
    /// The parts whose resources are the previous build's: the proxy-wide one, the kept
    /// upstreams', and the outbound one when it was not built again.
    pub(crate) fn reused(&self) -> Vec<String> {
        let mut parts: Vec<String> = self.kept.iter().map(|id| id.to_string()).collect();
        if self.transparent && !self.outbound {
            parts.push(OUTBOUND.to_owned());
        }
        parts.push(COMMON.to_owned());
        parts
    }

    /// The load assignments (by name) of the untouched upstreams: the previous build's.
    pub(crate) fn unchanged_endpoints(&self) -> Vec<&'s str> {
        let targets = self
            .untouched
            .iter()
            .flat_map(|u| u.chain.iter().flat_map(|c| c.targets.values()));
        targets.map(|t| t.sni.as_str()).collect()
    }

    /// The resources the previous build (of `prev`) made for the superseded upstreams, load
    /// assignments included: a build that makes each of them again replaces them all.
    pub(crate) fn superseded_names(&self, prev: &ConfigSnapshot) -> Vec<(&'static str, String)> {
        let mut names = Vec::new();
        for (id, upstream) in &self.superseded {
            super::upstream_part_names(prev, id, upstream, &mut names);
            let targets = upstream.chain.iter().flat_map(|c| c.targets.values());
            names.extend(targets.map(|t| (ENDPOINT, t.sni.clone())));
        }
        names
    }
}

/// Builds what differs from the build of `prev`: when every proxy-wide input is the same,
/// only the upstreams whose chain or position changed are built, and the load assignments
/// of those whose snapshot was replaced; the rest is the previous build's, taken by the
/// caller. `None`: a full build is needed.
pub(crate) fn build_changed<'s, 'p>(
    snapshot: &'s ConfigSnapshot,
    prev: &'p ConfigSnapshot,
    prev_outbound: Option<&Arc<Resources>>,
    shared: Option<&SharedEncodings>,
) -> Option<(Changed<'s, 'p>, Result<Resources, BuildError>)> {
    // A proxyless client's build is small and all of a piece: always whole.
    if !super::same_proxy_wide(prev, snapshot) || snapshot.service.connect.native {
        return None;
    }
    let (Some(x), Some(y)) = (prev.connect_proxy(), snapshot.connect_proxy()) else {
        return None;
    };
    // One ordered walk of both upstream maps: the upstreams kept (same position and
    // chain), those to build again, and those whose snapshot was replaced (their load
    // assignments are built).
    let (mut kept, mut untouched, mut rebuilt, mut replaced) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut superseded = Vec::new();
    for pair in super::upstreams::side_by_side(&x.upstreams, &y.upstreams) {
        match pair {
            EitherOrBoth::Left((o, p)) => superseded.push((&**o, &**p)),
            EitherOrBoth::Both((_, p), (id, u)) if Arc::ptr_eq(p, u) => {
                kept.push(&**id);
                untouched.push(&**u);
            }
            EitherOrBoth::Both((_, p), (id, u)) if p.index == u.index && super::same_arc(&p.chain, &u.chain) => {
                kept.push(&**id);
                replaced.push(&**id);
            }
            EitherOrBoth::Both((o, p), (id, _)) => {
                superseded.push((&**o, &**p));
                rebuilt.push(&**id);
                replaced.push(&**id);
            }
            EitherOrBoth::Right((id, _)) => {
                rebuilt.push(&**id);
                replaced.push(&**id);
            }
        }
    }
    // Asked once per upstream by every builder: the few upstreams to build (one, when an
    // upstream was added), compared by address first (builders pass the snapshot's keys).
    let rebuild = |id: &UpstreamId| rebuilt.iter().any(|r| std::ptr::eq(*r, id) || *r == id);
    let endpoints = |id: &UpstreamId| replaced.iter().any(|r| std::ptr::eq(*r, id) || *r == id);
    // An upstream added or given its chain matches nothing until its endpoints bring a
    // virtual IP: the outbound listener then stays as it was.
    let outbound = y.transparent && !transparent::same_listener(prev, snapshot);
    let scope = Scope {
        common: false,
        outbound,
        outbound_from: prev_outbound.map(|part| (prev, part)),
        upstream: &rebuild,
        endpoints: &endpoints,
    };
    let built = super::build_scoped(snapshot, shared, &scope);
    let changed = Changed {
        kept,
        untouched,
        superseded,
        outbound,
        transparent: y.transparent,
    };
    Some((changed, built))
}
