//! Managed proxies: the agent runs the proxies of its local services itself, after Consul
//! 1.4's proxy manager. The desired set follows the local state — every local proxy marked
//! [`Managed`] — and is handed to the supervisor's daemon manager
//! (`supervisor::daemon`), which starts, restarts (with back-off), stops and, after an agent
//! restart, re-adopts the processes, with pid and log files under
//! `<data-dir>/proxies/` (a private temporary directory with `-dev`).
//!
//! The default command is `meshd connect envoy -proxy-id <id>` against this agent's HTTP and
//! xDS addresses; a `Connect.Proxy.Command` replaces it. The proxy id is in
//! `CONNECT_PROXY_ID`, its token in `CONNECT_PROXY_TOKEN` — the environment, never the
//! command line. Proxies are not run as root unless `allow_managed_root` says so.
//!
//! Each proxy's status (pid, state, restarts, last exit, why it cannot start) is kept from the
//! manager's events for the agent's API.

use crate::local::{LocalState, Managed};
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use supervisor::daemon::{DaemonEvent, DaemonSpec, DesiredSet, ManagerHandle, ManagerOptions};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, info_span, warn};

/// How the agent runs its proxies.
#[derive(Debug, Clone)]
pub struct ManagedConfig {
    /// Where pids, logs, the daemon snapshot and the proxies' run dirs live; `None` (`-dev`):
    /// a private temporary directory, and the proxies are stopped with the agent.
    pub data_dir: Option<PathBuf>,
    /// Run proxies even when the agent runs as root.
    pub allow_root: bool,
    /// The `meshd` binary of the default command.
    pub program: PathBuf,
    /// The agent's HTTP API (the default command's `-http-addr`).
    pub http_addr: SocketAddr,
    /// The agent's xDS address (the default command's `-grpc-addr`).
    pub grpc_addr: SocketAddr,
    /// The Envoy binary of the default command (`None`: `envoy` from `PATH`).
    pub envoy_binary: Option<PathBuf>,
    /// How long Envoy drains when its proxy stops (within the 5 s before SIGKILL).
    pub drain_time: std::time::Duration,
}

/// What the agent knows of one managed proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProxyStatus {
    /// `starting`, `running`, `restarting` (exited, waiting for its back-off) or `failed`
    /// (cannot start; retried with back-off).
    #[serde(rename = "State")]
    pub state: String,
    /// The proxy process (`meshd connect envoy`, or the `Command`), when one runs.
    #[serde(rename = "Pid", skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Processes started after the first one (restarts by this agent).
    #[serde(rename = "Restarts")]
    pub restarts: u32,
    /// Re-adopted from a previous agent rather than started by this one.
    #[serde(rename = "Adopted")]
    pub adopted: bool,
    /// How the last process ended, if one did.
    #[serde(rename = "LastExit", skip_serializing_if = "String::is_empty")]
    pub last_exit: String,
    /// Why it cannot be started, while that lasts.
    #[serde(rename = "Error", skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// The agent's managed proxies (see the module docs).
pub struct ManagedProxies {
    handle: Mutex<Option<ManagerHandle>>,
    status: Arc<Mutex<BTreeMap<String, ProxyStatus>>>,
    stop: CancellationToken,
    tasks: TaskTracker,
    /// Stops the proxies with the agent (`-dev`), else leaves them for the next agent.
    kill_on_stop: bool,
    /// The `-dev` directory, removed after the proxies stopped.
    _temp: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for ManagedProxies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedProxies")
            .field("kill_on_stop", &self.kill_on_stop)
            .finish_non_exhaustive()
    }
}

/// Why managed proxies cannot be run at all.
#[derive(Debug, thiserror::Error)]
pub enum ManagedError {
    /// The temporary directory of `-dev` could not be made.
    #[error("cannot make a directory for managed proxies: {0}")]
    TempDir(std::io::Error),
    /// The daemon manager could not start (its data dir or snapshot).
    #[error(transparent)]
    Daemon(#[from] supervisor::daemon::DaemonError),
}

impl ManagedProxies {
    /// Starts the daemon manager (re-adopting the proxies a previous agent left running) and
    /// keeps its desired set equal to `state`'s managed proxies.
    pub fn start(state: Arc<LocalState>, config: ManagedConfig) -> Result<Self, ManagedError> {
        let (dir, temp) = match &config.data_dir {
            Some(dir) => (dir.join("proxies"), None),
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("meshd-proxies-")
                    .tempdir()
                    .map_err(ManagedError::TempDir)?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        let (tx, rx) = mpsc::channel(4);
        let options = ManagerOptions {
            allow_root: config.allow_root,
            // With -dev the proxies go with the agent, even when it is killed.
            tied: temp.is_some(),
            ..ManagerOptions::new(dir.join("daemons"))
        };
        let handle = supervisor::daemon::Manager::start(options, rx)?;
        let status: Arc<Mutex<BTreeMap<String, ProxyStatus>>> = Arc::default();
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let mut events = handle.events();
        let (s, st) = (Arc::clone(&status), stop.clone());
        tasks.spawn(
            async move {
                loop {
                    let event = tokio::select! {
                        () = st.cancelled() => return,
                        event = events.recv() => event,
                    };
                    match event {
                        Ok(event) => record(&mut s.lock(), event),
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                            warn!(missed = n, "managed proxy events were dropped: statuses may be behind");
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    }
                }
            }
            .instrument(info_span!("managed_proxy_events")),
        );
        let run_dir = dir.join("run");
        let (s, st) = (Arc::clone(&status), stop.clone());
        tasks.spawn(
            async move { follow(state, config, run_dir, tx, s, st).await }.instrument(info_span!("managed_proxies")),
        );
        Ok(Self {
            handle: Mutex::new(Some(handle)),
            status,
            stop,
            tasks,
            kill_on_stop: temp.is_some(),
            _temp: temp,
        })
    }

    /// The status of managed proxy `id`.
    pub fn status(&self, id: &str) -> Option<ProxyStatus> {
        self.status.lock().get(id).cloned()
    }

    /// Every managed proxy's status, by id.
    pub fn statuses(&self) -> BTreeMap<String, ProxyStatus> {
        self.status.lock().clone()
    }

    /// Stops following the local state; with a data dir the proxies keep running for the
    /// next agent to re-adopt, with `-dev` they are stopped (SIGINT, then SIGKILL after 5 s).
    pub async fn shutdown(&self) {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        let handle = self.handle.lock().take();
        if let Some(handle) = handle {
            if self.kill_on_stop {
                info!("stopping the managed proxies (-dev)");
                handle.kill().await;
            } else {
                info!("leaving the managed proxies running for the next agent");
                handle.close().await;
            }
        }
    }
}

/// Folds one daemon event into the statuses.
fn record(status: &mut BTreeMap<String, ProxyStatus>, event: DaemonEvent) {
    match event {
        DaemonEvent::Started { id, pid, .. } => {
            let s = status.entry(id).or_default();
            if s.pid.is_some() || !s.last_exit.is_empty() {
                s.restarts += 1;
            }
            *s = ProxyStatus {
                state: "running".into(),
                pid: Some(pid),
                adopted: false,
                error: String::new(),
                ..s.clone()
            };
        }
        DaemonEvent::Adopted { id, pid } => {
            let s = status.entry(id).or_default();
            s.state = "running".into();
            s.pid = Some(pid);
            s.adopted = true;
            s.error.clear();
        }
        DaemonEvent::Exited { id, pid, status: how } => {
            let s = status.entry(id).or_default();
            s.state = "restarting".into();
            s.pid = None;
            s.last_exit = format!("pid {pid}: {}", how.as_deref().unwrap_or("exited"));
        }
        DaemonEvent::Failed { id, reason } => {
            let s = status.entry(id).or_default();
            s.state = "failed".into();
            s.pid = None;
            s.error = reason;
        }
        DaemonEvent::Stopped { id } => {
            status.remove(&id);
        }
    }
}

/// An address a local process can reach the agent at (`0.0.0.0` means this host).
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        ip if ip.is_unspecified() => SocketAddr::new(
            if ip.is_ipv4() {
                IpAddr::V4(Ipv4Addr::LOCALHOST)
            } else {
                IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)
            },
            addr.port(),
        ),
        _ => addr,
    }
}

/// The daemon that runs proxy `id` (a sidecar of `parent`).
fn spec(config: &ManagedConfig, run_dir: &std::path::Path, id: &str, parent: &str, managed: &Managed) -> DaemonSpec {
    let (command, args) = match managed.command.split_first() {
        Some((program, args)) => (PathBuf::from(program), args.to_vec()),
        None => {
            let mut args: Vec<String> = [
                "connect",
                "envoy",
                "-proxy-id",
                id,
                "-http-addr",
                &reachable(config.http_addr).to_string(),
                "-grpc-addr",
                &reachable(config.grpc_addr).to_string(),
                // No -admin-bind: Envoy's admin is a Unix socket in the run dir, which only
                // this user can reach (a TCP admin would let anyone on the host stop it).
                "-drain-time",
                &format!("{}ms", config.drain_time.as_millis()),
                "-run-dir",
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
            let dir = run_dir.join(atomic_file::file_name_for(id));
            // A base id stable for this proxy of this agent: a proxy restarted after a crash
            // (or a kill) removes the shared memory the previous Envoy left behind.
            args.push(dir.to_string_lossy().into_owned());
            args.push("-base-id".into());
            args.push(base_id(&dir).to_string());
            if let Some(envoy) = &config.envoy_binary {
                args.push("-envoy-binary".into());
                args.push(envoy.to_string_lossy().into_owned());
            }
            (config.program.clone(), args)
        }
    };
    DaemonSpec {
        command,
        args,
        env: BTreeMap::new(),
        // The proxy's local token (else the registration's); in the environment only.
        token: managed.local_token.clone().or_else(|| managed.token.clone()),
        sidecar_for: parent.to_owned(),
    }
}

/// Envoy's hot-restart base id for the proxy whose run dir is `dir`.
fn base_id(dir: &std::path::Path) -> u32 {
    supervisor::envoy::stable_base_id(&[dir.to_string_lossy().as_bytes()])
}

/// Keeps the daemon manager's desired set equal to the local state's managed proxies.
async fn follow(
    state: Arc<LocalState>,
    config: ManagedConfig,
    run_dir: PathBuf,
    tx: mpsc::Sender<DesiredSet>,
    status: Arc<Mutex<BTreeMap<String, ProxyStatus>>>,
    stop: CancellationToken,
) {
    // Managed proxies are services: a check's report does not change them.
    let mut changes = state.subscribe_services();
    let mut last: Option<DesiredSet> = None;
    loop {
        let desired: DesiredSet = state
            .services_where(|s| s.managed.is_some())
            .into_iter()
            .filter_map(|s| {
                let managed = s.managed.as_ref()?;
                let parent = s.sidecar_of.clone().unwrap_or_default();
                Some((
                    s.service.id.clone(),
                    spec(&config, &run_dir, &s.service.id, &parent, managed),
                ))
            })
            .collect();
        if last.as_ref() != Some(&desired) {
            {
                let mut st = status.lock();
                // A proxy that left the set has no status any more (one stopped while waiting
                // for its back-off sends no event).
                st.retain(|id, _| desired.contains_key(id));
                for id in desired.keys() {
                    st.entry(id.clone()).or_insert_with(|| ProxyStatus {
                        state: "starting".into(),
                        ..ProxyStatus::default()
                    });
                }
            }
            if tx.send(desired.clone()).await.is_err() {
                return;
            }
            last = Some(desired);
        }
        tokio::select! {
            () = stop.cancelled() => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests;
