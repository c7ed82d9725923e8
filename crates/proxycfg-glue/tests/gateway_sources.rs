//! The gateway-services data sources of both families: `ServerGatewayServices` over the
//! catalog, `CacheGatewayServices` over the agent cache and a real server's HTTP API. Each
//! delivers the gateway's services, then a change (entry or wildcard), and refuses another
//! datacenter. And the leaf sources of both families with DNS SANs (an ingress gateway's
//! hosts).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use agent_cache::{AgentCaches, CachesConfig};
use api_client::Servers;
use catalog::{Op, Store, StoreConfig};
use proxycfg::data_sources::*;
use proxycfg::fake::event_channel;
use proxycfg::{CorrelationId, DataSource, DataSourceError, UpdateEvent, UpdatePayload};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use structs::*;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

struct NoChecks(tokio::sync::watch::Sender<u64>);

impl proxycfg_glue::LocalChecks for NoChecks {
    fn http_checks(&self, _: &str) -> Vec<HealthCheck> {
        Vec::new()
    }
    fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.0.subscribe()
    }
}

fn start(
    source: &Arc<dyn DataSource<GatewayServicesRequest>>,
    datacenter: &str,
    cancel: &CancellationToken,
) -> mpsc::Receiver<Box<UpdateEvent>> {
    let (tx, rx) = event_channel::<Arc<Vec<GatewayService>>>(16);
    let req = GatewayServicesRequest {
        datacenter: datacenter.into(),
        gateway: "tgw".into(),
    };
    tokio::spawn(Arc::clone(source).notify(req, CorrelationId::GatewayServices, tx, cancel.clone()));
    rx
}

async fn next(rx: &mut mpsc::Receiver<Box<UpdateEvent>>) -> Result<Vec<(String, bool)>, DataSourceError> {
    let event = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("nothing within 10 s")
        .expect("the watch ended");
    assert_eq!(event.correlation_id, CorrelationId::GatewayServices);
    event.result.map(|p| match p {
        UpdatePayload::GatewayServices(list) => list.iter().map(|g| (g.service.clone(), g.from_wildcard)).collect(),
        other => panic!("unexpected payload {other:?}"),
    })
}

async fn write(store: &Store, op: Op) {
    store.write(op).await.unwrap();
}

fn entry(services: serde_json::Value) -> Op {
    Op::ConfigSet {
        entry: Box::new(
            ConfigEntry::from_json(json!({"Kind": "terminating-gateway", "Name": "tgw", "Services": services}))
                .unwrap(),
        ),
        cas: None,
    }
}

fn register(name: &str) -> Op {
    Op::Register(Box::new(RegisterRequest {
        node: "n1".into(),
        address: "10.0.0.1".into(),
        service: Some(NodeService {
            service: name.into(),
            id: name.into(),
            port: 80,
            ..Default::default()
        }),
        ..Default::default()
    }))
}

/// The same story for either family: empty, the entry, a wildcard service, the entry gone.
async fn follows_entry_and_wildcards(store: &Store, source: &Arc<dyn DataSource<GatewayServicesRequest>>) {
    let cancel = CancellationToken::new();
    let mut rx = start(source, "dc1", &cancel);
    assert_eq!(next(&mut rx).await.unwrap(), []);
    write(
        store,
        entry(json!([{"Name": "billing", "CAFile": "/ca.pem"}, {"Name": "*"}])),
    )
    .await;
    assert_eq!(next(&mut rx).await.unwrap(), [("billing".to_owned(), false)]);
    write(store, register("legacy")).await;
    assert_eq!(
        next(&mut rx).await.unwrap(),
        [("billing".to_owned(), false), ("legacy".to_owned(), true)]
    );
    write(
        store,
        Op::ConfigDelete {
            kind: ConfigEntryKind::TerminatingGateway,
            name: "tgw".into(),
            cas: None,
        },
    )
    .await;
    assert_eq!(next(&mut rx).await.unwrap(), []);

    let mut other = start(source, "dc2", &cancel);
    let err = next(&mut other).await.unwrap_err();
    assert!(err.to_string().contains("dc2"), "{err}");
    cancel.cancel();
}

#[tokio::test]
async fn server_gateway_services_follow_the_catalog() {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let sources = proxycfg_glue::server_data_sources(store.clone());
    follows_entry_and_wildcards(&store, &sources.gateway_services).await;
}

#[tokio::test]
async fn server_gateway_services_skip_unchanged_values() {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let sources = proxycfg_glue::server_data_sources(store.clone());
    write(&store, entry(json!([{"Name": "*"}]))).await;
    let cancel = CancellationToken::new();
    let mut rx = start(&sources.gateway_services, "dc1", &cancel);
    assert_eq!(next(&mut rx).await.unwrap(), []);
    // A sidecar is not a wildcard candidate: its registration bumps the key, the value stays.
    let mut sidecar = NodeService {
        kind: ServiceKind::ConnectProxy,
        service: "x-sidecar-proxy".into(),
        id: "x-sidecar-proxy".into(),
        port: 21000,
        ..Default::default()
    };
    sidecar.proxy.destination_service_name = "x".into();
    write(
        &store,
        Op::Register(Box::new(RegisterRequest {
            node: "n1".into(),
            address: "10.0.0.1".into(),
            service: Some(sidecar),
            ..Default::default()
        })),
    )
    .await;
    write(&store, register("legacy")).await;
    assert_eq!(
        next(&mut rx).await.unwrap(),
        [("legacy".to_owned(), true)],
        "no repeat of []"
    );
    cancel.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_gateway_services_follow_the_servers() {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let app = http_api::router(store.clone(), http_api::ApiConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let caches = AgentCaches::new(
        Arc::new(Servers::new(&[addr])),
        CachesConfig::default(),
        CancellationToken::new(),
    );
    let checks = Arc::new(NoChecks(tokio::sync::watch::Sender::new(0)));
    let sources = proxycfg_glue::cache_data_sources(caches.clone(), checks);
    follows_entry_and_wildcards(&store, &sources.gateway_services).await;
    caches.shutdown().await;
}

/// The DNS SANs of a PEM certificate.
fn dns_sans_of(cert_pem: &str) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).unwrap();
    let cert = pem.parse_x509().unwrap();
    let sans = cert.subject_alternative_name().unwrap().unwrap();
    sans.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(d) => Some((*d).to_owned()),
            _ => None,
        })
        .collect()
}

async fn leaf_with(source: &Arc<dyn DataSource<LeafRequest>>, dns_sans: &[&str]) -> Arc<IssuedCert> {
    let cancel = CancellationToken::new();
    let (tx, mut rx) = event_channel::<Arc<IssuedCert>>(16);
    let req = LeafRequest {
        datacenter: "dc1".into(),
        service: "ing".into(),
        dns_sans: dns_sans.iter().map(|s| (*s).to_owned()).collect(),
        token: None,
    };
    tokio::spawn(Arc::clone(source).notify(req, CorrelationId::Leaf, tx, cancel.clone()));
    let event = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("no leaf within 10 s")
        .expect("the watch ended");
    cancel.cancel();
    match event.result.expect("a leaf") {
        UpdatePayload::Leaf(cert) => cert,
        other => panic!("unexpected payload {other:?}"),
    }
}

async fn leaves_carry_dns_sans(source: &Arc<dyn DataSource<LeafRequest>>) {
    let with = leaf_with(source, &["shop.example.com", "*.shop.example.com"]).await;
    let mut got = dns_sans_of(&with.cert_pem);
    got.sort();
    assert_eq!(got, ["*.shop.example.com", "shop.example.com"]);
    let plain = leaf_with(source, &[]).await;
    assert!(dns_sans_of(&plain.cert_pem).is_empty());
    assert_ne!(
        with.serial_number, plain.serial_number,
        "other SANs, another certificate"
    );
    let reordered = leaf_with(source, &["*.shop.example.com", "shop.example.com"]).await;
    assert_eq!(
        reordered.serial_number, with.serial_number,
        "the same set, the same certificate"
    );
}

#[tokio::test]
async fn server_leaves_carry_dns_sans() {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let sources = proxycfg_glue::server_data_sources(store.clone());
    leaves_carry_dns_sans(&sources.leaf).await;
}

/// The ingress-gateway entry that gives `ing` the names the cache's CSRs carry (a server
/// signs no DNS SAN a gateway's entry does not give it).
async fn ingress_hosts(store: &Store) {
    for entry in [
        json!({"Kind": "proxy-defaults", "Name": "global", "Config": {"protocol": "http"}}),
        json!({"Kind": "ingress-gateway", "Name": "ing", "TLS": {"Enabled": true}, "Listeners": [{"Port": 8443,
               "Protocol": "http", "Services": [{"Name": "shop", "Hosts": ["shop.example.com", "*.shop.example.com"]}]}]}),
    ] {
        let entry = Box::new(ConfigEntry::from_json(entry).unwrap());
        write(store, Op::ConfigSet { entry, cas: None }).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_leaves_carry_dns_sans() {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    ingress_hosts(&store).await;
    let app = http_api::router(store.clone(), http_api::ApiConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let caches = AgentCaches::new(
        Arc::new(Servers::new(&[addr])),
        CachesConfig::default(),
        CancellationToken::new(),
    );
    let checks = Arc::new(NoChecks(tokio::sync::watch::Sender::new(0)));
    let sources = proxycfg_glue::cache_data_sources(caches.clone(), checks);
    leaves_carry_dns_sans(&sources.leaf).await;
    caches.shutdown().await;
}
