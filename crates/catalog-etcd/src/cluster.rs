//! The servers sharing one etcd: who they are, which one leads, and the heartbeats they
//! have seen.
//!
//! Keys, under `<prefix>cluster/`, all attached to the writing server's lease (so they
//! vanish within the lease TTL of its death):
//!
//! - `server/<name>`: each server's [`ServerInfo`], for `/v1/status/peers`;
//! - `leader`: the leading server's [`ServerInfo`], created only if absent (a transaction
//!   on its `create_revision`), so at most one server holds it; the others try again as
//!   soon as it is deleted. A server that finds it on its own lease leads (it stepped down
//!   while cut off from etcd, and its lease outlived the cut);
//! - `heartbeat/<name>`: the nodes whose agents sent this server a heartbeat lately, so the
//!   leader (which alone marks nodes critical) knows of heartbeats sent to any server.
//!
//! A server that cannot renew its lease for two thirds of its TTL stops leading before the
//! lease can expire and another server take over; it campaigns only while its lease was
//! renewed within that time.

use crate::config::EtcdConfig;
use crate::outage::{Outage, sleep_or_stop};
use catalog::StoreError;
use catalog::cluster::{Cluster, ClusterStatus, ServerInfo};
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// This server's membership: its lease, registration and leadership, the cluster view, and
/// heartbeats shared by the servers.
pub(crate) struct Membership {
    client: Client,
    prefix: String,
    me: ServerInfo,
    ttl: Duration,
    status: watch::Sender<ClusterStatus>,
    leading: watch::Sender<bool>,
    /// When a heartbeat for each node was last reported by any server.
    heartbeats: Mutex<HashMap<String, Instant>>,
    lease: Mutex<Option<i64>>,
    leader_gone: Notify,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

impl Membership {
    pub(crate) fn new(client: Client, config: &EtcdConfig) -> Arc<Self> {
        Arc::new(Self {
            client,
            prefix: format!("{}cluster/", config.prefix),
            me: ServerInfo {
                name: config.server_name.clone(),
                address: config.advertise.clone(),
                xds_address: config.xds_address.clone(),
                grpc_tls_address: config.grpc_tls_address.clone(),
            },
            ttl: config.lease_ttl.max(Duration::from_secs(2)),
            status: watch::Sender::new(ClusterStatus::default()),
            leading: watch::Sender::new(false),
            heartbeats: Mutex::new(HashMap::new()),
            lease: Mutex::new(None),
            leader_gone: Notify::new(),
        })
    }

    /// Makes sure no other live server uses this server's name: two servers of one name
    /// would overwrite each other's registration and count as one. A registration under the
    /// name with this server's own address is this server's from before a restart; one with
    /// another address may be a server that crashed, whose lease expires within the TTL, so
    /// it is waited for that long before the name counts as taken.
    pub(crate) async fn claim_name(&self, request_timeout: Duration) -> Result<(), StoreError> {
        let key = self.key(&format!("server/{}", self.me.name));
        let mut kv = self.client.kv_client();
        let deadline = Instant::now() + self.ttl + Duration::from_secs(1);
        loop {
            let resp = tokio::time::timeout(request_timeout, kv.get(key.clone(), None))
                .await
                .map_err(|_| StoreError::EtcdTimeout {
                    what: "reading the servers' registrations".into(),
                    after: request_timeout,
                })?
                .map_err(|source| StoreError::Etcd {
                    what: "reading the servers' registrations".into(),
                    source: Box::new(source),
                })?;
            let Some(held) = resp.kvs().first() else {
                return Ok(());
            };
            let other: ServerInfo = serde_json::from_slice(held.value()).unwrap_or(ServerInfo {
                name: self.me.name.clone(),
                address: "an unknown address".into(),
                xds_address: String::new(),
                grpc_tls_address: String::new(),
            });
            if other.address == self.me.address {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StoreError::ServerNameTaken {
                    name: self.me.name.clone(),
                    address: other.address,
                });
            }
            warn!(name = %self.me.name, other = %other.address, "another server registered this server's name: waiting for its lease to expire");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    fn key(&self, what: &str) -> String {
        format!("{}{what}", self.prefix)
    }

    fn set_leading(&self, leading: bool) {
        if *self.leading.borrow() != leading {
            if leading {
                info!(server = %self.me.name, "this server now leads the cluster");
            } else {
                warn!(server = %self.me.name, "this server no longer leads the cluster");
            }
            self.leading.send_replace(leading);
        }
    }

    /// Keeps this server registered and campaigning until `stop`; then gives the lease back
    /// (so its registration and leadership end at once).
    pub(crate) async fn run_session(self: Arc<Self>, stop: CancellationToken) {
        let mut lease_client = self.client.lease_client();
        let mut delay = Duration::from_millis(200);
        let mut outage = Outage::default();
        const WHAT: &str = "getting an etcd lease for this server failed, retrying";
        loop {
            let granted = tokio::select! {
                () = stop.cancelled() => return,
                r = lease_client.grant(self.ttl.as_secs() as i64, None) => r,
            };
            let lease = match granted {
                Ok(r) => {
                    outage.worked(WHAT);
                    r.id()
                }
                Err(e) => {
                    outage.failed(WHAT, &e);
                    if sleep_or_stop(&stop, delay).await {
                        return;
                    }
                    delay = (delay * 2).min(Duration::from_secs(2));
                    continue;
                }
            };
            delay = Duration::from_millis(200);
            *self.lease.lock() = Some(lease);
            self.hold(lease, &stop).await;
            *self.lease.lock() = None;
            if stop.is_cancelled() {
                // Shutting down: leadership is handed over with the lease, not lost.
                if self.leading.send_replace(false) {
                    info!(server = %self.me.name, "this server stops leading: shutting down");
                }
                let mut lease_client = self.client.lease_client();
                let _ = tokio::time::timeout(Duration::from_secs(2), lease_client.revoke(lease)).await;
                return;
            }
            self.set_leading(false);
            // The lease may still live in etcd (renewals failed, yet it did not expire):
            // give it back so that its registration and any leader key on it go now, not
            // at its expiry.
            let _ = tokio::time::timeout(self.ttl / 3, lease_client.revoke(lease)).await;
        }
    }

    /// Registers under `lease`, renews it and campaigns, until the lease is lost or `stop`.
    async fn hold(&self, lease: i64, stop: &CancellationToken) {
        let info = serde_json::to_vec(&self.me).unwrap_or_default();
        let mut kv = self.client.kv_client();
        let mut lease_client = self.client.lease_client();
        let tick = self.ttl / 3;
        let mut registered = false;
        let mut keeper = None;
        let mut last_renewed = Instant::now();
        let mut renewing = true;
        loop {
            if !registered {
                let put = kv.put(
                    self.key(&format!("server/{}", self.me.name)),
                    info.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                );
                registered = matches!(tokio::time::timeout(tick, put).await, Ok(Ok(_)));
            }
            // Campaign only on a lease renewed lately: a lease about to expire must not
            // (re)gain the lead another server may take in a moment.
            if registered && !*self.leading.borrow() && last_renewed.elapsed() <= self.ttl * 2 / 3 {
                match tokio::time::timeout(tick, self.campaign(&mut kv, lease, &info)).await {
                    Ok(Ok(true)) => self.set_leading(true),
                    Ok(Ok(false)) => {}
                    Ok(Err(e)) => tracing::debug!(error = %e, "campaigning for the lead failed"),
                    Err(_) => tracing::debug!("campaigning for the lead: no answer"),
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                // A failed renewal is tried again sooner, so that a server cut off steps
                // down close to two thirds of the TTL and renews soon after it is back.
                () = tokio::time::sleep(if renewing { tick } else { tick / 4 }) => {}
                () = self.leader_gone.notified() => {}
            }
            if keeper.is_none() {
                keeper = tokio::time::timeout(tick, lease_client.keep_alive(lease))
                    .await
                    .ok()
                    .and_then(Result::ok);
            }
            if let Some((k, responses)) = keeper.as_mut() {
                let renewed = async {
                    k.keep_alive().await?;
                    responses.message().await
                };
                match tokio::time::timeout(tick, renewed).await {
                    Ok(Ok(Some(r))) if r.ttl() > 0 => {
                        last_renewed = Instant::now();
                        renewing = true;
                    }
                    Ok(Ok(Some(_))) => {
                        warn!("this server's etcd lease expired; registering again");
                        return;
                    }
                    _ => keeper = None,
                }
            }
            if keeper.is_none() {
                renewing = false;
            }
            let silent = last_renewed.elapsed();
            if silent > self.ttl * 2 / 3 && *self.leading.borrow() {
                // Step down before the lease can expire and another server lead too.
                self.set_leading(false);
            }
            if silent > self.ttl {
                warn!(silent = ?silent, "could not renew this server's etcd lease; registering again");
                return;
            }
        }
    }

    /// Tries to take the lead under `lease`: true if this server holds `leader` now. The key
    /// is created if absent; if it exists and is attached to `lease`, it is this server's
    /// still (a server that stepped down because it could not renew its lease for a while,
    /// and then could, finds it there: nobody else can create the key while it exists, so
    /// without this the cluster would have no leader until the lease expired, i.e. never).
    async fn campaign(
        &self,
        kv: &mut etcd_client::KvClient,
        lease: i64,
        info: &[u8],
    ) -> Result<bool, etcd_client::Error> {
        let leader = self.key("leader");
        let txn = Txn::new()
            .when([Compare::create_revision(leader.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                leader.clone(),
                info.to_vec(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(leader, None)]);
        let resp = kv.txn(txn).await?;
        if resp.succeeded() {
            return Ok(true);
        }
        let ours = resp.op_responses().into_iter().any(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().is_some_and(|kv| kv.lease() == lease),
            _ => false,
        });
        Ok(ours)
    }

    /// Follows the cluster keys: servers, leader and heartbeats.
    pub(crate) async fn run_watch(self: Arc<Self>, stop: CancellationToken) {
        let mut delay = Duration::from_millis(200);
        let mut outage = Outage::default();
        loop {
            if let Err(e) = self.follow(&stop, &mut outage).await {
                outage.failed("the etcd watch on the cluster's servers failed, retrying", &e);
            }
            if sleep_or_stop(&stop, delay).await {
                return;
            }
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }

    async fn follow(&self, stop: &CancellationToken, outage: &mut Outage) -> Result<(), etcd_client::Error> {
        let mut kv = self.client.kv_client();
        let resp = kv
            .get(self.prefix.clone(), Some(GetOptions::new().with_prefix()))
            .await?;
        outage.worked("the etcd watch on the cluster's servers failed, retrying");
        let mut servers: BTreeMap<String, ServerInfo> = BTreeMap::new();
        let mut leader = None;
        for kv in resp.kvs() {
            self.observe(kv.key(), Some(kv.value()), &mut servers, &mut leader);
        }
        self.publish(&servers, &leader);
        let from = resp.header().map_or(0, |h| h.revision()) + 1;
        let mut watch_client = self.client.watch_client();
        let mut stream = watch_client
            .watch(
                self.prefix.clone(),
                Some(WatchOptions::new().with_prefix().with_start_revision(from)),
            )
            .await?;
        loop {
            let message = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                m = stream.message() => m?,
            };
            let Some(resp) = message else { return Ok(()) };
            if resp.canceled() {
                return Ok(());
            }
            for event in resp.events() {
                let Some(kv) = event.kv() else { continue };
                let value = (event.event_type() == EventType::Put).then(|| kv.value());
                self.observe(kv.key(), value, &mut servers, &mut leader);
            }
            self.publish(&servers, &leader);
        }
    }

    fn observe(
        &self,
        key: &[u8],
        value: Option<&[u8]>,
        servers: &mut BTreeMap<String, ServerInfo>,
        leader: &mut Option<ServerInfo>,
    ) {
        let Some(key) = key
            .strip_prefix(self.prefix.as_bytes())
            .and_then(|k| std::str::from_utf8(k).ok())
        else {
            return;
        };
        let info = || value.and_then(|v| serde_json::from_slice::<ServerInfo>(v).ok());
        if key == "leader" {
            *leader = info();
            if leader.is_none() {
                self.leader_gone.notify_one();
            }
        } else if let Some(name) = key.strip_prefix("server/") {
            match info() {
                Some(i) => servers.insert(name.to_owned(), i),
                None => servers.remove(name),
            };
        } else if key.starts_with("heartbeat/")
            && let Some(nodes) = value.and_then(|v| serde_json::from_slice::<Vec<String>>(v).ok())
        {
            let now = Instant::now();
            let mut seen = self.heartbeats.lock();
            for node in nodes {
                seen.insert(node, now);
            }
        }
    }

    fn publish(&self, servers: &BTreeMap<String, ServerInfo>, leader: &Option<ServerInfo>) {
        let status = ClusterStatus {
            leader: leader.clone(),
            servers: servers.values().cloned().collect(),
        };
        self.status.send_if_modified(|s| {
            if *s == status {
                false
            } else {
                *s = status;
                true
            }
        });
    }
}

#[async_trait::async_trait]
impl Cluster for Membership {
    fn status(&self) -> ClusterStatus {
        self.status.borrow().clone()
    }

    fn subscribe_status(&self) -> watch::Receiver<ClusterStatus> {
        self.status.subscribe()
    }

    fn me(&self) -> &ServerInfo {
        &self.me
    }

    fn leading(&self) -> watch::Receiver<bool> {
        self.leading.subscribe()
    }

    fn heartbeat_seen(&self, node: &str) -> Option<Instant> {
        self.heartbeats.lock().get(node).copied()
    }

    async fn share_heartbeats(&self, nodes: Vec<String>) {
        let Some(lease) = *self.lease.lock() else { return };
        let Ok(value) = serde_json::to_vec(&nodes) else { return };
        let key = format!("{}heartbeat/{}", self.prefix, self.me.name);
        let mut kv = self.client.kv_client();
        let put = kv.put(key, value, Some(PutOptions::new().with_lease(lease)));
        match tokio::time::timeout(self.ttl, put).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => warn!(error = %e, "cannot share heartbeats through etcd"),
            Err(_) => warn!("cannot share heartbeats through etcd: no answer"),
        }
    }
}
