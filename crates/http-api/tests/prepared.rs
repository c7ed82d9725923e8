//! Prepared queries in process: create, read, update, execute (filters, templates,
//! limit), explain, delete, and what is refused.
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use axum::body::Body;
use axum::http::{Request, StatusCode};
use catalog::{Store, StoreConfig};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

async fn call(app: &axum::Router, method: &str, uri: &str, body: Value) -> (StatusCode, Value, String) {
    let body = if body.is_null() {
        Body::empty()
    } else {
        Body::from(body.to_string())
    };
    let req = Request::builder().method(method).uri(uri).body(body).unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null), text)
}

fn instance(node: &str, id: &str, tags: &[&str], status: &str) -> Value {
    json!({"Node": node, "Address": "10.0.0.1",
           "Service": {"ID": id, "Service": "web", "Tags": tags, "Port": 80},
           "Checks": [{"CheckID": format!("{id}-alive"), "Name": "alive", "ServiceID": id, "Status": status}]})
}

#[tokio::test]
async fn prepared_queries_as_consul() {
    let app = http_api::router(
        Store::open(StoreConfig::default()).await.unwrap(),
        http_api::ApiConfig::default(),
    );
    for (node, id, tags, status) in [
        ("n1", "web1", &["v1"][..], "passing"),
        ("n2", "web2", &["v2"][..], "warning"),
        ("n3", "web3", &["v2"][..], "critical"),
    ] {
        assert_eq!(
            call(&app, "PUT", "/v1/catalog/register", instance(node, id, tags, status))
                .await
                .0,
            StatusCode::OK
        );
    }
    let (status, v, text) = call(
        &app,
        "POST",
        "/v1/query",
        json!({"Name": "web-all", "Service": {"Service": "web"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let id = v["ID"].as_str().unwrap().to_owned();
    // Execute by id and by name: critical instances never, warning unless OnlyPassing.
    for asked in [id.as_str(), "web-all"] {
        let (_, v, _) = call(&app, "GET", &format!("/v1/query/{asked}/execute"), Value::Null).await;
        let mut ids: Vec<&str> = v["Nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["Service"]["ID"].as_str().unwrap())
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, ["web1", "web2"]);
        assert_eq!(
            (v["Service"].as_str(), v["Datacenter"].as_str(), v["Failovers"].as_u64()),
            (Some("web"), Some("dc1"), Some(0))
        );
    }
    let (_, v, _) = call(&app, "GET", "/v1/query/web-all/execute?limit=1", Value::Null).await;
    assert_eq!(v["Nodes"].as_array().unwrap().len(), 1);
    // Update: only passing, not v1.
    let update = json!({"Name": "web-all", "Service": {"Service": "web", "OnlyPassing": true, "Tags": ["!v1"]}});
    assert_eq!(
        call(&app, "PUT", &format!("/v1/query/{id}"), update).await.0,
        StatusCode::OK
    );
    let (_, v, _) = call(&app, "GET", &format!("/v1/query/{id}/execute"), Value::Null).await;
    assert_eq!(v["Nodes"].as_array().unwrap().len(), 0);
    let (_, v, _) = call(&app, "GET", &format!("/v1/query/{id}"), Value::Null).await;
    assert_eq!(v[0]["Service"]["OnlyPassing"], true);
    assert_eq!(
        call(&app, "GET", "/v1/query", Value::Null)
            .await
            .1
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // A template answers every name under its prefix.
    let template = json!({"Name": "tag-", "Template": {"Type": "name_prefix_match", "Regexp": "^tag-(.+)$"},
                          "Service": {"Service": "web", "Tags": ["${match(1)}"]}});
    assert_eq!(call(&app, "POST", "/v1/query", template).await.0, StatusCode::OK);
    let (_, v, _) = call(&app, "GET", "/v1/query/tag-v2/execute", Value::Null).await;
    let ids: Vec<&str> = v["Nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["Service"]["ID"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["web2"]);
    let (_, v, _) = call(&app, "GET", "/v1/query/tag-v1/explain", Value::Null).await;
    assert_eq!(v["Query"]["Service"]["Tags"], json!(["v1"]));

    // Refused, naming the field; a name is unique.
    let (status, _, text) = call(
        &app,
        "POST",
        "/v1/query",
        json!({"Name": "x", "Service": {"Service": "web", "Failover": {"NearestN": 2}}}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(text.contains("Service.Failover"), "{text}");
    let (status, _, text) = call(
        &app,
        "POST",
        "/v1/query",
        json!({"Name": "web-all", "Service": {"Service": "db"}}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(text.contains("is used by query"), "{text}");
    let (status, _, text) = call(&app, "POST", "/v1/query", json!({"Name": "y", "Service": {}})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(text.contains("Service.Service"), "{text}");
    assert_eq!(
        call(&app, "GET", "/v1/query/nope/execute", Value::Null).await.0,
        StatusCode::NOT_FOUND
    );

    // Delete.
    assert_eq!(
        call(&app, "DELETE", &format!("/v1/query/{id}"), Value::Null).await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&app, "GET", &format!("/v1/query/{id}"), Value::Null).await.0,
        StatusCode::NOT_FOUND
    );
}

/// `?connect=true` answers the sidecars, and `?index=` blocks until the query or its
/// service's instances change (what an agent's cache follows for a prepared-query upstream).
#[tokio::test]
async fn execute_answers_connect_instances_and_blocks_on_the_query_and_its_instances() {
    let app = http_api::router(
        Store::open(StoreConfig::default()).await.unwrap(),
        http_api::ApiConfig::default(),
    );
    let register = |node: &str, id: &str| {
        json!({"Node": node, "Address": "10.0.0.1", "Service": {
            "Kind": "connect-proxy", "ID": format!("{id}-sidecar-proxy"), "Service": "web-sidecar-proxy",
            "Port": 21000, "Proxy": {"DestinationServiceName": "web"}}})
    };
    assert_eq!(
        call(&app, "PUT", "/v1/catalog/register", register("n1", "web1"))
            .await
            .0,
        StatusCode::OK
    );
    let (status, _, text) = call(
        &app,
        "POST",
        "/v1/query",
        json!({"Name": "web", "Service": {"Service": "web"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let req = Request::builder()
        .uri("/v1/query/web/execute?connect=true")
        .body(Body::empty())
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let index: u64 = resp.headers()["x-consul-index"].to_str().unwrap().parse().unwrap();
    let v: Value = serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(v["Nodes"][0]["Service"]["ID"], "web1-sidecar-proxy");
    let (_, plain, _) = call(&app, "GET", "/v1/query/web/execute", Value::Null).await;
    assert_eq!(
        plain["Nodes"],
        json!([]),
        "without ?connect, the service's own instances (none)"
    );

    // Blocked at the current index: an unrelated write does not answer it, a new sidecar does.
    let blocked = {
        let app = app.clone();
        tokio::spawn(async move {
            call(
                &app,
                "GET",
                &format!("/v1/query/web/execute?connect=true&index={index}&wait=30s"),
                Value::Null,
            )
            .await
        })
    };
    let other = json!({"Node": "n9", "Address": "10.0.0.9", "Service": {"Service": "db", "Port": 5432}});
    assert_eq!(call(&app, "PUT", "/v1/catalog/register", other).await.0, StatusCode::OK);
    tokio::task::yield_now().await;
    assert!(
        !blocked.is_finished(),
        "a write elsewhere does not answer the blocked execute"
    );
    assert_eq!(
        call(&app, "PUT", "/v1/catalog/register", register("n2", "web2"))
            .await
            .0,
        StatusCode::OK
    );
    let (_, v, _) = tokio::time::timeout(std::time::Duration::from_secs(10), blocked)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v["Nodes"].as_array().unwrap().len(), 2);
}
