//! HA benchmark (prints figures; asserts nothing): several `meshd server -store etcd`
//! processes over a real 3-member etcd cluster, all on this machine.
//!
//! 1. Durable registrations per second through etcd, concurrent HTTP clients spread over 3
//!    servers; beside it the single-server embedded figure (one server with `-data-dir`).
//! 2. Propagation with 1,000 delta streams spread over the 3 servers (each a registered
//!    sidecar with 10 upstreams among 100 services): one service gains an instance through
//!    one server; every affected stream's receipt of it is timed.
//! 3. Failover: the same 1,000 proxies reconnect, all to one server, which is then killed
//!    with SIGKILL; each reconnects as Envoy does with several xDS servers in its bootstrap
//!    (round-robin over them from a random start, the dead one included, after Envoy's
//!    jittered backoff: below 500 ms, the bound doubling per failure) and is re-synced (its
//!    load assignments received again); the time from the kill to the last re-sync is
//!    printed.
//!
//! Run: `cargo xtask bench ha`. Scale with `WRITES=` (20000), `WRITERS=` (64), `PROXIES=`
//! (1000), `ROUNDS=` (10), `MAX_TXN_OPS=` (128: etcd's and meshd's limit per transaction).
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use serde_json::json;
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use test_support::ads::{CLUSTER, ENDPOINT, contains_marker, marker_address};
use test_support::etcd::EtcdCluster;
use test_support::figures::{env_usize, ms, percentile};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const SERVICES: usize = 100;
const UPSTREAMS: usize = 10;

struct Server {
    child: Child,
    http: String,
    grpc: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(args: &[String]) -> Server {
    let test_support::process::ServerProcess { child, http, grpc, .. } =
        test_support::process::start_server(std::path::Path::new(env!("CARGO_BIN_EXE_meshd")), args);
    Server { child, http, grpc }
}

fn etcd_servers(etcd: &EtcdCluster, prefix: &str, n: usize, max_ops: usize) -> Vec<Server> {
    (0..n)
        .map(|i| {
            start(&[
                "-store".into(),
                "etcd".into(),
                "-etcd-endpoints".into(),
                etcd.endpoints_arg(),
                "-etcd-prefix".into(),
                prefix.into(),
                "-etcd-max-txn-ops".into(),
                max_ops.to_string(),
                "-node".into(),
                format!("bench-{i}"),
                "-log-level".into(),
                "error".into(),
            ])
        })
        .collect()
}

fn registration(i: usize) -> serde_json::Value {
    json!({"Node": format!("node-{}", i / 10), "Address": format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255),
        "Service": {"Service": format!("svc-{}", i % 1000), "ID": format!("svc-{i}"), "Port": 8080}})
}

/// Registrations from `writers` concurrent clients, client `w` using server `w % servers`.
async fn writes(urls: &[String], writes: usize, writers: usize) -> f64 {
    let client = reqwest::Client::new();
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..writers {
        let (client, url) = (client.clone(), urls[w % urls.len()].clone());
        tasks.spawn(async move {
            let mut i = w;
            while i < writes {
                let resp = client
                    .put(format!("{url}/v1/catalog/register"))
                    .json(&registration(i))
                    .send()
                    .await
                    .unwrap();
                assert!(resp.status().is_success(), "{}", resp.text().await.unwrap());
                i += writers;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    writes as f64 / start.elapsed().as_secs_f64()
}

fn svc(i: usize) -> String {
    format!("svc-{i:03}")
}

/// What a roaming proxy reports.
enum Report {
    /// Its first sync.
    Ready,
    /// The round's marker reached proxy `.1`.
    Marker(Instant, usize),
    /// Proxy `.1` back in sync on another server after its stream ended.
    Resynced(Instant, usize),
}

/// Envoy's xDS reconnect backoff: the first retry within 500 ms, the bound doubling per
/// failed attempt up to 30 s, each delay drawn at random below it (full jitter).
const BACKOFF_BASE: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

fn backoff(failures: u32) -> Duration {
    let bound = BACKOFF_BASE.saturating_mul(1 << failures.min(16)).min(BACKOFF_MAX);
    Duration::from_millis(fastrand::u64(0..bound.as_millis() as u64))
}

/// A synthetic Envoy whose bootstrap lists several xDS servers: subscribes like Envoy
/// (clusters, then their load assignments), ACKs everything, reports the round marker. Its
/// first stream goes to `first`; after that, as Envoy's round-robin over the xDS cluster's
/// hosts (from a random start, a dead host included: without health checks it does not
/// know), each new stream goes to the next server, after Envoy's jittered backoff. It
/// reports when its load assignments are back after a reconnect (also after a server hands
/// it to another to balance the load).
async fn roaming_proxy(
    servers: Vec<String>,
    first: usize,
    idx: usize,
    marker: Arc<AtomicU64>,
    reports: mpsc::UnboundedSender<Report>,
) {
    let mut rr = fastrand::usize(0..servers.len());
    let mut at = first;
    let mut connected_before = false;
    let mut failures = 0;
    loop {
        if connected_before || failures > 0 {
            tokio::time::sleep(backoff(failures)).await;
        }
        // Until its first sync it keeps to `first` (as if only that server were up).
        if connected_before {
            rr += 1;
            at = rr % servers.len();
        }
        let grpc = &servers[at];
        let Ok(mut client) = AggregatedDiscoveryServiceClient::connect(format!("http://{grpc}")).await else {
            failures += 1;
            continue;
        };
        let (tx, rx) = mpsc::channel(16);
        let node = Some(Node {
            id: format!("app-{idx}-sidecar-proxy"),
            ..Default::default()
        });
        tx.send(DeltaDiscoveryRequest {
            node,
            type_url: CLUSTER.into(),
            ..Default::default()
        })
        .await
        .unwrap();
        let Ok(stream) = client.delta_aggregated_resources(ReceiverStream::new(rx)).await else {
            failures += 1;
            continue;
        };
        let mut stream = stream.into_inner();
        let mut subscribed = std::collections::HashSet::new();
        let mut synced = false;
        let mut reported = 0;
        while let Ok(Some(resp)) = stream.message().await {
            let ack = DeltaDiscoveryRequest {
                type_url: resp.type_url.clone(),
                response_nonce: resp.nonce.clone(),
                ..Default::default()
            };
            if tx.send(ack).await.is_err() {
                break;
            }
            if resp.type_url == CLUSTER {
                let names: Vec<String> = resp
                    .resources
                    .iter()
                    .map(|r| r.name.clone())
                    .filter(|n| n != "local_app" && !subscribed.contains(n))
                    .collect();
                if !names.is_empty() {
                    subscribed.extend(names.iter().cloned());
                    let _ = tx
                        .send(DeltaDiscoveryRequest {
                            type_url: ENDPOINT.into(),
                            resource_names_subscribe: names,
                            ..Default::default()
                        })
                        .await;
                }
            } else if resp.type_url == ENDPOINT {
                if !synced {
                    synced = true;
                    failures = 0;
                    let _ = reports.send(if connected_before {
                        Report::Resynced(Instant::now(), idx)
                    } else {
                        Report::Ready
                    });
                    connected_before = true;
                }
                let m = marker.load(Ordering::Acquire);
                if m != 0 && m != reported && resp.resources.iter().any(|r| contains_marker(r, m)) {
                    reported = m;
                    let _ = reports.send(Report::Marker(Instant::now(), idx));
                }
            }
        }
        if reports.is_closed() {
            return;
        }
        if !synced {
            failures += 1;
        }
    }
}

async fn put(client: &reqwest::Client, url: &str, body: serde_json::Value) {
    let resp = client
        .put(format!("{url}/v1/catalog/register"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.text().await.unwrap());
}

#[tokio::main(worker_threads = 2)]
async fn main() {
    let writes_n = env_usize("WRITES", 20_000);
    let writers = env_usize("WRITERS", 64);
    let n = env_usize("PROXIES", 1000);
    let rounds = env_usize("ROUNDS", 10);
    let max_ops = env_usize("MAX_TXN_OPS", 128);
    let etcd =
        tokio::task::spawn_blocking(move || EtcdCluster::builder(3).arg(format!("--max-txn-ops={max_ops}")).start())
            .await
            .unwrap();
    println!(
        "HA benchmark: 3 etcd members (etcd 3.5, fsync on) and 3 meshd servers, all on this 2-core machine with the load generator"
    );

    // 1. Write throughput.
    for through in [1, 3] {
        let servers = etcd_servers(&etcd, &format!("/bench-writes-{through}/"), 3, max_ops);
        let urls: Vec<String> = servers.iter().take(through).map(|s| s.http.clone()).collect();
        let rate = writes(&urls, writes_n, writers).await;
        println!(
            "  durable registrations through etcd, {writers} clients over {through} of 3 servers: {rate:.0} writes/s   [target >= 3000/s]"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let embedded = start(&[
        "-data-dir".into(),
        dir.path().to_string_lossy().into_owned(),
        "-log-level".into(),
        "error".into(),
    ]);
    let rate = writes(std::slice::from_ref(&embedded.http), writes_n, writers).await;
    println!("  beside it, one server with the embedded log (-data-dir): {rate:.0} writes/s");
    drop(embedded);

    // 2. Propagation over 3 servers.
    let mut servers = etcd_servers(&etcd, "/bench-xds/", 3, max_ops);
    let client = reqwest::Client::new();
    for s in 0..SERVICES {
        put(
            &client,
            &servers[s % 3].http,
            json!({"Node": format!("svc-node-{s}"), "Address": "10.100.0.1", "Service": {"Kind": "connect-proxy",
            "ID": format!("{}-sidecar-proxy", svc(s)), "Service": format!("{}-sidecar-proxy", svc(s)), "Port": 21000,
            "Proxy": {"DestinationServiceName": svc(s)}}}),
        )
        .await;
    }
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let upstreams: Vec<_> = (0..UPSTREAMS)
            .map(|j| json!({"DestinationName": svc((i + j * (SERVICES / UPSTREAMS)) % SERVICES), "LocalBindPort": 9000 + j}))
            .collect();
        let body = json!({"Node": format!("node-{i}"), "Address": "10.0.0.1", "Service": {"Kind": "connect-proxy",
            "ID": format!("app-{i}-sidecar-proxy"), "Service": format!("app-{i}-sidecar-proxy"), "Port": 21000,
            "Proxy": {"DestinationServiceName": format!("app-{i}"), "Upstreams": upstreams}}});
        let (client, url) = (client.clone(), servers[i % 3].http.clone());
        tasks.spawn(async move { put(&client, &url, body).await });
        if tasks.len() >= 64 {
            tasks.join_next().await;
        }
    }
    while tasks.join_next().await.is_some() {}
    let grpc: Vec<String> = servers.iter().map(|s| s.grpc.clone()).collect();
    let marker = Arc::new(AtomicU64::new(0));
    let (report, mut reports) = mpsc::unbounded_channel();
    let start_sync = Instant::now();
    let proxies: Vec<_> = (0..n)
        .map(|i| {
            tokio::spawn(roaming_proxy(
                grpc.clone(),
                i % 3,
                i,
                Arc::clone(&marker),
                report.clone(),
            ))
        })
        .collect();
    let mut ready = 0;
    while ready < n {
        if let Some(Report::Ready) = reports.recv().await {
            ready += 1;
        }
    }
    println!(
        "  {n} delta streams ({} per server), each a sidecar with {UPSTREAMS} upstreams of {SERVICES} services, synced in {}",
        n / 3,
        ms(start_sync.elapsed())
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let affected = n * UPSTREAMS / SERVICES;
    let mut lat = Vec::new();
    let mut writes = Vec::new();
    for round in 1..=rounds {
        let s = (round * 37) % SERVICES;
        marker.store(round as u64, Ordering::Release);
        let t0 = Instant::now();
        put(&client, &servers[round % 3].http, json!({"Node": format!("extra-{round}"), "Address": marker_address(round as u64), "Service": {"Kind": "connect-proxy",
            "ID": format!("{}-sidecar-proxy-{round}", svc(s)), "Service": format!("{}-sidecar-proxy", svc(s)), "Port": 21000,
            "Proxy": {"DestinationServiceName": svc(s)}}})).await;
        writes.push(t0.elapsed());
        let mut got = std::collections::BTreeSet::new();
        while got.len() < affected {
            match tokio::time::timeout(Duration::from_secs(10), reports.recv()).await {
                Ok(Some(Report::Marker(at, idx))) if got.insert(idx) => lat.push(at - t0),
                Ok(Some(_)) => {}
                _ => {
                    println!(
                        "  round {round}: only {} of {affected} streams got the change within 10 s",
                        got.len()
                    );
                    break;
                }
            }
        }
    }
    lat.sort();
    println!(
        "  write through one server -> affected streams on all three have it ({affected} streams x {rounds} rounds): p50 {}  p99 {}  max {}   [target p99 <= 100 ms]",
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        ms(*lat.last().unwrap_or(&Duration::ZERO))
    );
    println!(
        "  of which the write itself (HTTP register through one server until its response, durable in etcd): {}",
        test_support::figures::latency_summary(&mut writes)
    );

    // 3. Failover: every one of the n streams on one server, which is then killed.
    for p in proxies {
        p.abort();
    }
    drop(report);
    drop(reports);
    let streams = |http: String| {
        let client = client.clone();
        async move { test_support::process::metric(&client, &http, "meshd_xds_streams").await }
    };
    let mut open = f64::MAX;
    for _ in 0..200 {
        open = 0.0;
        for s in &servers {
            open += streams(s.http.clone()).await;
        }
        if open == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(open, 0.0, "the propagation streams ended");
    let (report, mut reports) = mpsc::unbounded_channel();
    let start_sync = Instant::now();
    for i in 0..n {
        tokio::spawn(roaming_proxy(
            grpc.clone(),
            0,
            i,
            Arc::new(AtomicU64::new(0)),
            report.clone(),
        ));
    }
    let mut ready = 0;
    while ready < n {
        if let Some(Report::Ready) = reports.recv().await {
            ready += 1;
        }
    }
    let mut on_victim = 0.0;
    for _ in 0..200 {
        on_victim = streams(servers[0].http.clone()).await;
        if on_victim >= n as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "  {n} delta streams all on one server ({on_victim} by its meshd_xds_streams), synced in {}",
        ms(start_sync.elapsed())
    );
    let killed = Instant::now();
    {
        let victim = &mut servers[0];
        let _ = victim.child.kill();
        let _ = victim.child.wait();
    }
    // Each proxy's first re-sync after the kill (a later one would be a hand-over to
    // balance the servers, not the failover).
    let mut first_resync = std::collections::HashMap::new();
    while first_resync.len() < n {
        match tokio::time::timeout(Duration::from_secs(30), reports.recv()).await {
            Ok(Some(Report::Resynced(at, idx))) => {
                first_resync.entry(idx).or_insert(at - killed);
            }
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    let mut resynced: Vec<Duration> = first_resync.into_values().collect();
    resynced.sort();
    let mut held = Vec::new();
    for s in &servers[1..] {
        held.push(streams(s.http.clone()).await);
    }
    println!(
        "  SIGKILL of the server holding all {n} streams: {} of them re-synced on the others ({held:?}), reconnecting as Envoy (round-robin over the bootstrap's servers, jittered backoff from 500 ms); p50 {}  p99 {}  last {} after the kill   [target <= 5 s for 1,000 streams]",
        resynced.len(),
        ms(percentile(&resynced, 0.5)),
        ms(percentile(&resynced, 0.99)),
        ms(*resynced.last().unwrap_or(&Duration::ZERO))
    );
    drop(reports);
    drop(servers);
    drop(etcd);
}
