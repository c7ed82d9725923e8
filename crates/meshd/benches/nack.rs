//! NACK loop (prints figures; asserts nothing): a real `meshd server -dev` and `PROXIES`
//! (100) synthetic proxies whose delta streams NACK every listener update and ACK the rest.
//! After the NACKs, the server is watched for `IDLE_S` (5) seconds with nothing changing:
//! printed are the listener responses sent meanwhile (target 0: the rejected version is never
//! resent) and the server's CPU (target: idle). Then one real change: each proxy gets exactly
//! one new listener, which it NACKs again.
//!
//! Run: `cargo xtask bench nack`.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use test_support::ads::proc_stat;
use test_support::figures::env_usize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

/// One proxy: subscribes to listeners (wildcard), NACKs each listener response, counts them.
async fn nacking_proxy(grpc: String, idx: usize, listeners: Arc<AtomicU64>) {
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(16);
    tx.send(DeltaDiscoveryRequest {
        node: Some(Node {
            id: format!("app-{idx}-sidecar-proxy"),
            ..Default::default()
        }),
        type_url: LISTENER.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut stream = client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    while let Ok(Some(resp)) = stream.message().await {
        if resp.type_url == LISTENER {
            listeners.fetch_add(1, Ordering::Relaxed);
        }
        let nack = DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            error_detail: (resp.type_url == LISTENER).then(|| RpcStatus {
                code: 3,
                message: "this proxy rejects every listener".into(),
                details: vec![],
            }),
            ..Default::default()
        };
        if tx.send(nack).await.is_err() {
            return;
        }
    }
}

#[tokio::main(worker_threads = 2)]
async fn main() {
    let proxies = env_usize("PROXIES", 100);
    let idle = Duration::from_secs(env_usize("IDLE_S", 5) as u64);
    let store = test_support::figures::BenchStore::from_env();
    let mut args = store.args();
    args.extend(["-log-level".to_owned(), "error".to_owned()]);
    let server = test_support::process::start_server(std::path::Path::new(env!("CARGO_BIN_EXE_meshd")), args);
    let mut child = server.child;
    let pid = child.id();
    let http = reqwest::Client::new();
    let register = |i: usize, port: u16| {
        let body = json!({"Node": format!("node-{i}"), "Address": "10.0.0.1", "Service": {"Kind": "connect-proxy",
            "ID": format!("app-{i}-sidecar-proxy"), "Service": format!("app-{i}-sidecar-proxy"), "Port": port,
            "Proxy": {"DestinationServiceName": format!("app-{i}")}}});
        let req = http.put(format!("{}/v1/catalog/register", server.http)).json(&body);
        async move { req.send().await.unwrap().error_for_status().unwrap() }
    };
    for i in 0..proxies {
        register(i, 21000).await;
    }
    let listeners = Arc::new(AtomicU64::new(0));
    for i in 0..proxies {
        tokio::spawn(nacking_proxy(server.grpc.clone(), i, Arc::clone(&listeners)));
    }
    // Every proxy got (and NACKed) its first listener.
    let t0 = Instant::now();
    while listeners.load(Ordering::Relaxed) < proxies as u64 {
        assert!(t0.elapsed() < Duration::from_secs(60), "not every proxy got a listener");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = listeners.load(Ordering::Relaxed);
    let (cpu0, _) = proc_stat(pid);
    tokio::time::sleep(idle).await;
    let (cpu1, _) = proc_stat(pid);
    let resent = listeners.load(Ordering::Relaxed) - before;
    // One real change for every proxy: its public listener's port.
    for i in 0..proxies {
        register(i, 21001).await;
    }
    let t1 = Instant::now();
    while listeners.load(Ordering::Relaxed) < before + proxies as u64 {
        assert!(
            t1.elapsed() < Duration::from_secs(60),
            "the change did not reach every proxy"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after_change = listeners.load(Ordering::Relaxed) - before;
    let cpu = cpu1.saturating_sub(cpu0);
    println!(
        "NACK loop: {proxies} delta streams NACK every listener update ({})",
        store.describe()
    );
    println!(
        "  idle {:.0} s after the NACKs: {resent} listener responses sent   [target 0]; server CPU {:.2} % of one core ({} ms)   [target: idle]",
        idle.as_secs_f64(),
        cpu.as_secs_f64() / idle.as_secs_f64() * 100.0,
        cpu.as_millis()
    );
    println!("  one real change: {after_change} listener responses for {proxies} proxies   [target {proxies}]");
    let _ = child.kill();
    let _ = child.wait();
}
