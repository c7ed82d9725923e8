//! Server benchmark (prints figures; asserts nothing): durable write throughput, waking
//! 10,000 blocking queries with one write, and server RSS with 10,000 services.
//!
//! Run: `cargo xtask bench server` (or `cargo bench -p meshd --bench server`; `ONLY=dashboard`
//! runs only the dashboard's page load, with `UI_SERVICES=` services, 1000 by default).
//! Scale with `WRITES=` (20000), `WRITERS=` (64), `WAITERS=` (10000), `SERVICES=` (10000).
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use catalog::{IndexKey, Op, Store, StoreConfig};
use std::process::Child;
use std::time::{Duration, Instant};
use structs::{NodeService, RegisterRequest};
use test_support::figures::{env_usize, ms, percentile, pin};

struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(data_dir: &std::path::Path) -> Server {
        let started = test_support::process::start_server(
            std::path::Path::new(env!("CARGO_BIN_EXE_meshd")),
            [
                std::ffi::OsStr::new("-log-level"),
                "warn".as_ref(),
                "-data-dir".as_ref(),
                data_dir.as_os_str(),
            ],
        );
        Server {
            child: started.child,
            url: started.http,
        }
    }

    fn rss_kib(&self) -> u64 {
        test_support::figures::rss_kib(self.child.id())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (user, system) CPU time of a process from its `stat` file (clock ticks of 10 ms).
fn cpu_split(stat_path: &str) -> (Duration, Duration) {
    let stat = std::fs::read_to_string(stat_path).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let tick = |i: usize| Duration::from_millis(fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) * 10);
    (tick(11), tick(12))
}

/// user + system CPU time of a process.
fn cpu_of(stat_path: &str) -> Duration {
    let (user, system) = cpu_split(stat_path);
    user + system
}

fn registration(i: usize) -> RegisterRequest {
    RegisterRequest {
        node: format!("node-{}", i / 10),
        address: format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255),
        service: Some(NodeService {
            service: format!("svc-{}", i % 1000),
            id: format!("svc-{i}"),
            port: 8080,
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn store_writes(writes: usize, writers: usize) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig {
        data_dir: Some(dir.path().to_owned()),
        ..StoreConfig::default()
    })
    .await
    .unwrap();
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..writers {
        let store = store.clone();
        tasks.spawn(async move {
            let mut took = Vec::new();
            let mut i = w;
            while i < writes {
                let t0 = Instant::now();
                store.write(Op::Register(Box::new(registration(i)))).await.unwrap();
                took.push(t0.elapsed());
                i += writers;
            }
            took
        });
    }
    let mut took = Vec::with_capacity(writes);
    while let Some(Ok(mine)) = tasks.join_next().await {
        took.extend(mine);
    }
    let elapsed = start.elapsed();
    println!(
        "  in-process store: {writes} durable registrations from {writers} concurrent writers in {} = {:.0} writes/s   [target >= 5000/s]; each write {} (snapshots every 10,000 records on the way)",
        ms(elapsed),
        writes as f64 / elapsed.as_secs_f64(),
        test_support::figures::latency_summary(&mut took)
    );
    // A quiet writer past the next snapshot (one write at a time, as an operator's or an
    // agent's): the snapshot of everything written above must not stall it.
    let mut quiet = Vec::new();
    for i in 0..10_500 {
        let t0 = Instant::now();
        store
            .write(Op::Register(Box::new(registration(writes + i))))
            .await
            .unwrap();
        quiet.push(t0.elapsed());
    }
    println!(
        "  in-process store: one writer, 10,500 writes across a snapshot of {} registrations: {}   [a stall is > 20 ms]",
        writes + 10_500,
        test_support::figures::latency_summary(&mut quiet)
    );
    store.close().await;
}

async fn http_writes(server: &Server, writes: usize, writers: usize) {
    let client = reqwest::Client::new();
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..writers {
        let (client, url) = (client.clone(), server.url.clone());
        tasks.spawn(async move {
            let mut i = w;
            while i < writes {
                let resp = client
                    .put(format!("{url}/v1/catalog/register"))
                    .json(&registration(i))
                    .send()
                    .await
                    .unwrap();
                assert!(resp.status().is_success());
                i += writers;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = start.elapsed();
    println!(
        "  over HTTP (real meshd server, data dir): {writes} registrations from {writers} concurrent clients in {} = {:.0} writes/s   [target >= 5000/s]",
        ms(elapsed),
        writes as f64 / elapsed.as_secs_f64()
    );
}

async fn store_wakeups(waiters: usize) {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    store.write(Op::Register(Box::new(registration(0)))).await.unwrap();
    let key = IndexKey::Service("svc-0".into());
    let after = store.read().index_of(&key);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..waiters {
        let (store, key, tx) = (store.clone(), key.clone(), tx.clone());
        tokio::spawn(async move {
            store.wait(&key, after, Duration::from_secs(600)).await;
            let _ = tx.send(Instant::now());
        });
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    store.write(Op::Register(Box::new(registration(1000)))).await.unwrap();
    let mut lat: Vec<Duration> = Vec::with_capacity(waiters);
    for _ in 0..waiters {
        lat.push(rx.recv().await.unwrap() - t0);
    }
    lat.sort();
    println!(
        "  in-process: {waiters} waits on one service woken by one write: p50 {}  p99 {}  max {}   [target p99 <= 50 ms]",
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        ms(*lat.last().unwrap())
    );
    store.close().await;
}

/// The HTTP wake-up twice: both processes on both cores, then the server pinned to CPU 0
/// and this load generator to CPU 1 (each alone on its core).
async fn http_wakeups_both(server: &Server, waiters: usize) {
    let how = "unpinned, 2 cores shared";
    if let Some(answer) = http_wakeups(server, waiters, "wake", how).await {
        floor_wakeups(waiters, answer, how, None).await;
    }
    let me = std::process::id();
    if !(pin(server.child.id(), "0") && pin(me, "1")) {
        println!("  over HTTP, pinned: not measured, `taskset` could not pin the processes");
        return;
    }
    let how = "server pinned to CPU 0, load generator to CPU 1";
    if let Some(answer) = http_wakeups(server, waiters, "wake-pinned", how).await {
        floor_wakeups(waiters, answer, how, Some("0")).await;
    }
    pin(server.child.id(), "0,1");
    pin(me, "0,1");
}

/// The floor of the same wake-up on this machine ([`test_support::http::WakeFloor`]: one
/// task writing one pre-encoded answer to every parked connection), `answer` being meshd's
/// answer replayed, the floor's process pinned to `cpus` when given.
async fn floor_wakeups(waiters: usize, answer: Vec<u8>, how: &str, cpus: Option<&str>) {
    let mut floor = test_support::http::WakeFloor::start(waiters);
    if let Some(cpus) = cpus
        && !pin(floor.pid(), cpus)
    {
        println!("  floor ({how}): not measured, `taskset` could not pin it");
        return;
    }
    let mut rx = test_support::http::park_waiters(&floor.addr.to_string(), "/floor", waiters);
    let (mut floor, parked) = tokio::task::spawn_blocking(move || {
        let parked = floor.wait_parked();
        (floor, parked)
    })
    .await
    .unwrap();
    if !parked {
        println!("  floor ({how}): the floor server ended before {waiters} connections parked; skipping");
        return;
    }
    let stat = format!("/proc/{}/stat", floor.pid());
    let (floor_cpu0, generator_cpu0) = (cpu_of(&stat), cpu_of("/proc/self/stat"));
    let t0 = Instant::now();
    floor.wake(&answer);
    let mut lat = Vec::with_capacity(waiters);
    let mut open = Vec::with_capacity(waiters);
    for _ in 0..waiters {
        let woken = rx.recv().await.unwrap();
        lat.push(woken.first - t0);
        open.push(woken.conn);
    }
    let floor_cpu = cpu_of(&stat) - floor_cpu0;
    let generator_cpu = cpu_of("/proc/self/stat") - generator_cpu0;
    drop(open);
    lat.sort();
    println!(
        "  floor ({how}): meshd's answer written to {waiters} parked connections in one pass, time to first response byte: p50 {}  p99 {}  max {}; its CPU {:.1} µs per connection, load generator {}",
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        ms(*lat.last().unwrap()),
        floor_cpu.as_secs_f64() * 1e6 / waiters as f64,
        ms(generator_cpu)
    );
}

/// Times one wake-up of `waiters` parked queries; returns meshd's answer (head and body, as
/// a client reads it) for the floor to replay.
async fn http_wakeups(server: &Server, waiters: usize, service: &str, how: &str) -> Option<Vec<u8>> {
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let url = server.url.clone();
    // One instance of a service nobody else touches; the waking write adds a second.
    let first = RegisterRequest {
        node: format!("{service}-1"),
        address: "10.200.0.1".into(),
        service: Some(NodeService {
            service: service.into(),
            port: 8080,
            ..Default::default()
        }),
        ..Default::default()
    };
    client
        .put(format!("{url}/v1/catalog/register"))
        .json(&first)
        .send()
        .await
        .unwrap();
    let resp = client
        .get(format!("{url}/v1/health/service/{service}"))
        .send()
        .await
        .unwrap();
    let index: u64 = resp.headers()["x-consul-index"].to_str().unwrap().parse().unwrap();
    let host = url.trim_start_matches("http://").to_owned();
    let mut rx = test_support::http::park_waiters(
        &host,
        &format!("/v1/health/service/{service}?index={index}&wait=5m"),
        waiters,
    );
    // Wait until every query is parked on the server.
    let ready = Instant::now();
    while (test_support::process::metric(&client, &url, "meshd_http_blocking_queries ").await as usize) < waiters {
        if ready.elapsed() > Duration::from_secs(120) {
            println!(
                "  over HTTP: only {} of {waiters} blocking queries got parked; skipping",
                test_support::process::metric(&client, &url, "meshd_http_blocking_queries ").await
            );
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let server_stat = format!("/proc/{}/stat", server.child.id());
    let (server_split0, client_cpu0) = (cpu_split(&server_stat), cpu_of("/proc/self/stat"));
    let t0 = Instant::now();
    let second = RegisterRequest {
        node: format!("{service}-2"),
        address: "10.200.0.2".into(),
        ..first
    };
    let resp = client
        .put(format!("{url}/v1/catalog/register"))
        .json(&second)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    let mut lat = Vec::with_capacity(waiters);
    let mut lat_last = Vec::with_capacity(waiters);
    let mut open = Vec::with_capacity(waiters);
    let mut woken_with_new_index = 0;
    for _ in 0..waiters {
        let woken = rx.recv().await.unwrap();
        open.push(woken.conn);
        lat.push(woken.first - t0);
        lat_last.push(woken.last - t0);
        if woken.index.is_some_and(|i| i > index) {
            woken_with_new_index += 1;
        }
    }
    let server_split = cpu_split(&server_stat);
    let (server_user, server_system) = (server_split.0 - server_split0.0, server_split.1 - server_split0.1);
    let client_cpu = cpu_of("/proc/self/stat") - client_cpu0;
    drop(open);
    lat.sort();
    println!(
        "  over HTTP ({how}): CPU during the wake-up: server {} user + {} system = {:.1} µs per woken query [target <= 10 µs], load generator {}",
        ms(server_user),
        ms(server_system),
        (server_user + server_system).as_secs_f64() * 1e6 / waiters as f64,
        ms(client_cpu)
    );
    println!(
        "  over HTTP ({how}): {waiters} blocking GET /v1/health/service woken by one write ({woken_with_new_index} saw the new index), time to first response byte: p50 {}  p99 {}  max {}   [target p99 <= 50 ms]",
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        ms(*lat.last().unwrap())
    );
    println!(
        "  over HTTP ({how}): time to the last response byte: {}   [target p99 <= 100 ms]",
        test_support::figures::latency_summary(&mut lat_last)
    );
    let addr = host.parse().ok()?;
    let answer = test_support::http::exchange(addr, &format!("/v1/health/service/{service}"), &[])
        .await
        .ok()?;
    // As a kept-alive connection receives it: without the `Connection: close` asked here.
    let head: Vec<&str> = answer
        .head
        .lines()
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    Some(format!("{}\r\n\r\n{}", head.join("\r\n"), answer.body).into_bytes())
}

/// The dashboard's first page with `n` services (one instance each): the page, its script
/// and style, and the services summary it fetches, as a browser loads them; server time is
/// measured from the request to the last byte of each answer (loopback).
async fn dashboard(n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let client = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let (client, url) = (client.clone(), server.url.clone());
        tasks.spawn(async move {
            let body = serde_json::json!({"Node": format!("ui-node-{}", i % 100), "Address": "10.0.0.1",
                "Service": {"Service": format!("svc-{i:04}"), "ID": format!("svc-{i:04}"), "Port": 8080},
                "Check": {"CheckID": format!("svc-{i:04}-alive"), "Name": "alive", "Status": "passing", "ServiceID": format!("svc-{i:04}")}});
            let resp = client.put(format!("{url}/v1/catalog/register")).json(&body).send().await.unwrap();
            assert!(resp.status().is_success());
        });
        if tasks.len() >= 32 {
            tasks.join_next().await;
        }
    }
    while tasks.join_next().await.is_some() {}
    let mut loads = Vec::new();
    let mut summary = Vec::new();
    for _ in 0..20 {
        let t0 = Instant::now();
        for path in ["/ui", "/ui/app.js", "/ui/style.css"] {
            let _ = client
                .get(format!("{}{path}", server.url))
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
        }
        let t1 = Instant::now();
        let list: Vec<serde_json::Value> = client
            .get(format!("{}/v1/internal/ui/services", server.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(list.len(), n);
        summary.push(t1.elapsed());
        loads.push(t0.elapsed());
    }
    loads.sort();
    summary.sort();
    println!(
        "  dashboard services page with {n} services (page, script, style, then the services summary): p50 {}  max {}; the summary alone p50 {}   [target <= 300 ms]",
        ms(percentile(&loads, 0.5)),
        ms(*loads.last().unwrap()),
        ms(percentile(&summary, 0.5))
    );
}

fn main() {
    if test_support::http::serve_wake_floor_if_asked() {
        return;
    }
    let writes = env_usize("WRITES", 20_000);
    let writers = env_usize("WRITERS", 64);
    let waiters = env_usize("WAITERS", 10_000);
    let services = env_usize("SERVICES", 10_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        println!("server benchmark (2-core machine; store on this machine's disk, fsync per batch)");
        if std::env::var("ONLY").is_ok_and(|v| v == "dashboard") {
            dashboard(env_usize("UI_SERVICES", 1000)).await;
            return;
        }
        let only_http_wake = std::env::var("ONLY").is_ok_and(|v| v == "http-wake");
        if only_http_wake {
            let dir = tempfile::tempdir().unwrap();
            let server = Server::start(dir.path());
            http_wakeups_both(&server, waiters).await;
            return;
        }
        store_writes(writes, writers).await;
        store_wakeups(waiters).await;
        dashboard(env_usize("UI_SERVICES", 1000)).await;

        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(dir.path());
        let idle = server.rss_kib();
        http_writes(&server, services, writers).await;
        let loaded = server.rss_kib();
        println!(
            "  server RSS: {:.1} MiB idle, {:.1} MiB with {services} registered service instances ({} nodes)",
            idle as f64 / 1024.0,
            loaded as f64 / 1024.0,
            services.div_ceil(10)
        );
        http_wakeups_both(&server, waiters).await;
    });
}
