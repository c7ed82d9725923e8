//! A real etcd cluster for tests: N members of the pinned etcd (`MESHD_ETCD`) on loopback
//! ports, each with its own temporary data dir, started and checked healthy before the test
//! goes on; members can be killed and restarted to test what a client does when one dies.
//!
//! Blocking: start it before entering async work, or from `spawn_blocking`.

use crate::ReservedPort;
use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tracing::Instrument as _;

/// How long members get to report healthy after a start or restart. Generous: a 2-core
/// machine running other tests may take a while to elect a leader.
const HEALTHY_WITHIN: Duration = Duration::from_secs(30);

/// Lines of a member's log shown when it fails.
const LOG_TAIL_LINES: usize = 40;

/// The pinned etcd server, installed into `.tools/` by the xtask and named in `MESHD_ETCD`
/// (`eval "$(cargo xtask tools)"` sets it for a run by hand). Panics when missing: tests that
/// need it never skip.
pub fn etcd_binary() -> PathBuf {
    std::env::var_os("MESHD_ETCD")
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .expect(
            "MESHD_ETCD must name the pinned etcd binary: run the tests with `cargo xtask test`, or `eval \"$(cargo xtask tools)\"` first",
        )
}

/// Options for a cluster before it starts (see [`EtcdCluster::builder`]).
#[derive(Debug, Clone)]
pub struct EtcdBuilder {
    members: usize,
    extra_args: Vec<OsString>,
}

impl EtcdBuilder {
    /// Adds an argument every member starts (and restarts) with, such as `--max-txn-ops=512`
    /// or `--auto-compaction-retention=1`.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Adds several arguments (see [`EtcdBuilder::arg`]).
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.extra_args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Starts every member and waits until each one reports healthy; panics with the log
    /// of a member that does not.
    pub fn start(self) -> EtcdCluster {
        assert!(self.members > 0, "an etcd cluster needs at least one member");
        static CLUSTERS: AtomicU32 = AtomicU32::new(0);
        let token = format!(
            "meshd-test-{}-{}",
            std::process::id(),
            CLUSTERS.fetch_add(1, Ordering::Relaxed)
        );
        let members = (0..self.members)
            .map(|i| Member {
                name: format!("member-{i}"),
                client: ReservedPort::new(),
                peer: ReservedPort::new(),
                dir: tempfile::Builder::new()
                    .prefix("meshd-etcd-")
                    .tempdir()
                    .expect("creating an etcd member's directory"),
                child: None,
            })
            .collect();
        let mut cluster = EtcdCluster {
            binary: etcd_binary(),
            token,
            extra_args: self.extra_args,
            members,
        };
        for i in 0..cluster.members.len() {
            cluster.spawn(i, "new");
        }
        // Members of a new cluster wait for each other: check them once all are started.
        for i in 0..cluster.members.len() {
            cluster.wait_healthy(i);
        }
        cluster
    }
}

/// One member: its ports stay reserved for the cluster's life, so a restart finds them free.
#[derive(Debug)]
struct Member {
    name: String,
    client: ReservedPort,
    peer: ReservedPort,
    /// Holds `data/` and `etcd.log` (both outputs, appended across restarts).
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Member {
    fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client.port())
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer.port())
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }
}

/// A running etcd cluster on 127.0.0.1. Its ports are reserved (see [`ReservedPort`]: etcd
/// listens with `SO_REUSEADDR`, so it gets them while nothing else can), which is why a start
/// never races another test for a port. Dropping it kills every member and removes their
/// data.
#[derive(Debug)]
pub struct EtcdCluster {
    binary: PathBuf,
    token: String,
    extra_args: Vec<OsString>,
    members: Vec<Member>,
}

impl EtcdCluster {
    /// Starts a cluster of `members` and waits until all are healthy.
    pub fn start(members: usize) -> Self {
        Self::builder(members).start()
    }

    /// A cluster of `members` with extra etcd arguments (see [`EtcdBuilder`]).
    pub fn builder(members: usize) -> EtcdBuilder {
        EtcdBuilder {
            members,
            extra_args: Vec::new(),
        }
    }

    /// How many members the cluster has (running or not).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no member (never, once started).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Each member's client URL, `http://127.0.0.1:PORT`, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::client_url).collect()
    }

    /// The client URLs comma-joined, as a flag value.
    pub fn endpoints_arg(&self) -> String {
        self.endpoints().join(",")
    }

    /// Member `i`'s data directory (etcd's `--data-dir`).
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.members[i].dir.path().join("data")
    }

    /// Kills member `i` with SIGKILL (a crash: nothing flushed, no goodbye to its peers) and
    /// reaps it. Its data dir and ports stay for [`EtcdCluster::restart`].
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            // Only our own child: `Child::kill` signals the process we spawned and still own.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its ports and data dir, rejoining as an existing member,
    /// and waits until it is healthy. Kills it first if it still runs.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i, "existing");
        self.wait_healthy(i);
    }

    /// Whether member `i`'s process is running (it may not be healthy yet).
    pub fn is_running(&mut self, i: usize) -> bool {
        self.members[i]
            .child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Whether member `i` answers `GET /health` with `"health":"true"` (it serves, with a
    /// leader and a quorum behind it).
    pub fn is_healthy(&self, i: usize) -> bool {
        health(self.members[i].client.port()).is_ok_and(|body| body.contains(r#""health":"true""#))
    }

    /// Waits until member `i` is healthy; panics with its log if it is not within 30 s or
    /// if its process exits.
    pub fn wait_healthy(&mut self, i: usize) {
        let deadline = Instant::now() + HEALTHY_WITHIN;
        loop {
            let last = match health(self.members[i].client.port()) {
                Ok(body) if body.contains(r#""health":"true""#) => return,
                Ok(body) => body,
                Err(e) => e,
            };
            if !self.is_running(i) {
                self.fail(i, "exited");
            }
            if Instant::now() > deadline {
                self.fail(
                    i,
                    &format!("is not healthy after {HEALTHY_WITHIN:?} (last answer: {last})"),
                );
            }
            pause(Duration::from_millis(50));
        }
    }

    /// The last lines of member `i`'s log (both of its outputs, every run of it).
    pub fn log_tail(&self, i: usize) -> String {
        tail(&self.members[i].log_path(), LOG_TAIL_LINES)
    }

    fn fail(&self, i: usize, what: &str) -> ! {
        let m = &self.members[i];
        panic!(
            "etcd {} ({}) {what}; last lines of {}:\n{}",
            m.name,
            m.client_url(),
            m.log_path().display(),
            self.log_tail(i)
        )
    }

    /// Starts member `i`'s process (`state`: `new` for a new cluster, `existing` to rejoin).
    fn spawn(&mut self, i: usize, state: &str) {
        let initial_cluster = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        let m = &self.members[i];
        let log = File::options()
            .create(true)
            .append(true)
            .open(m.log_path())
            .expect("opening an etcd member's log");
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(m.dir.path().join("data"))
            .arg("--listen-client-urls")
            .arg(m.client_url())
            .arg("--advertise-client-urls")
            .arg(m.client_url())
            .arg("--listen-peer-urls")
            .arg(m.peer_url())
            .arg("--initial-advertise-peer-urls")
            .arg(m.peer_url())
            .arg("--initial-cluster")
            .arg(&initial_cluster)
            .arg("--initial-cluster-token")
            .arg(&self.token)
            .arg("--initial-cluster-state")
            .arg(state)
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("sharing an etcd member's log"))
            .stderr(log);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.binary.display()));
        self.members[i].child = Some(child);
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// `GET /health` on a member's client port: the body, or why there is none. Plain HTTP/1.1,
/// one request per connection, bounded at 2 s.
fn health(port: u16) -> Result<String, String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let limit = Duration::from_secs(2);
    let mut conn = TcpStream::connect_timeout(&addr, limit).map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(limit)).map_err(|e| e.to_string())?;
    conn.set_write_timeout(Some(limit)).map_err(|e| e.to_string())?;
    write!(
        conn,
        "GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).map_err(|e| format!("read: {e}"))?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP answer: {answer:?}"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("{}: {body}", head.lines().next().unwrap_or_default()));
    }
    Ok(body.to_owned())
}

/// The last `n` lines of the file at `path` (a note when it cannot be read).
fn tail(path: &Path, n: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("(cannot read it: {e})"),
    }
}

/// Waits on this thread: start and restart are blocking by design (see the module docs).
#[allow(
    clippy::disallowed_methods,
    reason = "a blocking helper that callers run outside any runtime worker"
)]
fn pause(d: Duration) {
    std::thread::sleep(d);
}

/// A TCP forwarder between a client (a store, a server) and an etcd member that a test can
/// cut: while cut, its connections are closed and new ones are dropped at once, as if the
/// network between them had failed. Dropping it cuts every connection and stops listening.
#[derive(Debug)]
pub struct CuttableLink {
    url: String,
    cut: tokio::sync::watch::Sender<bool>,
    /// Connections forwarding now: [`CuttableLink::cut`] waits for none to be left.
    open: tokio::sync::watch::Sender<usize>,
    accept: tokio::task::JoinHandle<()>,
}

impl CuttableLink {
    /// Listens on an ephemeral loopback port and forwards to `upstream` (a client URL).
    pub async fn to(upstream: &str) -> CuttableLink {
        let upstream = upstream.trim_start_matches("http://").to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port");
        let url = format!("http://{}", listener.local_addr().expect("the listener's address"));
        let cut = tokio::sync::watch::Sender::new(false);
        let cut_rx = cut.subscribe();
        let open = tokio::sync::watch::Sender::new(0usize);
        let counted = open.clone();
        // Ends when the link is dropped (aborted); each connection's task ends when either
        // side closes or the link is cut.
        let span = tracing::info_span!("cuttable_link", %url, %upstream);
        let accept = tokio::spawn(
            async move {
                while let Ok((mut down, _)) = listener.accept().await {
                    if *cut_rx.borrow() {
                        continue;
                    }
                    let upstream = upstream.clone();
                    let mut cut_rx = cut_rx.clone();
                    let counted = counted.clone();
                    counted.send_modify(|n| *n += 1);
                    tokio::spawn(
                        async move {
                            if let Ok(mut up) = tokio::net::TcpStream::connect(&upstream).await {
                                // The cut first: once it is seen, not one more byte is forwarded.
                                tokio::select! {
                                    biased;
                                    _ = cut_rx.wait_for(|cut| *cut) => {}
                                    _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
                                }
                            }
                            counted.send_modify(|n| *n -= 1);
                        }
                        .in_current_span(),
                    );
                }
            }
            .instrument(span),
        );
        CuttableLink { url, cut, open, accept }
    }

    /// The URL to give the client instead of the member's.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Cuts the link: open connections close, new ones are dropped. Returns once every
    /// connection has stopped forwarding, so nothing sent after it crosses the link.
    pub async fn cut(&self) {
        self.cut.send_replace(true);
        let _ = self.open.subscribe().wait_for(|n| *n == 0).await;
    }

    /// Restores the link: new connections are forwarded again.
    pub fn restore(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for CuttableLink {
    fn drop(&mut self) {
        self.cut.send_replace(true);
        self.accept.abort();
    }
}
