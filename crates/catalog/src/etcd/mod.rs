//! The HA backend: the catalog kept in etcd, shared by several meshd servers.
//!
//! Each server keeps the whole catalog in memory, as with the embedded log, and keeps it
//! current from one etcd watch on the catalog's keys, applying every etcd revision in order.
//! An etcd revision is the catalog index, so `X-Consul-Index` means the same on every server.
//!
//! - **Writes.** One task takes every queued write (group commit), plans each against the
//!   state it holds, and sends the rows they change as one etcd transaction, guarded by the
//!   write guard (see [`layout`]): if another server wrote since the state it planned on,
//!   etcd refuses it, the task waits until its watch has applied that write and plans the
//!   batch again. A write is acknowledged once etcd committed it and this server's watch has
//!   applied it, so a client reads its own writes on the server it wrote to. A batch whose
//!   writes change nothing (refused, a failed check-and-set) is still confirmed with the
//!   guard, so that every answer reflects the latest committed state.
//! - **Reads** never ask etcd: blocking queries, the event publisher and proxies keep
//!   working on the last applied state while etcd has no quorum.
//! - **Compaction.** When the watch's next revision has been compacted away, the server
//!   reads every key again and publishes the result as a reset: every subscriber gets the
//!   new value and every blocking query wakes.
//! - **Cluster** (`cluster.rs`): servers register under a lease, one of them leads.

mod cluster;
pub(crate) mod layout;

pub use cluster::{Cluster, ClusterStatus, ServerInfo};
pub use layout::LayoutError;

use crate::error::{StorageFailure, StoreError, WriteError};
use crate::ops::plan;
use crate::state::{Change, State};
use crate::store::{Inner, Job, WriteOutcome, notify, notify_all};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use structs::Index;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// How to reach etcd and how this server appears in the cluster.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// Client URLs of the etcd members (`http://host:2379`).
    pub endpoints: Vec<String>,
    /// Every key meshd writes starts with this (`/meshd/`).
    pub prefix: String,
    /// This server's name, unique in the cluster (its node name).
    pub server_name: String,
    /// The address this server reports for itself (`/v1/status/peers`).
    pub advertise: String,
    /// This server's xDS address, for whoever lists servers.
    pub xds_address: String,
    /// Lease of the server's registration and leadership: a dead server's duties move to
    /// another within this time.
    pub lease_ttl: Duration,
    /// A write not committed by etcd within this time fails (quorum lost, etcd down).
    pub request_timeout: Duration,
    /// Operations one etcd transaction may hold (etcd's `--max-txn-ops`, 128 by default).
    pub max_txn_ops: usize,
}

impl EtcdConfig {
    /// Settings for `endpoints` with the defaults.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            prefix: "/meshd/".into(),
            server_name: "meshd-server".into(),
            advertise: String::new(),
            xds_address: String::new(),
            lease_ttl: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            max_txn_ops: 128,
        }
    }

    fn catalog_prefix(&self) -> String {
        format!("{}{}", self.prefix, layout::CATALOG)
    }

    fn guard_key(&self) -> String {
        format!("{}{}", self.catalog_prefix(), layout::GUARD)
    }
}

fn etcd_err(what: impl Into<String>) -> impl FnOnce(etcd_client::Error) -> StoreError {
    let what = what.into();
    move |source| StoreError::Etcd { what, source }
}

/// The etcd side of a store: its client and how far its watch has applied.
pub(crate) struct Backend {
    client: Client,
    config: EtcdConfig,
    /// The revision the local state reflects.
    applied: watch::Sender<Index>,
    pub(crate) stop: CancellationToken,
    pub(crate) cluster: Arc<Cluster>,
    /// Full reloads after a compaction.
    pub(crate) reloads: std::sync::atomic::AtomicU64,
    /// Writes failing (logged when they start and stop failing).
    write_outage: parking_lot::Mutex<Outage>,
}

/// Connects to etcd and reads the catalog: a one-line error when etcd cannot be reached
/// within the request timeout.
pub(crate) async fn connect(config: &EtcdConfig) -> Result<(Client, State), StoreError> {
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
    let state = load(&client, config).await.map_err(|e| match e {
        StoreError::EtcdTimeout { after, .. } => StoreError::EtcdTimeout {
            what: format!("reading the catalog from etcd at {endpoints}"),
            after,
        },
        other => other,
    })?;
    Ok((client, state))
}

/// Reads every catalog key: the state at the read's revision.
async fn load(client: &Client, config: &EtcdConfig) -> Result<State, StoreError> {
    let prefix = config.catalog_prefix();
    let mut kv = client.kv_client();
    let resp = tokio::time::timeout(
        config.request_timeout,
        kv.get(prefix.clone(), Some(GetOptions::new().with_prefix())),
    )
    .await
    .map_err(|_| StoreError::EtcdTimeout {
        what: "reading the catalog from etcd".into(),
        after: config.request_timeout,
    })?
    .map_err(etcd_err("reading the catalog from etcd"))?;
    let revision = resp.header().map_or(0, |h| h.revision());
    let mut kvs = Vec::with_capacity(resp.kvs().len());
    for kv in resp.kvs() {
        let Some(key) = kv.key().strip_prefix(prefix.as_bytes()) else {
            continue;
        };
        let Ok(key) = std::str::from_utf8(key) else {
            error!(key = ?String::from_utf8_lossy(kv.key()), "skipping an etcd key that is not UTF-8");
            continue;
        };
        // A key meshd cannot read is reported and skipped, not fatal: the rest of the
        // catalog is still served.
        if let Err(e) = layout::decode(key, Some(kv.value())) {
            error!(error = %e, "skipping an etcd key meshd cannot read");
            continue;
        }
        kvs.push(layout::Kv {
            key,
            value: kv.value(),
            create: Index(kv.create_revision() as u64),
            modify: Index(kv.mod_revision() as u64),
        });
    }
    layout::load(kvs, Index(revision as u64)).map_err(|e| StoreError::Corrupt(e.to_string()))
}

impl Backend {
    pub(crate) fn new(client: Client, config: EtcdConfig, applied: Index) -> Arc<Self> {
        let cluster = Cluster::new(client.clone(), &config);
        Arc::new(Self {
            client,
            config,
            applied: watch::Sender::new(applied),
            stop: CancellationToken::new(),
            cluster,
            reloads: std::sync::atomic::AtomicU64::new(0),
            write_outage: parking_lot::Mutex::new(Outage::default()),
        })
    }

    /// Waits until the local state reflects `revision`; false after `timeout`.
    pub(crate) async fn caught_up(&self, revision: Index, timeout: Duration) -> bool {
        let mut rx = self.applied.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|applied| *applied >= revision))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

impl Backend {
    /// Waits until the local state reflects every catalog write etcd had committed when
    /// called (the write guard's revision, read linearizably); false after `timeout`.
    pub(crate) async fn catch_up(&self, timeout: Duration) -> bool {
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
        self.caught_up(latest, deadline.saturating_duration_since(tokio::time::Instant::now()))
            .await
    }
}

/// What planning decided for one queued write.
enum Planned {
    Refused(WriteError),
    /// Nothing to write; `applied` false when a check-and-set did not match.
    Unchanged(bool),
    Changed,
}

/// A batch planned against one state: each write's outcome and the keys they change.
struct Batch {
    planned: Vec<Planned>,
    /// Keys (relative to the catalog prefix) and what to put there (`None`: delete), in
    /// first-written order, the last write of each key winning.
    ops: Vec<(String, Option<Vec<u8>>)>,
}

/// Plans `jobs` in order on `state`, taking as many as one transaction holds; the rest are
/// left in `jobs`.
fn plan_batch(state: &State, jobs: &VecDeque<Job>, datacenter: &str, max_ops: usize) -> (Batch, usize) {
    let now = SystemTime::now();
    let mut working = state.clone();
    let mut batch = Batch {
        planned: Vec::new(),
        ops: Vec::new(),
    };
    let mut position: HashMap<String, usize> = HashMap::new();
    for (taken, job) in jobs.iter().enumerate() {
        let p = match plan(&job.op, &working, datacenter, now) {
            Err(e) => {
                batch.planned.push(Planned::Refused(e));
                continue;
            }
            Ok(p) if !p.applied || p.changes.is_empty() => {
                batch.planned.push(Planned::Unchanged(p.applied));
                continue;
            }
            Ok(p) => p,
        };
        let encoded: Result<Vec<_>, _> = p.changes.iter().map(layout::encode).collect();
        let encoded = match encoded {
            Ok(e) => e,
            Err(source) => {
                let failure = StorageFailure(Arc::new(StoreError::Encode { what: "a row", source }));
                batch.planned.push(Planned::Refused(WriteError::Storage(failure)));
                continue;
            }
        };
        let fresh: HashSet<&String> = encoded
            .iter()
            .map(|(k, _)| k)
            .filter(|k| !position.contains_key(*k))
            .collect();
        // One slot stays for the write guard.
        if batch.ops.len() + fresh.len() + 1 > max_ops {
            if batch.ops.is_empty() {
                let why = format!(
                    "this write changes {} keys, more than one etcd transaction may hold (max {}; see etcd's --max-txn-ops)",
                    fresh.len(),
                    max_ops - 1
                );
                let failure = StorageFailure(Arc::new(StoreError::Corrupt(why)));
                batch.planned.push(Planned::Refused(WriteError::Storage(failure)));
                continue;
            }
            return (batch, taken);
        }
        working.apply(working.index.next(), &p.changes);
        for (key, value) in encoded {
            match position.get(&key) {
                Some(&i) => batch.ops[i].1 = value,
                None => {
                    position.insert(key.clone(), batch.ops.len());
                    batch.ops.push((key, value));
                }
            }
        }
        batch.planned.push(Planned::Changed);
    }
    let taken = batch.planned.len();
    (batch, taken)
}

/// How many times a batch is planned again after other servers' writes before it fails.
const MAX_CONFLICTS: usize = 64;

/// The write task: batches queued writes into guarded etcd transactions (see the module docs).
pub(crate) async fn writer(inner: Arc<Inner>, backend: Arc<Backend>, mut rx: mpsc::Receiver<Job>) {
    let mut queue: VecDeque<Job> = VecDeque::new();
    loop {
        if queue.is_empty() {
            match rx.recv().await {
                Some(job) => queue.push_back(job),
                None => break,
            }
        }
        while queue.len() < inner.config.max_batch {
            match rx.try_recv() {
                Ok(job) => queue.push_back(job),
                Err(_) => break,
            }
        }
        commit(&inner, &backend, &mut queue).await;
    }
    info!("etcd writer stopped");
}

fn fail_all(jobs: impl IntoIterator<Item = Job>, error: StoreError) {
    let failure = StorageFailure(Arc::new(error));
    for job in jobs {
        let _ = job.reply.send(Err(WriteError::Storage(failure.clone())));
    }
}

/// Commits the writes at the front of `queue` (as many as one transaction holds), planning
/// them again while other servers' writes get in first.
async fn commit(inner: &Arc<Inner>, backend: &Backend, queue: &mut VecDeque<Job>) {
    let config = &backend.config;
    let mut kv = backend.client.kv_client();
    for _ in 0..MAX_CONFLICTS {
        let base = inner.state.read().clone();
        let (batch, taken) = plan_batch(&base, queue, &inner.config.datacenter, config.max_txn_ops.max(2));
        let guard = config.guard_key();
        let mut then: Vec<TxnOp> = batch
            .ops
            .iter()
            .map(|(key, value)| {
                let key = format!("{}{key}", config.catalog_prefix());
                match value {
                    Some(v) => TxnOp::put(key, v.clone(), None),
                    None => TxnOp::delete(key, None),
                }
            })
            .collect();
        if !then.is_empty() {
            then.push(TxnOp::put(guard.clone(), config.server_name.clone(), None));
        }
        let txn = Txn::new()
            .when([Compare::mod_revision(
                guard.clone(),
                CompareOp::Less,
                base.index.0 as i64 + 1,
            )])
            .and_then(then)
            .or_else([TxnOp::get(guard, None)]);
        let mut tried = Tried::default();
        let sent = tokio::time::timeout(
            config.request_timeout,
            send(&mut kv, txn, &config.guard_key(), &mut tried),
        )
        .await;
        let resp = match sent {
            Err(_) => {
                let cause = tried.cause();
                backend
                    .write_outage
                    .lock()
                    .failed("writes to etcd fail (HTTP 500)", &cause);
                fail_all(
                    queue.drain(..taken),
                    StoreError::EtcdTimeout {
                        what: cause,
                        after: config.request_timeout,
                    },
                );
                return;
            }
            Ok(Err(source)) => {
                backend
                    .write_outage
                    .lock()
                    .failed("writes to etcd fail (HTTP 500)", &source);
                let what = if tried.no_leader {
                    tried.cause_without_error()
                } else {
                    "writing to etcd".into()
                };
                fail_all(queue.drain(..taken), StoreError::Etcd { what, source });
                return;
            }
            Ok(Ok(resp)) => resp,
        };
        if !resp.succeeded() {
            // Another server wrote first: catch up to its write and plan again.
            let theirs = resp
                .op_responses()
                .into_iter()
                .find_map(|r| match r {
                    TxnOpResponse::Get(g) => g.kvs().first().map(|kv| Index(kv.mod_revision() as u64)),
                    _ => None,
                })
                .unwrap_or(base.index.next());
            if !backend.caught_up(theirs, config.request_timeout).await {
                fail_all(
                    queue.drain(..taken),
                    StoreError::EtcdTimeout {
                        what: format!("catching up with etcd to revision {theirs} (the watch is behind)"),
                        after: config.request_timeout,
                    },
                );
                return;
            }
            continue;
        }
        backend.write_outage.lock().worked("writes to etcd fail (HTTP 500)");
        let revision = Index(resp.header().map_or(0, |h| h.revision()) as u64);
        let changed = batch.planned.iter().any(|p| matches!(p, Planned::Changed));
        if changed && !backend.caught_up(revision, config.request_timeout).await {
            // Committed, so acknowledged; this server's reads lag until its watch catches up.
            warn!(%revision, "a committed write is not yet visible here: the etcd watch is behind");
        }
        let unchanged_index = base.index.max(Index(1));
        for (job, planned) in queue.drain(..taken).zip(batch.planned) {
            let result = match planned {
                Planned::Refused(e) => Err(e),
                Planned::Unchanged(applied) => Ok(WriteOutcome {
                    index: unchanged_index,
                    applied,
                }),
                Planned::Changed => Ok(WriteOutcome {
                    index: revision,
                    applied: true,
                }),
            };
            let _ = job.reply.send(result);
        }
        return;
    }
    fail_all(
        queue.drain(..),
        StoreError::Corrupt(format!(
            "gave up after {MAX_CONFLICTS} conflicting writes from other servers"
        )),
    );
}

/// Whether a transaction that failed with `e` may simply be sent again: the member could
/// not be reached or its connection broke or was cancelled (another may take it), or it has
/// no leader now
/// (an election is under way; [`send`] gives up once that lasts [`NO_LEADER_GRACE`]). A transaction that did commit
/// despite an error is harmless to send again: its guard no longer matches, and the batch is
/// planned again on the state that includes it.
fn retriable(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => match status.code() {
            // etcd's "try again or elsewhere": no leader, leader changed, not reachable.
            tonic::Code::Unavailable => true,
            // A connection to a member that just died breaks under the request.
            tonic::Code::Unknown => status.message().contains("transport error"),
            tonic::Code::Cancelled => true,
            _ => false,
        },
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

/// Whether etcd answered that it has no leader (an election, or quorum lost).
fn no_leader(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(status) if status.message().contains("leader"))
}

/// How long a write keeps trying while etcd answers "no leader": about one election (etcd's
/// default election timeout is 1 s), so a leader change is ridden out while a lost quorum
/// fails the write soon after etcd notices it, not after the whole request timeout.
const NO_LEADER_GRACE: Duration = Duration::from_secs(1);

/// How often etcd is asked whether it has a leader while an attempt waits for its answer.
const LEADER_PROBE_EVERY: Duration = Duration::from_millis(200);

/// How long one attempt at a transaction may take before it is sent again: a proposal
/// caught in a leader's failure waits in etcd for several seconds, while a new attempt
/// reaches the new leader.
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(1500);

/// Sends a transaction, again while it fails in a way [`retriable`] allows or gets no
/// answer within [`ATTEMPT_TIMEOUT`] (the caller bounds the whole with its timeout), but
/// gives up once etcd has had no leader for [`NO_LEADER_GRACE`]: a proposal sent just
/// before quorum was lost gets no answer at all, so meanwhile etcd is asked (see
/// [`leaderless`]). `tried` keeps what went wrong for the caller's report: the last error,
/// whether an attempt went unanswered (etcd may still commit it), and whether it gave up
/// for want of a leader.
async fn send(
    kv: &mut etcd_client::KvClient,
    txn: Txn,
    probe_key: &str,
    tried: &mut Tried,
) -> Result<etcd_client::TxnResponse, etcd_client::Error> {
    let leaderless = leaderless(kv.clone(), probe_key.to_owned());
    tokio::pin!(leaderless);
    loop {
        let attempt = tokio::time::timeout(ATTEMPT_TIMEOUT, kv.txn(txn.clone()));
        let answer = tokio::select! {
            a = attempt => a,
            e = &mut leaderless => {
                // The attempt in flight is abandoned, not withdrawn.
                tried.unanswered = true;
                tried.no_leader = true;
                return Err(e);
            }
        };
        match answer {
            Err(_) => tried.unanswered = true,
            Ok(Err(e)) if retriable(&e) => {
                tried.last_error = Some(e.to_string());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(other) => return other,
        }
    }
}

/// Resolves, with etcd's error, once every member that answers has said it has no leader
/// for [`NO_LEADER_GRACE`]. Asks with a serializable read (answered by the member itself,
/// refused without a leader as the client requires one), so it answers while quorum is lost;
/// members that cannot be reached tell nothing, and any answer from a member with a leader
/// starts the count again.
async fn leaderless(mut kv: etcd_client::KvClient, key: String) -> etcd_client::Error {
    let mut since: Option<tokio::time::Instant> = None;
    loop {
        tokio::time::sleep(LEADER_PROBE_EVERY).await;
        let probe = kv.get(key.clone(), Some(GetOptions::new().with_serializable()));
        match tokio::time::timeout(LEADER_PROBE_EVERY, probe).await {
            Ok(Err(e)) if no_leader(&e) => {
                let first = *since.get_or_insert_with(tokio::time::Instant::now);
                if first.elapsed() >= NO_LEADER_GRACE {
                    return e;
                }
            }
            Ok(Ok(_)) => since = None,
            _ => {}
        }
    }
}

/// What went wrong with the attempts at one transaction.
#[derive(Default)]
struct Tried {
    last_error: Option<String>,
    unanswered: bool,
    /// Gave up: etcd kept answering that it has no leader.
    no_leader: bool,
}

impl Tried {
    /// Why the write failed, for the 500: the cause, and whether it may still apply.
    fn cause(&self) -> String {
        match &self.last_error {
            Some(e) => format!("{}: {e}", self.cause_without_error()),
            None => self.cause_without_error(),
        }
    }

    /// [`Tried::cause`] without etcd's last error (the caller adds it).
    fn cause_without_error(&self) -> String {
        let why = "etcd did not commit the write (no quorum?)";
        if self.unanswered {
            format!("{why}; it was not acknowledged, but etcd may still apply it if it commits it later")
        } else {
            why.to_owned()
        }
    }
}

/// The watch task: applies every catalog revision in order, from the revision after the
/// state's, and reloads everything when that revision has been compacted.
pub(crate) async fn applier(inner: Arc<Inner>, backend: Arc<Backend>) {
    let config = &backend.config;
    let prefix = config.catalog_prefix();
    let mut watch_client = backend.client.watch_client();
    let mut delay = Duration::from_millis(100);
    let mut outage = Outage::default();
    const WHAT: &str = "the etcd watch on the catalog failed, retrying";
    loop {
        let from = backend.applied.borrow().0 as i64 + 1;
        let options = WatchOptions::new().with_prefix().with_start_revision(from);
        let started = tokio::select! {
            () = backend.stop.cancelled() => return,
            r = watch_client.watch(prefix.clone(), Some(options)) => r,
        };
        let mut stream = match started {
            Ok(s) => s,
            Err(e) => {
                outage.failed(WHAT, &e);
                if sleep_or_stop(&backend.stop, delay).await {
                    return;
                }
                delay = (delay * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        loop {
            let message = tokio::select! {
                () = backend.stop.cancelled() => return,
                m = stream.message() => m,
            };
            match message {
                Ok(Some(resp)) if resp.compact_revision() > 0 => {
                    warn!(
                        compacted_to = resp.compact_revision(),
                        wanted = from,
                        "etcd compacted revisions this server has not applied: reloading the catalog"
                    );
                    match load(&backend.client, config).await {
                        Ok(state) => reset(&inner, &backend, state),
                        Err(e) => warn!(error = %e, "cannot reload the catalog from etcd; retrying"),
                    }
                    break;
                }
                Ok(Some(resp)) if resp.canceled() => {
                    outage.failed(WHAT, &format!("etcd ended the watch: {}", resp.cancel_reason()));
                    break;
                }
                Ok(Some(resp)) => {
                    delay = Duration::from_millis(100);
                    outage.worked(WHAT);
                    apply_events(&inner, &backend, &prefix, resp.events());
                }
                Ok(None) => {
                    outage.failed(WHAT, &"the watch stream closed");
                    break;
                }
                Err(e) => {
                    outage.failed(WHAT, &e);
                    break;
                }
            }
        }
        if sleep_or_stop(&backend.stop, delay).await {
            return;
        }
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// Logs a connection to etcd that keeps failing once when it starts failing (a warning)
/// and once when it works again, not at every retry.
#[derive(Default)]
pub(crate) struct Outage {
    since: Option<std::time::Instant>,
}

impl Outage {
    /// A try failed: warns the first time.
    pub(crate) fn failed(&mut self, what: &str, error: &dyn std::fmt::Display) {
        if self.since.is_none() {
            self.since = Some(std::time::Instant::now());
            warn!(%error, "{what} (reads serve the last applied state; logged again once it works)");
        } else {
            tracing::debug!(%error, "{what}: still failing");
        }
    }

    /// A try worked: says so if it had been failing.
    pub(crate) fn worked(&mut self, what: &str) {
        if let Some(since) = self.since.take() {
            info!(after = ?since.elapsed(), "{what}; working again");
        }
    }
}

/// Sleeps `delay`; true if the store stopped meanwhile.
async fn sleep_or_stop(stop: &CancellationToken, delay: Duration) -> bool {
    tokio::select! {
        () = stop.cancelled() => true,
        () = tokio::time::sleep(delay) => false,
    }
}

/// Applies a watch response's events, one state per revision (a transaction's events share
/// one revision).
fn apply_events(inner: &Inner, backend: &Backend, prefix: &str, events: &[etcd_client::Event]) {
    let mut revision = None;
    let mut changes: Vec<Change> = Vec::new();
    for event in events {
        let Some(kv) = event.kv() else { continue };
        let rev = Index(kv.mod_revision() as u64);
        if revision.is_some_and(|r| r != rev) {
            apply_revision(
                inner,
                backend,
                revision.take().unwrap_or(rev),
                std::mem::take(&mut changes),
            );
        }
        revision = Some(rev);
        let Some(key) = kv
            .key()
            .strip_prefix(prefix.as_bytes())
            .and_then(|k| std::str::from_utf8(k).ok())
        else {
            continue;
        };
        let value = match event.event_type() {
            EventType::Put => Some(kv.value()),
            EventType::Delete => None,
        };
        match layout::decode(key, value) {
            Ok(Some(change)) => changes.push(change),
            Ok(None) => {}
            Err(e) => error!(error = %e, "skipping an etcd change meshd cannot read"),
        }
    }
    if let Some(rev) = revision {
        apply_revision(inner, backend, rev, changes);
    }
}

fn apply_revision(inner: &Inner, backend: &Backend, revision: Index, changes: Vec<Change>) {
    let current = inner.state.read().clone();
    if revision <= current.index {
        return;
    }
    if !changes.is_empty() {
        let mut next = (*current).clone();
        let bumped: HashSet<_> = next.apply(revision, &changes).into_iter().collect();
        let next = Arc::new(next);
        *inner.state.write() = Arc::clone(&next);
        notify(inner, &next, &bumped);
    }
    backend.applied.send_replace(revision);
}

/// Replaces the state with a full reload and wakes everyone who watches anything.
fn reset(inner: &Inner, backend: &Backend, state: State) {
    let current = inner.state.read().index;
    if state.index < current {
        // Never serve an index lower than one already served.
        warn!(reloaded = %state.index, current = %current, "ignoring a reload older than the applied state");
        return;
    }
    let index = state.index;
    let state = Arc::new(state);
    *inner.state.write() = Arc::clone(&state);
    backend.reloads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    notify_all(inner, &state);
    backend.applied.send_replace(index);
    info!(%index, "catalog reloaded from etcd; subscribers reset");
}
