//! Managed proxies under agent restarts (prints figures; asserts nothing): a real `meshd
//! server`, one real `meshd agent` (data dir, `-managed-sidecars`) running `PROXIES` (20)
//! real Envoys — `app-0` calls the 19 others through its upstreams — and `RATE` (500)
//! requests/s through them while the agent is restarted `RESTARTS` (10) times, alternately with
//! SIGTERM and SIGKILL. Printed: failed requests (target 0), the time from each agent start to
//! every proxy re-adopted, and the processes left over (target 0).
//!
//! Run: `cargo xtask bench supervisor` (it installs the pinned Envoy), or
//! `MESHD_ENVOY=... cargo bench -p meshd --bench managed`.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use serde_json::{Value, json};
use std::path::Path;
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use test_support::figures::{env_usize, ms, percentile};

fn meshd() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_meshd"))
}

/// Processes whose command line names `dir` (this run's agent data dir): its proxies.
fn processes_under(dir: &Path) -> Vec<u32> {
    let needle = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .map(|procs| {
            procs
                .filter_map(Result::ok)
                .filter_map(|p| {
                    let pid = p.file_name().to_str()?.parse::<u32>().ok()?;
                    let cmdline = std::fs::read(p.path().join("cmdline")).ok()?;
                    String::from_utf8_lossy(&cmdline).contains(&needle).then_some(pid)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn stop(child: &mut Child, kill: bool) {
    if kill {
        let _ = child.kill();
        let _ = child.wait();
    } else {
        supervisor::process::terminate_blocking(child, Duration::from_secs(10));
    }
}

#[tokio::main(worker_threads = 2)]
async fn main() {
    let proxies = env_usize("PROXIES", 20).max(2);
    let rate = env_usize("RATE", 500).max(1);
    let restarts = env_usize("RESTARTS", 10);
    let envoy = test_support::envoy();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("agent");
    let store = test_support::figures::BenchStore::from_env();
    let mut server_args = store.args();
    server_args.extend(["-log-level".to_owned(), "error".to_owned()]);
    let mut server = test_support::process::start_server(meshd(), server_args);
    let (http, grpc) = (
        format!("127.0.0.1:{}", test_support::reserve_port()),
        format!("127.0.0.1:{}", test_support::reserve_port()),
    );
    let args: Vec<String> = [
        "-node",
        "bench-node",
        "-advertise",
        "127.0.0.1",
        "-retry-join",
        server.http.trim_start_matches("http://"),
        "-managed-sidecars",
        "-allow-managed-root",
        "-leave-on-terminate=false",
        "-log-level",
        "error",
        "-data-dir",
        data.to_str().unwrap(),
        "-envoy-binary",
        envoy.to_str().unwrap(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let start_agent = || test_support::process::start_agent_at(meshd(), &http, &grpc, &args).child;
    let mut agent = start_agent();
    let client = reqwest::Client::new();
    let agent_url = format!("http://{http}");
    let upstream_ports: Vec<u16> = (1..proxies).map(|_| test_support::reserve_port()).collect();
    for i in 0..proxies {
        let backend = test_support::http::named_backend(Box::leak(format!("app-{i}").into_boxed_str()));
        let upstreams: Vec<Value> = if i == 0 {
            (1..proxies)
                .map(|j| json!({"DestinationName": format!("app-{j}"), "LocalBindPort": upstream_ports[j - 1]}))
                .collect()
        } else {
            Vec::new()
        };
        let body = json!({"Name": format!("app-{i}"), "Port": backend, "Connect": {"SidecarService": {
            "Port": test_support::reserve_port(), "Proxy": {"Upstreams": upstreams}}}});
        client
            .put(format!("{agent_url}/v1/agent/service/register"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .error_for_status()
            .unwrap();
    }
    // Every upstream answers through the mesh.
    let started = Instant::now();
    for port in &upstream_ports {
        let url = format!("http://127.0.0.1:{port}/");
        loop {
            let ok = client.get(&url).timeout(Duration::from_secs(2)).send().await;
            if ok.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(180), "the mesh did not come up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let up = started.elapsed();
    let expected_processes = processes_under(&data).len();
    println!(
        "managed proxies benchmark: {proxies} managed Envoys on one agent ({expected_processes} processes: the agent, its proxies and their Envoys; {}), all answering after {}",
        store.describe(),
        ms(up)
    );

    // Load: RATE requests/s spread over app-0's upstreams.
    let stop_load = Arc::new(AtomicBool::new(false));
    let load = {
        let stop_load = Arc::clone(&stop_load);
        let urls: Vec<String> = upstream_ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}/"))
            .collect();
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate as u64));
            let (mut ok, mut failed, mut i) = (0u64, 0u64, 0usize);
            let mut inflight = tokio::task::JoinSet::new();
            while !stop_load.load(Ordering::Relaxed) {
                tick.tick().await;
                let req = client.get(&urls[i % urls.len()]).timeout(Duration::from_secs(5)).send();
                i += 1;
                inflight.spawn(async move { req.await.is_ok_and(|r| r.status().is_success()) });
                while let Some(done) = inflight.try_join_next() {
                    if done.unwrap_or(false) { ok += 1 } else { failed += 1 }
                }
            }
            while let Some(done) = inflight.join_next().await {
                if done.unwrap_or(false) { ok += 1 } else { failed += 1 }
            }
            (ok, failed)
        })
    };

    let ids: Vec<String> = (0..proxies).map(|i| format!("app-{i}-sidecar-proxy")).collect();
    let mut readopt = Vec::new();
    for round in 0..restarts {
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop(&mut agent, round % 2 == 1);
        let t0 = Instant::now();
        agent = start_agent();
        // Until every proxy is running and re-adopted.
        loop {
            let mut adopted = 0;
            for id in &ids {
                let v: Option<Value> = async {
                    let r = client
                        .get(format!("{agent_url}/v1/agent/connect/proxy/{id}"))
                        .send()
                        .await
                        .ok()?;
                    r.json().await.ok()
                }
                .await;
                if v.is_some_and(|v| v["Status"]["State"] == "running" && v["Status"]["Adopted"] == true) {
                    adopted += 1;
                }
            }
            if adopted == ids.len() {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "round {round}: only {adopted} re-adopted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        readopt.push(t0.elapsed());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_load.store(true, Ordering::Relaxed);
    let (ok, failed) = load.await.unwrap();
    let after_restarts = processes_under(&data).len();
    readopt.sort();
    println!(
        "  {restarts} agent restarts (SIGTERM and SIGKILL alternately) under {rate} requests/s: {ok} ok, {failed} failed   [target 0 failed]"
    );
    println!(
        "  agent start -> all {proxies} proxies re-adopted: p50 {}  max {}",
        ms(percentile(&readopt, 0.5)),
        ms(*readopt.last().unwrap())
    );

    // Everything deregistered, then the agent stopped: nothing may be left.
    for i in 0..proxies {
        let _ = client
            .put(format!("{agent_url}/v1/agent/service/deregister/app-{i}"))
            .send()
            .await;
    }
    let t0 = Instant::now();
    let agent_pid = agent.id();
    while processes_under(&data).iter().any(|p| *p != agent_pid) && t0.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop(&mut agent, false);
    let left = processes_under(&data);
    println!(
        "  processes after the restarts: {after_restarts} (as before: {expected_processes}); left after deregistering everything: {}   [target 0]",
        left.len()
    );
    for pid in left {
        let _ = supervisor::process::signal(pid, rustix::process::Signal::KILL);
    }
    supervisor::process::terminate_blocking(&mut server.child, Duration::from_secs(10));
}
