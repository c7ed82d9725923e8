//! Auditing writes: the HTTP API runs each write request in an [`AuditScope`] holding the
//! request's record; the first [`Store::write`](crate::Store::write) made within it carries
//! the record, which the writer adds to the write's own changes, so the record is committed
//! with the write, at its index, or not at all (a refused write, or one that changes
//! nothing). A write that was refused is recorded afterwards by the caller with
//! [`Op::AuditOnly`](crate::Op::AuditOnly) in a scope of its own.
//!
//! The scope is a task-local value: the store's many callers in the HTTP API need not pass
//! it along, and a write made outside any scope (a server's own work: replication, the
//! session reaper, the CA's pruning) is not audited.

use crate::state::{Change, State};
use parking_lot::Mutex;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use structs::Index;
use structs::audit::AuditRecord;

tokio::task_local! {
    static SCOPE: Arc<Slot>;
}

/// What became of a scope's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditOutcome {
    /// No write was made in the scope.
    NotWritten,
    /// Committed with a write: its place in the log and the write's index.
    Recorded {
        /// The record's `Seq`.
        seq: u64,
        /// The write's index.
        index: Index,
    },
    /// The write changed nothing; `applied` is false when a check-and-set did not match.
    Unchanged {
        /// Whether the write's condition held.
        applied: bool,
    },
    /// The write was refused (the error went to the caller).
    Refused,
}

/// One request's record, shared by the scope's owner and the write that carries it.
#[derive(Debug)]
struct Slot {
    record: AuditRecord,
    retention: AtomicU64,
    /// A write took the record (only the first write of a request carries it).
    taken: AtomicBool,
    /// The `Seq` the writer gave it in the plan that was last made (0: none).
    seq: AtomicU64,
    outcome: Mutex<AuditOutcome>,
}

/// A request's audit record, and what became of it.
#[derive(Debug, Clone)]
pub struct AuditScope(Arc<Slot>);

impl AuditScope {
    /// A scope for `record` (its `Seq` and `Index` are given when committed).
    pub fn new(record: AuditRecord) -> Self {
        Self(Arc::new(Slot {
            record,
            retention: AtomicU64::new(0),
            taken: AtomicBool::new(false),
            seq: AtomicU64::new(0),
            outcome: Mutex::new(AuditOutcome::NotWritten),
        }))
    }

    /// Runs `fut` with this scope: the first store write it makes carries the record.
    pub async fn run<F: Future>(&self, fut: F) -> F::Output {
        SCOPE.scope(Arc::clone(&self.0), fut).await
    }

    /// What became of the record.
    pub fn outcome(&self) -> AuditOutcome {
        *self.0.outcome.lock()
    }

    /// The record as the scope holds it (without `Seq` and `Index`).
    pub fn record(&self) -> &AuditRecord {
        &self.0.record
    }
}

/// The record a queued write carries, taken from the calling task's scope.
#[derive(Debug)]
pub(crate) struct JobAudit(Arc<Slot>);

impl JobAudit {
    /// The record of the calling task's scope, unless a write took it already.
    pub(crate) fn take(retention: usize) -> Option<JobAudit> {
        let slot = SCOPE.try_with(Arc::clone).ok()?;
        if slot.taken.swap(true, Ordering::AcqRel) {
            return None;
        }
        slot.retention.store(retention as u64, Ordering::Relaxed);
        Some(JobAudit(slot))
    }

    /// Another handle on the same record (the writer's).
    pub(crate) fn share(&self) -> JobAudit {
        JobAudit(Arc::clone(&self.0))
    }

    /// The changes that add the record to `state`'s log, as accepted.
    pub(crate) fn changes(&self, state: &State) -> Vec<Change> {
        let record = self.0.record.clone();
        let retention = usize::try_from(self.0.retention.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
        let changes = state.audit_changes(record, retention);
        let seq = changes.iter().find_map(|c| match c {
            Change::PutAudit(r) => Some(r.seq),
            _ => None,
        });
        self.0.seq.store(seq.unwrap_or(0), Ordering::Relaxed);
        changes
    }

    /// Notes what became of the write: refused, or answered with `index` and `applied`.
    pub(crate) fn finish(&self, answer: Option<(Index, bool)>) {
        *self.0.outcome.lock() = match (answer, self.0.seq.load(Ordering::Relaxed)) {
            (None, _) => AuditOutcome::Refused,
            (Some((_, applied)), 0) => AuditOutcome::Unchanged { applied },
            (Some((index, _)), seq) => AuditOutcome::Recorded { seq, index },
        };
    }

    /// Forgets the `Seq` of a plan that was dropped (planned again, or found unchanged).
    pub(crate) fn unplanned(&self) {
        self.0.seq.store(0, Ordering::Relaxed);
    }
}

/// Lets the calling task's scope carry its record again when its write committed without
/// it (a restore over etcd); true if it will.
pub(crate) fn release_unrecorded() -> bool {
    SCOPE
        .try_with(|slot| {
            let unrecorded = *slot.outcome.lock() == AuditOutcome::Unchanged { applied: true };
            if unrecorded {
                slot.taken.store(false, Ordering::Release);
            }
            unrecorded
        })
        .unwrap_or(false)
}
