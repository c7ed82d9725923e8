//! Where a connected proxy's memory goes (prints figures; asserts nothing). A real `meshd
//! server -dev` with `PROXIES` (1,000) registered sidecars (10 upstreams each among 100
//! services); the server's RSS is read at three points:
//!
//! 1. registered, no stream: the catalog's share (against the RSS before the proxies);
//! 2. every proxy's gRPC connection and ADS stream open, but no request sent yet: the
//!    transport's share (HTTP/2 connection, stream, the waiting stream driver);
//! 3. every stream has sent its node and subscribed (clusters, their load assignments,
//!    listeners), all ACKed: the proxy's configuration state (its proxycfg State and watches,
//!    snapshot, built and encoded resources, protocol state).
//!
//! Also printed: the encoded bytes of each proxy's resources, as received.
//!
//! Each proxy's first request carries a node of Envoy's size (`NODE_KB`, 60: Envoy 1.40 lists
//! its extensions there); later requests carry none, as with the bootstrap meshd writes.
//!
//! Run: `cargo xtask bench memory`.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use envoy_types::pb::envoy::config::core::v3::{Extension, Node};
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use prost::Message;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use test_support::ads::proc_stat;
use test_support::figures::env_usize;
use tokio::sync::{Barrier, mpsc};
use tokio_stream::wrappers::ReceiverStream;

const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const SERVICES: usize = 100;
const UPSTREAMS: usize = 10;

/// The extensions a proxy lists in its node: about `NODE_KB` (60) KiB of them, as Envoy 1.40
/// sends on its first request (its build lists every extension it was compiled with); 0 for
/// a bare node.
fn extensions() -> Vec<Extension> {
    let bytes = env_usize("NODE_KB", 60) * 1024;
    let one = |i: usize| Extension {
        name: format!("envoy.filters.network.example_extension_{i}"),
        category: "envoy.filters.network".into(),
        type_urls: vec![format!("envoy.extensions.filters.network.example_{i}.v3.ExampleConfig")],
        ..Default::default()
    };
    let each = one(0).encoded_len() + 3;
    (0..bytes / each).map(one).collect()
}

/// One proxy: opens its stream and waits at `held`; then subscribes like Envoy, ACKs
/// everything, and reports its bytes once it has clusters, load assignments and listeners.
async fn proxy(grpc: String, idx: usize, held: Arc<Barrier>, go: Arc<Barrier>, done: mpsc::UnboundedSender<usize>) {
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(16);
    let mut stream = client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    held.wait().await;
    go.wait().await;
    tx.send(DeltaDiscoveryRequest {
        node: Some(Node {
            id: format!("app-{idx}-sidecar-proxy"),
            extensions: extensions(),
            ..Default::default()
        }),
        type_url: CLUSTER.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    tx.send(DeltaDiscoveryRequest {
        type_url: LISTENER.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let (mut bytes, mut have) = (0usize, [false; 3]);
    let mut reported = false;
    while let Ok(Some(resp)) = stream.message().await {
        bytes += resp.resources.iter().map(|r| r.encoded_len()).sum::<usize>();
        if resp.type_url == CLUSTER {
            have[0] = true;
            let names: Vec<String> = resp.resources.iter().map(|r| r.name.clone()).collect();
            tx.send(DeltaDiscoveryRequest {
                type_url: EDS.into(),
                resource_names_subscribe: names,
                ..Default::default()
            })
            .await
            .unwrap();
        } else if resp.type_url == EDS {
            have[1] = true;
        } else if resp.type_url == LISTENER {
            have[2] = true;
        }
        tx.send(DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
        if !reported && have.iter().all(|h| *h) {
            reported = true;
            let _ = done.send(bytes);
        }
    }
}

#[tokio::main(worker_threads = 2)]
async fn main() {
    let n = env_usize("PROXIES", 1000);
    // `MEMORY_SERVER_BIN` runs the server through another program (a heap profiler's
    // wrapper script, say) that execs meshd with the arguments it is given.
    let bin = std::env::var_os("MEMORY_SERVER_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_BIN_EXE_meshd")));
    let store = test_support::figures::BenchStore::from_env();
    let mut args = store.args();
    args.extend(["-log-level".to_owned(), "error".to_owned()]);
    let server = test_support::process::start_server(&bin, args);
    let mut child = server.child;
    let pid = child.id();
    let http = reqwest::Client::new();
    for s in 0..SERVICES {
        http.put(format!("{}/v1/catalog/register", server.http))
            .json(&json!({"Node": format!("svc-node-{s}"), "Address": "10.100.0.1", "Service": {"Kind": "connect-proxy",
                "ID": format!("svc-{s:03}-sidecar-proxy"), "Service": format!("svc-{s:03}-sidecar-proxy"), "Port": 21000,
                "Proxy": {"DestinationServiceName": format!("svc-{s:03}")}}}))
            .send()
            .await
            .unwrap()
            .error_for_status()
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, rss_base) = proc_stat(pid);
    let mut writes = tokio::task::JoinSet::new();
    for i in 0..n {
        let upstreams: Vec<_> = (0..UPSTREAMS)
            .map(|j| json!({"DestinationName": format!("svc-{:03}", (i + j * (SERVICES / UPSTREAMS)) % SERVICES), "LocalBindPort": 9000 + j}))
            .collect();
        let req = http.put(format!("{}/v1/catalog/register", server.http)).json(&json!({"Node": format!("node-{i}"), "Address": "10.0.0.1",
            "Service": {"Kind": "connect-proxy", "ID": format!("app-{i}-sidecar-proxy"), "Service": format!("app-{i}-sidecar-proxy"),
                        "Port": 21000, "Proxy": {"DestinationServiceName": format!("app-{i}"), "Upstreams": upstreams}}}));
        writes.spawn(async move { req.send().await.unwrap().error_for_status().unwrap() });
        if writes.len() >= 64 {
            writes.join_next().await;
        }
    }
    while writes.join_next().await.is_some() {}
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, rss_registered) = proc_stat(pid);

    let held = Arc::new(Barrier::new(n + 1));
    let go = Arc::new(Barrier::new(n + 1));
    let (done_tx, mut done) = mpsc::unbounded_channel();
    for i in 0..n {
        tokio::spawn(proxy(
            server.grpc.clone(),
            i,
            Arc::clone(&held),
            Arc::clone(&go),
            done_tx.clone(),
        ));
        if i % 256 == 255 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    held.wait().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, rss_held) = proc_stat(pid);
    go.wait().await;
    let mut bytes = 0usize;
    for _ in 0..n {
        bytes += done.recv().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, rss_synced) = proc_stat(pid);

    let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / n as f64;
    println!(
        "memory per connected proxy ({n} proxies, {UPSTREAMS} upstreams each, delta ADS; proc_stat RSS in KiB; {})",
        store.describe()
    );
    println!(
        "  catalog (the registration, before any stream): {:.1} KiB per proxy (server RSS {:.1} MiB with them)",
        per(rss_base, rss_registered),
        rss_registered as f64 / 1024.0
    );
    println!(
        "  transport (HTTP/2 connection + ADS stream open, nothing requested): {:.1} KiB per proxy",
        per(rss_registered, rss_held)
    );
    println!(
        "  configuration (proxycfg State and watches, snapshot, built and encoded resources, protocol state): {:.1} KiB per proxy",
        per(rss_held, rss_synced)
    );
    println!(
        "  total with streams: {:.1} KiB per proxy; resources as received: {:.1} KiB per proxy",
        per(rss_registered, rss_synced),
        bytes as f64 / n as f64 / 1024.0
    );
    // SIGTERM: a profiler wrapping the server writes its report when the server exits.
    supervisor::process::terminate_blocking(&mut child, Duration::from_secs(60));
}
