//! One daemon's keep-alive task: start, wait, restart with back-off; files and environment.

use super::backoff::{Backoff, RestartPolicy};
use super::events::{DaemonEvent, Report};
use super::spec::DaemonSpec;
use crate::process::{ProcessId, Watched, stop_child, stop_watched, write_atomic};
use rustix::process::Signal;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The pid file of daemon `id` (ids become file names through `atomic_file::file_name_for`).
pub(super) fn pid_path(data_dir: &Path, id: &str) -> PathBuf {
    data_dir
        .join("pids")
        .join(format!("{}.pid", atomic_file::file_name_for(id)))
}

pub(super) struct DaemonCtx {
    pub(super) id: String,
    pub(super) spec: DaemonSpec,
    pub(super) data_dir: PathBuf,
    pub(super) policy: RestartPolicy,
    pub(super) allow_root: bool,
    pub(super) stop_grace: Duration,
    pub(super) tied: bool,
    pub(super) events: tokio::sync::broadcast::Sender<DaemonEvent>,
    pub(super) reports: mpsc::UnboundedSender<Report>,
}

enum Running {
    Child(tokio::process::Child),
    Adopted(Watched),
}

/// Keeps one daemon alive until `stop` (stop the process) or `leave` (leave it running).
pub(super) async fn keep_alive(
    ctx: DaemonCtx,
    adopt: Option<ProcessId>,
    stop: CancellationToken,
    leave: CancellationToken,
) {
    if rustix::process::geteuid().is_root() && !ctx.allow_root {
        // Nothing changes this short of a restart with the flag: said once, never retried.
        tracing::error!(id = %ctx.id, reason = ROOT_REFUSAL, "not starting the managed proxy");
        let _ = ctx.events.send(DaemonEvent::Failed {
            id: ctx.id.clone(),
            reason: ROOT_REFUSAL.to_owned(),
        });
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = leave.cancelled() => {}
        }
        return;
    }
    let mut backoff = Backoff::new(ctx.policy);
    let mut running = adopt.and_then(|p| readopt(&ctx, p, &mut backoff));
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
                match start_reported(&ctx, &mut backoff) {
                    Some(child) => Running::Child(child),
                    None => continue,
                }
            }
        };
        let pid = match &proc {
            Running::Child(c) => c.id().unwrap_or_default(),
            Running::Adopted(w) => w.id().pid,
        };
        // How it ended: known for our own children; an adopted process is watched through a
        // pidfd, which tells that it ended, not how.
        let (exited, how) = match &mut proc {
            Running::Child(c) => tokio::select! {
                status = c.wait() => (true, status.ok().map(|s| s.to_string())),
                _ = stop.cancelled() => { stop_child(c, Signal::INT, ctx.stop_grace).await; (false, None) }
                _ = leave.cancelled() => return,
            },
            Running::Adopted(w) => tokio::select! {
                _ = w.exited() => (true, None),
                _ = stop.cancelled() => { stop_watched(w, Signal::INT, ctx.stop_grace).await; (false, None) }
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
        tracing::warn!(id = %ctx.id, pid, status = how.as_deref().unwrap_or("unknown"), "daemon exited; restarting");
        let _ = ctx.events.send(DaemonEvent::Exited {
            id: ctx.id.clone(),
            pid,
            status: how,
        });
    }
}

/// Why a daemon is not started when the manager runs as root without `allow_root`.
pub(crate) const ROOT_REFUSAL: &str =
    "refusing to run a managed proxy as root: run the agent as another user, or start it with -allow-managed-root";

/// Watches a process a previous manager started, if it is still the one it was (counted as
/// a start, so a crash right after restarts with back-off).
fn readopt(ctx: &DaemonCtx, p: ProcessId, backoff: &mut Backoff) -> Option<Running> {
    match Watched::open(p) {
        Ok(w) => {
            tracing::info!(id = %ctx.id, pid = p.pid, "re-adopted running daemon");
            backoff.next_attempt(Instant::now());
            backoff.started(Instant::now());
            let _ = ctx.events.send(DaemonEvent::Adopted {
                id: ctx.id.clone(),
                pid: p.pid,
            });
            Some(Running::Adopted(w))
        }
        Err(e) => {
            tracing::info!(id = %ctx.id, pid = p.pid, error = %e, "cannot re-adopt daemon: starting it anew");
            None
        }
    }
}

/// Starts the daemon and reports the outcome (a failure is an event and a log line; the
/// caller tries again after the back-off).
fn start_reported(ctx: &DaemonCtx, backoff: &mut Backoff) -> Option<tokio::process::Child> {
    match start(ctx) {
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
            Some(child)
        }
        Err(reason) => {
            tracing::error!(id = %ctx.id, %reason, "cannot start daemon");
            let _ = ctx.events.send(DaemonEvent::Failed {
                id: ctx.id.clone(),
                reason,
            });
            None
        }
    }
}

/// Starts the daemon's process: own process group (terminal signals to the supervisor do not
/// reach it, and it outlives the supervisor), logs appended, pid file written atomically.
fn start(ctx: &DaemonCtx) -> Result<(tokio::process::Child, ProcessId), String> {
    let logs = ctx.data_dir.join("logs");
    let open = |suffix: &str| {
        let path = logs.join(format!("{}-{suffix}.log", atomic_file::file_name_for(&ctx.id)));
        atomic_file::open_private(&path, std::fs::OpenOptions::new().create(true).append(true))
            .map_err(|e| format!("cannot open {}: {e}", path.display()))
    };
    let (stdout, stderr) = (open("stdout")?, open("stderr")?);
    let mut command = tokio::process::Command::new(&ctx.spec.command);
    command
        .args(&ctx.spec.args)
        .envs(&ctx.spec.env)
        .env("CONNECT_PROXY_ID", &ctx.id)
        .env(
            "CONNECT_PROXY_TOKEN",
            ctx.spec.token.as_ref().map_or("", structs::Token::secret),
        )
        .env("CONNECT_SIDECAR_FOR", &ctx.spec.sidecar_for)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .kill_on_drop(false);
    let spawned = if ctx.tied {
        crate::process::spawn_tied(&mut command)
    } else {
        command.spawn()
    };
    let child = spawned.map_err(|e| format!("cannot run {}: {e}", ctx.spec.command.display()))?;
    let pid = child.id().ok_or("the process exited at once")?;
    let id = ProcessId::of(pid).unwrap_or(ProcessId { pid, start_time: 0 });
    let path = pid_path(&ctx.data_dir, &ctx.id);
    if let Err(e) = write_atomic(&path, format!("{pid}\n").as_bytes(), 0o600) {
        tracing::error!(path = %path.display(), error = %e, "cannot write pid file");
    }
    Ok((child, id))
}
