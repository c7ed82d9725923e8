//! The etcd storage of the catalog (`meshd server -store etcd`): the catalog kept in etcd,
//! shared by several meshd servers. A [`catalog::Store`] opened with an [`EtcdConfig`] as
//! its [`StoreConfig::backend`](catalog::StoreConfig::backend) keeps its catalog here; the
//! catalog crate itself knows nothing of etcd (a server built without etcd compiles neither
//! this crate nor etcd-client).
//!
//! Each server keeps the whole catalog in memory, as with the embedded log, and keeps it
//! current from one etcd watch on the catalog's keys, applying every etcd revision in order.
//! An etcd revision is the catalog index, so `X-Consul-Index` means the same on every server.
//!
//! - **Writes** (`writer.rs`): batches of queued writes, each one guarded etcd transaction;
//!   a write is answered once etcd committed it and this server's watch applied it.
//! - **Reads** never ask etcd: blocking queries, the event publisher and proxies keep
//!   working on the last applied state while etcd has no quorum.
//! - **The watch** (`apply.rs`) applies every revision in order. When its next revision has
//!   been compacted away, the server reads every key again and publishes the result as a
//!   reset: every subscriber gets the new value and every blocking query wakes.
//! - **Cluster** (`cluster.rs`): servers register under a lease, one of them leads.
//! - **Layout** (`layout.rs`): which key holds which row.

mod apply;
mod cluster;
mod config;
mod layout;
mod outage;
mod restore;
mod txn;
mod writer;

pub use config::EtcdConfig;
pub use layout::LayoutError;

use apply::Applier;
use catalog::State;
use catalog::StoreError;
use catalog::backend::Current;
use catalog::backend::{Backend, Storage, Writes};
use catalog::cluster::Cluster;
use cluster::Membership;
use etcd_client::{Client, ConnectOptions};
use outage::etcd_err;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use structs::Index;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The etcd storage: its client, the watch applying the catalog, and this server's
/// membership; the writer once started.
pub(crate) struct EtcdStorage {
    client: Client,
    config: EtcdConfig,
    applier: Arc<Applier>,
    membership: Arc<Membership>,
    /// The same membership, as the store hands it out.
    cluster: Arc<dyn Cluster>,
    /// Ends the watches and the lease (after the writer, which ends with its queue).
    stop: CancellationToken,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// The catalog watch, the lease session and the cluster watch.
    followers: Mutex<Vec<JoinHandle<()>>>,
}

/// Connects to etcd and reads the catalog: a one-line error when etcd cannot be reached
/// within the request timeout.
async fn connect(config: &EtcdConfig) -> Result<(Client, State, Option<String>), StoreError> {
    if config.endpoints.is_empty() {
        return Err(StoreError::Corrupt("no etcd endpoint given".into()));
    }
    let options = ConnectOptions::new()
        .with_connect_timeout(config.request_timeout)
        .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5))
        .with_require_leader(true);
    let endpoints = config.endpoints.join(",");
    let client = tokio::time::timeout(
        config.request_timeout,
        Client::connect(config.endpoints.clone(), Some(options)),
    )
    .await
    .map_err(|_| StoreError::EtcdTimeout {
        what: format!("connecting to etcd at {endpoints}"),
        after: config.request_timeout,
    })?
    .map_err(etcd_err(format!("connecting to etcd at {endpoints}")))?;
    let (state, marker) = apply::load(&client, config).await.map_err(|e| match e {
        StoreError::EtcdTimeout { after, .. } => StoreError::EtcdTimeout {
            what: format!("reading the catalog from etcd at {endpoints}"),
            after,
        },
        other => other,
    })?;
    Ok((client, state, marker))
}

#[async_trait::async_trait]
impl Backend for EtcdConfig {
    async fn open(
        &self,
        publish_buffer: usize,
        writes: Writes,
    ) -> Result<(Arc<dyn Storage>, Arc<Current>), StoreError> {
        let (storage, state) = EtcdStorage::open(self.clone()).await?;
        let current = Current::new(state, publish_buffer);
        let storage = storage.start(Arc::clone(&current), writes);
        Ok((storage, current))
    }
}

impl EtcdStorage {
    /// Connects, reads the catalog and claims this server's name: a one-line error when
    /// etcd cannot be reached within the request timeout, or another live server has the
    /// name.
    pub(crate) async fn open(config: EtcdConfig) -> Result<(Arc<Self>, State), StoreError> {
        let (client, state, marker) = connect(&config).await?;
        let applier = Arc::new(Applier::new(client.clone(), config.clone(), &state, marker));
        let membership = Membership::new(client.clone(), &config);
        membership.claim_name(config.request_timeout).await?;
        let storage = Arc::new(Self {
            client,
            config,
            applier,
            cluster: Arc::clone(&membership) as Arc<dyn Cluster>,
            membership,
            stop: CancellationToken::new(),
            writer: Mutex::new(None),
            followers: Mutex::new(Vec::new()),
        });
        Ok((storage, state))
    }

    /// Starts following the catalog into `current`, the lease and cluster watch, and the
    /// writer on `writes`.
    pub(crate) fn start(self: Arc<Self>, current: Arc<Current>, writes: Writes) -> Arc<dyn Storage> {
        let server = self.config.server_name.clone();
        let followers = vec![
            tokio::spawn(
                Arc::clone(&self.applier)
                    .run(Arc::clone(&current), self.stop.clone())
                    .instrument(tracing::info_span!("etcd_catalog_watch", %server)),
            ),
            tokio::spawn(
                Arc::clone(&self.membership)
                    .run_session(self.stop.clone())
                    .instrument(tracing::info_span!("etcd_lease", %server)),
            ),
            tokio::spawn(
                Arc::clone(&self.membership)
                    .run_watch(self.stop.clone())
                    .instrument(tracing::info_span!("etcd_cluster_watch", %server)),
            ),
        ];
        *self.followers.lock() = followers;
        let writer = writer::Writer::new(self.client.clone(), self.config.clone(), Arc::clone(&self.applier));
        let writer = tokio::spawn(
            writer
                .run(current, writes)
                .instrument(tracing::info_span!("etcd_writer", %server)),
        );
        *self.writer.lock() = Some(writer);
        self
    }
}

#[async_trait::async_trait]
impl Storage for EtcdStorage {
    async fn close(&self) {
        let writer = self.writer.lock().take();
        if let Some(writer) = writer {
            let _ = writer.await;
        }
        self.stop.cancel();
        let followers = std::mem::take(&mut *self.followers.lock());
        for task in followers {
            let _ = task.await;
        }
    }

    async fn wait_applied(&self, index: Index, timeout: Duration) -> bool {
        self.applier.caught_up(index, timeout).await
    }

    /// Reads the write guard's revision linearizably (every catalog write committed when
    /// called), then waits until the watch has applied it.
    async fn catch_up(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut kv = self.client.kv_client();
        let read = kv.get(self.config.guard_key(), None);
        let latest = match tokio::time::timeout_at(deadline, read).await {
            Ok(Ok(resp)) => resp
                .kvs()
                .first()
                .map_or(Index(0), |kv| Index(kv.mod_revision() as u64)),
            _ => return false,
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.applier.caught_up(latest, left).await
    }

    fn cluster(&self) -> Option<&Arc<dyn Cluster>> {
        Some(&self.cluster)
    }

    fn reloads(&self) -> u64 {
        self.applier.reloads()
    }
}
