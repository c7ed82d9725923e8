//! The agent's HTTP API in process (no server): status codes and messages Consul's clients
//! rely on.
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use agent::{Agent, AgentConfig};
use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

async fn app() -> (Router, Agent) {
    let agent = Agent::start(AgentConfig {
        node: "n1".into(),
        // Nothing listens on port 1: every forwarded request fails.
        servers: vec!["127.0.0.1:1".into()],
        ..AgentConfig::default()
    })
    .await
    .unwrap();
    (agent::http::router(agent.clone()), agent)
}

async fn call(app: &Router, method: &str, uri: &str, body: Value) -> (StatusCode, String) {
    let body = if body.is_null() {
        Body::empty()
    } else {
        Body::from(body.to_string())
    };
    let req = Request::builder().method(method).uri(uri).body(body).unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test]
async fn bad_input_is_a_400_naming_the_field_and_changes_nothing() {
    let (app, agent) = app().await;
    let (st, body) = call(
        &app,
        "PUT",
        "/v1/agent/service/register",
        json!({"name": "web", "port": "x"}),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(body.starts_with("request decode failed: Port:"), "{body}");
    let (st, body) = call(&app, "PUT", "/v1/agent/service/register", Value::Null).await;
    assert_eq!(
        (st, body.trim()),
        (
            StatusCode::BAD_REQUEST,
            "request body is empty: expected a service definition"
        )
    );
    let (st, body) = call(
        &app,
        "PUT",
        "/v1/agent/service/register",
        json!({"Name": "web", "Check": {"GRPC": "127.0.0.1:9000", "Interval": "5s"}}),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(body.starts_with("Check.GRPC: not allowed"), "{body}");
    let (st, body) = call(&app, "PUT", "/v1/agent/check/register", json!({"Name": "c"})).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(body.starts_with("TTL: required"), "{body}");
    assert!(agent.state().services().is_empty() && agent.state().checks().is_empty());
    let (st, body) = call(
        &app,
        "PUT",
        "/v1/agent/service/maintenance/web?enable=maybe",
        Value::Null,
    )
    .await;
    assert_eq!(
        (st, body.trim()),
        (
            StatusCode::BAD_REQUEST,
            "invalid value for ?enable: \"maybe\" is not a boolean (use true or false)"
        )
    );
    let (st, body) = call(&app, "GET", "/v1/agent/services?filter=Service.Foo==web", Value::Null).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(
        body.starts_with("filter: unknown selector \"Service.Foo\" at offset 0"),
        "{body}"
    );
    agent.shutdown().await;
}

#[tokio::test]
async fn unknown_ids_are_404s_and_ttl_reports_need_a_ttl_check() {
    let (app, agent) = app().await;
    for uri in [
        "/v1/agent/service/deregister/nope",
        "/v1/agent/check/deregister/nope",
        "/v1/agent/check/pass/nope",
        "/v1/agent/service/maintenance/nope?enable=true",
    ] {
        assert_eq!(
            call(&app, "PUT", uri, Value::Null).await.0,
            StatusCode::NOT_FOUND,
            "{uri}"
        );
    }
    assert_eq!(
        call(&app, "GET", "/v1/agent/service/nope", Value::Null).await.0,
        StatusCode::NOT_FOUND
    );
    let reg =
        json!({"Name": "web", "Port": 80, "Checks": [{"CheckID": "tcp", "TCP": "127.0.0.1:80", "Interval": "10s"}]});
    assert_eq!(
        call(&app, "PUT", "/v1/agent/service/register", reg).await.0,
        StatusCode::OK
    );
    let (st, body) = call(&app, "PUT", "/v1/agent/check/pass/tcp", Value::Null).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(body.contains("not a TTL check"), "{body}");
    let (st, body) = call(&app, "PUT", "/v1/agent/check/update/tcp", json!({"Status": "sideways"})).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(body.starts_with("Status:"), "{body}");
    agent.shutdown().await;
}

#[tokio::test]
async fn local_health_answers_with_consul_status_codes() {
    let (app, agent) = app().await;
    let reg = json!({"Name": "web", "ID": "web-1", "Port": 80, "Check": {"CheckID": "t", "TTL": "60s"}});
    assert_eq!(
        call(&app, "PUT", "/v1/agent/service/register", reg).await.0,
        StatusCode::OK
    );
    let (st, body) = call(&app, "GET", "/v1/agent/health/service/id/web-1", Value::Null).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["AggregatedStatus"], "critical");
    assert_eq!(v["Service"]["ID"], "web-1");
    assert_eq!(v["Checks"][0]["CheckID"], "t");
    assert_eq!(
        call(&app, "PUT", "/v1/agent/check/warn/t?note=slow", Value::Null)
            .await
            .0,
        StatusCode::OK
    );
    let (st, body) = call(
        &app,
        "GET",
        "/v1/agent/health/service/name/web?format=text",
        Value::Null,
    )
    .await;
    assert_eq!((st, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, "warning"));
    assert_eq!(
        call(
            &app,
            "PUT",
            "/v1/agent/check/update/t",
            json!({"Status": "passing", "Output": "ok"})
        )
        .await
        .0,
        StatusCode::OK
    );
    let (st, body) = call(&app, "GET", "/v1/agent/health/service/name/web", Value::Null).await;
    assert_eq!(st, StatusCode::OK);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v[0]["AggregatedStatus"], "passing");
    assert_eq!(v[0]["Checks"][0]["Output"], "ok");
    assert_eq!(
        call(
            &app,
            "PUT",
            "/v1/agent/service/maintenance/web-1?enable=True",
            Value::Null
        )
        .await
        .0,
        StatusCode::OK
    );
    let (st, body) = call(
        &app,
        "GET",
        "/v1/agent/health/service/id/web-1?format=text",
        Value::Null,
    )
    .await;
    assert_eq!((st, body.as_str()), (StatusCode::SERVICE_UNAVAILABLE, "maintenance"));
    assert_eq!(
        call(&app, "GET", "/v1/agent/health/service/name/nope", Value::Null)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    // Agent views drop what the catalog stamps and add the datacenter.
    let (_, body) = call(&app, "GET", "/v1/agent/services", Value::Null).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["web-1"]["Datacenter"], "dc1");
    assert!(v["web-1"].get("CreateIndex").is_none() && v["web-1"].get("Proxy").is_none());
    let (_, body) = call(&app, "GET", "/v1/agent/self", Value::Null).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["Config"]["NodeName"].as_str(), v["Config"]["Server"].as_bool()),
        (Some("n1"), Some(false))
    );
    agent.shutdown().await;
}

#[tokio::test]
async fn forwarding_without_a_server_is_a_500_with_one_line() {
    let (app, agent) = app().await;
    let (st, body) = call(&app, "GET", "/v1/health/service/web?index=5&wait=1s", Value::Null).await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body.lines().count(), 1, "{body}");
    assert!(
        body.starts_with("cannot forward to a server: no server answered"),
        "{body}"
    );
    // Only /v1 is forwarded; the agent serves the dashboard itself.
    assert_eq!(
        call(&app, "GET", "/elsewhere/", Value::Null).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(call(&app, "GET", "/ui/", Value::Null).await.0, StatusCode::OK);
    // The server that did not answer shows as failed (4) among the members.
    let (_, body) = call(&app, "GET", "/v1/agent/members", Value::Null).await;
    let members: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(members[0]["Name"], "n1");
    assert_eq!(members[0]["Status"], 1);
    assert_eq!(members[1]["Tags"]["role"], "consul");
    assert_eq!(members[1]["Status"], 4);
    agent.shutdown().await;
}

#[tokio::test]
async fn a_service_read_blocks_on_its_content_hash() {
    let (app, agent) = app().await;
    let reg = json!({"Name": "web", "Port": 80, "Tags": ["a"]});
    assert_eq!(
        call(&app, "PUT", "/v1/agent/service/register", reg).await.0,
        StatusCode::OK
    );
    let (st, body) = call(&app, "GET", "/v1/agent/service/web", Value::Null).await;
    assert_eq!(st, StatusCode::OK);
    let v: Value = serde_json::from_str(&body).unwrap();
    let hash = v["ContentHash"].as_str().unwrap().to_owned();
    // Same hash: waits until the wait ends, then answers unchanged.
    let started = std::time::Instant::now();
    let (_, body) = call(
        &app,
        "GET",
        &format!("/v1/agent/service/web?hash={hash}&wait=200ms"),
        Value::Null,
    )
    .await;
    assert!(started.elapsed() >= std::time::Duration::from_millis(200));
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["ContentHash"],
        hash.as_str()
    );
    // A change wakes it with the new content.
    let blocked = {
        let app = app.clone();
        let uri = format!("/v1/agent/service/web?hash={hash}&wait=30s");
        tokio::spawn(async move { call(&app, "GET", &uri, Value::Null).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!blocked.is_finished());
    let reg = json!({"Name": "web", "Port": 80, "Tags": ["b"]});
    assert_eq!(
        call(&app, "PUT", "/v1/agent/service/register", reg).await.0,
        StatusCode::OK
    );
    let (st, body) = blocked.await.unwrap();
    assert_eq!(st, StatusCode::OK);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["Tags"], json!(["b"]));
    assert_ne!(v["ContentHash"], hash.as_str());
    let (st, _) = call(&app, "GET", "/v1/agent/service/web?wait=soon", Value::Null).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    agent.shutdown().await;
}

#[tokio::test]
async fn node_maintenance_puts_every_local_instance_into_maintenance() {
    let (app, agent) = app().await;
    let reg =
        json!({"Name": "web", "ID": "web-1", "Port": 80, "Check": {"CheckID": "t", "TTL": "60s", "Status": "passing"}});
    assert_eq!(
        call(&app, "PUT", "/v1/agent/service/register", reg).await.0,
        StatusCode::OK
    );
    let (st, body) = call(&app, "PUT", "/v1/agent/maintenance?enable=yes", Value::Null).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{body}");
    let (st, _) = call(
        &app,
        "PUT",
        "/v1/agent/maintenance?enable=true&reason=kernel",
        Value::Null,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let check = agent.state().check("_node_maintenance").unwrap().check;
    assert_eq!(
        (
            check.name.as_str(),
            check.notes.as_str(),
            check.status,
            check.service_id.as_str()
        ),
        ("Node Maintenance Mode", "kernel", structs::HealthStatus::Critical, "")
    );
    let (st, body) = call(
        &app,
        "GET",
        "/v1/agent/health/service/id/web-1?format=text",
        Value::Null,
    )
    .await;
    assert_eq!((st, body.as_str()), (StatusCode::SERVICE_UNAVAILABLE, "maintenance"));
    let (st, _) = call(&app, "PUT", "/v1/agent/maintenance?enable=false", Value::Null).await;
    assert_eq!(st, StatusCode::OK);
    assert!(agent.state().check("_node_maintenance").is_none());
    let (st, _) = call(&app, "GET", "/v1/agent/health/service/id/web-1", Value::Null).await;
    assert_eq!(st, StatusCode::OK);
    agent.shutdown().await;
}

#[tokio::test]
async fn input_errors_say_what_is_expected_and_unknown_keys_are_ignored() {
    let (app, agent) = app().await;
    // Not an object, at the top or where an object goes.
    for (uri, bad) in [
        ("/v1/agent/service/register", json!([1, 2])),
        ("/v1/agent/service/register", json!("web")),
        ("/v1/agent/check/register", json!(7)),
        ("/v1/agent/check/update/x", json!([])),
        ("/v1/agent/service/register", json!({"Name": "web", "Check": [1]})),
    ] {
        let (st, body) = call(&app, "PUT", uri, bad.clone()).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert!(body.contains("expected a JSON object"), "{bad}: {body}");
    }
    // Durations say what one looks like, after the field's name.
    let (st, body) = call(
        &app,
        "PUT",
        "/v1/agent/check/register",
        json!({"Name": "c", "HTTP": "http://127.0.0.1/", "Interval": "nope"}),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(
        body.starts_with("request decode failed: Interval: invalid duration \"nope\"")
            && body.contains("a duration like 10s"),
        "{body}"
    );
    // A header that would split the request, at registration rather than at every run.
    let (st, body) = call(
        &app,
        "PUT",
        "/v1/agent/service/register",
        json!({"Name": "web", "Port": 80, "Check": {"HTTP": "http://127.0.0.1/", "Interval": "5s",
               "Header": {"X-Auth": ["a\r\nHost: evil"]}}}),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(
        body.starts_with("Check.Header[\"X-Auth\"]: the value contains a CR, LF"),
        "{body}"
    );
    // Unknown keys are ignored, as Consul's API does.
    let (st, body) = call(
        &app,
        "PUT",
        "/v1/agent/check/register",
        json!({"Name": "c", "TTL": "10s", "SomethingNewer": {"x": 1}}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(
        call(&app, "PUT", "/v1/agent/check/deregister/c", Value::Null).await.0,
        StatusCode::OK
    );
    assert!(agent.state().services().is_empty() && agent.state().checks().is_empty());
    agent.shutdown().await;
}

/// An oversized body is a 413 that names the limit, on the agent's own endpoints and on
/// those it forwards.
#[tokio::test]
async fn an_oversized_body_is_a_413_naming_the_limit() {
    let (app, agent) = app().await;
    let big = json!({"Name": "web", "Meta": {"k": "a".repeat(600 * 1024)}});
    for uri in ["/v1/agent/service/register", "/v1/catalog/register"] {
        let (st, body) = call(&app, "PUT", uri, big.clone()).await;
        assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE, "{uri}: {body}");
        assert!(body.contains("limit of 524288 bytes"), "{uri}: {body}");
    }
    assert!(agent.state().services().is_empty(), "nothing registered");
}

#[tokio::test]
async fn services_and_checks_take_filter_expressions() {
    let (app, agent) = app().await;
    for (id, port, tags) in [("web-1", 8080, json!(["v1"])), ("web-2", 8081, json!(["v2"]))] {
        let body = json!({"ID": id, "Name": "web", "Port": port, "Tags": tags, "Meta": {"id": id},
                          "Check": {"CheckID": format!("{id}-ttl"), "TTL": "30s"}});
        let (st, body) = call(&app, "PUT", "/v1/agent/service/register", body).await;
        assert_eq!(st, StatusCode::OK, "{body}");
    }
    let (st, body) = call(&app, "PUT", "/v1/agent/check/pass/web-2-ttl", Value::Null).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let keys = |body: &str| -> Vec<String> {
        let v: Value = serde_json::from_str(body).unwrap();
        v.as_object().unwrap().keys().cloned().collect()
    };
    for (uri, want) in [
        ("/v1/agent/services?filter=Port%20%3D%3D%208081", vec!["web-2"]),
        ("/v1/agent/services?filter=v1%20in%20Tags", vec!["web-1"]),
        (
            "/v1/agent/services?filter=Meta.id%20matches%20%22%5Eweb-%22",
            vec!["web-1", "web-2"],
        ),
        ("/v1/agent/services?filter=Service%20%3D%3D%20api", vec![]),
        ("/v1/agent/checks?filter=Status%20%3D%3D%20passing", vec!["web-2-ttl"]),
        ("/v1/agent/checks?filter=ServiceID%20%3D%3D%20web-1", vec!["web-1-ttl"]),
    ] {
        let (st, body) = call(&app, "GET", uri, Value::Null).await;
        assert_eq!(st, StatusCode::OK, "{uri}: {body}");
        assert_eq!(keys(&body), want, "{uri}");
    }
    // A local endpoint that does not filter refuses the parameter rather than ignore it.
    let (st, body) = call(&app, "GET", "/v1/agent/members?filter=Name%3D%3Dn1", Value::Null).await;
    assert_eq!(
        (st, body.trim()),
        (
            StatusCode::BAD_REQUEST,
            "filter: /v1/agent/members does not take a filter expression"
        )
    );
    // A registration has no dry run: asked for one, nothing is registered.
    let (st, body) = call(
        &app,
        "PUT",
        "/v1/agent/service/register?dry-run",
        serde_json::json!({"Name": "trial", "Port": 1}),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.starts_with("dry-run: PUT /v1/agent/service/register has no dry run, and nothing was written"),
        "{body}"
    );
    let (_, services) = call(&app, "GET", "/v1/agent/services", Value::Null).await;
    assert!(!keys(&services).contains(&"trial".to_owned()), "{services}");
    let (st, body) = call(&app, "GET", "/v1/agent/checks?filter=Status%20%3D%3D", Value::Null).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(
        body.starts_with("filter: expected a value after \"==\" at offset 9"),
        "{body}"
    );
    agent.shutdown().await;
}
