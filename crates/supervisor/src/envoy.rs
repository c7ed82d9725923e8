//! Envoy as a [`Proxy`]: each epoch is one Envoy process started with `--restart-epoch N`
//! and the agent's base id, so epoch N+1 hot-restarts from epoch N (takes over its listen
//! sockets and stats; the parent drains for `--drain-time-s` and exits after
//! `--parent-shutdown-time-s`).
//!
//! Files live in the run directory (created 0700; bootstraps may hold tokens, so they are
//! written 0600 and passed by path, never on the command line where `ps` shows them):
//! `bootstrap-<epoch>.json` and `admin-<epoch>.addr` (Envoy writes its admin address there:
//! `IP:PORT`, or the path of a Unix socket, so an admin port of 0 works across epochs). The
//! hot-restart sockets epochs talk over are there too (`hot-restart_*`, mode 0600) rather than
//! in Envoy's default abstract namespace, where any process on the host could ask the running
//! Envoy for its listen sockets or tell it to terminate. Children are tied to the supervisor:
//! the kernel kills them if it dies.
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

/// Where an Envoy's admin interface listens: a TCP address, or a Unix socket (the default
/// of `meshd connect envoy`: a file mode 0600 in a 0700 directory, which only the supervisor's
/// user can reach).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AdminAddr {
    /// `IP:PORT`.
    Tcp(SocketAddr),
    /// The path of a Unix socket.
    Unix(PathBuf),
}

impl AdminAddr {
    /// An address as Envoy writes it with `--admin-address-path`: a path (absolute) for a
    /// Unix socket, else `IP:PORT`.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        if s.starts_with('/') {
            return Some(Self::Unix(PathBuf::from(s)));
        }
        s.parse().ok().map(Self::Tcp)
    }
}

impl From<SocketAddr> for AdminAddr {
    fn from(addr: SocketAddr) -> Self {
        Self::Tcp(addr)
    }
}

impl From<&AdminAddr> for AdminAddr {
    fn from(addr: &AdminAddr) -> Self {
        addr.clone()
    }
}

impl std::fmt::Display for AdminAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(addr) => addr.fmt(f),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// The longest path a Unix socket can be bound at (`sun_path` holds 108 bytes with the NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// The prefix of the hot-restart sockets in the run dir; Envoy appends
/// `_{parent,child,udp_parent,udp_child}_<id>`, the id derived from the base id and the
/// epoch (modulo 3).
const HOT_RESTART_SOCKET: &str = "hot-restart";

/// The longest name Envoy gives a hot-restart socket in the run dir (with the separator): its
/// id can take the 20 digits of a `u64` (Envoy sign-extends a base id × 10 past `i32::MAX`).
const HOT_RESTART_NAME_MAX: usize = "/hot-restart_udp_parent_".len() + 20;

/// Checks that Envoy can bind its sockets in `dir` (hot restart's, and `admin.sock`): a Unix
/// socket path is at most [`MAX_SOCKET_PATH`] bytes.
pub fn check_socket_dir(dir: &Path) -> std::io::Result<()> {
    let len = dir.as_os_str().len();
    if len + HOT_RESTART_NAME_MAX > MAX_SOCKET_PATH {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} is too long for Envoy's Unix sockets in it ({len} bytes; at most {}): use a shorter directory",
                dir.display(),
                MAX_SOCKET_PATH - HOT_RESTART_NAME_MAX
            ),
        ));
    }
    Ok(())
}

/// The command-line arguments that put Envoy's hot-restart sockets in `dir`, mode 0600.
pub fn hot_restart_socket_args(dir: &Path) -> Vec<std::ffi::OsString> {
    vec![
        "--socket-path".into(),
        dir.join(HOT_RESTART_SOCKET).into_os_string(),
        "--socket-mode".into(),
        "600".into(),
    ]
}

/// Runs Envoy epochs for an [`crate::agent::Agent`].
#[derive(Debug)]
pub struct EnvoyProxy {
    opts: EnvoyOptions,
    /// Epochs started and not yet cleaned up: when none is left, nothing shares the shared
    /// memory any more and it is removed.
    epochs: parking_lot::Mutex<std::collections::BTreeSet<u32>>,
}

impl EnvoyProxy {
    /// Prepares the run directory (0700). Refused when it is too long a path for the Unix
    /// sockets Envoy binds in it ([`check_socket_dir`]).
    pub fn new(opts: EnvoyOptions) -> std::io::Result<Self> {
        check_socket_dir(&opts.run_dir)?;
        // Bootstrap files hold the proxy's token: owner only.
        atomic_file::private_dir(&opts.run_dir)?;
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
    pub fn admin_address(&self, epoch: u32) -> Option<AdminAddr> {
        read_admin_address(&self.admin_address_path(epoch))
    }

    /// Whether epoch `epoch` answers `/ready` with LIVE.
    pub async fn is_live(&self, epoch: u32) -> bool {
        match self.admin_address(epoch) {
            Some(addr) => matches!(admin_request(addr, "GET", "/ready").await, Ok((200, _))),
            None => false,
        }
    }

    /// Removes the hot-restart sockets Envoys left in the run dir (Envoy never removes them,
    /// and names them after its own arithmetic on the base id and epoch).
    fn remove_hot_restart_sockets(&self) {
        let Ok(entries) = std::fs::read_dir(&self.opts.run_dir) else {
            return;
        };
        let prefix = format!("{HOT_RESTART_SOCKET}_");
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// The command line of epoch `epoch`.
    fn command(&self, epoch: u32, bootstrap: &Path, admin_path: &Path) -> tokio::process::Command {
        let o = &self.opts;
        let mut cmd = tokio::process::Command::new(&o.binary);
        cmd.arg("-c")
            .arg(bootstrap)
            .arg("--restart-epoch")
            .arg(epoch.to_string())
            .arg("--base-id")
            .arg(o.base_id.to_string())
            .arg("--drain-time-s")
            .arg(o.drain_time.as_secs().max(1).to_string())
            .arg("--parent-shutdown-time-s")
            .arg(o.parent_shutdown_time.as_secs().max(1).to_string())
            .arg("--admin-address-path")
            .arg(admin_path);
        // Extra arguments that place the sockets themselves win.
        if !o.extra_args.iter().any(|a| a == "--socket-path") {
            cmd.args(hot_restart_socket_args(&o.run_dir));
        }
        cmd.args(&o.extra_args).stdin(Stdio::null()).kill_on_drop(true);
        cmd
    }
}

/// Reads an address file written by `--admin-address-path`.
pub fn read_admin_address(path: &Path) -> Option<AdminAddr> {
    AdminAddr::parse(&std::fs::read_to_string(path).ok()?)
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

/// One request to an Envoy admin endpoint, over TCP or a Unix socket; returns the status
/// code and body.
pub async fn admin_request(addr: impl Into<AdminAddr>, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    let method = reqwest::Method::from_bytes(method.as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // A client per request: epochs come and go on different ports, so a pool would only
    // keep connections to Envoys that are gone. `no_proxy`: the admin is always local and
    // must not be sent through an HTTP(S)_PROXY from the environment.
    let builder = reqwest::Client::builder().no_proxy().timeout(ADMIN_TIMEOUT);
    let (builder, url) = match addr.into() {
        AdminAddr::Tcp(addr) => (builder, format!("http://{addr}{path}")),
        AdminAddr::Unix(socket) => (builder.unix_socket(socket), format!("http://localhost{path}")),
    };
    let client = builder.build().map_err(admin_error)?;
    let io = async {
        // Said explicitly: hyper sends no length for an empty body, and a POST without one
        // is ambiguous to some servers; the hand-written client always sent it.
        let response = client
            .request(method, url)
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

        let mut cmd = self.command(epoch, &bootstrap, &admin_path);
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
        let admin = self.admin_address(epoch);
        let _ = std::fs::remove_file(self.bootstrap_path(epoch));
        let _ = std::fs::remove_file(self.admin_address_path(epoch));
        let mut epochs = self.epochs.lock();
        epochs.remove(&epoch);
        if !epochs.is_empty() {
            return;
        }
        // No Envoy of ours is left: its sockets in the run dir go, as does the shared memory.
        self.remove_hot_restart_sockets();
        if let Some(AdminAddr::Unix(socket)) = admin
            && socket.parent() == Some(self.opts.run_dir.as_path())
        {
            let _ = std::fs::remove_file(socket);
        }
        if let Err(e) = clean_stale_shared_memory(self.opts.base_id) {
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
    use super::{AdminAddr, admin_request, check_socket_dir};
    use std::path::{Path, PathBuf};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Reads one request from `stream`, answers `response` and returns the request.
    async fn answer(mut stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin, response: &str) -> String {
        let mut request = Vec::new();
        let mut buf = [0u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await.unwrap();
            request.extend_from_slice(&buf[..n]);
        }
        stream.write_all(response.as_bytes()).await.unwrap();
        stream.shutdown().await.unwrap();
        String::from_utf8(request).unwrap()
    }

    #[tokio::test]
    async fn the_admin_is_reached_over_a_unix_socket() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("admin.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            answer(stream, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nLIVE\n").await
        });
        let addr = AdminAddr::parse(&format!("{}\n", socket.display())).unwrap();
        assert_eq!(addr, AdminAddr::Unix(socket.clone()));
        assert_eq!(
            admin_request(&addr, "GET", "/ready").await.unwrap(),
            (200, "LIVE\n".to_owned())
        );
        assert!(server.await.unwrap().starts_with("GET /ready HTTP/1.1\r\n"));
        assert_eq!(
            AdminAddr::parse("127.0.0.1:19000"),
            Some(AdminAddr::Tcp("127.0.0.1:19000".parse().unwrap()))
        );
        assert_eq!(AdminAddr::parse("relative/admin.sock"), None);
    }

    #[test]
    fn a_run_dir_too_long_for_envoys_sockets_is_refused() {
        assert!(check_socket_dir(Path::new("/tmp/meshd-envoy-abc")).is_ok());
        let long = PathBuf::from(format!("/{}", "d".repeat(80)));
        let err = check_socket_dir(&long).unwrap_err().to_string();
        assert!(err.contains("too long") && err.contains("at most 63"), "{err}");
    }

    /// Answers one connection with `response` and returns the request it read.
    async fn serve_once(response: &'static str) -> (std::net::SocketAddr, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            answer(stream, response).await
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
