//! User events in process: fire with filters and a payload, list by name, blocking, the
//! kept-events bound, and what is refused.
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use catalog::{Store, StoreConfig};
use http_body_util::BodyExt;
use serde_json::Value;
use std::time::Duration;
use tower::ServiceExt;

async fn call(app: &Router, method: &str, uri: &str, body: impl Into<Body>) -> (StatusCode, Option<u64>, String) {
    let req = Request::builder().method(method).uri(uri).body(body.into()).unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let index = resp
        .headers()
        .get("x-consul-index")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, index, String::from_utf8_lossy(&body).into_owned())
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap()
}

#[tokio::test]
async fn events_fire_list_block_and_stay_bounded() {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let app = http_api::router(store, http_api::ApiConfig::default());
    let (status, _, body) = call(&app, "PUT", "/v1/event/fire/deploy?service=web&tag=v2", "1609030").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let fired = json(&body);
    assert_eq!(fired["Name"], "deploy");
    assert_eq!(fired["Payload"], "MTYwOTAzMA==");
    assert_eq!(
        (fired["ServiceFilter"].as_str(), fired["TagFilter"].as_str()),
        (Some("web"), Some("v2"))
    );
    assert_eq!((fired["Version"].as_u64(), fired["LTime"].as_u64()), (Some(1), Some(1)));
    assert_eq!(
        uuid::Uuid::parse_str(fired["ID"].as_str().unwrap())
            .unwrap()
            .get_version_num(),
        4
    );

    call(&app, "PUT", "/v1/event/fire/restart", "").await;
    let (_, index, body) = call(&app, "GET", "/v1/event/list", "").await;
    let all = json(&body);
    assert_eq!(all.as_array().unwrap().len(), 2);
    assert!(all[1]["Payload"].is_null(), "an empty payload is null");
    let (_, _, body) = call(&app, "GET", "/v1/event/list?name=deploy", "").await;
    assert_eq!(json(&body).as_array().unwrap().len(), 1);

    // A blocking list wakes on the next event.
    let waiter = {
        let app = app.clone();
        let uri = format!("/v1/event/list?name=deploy&index={}&wait=5m", index.unwrap());
        tokio::spawn(async move { call(&app, "GET", &uri, "").await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    call(&app, "PUT", "/v1/event/fire/deploy", "2").await;
    let (_, woken_index, body) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(woken_index > index);
    assert_eq!(json(&body).as_array().unwrap().len(), 2);

    // At most 256 are kept: the oldest go, in order.
    for i in 0..260 {
        call(&app, "PUT", &format!("/v1/event/fire/bulk-{i}"), "").await;
    }
    let (_, _, body) = call(&app, "GET", "/v1/event/list", "").await;
    let kept = json(&body);
    let kept = kept.as_array().unwrap();
    assert_eq!(kept.len(), 256);
    assert_eq!(kept[0]["Name"], "bulk-4");
    assert_eq!(kept[255]["Name"], "bulk-259");
    assert!(kept.windows(2).all(|w| w[0]["LTime"].as_u64() < w[1]["LTime"].as_u64()));

    // Refused, naming the problem.
    let (status, _, body) = call(&app, "PUT", "/v1/event/fire/x", vec![b'p'; 513]).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(body.contains("512 byte limit"), "{body}");
    let (status, _, body) = call(&app, "PUT", "/v1/event/fire/x?node=(", "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.starts_with("node: not a regular expression"), "{body}");
    let (status, _, body) = call(&app, "PUT", "/v1/event/fire/x?tag=v1", "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, _, body) = call(&app, "GET", "/v1/event/list?node=web", "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("?node"), "{body}");
}
