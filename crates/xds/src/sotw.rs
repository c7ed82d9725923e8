//! The state-of-the-world ADS protocol state of one stream, as a pure state machine.
//!
//! Per type: the names asked for (none: every resource, for clusters and listeners), the
//! version of the last response the proxy ACKed, the one response in flight, and a rejected
//! version. A response carries every resource asked for; its version is a hash of their names
//! and versions. Same rules as delta: one un-ACKed response per type, stale nonces ignored,
//! a rejected version never resent.

use crate::delta::Ack;
use crate::resources::{CLUSTER, LISTENER, ResourceType, TYPES};
use crate::versioned::{TypeResources, VersionedResources};
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use sha2::{Digest, Sha256};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

#[derive(Debug, Default)]
struct TypeState {
    /// The type has been asked for at least once.
    requested: bool,
    names: BTreeSet<String>,
    acked: Option<String>,
    pending: Option<(String, String)>,
    rejected: Option<String>,
    /// The version last computed and the map it was computed from: the same map (pointer)
    /// and the same names give the same version without hashing again.
    computed: Option<(Arc<TypeResources>, String)>,
    /// Send the set again even if the proxy has this version (load assignments after a
    /// cluster change).
    resend: bool,
    /// The nonce (the stream's counter) of the last response of this type, 0 before any.
    last_nonce: u64,
}

/// One SotW stream's protocol state.
#[derive(Debug, Default)]
pub struct SotwState {
    /// The types this server serves, in [`TYPES`] order.
    served: [TypeState; TYPES.len()],
    /// Types asked for that are not served (tracked so their ACKs are understood).
    others: HashMap<String, TypeState>,
    next_nonce: u64,
}

fn wildcard_type(type_url: &str) -> bool {
    type_url == CLUSTER || type_url == LISTENER
}

impl SotwState {
    /// The listeners asked for by name (a proxyless gRPC client's targets); empty for a
    /// wildcard subscription (Envoy's).
    pub fn listener_names(&self) -> Vec<String> {
        self.served[ResourceType::Listener.index()]
            .names
            .iter()
            .cloned()
            .collect()
    }

    /// Applies a request: the names it asks for and the ACK/NACK it carries.
    pub fn on_request(&mut self, req: &DiscoveryRequest) -> Ack {
        let st = match ResourceType::from_url(&req.type_url) {
            Some(t) => &mut self.served[t.index()],
            None => self.others.entry(req.type_url.clone()).or_default(),
        };
        st.requested = true;
        if !req.response_nonce.is_empty() {
            match &st.pending {
                Some((nonce, _)) if *nonce == req.response_nonce => {}
                // The last response's nonce again, that response answered already: a
                // subscription change, not an answer (gRPC ACKs an aggregate cluster, then
                // asks for its members with the same nonce).
                None if st.last_nonce != 0
                    && u64::from_str_radix(&req.response_nonce, 16).is_ok_and(|n| n == st.last_nonce) =>
                {
                    let names: BTreeSet<String> = req.resource_names.iter().filter(|n| *n != "*").cloned().collect();
                    if names != st.names {
                        st.names = names;
                        st.computed = None;
                    }
                    return Ack::None;
                }
                // A stale request is ignored entirely, its subscription too.
                _ => return Ack::Stale,
            }
        }
        let names: BTreeSet<String> = req.resource_names.iter().filter(|n| *n != "*").cloned().collect();
        if names != st.names {
            st.names = names;
            st.computed = None;
        }
        if req.response_nonce.is_empty() {
            return Ack::None;
        }
        let Some((_, version)) = st.pending.take() else {
            return Ack::Stale;
        };
        match &req.error_detail {
            None => {
                st.acked = Some(version);
                st.rejected = None;
                Ack::Accepted {
                    type_url: req.type_url.clone(),
                }
            }
            Some(status) => {
                st.rejected = Some(version);
                Ack::Rejected {
                    type_url: req.type_url.clone(),
                    message: status.message.clone(),
                }
            }
        }
    }

    /// The responses to send now, in make-before-break order.
    pub fn responses(&mut self, resources: &VersionedResources) -> Vec<DiscoveryResponse> {
        let mut out = Vec::new();
        for (i, type_url) in TYPES.into_iter().enumerate() {
            let st = &mut self.served[i];
            if !st.requested || st.pending.is_some() {
                continue;
            }
            let all = st.names.is_empty() && wildcard_type(type_url);
            let map = resources.map(type_url);
            let version = match (&st.computed, map) {
                (Some((m, v)), Some(now)) if Arc::ptr_eq(m, now) => v.clone(),
                _ => {
                    let mut hasher = Sha256::new();
                    for (name, res) in resources.of(type_url) {
                        if all || st.names.contains(name) {
                            hasher.update(name.as_bytes());
                            hasher.update([0]);
                            hasher.update(res.version.as_bytes());
                            hasher.update([0]);
                        }
                    }
                    let version = hex::encode(&hasher.finalize()[..16]);
                    st.computed = map.map(|m| (Arc::clone(m), version.clone()));
                    version
                }
            };
            if (st.acked.as_ref() == Some(&version) && !st.resend) || st.rejected.as_ref() == Some(&version) {
                continue;
            }
            st.resend = false;
            let chosen: Vec<_> = resources
                .of(type_url)
                .filter(|(name, _)| all || st.names.contains(*name))
                .collect();
            self.next_nonce += 1;
            let nonce = format!("{:x}", self.next_nonce);
            let resources = chosen.iter().map(|(_, r)| r.resource.clone()).collect();
            // Envoy warms a changed cluster until it gets its load assignment again, which an
            // unchanged EDS set would not bring: the assignments go again after a cluster
            // change (not after the first clusters, which Envoy asks assignments for itself).
            let clusters_changed = i == ResourceType::Cluster.index() && self.served[i].acked.is_some();
            self.served[i].pending = Some((nonce.clone(), version.clone()));
            self.served[i].last_nonce = self.next_nonce;
            if clusters_changed {
                // Marked rather than forgotten: a response already in flight, once ACKed,
                // must not cancel it.
                self.served[ResourceType::Endpoint.index()].resend = true;
            }
            out.push(DiscoveryResponse {
                version_info: version,
                resources,
                type_url: type_url.to_owned(),
                nonce,
                ..Default::default()
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::ENDPOINT;

    fn res(items: &[(&'static str, &str, &[u8])]) -> VersionedResources {
        crate::versioned::test_resources(items)
    }

    fn request(names: &[&str], ack: Option<&DiscoveryResponse>) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: ENDPOINT.into(),
            resource_names: names.iter().map(|n| (*n).to_owned()).collect(),
            response_nonce: ack.map(|r| r.nonce.clone()).unwrap_or_default(),
            version_info: ack.map(|r| r.version_info.clone()).unwrap_or_default(),
            ..Default::default()
        }
    }

    #[test]
    fn a_cluster_change_sends_the_load_assignments_again() {
        let mut st = SotwState::default();
        let cds = |ack: Option<&DiscoveryResponse>| DiscoveryRequest {
            type_url: CLUSTER.into(),
            response_nonce: ack.map(|r| r.nonce.clone()).unwrap_or_default(),
            ..Default::default()
        };
        st.on_request(&cds(None));
        st.on_request(&request(&["a"], None));
        let v1 = res(&[(CLUSTER, "a", b"1"), (ENDPOINT, "a", b"1")]);
        let out = st.responses(&v1);
        assert_eq!(out.len(), 2);
        st.on_request(&cds(Some(&out[0])));
        st.on_request(&request(&["a"], Some(&out[1])));
        assert!(st.responses(&v1).is_empty());
        let v2 = res(&[(CLUSTER, "a", b"2"), (ENDPOINT, "a", b"1")]);
        let out = st.responses(&v2);
        let types: Vec<&str> = out.iter().map(|r| r.type_url.as_str()).collect();
        assert_eq!(
            types,
            [CLUSTER, ENDPOINT],
            "the unchanged assignment follows the changed cluster"
        );
    }

    /// gRPC ACKs a response, then changes its subscription in a request carrying the same
    /// nonce (an aggregate cluster's members): the new names are served; an older nonce is
    /// still ignored, subscription and all.
    #[test]
    fn the_answered_nonce_again_changes_the_subscription() {
        let mut st = SotwState::default();
        st.on_request(&request(&["a"], None));
        let v = res(&[(ENDPOINT, "a", b"1"), (ENDPOINT, "b", b"1"), (ENDPOINT, "c", b"1")]);
        let first = st.responses(&v).remove(0);
        assert!(matches!(
            st.on_request(&request(&["a"], Some(&first))),
            Ack::Accepted { .. }
        ));
        assert!(matches!(st.on_request(&request(&["a", "b"], Some(&first))), Ack::None));
        let second = st.responses(&v).remove(0);
        assert_eq!(second.resources.len(), 2, "the members asked for are sent");
        st.on_request(&request(&["a", "b"], Some(&second)));
        assert!(matches!(
            st.on_request(&request(&["a", "b", "c"], Some(&first))),
            Ack::Stale
        ));
        assert!(st.responses(&v).is_empty(), "a stale nonce changes nothing");
    }

    #[test]
    fn the_version_of_an_unchanged_map_is_reused_and_a_names_change_recomputes_it() {
        let mut st = SotwState::default();
        st.on_request(&request(&["a"], None));
        let v1 = res(&[(ENDPOINT, "a", b"1"), (ENDPOINT, "b", b"1")]);
        let out = st.responses(&v1);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].resources.len(), 1);
        st.on_request(&request(&["a"], Some(&out[0])));
        assert!(st.responses(&v1).is_empty(), "same map, ACKed: nothing");
        // Equal content in another map: the same version, nothing to send.
        let same = res(&[(ENDPOINT, "a", b"1"), (ENDPOINT, "b", b"1")]);
        assert!(st.responses(&same).is_empty());
        // Another name asked for with the same map: a new set, a new version.
        st.on_request(&request(&["a", "b"], None));
        let out2 = st.responses(&same);
        assert_eq!(out2.len(), 1);
        assert_eq!(out2[0].resources.len(), 2);
        assert_ne!(out2[0].version_info, out[0].version_info);
        // A change of "b" in a new map is seen.
        st.on_request(&request(&["a", "b"], Some(&out2[0])));
        let v2 = res(&[(ENDPOINT, "a", b"1"), (ENDPOINT, "b", b"2")]);
        assert_eq!(st.responses(&v2).len(), 1);
    }
}
