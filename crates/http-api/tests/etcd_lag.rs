//! Blocking queries on a server whose etcd watch is behind another's: two stores over one
//! real etcd, one of them behind a link the test cuts.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a panic is the failure report

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use catalog::{Store, StoreConfig};
use catalog_etcd::EtcdConfig;
use http_body_util::BodyExt;
use parking_lot::Mutex;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use test_support::etcd::{CuttableLink, EtcdCluster};
use tower::ServiceExt;

async fn open(endpoint: String, name: &str) -> (Router, Store) {
    let mut etcd = EtcdConfig::new(vec![endpoint]);
    etcd.prefix = "/lag/".into();
    etcd.server_name = name.into();
    etcd.lease_ttl = Duration::from_secs(2);
    etcd.request_timeout = Duration::from_secs(4);
    let store = Store::open(StoreConfig {
        backend: Some(std::sync::Arc::new(etcd)),
        ..StoreConfig::default()
    })
    .await
    .unwrap();
    (http_api::router(store.clone(), http_api::ApiConfig::default()), store)
}

/// The status and `X-Consul-Index` of a request.
async fn call(app: &Router, method: &str, uri: &str, body: String) -> (StatusCode, u64) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::from(body))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let index = resp
        .headers()
        .get("x-consul-index")
        .map_or(0, |v| v.to_str().unwrap().parse().unwrap());
    let _ = resp.into_body().collect().await.unwrap();
    (status, index)
}

async fn register(app: &Router, id: &str) {
    let body = json!({"Node": "n1", "Address": "10.0.0.1", "Service": {"ID": id, "Service": "web", "Port": 8080}});
    let (status, _) = call(app, "PUT", "/v1/catalog/register", body.to_string()).await;
    assert_eq!(status, StatusCode::OK);
}

async fn index(app: &Router, query: &str) -> u64 {
    let (status, index) = call(app, "GET", &format!("/v1/health/service/web{query}"), String::new()).await;
    assert_eq!(status, StatusCode::OK);
    index
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_server_waits_for_its_watch_and_never_answers_a_lower_index() {
    let etcd = tokio::task::spawn_blocking(|| EtcdCluster::start(1)).await.unwrap();
    let link = CuttableLink::to(&etcd.endpoints()[0]).await;
    let (lagging, store_a) = open(link.url(), "a").await;
    let (writer, store_b) = open(etcd.endpoints()[0].clone(), "b").await;
    register(&writer, "web-1").await;
    let first = index(&writer, "").await;
    assert!(
        store_a
            .wait_applied(structs::Index(first), Duration::from_secs(10))
            .await
    );

    // Every index the lagging server answers, in order, from a poller running throughout.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let stop = tokio::sync::watch::Sender::new(false);
    let poller = {
        let (lagging, seen, stop) = (lagging.clone(), Arc::clone(&seen), stop.clone());
        tokio::spawn(async move {
            while !*stop.borrow() {
                let i = index(&lagging, "").await;
                seen.lock().push(i);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };

    link.cut().await;
    register(&writer, "web-2").await;
    let newer = index(&writer, "").await;
    assert!(newer > first);
    assert_eq!(index(&lagging, "").await, first, "the cut-off server is behind");
    // A client that saw `newer` on the writer asks the lagging server: it waits.
    let blocked = {
        let lagging = lagging.clone();
        tokio::spawn(async move { index(&lagging, &format!("?index={newer}&wait=60s")).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !blocked.is_finished(),
        "a query at an index the server has not applied waits"
    );

    // Back in touch: the watch catches up to `newer`; the query then blocks as usual, until
    // the next change.
    link.restore();
    assert!(
        store_a
            .wait_applied(structs::Index(newer), Duration::from_secs(20))
            .await
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !blocked.is_finished(),
        "caught up, it blocks until the index passes {newer}"
    );
    register(&writer, "web-3").await;
    let woke = tokio::time::timeout(Duration::from_secs(20), blocked)
        .await
        .expect("the next change wakes it")
        .unwrap();
    assert!(woke > newer, "woke at {woke}, after {newer}");

    stop.send_replace(true);
    poller.await.unwrap();
    let seen = seen.lock().clone();
    assert!(seen.len() > 10, "the poller ran throughout: {seen:?}");
    assert!(
        seen.windows(2).all(|w| w[0] <= w[1]),
        "the lagging server's X-Consul-Index never went down: {seen:?}"
    );
    store_a.close().await;
    store_b.close().await;
}
