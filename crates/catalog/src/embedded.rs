//! The embedded storage: the catalog's log in the data dir (`wal.rs`), or memory only
//! (`-dev`), written by one thread.
//!
//! The writer takes every queued write (group commit), plans and applies each to a copy of
//! the current state (O(1), persistent maps), appends the batch to the log with one sync,
//! and only then swaps the new state in, wakes blocking queries, publishes events and
//! acknowledges. Readers therefore only ever see durable state, and an acknowledged write
//! survives `kill -9`.

use crate::cluster::Cluster;
use crate::current::Current;
use crate::error::{StorageFailure, StoreError, WriteError};
use crate::state::State;
use crate::storage::{Job, Planned, Storage, WriteOutcome, Writes};
use crate::wal::{self, Record, Wal};
use parking_lot::Mutex;
use std::{
    collections::{HashSet, VecDeque},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, SystemTime},
};
use structs::Index;
use tracing::{error, info, warn};

/// The embedded storage once its writer runs.
pub(crate) struct Embedded {
    writer: Mutex<Option<thread::JoinHandle<()>>>,
    compaction: Arc<Compaction>,
}

/// The writer of the embedded storage, before and while it runs on its thread.
pub(crate) struct LogWriter {
    /// `None`: memory only.
    wal: Option<Wal>,
    compaction: Arc<Compaction>,
    /// Set once the log could not be written nor cut back: every later write fails so.
    failed: Option<StorageFailure>,
}

/// Snapshots of the log: one at a time, on a thread of its own.
struct Compaction {
    /// Records after which a snapshot is written.
    every: u64,
    running: AtomicBool,
    thread: Mutex<Option<thread::JoinHandle<()>>>,
}

impl LogWriter {
    /// Opens `data_dir` (replaying it) or, without one, an empty state in memory.
    pub(crate) async fn open(data_dir: Option<PathBuf>, snapshot_every: u64) -> Result<(Self, State), StoreError> {
        let (wal, state) = match data_dir {
            Some(dir) => {
                let span = tracing::info_span!("store_open", dir = %dir.display());
                let (wal, state) = tokio::task::spawn_blocking(move || span.in_scope(|| Wal::open(&dir)))
                    .await
                    .map_err(StoreError::Panicked)??;
                (Some(wal), state)
            }
            None => (None, State::default()),
        };
        let compaction = Arc::new(Compaction {
            every: snapshot_every,
            running: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        let writer = LogWriter {
            wal,
            compaction,
            failed: None,
        };
        Ok((writer, state))
    }

    /// Starts the writer thread on `writes`, applying to `current`.
    pub(crate) fn start(self, current: Arc<Current>, writes: Writes) -> Result<Arc<Embedded>, StoreError> {
        let compaction = Arc::clone(&self.compaction);
        let span = tracing::info_span!("store_writer");
        let writer = thread::Builder::new()
            .name("meshd-store-writer".into())
            .spawn(move || span.in_scope(|| self.run(&current, writes)))
            .map_err(|error| StoreError::Io {
                what: "starting the store writer".into(),
                error,
            })?;
        Ok(Arc::new(Embedded {
            writer: Mutex::new(Some(writer)),
            compaction,
        }))
    }

    fn run(mut self, current: &Current, mut writes: Writes) {
        let mut batch = VecDeque::new();
        while let Some(first) = writes.jobs.blocking_recv() {
            batch.push_back(first);
            writes.take_queued(&mut batch);
            self.commit(current, &writes.datacenter, batch.drain(..));
        }
        info!("store writer stopped");
    }

    /// Plans and applies `batch` on a copy of the current state, logs it, then makes it
    /// current and answers every write.
    fn commit(&mut self, current: &Current, datacenter: &str, batch: impl ExactSizeIterator<Item = Job>) {
        if let Some(reason) = &self.failed {
            for job in batch {
                let _ = job.reply.send(Err(WriteError::Storage(reason.clone())));
            }
            return;
        }
        let now = SystemTime::now();
        let mut working = (*current.read()).clone();
        let mut records = Vec::new();
        let mut bumped = HashSet::new();
        let mut replies = Vec::with_capacity(batch.len());
        for job in batch {
            let result = match Planned::of(&job, &working, datacenter, now) {
                Planned::Refused(e) => Err(e),
                Planned::Unchanged { applied } => Ok(WriteOutcome {
                    index: working.index.max(Index(1)),
                    applied,
                }),
                Planned::Changed(changes) => {
                    let index = working.index.next();
                    bumped.extend(working.apply(index, &changes));
                    records.push(Record { index, changes });
                    Ok(WriteOutcome { index, applied: true })
                }
            };
            replies.push((job.reply, result));
        }
        if !records.is_empty() {
            if let Err(reason) = self.append(&records) {
                // Nothing of the batch is applied (the state is the working copy's).
                for (reply, result) in replies {
                    let _ = reply.send(result.and(Err(WriteError::Storage(reason.clone()))));
                }
                return;
            }
            let new = Arc::new(working);
            current.replace(Arc::clone(&new), &bumped);
            if let Some(wal) = self.wal.as_mut() {
                self.compaction.maybe_start(wal, &new);
            }
        }
        for (reply, result) in replies {
            let _ = reply.send(result);
        }
    }

    /// Appends `records` to the log (nothing to do in memory only).
    fn append(&mut self, records: &[Record]) -> Result<(), StorageFailure> {
        let Some(wal) = self.wal.as_mut() else {
            return Ok(());
        };
        let Err(e) = wal.append(records) else {
            return Ok(());
        };
        // With the log cut back to its last good record, later writes are tried again (the
        // disk may have room by then); otherwise none is accepted any more.
        let clean = wal.is_clean();
        if clean {
            error!(error = %e, "the log could not be written; this write fails, the next ones are tried");
        } else {
            error!(error = %e, "the log could not be written nor cut back; refusing further writes");
        }
        let reason = StorageFailure(Arc::new(e));
        if !clean {
            self.failed = Some(reason.clone());
        }
        Err(reason)
    }
}

/// The snapshot thread's nice value (the writer and the runtime keep the process's).
const SNAPSHOT_NICE: i32 = 10;

impl Compaction {
    /// Once `every` records were logged since the last snapshot, starts a new log segment
    /// and writes a snapshot of `state` on a thread, unless one is being written.
    fn maybe_start(self: &Arc<Self>, wal: &mut Wal, state: &Arc<State>) {
        if wal.records_since_snapshot < self.every || self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Err(e) = wal.rotate(state.index.next()) {
            warn!(error = %e, "could not start a new log segment; will retry");
            self.running.store(false, Ordering::Release);
            return;
        }
        let (dir, snap, done) = (wal.dir().to_owned(), Arc::clone(state), Arc::clone(self));
        let span = tracing::info_span!("store_snapshot", index = %state.index);
        let spawned = thread::Builder::new().name("meshd-snapshot".into()).spawn(move || {
            let _entered = span.enter();
            // Encoding a large state takes a core for a while: it yields to the writer and
            // the request threads (on Linux a thread's nice value is its own). Failing
            // leaves it at the process's priority.
            let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), SNAPSHOT_NICE);
            match wal::write_snapshot(&dir, &snap) {
                Ok(()) => info!(index = %snap.index, "snapshot written"),
                Err(e) => warn!(error = %e, "snapshot failed; the log still holds every write"),
            }
            done.running.store(false, Ordering::Release);
        });
        match spawned {
            // The previous snapshot thread has finished (running was false): reap it.
            Ok(handle) => {
                if let Some(previous) = self.thread.lock().replace(handle) {
                    let _ = previous.join();
                }
            }
            Err(_) => {
                warn!("could not start the snapshot thread");
                self.running.store(false, Ordering::Release);
            }
        }
    }
}

#[async_trait::async_trait]
impl Storage for Embedded {
    async fn close(&self) {
        let writer = self.writer.lock().take();
        let compaction = Arc::clone(&self.compaction);
        let span = tracing::info_span!("store_close");
        let _ = tokio::task::spawn_blocking(move || {
            let _entered = span.enter();
            if let Some(handle) = writer {
                let _ = handle.join();
            }
            if let Some(handle) = compaction.thread.lock().take() {
                let _ = handle.join();
            }
        })
        .await;
    }

    /// This store applies every write it acknowledges, and no other server writes.
    async fn wait_applied(&self, _index: Index, _timeout: Duration) -> bool {
        true
    }

    async fn catch_up(&self, _timeout: Duration) -> bool {
        true
    }

    fn cluster(&self) -> Option<&Arc<dyn Cluster>> {
        None
    }

    fn reloads(&self) -> u64 {
        0
    }
}
