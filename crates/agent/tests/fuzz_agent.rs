//! Property tests of the agent's request decoders (issue 18's fuzzing, structured): arbitrary
//! bytes and arbitrary JSON (keys from Consul's agent field names, any nesting) to every
//! write route of the agent's own API, and arbitrary query values to the ones that take
//! them. The answer is always a 2xx or a 4xx with a body saying why — never a panic, never a
//! 5xx but the one for servers that do not answer (there are none here).
//!
//! The generators never produce an address, nor a check that would dial or run anything
//! (HTTP, TCP, gRPC, scripts): what is registered here only ever reaches loopback.
//!
//! `cargo xtask fuzz` runs many more cases (`PROPTEST_CASES`).
#![allow(clippy::unwrap_used)]

use agent::{Agent, AgentConfig};
use axum::Router;
use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use proptest::prelude::*;
use serde_json::Value;
use std::sync::OnceLock;
use tower::ServiceExt;

/// Field names the agent's decoders know (and one they do not); no address and no check
/// kind that reaches the network.
const KEYS: &[&str] = &[
    "Name",
    "ID",
    "Port",
    "Kind",
    "Tags",
    "Meta",
    "Proxy",
    "DestinationServiceName",
    "DestinationServiceID",
    "LocalServicePort",
    "Upstreams",
    "DestinationName",
    "DestinationType",
    "LocalBindPort",
    "Config",
    "Mode",
    "Connect",
    "SidecarService",
    "Native",
    "Check",
    "Checks",
    "CheckID",
    "TTL",
    "Interval",
    "Timeout",
    "Status",
    "Output",
    "Notes",
    "ServiceID",
    "AliasService",
    "AliasNode",
    "DeregisterCriticalServiceAfter",
    "Weights",
    "Passing",
    "Warning",
    "EnableTagOverride",
    "x",
];

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (0u16..=65535).prop_map(Value::from),
        "[ -~]{0,16}".prop_map(Value::String),
        prop_oneof![
            Just("web"),
            Just("connect-proxy"),
            Just("passing"),
            Just("critical"),
            Just("10s"),
            Just("1ms"),
            Just("web-sidecar-proxy"),
            Just("service:web")
        ]
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        ]
    })
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        json().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        // Near-valid: a named service or check with arbitrary other fields.
        ("[a-z]{1,8}", json()).prop_map(|(name, v)| {
            let mut m = serde_json::Map::new();
            m.insert("Name".into(), Value::String(name));
            if let Value::Object(x) = v {
                m.extend(x);
            }
            serde_json::to_vec(&Value::Object(m)).unwrap()
        }),
    ]
}

const WRITES: &[&str] = &[
    "/v1/agent/service/register",
    "/v1/agent/service/register?replace-existing-checks=true",
    "/v1/agent/check/register",
    "/v1/agent/check/update/service:web",
    "/v1/agent/check/update/c",
];

/// Routes whose query values are fuzzed (`{}` is replaced by the value).
const QUERIES: &[&str] = &[
    "/v1/agent/service/maintenance/web?enable={}&reason={}",
    "/v1/agent/check/pass/c?note={}",
    "/v1/agent/check/fail/service:web?note={}",
    "/v1/agent/health/service/name/web?format={}",
    "/v1/agent/services?filter={}",
    "/v1/agent/connect/ca/leaf/web?index={}&wait={}",
];

fn setup() -> &'static (tokio::runtime::Runtime, Router) {
    static S: OnceLock<(tokio::runtime::Runtime, Router)> = OnceLock::new();
    S.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let app = rt.block_on(async {
            let agent = Agent::start(AgentConfig {
                node: "n1".into(),
                // Nothing listens on port 1: every request to a server fails at once.
                servers: vec!["127.0.0.1:1".into()],
                ..AgentConfig::default()
            })
            .await
            .unwrap();
            agent::http::router(agent)
        });
        (rt, app)
    })
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
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(prop::test_runner::FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn agent_write_bodies_get_an_answer_never_a_failure(uri in prop::sample::select(WRITES), body in body()) {
        let (status, text) = call("PUT", uri, body);
        prop_assert!(status < 500, "PUT {uri}: {status} {text}");
        if status >= 400 {
            prop_assert!(!text.trim().is_empty(), "PUT {uri}: a {status} says why");
        }
    }

    #[test]
    fn agent_query_values_get_an_answer_never_a_failure(route in prop::sample::select(QUERIES), a in "[ -~]{0,12}", b in "[ -~]{0,12}") {
        let enc = |v: &str| form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>();
        let uri = route.replacen("{}", &enc(&a), 1).replacen("{}", &enc(&b), 1);
        // Blocking leaf queries would wait: their wait is kept short.
        let uri = if uri.contains("/leaf/") { uri.replace("&wait=", "&wait=1ms&w=") } else { uri };
        let method = if route.contains("/health/") || route.contains("/services") || route.contains("/leaf/") { "GET" } else { "PUT" };
        let (status, text) = call(method, &uri, Vec::new());
        // A leaf needs the servers, and none answers here: Consul's 500 for that is the one
        // 5xx these requests may get, and it says so.
        let no_server = status == 500 && text.contains("no server answered");
        prop_assert!(status < 500 || no_server, "{method} {uri}: {status} {text}");
        if status >= 400 {
            prop_assert!(!text.trim().is_empty(), "{method} {uri}: a {status} says why");
        }
    }
}
