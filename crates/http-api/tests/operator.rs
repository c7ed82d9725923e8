//! Operator views and coordinates in process: Consul's shapes, from this server alone.
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use axum::body::Body;
use axum::http::{Request, StatusCode};
use catalog::{Store, StoreConfig};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

async fn call(app: &axum::Router, method: &str, uri: &str, body: &str) -> (StatusCode, String) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::from(body.to_owned()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn operator_views_and_coordinates_in_consuls_shape() {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let app = http_api::router(
        store,
        http_api::ApiConfig {
            node_name: "server-1".into(),
            server_addr: "10.0.0.1:8300".into(),
            ..Default::default()
        },
    );
    let register = json!({"Node": "n1", "Address": "10.0.0.2", "Service": {"Service": "web", "ID": "w1", "Connect": {"Native": true}}});
    assert_eq!(
        call(&app, "PUT", "/v1/catalog/register", &register.to_string()).await.0,
        StatusCode::OK
    );

    let (status, body) = call(&app, "GET", "/v1/operator/raft/configuration", "").await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["Servers"][0]["Node"], "server-1");
    assert_eq!(v["Servers"][0]["Address"], "10.0.0.1:8300");
    assert_eq!(v["Servers"][0]["Leader"], true);

    let v: Value = serde_json::from_str(&call(&app, "GET", "/v1/operator/autopilot/health", "").await.1).unwrap();
    assert_eq!(
        (v["Healthy"].as_bool(), v["FailureTolerance"].as_u64()),
        (Some(true), Some(0))
    );

    let v: Value = serde_json::from_str(&call(&app, "GET", "/v1/operator/usage", "").await.1).unwrap();
    let dc = &v["Usage"]["dc1"];
    assert_eq!(
        (dc["Nodes"].as_u64(), dc["ServiceInstances"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(dc["ConnectServiceInstances"]["connect-native"], 1);

    let v: Value = serde_json::from_str(&call(&app, "GET", "/v1/coordinate/datacenters", "").await.1).unwrap();
    assert_eq!(v, json!([{"Datacenter": "dc1", "AreaID": "WAN", "Coordinates": []}]));
    assert_eq!(call(&app, "GET", "/v1/coordinate/nodes", "").await.1, "[]");
    let (status, body) = call(&app, "PUT", "/v1/coordinate/update", "{}").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("no gossip"), "{body}");
    for method in ["GET", "POST", "PUT", "DELETE"] {
        let (status, body) = call(&app, method, "/v1/operator/keyring", "{}").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method}");
        assert!(body.starts_with("keyring operations do not apply"), "{method}: {body}");
    }
}
