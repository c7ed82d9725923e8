//! Gateway routes in process: `/v1/catalog/gateway-services/:gateway` and
//! `/v1/health/ingress/:service`, and the gateway entries' write-time checks over HTTP.
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use catalog::{Store, StoreConfig};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::time::Duration;
use tower::ServiceExt;

struct Reply {
    status: StatusCode,
    index: Option<u64>,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

async fn app() -> Router {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    http_api::router(store, http_api::ApiConfig::default())
}

async fn call(app: &Router, method: &str, uri: &str, body: Body) -> Reply {
    let req = Request::builder().method(method).uri(uri).body(body).unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let index = resp
        .headers()
        .get("x-consul-index")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        index,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

async fn get(app: &Router, uri: &str) -> Reply {
    call(app, "GET", uri, Body::empty()).await
}

async fn put(app: &Router, uri: &str, body: Value) -> Reply {
    call(app, "PUT", uri, Body::from(body.to_string())).await
}

async fn put_ok(app: &Router, uri: &str, body: Value) {
    let r = put(app, uri, body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

fn register(id: &str, name: &str, kind: &str, status: &str) -> Value {
    json!({"Node": "n1", "Address": "10.0.0.1",
        "Service": {"ID": id, "Service": name, "Kind": kind, "Port": 8080},
        "Checks": [{"CheckID": format!("{id}-alive"), "ServiceID": id, "Status": status}]})
}

#[tokio::test]
async fn gateway_services_in_consuls_shape_and_blocking() {
    let app = app().await;
    put_ok(
        &app,
        "/v1/config",
        json!({"Kind": "service-defaults", "Name": "web", "Protocol": "http"}),
    )
    .await;
    put_ok(
        &app,
        "/v1/config",
        json!({"Kind": "ingress-gateway", "Name": "ing", "Listeners": [
            {"Port": 8080, "Protocol": "http", "Services": [{"Name": "web", "Hosts": ["web.example"]}]}]}),
    )
    .await;
    let r = get(&app, "/v1/catalog/gateway-services/ing").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.json(),
        json!([{"Gateway": {"Name": "ing"}, "Service": {"Name": "web"}, "GatewayKind": "ingress-gateway",
            "Port": 8080, "Protocol": "http", "Hosts": ["web.example"]}])
    );
    // Unknown gateway: an empty list with an index to block on.
    let r = get(&app, "/v1/catalog/gateway-services/nope").await;
    assert_eq!(r.json(), json!([]));
    assert!(r.index.unwrap() >= 1);

    // A wildcard terminating gateway wakes when a service appears.
    put_ok(
        &app,
        "/v1/config",
        json!({"Kind": "terminating-gateway", "Name": "tgw", "Services": [{"Name": "*"}]}),
    )
    .await;
    let first = get(&app, "/v1/catalog/gateway-services/tgw").await;
    assert_eq!(first.json(), json!([]));
    let index = first.index.unwrap();
    let waiter = {
        let app = app.clone();
        tokio::spawn(async move { get(&app, &format!("/v1/catalog/gateway-services/tgw?index={index}&wait=5m")).await })
    };
    tokio::task::yield_now().await;
    put_ok(
        &app,
        "/v1/catalog/register",
        register("legacy", "legacy", "", "passing"),
    )
    .await;
    let r = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(r.index.unwrap() > index);
    let body = r.json();
    assert_eq!(body[0]["Service"]["Name"], "legacy");
    assert_eq!(body[0]["GatewayKind"], "terminating-gateway");
    assert_eq!(body[0]["FromWildcard"], true);
}

#[tokio::test]
async fn ingress_health_lists_the_gateways_exposing_a_service() {
    let app = app().await;
    put_ok(
        &app,
        "/v1/config",
        json!({"Kind": "service-defaults", "Name": "web", "Protocol": "http"}),
    )
    .await;
    put_ok(&app, "/v1/catalog/register", register("web1", "web", "", "passing")).await;
    put_ok(
        &app,
        "/v1/catalog/register",
        register("ing1", "ing", "ingress-gateway", "passing"),
    )
    .await;
    put_ok(
        &app,
        "/v1/catalog/register",
        register("ing2", "ing", "ingress-gateway", "critical"),
    )
    .await;
    put_ok(
        &app,
        "/v1/catalog/register",
        register("other1", "other", "ingress-gateway", "passing"),
    )
    .await;
    let r = get(&app, "/v1/health/ingress/web").await;
    assert_eq!(r.json(), json!([]), "no entry exposes web yet");
    let index = r.index.unwrap();
    let waiter = {
        let app = app.clone();
        tokio::spawn(async move { get(&app, &format!("/v1/health/ingress/web?index={index}&wait=5m")).await })
    };
    tokio::task::yield_now().await;
    put_ok(
        &app,
        "/v1/config",
        json!({"Kind": "ingress-gateway", "Name": "ing", "Listeners": [
            {"Port": 8080, "Protocol": "http", "Services": [{"Name": "*"}]}]}),
    )
    .await;
    let r = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .unwrap()
        .unwrap();
    let ids: Vec<String> = r
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|csn| csn["Service"]["ID"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["ing1", "ing2"]);
    let passing = get(&app, "/v1/health/ingress/web?passing").await.json();
    assert_eq!(passing.as_array().unwrap().len(), 1);
    assert_eq!(passing[0]["Service"]["ID"], "ing1");
    assert_eq!(passing[0]["Service"]["Kind"], "ingress-gateway");
    // A gateway instance's health wakes the query.
    let index = get(&app, "/v1/health/ingress/web").await.index.unwrap();
    put_ok(
        &app,
        "/v1/catalog/register",
        register("ing2", "ing", "ingress-gateway", "passing"),
    )
    .await;
    let r = get(&app, &format!("/v1/health/ingress/web?index={index}&wait=5m&passing")).await;
    assert_eq!(r.json().as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn gateway_entries_are_checked_on_write() {
    let app = app().await;
    let r = put(
        &app,
        "/v1/config",
        json!({"Kind": "ingress-gateway", "Name": "ing", "Listeners": [
            {"Port": 8080, "Protocol": "http", "Services": [{"Name": "web"}]}]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.body
            .contains("ingress-gateway \"ing\" Listeners[0].Services[0].Name: service \"web\" has protocol tcp"),
        "{}",
        r.body
    );
    let r = put(
        &app,
        "/v1/config",
        json!({"Kind": "terminating-gateway", "Name": "tgw", "Services": [{"Name": "db", "SNI": "db.example"}]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("Services[0].CAFile: required with SNI"), "{}", r.body);
}

fn condition<'v>(entry: &'v Value, kind: &str) -> &'v Value {
    entry["Status"]["Conditions"]
        .as_array()
        .unwrap_or_else(|| panic!("no status: {entry}"))
        .iter()
        .find(|c| c["Type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} condition: {entry}"))
}

/// The API gateway's entries carry a status derived from what they name, never the one a
/// client wrote; a blocking read of a route wakes when a service it names appears.
#[tokio::test]
async fn api_gateway_status_follows_services_and_routes() {
    let app = app().await;
    put_ok(
        &app,
        "/v1/config",
        json!({"Kind": "api-gateway", "Name": "gw", "Listeners": [{"Name": "web", "Port": 80, "Protocol": "http"}]}),
    )
    .await;
    put_ok(
        &app,
        "/v1/config",
        json!({"Kind": "http-route", "Name": "r", "Parents": [{"Name": "gw"}],
               "Rules": [{"Services": [{"Name": "api"}]}],
               "Status": {"Conditions": [{"Type": "Bound", "Status": "False", "Reason": "Made", "Message": "up"}]}}),
    )
    .await;
    let route = get(&app, "/v1/config/http-route/r").await;
    let r = route.json();
    assert_eq!(condition(&r, "Bound")["Status"], "True", "{r}");
    assert_eq!(condition(&r, "Bound")["Resource"]["Name"], "gw", "{r}");
    let refs = condition(&r, "ResolvedRefs");
    assert_eq!(
        (refs["Status"].as_str(), refs["Reason"].as_str()),
        (Some("False"), Some("BackendNotFound"))
    );
    assert!(refs["Message"].as_str().unwrap().contains("api"), "{r}");
    // A blocking read wakes when api is registered, and then says it resolves.
    let index = route.index.unwrap();
    let waiting = {
        let app = app.clone();
        tokio::spawn(async move { get(&app, &format!("/v1/config/http-route/r?index={index}&wait=5s")).await })
    };
    // Registered before or after the read starts waiting: either way its index moves.
    put_ok(&app, "/v1/catalog/register", register("api1", "api", "", "passing")).await;
    let woken = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(woken.index.unwrap() > index);
    assert_eq!(
        condition(&woken.json(), "ResolvedRefs")["Status"],
        "True",
        "{}",
        woken.body
    );
    // The gateway lists the route's listener as conflict-free; listing routes shows status.
    let list = get(&app, "/v1/config/http-route").await.json();
    assert_eq!(condition(&list[0], "Accepted")["Status"], "True");
    let gw = get(&app, "/v1/config/api-gateway/gw").await.json();
    assert_eq!(condition(&gw, "Conflicted")["Status"], "False", "{gw}");
    // A route naming a gateway that does not exist says so.
    put_ok(
        &app,
        "/v1/config",
        json!({"Kind": "tcp-route", "Name": "t", "Parents": [{"Name": "nowhere"}], "Services": [{"Name": "api"}]}),
    )
    .await;
    let t = get(&app, "/v1/config/tcp-route/t").await.json();
    assert_eq!(condition(&t, "Bound")["Reason"], "GatewayNotFound", "{t}");
}
