//! A proxy that reconnects to a restarted server (same data dir) with the versions it holds
//! gets nothing resent that did not change: versions are content hashes, and a delta stream's
//! initial resource versions are honoured.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

/// The server process, killed (by its own handle) if the test fails half-way.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        supervisor::process::terminate_blocking(&mut self.0, Duration::from_secs(10));
    }
}

struct Stream {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    rx: tonic::Streaming<DeltaDiscoveryResponse>,
}

impl Stream {
    async fn open(grpc: &str, first: DeltaDiscoveryRequest) -> Stream {
        let mut client = None;
        for _ in 0..100 {
            if let Ok(c) = AggregatedDiscoveryServiceClient::connect(format!("http://{grpc}")).await {
                client = Some(c);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut client = client.expect("the server's xDS port");
        let (tx, rx) = mpsc::channel(16);
        tx.send(first).await.unwrap();
        let rx = client
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Stream { tx, rx }
    }

    async fn recv(&mut self) -> DeltaDiscoveryResponse {
        tokio::time::timeout(Duration::from_secs(10), self.rx.message())
            .await
            .expect("a response")
            .unwrap()
            .unwrap()
    }

    async fn ack(&self, r: &DeltaDiscoveryResponse) {
        self.tx
            .send(DeltaDiscoveryRequest {
                type_url: r.type_url.clone(),
                response_nonce: r.nonce.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
}

fn first(type_url: &str, names: Vec<String>, versions: HashMap<String, String>) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: Some(Node {
            id: "web-sidecar-proxy".into(),
            ..Default::default()
        }),
        type_url: type_url.into(),
        resource_names_subscribe: names,
        initial_resource_versions: versions,
        ..Default::default()
    }
}

fn versions(r: &DeltaDiscoveryResponse) -> HashMap<String, String> {
    r.resources
        .iter()
        .map(|x| (x.name.clone(), x.version.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_after_a_server_restart_resends_nothing_unchanged() {
    let bin = Path::new(env!("CARGO_BIN_EXE_meshd"));
    let data = tempfile::tempdir().unwrap();
    let (http, grpc) = (
        format!("127.0.0.1:{}", test_support::reserve_port()),
        format!("127.0.0.1:{}", test_support::reserve_port()),
    );
    let args = ["-data-dir", data.path().to_str().unwrap(), "-log-level", "warn"];
    let mut server = Killed(test_support::process::start_server_at(bin, &http, &grpc, args).child);
    let client = reqwest::Client::new();
    for body in [
        json!({"Node": "n1", "Address": "10.0.0.1", "Service": {"Kind": "connect-proxy", "ID": "web-sidecar-proxy",
            "Service": "web-sidecar-proxy", "Port": 21000, "Proxy": {"DestinationServiceName": "web",
            "Upstreams": [{"DestinationName": "api", "LocalBindPort": 9191}]}}}),
        json!({"Node": "n2", "Address": "10.0.0.2", "Service": {"Kind": "connect-proxy", "ID": "api-sidecar-proxy",
            "Service": "api-sidecar-proxy", "Port": 21000, "Proxy": {"DestinationServiceName": "api"}}}),
    ] {
        let r = client
            .put(format!("http://{http}/v1/catalog/register"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }

    // Synced: clusters, then the upstream's load assignment.
    let mut s = Stream::open(&grpc, first(CLUSTER, vec![], HashMap::new())).await;
    let cds = s.recv().await;
    s.ack(&cds).await;
    let api: Vec<String> = cds
        .resources
        .iter()
        .map(|r| r.name.clone())
        .filter(|n| n.starts_with("api."))
        .collect();
    assert_eq!(api.len(), 1, "{:?}", versions(&cds));
    let mut e = Stream::open(&grpc, first(ENDPOINT, api.clone(), HashMap::new())).await;
    let eds = e.recv().await;
    e.ack(&eds).await;
    let mut l = Stream::open(&grpc, first(LISTENER, vec![], HashMap::new())).await;
    let lds = l.recv().await;
    l.ack(&lds).await;
    assert!(!lds.resources.is_empty());
    let (cds_versions, eds_versions, lds_versions) = (versions(&cds), versions(&eds), versions(&lds));
    drop((s, e, l));

    // The server is killed and comes back from its data dir.
    server.0.kill().unwrap();
    server.0.wait().unwrap();
    let _server = Killed(test_support::process::start_server_at(bin, &http, &grpc, args).child);

    // Reconnecting with what it holds: nothing comes back for clusters or endpoints.
    let mut s = Stream::open(&grpc, first(CLUSTER, vec![], cds_versions)).await;
    let mut e = Stream::open(&grpc, first(ENDPOINT, api.clone(), eds_versions.clone())).await;
    // Listeners name their certificates by SDS name: the re-signed leaf leaves them as they were.
    let mut l = Stream::open(&grpc, first(LISTENER, vec![], lds_versions)).await;
    for (what, stream) in [
        ("clusters", &mut s.rx),
        ("endpoints", &mut e.rx),
        ("listeners", &mut l.rx),
    ] {
        let got = tokio::time::timeout(Duration::from_millis(1500), stream.message()).await;
        assert!(got.is_err(), "{what} were resent after the restart: {got:?}");
    }
    // A real change still arrives.
    let r = client
        .put(format!("http://{http}/v1/catalog/register"))
        .json(
            &json!({"Node": "n3", "Address": "10.0.0.3", "Service": {"Kind": "connect-proxy",
            "ID": "api-sidecar-proxy", "Service": "api-sidecar-proxy", "Port": 21000,
            "Proxy": {"DestinationServiceName": "api"}}}),
        )
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let changed = e.recv().await;
    assert_eq!(changed.resources.len(), 1);
    assert_ne!(versions(&changed), eds_versions);
}
