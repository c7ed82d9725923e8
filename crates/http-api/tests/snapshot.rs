//! `/v1/snapshot` in process: a save and a restore through the API, a blocked client woken
//! by the restore at a higher index, and damaged archives refused with a 400 that changes
//! nothing.
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use catalog::{Store, StoreConfig};
use http_body_util::BodyExt;
use std::time::Duration;
use tower::ServiceExt;

struct Reply {
    status: StatusCode,
    index: Option<u64>,
    headers: axum::http::HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

async fn call(app: &Router, method: &str, uri: &str, body: impl Into<Body>) -> Reply {
    let req = Request::builder().method(method).uri(uri).body(body.into()).unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let index = headers
        .get("x-consul-index")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let body = resp.into_body().collect().await.unwrap().to_bytes().to_vec();
    Reply {
        status,
        index,
        headers,
        body,
    }
}

async fn ok(app: &Router, method: &str, uri: &str, body: impl Into<Body>) -> Reply {
    let r = call(app, method, uri, body).await;
    assert_eq!(r.status, StatusCode::OK, "{method} {uri}: {}", r.text());
    r
}

#[tokio::test]
async fn a_snapshot_saved_and_restored_over_the_api_brings_the_catalog_back() {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let app = http_api::router(store.clone(), http_api::ApiConfig::default());
    ok(&app, "PUT", "/v1/kv/app/config", "v1").await;
    let register = r#"{"Node":"n1","Address":"10.0.0.1","Service":{"Service":"web","Port":80}}"#;
    ok(&app, "PUT", "/v1/catalog/register", register).await;
    let saved = ok(&app, "GET", "/v1/snapshot", Body::empty()).await;
    assert_eq!(saved.headers["content-type"], "application/x-gzip");
    assert_eq!(&saved.body[..2], &[0x1f, 0x8b], "a gzip stream");
    let saved_at = saved.index.unwrap();

    ok(&app, "PUT", "/v1/kv/app/config", "v2").await;
    ok(&app, "PUT", "/v1/kv/app/extra", "x").await;
    ok(&app, "PUT", "/v1/catalog/deregister", r#"{"Node":"n1"}"#).await;
    let now = call(&app, "GET", "/v1/kv/app/config", Body::empty())
        .await
        .index
        .unwrap();
    assert!(now > saved_at);

    // A client blocked on the key wakes when the restore lands, at a higher index.
    let blocked = {
        let app = app.clone();
        tokio::spawn(async move {
            call(
                &app,
                "GET",
                &format!("/v1/kv/app/config?index={now}&wait=30s"),
                Body::empty(),
            )
            .await
        })
    };
    // (Whether it parks before the restore or asks after it, it must answer above `now`.)
    tokio::task::yield_now().await;
    let restored = ok(&app, "PUT", "/v1/snapshot", saved.body.clone()).await;
    assert!(restored.index.unwrap() > now, "{:?} > {now}", restored.index);
    let woke = tokio::time::timeout(Duration::from_secs(10), blocked)
        .await
        .unwrap()
        .unwrap();
    assert!(woke.index.unwrap() > now);

    let raw = ok(&app, "GET", "/v1/kv/app/config?raw", Body::empty()).await;
    assert_eq!(raw.text(), "v1");
    assert_eq!(
        call(&app, "GET", "/v1/kv/app/extra", Body::empty()).await.status,
        StatusCode::NOT_FOUND
    );
    let web = ok(&app, "GET", "/v1/catalog/service/web", Body::empty()).await;
    assert!(web.text().contains("\"n1\""), "{}", web.text());
    store.close().await;
}

#[tokio::test]
async fn a_damaged_archive_is_a_400_naming_the_problem_and_changes_nothing() {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let app = http_api::router(store.clone(), http_api::ApiConfig::default());
    ok(&app, "PUT", "/v1/kv/k", "before").await;
    let saved = ok(&app, "GET", "/v1/snapshot", Body::empty()).await.body;
    ok(&app, "PUT", "/v1/kv/k", "after").await;
    let index = store.read().index;
    let mut flipped = saved.clone();
    let at = flipped.len() / 2;
    flipped[at] ^= 0x10;
    let cases: [(&str, Vec<u8>, &str); 4] = [
        ("truncated", saved[..saved.len() / 2].to_vec(), "damaged or truncated"),
        ("flipped", flipped, "snapshot"),
        ("not an archive", b"hello".to_vec(), "damaged or truncated"),
        ("empty", Vec::new(), "body must be a snapshot archive"),
    ];
    for (what, body, says) in cases {
        let r = call(&app, "PUT", "/v1/snapshot", body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{what}: {}", r.text());
        assert!(r.text().contains(says), "{what}: {}", r.text());
    }
    crate::only_refusals_recorded_since(&store, index, "nothing was written");
    assert_eq!(ok(&app, "GET", "/v1/kv/k?raw", Body::empty()).await.text(), "after");
    store.close().await;
}
