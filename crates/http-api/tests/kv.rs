//! The KV API in process: Consul's shapes, parameters and errors, and blocking on a key and
//! on a prefix.
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
    headers: axum::http::HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.text()))
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

async fn app() -> Router {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    http_api::router(store, http_api::ApiConfig::default())
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

async fn put(app: &Router, uri: &str, value: &[u8]) -> Value {
    let r = call(app, "PUT", uri, value.to_vec()).await;
    assert_eq!(r.status, StatusCode::OK, "PUT {uri}: {}", r.text());
    r.json()
}

async fn get(app: &Router, uri: &str) -> Reply {
    call(app, "GET", uri, Body::empty()).await
}

#[tokio::test]
async fn entries_flags_and_check_and_set_as_consul() {
    let app = app().await;
    assert_eq!(put(&app, "/v1/kv/app/config?flags=42", b"hello").await, json!(true));
    let r = get(&app, "/v1/kv/app/config").await;
    assert_eq!(r.status, StatusCode::OK);
    let e = &r.json()[0];
    assert_eq!(e["Key"], "app/config");
    assert_eq!(e["Value"], "aGVsbG8=");
    assert_eq!(e["Flags"], 42);
    assert_eq!(e["LockIndex"], 0);
    assert!(e.get("Session").is_none());
    let modify = e["ModifyIndex"].as_u64().unwrap();
    assert_eq!(e["CreateIndex"].as_u64(), Some(modify));
    assert_eq!(r.index, Some(modify));

    // Check-and-set: 0 only creates; a stale index is refused; the current one applies.
    assert_eq!(put(&app, "/v1/kv/app/config?cas=0", b"x").await, json!(false));
    assert_eq!(
        put(&app, &format!("/v1/kv/app/config?cas={}", modify + 7), b"x").await,
        json!(false)
    );
    assert_eq!(
        put(&app, &format!("/v1/kv/app/config?cas={modify}"), b"v2").await,
        json!(true)
    );
    let e = get(&app, "/v1/kv/app/config").await.json()[0].clone();
    assert_eq!(e["CreateIndex"].as_u64(), Some(modify));
    assert!(e["ModifyIndex"].as_u64().unwrap() > modify);
    assert_eq!(e["Flags"], 0, "a write sets the flags it names (none: 0)");

    // An empty value is null; raw gives the bytes back, not guessed by a browser.
    put(&app, "/v1/kv/empty", b"").await;
    assert!(get(&app, "/v1/kv/empty").await.json()[0]["Value"].is_null());
    put(&app, "/v1/kv/page", b"<script>x</script>").await;
    let raw = get(&app, "/v1/kv/page?raw").await;
    assert_eq!(raw.body, b"<script>x</script>");
    assert_eq!(raw.headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(raw.headers["x-content-type-options"], "nosniff");
    put(&app, "/v1/kv/bin", &[0xff, 0x00, 0x80]).await;
    assert_eq!(
        get(&app, "/v1/kv/bin?raw").await.headers["content-type"],
        "application/octet-stream"
    );

    // Delete with a stale cas is refused; with the current one (or none) it goes.
    let modify = get(&app, "/v1/kv/page").await.index.unwrap();
    let r = call(
        &app,
        "DELETE",
        &format!("/v1/kv/page?cas={}", modify - 1),
        Body::empty(),
    )
    .await;
    assert_eq!(r.json(), json!(false));
    let r = call(&app, "DELETE", &format!("/v1/kv/page?cas={modify}"), Body::empty()).await;
    assert_eq!(r.json(), json!(true));
    assert_eq!(
        call(&app, "DELETE", "/v1/kv/never", Body::empty()).await.json(),
        json!(true)
    );
    // A missing key: 404, no body, an index to block on.
    let r = get(&app, "/v1/kv/page").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(r.body.is_empty());
    assert!(r.index.unwrap() > modify);
}

#[tokio::test]
async fn listings_recurse_keys_and_separator() {
    let app = app().await;
    for key in ["web/a", "web/b/c", "web/b/d", "webhook", "z"] {
        put(&app, &format!("/v1/kv/{key}"), b"v").await;
    }
    let r = get(&app, "/v1/kv/web/?recurse").await;
    let keys: Vec<Value> = r.json().as_array().unwrap().iter().map(|e| e["Key"].clone()).collect();
    assert_eq!(keys, ["web/a", "web/b/c", "web/b/d"]);
    assert_eq!(
        get(&app, "/v1/kv/web?keys").await.json(),
        json!(["web/a", "web/b/c", "web/b/d", "webhook"])
    );
    assert_eq!(
        get(&app, "/v1/kv/web/?keys&separator=/").await.json(),
        json!(["web/a", "web/b/"])
    );
    // Consul's old spelling still works.
    assert_eq!(
        get(&app, "/v1/kv/?keys&seperator=/").await.json(),
        json!(["web/", "webhook", "z"])
    );
    // Nothing under a prefix: 404; at the root, an empty list.
    assert_eq!(get(&app, "/v1/kv/none/?recurse").await.status, StatusCode::NOT_FOUND);
    assert_eq!(get(&app, "/v1/kv/none/?keys").await.status, StatusCode::NOT_FOUND);
    // Recursive delete of a prefix leaves the rest.
    let r = call(&app, "DELETE", "/v1/kv/web/?recurse", Body::empty()).await;
    assert_eq!(r.json(), json!(true));
    assert_eq!(get(&app, "/v1/kv/?keys").await.json(), json!(["webhook", "z"]));
    call(&app, "DELETE", "/v1/kv/?recurse", Body::empty()).await;
    assert_eq!(get(&app, "/v1/kv/?keys").await.json(), json!([]));
}

#[tokio::test]
async fn bad_requests_name_the_problem() {
    let app = app().await;
    let r = call(&app, "PUT", "/v1/kv/a?cas=1&acquire=s", "v").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.text().starts_with("Conflicting flags: cas, acquire"), "{}", r.text());
    let r = call(&app, "DELETE", "/v1/kv/a?recurse&cas=1", Body::empty()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = call(&app, "PUT", "/v1/kv/a?acquire=s", "v").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.text().contains("invalid session \"s\""), "{}", r.text());
    let r = get(&app, "/v1/kv/").await;
    assert_eq!(
        (r.status, r.text().trim()),
        (StatusCode::BAD_REQUEST, "Missing key name")
    );
    let r = call(&app, "DELETE", "/v1/kv/", Body::empty()).await;
    assert_eq!(
        (r.status, r.text().trim()),
        (StatusCode::BAD_REQUEST, "Missing key name")
    );
    let r = call(&app, "PUT", "/v1/kv/a?flags=x", "v").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.text().contains("flags"), "{}", r.text());
    let r = call(&app, "PUT", "/v1/kv/big", vec![b'x'; 512 * 1024 + 1]).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(r.text().contains("524288"), "{}", r.text());
    // Exactly the limit is fine.
    assert_eq!(put(&app, "/v1/kv/big", &vec![b'x'; 512 * 1024]).await, json!(true));
    // Nothing of the refused writes was stored.
    assert_eq!(get(&app, "/v1/kv/?keys").await.json(), json!(["big"]));
}

#[tokio::test]
async fn blocking_on_a_key_and_on_a_prefix() {
    let app = app().await;
    put(&app, "/v1/kv/a/x", b"1").await;
    put(&app, "/v1/kv/b/y", b"1").await;
    let key_index = get(&app, "/v1/kv/a/x").await.index.unwrap();
    let prefix_index = get(&app, "/v1/kv/a/?recurse").await.index.unwrap();
    assert_eq!(prefix_index, key_index);
    let wait = |uri: String| {
        let app = app.clone();
        tokio::spawn(async move { get(&app, &uri).await })
    };
    let on_key = wait(format!("/v1/kv/a/x?index={key_index}&wait=5m"));
    let on_prefix = wait(format!("/v1/kv/a/?recurse&index={prefix_index}&wait=5m"));
    let on_keys = wait(format!("/v1/kv/a/?keys&index={prefix_index}&wait=5m"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A write under another prefix wakes none of them.
    put(&app, "/v1/kv/b/y", b"2").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!on_key.is_finished() && !on_prefix.is_finished() && !on_keys.is_finished());
    // A new key under the prefix wakes the listings, not the other key.
    put(&app, "/v1/kv/a/z", b"1").await;
    let recurse = tokio::time::timeout(Duration::from_secs(10), on_prefix)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(recurse.json().as_array().unwrap().len(), 2);
    let keys = tokio::time::timeout(Duration::from_secs(10), on_keys)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(keys.json(), json!(["a/x", "a/z"]));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!on_key.is_finished());
    // A delete under the prefix moves it on too.
    let now = recurse.index.unwrap();
    let after_delete = wait(format!("/v1/kv/a/?recurse&index={now}&wait=5m"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    call(&app, "DELETE", "/v1/kv/a/z", Body::empty()).await;
    let r = tokio::time::timeout(Duration::from_secs(10), after_delete)
        .await
        .unwrap()
        .unwrap();
    assert!(r.index.unwrap() > now);
    assert_eq!(r.json().as_array().unwrap().len(), 1);
    // The key's own change wakes its watcher.
    put(&app, "/v1/kv/a/x", b"2").await;
    let r = tokio::time::timeout(Duration::from_secs(10), on_key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.json()[0]["Value"], "Mg==");
    // Without a change, the wait runs out with the same index.
    let idle = get(
        &app,
        &format!(
            "/v1/kv/b/?recurse&index={}&wait=30ms",
            get(&app, "/v1/kv/b/?recurse").await.index.unwrap()
        ),
    )
    .await;
    assert_eq!(idle.status, StatusCode::OK);
}

#[tokio::test]
async fn transactions_apply_all_or_nothing() {
    let app = app().await;
    put(&app, "/v1/kv/t/a", b"old").await;
    let a_index = get(&app, "/v1/kv/t/a").await.index.unwrap();
    let ops = json!([
        {"KV": {"Verb": "cas", "Key": "t/a", "Value": "bmV3", "Index": a_index}},
        {"KV": {"Verb": "set", "Key": "t/b", "Value": "Yg==", "Flags": 3}},
        {"KV": {"Verb": "get", "Key": "t/a"}},
        {"KV": {"Verb": "check-not-exists", "Key": "t/c"}},
        {"Node": {"Verb": "set", "Node": {"Node": "tx-node", "Address": "10.0.0.9"}}},
        {"Service": {"Verb": "set", "Node": "tx-node", "Service": {"ID": "db1", "Service": "db", "Port": 5432}}},
        {"KV": {"Verb": "get-tree", "Key": "t/"}},
    ]);
    let r = call(&app, "PUT", "/v1/txn", ops.to_string()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert!(v["Errors"].is_null());
    let results = v["Results"].as_array().unwrap();
    // cas, set, get, node, service, then the tree's two entries.
    assert_eq!(results.len(), 7, "{v}");
    assert!(results[0]["KV"]["Value"].is_null(), "a write's result carries no value");
    assert_eq!(results[2]["KV"]["Value"], "bmV3");
    assert_eq!(results[3]["Node"]["Address"], "10.0.0.9");
    assert_eq!(results[4]["Service"]["Port"], 5432);
    assert_eq!(results[6]["KV"]["Flags"], 3);
    // All committed at one index.
    let idx = results[0]["KV"]["ModifyIndex"].as_u64().unwrap();
    assert_eq!(results[1]["KV"]["ModifyIndex"].as_u64(), Some(idx));
    assert_eq!(results[4]["Service"]["ModifyIndex"].as_u64(), Some(idx));

    // A stale cas in the middle rolls back the operations before it.
    let ops = json!([
        {"KV": {"Verb": "set", "Key": "t/c", "Value": "Yw=="}},
        {"KV": {"Verb": "cas", "Key": "t/a", "Value": "eA==", "Index": a_index}},
    ]);
    let r = call(&app, "PUT", "/v1/txn", ops.to_string()).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
    let v = r.json();
    assert!(v["Results"].is_null());
    assert_eq!(v["Errors"][0]["OpIndex"], 1);
    assert!(
        v["Errors"][0]["What"].as_str().unwrap().contains("index is stale"),
        "{v}"
    );
    assert_eq!(
        get(&app, "/v1/kv/t/c").await.status,
        StatusCode::NOT_FOUND,
        "the first operation stayed"
    );
    // Later operations see earlier ones: create then check.
    let ops = json!([
        {"KV": {"Verb": "set", "Key": "t/d", "Value": "ZA=="}},
        {"KV": {"Verb": "check-not-exists", "Key": "t/d"}},
    ]);
    let r = call(&app, "PUT", "/v1/txn", ops.to_string()).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.json()["Errors"][0]["OpIndex"], 1);
    // Bad input: an unknown verb names itself; too many operations is a 413.
    let r = call(
        &app,
        "PUT",
        "/v1/txn",
        json!([{"KV": {"Verb": "frob", "Key": "x"}}]).to_string(),
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.json()["Errors"][0]["What"], "unknown KV verb \"frob\"");
    let many: Vec<Value> = (0..129)
        .map(|i| json!({"KV": {"Verb": "set", "Key": format!("m/{i}")}}))
        .collect();
    let r = call(&app, "PUT", "/v1/txn", Value::Array(many).to_string()).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(r.text().contains("128"), "{}", r.text());
    let r = call(&app, "PUT", "/v1/txn", json!([{"Nope": {}}]).to_string()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
}
