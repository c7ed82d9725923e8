//! Agent mode propagation benchmark (prints figures; asserts nothing), against a real
//! `meshd server` process:
//!
//! - fan-out through agent caches: `CACHES` agent caches (100) in this process, each with its
//!   own HTTP client and connections, each watching 10 services' health on the server (one of
//!   them, `hot`, watched by all); `hot` gets a new instance; every cache's receipt of it is
//!   timestamped. Printed: p50/p99/max, and the server's CPU per woken blocking query.
//! - one real `meshd agent` with `SIDECARS` local sidecars (20), each with 5 upstreams (one
//!   of them `hot`), and as many synthetic delta ADS streams on the agent's xDS; `hot` gets a
//!   new connect instance at the server; every stream's receipt of the new load assignment is
//!   timestamped. Printed: p50/p99/max and the agent's RSS.
//!
//! Run: `cargo xtask bench agent` (or `cargo bench -p meshd --bench agent_cache`). Scale with
//! `CACHES=`, `SIDECARS=`, `ROUNDS=` (10).
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use agent_cache::types::HealthKey;
use agent_cache::{AgentCaches, CachesConfig};
use api_client::Servers;
use serde_json::json;
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use test_support::ads::{delta_proxy, marker_address, proc_stat};
use test_support::figures::{env_usize, ms, percentile};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const OTHER_SERVICES: usize = 99;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn meshd() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_BIN_EXE_meshd"))
}

/// A write, and the time until its (durable) response.
async fn put(http: &reqwest::Client, url: String, body: serde_json::Value) -> Duration {
    let t0 = Instant::now();
    http.put(url)
        .json(&body)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
    t0.elapsed()
}

#[tokio::main(worker_threads = 2)]
async fn main() {
    let caches_n = env_usize("CACHES", 100);
    let sidecars = env_usize("SIDECARS", 20);
    let rounds = env_usize("ROUNDS", 10);
    let store = test_support::figures::BenchStore::from_env();
    let mut args = store.args();
    args.extend(["-log-level".to_owned(), "error".to_owned()]);
    let server = test_support::process::start_server(meshd(), args);
    let server_pid = server.child.id();
    let _server = Killed(server.child);
    let http = reqwest::Client::new();
    let register = format!("{}/v1/catalog/register", server.http);
    // One instance (with a sidecar) per service, `hot` among them.
    for s in 0..=OTHER_SERVICES {
        let name = if s == 0 {
            "hot".to_owned()
        } else {
            format!("svc-{s:02}")
        };
        put(
            &http,
            register.clone(),
            json!({"Node": format!("svc-node-{s}"), "Address": "10.100.0.1", "Service": {"Service": name, "Port": 8080}}),
        )
        .await;
        put(
            &http,
            register.clone(),
            json!({"Node": format!("svc-node-{s}"), "Address": "10.100.0.1", "Service": {"Kind": "connect-proxy",
                "ID": format!("{name}-sidecar-proxy"), "Service": format!("{name}-sidecar-proxy"), "Port": 21000,
                "Proxy": {"DestinationServiceName": name}}}),
        )
        .await;
    }
    println!(
        "agent mode benchmark (real meshd server process, {}; 2 cores shared with the load generator)",
        store.describe()
    );
    fan_out(&server.http, server_pid, &http, caches_n, rounds).await;
    through_agent(&server.http, &http, sidecars, rounds).await;
}

/// Fan-out through `n` agent caches watching 10 services each.
async fn fan_out(server_http: &str, server_pid: u32, http: &reqwest::Client, n: usize, rounds: usize) {
    let stop = CancellationToken::new();
    let marker = Arc::new(AtomicU64::new(0));
    let (report, mut reports) = mpsc::unbounded_channel::<(Instant, usize)>();
    let (ready, mut readies) = mpsc::unbounded_channel::<()>();
    let mut all = Vec::new();
    for i in 0..n {
        // Its own client and connection (HTTP/2), as a separate agent would have.
        let servers = Arc::new(Servers::multiplexed(&[server_http.to_owned()], None).unwrap());
        let caches = AgentCaches::new(servers, CachesConfig::default(), stop.child_token());
        for k in 0..10 {
            let service = if k == 0 {
                "hot".to_owned()
            } else {
                format!("svc-{:02}", 1 + (i * 9 + k) % OTHER_SERVICES)
            };
            let mut watch = caches.health.watch(&HealthKey {
                datacenter: None,
                service,
                connect: false,
                passing: false,
                token: None,
            });
            if k == 0 {
                let (marker, report, ready) = (Arc::clone(&marker), report.clone(), ready.clone());
                tokio::spawn(async move {
                    let mut told = false;
                    let mut seen = 0;
                    while let Some(Ok(f)) = watch.next().await {
                        if !told {
                            told = true;
                            let _ = ready.send(());
                        }
                        let m = marker.load(Ordering::Acquire);
                        if m != 0 && m != seen && f.value.iter().any(|n| n.node.address == marker_address(m)) {
                            seen = m;
                            let _ = report.send((Instant::now(), i));
                        }
                    }
                });
            } else {
                tokio::spawn(async move { while let Some(Ok(_)) = watch.next().await {} });
            }
        }
        all.push(caches);
    }
    for _ in 0..n {
        readies.recv().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut lat = Vec::new();
    let mut writes = Vec::new();
    let mut cpu = Duration::ZERO;
    for round in 1..=rounds {
        marker.store(round as u64, Ordering::Release);
        let (cpu0, _) = proc_stat(server_pid);
        let t0 = Instant::now();
        let write = put(
            http,
            format!("{server_http}/v1/catalog/register"),
            json!({"Node": format!("hot-extra-{round}"), "Address": marker_address(round as u64),
                "Service": {"Service": "hot", "Port": 8080}}),
        )
        .await;
        writes.push(write);
        let mut got = 0;
        while got < n {
            match tokio::time::timeout(Duration::from_secs(10), reports.recv()).await {
                Ok(Some((at, _))) => {
                    lat.push(at - t0);
                    got += 1;
                }
                _ => {
                    println!("  round {round}: only {got} of {n} caches saw the change within 10 s");
                    break;
                }
            }
        }
        cpu += proc_stat(server_pid).0 - cpu0;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lat.sort();
    println!(
        "  fan-out: {n} agent caches (own client each) x 10 services; endpoint change -> every cache has it ({n} x {rounds}): p50 {}  p99 {}  max {}   [target p99 <= 100 ms]",
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        ms(*lat.last().unwrap())
    );
    println!(
        "  of which the write itself (HTTP register until its durable response): {}",
        test_support::figures::latency_summary(&mut writes)
    );
    println!(
        "  server CPU per change: {} = {:.0} µs per woken blocking query (10 ms CPU-time granularity)",
        ms(cpu / rounds as u32),
        cpu.as_secs_f64() * 1e6 / (rounds * n) as f64
    );
    stop.cancel();
    for caches in all {
        caches.shutdown().await;
    }
}

/// One real agent with `sidecars` local sidecars and as many ADS streams.
async fn through_agent(server_http: &str, http: &reqwest::Client, sidecars: usize, rounds: usize) {
    let dir = tempfile::tempdir().unwrap();
    let services: Vec<_> = (0..sidecars)
        .map(|i| {
            let upstreams: Vec<_> = (0..5)
                .map(|j| {
                    let name = if j == 0 {
                        "hot".to_owned()
                    } else {
                        format!("svc-{:02}", 1 + (i * 4 + j) % OTHER_SERVICES)
                    };
                    json!({"DestinationName": name, "LocalBindPort": 9000 + j})
                })
                .collect();
            json!({"Name": format!("app-{i}"), "Port": 10000 + i, "Connect": {"SidecarService": {
                "Port": 30000 + i, "Proxy": {"Upstreams": upstreams}}}})
        })
        .collect();
    let config = dir.path().join("agent.json");
    std::fs::write(&config, serde_json::to_vec(&json!({"Services": services})).unwrap()).unwrap();
    let agent = test_support::process::start_agent(
        meshd(),
        [
            "-dev",
            "-node",
            "bench-agent",
            "-advertise",
            "127.0.0.1",
            "-retry-join",
            server_http.trim_start_matches("http://"),
            "-log-level",
            "error",
            "-config-file",
            config.to_str().unwrap(),
        ],
    );
    let agent_pid = agent.child.id();
    let _agent = Killed(agent.child);
    let marker = Arc::new(AtomicU64::new(0));
    let (report, mut reports) = mpsc::unbounded_channel();
    let (ready, mut readies) = mpsc::unbounded_channel();
    let gate = Arc::new(tokio::sync::Semaphore::new(sidecars.max(1)));
    let start = Instant::now();
    for i in 0..sidecars {
        let permit = Arc::clone(&gate).acquire_owned().await.unwrap();
        let (grpc, marker, report, ready) = (agent.grpc.clone(), Arc::clone(&marker), report.clone(), ready.clone());
        tokio::spawn(delta_proxy(grpc, i, marker, report, ready, permit, None));
    }
    for _ in 0..sidecars {
        readies.recv().await.unwrap();
    }
    let synced = start.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut lat = Vec::new();
    let mut writes = Vec::new();
    for round in 1..=rounds {
        let round = 1000 + round as u64;
        marker.store(round, Ordering::Release);
        let t0 = Instant::now();
        let write = put(
            http,
            format!("{server_http}/v1/catalog/register"),
            json!({"Node": format!("hot-connect-{round}"), "Address": marker_address(round),
                "Service": {"Kind": "connect-proxy", "ID": format!("hot-sidecar-proxy-{round}"),
                "Service": "hot-sidecar-proxy", "Port": 21000, "Proxy": {"DestinationServiceName": "hot"}}}),
        )
        .await;
        writes.push(write);
        let mut got = 0;
        while got < sidecars {
            match tokio::time::timeout(Duration::from_secs(10), reports.recv()).await {
                Ok(Some((at, _, _))) => {
                    lat.push(at - t0);
                    got += 1;
                }
                _ => {
                    println!("  round {round}: only {got} of {sidecars} streams saw the change within 10 s");
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lat.sort();
    let (_, rss) = proc_stat(agent_pid);
    let (anon, file) = test_support::figures::rss_split_kib(agent_pid);
    println!(
        "  one agent, {sidecars} local sidecars, {sidecars} delta ADS streams (synced in {}): endpoint change at the server -> the agent's streams have it ({sidecars} x {rounds}): p50 {}  p99 {}  max {}   [target p99 <= 150 ms]",
        ms(synced),
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        ms(*lat.last().unwrap())
    );
    println!(
        "  of which the write itself (HTTP register until its durable response): {}",
        test_support::figures::latency_summary(&mut writes)
    );
    println!(
        "  agent RSS with {sidecars} sidecars and streams: {:.1} MiB = {:.1} MB (anonymous {:.1} MiB, file-backed {:.1} MiB)   [target <= 30 MB; Consul's client agent idles near 87 MB]",
        rss as f64 / 1024.0,
        rss as f64 * 1024.0 / 1e6,
        anon as f64 / 1024.0,
        file as f64 / 1024.0
    );
}
