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

use crate::process::{ProcessId, Watched, stop_child, stop_watched, write_atomic};
use rustix::process::Signal;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// One proxy daemon to keep running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonSpec {
    /// The program.
    pub command: PathBuf,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment (on top of the supervisor's).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// ACL token, given as `CONNECT_PROXY_TOKEN`.
    #[serde(default)]
    pub token: String,
    /// The service this proxy is a sidecar for, given as `CONNECT_SIDECAR_FOR`.
    #[serde(default)]
    pub sidecar_for: String,
}

/// The desired daemons by proxy id.
pub type DesiredSet = BTreeMap<String, DaemonSpec>;

/// Restart back-off constants (Consul 1.4's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Attempts made without waiting.
    pub immediate: u32,
    /// The longest wait between attempts.
    pub max_wait: Duration,
    /// A process that ran this long resets the attempt count.
    pub healthy_after: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            immediate: 3,
            max_wait: Duration::from_secs(60),
            healthy_after: Duration::from_secs(10),
        }
    }
}

/// The attempt counter of one daemon.
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: RestartPolicy,
    attempts: u32,
    last_start: Option<Instant>,
}

impl Backoff {
    /// A fresh counter.
    pub fn new(policy: RestartPolicy) -> Self {
        Self {
            policy,
            attempts: 0,
            last_start: None,
        }
    }

    /// Counts an attempt about to be made at `now` and returns how long to wait before it.
    /// The first start is attempt 1.
    pub fn next_attempt(&mut self, now: Instant) -> Duration {
        if self
            .last_start
            .is_some_and(|s| now.duration_since(s) >= self.policy.healthy_after)
        {
            self.attempts = 0;
        }
        self.attempts = self.attempts.saturating_add(1);
        if self.attempts <= self.policy.immediate {
            return Duration::ZERO;
        }
        let exp = (self.attempts - self.policy.immediate).min(31);
        Duration::from_secs(1u64 << exp).min(self.policy.max_wait)
    }

    /// Records that the process started (or was adopted) at `at`.
    pub fn started(&mut self, at: Instant) {
        self.last_start = Some(at);
    }

    /// Attempts counted so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}

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
        }
    }
}

/// What happened to a daemon; sent to [`ManagerHandle::events`] subscribers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DaemonEvent {
    /// A process was started for the daemon (attempt counts from 1 since the last reset).
    Started {
        /// Proxy id.
        id: String,
        /// The new process.
        pid: u32,
        /// Attempt number.
        attempt: u32,
    },
    /// A running process from the snapshot was re-adopted without a restart.
    Adopted {
        /// Proxy id.
        id: String,
        /// The adopted process.
        pid: u32,
    },
    /// The daemon's process exited on its own (it will be restarted).
    Exited {
        /// Proxy id.
        id: String,
        /// The process that exited.
        pid: u32,
    },
    /// The daemon could not be started (it will be retried with back-off).
    Failed {
        /// Proxy id.
        id: String,
        /// Why.
        reason: String,
    },
    /// The daemon was stopped because it left the desired set or changed.
    Stopped {
        /// Proxy id.
        id: String,
    },
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
    #[error("cannot read the daemon snapshot {path}: {reason}")]
    Snapshot {
        /// The path.
        path: PathBuf,
        /// The cause.
        reason: String,
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

enum Report {
    Running { id: String, process: ProcessId },
    Gone { id: String },
}

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
            std::fs::create_dir_all(&dir).map_err(|source| DaemonError::DataDir {
                path: dir.clone(),
                source,
            })?;
        }
        let snapshot_path = opts.data_dir.join("snapshot.json");
        let restored = read_snapshot(&snapshot_path)?;
        let (ctl, ctl_rx) = mpsc::channel(1);
        let (events, first_events) = tokio::sync::broadcast::channel(1024);
        let cancel = CancellationToken::new();
        let mut run = Run {
            opts,
            snapshot_path,
            written: None,
            entries: BTreeMap::new(),
            daemons: BTreeMap::new(),
            tasks: JoinSet::new(),
            events: events.clone(),
            reports_tx: mpsc::unbounded_channel().0,
        };
        let (reports_tx, reports_rx) = mpsc::unbounded_channel();
        run.reports_tx = reports_tx;
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
        let task = tokio::spawn(run.main(desired, ctl_rx, reports_rx, cancel));
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
        Err(e) => {
            return Err(DaemonError::Snapshot {
                path: path.to_owned(),
                reason: e.to_string(),
            });
        }
    };
    let snap: Snapshot = serde_json::from_slice(&bytes).map_err(|e| DaemonError::Snapshot {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    if snap.version != SNAPSHOT_VERSION {
        return Err(DaemonError::Snapshot {
            path: path.to_owned(),
            reason: format!("version {} is not the supported {SNAPSHOT_VERSION}", snap.version),
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
        // Wait for the stops to complete before starting replacements with the same id.
        while self.tasks.len() > self.daemons.len() {
            if self.tasks.join_next().await.is_none() {
                break;
            }
        }
        // Drain reports from the stopped tasks (their Gone reports) before new ones run.
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
            events: self.events.clone(),
            reports: self.reports_tx.clone(),
        };
        self.tasks.spawn(keep_alive(ctx, adopt, stop.clone(), leave.clone()));
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

fn pid_path(data_dir: &Path, id: &str) -> PathBuf {
    data_dir.join("pids").join(format!("{}.pid", file_safe(id)))
}

/// Proxy ids become file names: keep them to a safe alphabet.
fn file_safe(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

struct DaemonCtx {
    id: String,
    spec: DaemonSpec,
    data_dir: PathBuf,
    policy: RestartPolicy,
    allow_root: bool,
    stop_grace: Duration,
    events: tokio::sync::broadcast::Sender<DaemonEvent>,
    reports: mpsc::UnboundedSender<Report>,
}

enum Running {
    Child(tokio::process::Child),
    Adopted(Watched),
}

/// Keeps one daemon alive until `stop` (stop the process) or `leave` (leave it running).
async fn keep_alive(ctx: DaemonCtx, adopt: Option<ProcessId>, stop: CancellationToken, leave: CancellationToken) {
    let mut backoff = Backoff::new(ctx.policy);
    let mut running: Option<Running> = None;
    if let Some(p) = adopt {
        match Watched::open(p) {
            Ok(w) => {
                tracing::info!(id = %ctx.id, pid = p.pid, "re-adopted running daemon");
                backoff.next_attempt(Instant::now());
                backoff.started(Instant::now());
                let _ = ctx.events.send(DaemonEvent::Adopted {
                    id: ctx.id.clone(),
                    pid: p.pid,
                });
                running = Some(Running::Adopted(w));
            }
            Err(e) => tracing::info!(id = %ctx.id, pid = p.pid, error = %e, "cannot re-adopt daemon: starting it anew"),
        }
    }
    loop {
        let mut proc = match running.take() {
            Some(r) => r,
            None => {
                let wait = backoff.next_attempt(Instant::now());
                if !wait.is_zero() {
                    tracing::info!(id = %ctx.id, ?wait, attempt = backoff.attempts(), "waiting before restarting daemon");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = stop.cancelled() => return,
                        _ = leave.cancelled() => return,
                    }
                }
                match start(&ctx) {
                    Ok((child, id)) => {
                        backoff.started(Instant::now());
                        let _ = ctx.reports.send(Report::Running {
                            id: ctx.id.clone(),
                            process: id,
                        });
                        let _ = ctx.events.send(DaemonEvent::Started {
                            id: ctx.id.clone(),
                            pid: id.pid,
                            attempt: backoff.attempts(),
                        });
                        Running::Child(child)
                    }
                    Err(reason) => {
                        tracing::error!(id = %ctx.id, %reason, "cannot start daemon");
                        let _ = ctx.events.send(DaemonEvent::Failed {
                            id: ctx.id.clone(),
                            reason,
                        });
                        continue;
                    }
                }
            }
        };
        let pid = match &proc {
            Running::Child(c) => c.id().unwrap_or_default(),
            Running::Adopted(w) => w.id().pid,
        };
        let exited = match &mut proc {
            Running::Child(c) => tokio::select! {
                _ = c.wait() => true,
                _ = stop.cancelled() => { stop_child(c, Signal::INT, ctx.stop_grace).await; false }
                _ = leave.cancelled() => return,
            },
            Running::Adopted(w) => tokio::select! {
                _ = w.exited() => true,
                _ = stop.cancelled() => { stop_watched(w, Signal::INT, ctx.stop_grace).await; false }
                _ = leave.cancelled() => return,
            },
        };
        let _ = std::fs::remove_file(pid_path(&ctx.data_dir, &ctx.id));
        let _ = ctx.reports.send(Report::Gone { id: ctx.id.clone() });
        if !exited {
            tracing::info!(id = %ctx.id, pid, "daemon stopped");
            let _ = ctx.events.send(DaemonEvent::Stopped { id: ctx.id.clone() });
            return;
        }
        tracing::warn!(id = %ctx.id, pid, "daemon exited; restarting");
        let _ = ctx.events.send(DaemonEvent::Exited {
            id: ctx.id.clone(),
            pid,
        });
    }
}

/// Starts the daemon's process: own process group (terminal signals to the supervisor do not
/// reach it, and it outlives the supervisor), logs appended, pid file written atomically.
fn start(ctx: &DaemonCtx) -> Result<(tokio::process::Child, ProcessId), String> {
    if rustix::process::geteuid().is_root() && !ctx.allow_root {
        return Err("refusing to run a proxy as root (allow it explicitly to do so)".into());
    }
    let logs = ctx.data_dir.join("logs");
    let open = |suffix: &str| {
        let path = logs.join(format!("{}-{suffix}.log", file_safe(&ctx.id)));
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))
    };
    let (stdout, stderr) = (open("stdout")?, open("stderr")?);
    let child = tokio::process::Command::new(&ctx.spec.command)
        .args(&ctx.spec.args)
        .envs(&ctx.spec.env)
        .env("CONNECT_PROXY_ID", &ctx.id)
        .env("CONNECT_PROXY_TOKEN", &ctx.spec.token)
        .env("CONNECT_SIDECAR_FOR", &ctx.spec.sidecar_for)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .kill_on_drop(false)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", ctx.spec.command.display()))?;
    let pid = child.id().ok_or("the process exited at once")?;
    let id = ProcessId::of(pid).unwrap_or(ProcessId { pid, start_time: 0 });
    let path = pid_path(&ctx.data_dir, &ctx.id);
    if let Err(e) = write_atomic(&path, format!("{pid}\n").as_bytes(), 0o644) {
        tracing::error!(path = %path.display(), error = %e, "cannot write pid file");
    }
    Ok((child, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_schedule_is_three_immediate_then_doubling_seconds_capped_at_a_minute() {
        let t0 = Instant::now();
        let mut b = Backoff::new(RestartPolicy::default());
        let waits: Vec<u64> = (0..12)
            .map(|_| {
                let w = b.next_attempt(t0);
                b.started(t0);
                w.as_secs()
            })
            .collect();
        assert_eq!(waits, [0, 0, 0, 2, 4, 8, 16, 32, 60, 60, 60, 60]);
    }

    #[test]
    fn backoff_count_resets_after_ten_seconds_healthy() {
        let t0 = Instant::now();
        let mut b = Backoff::new(RestartPolicy::default());
        for _ in 0..5 {
            b.next_attempt(t0);
            b.started(t0);
        }
        // Ran 9.9 s: not healthy yet, the count goes on.
        assert_eq!(
            b.next_attempt(t0 + Duration::from_millis(9_900)),
            Duration::from_secs(8)
        );
        b.started(t0 + Duration::from_secs(10));
        // Ran 10 s since its start: back to an immediate attempt 1.
        assert_eq!(b.next_attempt(t0 + Duration::from_secs(20)), Duration::ZERO);
        assert_eq!(b.attempts(), 1);
    }

    #[test]
    fn file_names_from_ids_stay_in_the_directory() {
        assert_eq!(file_safe("web-sidecar-proxy"), "web-sidecar-proxy");
        assert_eq!(file_safe("../etc/passwd"), ".._etc_passwd");
    }
}
