//! The ADS protocol over tonic with a scripted client: ACK, NACK without a resend loop,
//! stale nonces, wildcard and named subscriptions, unsubscribe, and delta reconnects.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::*;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use proxycfg::data_sources::*;
use proxycfg::fake::FakeDataSources;
use proxycfg::{
    Manager, ManagerConfig, ProxyId, ProxyRegistration, ProxyRequest, ProxySource, SourceError, SourceLease, Watcher,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use xds::resources::{CLUSTER, ENDPOINT, LISTENER};
use xds::{SnapshotSource, XdsServer};

struct ManagerSource(Manager);

impl SnapshotSource for ManagerSource {
    fn watch(&self, request: &ProxyRequest<'_>) -> Result<(Watcher, SourceLease), SourceError> {
        Ok((self.0.watch(&ProxyId::new("node-1", request.proxy_id)), Box::new(())))
    }
}

struct Harness {
    fakes: FakeDataSources,
    addr: std::net::SocketAddr,
    server: XdsServer,
}

fn health(service: &str) -> HealthRequest {
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

/// The first stream's status once `ready` holds for it. The server records a request when
/// it has read it, which a loaded machine may take a while to do: polled, never sampled
/// once after a fixed wait.
async fn status_when(h: &Harness, ready: impl Fn(&xds::status::StreamStatus) -> bool) -> xds::status::StreamStatus {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = h.server.sync_status().into_iter().next()
            && ready(&status)
        {
            return status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "status not reached within 30 s: {:?}",
            h.server.sync_status()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn harness() -> Harness {
    harness_with(xds::Admission::default()).await
}

async fn harness_with(admission: xds::Admission) -> Harness {
    harness_prepared(admission, |_, _| {}).await
}

/// The harness with `prepare(fakes, trust domain)` run before the proxy is registered.
async fn harness_prepared(admission: xds::Admission, prepare: impl FnOnce(&FakeDataSources, &str)) -> Harness {
    let ca = Ca::new();
    let scenario = Scenario {
        protocol: "tcp",
        upstreams: vec![("api", 9191, "tcp")],
        intentions: vec![],
        instances: vec![],
    };
    let snap = snapshot(&ca, &scenario);
    let trust = snap.roots.as_ref().unwrap().trust_domain.clone();
    let fakes = FakeDataSources::with_defaults(&trust);
    // Real CA material: the built resources must carry usable certificates.
    let roots = snap.roots.clone().unwrap();
    let leaf = snap.connect_proxy().unwrap().leaf.clone().unwrap();
    fakes.ca_roots.set_fallback(move |_| Some(Arc::clone(&roots)));
    fakes.leaf.set_fallback(move |_| Some(Arc::clone(&leaf)));
    fakes
        .health
        .set(&health("api"), Arc::new(vec![instance("api", "10.0.0.1", 21000)]));
    prepare(&fakes, &trust);
    let manager = Manager::new(ManagerConfig::default(), fakes.data_sources());
    let reg = ProxyRegistration {
        id: (*snap.proxy_id).clone(),
        service: Arc::clone(&snap.service),
        token: None,
    };
    manager.register(reg, ProxySource::Local, false).await.unwrap();
    let server = XdsServer::with_admission(Arc::new(ManagerSource(manager.clone())), admission);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = server.service();
    let csds = server.csds_service();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .add_service(csds)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
    });
    Harness { fakes, addr, server }
}

fn node() -> Option<Node> {
    Some(Node {
        id: "web-sidecar-proxy".into(),
        cluster: "web".into(),
        ..Default::default()
    })
}

struct Delta {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    rx: Streaming<DeltaDiscoveryResponse>,
}

impl Delta {
    async fn open(addr: std::net::SocketAddr, first: DeltaDiscoveryRequest) -> Delta {
        let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let (tx, rx) = mpsc::channel(16);
        tx.send(first).await.unwrap();
        let rx = client
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Delta { tx, rx }
    }
    async fn recv(&mut self) -> DeltaDiscoveryResponse {
        tokio::time::timeout(Duration::from_secs(10), self.rx.message())
            .await
            .expect("a response")
            .unwrap()
            .unwrap()
    }
    /// Nothing arrives for a while (a negative check: it can only pass wrongly, never fail wrongly).
    async fn silent(&mut self) {
        assert!(
            tokio::time::timeout(Duration::from_millis(300), self.rx.message())
                .await
                .is_err(),
            "unexpected response"
        );
    }
    async fn send(&self, req: DeltaDiscoveryRequest) {
        self.tx.send(req).await.unwrap();
    }
}

fn sub(type_url: &str, names: &[&str]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: node(),
        type_url: type_url.into(),
        resource_names_subscribe: names.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}

fn ack(r: &DeltaDiscoveryResponse) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: r.type_url.clone(),
        response_nonce: r.nonce.clone(),
        ..Default::default()
    }
}

fn names(r: &DeltaDiscoveryResponse) -> Vec<String> {
    r.resources.iter().map(|r| r.name.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_ack_nack_stale_unsubscribe_and_reconnect() {
    let h = harness().await;
    let mut s = Delta::open(h.addr, sub(CLUSTER, &[])).await;
    let cds = s.recv().await;
    assert_eq!(cds.type_url, CLUSTER);
    let clusters = names(&cds);
    assert_eq!(clusters.len(), 2, "local_app and api: {clusters:?}");
    let api_cluster = clusters.iter().find(|n| n.starts_with("api.")).unwrap().clone();
    s.send(ack(&cds)).await;
    s.silent().await;

    // Named EDS, then LDS (wildcard).
    s.send(sub(ENDPOINT, &[&api_cluster])).await;
    let eds = s.recv().await;
    assert_eq!(names(&eds), vec![api_cluster.clone()]);
    s.send(ack(&eds)).await;
    s.send(sub(LISTENER, &[])).await;
    let lds = s.recv().await;
    assert_eq!(lds.resources.len(), 2);
    s.send(ack(&lds)).await;
    s.silent().await;

    // An endpoint change sends only the changed load assignment; a stale nonce is ignored.
    h.fakes.health.set(
        &health("api"),
        Arc::new(vec![
            instance("api", "10.0.0.1", 21000),
            instance("api", "10.0.0.2", 21000),
        ]),
    );
    let eds2 = s.recv().await;
    assert_eq!(
        (eds2.type_url.as_str(), names(&eds2)),
        (ENDPOINT, vec![api_cluster.clone()])
    );
    s.send(DeltaDiscoveryRequest {
        type_url: ENDPOINT.into(),
        response_nonce: "stale".into(),
        ..Default::default()
    })
    .await;
    h.fakes
        .health
        .set(&health("api"), Arc::new(vec![instance("api", "10.0.0.3", 21000)]));
    s.silent().await; // still waiting for the ACK of eds2: one un-ACKed response per type

    // NACK: the proxy keeps the last good version; the rejected one is not sent again.
    s.send(DeltaDiscoveryRequest {
        error_detail: Some(RpcStatus {
            code: 3,
            message: "rejected on purpose".into(),
            details: vec![],
        }),
        ..ack(&eds2)
    })
    .await;
    let eds3 = s.recv().await; // the newer version (10.0.0.3) is not the rejected one
    assert_eq!(names(&eds3), vec![api_cluster.clone()]);
    s.send(DeltaDiscoveryRequest {
        error_detail: Some(RpcStatus {
            code: 3,
            message: "rejected again".into(),
            details: vec![],
        }),
        ..ack(&eds3)
    })
    .await;
    s.silent().await; // no resend loop

    // Unsubscribing sends nothing.
    s.send(DeltaDiscoveryRequest {
        type_url: ENDPOINT.into(),
        resource_names_unsubscribe: vec![api_cluster.clone()],
        ..Default::default()
    })
    .await;
    s.silent().await;

    // Reconnect with the versions it holds: only what differs is sent (nothing, here).
    let versions = cds
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.version.clone()))
        .collect();
    let mut again = Delta::open(
        h.addr,
        DeltaDiscoveryRequest {
            initial_resource_versions: versions,
            ..sub(CLUSTER, &[])
        },
    )
    .await;
    again.silent().await;
}

struct Sotw {
    tx: mpsc::Sender<DiscoveryRequest>,
    rx: Streaming<DiscoveryResponse>,
}

impl Sotw {
    async fn open(addr: std::net::SocketAddr, first: DiscoveryRequest) -> Sotw {
        let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let (tx, rx) = mpsc::channel(16);
        tx.send(first).await.unwrap();
        let rx = client
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Sotw { tx, rx }
    }
    async fn recv(&mut self) -> DiscoveryResponse {
        tokio::time::timeout(Duration::from_secs(10), self.rx.message())
            .await
            .expect("a response")
            .unwrap()
            .unwrap()
    }
    async fn silent(&mut self) {
        assert!(
            tokio::time::timeout(Duration::from_millis(300), self.rx.message())
                .await
                .is_err(),
            "unexpected response"
        );
    }
}

fn sotw(type_url: &str, names: &[&str], prev: Option<&DiscoveryResponse>) -> DiscoveryRequest {
    DiscoveryRequest {
        node: node(),
        type_url: type_url.into(),
        resource_names: names.iter().map(|s| (*s).to_owned()).collect(),
        version_info: prev.map(|p| p.version_info.clone()).unwrap_or_default(),
        response_nonce: prev.map(|p| p.nonce.clone()).unwrap_or_default(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_ack_nack_and_stale_nonce() {
    let h = harness().await;
    let mut s = Sotw::open(h.addr, sotw(CLUSTER, &[], None)).await;
    let cds = s.recv().await;
    assert_eq!(cds.resources.len(), 2, "wildcard: every cluster");
    s.tx.send(sotw(CLUSTER, &[], Some(&cds))).await.unwrap();
    s.silent().await;

    let api = "api.default.dc1.internal.";
    let cluster_name = {
        let c: envoy_types::pb::envoy::config::cluster::v3::Cluster = prost::Message::decode(
            cds.resources
                .iter()
                .find(|r| String::from_utf8_lossy(&r.value).contains(api))
                .unwrap()
                .value
                .as_slice(),
        )
        .unwrap();
        c.name
    };
    s.tx.send(sotw(ENDPOINT, &[&cluster_name], None)).await.unwrap();
    let eds = s.recv().await;
    assert_eq!(eds.resources.len(), 1);
    // A stale nonce is ignored entirely.
    let mut stale = sotw(ENDPOINT, &[&cluster_name], Some(&eds));
    stale.response_nonce = "stale".into();
    s.tx.send(stale).await.unwrap();
    s.silent().await;
    // NACK: not resent while nothing changes.
    let mut nack = sotw(ENDPOINT, &[&cluster_name], Some(&eds));
    nack.error_detail = Some(RpcStatus {
        code: 3,
        message: "no".into(),
        details: vec![],
    });
    s.tx.send(nack).await.unwrap();
    s.silent().await;
    {
        use xds::status::ResourceState::{Error, Synced};
        let status = &status_when(&h, |st| {
            st.types
                .iter()
                .any(|t| t.type_url == ENDPOINT && t.resources.get(&Error) == Some(&1))
        })
        .await;
        assert_eq!(status.protocol, "sotw");
        assert_eq!(
            counts(status, CLUSTER),
            vec![(Synced, 2)],
            "names read from the encoded clusters"
        );
        let eds_status = status.types.iter().find(|t| t.type_url == ENDPOINT).unwrap();
        assert_eq!(eds_status.resources.get(&Error), Some(&1));
        assert_eq!(eds_status.last_nack.as_ref().unwrap().error, "no");
        assert_eq!(eds_status.last_sent.as_ref().unwrap().version, eds.version_info);
        assert!(eds_status.last_acked.is_none(), "rejected, never acknowledged");
        // SotW's versions are the responses' version_info.
        let cds_status = status.types.iter().find(|t| t.type_url == CLUSTER).unwrap();
        let acked = cds_status.last_acked.as_ref().unwrap();
        assert_eq!(acked.version, cds.version_info);
        assert_eq!(acked.nonce, cds.nonce);
        assert_eq!(cds_status.last_sent.as_ref().unwrap().version, cds.version_info);
    }
    // A change is sent, with a new version.
    h.fakes
        .health
        .set(&health("api"), Arc::new(vec![instance("api", "10.0.0.9", 21000)]));
    let eds2 = s.recv().await;
    assert_ne!(eds2.version_info, eds.version_info);
    assert_eq!(eds2.type_url, ENDPOINT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_past_the_limit_are_refused_with_resource_exhausted() {
    let h = harness_with(xds::Admission {
        max_streams: 1,
        ..xds::Admission::default()
    })
    .await;
    let mut first = Delta::open(h.addr, sub(CLUSTER, &[])).await;
    assert_eq!(first.recv().await.type_url, CLUSTER);
    // The second is refused at once, with a reason.
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(1);
    tx.send(sub(CLUSTER, &[])).await.unwrap();
    let refused = client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(refused.message().contains("limit of 1"), "{}", refused.message());
    assert_eq!(h.server.metrics().streams_refused(), 1);
    // Once the first ends, a new stream is admitted.
    drop(first);
    let mut again = None;
    for _ in 0..100 {
        let (tx, rx) = mpsc::channel(1);
        tx.send(sub(CLUSTER, &[])).await.unwrap();
        if let Ok(r) = client.delta_aggregated_resources(ReceiverStream::new(rx)).await {
            again = Some((tx, r.into_inner()));
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_tx, mut stream) = again.expect("a stream admitted after the first closed");
    let resp = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.unwrap().type_url, CLUSTER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_new_streams_is_paced() {
    let h = harness_with(xds::Admission {
        setup_rate: 20.0,
        setup_burst: 2,
        ..xds::Admission::default()
    })
    .await;
    let started = std::time::Instant::now();
    let mut opened = Vec::new();
    for _ in 0..6 {
        opened.push(tokio::spawn(async move {
            let mut s = Delta::open(h.addr, sub(CLUSTER, &[])).await;
            s.recv().await;
            s
        }));
    }
    let mut streams = Vec::new();
    for o in opened {
        streams.push(o.await.unwrap());
    }
    // Two at once, then one every 50 ms: the last is set up at least 200 ms in.
    assert_eq!(h.server.metrics().streams_paced(), 4);
    assert!(
        started.elapsed() >= Duration::from_millis(190),
        "{:?}",
        started.elapsed()
    );
}

fn nack(r: &DeltaDiscoveryResponse, message: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: r.type_url.clone(),
        response_nonce: r.nonce.clone(),
        error_detail: Some(RpcStatus {
            code: 3,
            message: message.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn counts(status: &xds::status::StreamStatus, type_url: &str) -> Vec<(xds::status::ResourceState, usize)> {
    status
        .types
        .iter()
        .find(|t| t.type_url == type_url)
        .map(|t| t.resources.iter().map(|(k, v)| (*k, *v)).collect())
        .unwrap_or_default()
}

/// `node`'s CSDS rows (type, name, status, NACK detail), asked by `FetchClientStatus` and
/// by `StreamClientStatus`, which must agree.
async fn csds(addr: std::net::SocketAddr, node: &str) -> Vec<(String, String, i32, String)> {
    use envoy_types::pb::envoy::service::status::v3::ClientStatusRequest;
    use envoy_types::pb::envoy::service::status::v3::client_status_discovery_service_client::ClientStatusDiscoveryServiceClient;
    use envoy_types::pb::envoy::r#type::matcher::v3::{NodeMatcher, StringMatcher, string_matcher::MatchPattern};
    let mut client = ClientStatusDiscoveryServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let request = |id: &str| ClientStatusRequest {
        node_matchers: vec![NodeMatcher {
            node_id: Some(StringMatcher {
                match_pattern: Some(MatchPattern::Exact(id.into())),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let resp = client.fetch_client_status(request(node)).await.unwrap().into_inner();
    let requests = tokio_stream::iter([request(node), request("no-such-node")]);
    let mut answers = client.stream_client_status(requests).await.unwrap().into_inner();
    assert_eq!(
        answers.message().await.unwrap().as_ref(),
        Some(&resp),
        "a stream's answer is the fetch's"
    );
    let none = answers.message().await.unwrap().unwrap();
    assert!(none.config.is_empty(), "a matcher that selects no node: no client");
    assert!(
        answers.message().await.unwrap().is_none(),
        "the stream ends with the client's side"
    );
    assert_eq!(resp.config.len(), 1, "one stream of {node}");
    let config = &resp.config[0];
    assert_eq!(config.node.as_ref().unwrap().id, node);
    let mut names: Vec<_> = config
        .generic_xds_configs
        .iter()
        .map(|g| (&g.type_url, &g.name))
        .collect();
    names.sort();
    let listed = names.len();
    names.dedup();
    assert_eq!(
        names.len(),
        listed,
        "each resource once: a resource sent is not also NOT_SENT"
    );
    config
        .generic_xds_configs
        .iter()
        .map(|g| {
            if g.type_url.ends_with("Secret") {
                assert!(g.xds_config.is_none(), "a secret's contents are never listed");
            } else if g.config_status != 2 {
                let value = g.xds_config.as_ref().expect("contents of what was sent");
                assert_eq!(value.type_url, g.type_url);
            }
            (
                g.type_url.rsplit('.').next().unwrap().to_owned(),
                g.name.clone(),
                g.config_status,
                g.error_state.as_ref().map(|e| e.details.clone()).unwrap_or_default(),
            )
        })
        .collect()
}

/// With an authorizer set, CSDS answers only requests whose token it allows; a refusal is
/// `PERMISSION_DENIED` with the authorizer's reason, on both methods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csds_answers_only_tokens_the_authorizer_allows() {
    use envoy_types::pb::envoy::service::status::v3::ClientStatusRequest;
    use envoy_types::pb::envoy::service::status::v3::client_status_discovery_service_client::ClientStatusDiscoveryServiceClient;
    let h = harness().await;
    h.server.set_csds_authorizer(Arc::new(|token: Option<structs::Token>| {
        Box::pin(async move {
            if token.as_ref().map(structs::Token::secret) == Some("operator") {
                Ok(())
            } else {
                Err(format!("token {token:?} lacks operator:read"))
            }
        })
    }));
    let mut s = Delta::open(h.addr, sub(CLUSTER, &[])).await;
    let _ = s.recv().await;
    let mut client = ClientStatusDiscoveryServiceClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap();
    let with = |token: &str| {
        let mut r = tonic::Request::new(ClientStatusRequest::default());
        if !token.is_empty() {
            r.metadata_mut().insert("x-consul-token", token.parse().unwrap());
        }
        r
    };
    for token in ["", "guest"] {
        let err = client.fetch_client_status(with(token)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
        assert!(err.message().contains("lacks operator:read"), "{err:?}");
        let mut r = tonic::Request::new(tokio_stream::iter([ClientStatusRequest::default()]));
        if !token.is_empty() {
            r.metadata_mut().insert("x-consul-token", token.parse().unwrap());
        }
        let err = client.stream_client_status(r).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    }
    let answer = client.fetch_client_status(with("operator")).await.unwrap();
    assert!(
        answer.metadata().get("server-timing").is_some(),
        "the server's time is given"
    );
    let ids: Vec<_> = answer
        .into_inner()
        .config
        .into_iter()
        .map(|c| c.node.unwrap().id)
        .collect();
    assert_eq!(ids, ["web-sidecar-proxy"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_status_and_csds_follow_what_the_proxy_acknowledged_and_rejected() {
    use envoy_types::pb::envoy::service::status::v3::ConfigStatus;
    use xds::status::ResourceState::{Error, NotSent, Stale, Synced};
    let h = harness().await;
    h.server.set_server_name("server-a");
    let mut s = Delta::open(h.addr, sub(CLUSTER, &[])).await;
    let cds = s.recv().await;
    let status = &h.server.sync_status()[0];
    assert_eq!(status.node, "web-sidecar-proxy");
    assert_eq!(status.server, "server-a");
    assert_eq!(status.protocol, "delta");
    assert_eq!(counts(status, CLUSTER), vec![(Stale, 2)], "sent, not yet acknowledged");
    let of_type =
        |status: &xds::status::StreamStatus, t: &str| status.types.iter().find(|x| x.type_url == t).unwrap().clone();
    let sent_version = of_type(status, CLUSTER).last_sent.unwrap().version;
    assert_eq!(sent_version.len(), 32, "delta: a digest of the clusters sent");
    assert!(of_type(status, CLUSTER).last_acked.is_none());
    s.send(ack(&cds)).await;
    s.silent().await;
    let status = &status_when(&h, |st| counts(st, CLUSTER) == vec![(Synced, 2)]).await;
    let acked = of_type(status, CLUSTER).last_acked.unwrap();
    assert_eq!((acked.nonce, acked.version), (cds.nonce.clone(), sent_version.clone()));
    assert!(
        !counts(status, ENDPOINT).is_empty(),
        "load assignments held but never asked for"
    );
    assert!(counts(status, ENDPOINT).iter().all(|(s, _)| *s == NotSent));

    s.send(sub(LISTENER, &[])).await;
    let lds = s.recv().await;
    s.send(nack(&lds, "listener 'public_listener': bad filter")).await;
    s.silent().await;
    let status = &status_when(&h, |st| counts(st, LISTENER) == vec![(Error, 2)]).await;
    let listeners = status.types.iter().find(|t| t.type_url == LISTENER).unwrap();
    assert_eq!(
        listeners.last_nack.as_ref().unwrap().error,
        "listener 'public_listener': bad filter"
    );

    let rows = csds(h.addr, "web-sidecar-proxy").await;
    let of = |t: &str, st: ConfigStatus| rows.iter().filter(|r| r.0 == t && r.2 == st as i32).count();
    assert_eq!(of("Cluster", ConfigStatus::Synced), 2);
    assert_eq!(of("Listener", ConfigStatus::Error), 2);
    assert!(
        rows.iter()
            .filter(|r| r.0 == "Listener")
            .all(|r| r.3 == "listener 'public_listener': bad filter"),
        "{rows:?}"
    );
    assert!(of("ClusterLoadAssignment", ConfigStatus::NotSent) >= 1);
    drop(s);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !h.server.sync_status().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a closed stream leaves the status"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Configuration that cannot be built (a chain whose start node is missing, which the
/// compiler never makes) shows in the stream's sync status with its reason, under
/// `BuildProblems` in the JSON `/v1/internal/xds-status` serves (that handler serializes
/// these very values); the rest of the proxy's resources are still sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_that_cannot_be_built_shows_in_the_sync_status_with_its_reason() {
    let h = harness_prepared(xds::Admission::default(), |fakes, trust| {
        let trust = trust.to_owned();
        fakes.discovery_chain.set_fallback(move |r| {
            let mut chain = structs::CompiledDiscoveryChain::default_for(
                &r.name,
                &r.datacenter,
                &trust,
                r.override_protocol.unwrap_or_default(),
            );
            if r.name == "api" {
                chain.start_node = "router:missing".into();
            }
            Some(Arc::new(chain))
        });
    })
    .await;
    let mut s = Delta::open(h.addr, sub(CLUSTER, &[])).await;
    let cds = s.recv().await;
    assert!(!cds.resources.is_empty(), "the rest is still served");
    let status = &h.server.sync_status()[0];
    let why = status.build_problems.get("api").expect("api's problem is reported");
    assert!(why.contains("router:missing"), "{why}");
    let json = serde_json::to_value(status).unwrap();
    assert_eq!(json["BuildProblems"]["api"], serde_json::json!(why));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_never_answers_is_flagged_stuck_then_reset() {
    let h = harness().await;
    h.server
        .set_stuck_timing(Duration::from_secs(1), Duration::from_secs(3));
    let mut s = Delta::open(h.addr, sub(CLUSTER, &[])).await;
    let _cds = s.recv().await;
    // Never acknowledged: flagged (counted once, as the status says while the stream lives),
    // then reset. The exact thresholds are the paused-time tests' (`status/tests.rs`).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while h.server.metrics().streams_stuck() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never flagged stuck");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(h.server.metrics().streams_stuck(), 1);
    if let Some(status) = h.server.sync_status().first() {
        assert!(status.stuck, "counted stuck, and its status says so: {status:?}");
    }
    let ended = tokio::time::timeout(Duration::from_secs(30), s.rx.message())
        .await
        .expect("reset within the reset time");
    let status = ended.expect_err("ended with a status");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(h.server.metrics().streams_stuck_reset(), 1);
}
