//! Node liveness without gossip: agents send heartbeats, and the server keeps each node's
//! liveness check (Consul's `serfHealth` shape: a node check, so every instance on the node
//! follows it) passing while they arrive, critical once none has arrived for `timeout`, and
//! removes a node that has stayed critical for `reap_after`.
//!
//! With several servers over etcd, agents may send their heartbeats to any server, but only
//! the leading server marks nodes critical and reaps them: each server shares the nodes it
//! heard from through etcd (see [`crate::cluster::Cluster::share_heartbeats`]) every
//! quarter of the timeout, and the leader counts a node alive if any server heard from it. A
//! server that starts leading gives every node a full timeout first.
//!
//! Heartbeat times live in memory only. After a server restart every node with a liveness
//! check gets a full `timeout` from the restart to send its next heartbeat, and the reap
//! clock of a critical node starts again at the restart.

use crate::{Op, Store, WriteError};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;
use structs::{DeregisterRequest, HealthCheck, HealthStatus, RegisterRequest};
use tokio::time::Instant;
use tracing::{info, warn};

/// The liveness check's id (Consul's).
pub const CHECK_ID: &str = "serfHealth";
const CHECK_NAME: &str = "Serf Health Status";
const ALIVE: &str = "Agent alive and reachable";

/// Timing of liveness tracking.
#[derive(Debug, Clone)]
pub struct LivenessConfig {
    /// A node without a heartbeat for this long turns critical.
    pub timeout: Duration,
    /// A node critical for this long is removed from the catalog.
    pub reap_after: Duration,
    /// How often nodes are looked at.
    pub scan_interval: Duration,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            reap_after: Duration::from_secs(72 * 3600),
            scan_interval: Duration::from_millis(500),
        }
    }
}

/// Heartbeat bookkeeping of one server (see the module docs).
#[derive(Debug)]
pub struct Liveness {
    store: Store,
    config: LivenessConfig,
    started: Instant,
    seen: Mutex<HashMap<String, Instant>>,
    critical_since: Mutex<HashMap<String, Instant>>,
    /// Nodes heard from since this server last shared its heartbeats (several servers).
    to_share: Mutex<std::collections::HashSet<String>>,
    /// When this server started leading (several servers): the grace period starts there.
    leading_since: Mutex<Option<Instant>>,
}

fn liveness_check(status: HealthStatus, output: String) -> HealthCheck {
    HealthCheck {
        check_id: CHECK_ID.into(),
        name: CHECK_NAME.into(),
        status,
        output,
        ..HealthCheck::default()
    }
}

impl Liveness {
    /// Liveness tracking over `store`.
    pub fn new(store: Store, config: LivenessConfig) -> Self {
        Self {
            store,
            config,
            started: Instant::now(),
            seen: Mutex::new(HashMap::new()),
            critical_since: Mutex::new(HashMap::new()),
            to_share: Mutex::new(std::collections::HashSet::new()),
            leading_since: Mutex::new(None),
        }
    }

    /// The settings.
    pub fn config(&self) -> &LivenessConfig {
        &self.config
    }

    /// Records a heartbeat of `node` (reached at `address`); marks its liveness check passing
    /// if it is not already (registering the node if it does not exist yet).
    pub async fn heartbeat(&self, node: &str, address: &str) -> Result<(), WriteError> {
        self.seen.lock().insert(node.to_owned(), Instant::now());
        if self.store.cluster().is_some() {
            self.to_share.lock().insert(node.to_owned());
        }
        let state = self.store.read();
        let passing = state
            .check(node, CHECK_ID)
            .is_some_and(|c| c.status == HealthStatus::Passing);
        if passing {
            return Ok(());
        }
        let address = state
            .node(node)
            .map(|n| n.address.clone())
            .unwrap_or_else(|| address.to_owned());
        drop(state);
        self.critical_since.lock().remove(node);
        info!(%node, "node is alive");
        self.store
            .write(Op::Register(Box::new(RegisterRequest {
                node: node.to_owned(),
                address,
                skip_node_update: true,
                check: Some(liveness_check(HealthStatus::Passing, ALIVE.into())),
                ..RegisterRequest::default()
            })))
            .await
            .map(|_| ())
    }

    /// Looks at every node with a liveness check once: stale ones turn critical, long
    /// critical ones are removed.
    pub async fn scan(&self) {
        let now = Instant::now();
        let cluster = self.store.cluster();
        let started = match cluster {
            None => self.started,
            Some(_) => match *self.leading_since.lock() {
                Some(since) => since,
                // Only the leader marks and reaps.
                None => return,
            },
        };
        let state = self.store.read();
        let mut stale = Vec::new();
        let mut reap = Vec::new();
        for check in state
            .all_checks()
            .filter(|c| c.check_id == CHECK_ID && c.service_id.is_empty())
        {
            let node = &check.node;
            let local = self.seen.lock().get(node).copied();
            let shared = cluster.and_then(|c| c.heartbeat_seen(node));
            let last = local.max(shared).unwrap_or(started).max(started);
            match check.status {
                HealthStatus::Passing | HealthStatus::Warning if now.duration_since(last) > self.config.timeout => {
                    stale.push((node.clone(), now.duration_since(last)));
                }
                HealthStatus::Critical => {
                    let since = *self.critical_since.lock().entry(node.clone()).or_insert(now);
                    if now.duration_since(since) >= self.config.reap_after {
                        reap.push(node.clone());
                    }
                }
                _ => {}
            }
        }
        drop(state);
        for (node, silent) in stale {
            warn!(%node, silent_for = ?silent, "no heartbeat: marking the node critical");
            self.critical_since.lock().insert(node.clone(), now);
            let result = self
                .store
                .write(Op::Register(Box::new(RegisterRequest {
                    address: self
                        .store
                        .read()
                        .node(&node)
                        .map(|n| n.address.clone())
                        .unwrap_or_default(),
                    node: node.clone(),
                    skip_node_update: true,
                    check: Some(liveness_check(
                        HealthStatus::Critical,
                        format!("Agent not live or unreachable: no heartbeat for {}s", silent.as_secs()),
                    )),
                    ..RegisterRequest::default()
                })))
                .await;
            if let Err(error) = result {
                warn!(%node, %error, "cannot mark the node critical");
            }
        }
        for node in reap {
            warn!(%node, after = ?self.config.reap_after, "removing a node critical for too long");
            let result = self
                .store
                .write(Op::Deregister(DeregisterRequest {
                    node: node.clone(),
                    ..DeregisterRequest::default()
                }))
                .await;
            match result {
                Ok(_) => {
                    self.critical_since.lock().remove(&node);
                    self.seen.lock().remove(&node);
                }
                Err(error) => warn!(%node, %error, "cannot remove the node"),
            }
        }
    }

    /// Starts or ends this server's turn at marking and reaping.
    fn follow_leadership(&self, leading: bool) {
        let mut since = self.leading_since.lock();
        match (leading, since.is_some()) {
            (true, false) => {
                // A new leader gives every node a full timeout, and reap clocks start again.
                *since = Some(Instant::now());
                self.critical_since.lock().clear();
            }
            (false, true) => *since = None,
            _ => {}
        }
    }

    /// Scans every `scan_interval` until `stop` completes (with several servers: shares
    /// heartbeats, and scans only while leading).
    pub async fn run(&self, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        let share_every = self.config.timeout / 4;
        let mut shared_at = Instant::now();
        let mut leading = self.store.cluster().map(|c| c.leading());
        loop {
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(self.config.scan_interval) => {}
            }
            if let (Some(cluster), Some(leading)) = (self.store.cluster(), leading.as_mut()) {
                self.follow_leadership(*leading.borrow_and_update());
                if shared_at.elapsed() >= share_every {
                    shared_at = Instant::now();
                    let nodes: Vec<String> = self.to_share.lock().drain().collect();
                    if !nodes.is_empty() {
                        cluster.share_heartbeats(nodes).await;
                    }
                }
            }
            self.scan().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreConfig;

    fn status(store: &Store, node: &str) -> Option<HealthStatus> {
        store.read().check(node, CHECK_ID).map(|c| c.status)
    }

    #[tokio::test(start_paused = true)]
    async fn critical_after_timeout_passing_on_heartbeat_reaped_after_reap_timeout() {
        let store = Store::open(StoreConfig::default()).await.unwrap();
        let live = Liveness::new(
            store.clone(),
            LivenessConfig {
                timeout: Duration::from_secs(10),
                reap_after: Duration::from_secs(3600),
                scan_interval: Duration::from_secs(1),
            },
        );
        live.heartbeat("n1", "10.0.0.1").await.unwrap();
        assert_eq!(status(&store, "n1"), Some(HealthStatus::Passing));
        assert_eq!(store.read().node("n1").unwrap().address, "10.0.0.1");
        tokio::time::advance(Duration::from_secs(9)).await;
        live.scan().await;
        assert_eq!(status(&store, "n1"), Some(HealthStatus::Passing));
        tokio::time::advance(Duration::from_secs(2)).await;
        live.scan().await;
        assert_eq!(status(&store, "n1"), Some(HealthStatus::Critical));
        live.heartbeat("n1", "ignored").await.unwrap();
        assert_eq!(status(&store, "n1"), Some(HealthStatus::Passing));
        assert_eq!(
            store.read().node("n1").unwrap().address,
            "10.0.0.1",
            "heartbeats never move a node"
        );
        tokio::time::advance(Duration::from_secs(11)).await;
        live.scan().await;
        assert_eq!(status(&store, "n1"), Some(HealthStatus::Critical));
        tokio::time::advance(Duration::from_secs(3599)).await;
        live.scan().await;
        assert!(store.read().node("n1").is_some());
        tokio::time::advance(Duration::from_secs(2)).await;
        live.scan().await;
        assert!(store.read().node("n1").is_none(), "reaped");
        store.close().await;
    }
}
