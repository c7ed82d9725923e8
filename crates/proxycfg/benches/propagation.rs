//! proxycfg propagation benchmark (prints figures; asserts nothing).
//!
//! 1,000 connect-proxies, each with 10 upstreams drawn from 100 services (every service is an
//! upstream of exactly 100 proxies), fed by in-memory data sources. Each round changes the
//! endpoints of one service and measures, for every affected proxy, the time until its
//! watcher holds a snapshot with the new endpoints; CPU time of the whole process during the
//! round divided by the number of affected proxies; and memory per proxy State (RSS growth
//! from registering the proxies, divided by their number). A second run does the same with
//! 200 proxies of 100 upstreams each, so every change affects every proxy (PERFORMANCE.md P5:
//! CPU per affected proxy rebuild at 100 upstreams).
//!
//! Run: `cargo xtask bench proxycfg` (or `cargo bench -p proxycfg --bench propagation`).
//! Scale with `PROXIES=`, `UPSTREAMS=`, `ROUNDS=`, `P5_PROXIES=`.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use proxycfg::data_sources::HealthRequest;
use proxycfg::fake::FakeDataSources;
use proxycfg::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use structs::*;
use test_support::figures::{env_usize, ms, percentile};
use tokio::sync::mpsc;

const SERVICES: usize = 100;
const TRUST: &str = "bench.consul";

/// Sum of on-CPU time of every thread of this process, from the scheduler's ns counters.
fn process_cpu() -> Duration {
    let mut total = 0u64;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                total += s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    Duration::from_nanos(total)
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn service_name(i: usize) -> String {
    format!("svc-{i:03}")
}

fn health_req(service: &str) -> HealthRequest {
    HealthRequest {
        datacenter: "dc1".into(),
        service: service.into(),
        connect: true,
        passing_only: false,
        healthy_only: true,
        filter: String::new(),
        kind: None,
        token: None,
    }
}

fn endpoints(service: &str, round: usize, n: usize) -> Arc<Vec<CheckServiceNode>> {
    Arc::new(
        (0..n)
            .map(|k| CheckServiceNode {
                node: Node {
                    node: format!("node-{k}"),
                    address: format!("10.{}.{}.{k}", round / 250, round % 250),
                    ..Default::default()
                },
                service: NodeService {
                    kind: ServiceKind::ConnectProxy,
                    id: format!("{service}-sidecar-{k}"),
                    service: format!("{service}-sidecar-proxy"),
                    port: 21000,
                    ..Default::default()
                },
                checks: Vec::new(),
            })
            .collect(),
    )
}

fn fakes() -> FakeDataSources {
    let fakes = FakeDataSources::with_defaults(TRUST);
    fakes.health.set_fallback(|r| Some(endpoints(&r.service, 0, 3)));
    fakes
}

fn registration(i: usize, upstreams: &[usize]) -> ProxyRegistration {
    let name = format!("app-{i:04}");
    let svc = NodeService {
        kind: ServiceKind::ConnectProxy,
        id: format!("{name}-sidecar-proxy"),
        service: format!("{name}-sidecar-proxy"),
        port: 21000,
        proxy: ConnectProxyConfig {
            destination_service_name: name.clone(),
            local_service_port: 8080,
            upstreams: upstreams
                .iter()
                .enumerate()
                .map(|(j, s)| Upstream {
                    destination_name: service_name(*s),
                    local_bind_port: 9000 + j as u16,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        },
        ..Default::default()
    };
    ProxyRegistration {
        id: ProxyId::new("bench", svc.id.clone()),
        service: Arc::new(svc),
        token: None,
    }
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn marker(round: usize) -> String {
    format!("10.{}.{}.0", round / 250, round % 250)
}

/// Does this snapshot hold the endpoints of upstream `id` from the round with `marker`?
fn has_round(snap: &ConfigSnapshot, id: &UpstreamId, marker: &str) -> Option<bool> {
    let up = snap.connect_proxy()?.upstreams.get(id)?;
    Some(
        up.endpoints
            .values()
            .next()
            .is_some_and(|eps| eps.first().is_some_and(|e| e.node.address == marker)),
    )
}

async fn propagation(proxies: usize, upstreams_each: usize, rounds: usize) {
    let fakes = fakes();
    let manager = Manager::new(ManagerConfig::default(), fakes.data_sources());
    let coalesce = DEFAULT_COALESCE;

    // Which proxies watch which service.
    let upstreams_of = |i: usize| -> Vec<usize> {
        (0..upstreams_each)
            .map(|j| (i + j * (SERVICES / upstreams_each.max(1))) % SERVICES)
            .collect()
    };
    let mut watchers_of: Vec<Vec<usize>> = vec![Vec::new(); SERVICES];
    for i in 0..proxies {
        for s in upstreams_of(i) {
            watchers_of[s].push(i);
        }
    }

    let rss_before = rss_bytes();
    // Current round: service index in the high half, round number in the low half.
    let current = Arc::new(AtomicU64::new(u64::MAX));
    // Per round: (upstream id of the changed service, marker address), read by the watchers.
    let ids: Arc<Vec<UpstreamId>> = Arc::new(
        (0..SERVICES)
            .map(|s| {
                Upstream {
                    destination_name: service_name(s),
                    ..Default::default()
                }
                .id()
            })
            .collect(),
    );
    let markers: Arc<Vec<String>> = Arc::new((0..=rounds).map(marker).collect());
    let (report_tx, mut report_rx) = mpsc::unbounded_channel::<(usize, Instant)>();
    let start_registering = Instant::now();
    let mut watcher_tasks = tokio::task::JoinSet::new();
    for i in 0..proxies {
        let reg = registration(i, &upstreams_of(i));
        let mut w = manager.watch(&reg.id);
        manager.register(reg, ProxySource::Local, false).await.unwrap();
        let (current, report_tx) = (Arc::clone(&current), report_tx.clone());
        let (ids, markers) = (Arc::clone(&ids), Arc::clone(&markers));
        watcher_tasks.spawn(async move {
            let mut reported = u64::MAX;
            let mut first = true;
            while let Some(ev) = w.next().await {
                let WatchEvent::Snapshot(snap) = ev else { continue };
                if first {
                    first = false;
                    let _ = report_tx.send((i, Instant::now()));
                    continue;
                }
                let cur = current.load(Ordering::Acquire);
                if cur == u64::MAX || cur == reported {
                    continue;
                }
                let (svc, round) = ((cur >> 32) as usize, (cur & 0xffff_ffff) as usize);
                if has_round(&snap, &ids[svc], &markers[round]) == Some(true) {
                    reported = cur;
                    let _ = report_tx.send((i, Instant::now()));
                }
            }
        });
    }
    // Wait for every proxy's first valid snapshot.
    for _ in 0..proxies {
        report_rx.recv().await.unwrap();
    }
    let ready = start_registering.elapsed();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss_after = rss_bytes();
    let metrics = manager.metrics();

    println!("proxycfg propagation benchmark");
    println!(
        "  proxies: {proxies}, upstreams each: {upstreams_each}, services: {SERVICES}, coalescing window: {}",
        ms(coalesce)
    );
    println!(
        "  all {proxies} proxies registered and holding a valid snapshot after {} ({} live watches, {:.1} per proxy)",
        ms(ready),
        metrics.live_watches,
        metrics.live_watches as f64 / proxies as f64
    );
    let per_proxy = rss_after.saturating_sub(rss_before) as f64 / proxies as f64 / 1024.0;
    println!(
        "  memory per proxy State (RSS growth / proxies, incl. its watches and watcher): {per_proxy:.1} KiB   [target <= 50 KiB at 10 upstreams]"
    );

    let mut latencies = Vec::new();
    let mut cpu_per_affected = Vec::new();
    let mut round_p99 = Vec::new();
    let mut seed = 0x9e37_79b9_u64;
    for round in 1..=rounds {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let svc = (seed >> 33) as usize % SERVICES;
        let affected = watchers_of[svc].len();
        current.store(((svc as u64) << 32) | round as u64, Ordering::Release);
        let cpu0 = process_cpu();
        let t0 = Instant::now();
        fakes
            .health
            .set(&health_req(&service_name(svc)), endpoints(&service_name(svc), round, 3));
        let mut this_round = Vec::with_capacity(affected);
        for _ in 0..affected {
            let (_, at) = report_rx.recv().await.unwrap();
            this_round.push(at - t0);
        }
        let cpu = process_cpu() - cpu0;
        cpu_per_affected.push(cpu / affected as u32);
        this_round.sort();
        round_p99.push(percentile(&this_round, 0.99));
        latencies.extend(this_round);
        // Let the next round start from quiet.
        tokio::time::sleep(coalesce * 3).await;
    }
    latencies.sort();
    cpu_per_affected.sort();
    let m = manager.metrics();
    println!(
        "  rounds: {rounds}, affected proxies per change: {}",
        watchers_of[0].len()
    );
    println!(
        "  delivery latency (change -> watcher holds new snapshot): p50 {}  p99 {}  max {}   [target p99 <= {}]",
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
        ms(*latencies.last().unwrap_or(&Duration::ZERO)),
        ms(coalesce + Duration::from_millis(10)),
    );
    println!(
        "  process CPU per affected proxy (fake source + State rebuild + publish + watcher wake): p50 {}  p99 {}   [target <= 50 µs]",
        us(percentile(&cpu_per_affected, 0.5)),
        us(percentile(&cpu_per_affected, 0.99)),
    );
    println!(
        "  snapshots built: {}, stale updates dropped: {}",
        m.snapshots_built, m.stale_updates
    );

    manager.shutdown().await;
    watcher_tasks.shutdown().await;
}

fn main() {
    // `cargo bench` passes --bench; nothing else is accepted.
    let proxies = env_usize("PROXIES", 1000);
    let rounds = env_usize("ROUNDS", 40);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // The scenario: 1,000 proxies x 10 upstreams from 100 services.
        propagation(proxies, env_usize("UPSTREAMS", 10), rounds).await;
        println!();
        // PERFORMANCE.md P5: proxies with 100 upstreams each; every change affects all of them.
        propagation(env_usize("P5_PROXIES", 200), SERVICES, rounds).await;
    });
}
