//! The state-of-the-world ADS protocol state of one stream, as a pure state machine.
//!
//! Per type: the names asked for (none: every resource, for clusters and listeners), the
//! version of the last response the proxy ACKed, the one response in flight, and a rejected
//! version. A response carries every resource asked for; its version is a hash of their names
//! and versions. Same rules as delta: one un-ACKed response per type, stale nonces ignored,
//! a rejected version never resent.

use crate::delta::Ack;
use crate::resources::{CLUSTER, LISTENER, TYPES};
use crate::versioned::VersionedResources;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use sha2::{Digest, Sha256};
use std::collections::{BTreeSet, HashMap};

#[derive(Debug, Default)]
struct TypeState {
    names: BTreeSet<String>,
    acked: Option<String>,
    pending: Option<(String, String)>,
    rejected: Option<String>,
}

/// One SotW stream's protocol state.
#[derive(Debug, Default)]
pub struct SotwState {
    types: HashMap<String, TypeState>,
    next_nonce: u64,
}

fn wildcard_type(type_url: &str) -> bool {
    type_url == CLUSTER || type_url == LISTENER
}

impl SotwState {
    /// Applies a request: the names it asks for and the ACK/NACK it carries.
    pub fn on_request(&mut self, req: &DiscoveryRequest) -> Ack {
        let st = self.types.entry(req.type_url.clone()).or_default();
        if !req.response_nonce.is_empty() {
            match &st.pending {
                Some((nonce, _)) if *nonce == req.response_nonce => {}
                // A stale request is ignored entirely, its subscription too.
                _ => return Ack::Stale,
            }
        }
        st.names = req.resource_names.iter().filter(|n| *n != "*").cloned().collect();
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
        for type_url in TYPES {
            let Some(st) = self.types.get(type_url) else { continue };
            if st.pending.is_some() {
                continue;
            }
            let all = st.names.is_empty() && wildcard_type(type_url);
            let chosen: Vec<_> = resources
                .of(type_url)
                .filter(|(name, _)| all || st.names.contains(*name))
                .collect();
            let mut hasher = Sha256::new();
            for (name, res) in &chosen {
                hasher.update(name.as_bytes());
                hasher.update([0]);
                hasher.update(res.version.as_bytes());
                hasher.update([0]);
            }
            let version = crate::versioned::hex(&hasher.finalize()[..16]);
            if st.acked.as_ref() == Some(&version) || st.rejected.as_ref() == Some(&version) {
                continue;
            }
            self.next_nonce += 1;
            let nonce = format!("{:x}", self.next_nonce);
            let resources = chosen.iter().map(|(_, r)| r.resource.clone()).collect();
            if let Some(st) = self.types.get_mut(type_url) {
                st.pending = Some((nonce.clone(), version.clone()));
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
