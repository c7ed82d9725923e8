//! Managed proxy daemons, after Consul 1.4's proxy manager: a desired set of proxies
//! (id → command, args, env, token) kept running as long-lived processes that survive the
//! supervisor, with pid and log files and a snapshot to re-adopt them after a restart.
//!
//! Layout under the data dir:
//!
//! - `pids/<id>.pid`: the daemon's pid, written atomically when it starts, removed when it is
//!   stopped;
//! - `logs/<id>-stdout.log`, `logs/<id>-stderr.log`: appended across restarts;
//! - `snapshot.json` (0600: it holds tokens): every daemon's spec plus the identity (pid and
//!   kernel start time) of its process; written atomically and only when it changed.
//!
//! [`Manager::start`] restores from the snapshot first: a recorded process that is still the
//! same process (pid *and* start time match, so a reused pid is never adopted) is watched
//! through a pidfd instead of being restarted. Then the desired set arrives as a stream;
//! bursts are coalesced (applied after 500 ms without change, or 5 s after the first).
//!
//! Restart back-off ([`Backoff`]): the first 3 attempts are immediate, attempt n waits
//! 2^(n-3) s, capped at 1 min; a process that ran 10 s resets the count. Stop is SIGINT, 5 s
//! of grace, SIGKILL. [`ManagerHandle::close`] stops supervising and leaves the processes
//! running (they are re-adopted next start); [`ManagerHandle::kill`] stops them all.

use crate::process::{ProcessId, write_atomic};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

mod backoff;
mod events;
mod keep_alive;
mod spec;

pub use backoff::{Backoff, RestartPolicy};
pub use events::DaemonEvent;
use events::Report;
use keep_alive::{DaemonCtx, keep_alive, pid_path};
pub use spec::{DaemonSpec, DesiredSet};

/// Manager tuning.
#[derive(Debug, Clone)]
pub struct ManagerOptions {
    /// Where pids, logs and the snapshot live.
    pub data_dir: PathBuf,
    /// Start daemons even when the supervisor runs as root.
    pub allow_root: bool,
    /// Restart back-off.
    pub policy: RestartPolicy,
    /// A burst of desired-set changes is applied once this long passes without a change...
    pub quiescence: Duration,
    /// ...or this long after its first change, whichever comes first.
    pub max_coalesce: Duration,
    /// Between SIGINT and SIGKILL when stopping a daemon.
    pub stop_grace: Duration,
    /// Tie every daemon to the supervisor (killed when it dies, even by SIGKILL): for
    /// supervisors whose daemons must not outlive them (an agent in `-dev` mode).
    pub tied: bool,
}

impl ManagerOptions {
    /// Consul's defaults under `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            allow_root: false,
            policy: RestartPolicy::default(),
            quiescence: Duration::from_millis(500),
            max_coalesce: Duration::from_secs(5),
            stop_grace: Duration::from_secs(5),
            tied: false,
        }
    }
}

/// Errors of the daemon manager.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The data dir could not be prepared.
    #[error("cannot prepare {path}: {source}")]
    DataDir {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The snapshot exists but cannot be read.
    #[error("cannot read the daemon snapshot {path}")]
    SnapshotUnreadable {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The snapshot is not valid JSON of the expected shape.
    #[error("cannot decode the daemon snapshot {path}")]
    SnapshotUndecodable {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: serde_json::Error,
    },
    /// The snapshot was written by an incompatible version.
    #[error("the daemon snapshot {path} has version {found}, not the supported {SNAPSHOT_VERSION}")]
    SnapshotVersion {
        /// The path.
        path: PathBuf,
        /// The version it has.
        found: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotEntry {
    spec: DaemonSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    process: Option<ProcessId>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Snapshot {
    version: u32,
    proxies: BTreeMap<String, SnapshotEntry>,
}

const SNAPSHOT_VERSION: u32 = 1;

enum Control {
    Close(oneshot::Sender<()>),
    Kill(oneshot::Sender<()>),
}

/// Owns the manager's task: close or kill it; dropping it closes (processes keep running).
pub struct ManagerHandle {
    ctl: mpsc::Sender<Control>,
    events: tokio::sync::broadcast::Sender<DaemonEvent>,
    /// Subscribed before any daemon task ran, so the first caller sees restore's events.
    first_events: parking_lot::Mutex<Option<tokio::sync::broadcast::Receiver<DaemonEvent>>>,
    task: Option<tokio::task::JoinHandle<()>>,
    _close_on_drop: tokio_util::sync::DropGuard,
}

impl ManagerHandle {
    /// Subscribes to daemon events. The first call sees every event since `start` (restore's
    /// adoptions included); later calls see events from now on.
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<DaemonEvent> {
        self.first_events
            .lock()
            .take()
            .unwrap_or_else(|| self.events.subscribe())
    }

    /// Stops supervising and leaves every process running (the snapshot lets the next
    /// manager re-adopt them).
    pub async fn close(mut self) {
        self.finish(Control::Close).await;
    }

    /// Stops every daemon (SIGINT, grace, SIGKILL) and the manager.
    pub async fn kill(mut self) {
        self.finish(Control::Kill).await;
    }

    async fn finish(&mut self, make: fn(oneshot::Sender<()>) -> Control) {
        let (tx, rx) = oneshot::channel();
        if self.ctl.send(make(tx)).await.is_ok() {
            let _ = rx.await;
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

/// The daemon manager. See the module docs.
pub struct Manager;

struct Daemon {
    spec: DaemonSpec,
    stop: CancellationToken,
    leave: CancellationToken,
}

impl Manager {
    /// Prepares the data dir, restores the snapshot (re-adopting live processes) and starts
    /// supervising. Desired sets arrive on `desired`; when it closes, the last set is kept.
    pub fn start(opts: ManagerOptions, desired: mpsc::Receiver<DesiredSet>) -> Result<ManagerHandle, DaemonError> {
        for dir in [
            opts.data_dir.clone(),
            opts.data_dir.join("pids"),
            opts.data_dir.join("logs"),
        ] {
            // Pid files, logs and the snapshot (proxy tokens' environment among them) are
            // the owner's only.
            atomic_file::private_dir(&dir).map_err(|source| DaemonError::DataDir {
                path: dir.clone(),
                source,
            })?;
        }
        let snapshot_path = opts.data_dir.join("snapshot.json");
        let restored = read_snapshot(&snapshot_path)?;
        let (ctl, ctl_rx) = mpsc::channel(1);
        let (events, first_events) = tokio::sync::broadcast::channel(1024);
        let cancel = CancellationToken::new();
        let (reports_tx, reports_rx) = mpsc::unbounded_channel();
        let mut run = Run {
            opts,
            snapshot_path,
            written: None,
            entries: BTreeMap::new(),
            daemons: BTreeMap::new(),
            tasks: JoinSet::new(),
            events: events.clone(),
            reports_tx,
        };
        // Restore: the snapshot's set is the desired set until told otherwise.
        for (id, entry) in restored.proxies {
            let adopt = entry.process.filter(|p| p.is_alive());
            if let Some(p) = entry.process.filter(|_| adopt.is_none()) {
                tracing::info!(%id, pid = p.pid, "recorded daemon process is gone (or its pid was reused): starting it anew");
            }
            run.entries.insert(
                id.clone(),
                SnapshotEntry {
                    spec: entry.spec.clone(),
                    process: adopt,
                },
            );
            run.spawn_daemon(id, entry.spec, adopt);
        }
        run.write_snapshot();
        let guard = cancel.clone().drop_guard();
        let task = tokio::spawn(
            run.main(desired, ctl_rx, reports_rx, cancel)
                .instrument(tracing::info_span!("daemon_manager")),
        );
        Ok(ManagerHandle {
            ctl,
            events,
            first_events: parking_lot::Mutex::new(Some(first_events)),
            task: Some(task),
            _close_on_drop: guard,
        })
    }
}

fn read_snapshot(path: &Path) -> Result<Snapshot, DaemonError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Snapshot::default()),
        Err(source) => {
            return Err(DaemonError::SnapshotUnreadable {
                path: path.to_owned(),
                source,
            });
        }
    };
    let snap: Snapshot = serde_json::from_slice(&bytes).map_err(|source| DaemonError::SnapshotUndecodable {
        path: path.to_owned(),
        source,
    })?;
    if snap.version != SNAPSHOT_VERSION {
        return Err(DaemonError::SnapshotVersion {
            path: path.to_owned(),
            found: snap.version,
        });
    }
    Ok(snap)
}

struct Run {
    opts: ManagerOptions,
    snapshot_path: PathBuf,
    written: Option<Vec<u8>>,
    entries: BTreeMap<String, SnapshotEntry>,
    daemons: BTreeMap<String, Daemon>,
    tasks: JoinSet<()>,
    events: tokio::sync::broadcast::Sender<DaemonEvent>,
    reports_tx: mpsc::UnboundedSender<Report>,
}

impl Run {
    async fn main(
        mut self,
        mut desired: mpsc::Receiver<DesiredSet>,
        mut ctl: mpsc::Receiver<Control>,
        mut reports: mpsc::UnboundedReceiver<Report>,
        dropped: CancellationToken,
    ) {
        let mut pending: Option<(DesiredSet, Instant, Instant)> = None;
        let mut desired_open = true;
        loop {
            let apply_at = pending
                .as_ref()
                .map(|(_, first, last)| (*last + self.opts.quiescence).min(*first + self.opts.max_coalesce));
            tokio::select! {
                biased;
                _ = dropped.cancelled() => { self.close().await; return; }
                c = ctl.recv() => match c {
                    Some(Control::Close(ack)) => { self.close().await; let _ = ack.send(()); return; }
                    Some(Control::Kill(ack)) => { self.kill().await; let _ = ack.send(()); return; }
                    None => { self.close().await; return; }
                },
                Some(r) = reports.recv() => self.on_report(r),
                Some(_) = self.tasks.join_next() => {}
                set = desired.recv(), if desired_open => match set {
                    Some(set) => {
                        let now = Instant::now();
                        let first = pending.as_ref().map_or(now, |p| p.1);
                        pending = Some((set, first, now));
                    }
                    None => desired_open = false,
                },
                _ = async { match apply_at { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {
                    if let Some((set, _, _)) = pending.take() {
                        self.apply(set).await;
                    }
                }
            }
        }
    }

    fn on_report(&mut self, r: Report) {
        match r {
            Report::Running { id, process } => {
                if let Some(e) = self.entries.get_mut(&id) {
                    e.process = Some(process);
                }
            }
            Report::Gone { id } => {
                if let Some(e) = self.entries.get_mut(&id) {
                    e.process = None;
                }
            }
        }
        self.write_snapshot();
    }

    async fn apply(&mut self, set: DesiredSet) {
        // Stop what left or changed.
        let changed: Vec<String> = self
            .daemons
            .iter()
            .filter(|(id, d)| set.get(*id) != Some(&d.spec))
            .map(|(id, _)| id.clone())
            .collect();
        for id in changed {
            if let Some(d) = self.daemons.remove(&id) {
                tracing::info!(%id, "stopping daemon (removed or changed)");
                d.stop.cancel();
            }
            self.entries.remove(&id);
            let _ = std::fs::remove_file(pid_path(&self.opts.data_dir, &id));
        }
        // Wait for the stops to complete before starting replacements with the same id (their
        // last reports are then queued ahead of the replacements' first).
        while self.tasks.len() > self.daemons.len() {
            if self.tasks.join_next().await.is_none() {
                break;
            }
        }
        // Start what is new (or changed).
        for (id, spec) in set {
            if self.daemons.contains_key(&id) {
                continue;
            }
            self.entries.insert(
                id.clone(),
                SnapshotEntry {
                    spec: spec.clone(),
                    process: None,
                },
            );
            self.spawn_daemon(id, spec, None);
        }
        self.write_snapshot();
    }

    fn spawn_daemon(&mut self, id: String, spec: DaemonSpec, adopt: Option<ProcessId>) {
        let stop = CancellationToken::new();
        let leave = CancellationToken::new();
        let ctx = DaemonCtx {
            id: id.clone(),
            spec: spec.clone(),
            data_dir: self.opts.data_dir.clone(),
            policy: self.opts.policy,
            allow_root: self.opts.allow_root,
            stop_grace: self.opts.stop_grace,
            tied: self.opts.tied,
            events: self.events.clone(),
            reports: self.reports_tx.clone(),
        };
        let span = tracing::info_span!("daemon", id = %id);
        self.tasks
            .spawn(keep_alive(ctx, adopt, stop.clone(), leave.clone()).instrument(span));
        self.daemons.insert(id, Daemon { spec, stop, leave });
    }

    async fn close(&mut self) {
        for d in self.daemons.values() {
            d.leave.cancel();
        }
        while self.tasks.join_next().await.is_some() {}
        self.write_snapshot();
    }

    async fn kill(&mut self) {
        for d in self.daemons.values() {
            d.stop.cancel();
        }
        while self.tasks.join_next().await.is_some() {}
        for e in self.entries.values_mut() {
            e.process = None;
        }
        self.write_snapshot();
    }

    /// Writes the snapshot if its content changed since the last write.
    fn write_snapshot(&mut self) {
        let snap = Snapshot {
            version: SNAPSHOT_VERSION,
            proxies: self.entries.clone(),
        };
        let Ok(bytes) = serde_json::to_vec_pretty(&snap) else {
            return;
        };
        if self.written.as_ref() == Some(&bytes) {
            return;
        }
        match write_atomic(&self.snapshot_path, &bytes, 0o600) {
            Ok(()) => self.written = Some(bytes),
            Err(e) => {
                tracing::error!(path = %self.snapshot_path.display(), error = %e, "cannot write the daemon snapshot")
            }
        }
    }
}
