//! Where the catalog is kept: the [`Storage`] trait the [`Store`](crate::Store) works
//! through, and what the writers of its two implementations share. The implementations are
//! the embedded log (`embedded.rs`: a log in the data dir, or memory only) and etcd (the
//! catalog-etcd crate, through [`Backend`](crate::backend::Backend): one catalog shared by
//! several servers).
//!
//! Both writers take every queued write (group commit), plan each on the current state
//! ([`Planned::of`]), make the batch durable and answer each write. They stay two loops, not
//! one over this trait, because the loops themselves differ:
//! - the log's writer blocks on `fdatasync`, so it owns a thread rather than a runtime
//!   worker, and it applies each batch to the state itself once the log holds it;
//! - etcd's writer awaits the network on a task and applies nothing: the catalog watch
//!   applies every server's writes, this one's too, in revision order. It also plans a batch
//!   again when another server wrote first, and leaves for the next transaction what one
//!   etcd transaction cannot hold.
//!
//! What is the same — the queue ([`Writes`]), planning one write ([`Planned`]), the answer
//! ([`WriteOutcome`]) — lives here.

use crate::audit::JobAudit;
use crate::cluster::Cluster;
use crate::error::WriteError;
use crate::ops::{Op, plan};
use crate::state::{Change, State};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use structs::Index;
use tokio::sync::{mpsc, oneshot};

/// The result of an accepted write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOutcome {
    /// The index the write committed at (the current index if it changed nothing).
    pub index: Index,
    /// False when a check-and-set did not match and nothing was written.
    pub applied: bool,
}

/// A queued write and where its answer goes.
pub struct Job {
    /// The write.
    pub op: Op,
    /// The audit record committed with the write, if any.
    pub(crate) audit: Option<JobAudit>,
    /// Where its answer goes.
    pub reply: oneshot::Sender<Result<WriteOutcome, WriteError>>,
}

/// What a storage's writer works from.
pub struct Writes {
    /// The queue; the writer stops once it is closed and empty.
    pub jobs: mpsc::Receiver<Job>,
    /// The datacenter writes are planned for.
    pub datacenter: String,
    /// Writes taken in one batch at most.
    pub max_batch: usize,
}

impl Writes {
    /// Moves what is queued now into `batch`, without waiting, until it holds `max_batch`.
    pub fn take_queued(&mut self, batch: &mut VecDeque<Job>) {
        while batch.len() < self.max_batch {
            match self.jobs.try_recv() {
                Ok(job) => batch.push_back(job),
                Err(_) => break,
            }
        }
    }
}

/// What planning decided for one queued write.
pub enum Planned {
    /// Refused: nothing is written, the caller gets the error.
    Refused(WriteError),
    /// Nothing to write; `applied` is false when a check-and-set did not match.
    Unchanged {
        /// Whether the write's condition held.
        applied: bool,
    },
    /// These changes are to be made durable.
    Changed(Vec<Change>),
}

impl Planned {
    /// Plans `op` on `state` (see [`plan`]): what a write, or its dry run, would commit.
    pub fn of_op(op: &Op, state: &State, datacenter: &str, now: SystemTime) -> Self {
        match plan(op, state, datacenter, now) {
            Err(e) => Planned::Refused(e),
            Ok(p) if !p.applied => Planned::Unchanged { applied: false },
            Ok(p) if p.changes.is_empty() => Planned::Unchanged { applied: true },
            Ok(mut p) => {
                crate::virtual_ips::assign(state, &mut p.changes);
                Planned::Changed(p.changes)
            }
        }
    }

    /// Plans `job`'s write on `state`; a write that changes something (or is nothing but
    /// its record, [`Op::AuditOnly`]) carries its audit record, if it has one.
    pub fn of(job: &Job, state: &State, datacenter: &str, now: SystemTime) -> Self {
        let planned = Self::of_op(&job.op, state, datacenter, now);
        let Some(audit) = &job.audit else {
            return planned;
        };
        audit.unplanned();
        let mut changes = match planned {
            Planned::Changed(changes) => changes,
            Planned::Unchanged { applied: true } if matches!(job.op, Op::AuditOnly) => Vec::new(),
            other => return other,
        };
        changes.extend(audit.changes(state));
        if changes.is_empty() {
            return Planned::Unchanged { applied: true };
        }
        Planned::Changed(changes)
    }
}

/// Where the catalog is kept, once its writer runs: what the store asks of it besides
/// writes (which go through [`Writes`]).
#[async_trait::async_trait]
pub trait Storage: Send + Sync {
    /// Waits until the writer has answered every write queued before [`Writes::jobs`]
    /// closed, then stops and waits for every task and thread the storage started.
    async fn close(&self);

    /// Waits until the current state reflects `index` (written through another server), or
    /// `timeout`; true once it does.
    async fn wait_applied(&self, index: Index, timeout: Duration) -> bool;

    /// Waits until the current state reflects every write committed anywhere before the
    /// call, or `timeout`; true once it does.
    async fn catch_up(&self, timeout: Duration) -> bool;

    /// The servers sharing this storage, if it is shared.
    fn cluster(&self) -> Option<&Arc<dyn Cluster>>;

    /// How many times the catalog was read again wholesale (a shared storage whose change
    /// feed lost its place).
    fn reloads(&self) -> u64;
}
