//! HTTP handlers in process: shapes, conventions and every error path.
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use catalog::{Store, StoreConfig};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

struct Reply {
    status: StatusCode,
    index: Option<u64>,
    content_type: String,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

async fn app() -> (Router, Store) {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    (
        http_api::router(
            store.clone(),
            http_api::ApiConfig {
                max_body: 64 * 1024,
                ..Default::default()
            },
        ),
        store,
    )
}

async fn call(app: &Router, method: &str, uri: &str, body: impl Into<Body>) -> Reply {
    let req = Request::builder().method(method).uri(uri).body(body.into()).unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let index = resp
        .headers()
        .get("x-consul-index")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        index,
        content_type,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

async fn get(app: &Router, uri: &str) -> Reply {
    call(app, "GET", uri, Body::empty()).await
}

async fn put(app: &Router, uri: &str, body: Value) -> Reply {
    call(app, "PUT", uri, body.to_string()).await
}

fn web_and_proxy() -> [Value; 2] {
    [
        json!({"Node": "n1", "Address": "10.0.0.1", "Service": {"Service": "web", "Port": 8080},
               "Checks": [{"CheckID": "web-alive", "ServiceID": "web", "Status": "passing"}]}),
        json!({"node": "n1", "address": "10.0.0.1", "service": {"kind": "connect-proxy", "id": "web-sidecar-proxy",
               "service": "web-sidecar-proxy", "port": 21000,
               "proxy": {"destination_service_name": "web", "local_service_port": 8080,
                         "upstreams": [{"destination_name": "api", "local_bind_port": 9191, "config": {"Keep_Case": 1}}]}}}),
    ]
}

#[tokio::test]
async fn register_read_back_in_every_view() {
    let (app, _) = app().await;
    for body in web_and_proxy() {
        let r = put(&app, "/v1/catalog/register", body).await;
        assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "true"));
    }
    let r = get(&app, "/v1/catalog/services").await;
    assert_eq!(r.json(), json!({"web": [], "web-sidecar-proxy": []}));
    let r = get(&app, "/v1/catalog/service/web").await;
    assert_eq!(r.json()[0]["ServiceName"], "web");
    assert_eq!(r.json()[0]["ServiceTags"], json!([]), "[] never null");
    let r = get(&app, "/v1/catalog/connect/web").await;
    let proxy = &r.json()[0];
    assert_eq!(proxy["ServiceKind"], "connect-proxy");
    assert_eq!(proxy["ServiceProxy"]["Upstreams"][0]["Config"], json!({"Keep_Case": 1}));
    // Kept as given: unset reads back "" (and means a service), as Consul's.
    assert_eq!(proxy["ServiceProxy"]["Upstreams"][0]["DestinationType"], "");
    let r = get(&app, "/v1/health/service/web?passing").await;
    assert_eq!(r.json()[0]["Checks"][0]["CheckID"], "web-alive");
    let r = get(&app, "/v1/health/connect/web").await;
    assert_eq!(r.json()[0]["Service"]["Proxy"]["DestinationServiceName"], "web");
    let r = get(&app, "/v1/health/checks/web").await;
    assert_eq!(r.json().as_array().unwrap().len(), 1);
    let r = get(&app, "/v1/health/state/passing").await;
    assert_eq!(r.json().as_array().unwrap().len(), 1);
    let r = get(&app, "/v1/catalog/node/n1").await;
    assert_eq!(r.json()["Services"]["web-sidecar-proxy"]["Port"], 21000);
    let r = get(&app, "/v1/catalog/node/nope").await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "null"));
    assert!(r.index.unwrap() >= 1);
    let r = get(&app, "/v1/catalog/nodes").await;
    assert_eq!(r.json()[0]["Node"], "n1");
    assert_eq!(get(&app, "/v1/catalog/datacenters").await.json(), json!(["dc1"]));
    let r = get(&app, "/v1/health/service/nothing").await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "[]"));

    let r = put(
        &app,
        "/v1/catalog/deregister",
        json!({"Node": "n1", "ServiceID": "web"}),
    )
    .await;
    assert_eq!(r.body, "true");
    assert_eq!(get(&app, "/v1/health/checks/web").await.body, "[]");
}

#[tokio::test]
async fn every_blocking_get_carries_an_index() {
    let (app, _) = app().await;
    for uri in [
        "/v1/catalog/nodes",
        "/v1/catalog/node/x",
        "/v1/catalog/services",
        "/v1/catalog/service/x",
        "/v1/catalog/connect/x",
        "/v1/health/service/x",
        "/v1/health/connect/x",
        "/v1/health/checks/x",
        "/v1/health/state/any",
        "/v1/health/node/x",
        "/v1/config/service-defaults",
        "/v1/connect/ca/roots",
        "/v1/connect/ca/configuration",
        "/v1/agent/connect/ca/leaf/web",
        "/v1/connect/intentions",
        "/v1/connect/intentions/match?by=destination&name=x",
        "/v1/connect/intentions/check?source=a&destination=b",
    ] {
        let r = get(&app, uri).await;
        assert_eq!(r.status, StatusCode::OK, "{uri}: {}", r.body);
        assert!(r.index.is_some_and(|i| i >= 1), "{uri} lacks X-Consul-Index");
        assert_eq!(r.content_type, "application/json", "{uri}");
    }
}

#[tokio::test]
async fn blocking_query_wakes_on_change_and_times_out_otherwise() {
    let (app, _) = app().await;
    let first = get(&app, "/v1/health/service/web").await.index.unwrap();
    // Nothing changes: the wait runs out and returns the same index.
    let r = get(&app, &format!("/v1/health/service/web?index={first}&wait=20ms")).await;
    assert_eq!(r.index, Some(first));
    // A change wakes it.
    let waiter = {
        let app = app.clone();
        tokio::spawn(async move { get(&app, &format!("/v1/health/service/web?index={first}&wait=5m")).await })
    };
    tokio::task::yield_now().await;
    put(&app, "/v1/catalog/register", web_and_proxy()[0].clone()).await;
    let r = tokio::time::timeout(std::time::Duration::from_secs(30), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(r.index.unwrap() > first);
    assert_eq!(r.json().as_array().unwrap().len(), 1);
    // An index from the future (a reset) answers at once.
    let r = get(&app, "/v1/health/service/web?index=999999&wait=5m").await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn config_entries_set_get_list_delete_with_cas() {
    let (app, _) = app().await;
    let entry = json!({"Kind": "service-defaults", "Name": "api", "Protocol": "http"});
    assert_eq!(put(&app, "/v1/config?cas=0", entry.clone()).await.body, "true");
    assert_eq!(put(&app, "/v1/config?cas=0", entry.clone()).await.body, "false");
    let r = get(&app, "/v1/config/service-defaults/api").await;
    assert_eq!(r.json()["Protocol"], "http");
    let modify = r.json()["ModifyIndex"].as_u64().unwrap();
    assert_eq!(
        put(
            &app,
            &format!("/v1/config?cas={modify}"),
            json!({"kind": "service-defaults", "name": "api", "protocol": "grpc"})
        )
        .await
        .body,
        "true"
    );
    assert_eq!(
        get(&app, "/v1/config/service-defaults").await.json()[0]["Protocol"],
        "grpc"
    );
    assert_eq!(
        call(&app, "DELETE", "/v1/config/service-defaults/api?cas=1", Body::empty())
            .await
            .body,
        "false"
    );
    assert_eq!(
        call(&app, "DELETE", "/v1/config/service-defaults/api", Body::empty())
            .await
            .body,
        "true"
    );
    let r = get(&app, "/v1/config/service-defaults/api").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(r.body.starts_with("Config entry not found"));
}

#[tokio::test]
async fn intentions_exact_match_check() {
    let (app, _) = app().await;
    let r = put(
        &app,
        "/v1/connect/intentions/exact?source=web&destination=api",
        json!({"SourceType": "consul", "Action": "allow"}),
    )
    .await;
    assert_eq!(r.body, "true");
    put(
        &app,
        "/v1/connect/intentions/exact?source=*&destination=api",
        json!({"Action": "deny"}),
    )
    .await;
    let r = get(&app, "/v1/connect/intentions/exact?source=web&destination=api").await;
    assert_eq!(
        (r.json()["Action"].as_str(), r.json()["Precedence"].as_u64()),
        (Some("allow"), Some(9))
    );
    let r = get(&app, "/v1/connect/intentions/match?by=destination&name=api").await;
    assert_eq!(r.json()["api"].as_array().unwrap().len(), 2);
    assert_eq!(r.json()["api"][0]["SourceName"], "web", "precedence order");
    assert_eq!(
        get(&app, "/v1/connect/intentions/check?source=web&destination=api")
            .await
            .json(),
        json!({"Allowed": true})
    );
    assert_eq!(
        get(&app, "/v1/connect/intentions/check?source=db&destination=api")
            .await
            .json(),
        json!({"Allowed": false})
    );
    assert_eq!(
        get(&app, "/v1/connect/intentions/check?source=db&destination=other")
            .await
            .json(),
        json!({"Allowed": true})
    );
    assert_eq!(
        call(
            &app,
            "DELETE",
            "/v1/connect/intentions/exact?source=web&destination=api",
            Body::empty()
        )
        .await
        .body,
        "true"
    );
    assert_eq!(
        get(&app, "/v1/connect/intentions/exact?source=web&destination=api")
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn ca_roots_configuration_and_leaf() {
    let (app, _) = app().await;
    let roots = get(&app, "/v1/connect/ca/roots").await.json();
    assert_eq!(roots["Roots"].as_array().unwrap().len(), 1);
    let td = roots["TrustDomain"].as_str().unwrap().to_owned();
    let leaf = get(&app, "/v1/agent/connect/ca/leaf/web").await.json();
    assert_eq!(leaf["ServiceURI"], format!("spiffe://{td}/ns/default/dc/dc1/svc/web"));
    let conf = get(&app, "/v1/connect/ca/configuration").await.json();
    assert_eq!(
        (conf["Provider"].as_str(), conf["Config"]["LeafCertTTL"].as_str()),
        (Some("consul"), Some("72h0m0s"))
    );
    let r = put(
        &app,
        "/v1/connect/ca/configuration",
        json!({"Provider": "consul", "Config": {"PrivateKeyBits": 384}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let roots = get(&app, "/v1/connect/ca/roots").await.json();
    assert_eq!(
        roots["Roots"].as_array().unwrap().len(),
        2,
        "rotation keeps the old root"
    );
    assert_ne!(
        get(&app, "/v1/agent/connect/ca/leaf/web").await.json()["SerialNumber"],
        leaf["SerialNumber"]
    );
    // What a GET answers goes back as it is; keys sent empty or null mean unset.
    let mut conf = get(&app, "/v1/connect/ca/configuration").await.json();
    conf["Config"]["PrivateKey"] = json!("");
    conf["Config"]["RootCert"] = serde_json::Value::Null;
    let r = put(&app, "/v1/connect/ca/configuration", conf).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

#[tokio::test]
async fn errors_are_plain_text_and_name_the_problem() {
    let (app, store) = app().await;
    let before = store.read().index;
    let cases: Vec<(&str, &str, String, StatusCode, &str)> = vec![
        (
            "PUT",
            "/v1/catalog/register",
            "{not json".into(),
            StatusCode::BAD_REQUEST,
            "request decode failed: invalid JSON",
        ),
        (
            "PUT",
            "/v1/catalog/register",
            "".into(),
            StatusCode::BAD_REQUEST,
            "request body is empty",
        ),
        (
            "PUT",
            "/v1/catalog/register",
            json!({"Node": "n1"}).to_string(),
            StatusCode::BAD_REQUEST,
            "Address: required",
        ),
        (
            "PUT",
            "/v1/catalog/register",
            json!({"Node": "n1", "Address": "a", "Service": {"Service": "p", "Kind": "connect-proxy", "Port": 1}})
                .to_string(),
            StatusCode::BAD_REQUEST,
            "Service.Proxy.DestinationServiceName: required for kind connect-proxy",
        ),
        (
            "PUT",
            "/v1/catalog/register",
            json!({"Node": "n1", "Address": "a", "Service": {"Service": "x", "Port": 70000}}).to_string(),
            StatusCode::BAD_REQUEST,
            "request decode failed: Service.Port: invalid value",
        ),
        (
            "PUT",
            "/v1/catalog/register",
            json!({"Node": "n1", "Address": "a", "Datacenter": "dc9"}).to_string(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "No path to datacenter \"dc9\"",
        ),
        (
            "PUT",
            "/v1/config",
            json!({"Kind": "service-defaults", "Name": "api", "Protocl": "http"}).to_string(),
            StatusCode::BAD_REQUEST,
            "request decode failed: Protocl: unknown field `Protocl`",
        ),
        (
            "PUT",
            "/v1/config",
            json!({"Kind": "service-splitter", "Name": "api", "Splits": [{"Weight": 10}]}).to_string(),
            StatusCode::BAD_REQUEST,
            "Splits: weights must add up to 100",
        ),
        (
            "PUT",
            "/v1/config?cas=x",
            json!({"Kind": "mesh"}).to_string(),
            StatusCode::BAD_REQUEST,
            "invalid cas parameter",
        ),
        (
            "GET",
            "/v1/config/nope",
            String::new(),
            StatusCode::BAD_REQUEST,
            "kind: unknown config entry kind \"nope\"",
        ),
        (
            "GET",
            "/v1/health/state/sad",
            String::new(),
            StatusCode::BAD_REQUEST,
            "state: unknown check state \"sad\"",
        ),
        (
            "GET",
            "/v1/health/service/x?wait=forever&index=1",
            String::new(),
            StatusCode::BAD_REQUEST,
            "wait: invalid duration",
        ),
        (
            "GET",
            "/v1/health/service/x?filter=Service.Port==web",
            String::new(),
            StatusCode::BAD_REQUEST,
            "filter: invalid value \"web\" for \"Service.Port\" at offset 14: expected an integer",
        ),
        (
            "GET",
            "/v1/catalog/nodes?filter=Service.Port==1",
            String::new(),
            StatusCode::BAD_REQUEST,
            "filter: unknown selector \"Service.Port\" at offset 0: known selectors are ID, Node, Address",
        ),
        (
            "PUT",
            "/v1/kv/trial?dry-run",
            "v".to_owned(),
            StatusCode::BAD_REQUEST,
            "dry-run: PUT /v1/kv/trial has no dry run, and nothing was written: dry runs cover config entries (/v1/config), intentions and catalog registrations (/v1/catalog/register, /v1/catalog/deregister)",
        ),
        (
            "GET",
            "/v1/catalog/datacenters?filter=Node==n1",
            String::new(),
            StatusCode::BAD_REQUEST,
            "filter: /v1/catalog/datacenters does not take a filter expression",
        ),
        (
            "GET",
            "/v1/catalog/nodes?dc=dc2",
            String::new(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "No path to datacenter \"dc2\"",
        ),
        (
            "GET",
            "/v1/connect/intentions/exact?source=web",
            String::new(),
            StatusCode::BAD_REQUEST,
            "required query parameter 'destination' not set",
        ),
        (
            "PUT",
            "/v1/connect/intentions/exact?source=web&destination=api",
            json!({"Action": "maybe"}).to_string(),
            StatusCode::BAD_REQUEST,
            "request decode failed: Action: unknown value \"maybe\"",
        ),
        (
            "PUT",
            "/v1/connect/intentions/exact?source=web&destination=api",
            json!({}).to_string(),
            StatusCode::BAD_REQUEST,
            "Action: required (or Permissions)",
        ),
        (
            "PUT",
            "/v1/connect/ca/configuration",
            json!({"Provider": "vault"}).to_string(),
            StatusCode::BAD_REQUEST,
            "Provider: \"vault\" is not available",
        ),
        (
            "PUT",
            "/v1/connect/ca/configuration",
            json!({"Config": {"PrivateKeyType": "rsa"}}).to_string(),
            StatusCode::BAD_REQUEST,
            "Config.PrivateKeyType: \"rsa\" is not supported",
        ),
        (
            // A supplied root is refused, never accepted and ignored.
            "PUT",
            "/v1/connect/ca/configuration",
            json!({"Provider": "consul", "Config": {"PrivateKey": "-----BEGIN EC PRIVATE KEY-----", "RootCert": "-----BEGIN CERTIFICATE-----"}}).to_string(),
            StatusCode::BAD_REQUEST,
            "Config.PrivateKey: a user-supplied root key or certificate is not supported",
        ),
        (
            "PUT",
            "/v1/connect/ca/configuration",
            json!({"Config": {"CSRMaxPerSecond": 50}}).to_string(),
            StatusCode::BAD_REQUEST,
            "Config.CSRMaxPerSecond: not supported by the built-in CA",
        ),
        (
            "GET",
            "/v1/no/such/path",
            String::new(),
            StatusCode::NOT_FOUND,
            "404 page not found: no endpoint at /v1/no/such/path",
        ),
        (
            "POST",
            "/v1/catalog/register",
            String::new(),
            StatusCode::METHOD_NOT_ALLOWED,
            "method POST not allowed",
        ),
        (
            "DELETE",
            "/v1/catalog/services",
            String::new(),
            StatusCode::METHOD_NOT_ALLOWED,
            "method DELETE not allowed",
        ),
    ];
    for (method, uri, body, status, text) in cases {
        let r = call(&app, method, uri, body).await;
        assert_eq!(r.status, status, "{method} {uri}: {}", r.body);
        assert!(
            r.body.starts_with(text),
            "{method} {uri}: {:?} does not start with {text:?}",
            r.body
        );
        assert!(
            r.content_type.starts_with("text/plain"),
            "{method} {uri}: {}",
            r.content_type
        );
    }
    // Oversized bodies: 413, and nothing written.
    let big = format!("{{\"Node\": \"n1\", \"Address\": \"{}\"}}", "a".repeat(100 * 1024));
    let r = call(&app, "PUT", "/v1/catalog/register", big).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        r.body.contains("limit of ") && r.body.contains(" bytes"),
        "names the limit: {}",
        r.body
    );
    crate::only_refusals_recorded_since(&store, before, "no rejected write changed anything");
}

#[tokio::test]
async fn pretty_and_metrics() {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let metrics = std::sync::Arc::new(http_api::HttpMetrics::default());
    let app = http_api::router(
        store.clone(),
        http_api::ApiConfig {
            metrics: std::sync::Arc::clone(&metrics),
            ..Default::default()
        },
    );
    let r = get(&app, "/v1/catalog/datacenters?pretty").await;
    assert_eq!(r.body, "[\n  \"dc1\"\n]");
    assert_eq!(get(&app, "/v1/no/such/path").await.status, StatusCode::NOT_FOUND);
    // The owner registers the API's metrics (the node serves them at /v1/agent/metrics).
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(http_api::CatalogMetrics::new(store.clone())));
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        "# HELP meshd_catalog_index Index of the last committed catalog write.",
        "# TYPE meshd_catalog_index gauge",
        "meshd_catalog_nodes 0",
        "meshd_server_leader 1",
        "# HELP meshd_http_requests HTTP API requests served, by status class.",
        "# TYPE meshd_http_requests counter",
        "meshd_http_requests_total{code=\"2xx\"} 1",
        "meshd_http_requests_total{code=\"4xx\"} 1",
        "meshd_http_requests_total{code=\"5xx\"} 0",
        "meshd_http_blocking_queries 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} missing from:\n{text}");
    }
    assert_eq!(get(&app, "/v1/status/leader").await.json(), json!("127.0.0.1:8300"));
    assert_eq!(
        get(&app, "/v1/status/leader?dc=dc1").await.json(),
        json!("127.0.0.1:8300")
    );
    for path in ["/v1/status/leader?dc=dc9", "/v1/status/peers?dc=dc9"] {
        let r = get(&app, path).await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{path}");
        assert!(
            r.body.starts_with("No path to datacenter \"dc9\""),
            "{path}: {}",
            r.body
        );
    }
    assert_eq!(get(&app, "/v1/agent/self").await.json()["Config"]["Datacenter"], "dc1");
}

/// A CSR for `uri` (the key stays here, as on an agent).
fn csr_for(uri: &str) -> String {
    csr_with_dns(uri, &[])
}

fn csr_with_dns(uri: &str, dns: &[&str]) -> String {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = vec![rcgen::SanType::URI(uri.to_owned().try_into().unwrap())];
    for name in dns {
        params
            .subject_alt_names
            .push(rcgen::SanType::DnsName((*name).to_owned().try_into().unwrap()));
    }
    params.serialize_request(&key).unwrap().pem().unwrap()
}

/// A CSR's DNS SANs: `*` is a 400 (not a 500), and a service may claim only the hosts its
/// ingress-gateway config entry gives it.
#[tokio::test]
async fn csr_dns_sans_are_limited_to_the_names_the_service_may_claim() {
    let (app, _store) = app().await;
    let roots = get(&app, "/v1/connect/ca/roots").await.json();
    let td = roots["TrustDomain"].as_str().unwrap().to_owned();
    let defaults = put(
        &app,
        "/v1/config",
        json!({"Kind": "proxy-defaults", "Name": "global", "Config": {"protocol": "http"}}),
    )
    .await;
    assert_eq!(defaults.status, StatusCode::OK, "{}", defaults.body);
    let entry = put(
        &app,
        "/v1/config",
        json!({"Kind": "ingress-gateway", "Name": "ing", "TLS": {"Enabled": true},
               "Listeners": [{"Port": 8080, "Protocol": "http", "Services": [
                   {"Name": "shop", "Hosts": ["shop.example.com"]}, {"Name": "api"}]}]}),
    )
    .await;
    assert_eq!(entry.status, StatusCode::OK, "{}", entry.body);
    let uri = |svc: &str| format!("spiffe://{td}/ns/default/dc/dc1/svc/{svc}");
    let sign = |svc: &str, dns: &[&str]| {
        let body = json!({"CSR": csr_with_dns(&uri(svc), dns)});
        let app = &app;
        async move { put(app, "/v1/internal/connect/ca/sign", body).await }
    };
    let good = sign(
        "ing",
        &["shop.example.com", "api.ingress.consul", "api.ingress.dc1.consul"],
    )
    .await;
    assert_eq!(good.status, StatusCode::OK, "{}", good.body);
    for (svc, dns, says) in [
        ("ing", "*", "is not a DNS name"),
        ("ing", "bank.example.com", "may not claim"),
        ("ing", "web.ingress.consul", "may not claim"),
        ("web", "shop.example.com", "may not claim"),
    ] {
        let bad = sign(svc, &[dns]).await;
        assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{svc} {dns}: {}", bad.body);
        assert!(bad.body.contains(says), "{svc} {dns}: {}", bad.body);
    }
}

#[tokio::test]
async fn csr_signing_returns_a_certificate_and_never_a_key() {
    let (app, _store) = app().await;
    let roots = get(&app, "/v1/connect/ca/roots").await.json();
    let td = roots["TrustDomain"].as_str().unwrap().to_owned();
    let good = put(
        &app,
        "/v1/internal/connect/ca/sign",
        json!({"CSR": csr_for(&format!("spiffe://{td}/ns/default/dc/dc1/svc/web"))}),
    )
    .await;
    assert_eq!(good.status, StatusCode::OK, "{}", good.body);
    let cert = good.json();
    assert_eq!(cert["Service"], "web");
    assert!(cert["CertPEM"].as_str().unwrap().contains("BEGIN CERTIFICATE"));
    assert!(!good.body.contains("PRIVATE KEY"), "{}", good.body);

    for (body, says) in [
        (
            json!({"CSR": csr_for("spiffe://other.consul/ns/default/dc/dc1/svc/web")}),
            "trust domain",
        ),
        (
            json!({"CSR": csr_for(&format!("spiffe://{td}/ns/default/dc/dc9/svc/web"))}),
            "datacenter",
        ),
        (
            json!({"CSR": "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"}),
            "CSR",
        ),
        (json!({}), "CSR: missing"),
    ] {
        let bad = put(&app, "/v1/internal/connect/ca/sign", body).await;
        assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
        assert!(bad.body.contains(says), "{says}: {}", bad.body);
    }
    let not_json = call(&app, "PUT", "/v1/internal/connect/ca/sign", "{").await;
    assert_eq!(not_json.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_missing_config_entry_is_a_404_with_an_index_to_block_on() {
    let (app, _store) = app().await;
    let missing = get(&app, "/v1/config/service-defaults/web").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing.index.is_some_and(|i| i >= 1), "404 without X-Consul-Index");
}

/// `SkipNodeUpdate` without an address adds a service to an existing node and leaves the
/// node as it is; with no such node it is a 400 naming the address.
#[tokio::test]
async fn skip_node_update_needs_no_address_on_an_existing_node() {
    let (app, _) = app().await;
    let r = put(
        &app,
        "/v1/catalog/register",
        json!({"Node": "n1", "Address": "10.0.0.1", "NodeMeta": {"rack": "r1"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = put(
        &app,
        "/v1/catalog/register",
        json!({"Node": "n1", "SkipNodeUpdate": true, "Service": {"Service": "web", "Port": 80}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let node = get(&app, "/v1/catalog/node/n1").await.json();
    assert_eq!(node["Node"]["Address"], "10.0.0.1");
    assert_eq!(node["Node"]["Meta"]["rack"], "r1");
    assert_eq!(node["Services"]["web"]["Port"], 80);
    // The same as a list, as Consul's node-services endpoint answers.
    let listed = get(&app, "/v1/catalog/node-services/n1").await;
    assert!(listed.index.is_some());
    let listed = listed.json();
    assert_eq!(listed["Node"]["Address"], "10.0.0.1");
    assert_eq!(listed["Services"][0]["Service"], "web");
    assert_eq!(
        get(&app, "/v1/catalog/node-services/nobody").await.json(),
        json!({"Node": null, "Services": []})
    );
    let r = put(
        &app,
        "/v1/catalog/register",
        json!({"Node": "ghost", "SkipNodeUpdate": true, "Service": {"Service": "web", "Port": 80}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.body
            .starts_with("Address: required: node \"ghost\" is not registered"),
        "{}",
        r.body
    );
}

/// Two nodes in two zones, each with a `web` instance (different tags, meta and ports), `api`
/// on the second, and a check per instance (one critical).
async fn two_zones(app: &Router) {
    let regs = [
        json!({"Node": "n1", "Address": "10.0.0.1", "NodeMeta": {"zone": "a"},
               "Service": {"ID": "web-1", "Service": "web", "Port": 8080, "Tags": ["v1"], "Meta": {"version": "1"}},
               "Checks": [{"CheckID": "web-1-alive", "Name": "alive", "ServiceID": "web-1", "Status": "passing"}]}),
        json!({"Node": "n2", "Address": "10.0.0.2", "NodeMeta": {"zone": "b"},
               "Service": {"ID": "web-2", "Service": "web", "Port": 8081, "Tags": ["v2", "canary"], "Meta": {"version": "2"}},
               "Checks": [{"CheckID": "web-2-alive", "Name": "alive", "ServiceID": "web-2", "Status": "critical"}]}),
        json!({"Node": "n2", "Address": "10.0.0.2", "NodeMeta": {"zone": "b"},
               "Service": {"ID": "api", "Service": "api", "Port": 9090, "Tags": ["v2"]}}),
    ];
    for body in regs {
        let r = put(app, "/v1/catalog/register", body).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
}

/// Values of `field` in a JSON list answer, in order.
fn column(r: &Reply, field: &str) -> Vec<String> {
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let v = r.json();
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|row| {
            row.pointer(field)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn filter_expressions_on_every_list_endpoint_with_their_own_selectors() {
    let (app, _) = app().await;
    two_zones(&app).await;
    let q = |path: &str, expr: &str| format!("{path}?filter={}", urlencode(expr));
    let cases: Vec<(String, &str, Vec<&str>)> = vec![
        (q("/v1/catalog/nodes", "Meta.zone == a"), "/Node", vec!["n1"]),
        (
            q("/v1/catalog/nodes", "Node matches \"^n\" and Address != 10.0.0.1"),
            "/Node",
            vec!["n2"],
        ),
        (
            q("/v1/catalog/service/web", "ServiceMeta.version == 2"),
            "/ServiceID",
            vec!["web-2"],
        ),
        (
            q("/v1/catalog/service/web", "canary in ServiceTags or NodeMeta.zone == a"),
            "/ServiceID",
            vec!["web-1", "web-2"],
        ),
        (q("/v1/catalog/service/web", "ServicePort == 8080"), "/Node", vec!["n1"]),
        (
            q("/v1/catalog/node-services/n2", "Port == 9090"),
            "/Services/0/ID",
            vec![],
        ),
        (
            q("/v1/health/service/web", "Node.Meta.zone == b"),
            "/Service/ID",
            vec!["web-2"],
        ),
        (
            q("/v1/health/service/web", "Service.Tags is empty"),
            "/Service/ID",
            vec![],
        ),
        (
            q("/v1/health/checks/web", "Status == critical"),
            "/CheckID",
            vec!["web-2-alive"],
        ),
        (q("/v1/health/state/any", "Node == n1"), "/CheckID", vec!["web-1-alive"]),
        (
            q("/v1/health/node/n2", "ServiceName == web and v2 in ServiceTags"),
            "/CheckID",
            vec!["web-2-alive"],
        ),
    ];
    for (uri, field, want) in cases {
        let r = get(&app, &uri).await;
        if field.starts_with("/Services") {
            let ids: Vec<Value> = r.json()["Services"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["ID"].clone())
                .collect();
            assert_eq!(ids, vec![json!("api")], "{uri}");
            continue;
        }
        assert_eq!(column(&r, field), want, "{uri}");
    }
    // The catalog's service list: the tags of the instances that match, by service.
    let r = get(
        &app,
        &q("/v1/catalog/services", "NodeMeta.zone == b and ServiceName == web"),
    )
    .await;
    assert_eq!(r.json(), json!({"web": ["canary", "v2"]}));
    // The node's services by id.
    let r = get(&app, &q("/v1/catalog/node/n2", "Service == api")).await;
    let services = r.json()["Services"].clone();
    let ids: Vec<&String> = services.as_object().unwrap().keys().collect();
    assert_eq!(ids, ["api"]);
    // A watch with a filter: parked at the current index, woken by a change that matches,
    // answered with the filtered list.
    let path = q("/v1/health/service/web", "Service.Meta.version == 3");
    let first = get(&app, &path).await;
    assert_eq!(first.body, "[]");
    let index = first.index.unwrap();
    let waiter = {
        let (app, path) = (app.clone(), path.clone());
        tokio::spawn(async move { get(&app, &format!("{path}&index={index}&wait=5m")).await })
    };
    tokio::task::yield_now().await;
    let r = put(
        &app,
        "/v1/catalog/register",
        json!({"Node": "n1", "Address": "10.0.0.1", "NodeMeta": {"zone": "a"},
               "Service": {"ID": "web-3", "Service": "web", "Port": 8082, "Meta": {"version": "3"}}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let woken = tokio::time::timeout(std::time::Duration::from_secs(30), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(woken.index.unwrap() > index);
    assert_eq!(column(&woken, "/Service/ID"), ["web-3"]);
    // The same path without the filter is its own answer (answers are shared per query).
    assert_eq!(
        column(&get(&app, "/v1/health/service/web").await, "/Service/ID").len(),
        3
    );
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn legacy_intentions_by_id_create_read_update_delete() {
    let (app, _) = app().await;
    let r = call(
        &app,
        "POST",
        "/v1/connect/intentions",
        json!({"SourceName": "web", "DestinationName": "db", "Action": "allow", "Description": "d",
               "ID": "", "Precedence": 0, "CreatedAt": "0001-01-01T00:00:00Z"})
        .to_string(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let id = r.json()["ID"].as_str().unwrap().to_owned();
    assert!(uuid::Uuid::parse_str(&id).is_ok(), "{id}");
    let uri = format!("/v1/connect/intentions/{id}");
    let got = get(&app, &uri).await;
    assert_eq!(
        (got.json()["SourceName"].clone(), got.json()["Action"].clone()),
        (json!("web"), json!("allow"))
    );
    assert!(got.index.is_some());
    // The list and the exact route show the same id.
    assert_eq!(get(&app, "/v1/connect/intentions").await.json()[0]["ID"], id.as_str());
    let exact = get(&app, "/v1/connect/intentions/exact?source=web&destination=db").await;
    assert_eq!(exact.json()["ID"], id.as_str());
    // A second create of the same pair is a conflict naming the id; nothing changes.
    let r = call(
        &app,
        "POST",
        "/v1/connect/intentions",
        json!({"SourceName": "web", "DestinationName": "db", "Action": "deny"}).to_string(),
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(r.body.contains(&id), "{}", r.body);
    // An update keeps the id; renaming is refused naming the field.
    let r = put(
        &app,
        &uri,
        json!({"SourceName": "web", "DestinationName": "db", "Action": "deny"}),
    )
    .await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "true"));
    assert_eq!(get(&app, &uri).await.json()["Action"], "deny");
    let r = put(&app, &uri, json!({"SourceName": "api", "Action": "deny"})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.body.starts_with("SourceName: changing it (\"web\" to \"api\")"),
        "{}",
        r.body
    );
    // Bad and unknown ids.
    let r = get(&app, "/v1/connect/intentions/not-a-uuid").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.starts_with("id: \"not-a-uuid\" is not a UUID"), "{}", r.body);
    let missing = "/v1/connect/intentions/00000000-0000-4000-8000-000000000000";
    assert_eq!(get(&app, missing).await.status, StatusCode::NOT_FOUND);
    assert_eq!(
        call(&app, "DELETE", missing, Body::empty()).await.status,
        StatusCode::NOT_FOUND
    );
    // Bad bodies name the field.
    let r = call(
        &app,
        "POST",
        "/v1/connect/intentions",
        json!({"SourceName": "web"}).to_string(),
    )
    .await;
    assert_eq!(
        (r.status, r.body.trim()),
        (StatusCode::BAD_REQUEST, "DestinationName: required")
    );
    let r = call(
        &app,
        "POST",
        "/v1/connect/intentions",
        json!({"SourceName": "a", "DestinationName": "b", "SourceNS": "team"}).to_string(),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.starts_with("SourceNS: \"team\" is not supported"), "{}", r.body);
    // Delete.
    let r = call(&app, "DELETE", &uri, Body::empty()).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "true"));
    assert_eq!(get(&app, &uri).await.status, StatusCode::NOT_FOUND);
    assert_eq!(get(&app, "/v1/connect/intentions").await.body, "[]");
}

#[tokio::test]
async fn connect_authorize_decides_by_trust_domain_and_intentions() {
    let (app, _) = app().await;
    let roots = get(&app, "/v1/connect/ca/roots").await.json();
    let td = roots["TrustDomain"].as_str().unwrap().to_owned();
    for (source, action) in [("web", "allow"), ("api", "deny")] {
        let r = put(
            &app,
            &format!("/v1/connect/intentions/exact?source={source}&destination=db"),
            json!({"Action": action}),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    let ask = |source: &str, domain: &str| {
        let body = json!({"Target": "db", "ClientCertURI": format!("spiffe://{domain}/ns/default/dc/dc1/svc/{source}"),
                          "ClientCertSerial": "01:02"});
        let app = app.clone();
        async move { call(&app, "POST", "/v1/agent/connect/authorize", body.to_string()).await }
    };
    let cases = [
        ("web", td.as_str(), true, "Matched L4 intention web => db: allow"),
        ("api", td.as_str(), false, "Matched L4 intention api => db: deny"),
        // No intention: the default, allow with ACLs off.
        ("other", td.as_str(), true, "No intention matched"),
        (
            "web",
            "11111111-2222-3333-4444-555555555555.consul",
            false,
            "Client certificate is from trust domain",
        ),
    ];
    for (source, domain, authorized, reason) in cases {
        let r = ask(source, domain).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        let v = r.json();
        assert_eq!(v["Authorized"], authorized, "{source}@{domain}: {v}");
        assert!(v["Reason"].as_str().unwrap().starts_with(reason), "{v}");
    }
    let bad = call(
        &app,
        "POST",
        "/v1/agent/connect/authorize",
        json!({"Target": "db", "ClientCertURI": "https://x"}).to_string(),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.body.starts_with("ClientCertURI: \"https://x\""), "{}", bad.body);
    let missing = call(
        &app,
        "POST",
        "/v1/agent/connect/authorize",
        json!({"ClientCertURI": "x"}).to_string(),
    )
    .await;
    assert_eq!(
        (missing.status, missing.body.trim()),
        (StatusCode::BAD_REQUEST, "Target: required")
    );
}
