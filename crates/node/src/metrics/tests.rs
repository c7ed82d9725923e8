//! The metrics route: both formats from one registry, and `agent:read` on the node.

use super::*;
use axum::body::Body;
use axum::http::Request;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tower::ServiceExt;

fn registry() -> Registry {
    let mut registry = Registry::default();
    let gauge: Gauge = Gauge::default();
    gauge.set(7);
    registry.register("meshd_things", "Things", gauge);
    let requests = Family::<Vec<(String, String)>, Counter>::default();
    requests.get_or_create(&vec![("code".into(), "2xx".into())]).inc_by(3);
    requests.get_or_create(&vec![("code".into(), "a, b=c".into())]).inc();
    registry.register("meshd_requests", "Requests", requests);
    let latency = Histogram::new([0.1, 1.0]);
    latency.observe(0.5);
    latency.observe(1.5);
    registry.register("meshd_latency_seconds", "Latency", latency);
    registry
}

async fn get(path: &str, token: Option<&str>) -> (StatusCode, String, String) {
    let app = crate::authz::with_tokens(
        router(registry(), "n1".into()),
        Arc::new(crate::test_tokens::ReaderTokens),
    );
    let mut req = Request::get(path);
    if let Some(token) = token {
        req = req.header("x-consul-token", token);
    }
    let resp = app.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
    let status = resp.status();
    let content_type = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    (status, content_type, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn prometheus_text() {
    let (status, content_type, body) = get("/v1/agent/metrics?format=prometheus", Some("reader")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(content_type.starts_with("application/openmetrics-text; version=1.0.0"));
    for line in [
        "# TYPE meshd_things gauge",
        "meshd_things 7",
        "meshd_requests_total{code=\"2xx\"} 3",
    ] {
        assert!(body.lines().any(|l| l == line), "{line:?} missing from:\n{body}");
    }
    assert!(body.ends_with("# EOF\n"));
}

#[tokio::test]
async fn consul_json_shape() {
    let (status, content_type, body) = get("/v1/agent/metrics", Some("reader")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(content_type, "application/json");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(v["Timestamp"].as_str().is_some_and(|t| !t.is_empty()));
    assert_eq!(v["Points"], json!([]));
    assert_eq!(
        v["Gauges"],
        json!([{"Name": "meshd_things", "Value": 7.0, "Labels": {}}])
    );
    let counters = v["Counters"].as_array().unwrap();
    assert!(
        counters.contains(&json!({"Name": "meshd_requests", "Count": 3, "Sum": 3.0, "Labels": {"code": "2xx"}})),
        "{counters:?}"
    );
    assert!(
        counters.contains(&json!({"Name": "meshd_requests", "Count": 1, "Sum": 1.0, "Labels": {"code": "a, b=c"}})),
        "{counters:?}"
    );
    assert_eq!(
        v["Samples"],
        json!([{"Name": "meshd_latency_seconds", "Count": 2, "Sum": 2.0, "Mean": 1.0, "Labels": {}}])
    );
}

#[tokio::test]
async fn refusals() {
    let (status, _, body) = get("/v1/agent/metrics?format=xml", Some("reader")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.starts_with("format: \"xml\" is not supported"), "{body}");
    let (status, _, body) = get("/v1/agent/metrics?format=prometheus", None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(body.contains("lacks permission 'agent:read' on \"n1\""), "{body}");
    let (status, _, _) = get("/v1/agent/metrics", Some("nonsense")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[test]
fn sample_lines() {
    assert_eq!(
        parse_sample(r#"a_total{x="1",y="q\"\\\n"} 2.5 123"#),
        Some(Sample {
            name: "a_total".into(),
            labels: [("x".into(), "1".into()), ("y".into(), "q\"\\\n".into())].into(),
            value: 2.5,
        })
    );
    assert_eq!(parse_sample("b +Inf").map(|s| s.value), Some(f64::INFINITY));
    assert_eq!(parse_sample("c{x=\"1\""), None);
    assert_eq!(parse_sample("d notanumber"), None);
}
