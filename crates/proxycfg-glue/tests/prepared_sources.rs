//! Prepared-query upstreams in both modes: the server source over the catalog, the cache
//! source over a real server's HTTP API. Each reports a missing query as an error, then
//! follows the query's creation, its service's sidecars, and a change of the query.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use catalog::{Op, Store, StoreConfig};
use proxycfg::data_sources::{PreparedQueryRequest, WatchRequest};
use proxycfg::fake::event_channel;
use proxycfg::{CorrelationId, DataSource, DataSources, UpdateEvent, UpdatePayload};
use std::sync::Arc;
use std::time::Duration;
use structs::query::{PreparedQuery, ServiceQuery};
use structs::*;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

async fn sidecar(store: &Store, node: &str, dest: &str) {
    let svc = NodeService {
        kind: ServiceKind::ConnectProxy,
        id: format!("{dest}-{node}-sidecar-proxy"),
        service: format!("{dest}-sidecar-proxy"),
        port: 21000,
        proxy: ConnectProxyConfig {
            destination_service_name: dest.into(),
            ..Default::default()
        },
        ..Default::default()
    };
    let req = RegisterRequest {
        node: node.into(),
        address: "10.0.0.1".into(),
        service: Some(svc),
        ..Default::default()
    };
    store.write(Op::Register(Box::new(req))).await.unwrap();
}

async fn set_query(store: &Store, service: &str, create: bool) {
    let query = PreparedQuery {
        id: "6a4b5a1c-0000-4000-8000-000000000001".into(),
        name: "web-query".into(),
        service: ServiceQuery {
            service: service.into(),
            ..Default::default()
        },
        ..Default::default()
    };
    store
        .write(Op::QuerySet {
            query: Box::new(query),
            create,
        })
        .await
        .unwrap();
}

/// The watch's next delivery: the instances' ids, or the error's text.
async fn next(rx: &mut mpsc::Receiver<Box<UpdateEvent>>) -> Result<Vec<String>, String> {
    let event = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a delivery within 10 s")
        .expect("the watch is running");
    match event.result {
        Ok(UpdatePayload::Health(nodes)) => Ok(nodes.iter().map(|n| n.service.id.clone()).collect()),
        Ok(other) => panic!("not instances: {other:?}"),
        Err(e) => Err(e.to_string()),
    }
}

async fn follows_a_query(store: Store, sources: DataSources) {
    let cancel = CancellationToken::new();
    let (tx, mut rx) = event_channel::<<PreparedQueryRequest as WatchRequest>::Response>(16);
    let req = PreparedQueryRequest {
        datacenter: "dc1".into(),
        query: "web-query".into(),
    };
    let source: Arc<dyn DataSource<PreparedQueryRequest>> = Arc::clone(&sources.prepared_query);
    tokio::spawn(source.notify(req, CorrelationId::Roots, tx, cancel.clone()));
    let missing = next(&mut rx).await.unwrap_err();
    assert!(missing.contains("\"web-query\" does not exist"), "{missing}");

    set_query(&store, "web", true).await;
    assert_eq!(next(&mut rx).await.unwrap(), Vec::<String>::new());
    sidecar(&store, "n1", "web").await;
    assert_eq!(next(&mut rx).await.unwrap(), ["web-n1-sidecar-proxy"]);
    sidecar(&store, "n2", "web").await;
    assert_eq!(
        next(&mut rx).await.unwrap(),
        ["web-n1-sidecar-proxy", "web-n2-sidecar-proxy"]
    );
    // Another service's sidecar changes nothing the query selects; the query moving to that
    // service does.
    sidecar(&store, "n3", "api").await;
    set_query(&store, "api", false).await;
    assert_eq!(next(&mut rx).await.unwrap(), ["api-n3-sidecar-proxy"]);
    cancel.cancel();
}

#[tokio::test]
async fn the_server_source_follows_a_prepared_query() {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let sources = proxycfg_glue::server_data_sources(store.clone());
    follows_a_query(store, sources).await;
}

#[cfg(feature = "cache")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_source_follows_a_prepared_query_through_a_servers_api() {
    use agent_cache::{AgentCaches, CachesConfig};
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let app = http_api::router(store.clone(), http_api::ApiConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let servers = Arc::new(api_client::Servers::new(&[addr]));
    let caches = AgentCaches::new(servers, CachesConfig::default(), CancellationToken::new());
    struct NoChecks(tokio::sync::watch::Sender<u64>);
    impl proxycfg_glue::LocalChecks for NoChecks {
        fn http_checks(&self, _: &str) -> Vec<HealthCheck> {
            Vec::new()
        }
        fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
            self.0.subscribe()
        }
    }
    let local = Arc::new(NoChecks(tokio::sync::watch::Sender::new(0)));
    let sources = proxycfg_glue::cache_data_sources(caches.clone(), local);
    follows_a_query(store, sources).await;
    caches.shutdown().await;
}
