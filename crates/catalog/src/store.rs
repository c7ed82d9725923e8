//! The Store: the catalog's single writer, its readers, blocking waits and subscriptions.
//!
//! Writes go to one writer thread through a queue. The writer takes every queued write
//! (group commit), plans and applies each to a copy of the current state (O(1), persistent
//! maps), appends the batch to the log with one sync, and only then swaps the new state in,
//! wakes blocking queries, publishes events and acknowledges. Readers therefore only ever
//! see durable state, and an acknowledged write survives `kill -9`.

use crate::ca;
use crate::error::{StorageFailure, StoreError, WriteError};
use crate::etcd;
use crate::keys::{IndexKey, Topic};
use crate::ops::{Op, plan};
use crate::publisher::{Publisher, Subscription};
use crate::state::State;
use crate::wal::{self, Record, Wal};
use bounded_maps::SweptMap;
use parking_lot::{Mutex, RwLock};
use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, SystemTime},
};
use structs::{Index, IssuedCert};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{error, info, warn};

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
    /// Keep the catalog in etcd, shared with other servers, instead of `data_dir`.
    pub etcd: Option<crate::etcd::EtcdConfig>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            datacenter: "dc1".into(),
            data_dir: None,
            snapshot_every: 10_000,
            publish_buffer: 16,
            max_batch: 1024,
            etcd: None,
        }
    }
}

/// The result of an accepted write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOutcome {
    /// The index the write committed at (the current index if it changed nothing).
    pub index: Index,
    /// False when a check-and-set did not match and nothing was written.
    pub applied: bool,
}

pub(crate) struct Job {
    pub(crate) op: Op,
    pub(crate) reply: oneshot::Sender<Result<WriteOutcome, WriteError>>,
}

/// A leaf's identity in the store's cache: service and sorted DNS SANs.
type LeafKey = (String, Vec<String>);

pub(crate) struct Inner {
    pub(crate) config: StoreConfig,
    pub(crate) state: RwLock<Arc<State>>,
    /// Per-key index channels; keys nobody waits on are swept as the map grows. `None` once
    /// waiters are released (shutdown): every wait then answers at once.
    watches: Mutex<Option<SweptMap<IndexKey, watch::Sender<Index>>>>,
    publisher: Publisher,
    /// Issued leaves by service and (sorted) DNS SANs.
    leaves: Mutex<HashMap<LeafKey, Arc<IssuedCert>>>,
    compacting: AtomicBool,
    snapshotter: Mutex<Option<thread::JoinHandle<()>>>,
    /// The etcd side, when the catalog lives there.
    etcd: Option<Arc<etcd::Backend>>,
}

/// What applies writes: the log writer thread, or the etcd tasks.
enum Writer {
    Thread(thread::JoinHandle<()>),
    Etcd {
        writer: tokio::task::JoinHandle<()>,
        others: Vec<tokio::task::JoinHandle<()>>,
    },
}

/// The catalog store. Cheap to clone; [`Store::close`] stops the writer.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
    tx: Arc<Mutex<Option<mpsc::Sender<Job>>>>,
    writer: Arc<Mutex<Option<Writer>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens the store (replaying its data dir, if any), starts the writer, and creates the
    /// CA on first start.
    pub async fn open(config: StoreConfig) -> Result<Store, StoreError> {
        if let Some(etcd) = config.etcd.clone() {
            return Self::open_etcd(config, etcd).await;
        }
        let (wal, state) = match &config.data_dir {
            Some(dir) => {
                let dir = dir.clone();
                let (wal, state) = tokio::task::spawn_blocking(move || Wal::open(&dir))
                    .await
                    .map_err(StoreError::Panicked)??;
                (Some(wal), state)
            }
            None => (None, State::default()),
        };
        let inner = Inner::new(config, state, None);
        let (tx, rx) = mpsc::channel(inner.config.max_batch * 4);
        let writer_inner = Arc::clone(&inner);
        let writer = thread::Builder::new()
            .name("meshd-store-writer".into())
            .spawn(move || writer_loop(writer_inner, wal, rx))
            .map_err(|error| StoreError::Io {
                what: "starting the store writer".into(),
                error,
            })?;
        Self::started(inner, tx, Writer::Thread(writer)).await
    }

    /// Opens the store over etcd: reads the catalog, then follows it with a watch, writes
    /// through guarded transactions, and joins the cluster (see the `etcd` module).
    async fn open_etcd(config: StoreConfig, etcd_config: etcd::EtcdConfig) -> Result<Store, StoreError> {
        let (client, state) = etcd::connect(&etcd_config).await?;
        let index = state.index;
        let request_timeout = etcd_config.request_timeout;
        let backend = etcd::Backend::new(client, etcd_config, index);
        backend.cluster.claim_name(request_timeout).await?;
        let inner = Inner::new(config, state, Some(Arc::clone(&backend)));
        let (tx, rx) = mpsc::channel(inner.config.max_batch * 4);
        let others = vec![
            tokio::spawn(etcd::applier(Arc::clone(&inner), Arc::clone(&backend))),
            tokio::spawn(Arc::clone(&backend.cluster).run_session(backend.stop.clone())),
            tokio::spawn(Arc::clone(&backend.cluster).run_watch(backend.stop.clone())),
        ];
        let writer = tokio::spawn(etcd::writer(Arc::clone(&inner), Arc::clone(&backend), rx));
        Self::started(inner, tx, Writer::Etcd { writer, others }).await
    }

    /// Wraps a started writer, and creates the CA on first start.
    async fn started(inner: Arc<Inner>, tx: mpsc::Sender<Job>, writer: Writer) -> Result<Store, StoreError> {
        let store = Store {
            inner,
            tx: Arc::new(Mutex::new(Some(tx))),
            writer: Arc::new(Mutex::new(Some(writer))),
        };
        if store.read().ca().is_none()
            && let Err(e) = store.write(Op::CaBootstrap(ca::CaConfig::default())).await
        {
            store.close().await;
            return Err(StoreError::CaBootstrap(Box::new(e)));
        }
        Ok(store)
    }

    /// How many times the catalog was read again from etcd because the watch's next
    /// revision had been compacted (0 for the embedded store).
    pub fn etcd_reloads(&self) -> u64 {
        self.inner
            .etcd
            .as_ref()
            .map_or(0, |b| b.reloads.load(Ordering::Relaxed))
    }

    /// Waits until this store has applied `index` (written through another server), or
    /// `timeout`; true once it has. The embedded store applies everything it acknowledges.
    pub async fn wait_applied(&self, index: Index, timeout: Duration) -> bool {
        match &self.inner.etcd {
            Some(backend) => backend.caught_up(index, timeout).await,
            None => true,
        }
    }

    /// Waits until this store has applied every write committed anywhere before the call
    /// (over etcd: another server's too), or `timeout`; true once it has. For what must not
    /// be judged on a state behind another server's, such as a token written through
    /// another server and unknown here. The embedded store has always applied everything.
    pub async fn catch_up(&self, timeout: Duration) -> bool {
        match &self.inner.etcd {
            Some(backend) => backend.catch_up(timeout).await,
            None => true,
        }
    }

    /// The servers sharing this store's etcd (`None`: the embedded store, one server).
    pub fn cluster(&self) -> Option<&Arc<etcd::Cluster>> {
        self.inner.etcd.as_ref().map(|b| &b.cluster)
    }

    /// The datacenter this store serves.
    pub fn datacenter(&self) -> &str {
        &self.inner.config.datacenter
    }

    /// The current (durable) state.
    pub fn read(&self) -> Arc<State> {
        self.inner.state.read().clone()
    }

    /// Submits a write and waits until it is durable (or refused).
    pub async fn write(&self, op: Op) -> Result<WriteOutcome, WriteError> {
        let tx = self.tx.lock().clone().ok_or(WriteError::Closed)?;
        let (reply, rx) = oneshot::channel();
        tx.send(Job { op, reply }).await.map_err(|_| WriteError::Closed)?;
        rx.await.map_err(|_| WriteError::Closed)?
    }

    /// The index of `key`, as a channel that changes with it: for a long-lived follower of a
    /// few keys, which keeps its receivers rather than waiting anew each time. `None` once
    /// waits are released (the store is closing); the channel closes then too.
    pub fn index_receiver(&self, key: &IndexKey) -> Option<watch::Receiver<Index>> {
        let mut guard = self.inner.watches.lock();
        let watches = guard.as_mut()?;
        watches.sweep_if_due(|_, tx| tx.receiver_count() > 0);
        Some(
            watches
                .entry(key.clone())
                .or_insert_with(|| watch::Sender::new(self.read().index_of(key)))
                .subscribe(),
        )
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
        // Dropping the senders wakes every receiver.
        self.inner.watches.lock().take();
    }

    /// True once [`Store::release_waiters`] ran (shutting down): waits return at once.
    pub fn is_closed(&self) -> bool {
        self.inner.watches.lock().is_none()
    }

    /// Subscribes to a topic: its current value first, then every change.
    pub fn subscribe(&self, topic: Topic) -> Subscription {
        self.inner.publisher.subscribe(topic, || self.read())
    }

    /// Topics with subscribers now.
    pub fn subscribed_topics(&self) -> usize {
        self.inner.publisher.topic_count()
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

    /// Stops accepting writes, lets queued ones finish, and waits for the writer and any
    /// snapshot in progress to stop.
    pub async fn close(&self) {
        self.tx.lock().take();
        let writer = self.writer.lock().take();
        match writer {
            Some(Writer::Etcd { writer, others }) => {
                let _ = writer.await;
                if let Some(backend) = &self.inner.etcd {
                    backend.stop.cancel();
                }
                for task in others {
                    let _ = task.await;
                }
            }
            thread => {
                let inner = Arc::clone(&self.inner);
                let _ = tokio::task::spawn_blocking(move || {
                    if let Some(Writer::Thread(handle)) = thread {
                        let _ = handle.join();
                    }
                    if let Some(handle) = inner.snapshotter.lock().take() {
                        let _ = handle.join();
                    }
                })
                .await;
            }
        }
    }
}

impl Inner {
    fn new(config: StoreConfig, state: State, etcd: Option<Arc<etcd::Backend>>) -> Arc<Self> {
        Arc::new(Inner {
            publisher: Publisher::new(config.publish_buffer),
            config,
            state: RwLock::new(Arc::new(state)),
            watches: Mutex::new(Some(SweptMap::default())),
            leaves: Mutex::new(HashMap::new()),
            compacting: AtomicBool::new(false),
            snapshotter: Mutex::new(None),
            etcd,
        })
    }
}

fn writer_loop(inner: Arc<Inner>, mut wal: Option<Wal>, mut rx: mpsc::Receiver<Job>) {
    let mut failed: Option<StorageFailure> = None;
    while let Some(first) = rx.blocking_recv() {
        let mut batch = vec![first];
        while batch.len() < inner.config.max_batch {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        if let Some(reason) = &failed {
            for job in batch {
                let _ = job.reply.send(Err(WriteError::Storage(reason.clone())));
            }
            continue;
        }
        let now = SystemTime::now();
        let mut working = (**inner.state.read()).clone();
        let mut records = Vec::new();
        let mut bumped = HashSet::new();
        let mut replies = Vec::with_capacity(batch.len());
        for job in batch {
            let result = match plan(&job.op, &working, &inner.config.datacenter, now) {
                Err(e) => Err(e),
                Ok(p) if !p.applied || p.changes.is_empty() => Ok(WriteOutcome {
                    index: working.index.max(Index(1)),
                    applied: p.applied,
                }),
                Ok(p) => {
                    let index = working.index.next();
                    bumped.extend(working.apply(index, &p.changes));
                    records.push(Record {
                        index,
                        changes: p.changes,
                    });
                    Ok(WriteOutcome { index, applied: true })
                }
            };
            replies.push((job.reply, result));
        }
        if !records.is_empty() {
            if let Some(w) = wal.as_mut()
                && let Err(e) = w.append(&records)
            {
                // Nothing of the batch is applied (the state is the working copy's). With the
                // log cut back to its last good record, later writes are tried again (the
                // disk may have room by then); otherwise none is accepted any more.
                let clean = w.is_clean();
                if clean {
                    error!(error = %e, "the log could not be written; this write fails, the next ones are tried");
                } else {
                    error!(error = %e, "the log could not be written nor cut back; refusing further writes");
                }
                let reason = StorageFailure(Arc::new(e));
                for (reply, result) in replies {
                    let _ = reply.send(result.and(Err(WriteError::Storage(reason.clone()))));
                }
                if !clean {
                    failed = Some(reason);
                }
                continue;
            }
            let new = Arc::new(working);
            *inner.state.write() = Arc::clone(&new);
            notify(&inner, &new, &bumped);
            if let Some(w) = wal.as_mut() {
                maybe_compact(&inner, w, &new);
            }
        }
        for (reply, result) in replies {
            let _ = reply.send(result);
        }
    }
    info!("store writer stopped");
}

pub(crate) fn notify(inner: &Inner, state: &State, bumped: &HashSet<IndexKey>) {
    // Only the keys this write touched; keys nobody waits on any more are dropped here or
    // swept when the map has doubled (see `wait`). Nothing to wake once waiters are released.
    if let Some(watches) = inner.watches.lock().as_mut() {
        for key in bumped {
            if let Some(tx) = watches.get(key) {
                if tx.receiver_count() == 0 {
                    watches.remove(key);
                } else {
                    tx.send_replace(state.index_of(key));
                }
            }
        }
    }
    inner.publisher.publish(state, bumped);
}

/// After the state was replaced wholesale (reloaded): every waiter reads again and every
/// subscribed topic gets its new value.
pub(crate) fn notify_all(inner: &Inner, state: &State) {
    if let Some(watches) = inner.watches.lock().as_mut() {
        watches.retain(|key, tx| {
            if tx.receiver_count() == 0 {
                return false;
            }
            tx.send_replace(state.index_of(key));
            true
        });
    }
    let keys = inner.publisher.keys();
    inner.publisher.publish(state, &keys);
}

fn maybe_compact(inner: &Arc<Inner>, wal: &mut Wal, state: &Arc<State>) {
    if wal.records_since_snapshot < inner.config.snapshot_every || inner.compacting.swap(true, Ordering::AcqRel) {
        return;
    }
    if let Err(e) = wal.rotate(state.index.next()) {
        warn!(error = %e, "could not start a new log segment; will retry");
        inner.compacting.store(false, Ordering::Release);
        return;
    }
    let (dir, snap, done) = (wal.dir().to_owned(), Arc::clone(state), Arc::clone(inner));
    let spawned = thread::Builder::new().name("meshd-snapshot".into()).spawn(move || {
        match wal::write_snapshot(&dir, &snap) {
            Ok(()) => info!(index = %snap.index, "snapshot written"),
            Err(e) => warn!(error = %e, "snapshot failed; the log still holds every write"),
        }
        done.compacting.store(false, Ordering::Release);
    });
    match spawned {
        // The previous snapshot thread has finished (compacting was false): reap it.
        Ok(handle) => {
            if let Some(previous) = inner.snapshotter.lock().replace(handle) {
                let _ = previous.join();
            }
        }
        Err(_) => {
            warn!("could not start the snapshot thread");
            inner.compacting.store(false, Ordering::Release);
        }
    }
}
