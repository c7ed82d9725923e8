//! What a server knows of the other datacenters (their federation states: servers and mesh
//! gateways), held beside the catalog rather than in it: the states are soft, sent again by
//! their datacenter whenever they change and whenever its link to the primary is made again
//! (see `docs/federation.md`). The HTTP API serves them, the server's federation loop keeps
//! them, and the proxies' data sources read the other datacenters' mesh gateways.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use structs::federation::FederationState;
use tokio::sync::watch;

/// Every datacenter's state this server knows, with an index that grows on each change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FederationStates {
    /// Grows by one with each change (blocking queries wait on it).
    pub index: u64,
    /// By datacenter.
    pub by_dc: BTreeMap<String, Arc<FederationState>>,
}

/// What a secondary datacenter copies from the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replicated {
    /// Config entries (intentions are `service-intentions` entries).
    ConfigEntries,
    /// ACL policies, roles and global tokens.
    Acl,
}

/// How a secondary's copy of one kind of the primary's data is doing (Consul's
/// `/v1/acl/replication` fields, and the lag meshd measures).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicationStatus {
    /// The replication loop runs (a secondary; for ACLs, with ACLs enabled).
    pub running: bool,
    /// The primary's index of the last copy made here.
    pub replicated_index: u64,
    /// When a copy last succeeded.
    pub last_success: Option<SystemTime>,
    /// When a round last failed, and why.
    pub last_error: Option<(SystemTime, String)>,
    /// From the primary's answer to its copy written here, for the last round that
    /// changed something (milliseconds; the two servers' clocks are compared).
    pub last_lag_ms: u64,
}

/// This server's view of the federation.
#[derive(Debug)]
pub struct Federation {
    local: String,
    primary: String,
    states: watch::Sender<Arc<FederationStates>>,
    config_replication: watch::Sender<ReplicationStatus>,
    acl_replication: watch::Sender<ReplicationStatus>,
    /// The CA (PEM) that verifies other datacenters' servers' HTTPS (`-tls-ca-file`).
    peer_ca: std::sync::OnceLock<Vec<u8>>,
    /// Set when the server drains: waiting queries answer at once.
    released: watch::Sender<bool>,
}

impl Federation {
    /// A server of datacenter `local` whose primary datacenter is `primary`.
    pub fn new(local: &str, primary: &str) -> Arc<Self> {
        Arc::new(Self {
            local: local.to_owned(),
            primary: primary.to_owned(),
            states: watch::Sender::new(Arc::default()),
            config_replication: watch::Sender::new(ReplicationStatus::default()),
            acl_replication: watch::Sender::new(ReplicationStatus::default()),
            peer_ca: std::sync::OnceLock::new(),
            released: watch::Sender::new(false),
        })
    }

    /// Answers every waiting query now, and later ones at once (the server is draining).
    pub fn release_waiters(&self) {
        self.released.send_replace(true);
    }

    /// The status of the copy of `what` (kept by the replication loop, which updates it).
    pub fn replication(&self, what: Replicated) -> &watch::Sender<ReplicationStatus> {
        match what {
            Replicated::ConfigEntries => &self.config_replication,
            Replicated::Acl => &self.acl_replication,
        }
    }

    /// Sets the CA (PEM) that verifies other datacenters' servers' HTTPS (once: later calls
    /// change nothing).
    pub fn set_peer_ca(&self, pem: Vec<u8>) {
        let _ = self.peer_ca.set(pem);
    }

    /// The CA that verifies other datacenters' servers' HTTPS, if one was given.
    pub fn peer_ca(&self) -> Option<&[u8]> {
        self.peer_ca.get().map(Vec::as_slice)
    }

    /// This server's datacenter.
    pub fn local(&self) -> &str {
        &self.local
    }

    /// The primary datacenter.
    pub fn primary(&self) -> &str {
        &self.primary
    }

    /// True on a server of the primary datacenter.
    pub fn is_primary(&self) -> bool {
        self.local == self.primary
    }

    /// The states now.
    pub fn states(&self) -> Arc<FederationStates> {
        Arc::clone(&self.states.borrow())
    }

    /// Follows the states.
    pub fn subscribe(&self) -> watch::Receiver<Arc<FederationStates>> {
        self.states.subscribe()
    }

    /// Every known datacenter: this one first, then the others by name (Consul's order is
    /// by round-trip time, which meshd does not measure).
    pub fn datacenters(&self) -> Vec<String> {
        let states = self.states();
        let mut out = vec![self.local.clone()];
        out.extend(states.by_dc.keys().filter(|dc| **dc != self.local).cloned());
        out
    }

    /// The HTTP addresses of `dc`'s servers (none: an unknown datacenter).
    pub fn servers_of(&self, dc: &str) -> Vec<String> {
        self.states()
            .by_dc
            .get(dc)
            .map(|s| s.servers.clone())
            .unwrap_or_default()
    }

    /// The HTTP addresses of `dc`'s servers once some are known (a secondary learns the
    /// primary's when it first links).
    pub async fn servers_known(&self, dc: &str) -> Vec<String> {
        let mut states = self.subscribe();
        let _ = states
            .wait_for(|s| s.by_dc.get(dc).is_some_and(|s| !s.servers.is_empty()))
            .await;
        self.servers_of(dc)
    }

    /// Sets one datacenter's state; false when it changed nothing (its time aside).
    pub fn put(&self, state: FederationState) -> bool {
        self.states.send_if_modified(|states| {
            if states.by_dc.get(&state.datacenter).is_some_and(|s| s.same_as(&state)) {
                return false;
            }
            let next = Arc::make_mut(states);
            next.index += 1;
            next.by_dc.insert(state.datacenter.clone(), Arc::new(state));
            true
        })
    }

    /// Takes the primary's list (on a secondary), keeping this datacenter's own state as
    /// this server knows it.
    pub fn replace(&self, states: Vec<FederationState>) {
        let _changed = self.states.send_if_modified(|current| {
            let mut by_dc: BTreeMap<String, Arc<FederationState>> = states
                .into_iter()
                .filter(|s| s.datacenter != self.local)
                .map(|s| match current.by_dc.get(&s.datacenter) {
                    Some(kept) if kept.same_as(&s) => (s.datacenter.clone(), Arc::clone(kept)),
                    _ => (s.datacenter.clone(), Arc::new(s)),
                })
                .collect();
            if let Some(own) = current.by_dc.get(&self.local) {
                by_dc.insert(self.local.clone(), Arc::clone(own));
            }
            if by_dc.len() == current.by_dc.len()
                && by_dc
                    .iter()
                    .all(|(dc, s)| current.by_dc.get(dc).is_some_and(|c| Arc::ptr_eq(c, s)))
            {
                return false;
            }
            let next = Arc::make_mut(current);
            next.index += 1;
            next.by_dc = by_dc;
            true
        });
    }

    /// The states once their index passes `after`, or when `wait` is over (at once while
    /// the server drains).
    pub async fn wait(&self, after: u64, wait: Duration) -> Arc<FederationStates> {
        let (mut states, mut released) = (self.subscribe(), self.released.subscribe());
        let _ = tokio::time::timeout(wait, async {
            tokio::select! {
                _ = states.wait_for(|s| s.index > after) => {}
                _ = released.wait_for(|r| *r) => {}
            }
        })
        .await;
        self.states()
    }
}
