//! The agent driving the real, pinned Envoy: hot restarts under traffic with zero failed
//! requests, a graceful drain that lets in-flight requests finish, a crash restarted, stale
//! shared memory cleaned before epoch 0, and the admin and hot-restart sockets kept private.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::{Load, bootstrap, envoy_child_pid, wait_for};
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use supervisor::agent::{Agent, AgentError, AgentHandle, AgentOptions};
use supervisor::envoy::{AdminAddr, EnvoyConfig, EnvoyOptions, EnvoyProxy, admin_request, read_admin_address};
use test_support::http::{backend, get};
use test_support::{base_id, envoy, reserve_port as free_port};
use tokio_util::sync::CancellationToken;

struct Running {
    handle: AgentHandle<EnvoyConfig>,
    task: tokio::task::JoinHandle<Result<(), AgentError>>,
    cancel: CancellationToken,
    run_dir: PathBuf,
    base: u32,
}

fn start(dir: &Path, slot: u32, agent_opts: AgentOptions) -> Running {
    let base = base_id(slot);
    let run_dir = dir.join("run");
    let mut o = EnvoyOptions::new(envoy(), base, &run_dir);
    o.drain_time = Duration::from_secs(1);
    o.parent_shutdown_time = Duration::from_secs(2);
    o.extra_args = ["--concurrency", "1", "-l", "error"].map(String::from).to_vec();
    o.log_file = Some(dir.join("envoy.log"));
    let (agent, handle) = Agent::new(EnvoyProxy::new(o).unwrap(), agent_opts);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(agent.run(cancel.clone()));
    Running {
        handle,
        task,
        cancel,
        run_dir,
        base,
    }
}

impl Running {
    fn admin(&self, epoch: u32) -> Option<AdminAddr> {
        read_admin_address(&self.run_dir.join(format!("admin-{epoch}.addr")))
    }

    async fn server_info(&self, epoch: u32) -> Option<serde_json::Value> {
        let (code, body) = admin_request(self.admin(epoch)?, "GET", "/server_info").await.ok()?;
        (code == 200).then(|| serde_json::from_str(&body).ok()).flatten()
    }

    async fn wait_live(&self, epoch: u32) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !self.server_info(epoch).await.is_some_and(|i| i["state"] == "LIVE") {
            if tokio::time::Instant::now() > deadline {
                let log = std::fs::read_to_string(self.run_dir.with_file_name("envoy.log")).unwrap_or_default();
                panic!(
                    "epoch {epoch} not live in 20 s; agent {:?}; envoy log:\n{log}",
                    self.handle.status().borrow()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn wait_running(&self, want: &[u32]) {
        let mut status = self.handle.status();
        tokio::time::timeout(Duration::from_secs(20), status.wait_for(|s| s.running == want))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "running epochs never became {want:?}: {:?}",
                    self.handle.status().borrow()
                )
            })
            .unwrap();
    }

    async fn stop(self) {
        self.cancel.cancel();
        self.task.await.unwrap().unwrap();
        let _ = supervisor::envoy::clean_stale_shared_memory(self.base);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_restarts_zero_one_two_under_traffic_fail_no_request() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = backend(Duration::ZERO).await;
    let port = free_port();
    let listen: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let r = start(dir.path(), 0, AgentOptions::default());
    r.handle
        .set_config(EnvoyConfig(bootstrap(port, upstream, 0)))
        .await
        .unwrap();
    r.wait_live(0).await;
    assert_eq!(get(listen, "/").await, Ok(200));

    let load = Load::start(listen, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    for epoch in 1..=2 {
        r.handle
            .set_config(EnvoyConfig(bootstrap(port, upstream, epoch)))
            .await
            .unwrap();
        r.wait_live(epoch).await;
        let info = r.server_info(epoch).await.unwrap();
        assert_eq!(info["command_line_options"]["restart_epoch"], epoch);
        assert_eq!(info["command_line_options"]["base_id"], r.base.to_string());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The parents drain and exit on their own (exit 0: a normal end, no restart).
    r.wait_running(&[2]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let errors = load.errors.clone();
    let (ok, failed) = load.finish().await;
    assert_eq!(failed, 0, "failed requests across hot restarts: {:?}", errors.lock());
    assert!(ok > 300, "only {ok} requests went through");
    let status = r.handle.status().borrow().clone();
    assert_eq!(status.starts, 3, "exactly three epochs started: {status:?}");
    // Stats carried over: uptime across epochs exceeds this epoch's.
    let info = r.server_info(2).await.unwrap();
    let secs = |k: &str| info[k].as_str().unwrap().trim_end_matches('s').parse::<u64>().unwrap();
    assert!(secs("uptime_all_epochs") > secs("uptime_current_epoch"), "{info}");
    let admin = r.admin(2).unwrap();
    r.stop().await;
    assert!(
        admin_request(admin, "GET", "/ready").await.is_err(),
        "envoy still answers after the agent stopped"
    );
    assert!(
        std::fs::read_dir(dir.path().join("run")).unwrap().next().is_none(),
        "run dir cleaned up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_drain_lets_in_flight_requests_complete() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = backend(Duration::from_millis(1500)).await;
    let port = free_port();
    let listen: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let opts = AgentOptions {
        // Long enough that Envoy's own 1 s drain, the in-flight request and the admin reads
        // below fit in it on a loaded machine.
        drain_period: Duration::from_secs(8),
        ..AgentOptions::default()
    };
    let r = start(dir.path(), 1, opts);
    r.handle
        .set_config(EnvoyConfig(bootstrap(port, upstream, 0)))
        .await
        .unwrap();
    r.wait_live(0).await;
    let slow = tokio::spawn(get(listen, "/slow"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = tokio::time::Instant::now();
    r.handle.drain().await.unwrap();
    // Envoy is draining: its listener closes gracefully, the in-flight request finishes.
    assert_eq!(slow.await.unwrap(), Ok(200), "the in-flight request was cut");
    let admin = r.admin(0).unwrap();
    // Envoy's own drain time (1 s) ends with its listener stopped, while the process (its
    // admin) lives on until the agent's drain period is over.
    wait_for(Duration::from_secs(6), "the listener stopped", async || {
        let stats = admin_request(&admin, "GET", "/stats?filter=listener_manager.listener_stopped").await;
        stats.is_ok_and(|(_, body)| body.contains("listener_stopped: 1"))
    })
    .await;
    assert!(t0.elapsed() < Duration::from_secs(8));
    assert_eq!(admin_request(&admin, "GET", "/ready").await.unwrap().0, 200);
    r.task.await.unwrap().unwrap();
    assert!(
        t0.elapsed() >= Duration::from_secs(8),
        "stopped before the drain period ended"
    );
    assert!(admin_request(admin, "GET", "/ready").await.is_err());
    let _ = supervisor::envoy::clean_stale_shared_memory(r.base);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_envoy_is_restarted_and_stale_shared_memory_is_removed_first() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = backend(Duration::ZERO).await;
    let port = free_port();
    let listen: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let base = base_id(2);
    // Left behind by an earlier Envoy with this base id.
    let shm = PathBuf::from(format!("/dev/shm/envoy_shared_memory_{}", u64::from(base) * 10));
    std::fs::write(&shm, vec![7u8; 4096]).unwrap();
    let stale_inode = std::fs::metadata(&shm).unwrap().ino();
    let r = start(dir.path(), 2, AgentOptions::default());
    r.handle
        .set_config(EnvoyConfig(bootstrap(port, upstream, 0)))
        .await
        .unwrap();
    r.wait_live(0).await;
    assert_ne!(
        std::fs::metadata(&shm).unwrap().ino(),
        stale_inode,
        "stale shared memory was reused"
    );

    // Kill the running Envoy: an unexpected exit; restarted at epoch 0 after 200 ms.
    let envoy_pid = envoy_child_pid(base_id(2));
    supervisor::process::signal(envoy_pid, rustix::process::Signal::KILL).unwrap();
    let t0 = tokio::time::Instant::now();
    wait_for(Duration::from_secs(20), "restarted envoy", async || {
        get(listen, "/").await == Ok(200)
    })
    .await;
    // The exact back-off (200 ms here) is the paused-time tests' to check; this one only
    // tells a prompt restart from the long back-off of a crash loop.
    let restarted = t0.elapsed();
    assert!(restarted < Duration::from_secs(15), "restart took {restarted:?}");
    assert_eq!(r.handle.status().borrow().starts, 2);
    assert_ne!(envoy_child_pid(base_id(2)), envoy_pid);
    r.stop().await;
}

/// `bootstrap` with the admin interface on a Unix socket at `socket`.
fn with_admin_socket(bootstrap: &str, socket: &Path) -> EnvoyConfig {
    let mut json: serde_json::Value = serde_json::from_str(bootstrap).unwrap();
    json["admin"]["address"] = serde_json::json!({"pipe": {"path": socket, "mode": 0o600}});
    EnvoyConfig(json.to_string())
}

fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(meta.file_type().is_socket(), "{} is no socket", path.display());
    meta.permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_and_hot_restart_sockets_are_private_files_across_a_hot_restart() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = backend(Duration::ZERO).await;
    let port = free_port();
    let listen: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let r = start(dir.path(), 3, AgentOptions::default());
    let socket = r.run_dir.join("admin.sock");
    r.handle
        .set_config(with_admin_socket(&bootstrap(port, upstream, 0), &socket))
        .await
        .unwrap();
    r.wait_live(0).await;
    assert_eq!(r.admin(0), Some(AdminAddr::Unix(socket.clone())));
    assert_eq!(mode_of(&socket), 0o600);
    // Epochs talk over files of the run dir, not Envoy's default abstract sockets, which
    // anyone on the host could send a terminate request (or ask for the listen sockets).
    let id = u64::from(r.base) * 10;
    for role in ["parent", "child"] {
        assert_eq!(mode_of(&r.run_dir.join(format!("hot-restart_{role}_{id}"))), 0o600);
    }
    let abstract_sockets: Vec<String> = std::fs::read_to_string("/proc/net/unix")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        // Abstract names show with a leading `@`, padded with `@` for their NULs.
        .filter(|name| name.starts_with('@') && name.trim_end_matches('@').ends_with(&format!("_{id}")))
        .map(str::to_owned)
        .collect();
    assert!(
        abstract_sockets.is_empty(),
        "abstract hot-restart sockets: {abstract_sockets:?}"
    );

    // A hot restart binds the same admin path: the new epoch answers there.
    r.handle
        .set_config(with_admin_socket(&bootstrap(port, upstream, 1), &socket))
        .await
        .unwrap();
    r.wait_live(1).await;
    let info = r.server_info(1).await.unwrap();
    assert_eq!(info["command_line_options"]["restart_epoch"], 1);
    assert_eq!(r.admin(1), Some(AdminAddr::Unix(socket.clone())));
    assert_eq!(mode_of(&socket), 0o600);
    assert_eq!(get(listen, "/").await, Ok(200));
    r.wait_running(&[1]).await;
    let run_dir = r.run_dir.clone();
    r.stop().await;
    let left: Vec<_> = std::fs::read_dir(&run_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left in the run dir: {left:?}");
}
