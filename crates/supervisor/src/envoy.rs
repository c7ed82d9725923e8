//! Envoy as a [`Proxy`]: each epoch is one Envoy process started with `--restart-epoch N`
//! and the agent's base id, so epoch N+1 hot-restarts from epoch N (takes over its listen
//! sockets and stats; the parent drains for `--drain-time-s` and exits after
//! `--parent-shutdown-time-s`).
//!
//! Files live in the run directory (created 0700; bootstraps may hold tokens, so they are
//! written 0600 and passed by path, never on the command line where `ps` shows them):
//! `bootstrap-<epoch>.json` and `admin-<epoch>.addr` (Envoy writes its admin address there,
//! so an admin port of 0 works across epochs). Children are tied to the supervisor: the
//! kernel kills them if it dies.
//!
//! Envoy leaves its shared memory (`/dev/shm/envoy_shared_memory_<base id × 10>`) behind on
//! exit; it is removed when the last epoch has been cleaned up, and before epoch 0 in case a
//! killed supervisor could not.

use crate::agent::{Proxy, ProxyError};
use crate::process::{spawn_tied, write_atomic};
use rustix::process::Signal;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How to run Envoy.
#[derive(Debug, Clone)]
pub struct EnvoyOptions {
    /// The Envoy binary.
    pub binary: PathBuf,
    /// Hot restart base id: shared by this agent's epochs, distinct from every other Envoy
    /// on the host.
    pub base_id: u32,
    /// Where bootstraps and admin address files go.
    pub run_dir: PathBuf,
    /// `--drain-time-s`: how long a parent drains during a hot restart.
    pub drain_time: Duration,
    /// `--parent-shutdown-time-s`: when the parent is told to exit.
    pub parent_shutdown_time: Duration,
    /// Extra command-line arguments for every epoch.
    pub extra_args: Vec<String>,
    /// How long `run` polls for the epoch to become live. An exit before it is live is a
    /// failed start; once live (or once this has passed) an exit is a crash.
    pub live_timeout: Duration,
    /// After SIGTERM, how long before SIGKILL.
    pub stop_grace: Duration,
    /// Send Envoy's stdout/stderr here (appending); `None` inherits the supervisor's.
    pub log_file: Option<PathBuf>,
}

impl EnvoyOptions {
    /// Defaults for `binary`, `base_id` and `run_dir`: drain 5 s, parent shutdown 10 s.
    pub fn new(binary: impl Into<PathBuf>, base_id: u32, run_dir: impl Into<PathBuf>) -> Self {
        Self {
            binary: binary.into(),
            base_id,
            run_dir: run_dir.into(),
            drain_time: Duration::from_secs(5),
            parent_shutdown_time: Duration::from_secs(10),
            extra_args: Vec::new(),
            live_timeout: Duration::from_secs(20),
            stop_grace: Duration::from_secs(5),
            log_file: None,
        }
    }
}

/// Envoy's bootstrap for an epoch (JSON or YAML text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyConfig(pub String);

/// Runs Envoy epochs for an [`crate::agent::Agent`].
#[derive(Debug)]
pub struct EnvoyProxy {
    opts: EnvoyOptions,
    /// Epochs started and not yet cleaned up: when none is left, nothing shares the shared
    /// memory any more and it is removed.
    epochs: parking_lot::Mutex<std::collections::BTreeSet<u32>>,
}

impl EnvoyProxy {
    /// Prepares the run directory (0700).
    pub fn new(opts: EnvoyOptions) -> std::io::Result<Self> {
        // Bootstrap files hold the proxy's token: owner only.
        let tightened = atomic_file::private_dir(&opts.run_dir)?;
        if tightened.any() {
            tracing::warn!(dir = %opts.run_dir.display(), files = tightened.entries.len(), "the run dir let other users read it: tightened to 0700, its files to 0600");
        }
        Ok(Self {
            opts,
            epochs: Default::default(),
        })
    }

    /// The options in use.
    pub fn options(&self) -> &EnvoyOptions {
        &self.opts
    }

    fn bootstrap_path(&self, epoch: u32) -> PathBuf {
        self.opts.run_dir.join(format!("bootstrap-{epoch}.json"))
    }

    /// Where epoch `epoch` writes its admin address.
    pub fn admin_address_path(&self, epoch: u32) -> PathBuf {
        self.opts.run_dir.join(format!("admin-{epoch}.addr"))
    }

    /// The admin address of epoch `epoch`, once Envoy has written it.
    pub fn admin_address(&self, epoch: u32) -> Option<SocketAddr> {
        read_admin_address(&self.admin_address_path(epoch))
    }

    /// Whether epoch `epoch` answers `/ready` with LIVE.
    pub async fn is_live(&self, epoch: u32) -> bool {
        match self.admin_address(epoch) {
            Some(addr) => matches!(admin_request(addr, "GET", "/ready").await, Ok((200, _))),
            None => false,
        }
    }
}

/// Reads an address file written by `--admin-address-path`.
pub fn read_admin_address(path: &Path) -> Option<SocketAddr> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A hot-restart base id derived from `parts`: the same parts give the same id in every build
/// and process (FNV-1a, unlike std's hasher), so a restarted supervisor finds what the last
/// one left. Envoy names shared memory after base id × 10: the id stays well inside `u32`.
pub fn stable_base_id(parts: &[&[u8]]) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().flat_map(|p| p.iter()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    1 + u32::try_from(h % 400_000_000).unwrap_or(0)
}

/// Removes the shared memory a previous Envoy with `base_id` left behind (Envoy names it
/// `envoy_shared_memory_<base id × 10>` and does not unlink it on exit). Call before epoch 0
/// only: later epochs share it with their parent.
pub fn clean_stale_shared_memory(base_id: u32) -> std::io::Result<()> {
    let path = PathBuf::from(format!("/dev/shm/envoy_shared_memory_{}", u64::from(base_id) * 10));
    match std::fs::remove_file(&path) {
        Ok(()) => {
            tracing::info!(path = %path.display(), "removed stale Envoy shared memory");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// How long one admin request may take, connect to last body byte.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);

/// One request to an Envoy admin endpoint; returns the status code and body.
pub async fn admin_request(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    let method = reqwest::Method::from_bytes(method.as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // A client per request: epochs come and go on different ports, so a pool would only
    // keep connections to Envoys that are gone. `no_proxy`: the admin is always local and
    // must not be sent through an HTTP(S)_PROXY from the environment.
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(ADMIN_TIMEOUT)
        .build()
        .map_err(admin_error)?;
    let io = async {
        // Said explicitly: hyper sends no length for an empty body, and a POST without one
        // is ambiguous to some servers; the hand-written client always sent it.
        let response = client
            .request(method, format!("http://{addr}{path}"))
            .header(reqwest::header::CONTENT_LENGTH, "0")
            .send()
            .await?;
        let status = response.status().as_u16();
        Ok((status, response.text().await?))
    };
    io.await.map_err(admin_error)
}

/// An admin request's failure as an I/O error, keeping the causes reqwest wraps (its own
/// message alone does not say whether the connection was refused or reset).
fn admin_error(e: reqwest::Error) -> std::io::Error {
    if e.is_timeout() {
        return std::io::Error::new(std::io::ErrorKind::TimedOut, "admin request timed out");
    }
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    let kind = if e.is_connect() {
        std::io::ErrorKind::ConnectionRefused
    } else {
        std::io::ErrorKind::Other
    };
    std::io::Error::new(kind, message)
}

const LIVE_POLL: Duration = Duration::from_millis(20);

impl Proxy for EnvoyProxy {
    type Config = EnvoyConfig;

    async fn run(&self, config: &EnvoyConfig, epoch: u32, abort: CancellationToken) -> Result<(), ProxyError> {
        let o = &self.opts;
        if epoch == 0 {
            clean_stale_shared_memory(o.base_id)
                .map_err(|e| ProxyError::Start(format!("cannot remove stale shared memory: {e}")))?;
        }
        self.epochs.lock().insert(epoch);
        let bootstrap = self.bootstrap_path(epoch);
        write_atomic(&bootstrap, config.0.as_bytes(), 0o600)
            .map_err(|e| ProxyError::Start(format!("cannot write {}: {e}", bootstrap.display())))?;
        let admin_path = self.admin_address_path(epoch);
        let _ = std::fs::remove_file(&admin_path);

        let mut cmd = tokio::process::Command::new(&o.binary);
        cmd.arg("-c")
            .arg(&bootstrap)
            .arg("--restart-epoch")
            .arg(epoch.to_string())
            .arg("--base-id")
            .arg(o.base_id.to_string())
            .arg("--drain-time-s")
            .arg(o.drain_time.as_secs().max(1).to_string())
            .arg("--parent-shutdown-time-s")
            .arg(o.parent_shutdown_time.as_secs().max(1).to_string())
            .arg("--admin-address-path")
            .arg(&admin_path)
            .args(&o.extra_args)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(log) = &o.log_file {
            let open = || atomic_file::open_private(log, std::fs::OpenOptions::new().create(true).append(true));
            let (out, err) = open()
                .and_then(|a| Ok((a, open()?)))
                .map_err(|e| ProxyError::Start(format!("cannot open {}: {e}", log.display())))?;
            cmd.stdout(out).stderr(err);
        }
        let mut child =
            spawn_tied(&mut cmd).map_err(|e| ProxyError::Start(format!("cannot run {}: {e}", o.binary.display())))?;
        let pid = child.id().unwrap_or_default();
        tracing::info!(epoch, pid, base_id = o.base_id, "envoy started");

        // Until live, an exit is a failed start; after, it is a crash.
        let mut live = false;
        let live_deadline = tokio::time::Instant::now() + o.live_timeout;
        let status = loop {
            tokio::select! {
                status = child.wait() => break status,
                _ = abort.cancelled() => {
                    crate::process::stop_child(&mut child, Signal::TERM, o.stop_grace).await;
                    return Ok(());
                }
                _ = tokio::time::sleep(LIVE_POLL), if !live => {
                    if self.is_live(epoch).await {
                        tracing::info!(epoch, pid, "envoy is live");
                        live = true;
                    } else if tokio::time::Instant::now() >= live_deadline {
                        tracing::warn!(epoch, pid, "envoy not live in time; treating it as started");
                        live = true;
                    }
                }
            }
        };
        let status = status.map_err(|e| ProxyError::Exited(format!("cannot wait for envoy: {e}")))?;
        tracing::info!(epoch, pid, %status, "envoy exited");
        match (status.success(), live) {
            (true, _) => Ok(()),
            (false, false) => Err(ProxyError::Start(format!(
                "envoy epoch {epoch} exited before it was live: {status}"
            ))),
            (false, true) => Err(ProxyError::Exited(format!("envoy epoch {epoch}: {status}"))),
        }
    }

    async fn wait_live(&self, epoch: u32) {
        while !self.is_live(epoch).await {
            tokio::time::sleep(LIVE_POLL).await;
        }
    }

    async fn drain(&self, epoch: u32) -> Result<(), ProxyError> {
        let addr = self
            .admin_address(epoch)
            .ok_or_else(|| ProxyError::Exited(format!("epoch {epoch} has no admin address")))?;
        match admin_request(addr, "POST", "/drain_listeners?graceful").await {
            Ok((200, _)) => Ok(()),
            Ok((code, body)) => Err(ProxyError::Exited(format!(
                "drain_listeners answered {code}: {}",
                body.trim()
            ))),
            Err(e) => Err(ProxyError::Exited(format!("drain_listeners: {e}"))),
        }
    }

    fn cleanup(&self, epoch: u32) {
        let _ = std::fs::remove_file(self.bootstrap_path(epoch));
        let _ = std::fs::remove_file(self.admin_address_path(epoch));
        let mut epochs = self.epochs.lock();
        epochs.remove(&epoch);
        if epochs.is_empty()
            && let Err(e) = clean_stale_shared_memory(self.opts.base_id)
        {
            tracing::warn!(error = %e, "cannot remove Envoy's shared memory");
        }
    }

    fn panic(&self, config: &EnvoyConfig) {
        tracing::error!(
            bytes = config.0.len(),
            "envoy could not be started with the desired bootstrap; giving up"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::admin_request;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Answers one connection with `response` and returns the request it read.
    async fn serve_once(response: &'static str) -> (std::net::SocketAddr, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = stream.read(&mut buf).await.unwrap();
                request.extend_from_slice(&buf[..n]);
            }
            stream.write_all(response.as_bytes()).await.unwrap();
            stream.shutdown().await.unwrap();
            String::from_utf8(request).unwrap()
        });
        (addr, task)
    }

    #[tokio::test]
    async fn chunked_admin_answers_are_decoded() {
        let (addr, server) = serve_once(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n",
        )
        .await;
        assert_eq!(
            admin_request(addr, "GET", "/stats").await.unwrap(),
            (200, "hello, world".to_owned())
        );
        assert!(server.await.unwrap().starts_with("GET /stats HTTP/1.1\r\n"));
    }

    #[tokio::test]
    async fn a_post_carries_an_empty_body_and_the_status_is_returned() {
        let (addr, server) =
            serve_once("HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope").await;
        assert_eq!(
            admin_request(addr, "POST", "/drain_listeners?graceful").await.unwrap(),
            (405, "nope".to_owned())
        );
        let request = server.await.unwrap().to_ascii_lowercase();
        assert!(
            request.starts_with("post /drain_listeners?graceful http/1.1\r\n"),
            "{request}"
        );
        assert!(request.contains("content-length: 0\r\n"), "{request}");
    }

    #[tokio::test]
    async fn a_closed_port_is_an_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let err = admin_request(addr, "GET", "/ready").await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    }
}
