//! Supervisor benchmark (prints figures; see docs/benchmarks.md):
//!
//! 1. hot restart under load: requests at a steady rate (default 500/s, each on a fresh
//!    connection) through a real Envoy while the agent hot-restarts it 20 times; failed
//!    requests and the time from a new config to the new epoch being LIVE;
//! 2. crash to restart: the running Envoy is killed (SIGKILL) and the time until the agent has
//!    a LIVE replacement is measured for the first attempts (back-off 200 ms, 400 ms, ...);
//! 3. the same for a managed daemon (restarted without waiting for its first 3 attempts):
//!    kill to the new process running.
//!
//! Env: MESHD_ENVOY (set by `cargo xtask bench supervisor`), BENCH_RPS, BENCH_RESTARTS.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use common::{Load, bootstrap, envoy_child_pid};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use supervisor::agent::{Agent, AgentOptions};
use supervisor::daemon::{DaemonEvent, DaemonSpec, Manager, ManagerOptions};
use supervisor::envoy::{EnvoyConfig, EnvoyOptions, EnvoyProxy, admin_request, read_admin_address};
use test_support::http::backend;
use test_support::{base_id, envoy, reserve_port as free_port};
use tokio_util::sync::CancellationToken;

fn env_u32(name: &str, default: u32) -> u32 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// Waits (polling every 2 ms) until epoch `epoch` answers LIVE.
async fn until_live(run_dir: &std::path::Path, epoch: u32) {
    let file = run_dir.join(format!("admin-{epoch}.addr"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(addr) = read_admin_address(&file)
            && matches!(admin_request(addr, "GET", "/ready").await, Ok((200, _)))
        {
            return;
        }
        assert!(Instant::now() < deadline, "epoch {epoch} never became live");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rps = env_u32("BENCH_RPS", 500);
    let restarts = env_u32("BENCH_RESTARTS", 20);
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let base = base_id(5);
    let mut o = EnvoyOptions::new(envoy(), base, &run_dir);
    o.drain_time = Duration::from_secs(2);
    o.parent_shutdown_time = Duration::from_secs(3);
    o.extra_args = ["--concurrency", "1", "-l", "error"].map(String::from).to_vec();
    let (agent, handle) = Agent::new(EnvoyProxy::new(o).unwrap(), AgentOptions::default());
    let cancel = CancellationToken::new();
    let task = tokio::spawn(agent.run(cancel.clone()));

    let upstream = backend(Duration::ZERO).await;
    let port = free_port();
    let listen: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    handle
        .set_config(EnvoyConfig(bootstrap(port, upstream, 0)))
        .await
        .unwrap();
    until_live(&run_dir, 0).await;

    println!("hot restart under load: {rps} requests/s (a new connection each), {restarts} hot restarts, 1 s apart");
    let load = Load::start(listen, rps);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut times = Vec::new();
    for epoch in 1..=restarts {
        let t0 = Instant::now();
        handle
            .set_config(EnvoyConfig(bootstrap(port, upstream, epoch)))
            .await
            .unwrap();
        until_live(&run_dir, epoch).await;
        let took = t0.elapsed();
        times.push(took);
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(took)).await;
    }
    let mut status = handle.status();
    tokio::time::timeout(Duration::from_secs(30), status.wait_for(|s| s.running == [restarts]))
        .await
        .expect("old epochs did not exit")
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let errors = load.errors.clone();
    let (ok, failed) = load.finish().await;
    times.sort();
    println!("  requests: {ok} ok, {failed} failed (target 0)");
    for e in errors.lock().iter().take(5) {
        println!("    failure: {e}");
    }
    println!(
        "  config change -> new epoch LIVE: p50 {} / p99 {} / max {}",
        ms(pct(&times, 0.5)),
        ms(pct(&times, 0.99)),
        ms(*times.last().unwrap())
    );
    println!("  epochs started: {} (1 + {restarts})", handle.status().borrow().starts);

    println!("crash to restart (Envoy killed with SIGKILL; agent back-off 200 ms doubling):");
    for attempt in 1..=3 {
        let pid = envoy_child_pid(base);
        let t0 = Instant::now();
        supervisor::process::signal(pid, rustix::process::Signal::KILL).unwrap();
        // After a crash every epoch is aborted and the agent restarts from epoch 0 (whose old
        // address file, if any, answers nothing until the new process writes it).
        until_live(&run_dir, 0).await;
        println!(
            "  attempt {attempt}: LIVE again after {} (target <= 1 s)",
            ms(t0.elapsed())
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    cancel.cancel();
    task.await.unwrap().unwrap();

    println!("crash to restart (managed daemon killed with SIGKILL; first 3 attempts immediate):");
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let mopts = ManagerOptions {
        allow_root: true,
        quiescence: Duration::from_millis(10),
        ..ManagerOptions::new(dir.path().join("daemons"))
    };
    let manager = Manager::start(mopts, rx).unwrap();
    let mut events = manager.events();
    let spec = DaemonSpec {
        command: "sleep".into(),
        args: vec!["1000".into()],
        env: Default::default(),
        token: None,
        sidecar_for: "bench".into(),
    };
    tx.send([("bench-proxy".to_owned(), spec)].into()).await.unwrap();
    let mut pid = loop {
        if let DaemonEvent::Started { pid, .. } = events.recv().await.unwrap() {
            break pid;
        }
    };
    for attempt in 2..=4 {
        let t0 = Instant::now();
        supervisor::process::signal(pid, rustix::process::Signal::KILL).unwrap();
        pid = loop {
            if let DaemonEvent::Started { pid, .. } = events.recv().await.unwrap() {
                break pid;
            }
        };
        let note = if attempt <= 3 {
            "immediate; target <= 1 s"
        } else {
            "by design: 2 s back-off from attempt 4"
        };
        println!(
            "  attempt {attempt}: running again after {:.1} ms ({note})",
            t0.elapsed().as_secs_f64() * 1000.0
        );
    }
    manager.kill().await;
}
