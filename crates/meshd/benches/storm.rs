//! Reconnect storm (prints figures; asserts nothing): a real `meshd server` on a data dir,
//! `PROXIES` (5,000) synthetic proxies holding delta ADS streams (clusters subscribed, every
//! response ACKed), each reconnecting on its own when its stream ends (back-off 0.25 s
//! doubling to 2 s, jittered, as Envoy's). The server is killed with SIGKILL and started
//! again from its data dir at the same addresses: every stream reconnects at once. Printed:
//! how long until every stream had its clusters again (target ≤ 15 s), the p50/p99 of that
//! per stream, how many streams the server refused or paced meanwhile, and how many never
//! re-synced within 60 s (target 0).
//!
//! Run: `cargo xtask bench storm`. `PROXIES=` to scale.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use serde_json::json;
use std::time::{Duration, Instant};
use test_support::figures::{env_usize, ms, percentile};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// One proxy: keeps a delta stream open, reconnecting with back-off; each time its clusters
/// arrive it reports (proxy, when).
async fn proxy(grpc: String, idx: usize, synced: mpsc::UnboundedSender<(usize, Instant)>) {
    let mut backoff = Duration::from_millis(250);
    loop {
        let Ok(mut client) = AggregatedDiscoveryServiceClient::connect(format!("http://{grpc}")).await else {
            let jitter = backoff.mul_f64(0.5 + fastrand_f64());
            tokio::time::sleep(jitter).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
            continue;
        };
        let (tx, rx) = mpsc::channel(16);
        let first = DeltaDiscoveryRequest {
            node: Some(Node {
                id: format!("app-{idx}-sidecar-proxy"),
                ..Default::default()
            }),
            type_url: CLUSTER.into(),
            ..Default::default()
        };
        if tx.send(first).await.is_err() {
            continue;
        }
        let Ok(resp) = client.delta_aggregated_resources(ReceiverStream::new(rx)).await else {
            tokio::time::sleep(backoff.mul_f64(0.5 + fastrand_f64())).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
            continue;
        };
        let mut stream = resp.into_inner();
        let mut reported = false;
        while let Ok(Some(r)) = stream.message().await {
            if !reported && r.type_url == CLUSTER {
                reported = true;
                backoff = Duration::from_millis(250);
                let _ = synced.send((idx, Instant::now()));
            }
            let ack = DeltaDiscoveryRequest {
                type_url: r.type_url.clone(),
                response_nonce: r.nonce.clone(),
                ..Default::default()
            };
            if tx.send(ack).await.is_err() {
                break;
            }
        }
        // The stream ended (the server went away, or refused it): back off and reconnect.
        tokio::time::sleep(backoff.mul_f64(0.5 + fastrand_f64())).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// A cheap uniform [0, 1) from the clock's nanoseconds (jitter only).
fn fastrand_f64() -> f64 {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    f64::from(n % 1_000_000) / 1_000_000.0
}

#[tokio::main(worker_threads = 2)]
async fn main() {
    let n = env_usize("PROXIES", 5000);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let http = format!("127.0.0.1:{}", test_support::reserve_port());
    let grpc = format!("127.0.0.1:{}", test_support::reserve_port());
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_meshd"));
    let args = ["-data-dir", data.to_str().unwrap(), "-log-level", "error"];
    let mut server = test_support::process::start_server_at(bin, &http, &grpc, args).child;
    let base = format!("http://{http}");
    let client = reqwest::Client::new();
    client
        .put(format!("{base}/v1/catalog/register"))
        .json(&json!({"Node": "svc-node", "Address": "10.100.0.1", "Service": {"Kind": "connect-proxy",
            "ID": "svc-sidecar-proxy", "Service": "svc-sidecar-proxy", "Port": 21000, "Proxy": {"DestinationServiceName": "svc"}}}))
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
    let mut writes = tokio::task::JoinSet::new();
    for i in 0..n {
        let req = client.put(format!("{base}/v1/catalog/register")).json(&json!({"Node": format!("node-{i}"), "Address": "10.0.0.1",
            "Service": {"Kind": "connect-proxy", "ID": format!("app-{i}-sidecar-proxy"), "Service": format!("app-{i}-sidecar-proxy"),
                        "Port": 21000, "Proxy": {"DestinationServiceName": format!("app-{i}"),
                                                 "Upstreams": [{"DestinationName": "svc", "LocalBindPort": 9000}]}}}));
        writes.spawn(async move { req.send().await.unwrap().error_for_status().unwrap() });
        if writes.len() >= 64 {
            writes.join_next().await;
        }
    }
    while writes.join_next().await.is_some() {}

    let (synced_tx, mut synced) = mpsc::unbounded_channel();
    for i in 0..n {
        tokio::spawn(proxy(grpc.clone(), i, synced_tx.clone()));
    }
    let t0 = Instant::now();
    let mut first = vec![false; n];
    let mut count = 0;
    while count < n {
        let (i, _) = synced.recv().await.unwrap();
        if !first[i] {
            first[i] = true;
            count += 1;
        }
    }
    println!("reconnect storm: {n} delta streams, server killed (SIGKILL) and restarted from its data dir");
    println!("  first sync of all {n} streams: {}", ms(t0.elapsed()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    while synced.try_recv().is_ok() {}

    server.kill().unwrap();
    server.wait().unwrap();
    let killed = Instant::now();
    let mut server = test_support::process::start_server_at(bin, &http, &grpc, args).child;
    let up = killed.elapsed();
    let mut again: Vec<Option<Duration>> = vec![None; n];
    let mut count = 0;
    let deadline = killed + Duration::from_secs(60);
    while count < n {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, synced.recv()).await {
            Ok(Some((i, at))) => {
                if again[i].is_none() {
                    again[i] = Some(at.duration_since(killed));
                    count += 1;
                }
            }
            _ => break,
        }
    }
    let mut times: Vec<Duration> = again.iter().flatten().copied().collect();
    times.sort();
    let never = n - times.len();
    let paced = test_support::process::metric(&client, &base, "meshd_xds_streams_paced_total").await;
    let refused = test_support::process::metric(&client, &base, "meshd_xds_streams_refused_total").await;
    println!("  the new server answered {} after the kill", ms(up));
    println!(
        "  every stream re-synced (clusters again) {} after the kill   [target <= 15 s]; per stream p50 {} p99 {}",
        times.last().map_or_else(|| "never".into(), |d| ms(*d)),
        ms(percentile(&times, 0.50)),
        ms(percentile(&times, 0.99))
    );
    println!(
        "  streams paced during the storm: {paced}; refused: {refused}; never re-synced within 60 s: {never}   [target 0]"
    );
    let _ = server.kill();
    let _ = server.wait();
}
