//! Writing the catalog to etcd: one task takes every queued write (group commit), plans
//! each on the current state, and sends the rows they change as one etcd transaction,
//! guarded by the write guard (see [`layout`]). If another server wrote since the state it
//! planned on, etcd refuses it; the task waits until the watch has applied that write and
//! plans the batch again. A write is answered once etcd committed it and the watch has
//! applied it, so a client reads its own writes on the server it wrote to. A batch whose
//! writes change nothing (refused, a failed check-and-set) is still confirmed with the
//! guard, so that every answer reflects the latest committed state.

use super::apply::Applier;
use super::config::EtcdConfig;
use super::layout;
use super::outage::Outage;
use crate::current::Current;
use crate::error::{StorageFailure, StoreError, WriteError};
use crate::state::State;
use crate::storage::{Job, Planned, WriteOutcome, Writes};
use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use structs::Index;
use tracing::{info, warn};

/// The write side of the etcd storage.
pub(crate) struct Writer {
    client: Client,
    config: EtcdConfig,
    /// Where this server's own writes show up before they are answered.
    applier: Arc<Applier>,
    /// Writes failing (logged when they start and stop failing).
    outage: parking_lot::Mutex<Outage>,
}

/// What the write outage is logged as.
const WRITES_FAIL: &str = "writes to etcd fail (HTTP 500)";

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
        if matches!(job.op, crate::ops::Op::Restore(_)) {
            // A restore is written on its own (see `restore.rs`).
            return (batch, taken);
        }
        let changes = match Planned::of(&job.op, &working, datacenter, now) {
            Planned::Changed(changes) => changes,
            other => {
                batch.planned.push(other);
                continue;
            }
        };
        let encoded: Result<Vec<_>, _> = changes.iter().map(layout::encode).collect();
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
        working.apply(working.index.next(), &changes);
        for (key, value) in encoded {
            match position.get(&key) {
                Some(&i) => batch.ops[i].1 = value,
                None => {
                    position.insert(key.clone(), batch.ops.len());
                    batch.ops.push((key, value));
                }
            }
        }
        batch.planned.push(Planned::Changed(changes));
    }
    let taken = batch.planned.len();
    (batch, taken)
}

/// How many times a batch is planned again after other servers' writes before it fails.
const MAX_CONFLICTS: usize = 64;

fn fail_all(jobs: impl IntoIterator<Item = Job>, error: StoreError) {
    let failure = StorageFailure(Arc::new(error));
    for job in jobs {
        let _ = job.reply.send(Err(WriteError::Storage(failure.clone())));
    }
}

/// Answers the writes of a committed batch: those that changed something at `revision`,
/// the others at `unchanged`.
fn answer(jobs: impl IntoIterator<Item = Job>, planned: Vec<Planned>, unchanged: Index, revision: Index) {
    for (job, planned) in jobs.into_iter().zip(planned) {
        let result = match planned {
            Planned::Refused(e) => Err(e),
            Planned::Unchanged { applied } => Ok(WriteOutcome {
                index: unchanged,
                applied,
            }),
            Planned::Changed(_) => Ok(WriteOutcome {
                index: revision,
                applied: true,
            }),
        };
        let _ = job.reply.send(result);
    }
}

/// The transaction writing `ops` if no catalog write committed after `base`; otherwise it
/// reads the write guard, to tell whose write came first.
fn guarded_txn(config: &EtcdConfig, base: Index, ops: &[(String, Option<Vec<u8>>)]) -> Txn {
    let guard = config.guard_key();
    let mut then: Vec<TxnOp> = ops
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
    Txn::new()
        .when([Compare::mod_revision(guard.clone(), CompareOp::Less, base.0 as i64 + 1)])
        .and_then(then)
        .or_else([TxnOp::get(guard, None)])
}

impl Writer {
    /// Writes through `client`; answers once `applier` has applied what was written.
    pub(crate) fn new(client: Client, config: EtcdConfig, applier: Arc<Applier>) -> Self {
        Self {
            client,
            config,
            applier,
            outage: parking_lot::Mutex::new(Outage::default()),
        }
    }

    /// Batches queued writes into guarded etcd transactions (see the module docs) until the
    /// queue closes.
    pub(crate) async fn run(self, current: Arc<Current>, mut writes: Writes) {
        let mut queue: VecDeque<Job> = VecDeque::new();
        loop {
            if queue.is_empty() {
                match writes.jobs.recv().await {
                    Some(job) => queue.push_back(job),
                    None => break,
                }
            }
            writes.take_queued(&mut queue);
            if let Some(Job {
                op: crate::ops::Op::Restore(snapshot),
                ..
            }) = queue.front()
            {
                let snapshot = Arc::clone(snapshot);
                let result = super::restore::restore(&self.client, &self.config, &self.applier, &snapshot).await;
                if let Some(job) = queue.pop_front() {
                    let _ = job
                        .reply
                        .send(result.map_err(|e| WriteError::Storage(StorageFailure(Arc::new(e)))));
                }
                continue;
            }
            self.commit(&current, &writes.datacenter, &mut queue).await;
        }
        info!("etcd writer stopped");
    }

    /// Commits the writes at the front of `queue` (as many as one transaction holds),
    /// planning them again while other servers' writes get in first.
    async fn commit(&self, current: &Current, datacenter: &str, queue: &mut VecDeque<Job>) {
        let config = &self.config;
        let mut kv = self.client.kv_client();
        for _ in 0..MAX_CONFLICTS {
            if let Some(marker) = self.applier.restoring() {
                let taken = queue
                    .iter()
                    .take_while(|j| !matches!(j.op, crate::ops::Op::Restore(_)))
                    .count();
                return fail_all(queue.drain(..taken), StoreError::RestoreInProgress(marker));
            }
            let base = current.read();
            let (batch, taken) = plan_batch(&base, queue, datacenter, config.max_txn_ops.max(2));
            let txn = guarded_txn(config, base.index, &batch.ops);
            let mut tried = Tried::default();
            let sent = tokio::time::timeout(
                config.request_timeout,
                send(&mut kv, txn, &config.guard_key(), &mut tried),
            )
            .await;
            let resp = match sent {
                Ok(Ok(resp)) => resp,
                Ok(Err(source)) => return fail_all(queue.drain(..taken), self.failed(Some(source), &tried)),
                Err(_) => return fail_all(queue.drain(..taken), self.failed(None, &tried)),
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
                if !self.applier.caught_up(theirs, config.request_timeout).await {
                    let error = StoreError::EtcdTimeout {
                        what: format!("catching up with etcd to revision {theirs} (the watch is behind)"),
                        after: config.request_timeout,
                    };
                    return fail_all(queue.drain(..taken), error);
                }
                continue;
            }
            self.outage.lock().worked(WRITES_FAIL);
            let revision = Index(resp.header().map_or(0, |h| h.revision()) as u64);
            let changed = batch.planned.iter().any(|p| matches!(p, Planned::Changed(_)));
            if changed && !self.applier.caught_up(revision, config.request_timeout).await {
                // Committed, so acknowledged; this server's reads lag until its watch catches up.
                warn!(%revision, "a committed write is not yet visible here: the etcd watch is behind");
            }
            answer(queue.drain(..taken), batch.planned, base.index.max(Index(1)), revision);
            return;
        }
        fail_all(
            queue.drain(..),
            StoreError::Corrupt(format!(
                "gave up after {MAX_CONFLICTS} conflicting writes from other servers"
            )),
        );
    }

    /// Why a transaction failed with etcd's `error`, or got no answer in time (`None`); logs
    /// the start of a write outage.
    fn failed(&self, error: Option<etcd_client::Error>, tried: &Tried) -> StoreError {
        match error {
            None => {
                let cause = tried.cause();
                self.outage.lock().failed(WRITES_FAIL, &cause);
                StoreError::EtcdTimeout {
                    what: cause,
                    after: self.config.request_timeout,
                }
            }
            Some(source) => {
                self.outage.lock().failed(WRITES_FAIL, &source);
                let what = if tried.no_leader {
                    tried.cause_without_error()
                } else {
                    "writing to etcd".into()
                };
                StoreError::Etcd { what, source }
            }
        }
    }
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
pub(super) async fn send(
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
pub(super) struct Tried {
    last_error: Option<String>,
    unanswered: bool,
    /// Gave up: etcd kept answering that it has no leader.
    no_leader: bool,
}

impl Tried {
    /// Why the write failed, for the 500: the cause, and whether it may still apply.
    pub(super) fn cause(&self) -> String {
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
