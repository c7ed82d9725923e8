//! The delta (incremental) ADS protocol state of one stream, as a pure state machine: feed it
//! requests and resource sets, ask it what to send.
//!
//! Per type it tracks the subscription (wildcard or names), what the proxy has (name →
//! version, seeded from `initial_resource_versions` on reconnect, advanced on ACK), the one
//! response in flight (nonce and what it carried), and versions the proxy rejected. Rules:
//! at most one un-ACKed response per type; a request whose nonce is not the one in flight is
//! stale and ignored for acknowledgement; a NACK keeps the proxy's last good versions, is
//! recorded with its error, and the rejected version is never sent again (a new snapshot or
//! request must change something first). Order is make-before-break: clusters, endpoints,
//! listeners, routes; removals only once every type is quiet.

use crate::resources::{ResourceType, TYPES};
use crate::versioned::{TypeResources, VersionedResources};
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource};
use std::collections::BTreeSet;

/// Maps keyed by resource names: a fast seeded hash (names are long; SipHash showed in
/// profiles).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::quality::RandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::quality::RandomState>;
use std::sync::Arc;

/// Responses carry at most this many bytes of resources (gRPC's default limit is 4 MiB).
pub const MAX_RESPONSE_BYTES: usize = 3 * 1024 * 1024;

/// What a request meant for the caller's metrics and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ack {
    /// Nothing was acknowledged (a subscription change, or the first request).
    None,
    /// The response with this nonce was accepted.
    Accepted {
        /// The type.
        type_url: String,
    },
    /// The response was rejected with this message.
    Rejected {
        /// The type.
        type_url: String,
        /// Envoy's error detail.
        message: String,
    },
    /// The nonce is not the one in flight; ignored.
    Stale,
}

/// A version as the proxy holds it: meshd's own (32 lowercase hex digits) in its 16 bytes,
/// any other (a version from elsewhere, given on a reconnect) as it came. A stream holds one
/// per resource for its life: a name shared with the snapshot's and 16 bytes, where two
/// strings of their own took about 150.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Held {
    Ours([u8; 16]),
    Other(Box<str>),
}

impl Held {
    fn of(version: &str) -> Self {
        let mut bytes = [0u8; 16];
        let ours = version.len() == 32 && version.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
        if ours && hex::decode_to_slice(version, &mut bytes).is_ok() {
            Held::Ours(bytes)
        } else {
            Held::Other(version.into())
        }
    }
}

/// A resource name, shared with the snapshot's resources where it came from them.
type Name = Arc<str>;

/// A response in flight: its nonce, and what it carried (name → version, or `None` for a
/// removal).
type InFlight = (String, HashMap<Name, Option<Held>>);

#[derive(Debug, Default)]
struct TypeState {
    wildcard: bool,
    /// Names subscribed to (asked for on every candidate: hashed, not ordered).
    subscribed: HashSet<String>,
    /// name → version the proxy has.
    known: HashMap<Name, Held>,
    /// Nonce in flight and what it carried: name → Some(version) or None (removal). Boxed:
    /// most of a stream's life nothing is in flight.
    pending: Option<Box<InFlight>>,
    /// name → version the proxy rejected.
    rejected: HashMap<Name, Held>,
    /// The type has been asked for at least once.
    requested: bool,
    /// The resources of this type the proxy was last found fully in sync with (nothing to
    /// upsert or remove), held so that the same map (pointer) means nothing to diff. Any
    /// request of this type clears it (an ACK of a complete response then sets it again),
    /// except one that only subscribes to more names while no response is in flight: those
    /// names go to `fresh` instead.
    in_sync: Option<Arc<TypeResources>>,
    /// Names subscribed to since the proxy was last in sync (with `in_sync`), which it may
    /// lack: candidates besides what changed from `in_sync`. Empty when not in sync.
    fresh: Vec<String>,
    /// The map the response in flight was diffed against, when that response carried
    /// everything the proxy lacked of it and nothing needed removing: once it is ACKed (and
    /// the subscription did not change), the proxy is in sync with that map.
    pending_complete: Option<Arc<TypeResources>>,
    /// Names to send again whatever the proxy has (load assignments of updated clusters).
    resend: BTreeSet<String>,
    /// A response of this type was sent on this stream (or, for a proxy that reconnected
    /// with resources of it, on an earlier one).
    answered: bool,
}

impl TypeState {
    fn wants(&self, name: &str) -> bool {
        self.wildcard || self.subscribed.contains(name)
    }

    fn is_in_sync(&self, now: Option<&Arc<TypeResources>>) -> bool {
        self.fresh.is_empty() && matches!((&self.in_sync, now), (Some(a), Some(b)) if Arc::ptr_eq(a, b))
    }

    /// Forgets the map the proxy was in sync with: the next response considers every resource.
    fn unsync(&mut self) {
        self.in_sync = None;
        self.fresh.clear();
    }

    /// True when `req` only subscribes this type to more names (no ACK, no removal, no
    /// wildcard), while nothing is in flight: the proxy stays in sync with what it was,
    /// and the names are candidates of their own.
    fn only_subscribes(&self, req: &DeltaDiscoveryRequest) -> bool {
        self.requested
            && self.in_sync.is_some()
            && self.pending.is_none()
            && req.response_nonce.is_empty()
            && req.error_detail.is_none()
            && req.resource_names_unsubscribe.is_empty()
            && req.initial_resource_versions.is_empty()
            && !req.resource_names_subscribe.iter().any(|n| n == "*")
    }

    /// Drops each name to resend that the proxy no longer wants, or that `map` no longer has.
    fn drop_stale_resends(&mut self, map: Option<&Arc<TypeResources>>) {
        if !self.resend.is_empty() {
            let (wildcard, subscribed) = (self.wildcard, &self.subscribed);
            self.resend
                .retain(|n| (wildcard || subscribed.contains(n)) && map.is_some_and(|m| m.contains_key(n.as_str())));
        }
    }

    /// The resources of `type_url` that may be missing, and whether a wanted name is gone.
    /// In sync with an earlier map: only what differs from it can be missing (a walk of both
    /// maps in order, comparing pointers), and the response is complete unless a wanted name
    /// of it is gone (`Some`). Otherwise every resource is a candidate, checked against
    /// `known` (`None`). Names to resend are candidates even when the map is unchanged.
    fn candidates<'r>(&self, type_url: &str, resources: &'r VersionedResources) -> (Vec<Candidate<'r>>, Option<bool>) {
        let (mut candidates, lost) = match (&self.in_sync, resources.map(type_url)) {
            (Some(old), Some(new)) => {
                let (changed, gone) = diff_maps(old, new);
                (changed, Some(gone.iter().any(|n| self.wants(n))))
            }
            _ => (resources.of(type_url).collect(), None),
        };
        if !self.resend.is_empty() {
            for (name, res) in resources.of(type_url) {
                if self.resend.contains(name) && !candidates.iter().any(|(n, _)| *n == name) {
                    candidates.push((name, res));
                }
            }
        }
        if lost.is_some() {
            let map = resources.map(type_url);
            for name in &self.fresh {
                if let Some((name, res)) = map.and_then(|m| m.get_key_value(name.as_str()))
                    && !candidates.iter().any(|(n, _)| *n == &**name)
                {
                    candidates.push((name, res));
                }
            }
        }
        (candidates, lost)
    }

    /// The candidates the proxy wants and lacks (or is to be sent again), as many as fit
    /// one response; names are shared with `map`'s where it has them.
    fn pick(&self, candidates: Vec<Candidate<'_>>, map: Option<&Arc<TypeResources>>) -> Picked {
        let mut picked = Picked::default();
        let mut size = 0;
        for (name, res) in candidates {
            if !self.wants(name) {
                continue;
            }
            let version = Held::Ours(res.digest);
            if (self.known.get(name) == Some(&version) && !self.resend.contains(name))
                || self.rejected.get(name) == Some(&version)
            {
                continue;
            }
            if size > 0 && size + res.resource.value.len() > MAX_RESPONSE_BYTES {
                picked.truncated = true;
                break; // the rest goes after this response is acknowledged
            }
            size += res.resource.value.len();
            let key = map
                .and_then(|m| m.get_key_value(name))
                .map_or_else(|| Arc::from(name), |(k, _)| Arc::clone(k));
            picked.sent.insert(key, Some(version));
            picked.upserts.push(Resource {
                name: name.to_owned(),
                version: res.version.clone(),
                resource: Some(res.resource.clone()),
                ..Default::default()
            });
        }
        picked
    }
}

/// A resource that may be sent: its name and versioned encoding.
type Candidate<'r> = (&'r str, &'r Arc<crate::versioned::Versioned>);

/// What one response upserts: the resources, what it carries (name → version), and
/// whether more was left for the next response.
#[derive(Default)]
struct Picked {
    upserts: Vec<Resource>,
    sent: HashMap<Name, Option<Held>>,
    truncated: bool,
}

/// One delta stream's protocol state.
#[derive(Debug, Default)]
pub struct DeltaState {
    /// The types this server serves, in [`TYPES`] order.
    served: [TypeState; TYPES.len()],
    /// Types the proxy asked for that are not served (tracked so their ACKs are understood).
    others: HashMap<String, TypeState>,
    next_nonce: u64,
}

/// The position of `type_url` in [`TYPES`].
fn slot(type_url: &str) -> Option<usize> {
    ResourceType::from_url(type_url).map(ResourceType::index)
}

impl DeltaState {
    /// The listeners subscribed to by name (a proxyless client's targets); empty for a
    /// wildcard subscription (Envoy's).
    pub fn listener_names(&self) -> Vec<String> {
        let st = &self.served[ResourceType::Listener.index()];
        if st.wildcard {
            return Vec::new();
        }
        let mut names: Vec<String> = st.subscribed.iter().cloned().collect();
        names.sort_unstable();
        names
    }

    /// Applies a request: subscriptions, initial versions, and the ACK/NACK it carries.
    pub fn on_request(&mut self, req: &DeltaDiscoveryRequest) -> Ack {
        let st = match slot(&req.type_url) {
            Some(i) => &mut self.served[i],
            None => self.others.entry(req.type_url.clone()).or_default(),
        };
        if st.only_subscribes(req) {
            for name in &req.resource_names_subscribe {
                st.subscribed.insert(name.clone());
                st.fresh.push(name.clone());
            }
            return Ack::None;
        }
        st.unsync();
        let complete = st.pending_complete.take();
        let first = !st.requested;
        st.requested = true;
        if first {
            // An empty first subscription is a wildcard request (legacy wildcard), as is `*`.
            st.wildcard = req.resource_names_subscribe.is_empty();
            // A proxy reconnecting with what it holds was answered on an earlier stream.
            st.answered = !req.initial_resource_versions.is_empty();
            for (name, version) in &req.initial_resource_versions {
                st.known.insert(Arc::from(name.as_str()), Held::of(version));
            }
        }
        for name in &req.resource_names_subscribe {
            if name == "*" {
                st.wildcard = true;
            } else {
                st.subscribed.insert(name.clone());
            }
        }
        for name in &req.resource_names_unsubscribe {
            if name == "*" {
                st.wildcard = false;
            } else {
                st.subscribed.remove(name);
                st.known.remove(name.as_str());
            }
        }
        if req.response_nonce.is_empty() {
            return Ack::None;
        }
        match st.pending.as_deref() {
            Some((nonce, _)) if *nonce == req.response_nonce => {}
            _ => return Ack::Stale,
        }
        let Some((_, sent)) = st.pending.take().map(|p| *p) else {
            return Ack::Stale;
        };
        match &req.error_detail {
            None => {
                if req.resource_names_subscribe.is_empty() && req.resource_names_unsubscribe.is_empty() {
                    st.in_sync = complete;
                }
                for (name, version) in sent {
                    match version {
                        // A name unsubscribed while the response was in flight: the proxy
                        // dropped what it got of it (held, it would never be sent again).
                        Some(_) if !st.wants(&name) => {
                            st.rejected.remove(&name);
                        }
                        Some(v) => {
                            st.rejected.remove(&name);
                            st.known.insert(name, v);
                        }
                        None => {
                            st.known.remove(&name);
                        }
                    }
                }
                Ack::Accepted {
                    type_url: req.type_url.clone(),
                }
            }
            Some(status) => {
                for (name, version) in sent {
                    if let Some(v) = version {
                        st.rejected.insert(name, v);
                    }
                }
                Ack::Rejected {
                    type_url: req.type_url.clone(),
                    message: status.message.clone(),
                }
            }
        }
    }

    fn nonce(&mut self) -> String {
        self.next_nonce += 1;
        format!("{:x}", self.next_nonce)
    }

    /// The responses to send now for `resources`, in make-before-break order.
    pub fn responses(&mut self, resources: &VersionedResources) -> Vec<DeltaDiscoveryResponse> {
        // Upserts, type by type.
        let out: Vec<_> = TYPES
            .into_iter()
            .enumerate()
            .filter_map(|(i, type_url)| self.upserts(i, type_url, resources))
            .collect();
        if !out.is_empty() || !self.quiet() {
            return out;
        }
        // Removals, once everything new is in place.
        TYPES
            .into_iter()
            .enumerate()
            .filter_map(|(i, type_url)| self.removals(i, type_url, resources))
            .collect()
    }

    /// The response carrying what the proxy lacks of type `i` (as much as fits one
    /// response), unless it has all of it or a response of that type waits for its ACK.
    fn upserts(
        &mut self,
        i: usize,
        type_url: &'static str,
        resources: &VersionedResources,
    ) -> Option<DeltaDiscoveryResponse> {
        let map = resources.map(type_url);
        self.served[i].drop_stale_resends(map);
        let st = &self.served[i];
        if !st.requested || st.pending.is_some() || st.is_in_sync(map) {
            return None;
        }
        let (candidates, lost) = st.candidates(type_url, resources);
        let Picked {
            upserts,
            sent,
            truncated,
        } = st.pick(candidates, map);
        // A wildcard subscription is answered even when there is nothing of its type: Envoy
        // completes its initialisation on that first answer (a gateway with nothing to serve
        // yet is ready, not waiting out its initial fetch timeout).
        if upserts.is_empty() && (st.answered || !st.wildcard) {
            return None;
        }
        let complete = !truncated
            && match lost {
                Some(lost) => !lost,
                None => map.is_some_and(|m| st.known.keys().all(|name| !st.wants(name) || m.contains_key(&**name))),
            };
        let complete = if complete { map.cloned() } else { None };
        // Envoy replaces an updated cluster by a new one that warms until it receives its
        // load assignment, which it does not have again when the assignment is unchanged:
        // without this, the new cluster waits out the initial fetch timeout (15 s) before
        // taking traffic. The assignments of updated clusters are sent again (after them).
        let updated_clusters: Vec<String> = if i == ResourceType::Cluster.index() {
            sent.keys()
                .filter(|name| st.known.contains_key(*name))
                .map(|name| name.to_string())
                .collect()
        } else {
            Vec::new()
        };
        let nonce = self.nonce();
        let st = &mut self.served[i];
        st.answered = true;
        for name in sent.keys() {
            st.resend.remove(&**name);
        }
        st.pending = Some(Box::new((nonce.clone(), sent)));
        st.pending_complete = complete;
        if !updated_clusters.is_empty() {
            // Marked rather than forgotten: an assignment response already in flight, once
            // ACKed, must not cancel the resend.
            let endpoints = &mut self.served[ResourceType::Endpoint.index()];
            endpoints.resend.extend(updated_clusters);
            endpoints.unsync();
        }
        Some(DeltaDiscoveryResponse {
            type_url: type_url.to_owned(),
            resources: upserts,
            nonce,
            ..Default::default()
        })
    }

    /// The response removing what the proxy has of type `i` and `resources` no longer do;
    /// with nothing to remove, the type is in sync with this map.
    fn removals(
        &mut self,
        i: usize,
        type_url: &'static str,
        resources: &VersionedResources,
    ) -> Option<DeltaDiscoveryResponse> {
        let st = &self.served[i];
        if !st.requested || st.is_in_sync(resources.map(type_url)) {
            return None;
        }
        let map = resources.map(type_url);
        let removed: Vec<String> = match (&st.in_sync, map) {
            // In sync with an earlier map, the proxy holds none of the wanted names it lacked:
            // only names that map had and this one lacks can be removals (a walk of both maps
            // in order, comparing pointers, instead of a lookup of every name held).
            (Some(old), Some(new)) => diff_maps(old, new)
                .1
                .into_iter()
                .filter(|name| st.wants(name) && st.known.contains_key(name.as_str()))
                .collect(),
            _ => st
                .known
                .keys()
                .filter(|name| st.wants(name) && !map.is_some_and(|m| m.contains_key(&***name)))
                .map(|name| name.to_string())
                .collect(),
        };
        if removed.is_empty() {
            // Nothing to upsert (above) and nothing to remove: in sync with this map (the
            // fresh names it has, the proxy has too: nothing was upserted).
            self.served[i].unsync();
            self.served[i].in_sync = resources.map(type_url).cloned();
            return None;
        }
        let nonce = self.nonce();
        self.served[i].answered = true;
        self.served[i].pending = Some(Box::new((
            nonce.clone(),
            removed.iter().map(|n| (Arc::from(n.as_str()), None)).collect(),
        )));
        Some(DeltaDiscoveryResponse {
            type_url: type_url.to_owned(),
            removed_resources: removed,
            nonce,
            ..Default::default()
        })
    }

    /// True when no response waits for an ACK.
    pub fn quiet(&self) -> bool {
        self.served
            .iter()
            .chain(self.others.values())
            .all(|t| t.pending.is_none())
    }
}

/// The entries of `new` that are not `old`'s (absent there, or another version), and the
/// names of `old` that `new` lacks; both maps are walked once, in order, and an entry that
/// is the very same `Arc` costs a pointer comparison.
fn diff_maps<'n>(
    old: &TypeResources,
    new: &'n TypeResources,
) -> (Vec<(&'n str, &'n Arc<crate::versioned::Versioned>)>, Vec<String>) {
    let mut changed = Vec::new();
    let mut gone = Vec::new();
    let mut olds = old.iter().peekable();
    for (name, v) in new {
        // Names of old before this one are gone from new. Names taken over from a build's
        // predecessor are its very `Arc`s; others are compared once each step.
        let mut same = false;
        while let Some((o, ov)) = olds.peek() {
            let order = if Arc::ptr_eq(o, name) {
                std::cmp::Ordering::Equal
            } else {
                o.as_ref().cmp(name.as_ref())
            };
            match order {
                std::cmp::Ordering::Less => {
                    gone.push(o.to_string());
                    olds.next();
                }
                std::cmp::Ordering::Equal => {
                    same = Arc::ptr_eq(ov, v) || ov.digest == v.digest;
                    olds.next();
                    break;
                }
                std::cmp::Ordering::Greater => break,
            }
        }
        if !same {
            changed.push((&**name, v));
        }
    }
    gone.extend(olds.map(|(o, _)| o.to_string()));
    (changed, gone)
}

/// Shared resources of the snapshot a stream serves.
pub type Current = Arc<VersionedResources>;

#[cfg(test)]
mod tests;
