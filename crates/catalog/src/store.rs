//! The Store: the catalog's single way in — writes through one queue to the storage's
//! writer, reads of the current state, blocking waits and subscriptions.
//!
//! Where the catalog is kept is a [`Storage`]: the embedded log, or a [`Backend`]'s (etcd's,
//! with the catalog-etcd crate). Either way a write is acknowledged only once durable, and
//! readers only ever see durable state.

use crate::audit::JobAudit;
use crate::backend::Backend;
use crate::ca;
use crate::cluster::Cluster;
use crate::current::Current;
use crate::embedded::LogWriter;
use crate::error::{StoreError, WriteError};
use crate::keys::{IndexKey, Topic};
use crate::ops::Op;
use crate::publisher::Subscription;
use crate::state::State;
use crate::storage::{Job, Planned, Storage, WriteOutcome, Writes};
use parking_lot::Mutex;
use std::{collections::HashMap, path::PathBuf, sync::Arc, time::Duration, time::SystemTime};
use structs::{Index, IssuedCert};
use tokio::sync::{mpsc, oneshot, watch};

/// Store settings.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// This server's datacenter.
    pub datacenter: String,
    /// Where state is kept; `None` keeps it in memory only (`-dev`).
    pub data_dir: Option<PathBuf>,
    /// Write a snapshot (and drop the log it covers) after this many records.
    pub snapshot_every: u64,
    /// Events buffered per topic before a slow subscriber is told to resubscribe.
    pub publish_buffer: usize,
    /// Writes taken in one batch at most.
    pub max_batch: usize,
    /// The primary datacenter of a federation (`None`: this one). A secondary's server
    /// creates no CA at first start: its CA follows the primary's, and leaves wait for it.
    pub primary_datacenter: Option<String>,
    /// How many audit records are kept (the oldest are dropped); 0 keeps none.
    pub audit_retention: usize,
    /// The CA's cluster id when this store creates the CA (its trust domain is
    /// `<id>.consul`); `None`: a random UUID. A store whose CA exists with another id does
    /// not open (the id cannot change under issued certificates).
    pub ca_cluster_id: Option<String>,
    /// Keep the catalog there instead of `data_dir` (catalog-etcd's `EtcdConfig`: in etcd,
    /// shared with other servers).
    pub backend: Option<Arc<dyn Backend>>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            datacenter: "dc1".into(),
            data_dir: None,
            snapshot_every: 10_000,
            publish_buffer: 16,
            max_batch: 1024,
            primary_datacenter: None,
            audit_retention: structs::audit::DEFAULT_RETENTION,
            ca_cluster_id: None,
            backend: None,
        }
    }
}

/// A leaf's identity in the store's cache: service and sorted DNS SANs.
type LeafKey = (String, Vec<String>);

struct Inner {
    config: StoreConfig,
    current: Arc<Current>,
    storage: Arc<dyn Storage>,
    /// Issued leaves by service and (sorted) DNS SANs.
    leaves: Mutex<HashMap<LeafKey, Arc<IssuedCert>>>,
    /// The other datacenters.
    federation: Arc<crate::federation::Federation>,
}

/// The catalog store. Cheap to clone; [`Store::close`] stops the writer.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
    tx: Arc<Mutex<Option<mpsc::Sender<Job>>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens the store (replaying its data dir, or reading the catalog from etcd), starts
    /// the writer, and creates the CA on first start.
    pub async fn open(config: StoreConfig) -> Result<Store, StoreError> {
        let (tx, jobs) = mpsc::channel(config.max_batch * 4);
        let writes = Writes {
            jobs,
            datacenter: config.datacenter.clone(),
            max_batch: config.max_batch,
        };
        let (storage, current) = open_storage(&config, writes).await?;
        let store = Store {
            inner: Arc::new(Inner {
                federation: crate::federation::Federation::new(
                    &config.datacenter,
                    config.primary_datacenter.as_deref().unwrap_or(&config.datacenter),
                ),
                config,
                current,
                storage,
                leaves: Mutex::new(HashMap::new()),
            }),
            tx: Arc::new(Mutex::new(Some(tx))),
        };
        let wanted = store.inner.config.ca_cluster_id.clone();
        if store.read().ca().is_none()
            && store.federation().is_primary()
            && let Err(e) = store
                .write(Op::CaBootstrap {
                    config: ca::CaConfig::default(),
                    cluster_id: wanted.clone(),
                })
                .await
        {
            store.close().await;
            return Err(StoreError::CaBootstrap(Box::new(e)));
        }
        let existing = store.read().ca().map(|ca| ca.cluster_id.clone());
        if let (Some(wanted), Some(existing)) = (wanted, existing)
            && wanted != existing
        {
            store.close().await;
            return Err(StoreError::ClusterIdMismatch { wanted, existing });
        }
        Ok(store)
    }

    /// How many times the catalog was read again from etcd because the watch's next
    /// revision had been compacted (0 for the embedded store).
    pub fn etcd_reloads(&self) -> u64 {
        self.inner.storage.reloads()
    }

    /// Waits until this store has applied `index` (written through another server), or
    /// `timeout`; true once it has. The embedded store applies everything it acknowledges.
    pub async fn wait_applied(&self, index: Index, timeout: Duration) -> bool {
        self.inner.storage.wait_applied(index, timeout).await
    }

    /// Waits until this store has applied every write committed anywhere before the call
    /// (over etcd: another server's too), or `timeout`; true once it has. For what must not
    /// be judged on a state behind another server's, such as a token written through
    /// another server and unknown here. The embedded store has always applied everything.
    pub async fn catch_up(&self, timeout: Duration) -> bool {
        self.inner.storage.catch_up(timeout).await
    }

    /// The servers sharing this store's etcd (`None`: the embedded store, one server).
    pub fn cluster(&self) -> Option<&Arc<dyn Cluster>> {
        self.inner.storage.cluster()
    }

    /// The datacenter this store serves.
    pub fn datacenter(&self) -> &str {
        &self.inner.config.datacenter
    }

    /// The current (durable) state.
    pub fn read(&self) -> Arc<State> {
        self.inner.current.read()
    }

    /// Submits a write and waits until it is durable (or refused).
    pub async fn write(&self, op: Op) -> Result<WriteOutcome, WriteError> {
        let tx = self.tx.lock().clone().ok_or(WriteError::Closed)?;
        let (reply, rx) = oneshot::channel();
        let audit = JobAudit::take(self.inner.config.audit_retention);
        let job = Job {
            op,
            reply,
            audit: audit.as_ref().map(JobAudit::share),
        };
        let result = match tx.send(job).await {
            Ok(()) => rx.await.unwrap_or(Err(WriteError::Closed)),
            Err(_) => Err(WriteError::Closed),
        };
        if let Some(audit) = audit {
            audit.finish(result.as_ref().ok().map(|o| (o.index, o.applied)));
        }
        result
    }

    /// What `op` would make of the current state, without writing it (a dry run): the state
    /// it was planned on and the state it would leave, or the error the write would get.
    /// Planned exactly as the write would be (the same checks, the same virtual IPs).
    pub fn dry_run(&self, op: &Op) -> Result<(Arc<State>, Arc<State>), WriteError> {
        let before = self.read();
        let mut after = (*before).clone();
        match Planned::of_op(op, &before, &self.inner.config.datacenter, SystemTime::now()) {
            Planned::Refused(e) => return Err(e),
            Planned::Changed(changes) => {
                after.apply(before.index.next(), &changes);
            }
            Planned::Unchanged { .. } => {}
        }
        Ok((before, Arc::new(after)))
    }

    /// The index of `key`, as a channel that changes with it: for a long-lived follower of a
    /// few keys, which keeps its receivers rather than waiting anew each time. `None` once
    /// waits are released (the store is closing); the channel closes then too.
    pub fn index_receiver(&self, key: &IndexKey) -> Option<watch::Receiver<Index>> {
        self.inner.current.index_receiver(key)
    }

    /// Waits until the index of `key` passes `after`, or `timeout` elapses; returns the state
    /// then current. Cheap per waiter: one watch receiver on a per-key channel.
    pub async fn wait(&self, key: &IndexKey, after: Index, timeout: Duration) -> Arc<State> {
        let Some(mut rx) = self.index_receiver(key) else {
            return self.read();
        };
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        loop {
            if *rx.borrow_and_update() > after {
                break;
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { break },
                () = &mut deadline => break,
            }
        }
        self.read()
    }

    /// Ends every blocking wait now and makes later ones answer at once (with the current
    /// state, as a wait that timed out): the first step of a shutdown, so that parked
    /// blocking queries do not hold it for their whole wait.
    pub fn release_waiters(&self) {
        self.inner.current.release_waiters();
    }

    /// True once [`Store::release_waiters`] ran (shutting down): waits return at once.
    pub fn is_closed(&self) -> bool {
        self.inner.current.waiters_released()
    }

    /// Subscribes to a topic: its current value first, then every change.
    pub fn subscribe(&self, topic: Topic) -> Subscription {
        self.inner.current.subscribe(topic)
    }

    /// Topics with subscribers now.
    pub fn subscribed_topics(&self) -> usize {
        self.inner.current.subscribed_topics()
    }

    /// A leaf certificate for `service`, signed by the active root. Reused until two thirds
    /// of its lifetime have passed or the CA changes.
    pub fn leaf(&self, service: &str) -> Result<Arc<IssuedCert>, WriteError> {
        self.leaf_with_sans(service, &[])
    }

    /// As [`Store::leaf`], with `dns_sans` as DNS SANs too: each set of SANs (in any order) is
    /// its own certificate, cached and renewed as the plain one is.
    pub fn leaf_with_sans(&self, service: &str, dns_sans: &[String]) -> Result<Arc<IssuedCert>, WriteError> {
        let state = self.read();
        let ca = state.ca().ok_or(ca::CaError::NoActiveRoot)?;
        let now = SystemTime::now();
        let mut sans = dns_sans.to_vec();
        sans.sort();
        sans.dedup();
        let key = (service.to_owned(), sans);
        if let Some(cert) = self.inner.leaves.lock().get(&key)
            && cert.create_index == ca.modify_index
            && now < cert.renew_at()
        {
            return Ok(Arc::clone(cert));
        }
        let cert = Arc::new(ca::sign_leaf_with_sans(
            &ca,
            &self.inner.config.datacenter,
            service,
            &key.1,
            now,
        )?);
        self.inner.leaves.lock().insert(key, Arc::clone(&cert));
        Ok(cert)
    }

    /// Signs a leaf for the public key of a CSR sent by an agent (see [`ca::sign_csr`]); the
    /// private key never reaches the server. DNS SANs are limited to the names the service's
    /// ingress-gateway config entry gives it (none for any other service).
    pub fn sign_csr(&self, csr_pem: &str) -> Result<IssuedCert, ca::CsrError> {
        let state = self.read();
        let ca = state.ca().ok_or(ca::CaError::NoActiveRoot)?;
        let datacenter = &self.inner.config.datacenter;
        let may_claim = |service: &str, name: &str| match state
            .config_entry(structs::config_entry::ConfigEntryKind::IngressGateway, service)
            .as_deref()
        {
            Some(structs::config_entry::ConfigEntry::IngressGateway(g)) => g.may_claim_dns_name(name, datacenter),
            _ => false,
        };
        ca::sign_csr(&ca, datacenter, csr_pem, &may_claim, SystemTime::now())
    }

    /// What this server knows of the other datacenters.
    pub fn federation(&self) -> &Arc<crate::federation::Federation> {
        &self.inner.federation
    }

    /// Signs a secondary datacenter's intermediate (see [`ca::sign_intermediate`]): its PEM
    /// and the id of the root that signed it.
    pub fn sign_intermediate(&self, csr_pem: &str) -> Result<(String, String), ca::CsrError> {
        let state = self.read();
        let ca = state.ca().ok_or(ca::CaError::NoActiveRoot)?;
        ca::sign_intermediate(&ca, csr_pem, SystemTime::now())
    }

    /// A snapshot archive of the current state and the index it was taken at (see
    /// [`crate::snapshot`]). Serialising and compressing run on a blocking thread.
    pub async fn save_snapshot(&self) -> Result<(Index, Vec<u8>), crate::snapshot::SnapshotError> {
        let state = self.read();
        let datacenter = self.inner.config.datacenter.clone();
        let index = state.index;
        let archive = tokio::task::spawn_blocking(move || crate::snapshot::save(&state, &datacenter))
            .await
            .map_err(|e| crate::snapshot::SnapshotError::State(format!("the snapshot task failed: {e}")))??;
        Ok((index, archive))
    }

    /// Replaces every row with `snapshot`'s, as one write: readers see the state before or
    /// the state after, and every index moves forward.
    pub async fn restore(&self, snapshot: Arc<crate::snapshot::Snapshot>) -> Result<WriteOutcome, WriteError> {
        let outcome = self.write(Op::Restore(snapshot)).await?;
        // Over etcd a restore is written apart from the writer's plans, without the audit
        // record it carried: the record follows it in a write of its own.
        if crate::audit::release_unrecorded() {
            self.write(Op::AuditOnly).await?;
        }
        Ok(outcome)
    }

    /// Stops accepting writes, lets queued ones finish, and waits for the writer and
    /// whatever else the storage runs (snapshots, etcd's watches and lease) to stop.
    pub async fn close(&self) {
        self.tx.lock().take();
        self.inner.storage.close().await;
    }
}

/// Opens the storage `config` names, with `writes` for its writer, and the state it holds.
async fn open_storage(config: &StoreConfig, writes: Writes) -> Result<(Arc<dyn Storage>, Arc<Current>), StoreError> {
    if let Some(backend) = &config.backend {
        return backend.open(config.publish_buffer, writes).await;
    }
    let (writer, state) = LogWriter::open(config.data_dir.clone(), config.snapshot_every).await?;
    let current = Current::new(state, config.publish_buffer);
    let storage = writer.start(Arc::clone(&current), writes)?;
    Ok((storage, current))
}
