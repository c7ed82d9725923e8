//! Property tests of every request decoder and query parser (issue 18's fuzzing,
//! structured): arbitrary bytes and arbitrary JSON (keys from Consul's field names, any
//! nesting) to every write route — the ACL ones against a server with ACLs on, their rules in
//! arbitrary HCL — arbitrary query strings to the read routes, and arbitrary `index` and
//! `wait` values to the blocking-query parser. The answer is always a 2xx or a 4xx with a
//! body saying why — never a panic, never a 5xx.
//!
//! `cargo xtask fuzz` runs many more cases (`PROPTEST_CASES`).
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use catalog::{Store, StoreConfig};
use http_body_util::BodyExt;
use proptest::prelude::*;
use serde_json::Value;
use std::sync::OnceLock;
use tower::ServiceExt;

/// Field names the decoders know (and a few they do not), so arbitrary JSON reaches deep.
const KEYS: &[&str] = &[
    "Node",
    "Address",
    "Service",
    "ID",
    "Port",
    "Kind",
    "Proxy",
    "DestinationServiceName",
    "Upstreams",
    "DestinationName",
    "LocalBindPort",
    "Checks",
    "Check",
    "CheckID",
    "Status",
    "ServiceID",
    "Name",
    "Protocol",
    "Routes",
    "Match",
    "HTTP",
    "PathPrefix",
    "Destination",
    "Splits",
    "Weight",
    "Subsets",
    "Filter",
    "Failover",
    "Redirect",
    "Sources",
    "Action",
    "Permissions",
    "Meta",
    "Tags",
    "Config",
    "Connect",
    "SidecarService",
    "Rules",
    "Policies",
    "Roles",
    "ServiceIdentities",
    "ServiceName",
    "NodeIdentities",
    "Datacenter",
    "ExpirationTTL",
    "ExpirationTime",
    "CSR",
    "LeafCertTTL",
    "Provider",
    "SecretID",
    "AccessorID",
    "TaggedAddresses",
    "Weights",
    "Passing",
    "Mode",
    "x",
];

/// Arbitrary JSON with Consul's keys.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "[ -~]{0,16}".prop_map(Value::String),
        prop_oneof![
            Just("http"),
            Just("tcp"),
            Just("connect-proxy"),
            Just("allow"),
            Just("deny"),
            Just("1h"),
            Just("service-defaults"),
            Just("service-router")
        ]
        .prop_map(|s| Value::String(s.to_owned())),
        hcl().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        ]
    })
}

/// Arbitrary ACL rules: HCL (or JSON) pieces in any order, some broken.
fn hcl() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("service \"web\" { policy = \"write\" }"),
        Just("service_prefix \"\" { policy = \"read\" intentions = \"write\" }"),
        Just("node_prefix \"\" { policy = \"read\" }"),
        Just("operator = \"write\""),
        Just("acl = \"read\""),
        Just("mesh = \"deny\""),
        Just("key_prefix \"\" { policy = \"list\" }"),
        Just("{\"service\": {\"web\": {\"policy\": \"read\"}}}"),
        Just("policy = "),
        Just("{"),
        Just("}"),
        Just("\""),
        Just("#"),
        Just("\n"),
        Just("/*"),
        "[ -~]{0,8}".prop_map(|s| Box::leak(s.into_boxed_str()) as &str),
    ];
    let sep = prop_oneof![3 => Just("\n"), 1 => Just(" "), 1 => Just("\n\n  ")];
    prop::collection::vec((piece, sep), 0..6).prop_map(|v| v.into_iter().flat_map(|(p, s)| [p, s]).collect())
}

/// Near-valid ACL bodies (a fresh name and arbitrary rules, plus arbitrary keys), so most
/// reach the rules parser and the policy, role and token checks behind it.
fn acl_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![1 => body(), 2 => near_valid_acl()]
}

fn near_valid_acl() -> impl Strategy<Value = Vec<u8>> {
    ("[a-z0-9-]{1,12}", hcl(), json()).prop_map(|(name, rules, extra)| {
        let mut v = serde_json::json!({"Name": name, "Rules": rules, "Description": "fuzz"});
        if let (Value::Object(m), Value::Object(x)) = (&mut v, extra) {
            m.extend(x.into_iter().filter(|(k, _)| k != "Name"));
        }
        serde_json::to_vec(&v).unwrap()
    })
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        json().prop_map(|v| serde_json::to_vec(&v).unwrap()),
    ]
}

const WRITES: &[(&str, &str)] = &[
    ("PUT", "/v1/catalog/register"),
    ("PUT", "/v1/catalog/deregister"),
    ("PUT", "/v1/config"),
    ("PUT", "/v1/connect/intentions/exact?source=web&destination=api"),
    ("PUT", "/v1/connect/ca/configuration"),
    ("PUT", "/v1/internal/connect/ca/sign"),
    ("POST", "/v1/discovery-chain/web"),
    ("PUT", "/v1/internal/node/heartbeat"),
];

/// Write routes of the ACL system, sent with the management token to a server with ACLs on.
const ACL_WRITES: &[(&str, &str)] = &[
    ("PUT", "/v1/acl/policy"),
    ("PUT", "/v1/acl/role"),
    ("PUT", "/v1/acl/token"),
    ("PUT", "/v1/acl/bootstrap"),
    ("PUT", "/v1/acl/token/00000000-0000-0000-0000-000000000001/clone"),
    ("PUT", "/v1/acl/policy/00000000-0000-0000-0000-000000000001"),
];

const READS: &[&str] = &[
    "/v1/catalog/services",
    "/v1/catalog/service/web",
    "/v1/catalog/nodes",
    "/v1/health/service/web",
    "/v1/health/state/any",
    "/v1/config/service-defaults",
    "/v1/connect/intentions/match",
    "/v1/connect/intentions/check",
    "/v1/discovery-chain/web",
    "/v1/connect/ca/roots",
];

/// One runtime and one server for every case (in memory; writes that succeed stay).
fn setup() -> &'static (tokio::runtime::Runtime, Router) {
    static S: OnceLock<(tokio::runtime::Runtime, Router)> = OnceLock::new();
    S.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let app = rt.block_on(async {
            let store = Store::open(StoreConfig::default()).await.unwrap();
            let liveness = std::sync::Arc::new(catalog::liveness::Liveness::new(store.clone(), Default::default()));
            http_api::router(
                store,
                http_api::ApiConfig {
                    liveness: Some(liveness),
                    ..http_api::ApiConfig::default()
                },
            )
        });
        (rt, app)
    })
}

/// A second server, with ACLs on (default deny), bootstrapped: its router and the management
/// token.
fn acl_setup() -> &'static (Router, String) {
    static S: OnceLock<(Router, String)> = OnceLock::new();
    S.get_or_init(|| {
        let (rt, _) = setup();
        rt.block_on(async {
            let store = Store::open(StoreConfig::default()).await.unwrap();
            let acl = std::sync::Arc::new(catalog::acl::Resolver::new(catalog::acl::AclSettings {
                enabled: true,
                default_allow: false,
                datacenter: "dc1".into(),
            }));
            store.write(catalog::Op::AclInit).await.unwrap();
            let app = http_api::router(
                store,
                http_api::ApiConfig {
                    acl,
                    ..Default::default()
                },
            );
            let (status, text) = send(&app, "PUT", "/v1/acl/bootstrap", Vec::new(), None).await;
            assert_eq!(status, 200, "{text}");
            let token = serde_json::from_str::<Value>(&text).unwrap()["SecretID"]
                .as_str()
                .unwrap()
                .to_owned();
            (app, token)
        })
    })
}

async fn send(app: &Router, method: &str, uri: &str, body: Vec<u8>, token: Option<&str>) -> (u16, String) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        req = req.header("X-Consul-Token", t);
    }
    let resp = app.clone().oneshot(req.body(Body::from(body)).unwrap()).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

fn call(method: &str, uri: &str, body: Vec<u8>) -> (u16, String) {
    let (rt, app) = setup();
    rt.block_on(async {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::from(body))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    })
}

proptest! {
    // Failures are kept beside this file and replayed first on every run: a crash found
    // becomes a regression test.
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(prop::test_runner::FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]
    #[test]
    fn write_bodies_get_an_answer_never_a_failure(route in prop::sample::select(WRITES), body in body()) {
        let (method, uri) = route;
        let (status, text) = call(method, uri, body);
        // A body naming another datacenter gets Consul's 500 "No path to datacenter": the one
        // 5xx a request can ask for.
        let other_dc = status == 500 && text.starts_with("No path to datacenter");
        prop_assert!(status < 500 || other_dc, "{method} {uri}: {status} {text}");
        if status >= 400 {
            prop_assert!(!text.trim().is_empty(), "{method} {uri}: a {status} says why");
        }
    }

    #[test]
    fn acl_bodies_and_rules_get_an_answer_never_a_failure(route in prop::sample::select(ACL_WRITES), body in acl_body()) {
        let (method, uri) = route;
        let (app, token) = acl_setup();
        let (rt, _) = setup();
        let (status, text) = rt.block_on(send(app, method, uri, body, Some(token)));
        prop_assert!(status < 500, "{method} {uri}: {status} {text}");
        if status >= 400 {
            prop_assert!(!text.trim().is_empty(), "{method} {uri}: a {status} says why");
        }
    }

    #[test]
    fn blocking_parameters_parse_or_say_why(index in "[ -~]{0,24}", wait in prop_oneof![
        "[ -~]{0,24}",
        "[0-9]{1,22}(ns|us|µs|ms|s|m|h|)",
        "-?[0-9]{0,6}(\\.[0-9]{0,6})?(ns|us|ms|s|m|h){1,3}",
    ]) {
        let raw = format!(
            "index={}&wait={}",
            form_urlencoded::byte_serialize(index.as_bytes()).collect::<String>(),
            form_urlencoded::byte_serialize(wait.as_bytes()).collect::<String>()
        );
        match http_api::query::Params::parse(Some(&raw)).blocking() {
            Ok(b) => prop_assert!(b.wait <= std::time::Duration::from_secs(600), "{raw}: {:?}", b.wait),
            Err(e) => prop_assert!(!e.to_string().is_empty(), "{raw}"),
        }
    }

    #[test]
    fn query_strings_get_an_answer_never_a_failure(
        path in prop::sample::select(READS),
        query in prop::collection::vec(
            (prop_oneof![
                prop::sample::select(&["index", "wait", "dc", "tag", "node-meta", "passing", "by", "name",
                    "source", "destination", "filter", "near", "pretty", "token"][..]).prop_map(str::to_owned),
                "[a-z]{1,6}",
             ],
             "[ -~]{0,12}"),
            0..5),
    ) {
        let q: String = query
            .iter()
            .map(|(k, v)| format!("{k}={}", form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>()))
            .collect::<Vec<_>>()
            .join("&");
        // A blocking query waits at most a millisecond here (its own wait parameters are
        // still parsed: they come first, and the first value counts... so they are renamed).
        let q = q.replace("wait=", "w=");
        let uri = format!("{path}?wait=1ms&{q}");
        let (status, text) = call("GET", &uri, Vec::new());
        // An unknown datacenter is Consul's 500 ("No path to datacenter"): the one 5xx asked for.
        let other_dc = status == 500 && text.starts_with("No path to datacenter");
        prop_assert!(status < 500 || other_dc, "GET {uri}: {status} {text}");
    }
}
