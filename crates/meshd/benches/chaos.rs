//! Chaos (prints figures; asserts nothing): a real `meshd server` on a data dir, `web` and
//! `api` with sidecars run by real Envoys under `meshd connect envoy`, and 200 requests/s
//! from web's upstream listener to api through the mesh for `DURATION_S` (180) seconds.
//! Every `KILL_EVERY_S` (20) seconds the server is killed with SIGKILL and started again from
//! its data dir at the same addresses; meanwhile a writer registers a node every 100 ms, and
//! another changes api's Envoy configuration every 500 ms (a deny intention `probe -> api`
//! written and deleted in turn: api's RBAC changes, web's traffic is not affected). Once the
//! kills are over, api's Envoy must hold the last acknowledged state of that intention, and a
//! last change must reach it: both are timed.
//! Printed: requests sent and failed (target 0 failed), kills, writes acknowledged, and how
//! many acknowledged writes are missing afterwards (target 0).
//!
//! Run: `cargo xtask chaos` (it installs the pinned Envoy).
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use serde_json::json;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use test_support::figures::env_usize;

/// A child stopped (SIGTERM, then SIGKILL) when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        supervisor::process::terminate_blocking(&mut self.0, Duration::from_secs(10));
    }
}

fn meshd() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_meshd"))
}

async fn wait_for<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let t0 = Instant::now();
    while !check().await {
        assert!(t0.elapsed() < Duration::from_secs(60), "{what}: not within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes (`deny`) or deletes the intention `probe -> api`; true once acknowledged.
async fn probe_intention(client: &reqwest::Client, base: &str, deny: bool) -> bool {
    let url = format!("{base}/v1/connect/intentions/exact?source=probe&destination=api");
    let req = if deny {
        client.put(url).json(&json!({"Action": "deny"}))
    } else {
        client.delete(url)
    };
    req.send().await.is_ok_and(|r| r.status().is_success())
}

fn envoy(service: &str, http: &str, grpc: &str, dir: &Path) -> (Proc, std::path::PathBuf) {
    let run_dir = dir.join(service);
    let child = Command::new(meshd())
        .args([
            "connect",
            "envoy",
            "-sidecar-for",
            service,
            "-node",
            &format!("node-{service}"),
        ])
        .args(["-http-addr", http.trim_start_matches("http://"), "-grpc-addr", grpc])
        .args([
            "-admin-bind",
            "127.0.0.1:0",
            "-log-level",
            "warn",
            "-drain-time",
            "1s",
            "-run-dir",
        ])
        .arg(&run_dir)
        .arg("-envoy-binary")
        .arg(test_support::envoy())
        .args(["--", "-l", "error"])
        .spawn()
        .unwrap();
    (Proc(child), run_dir)
}

#[tokio::main(worker_threads = 2)]
async fn main() {
    let duration = Duration::from_secs(env_usize("DURATION_S", 180) as u64);
    let kill_every = Duration::from_secs(env_usize("KILL_EVERY_S", 20) as u64);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let http = format!("127.0.0.1:{}", test_support::reserve_port());
    let grpc = format!("127.0.0.1:{}", test_support::reserve_port());
    let args = ["-data-dir", data.to_str().unwrap(), "-log-level", "error"];
    let start = || test_support::process::start_server_at(meshd(), &http, &grpc, args).child;
    let mut server = Proc(start());
    let base = format!("http://{http}");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();

    let api_port = test_support::http::named_backend("api-1");
    let web_port = test_support::http::named_backend("web");
    let (api_proxy, web_proxy, upstream) = (
        test_support::reserve_port(),
        test_support::reserve_port(),
        test_support::reserve_port(),
    );
    for (service, port, proxy_port, upstreams) in [
        ("api", api_port, api_proxy, json!([])),
        (
            "web",
            web_port,
            web_proxy,
            json!([{"DestinationName": "api", "LocalBindPort": upstream}]),
        ),
    ] {
        let node = format!("node-{service}");
        for svc in [
            json!({"Service": service, "Port": port}),
            json!({"Kind": "connect-proxy", "ID": format!("{service}-sidecar-proxy"), "Service": format!("{service}-sidecar-proxy"),
                   "Port": proxy_port, "Proxy": {"DestinationServiceName": service, "LocalServicePort": port, "Upstreams": upstreams}}),
        ] {
            client
                .put(format!("{base}/v1/catalog/register"))
                .json(&json!({"Node": node, "Address": "127.0.0.1", "Service": svc}))
                .send()
                .await
                .unwrap()
                .error_for_status()
                .unwrap();
        }
    }
    let (_api, api_dir) = envoy("api", &base, &grpc, dir.path());
    let (_web, _) = envoy("web", &base, &grpc, dir.path());
    let target = format!("http://127.0.0.1:{upstream}/");
    wait_for("traffic through the mesh", || async {
        client.get(&target).send().await.is_ok_and(|r| r.status().is_success())
    })
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let (sent, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load = {
        let (stop, sent, failed, client, target) = (
            Arc::clone(&stop),
            Arc::clone(&sent),
            Arc::clone(&failed),
            client.clone(),
            target.clone(),
        );
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            let mut inflight = tokio::task::JoinSet::new();
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let (client, target, sent, failed) =
                    (client.clone(), target.clone(), Arc::clone(&sent), Arc::clone(&failed));
                inflight.spawn(async move {
                    sent.fetch_add(1, Ordering::Relaxed);
                    let ok = client.get(&target).send().await.is_ok_and(|r| r.status().is_success());
                    if !ok {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                });
                while inflight.try_join_next().is_some() {}
            }
            while inflight.join_next().await.is_some() {}
        })
    };
    let acknowledged = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let writer = {
        let (stop, acknowledged, client, base) = (
            Arc::clone(&stop),
            Arc::clone(&acknowledged),
            client.clone(),
            base.clone(),
        );
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let node = format!("ack-{i}");
                let resp = client
                    .put(format!("{base}/v1/catalog/register"))
                    .json(&json!({"Node": node, "Address": "10.9.0.1"}))
                    .send()
                    .await;
                if resp.is_ok_and(|r| r.status().is_success()) {
                    acknowledged.lock().push(node);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    // api's Envoy's configuration changes throughout: the intention probe -> api is denied and
    // deleted in turn; `state` is the last acknowledged one (true: the deny is there).
    let state = Arc::new(AtomicBool::new(false));
    let toggles = Arc::new(AtomicU64::new(0));
    let toggler = {
        let (stop, state, toggles, client, base) = (
            Arc::clone(&stop),
            Arc::clone(&state),
            Arc::clone(&toggles),
            client.clone(),
            base.clone(),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let deny = !state.load(Ordering::Relaxed);
                if probe_intention(&client, &base, deny).await {
                    state.store(deny, Ordering::Relaxed);
                    toggles.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };

    let t0 = Instant::now();
    let mut kills = 0;
    while t0.elapsed() + kill_every <= duration {
        tokio::time::sleep(kill_every).await;
        server.0.kill().unwrap();
        server.0.wait().unwrap();
        kills += 1;
        server = Proc(start());
    }
    tokio::time::sleep(duration.saturating_sub(t0.elapsed())).await;
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    writer.await.unwrap();
    toggler.await.unwrap();

    // After the last restart: api's Envoy holds the last acknowledged state, and a new change
    // reaches it.
    let admin = format!(
        "http://{}",
        std::fs::read_to_string(api_dir.join("admin-0.addr")).unwrap().trim()
    );
    let holds = |deny: bool| {
        let (client, admin) = (client.clone(), admin.clone());
        async move {
            let dump = client
                .get(format!("{admin}/config_dump?resource=dynamic_listeners"))
                .send()
                .await;
            let Ok(dump) = dump else { return false };
            dump.text().await.is_ok_and(|t| t.contains("/svc/probe$") == deny)
        }
    };
    let synced = Instant::now();
    let last = state.load(Ordering::Relaxed);
    wait_for("api's Envoy holding the last acknowledged intention", || holds(last)).await;
    let synced = synced.elapsed();
    let changed = Instant::now();
    wait_for("a last change written", || probe_intention(&client, &base, !last)).await;
    wait_for("the last change reaching api's Envoy", || holds(!last)).await;
    let changed = changed.elapsed();

    let nodes: Vec<serde_json::Value> = client
        .get(format!("{base}/v1/catalog/nodes"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let present: std::collections::HashSet<String> = nodes
        .iter()
        .filter_map(|n| n["Node"].as_str().map(str::to_owned))
        .collect();
    let acknowledged = acknowledged.lock().clone();
    let missing = acknowledged.iter().filter(|n| !present.contains(*n)).count();
    println!(
        "chaos: {} s of web -> api through real Envoys at 200 requests/s, the server killed (SIGKILL) every {} s and restarted from its data dir",
        duration.as_secs(),
        kill_every.as_secs()
    );
    println!(
        "  requests: {} sent, {} failed   [target 0]; server kills: {kills}",
        sent.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    );
    println!(
        "  writes: {} acknowledged, {missing} missing afterwards   [target 0]",
        acknowledged.len()
    );
    println!(
        "  api's configuration changed {} times during the kills; its Envoy held the last acknowledged state {} ms after the kills ended, and a last change reached it in {} ms",
        toggles.load(Ordering::Relaxed),
        synced.as_millis(),
        changed.as_millis()
    );
    drop(server);
}
