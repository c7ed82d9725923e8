//! Writing the catalog to etcd: one task takes every queued write (group commit), plans
//! each on the current state, and sends the rows they change as one etcd transaction,
//! guarded by the write guard (see [`layout`]). If another server wrote since the state it
//! planned on, etcd refuses it; the task waits until the watch has applied that write and
//! plans the batch again. A write is answered once etcd committed it and the watch has
//! applied it, so a client reads its own writes on the server it wrote to. A batch whose
//! writes change nothing (refused, a failed check-and-set) is still confirmed with the
//! guard, so that every answer reflects the latest committed state.

use crate::apply::Applier;
use crate::config::EtcdConfig;
use crate::layout;
use crate::outage::Outage;
use crate::txn::{Tried, send};
use catalog::State;
use catalog::WriteOutcome;
use catalog::backend::Current;
use catalog::backend::{Job, Planned, Writes};
use catalog::{StorageFailure, StoreError, WriteError};
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::SystemTime;
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
        if matches!(job.op, catalog::Op::Restore(_)) {
            // A restore is written on its own (see `restore.rs`).
            return (batch, taken);
        }
        let changes = match Planned::of(job, &working, datacenter, now) {
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
                op: catalog::Op::Restore(snapshot),
                ..
            }) = queue.front()
            {
                let snapshot = Arc::clone(snapshot);
                let result = crate::restore::restore(&self.client, &self.config, &self.applier, &snapshot).await;
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
                    .take_while(|j| !matches!(j.op, catalog::Op::Restore(_)))
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
                StoreError::Etcd {
                    what,
                    source: Box::new(source),
                }
            }
        }
    }
}
