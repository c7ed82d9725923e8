//! Shared by the ACL tests: a fake server that resolves four identities' tokens, and calls
//! into an agent's router in process.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use axum::extract::Query;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use serde_json::Value;
use std::collections::BTreeMap;
use tower::ServiceExt;

pub const NODE: &str = "n1";
pub const WEB: &str = "web-secret";
pub const NODE_TOKEN: &str = "node-secret";
pub const MANAGEMENT: &str = "management-secret";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    Anonymous,
    Web,
    Node,
    Management,
}

impl Who {
    pub const ALL: [Who; 4] = [Who::Anonymous, Who::Web, Who::Node, Who::Management];

    pub fn token(self) -> Option<&'static str> {
        match self {
            Who::Anonymous => None,
            Who::Web => Some(WEB),
            Who::Node => Some(NODE_TOKEN),
            Who::Management => Some(MANAGEMENT),
        }
    }
}

/// `GET /v1/internal/acl/authorizer` as a server answers it, for the four identities; the
/// agent's blocking query on it (any index past 0) is held until the test ends.
async fn authorizer(Query(q): Query<BTreeMap<String, String>>, headers: HeaderMap) -> Response {
    if q.get("index").is_some_and(|i| i != "0") {
        tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
    }
    let token = headers
        .get("X-Consul-Token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let (accessor, rules) = match token {
        "" => ("00000000-0000-0000-0000-000000000002", vec![]),
        WEB => ("web-accessor", vec![acl::Rules::service_identity("web")]),
        NODE_TOKEN => ("node-accessor", vec![acl::Rules::node_identity(NODE)]),
        MANAGEMENT => (
            "management-accessor",
            vec![acl::Rules::parse(acl::GLOBAL_MANAGEMENT_RULES).unwrap()],
        ),
        _ => return (StatusCode::FORBIDDEN, "ACL not found").into_response(),
    };
    let rules = acl::TokenRules {
        accessor_id: accessor.into(),
        default_policy: "deny".into(),
        rules,
        expiration_time: None,
    };
    ([("X-Consul-Index", "1")], axum::Json(rules)).into_response()
}

/// A server that resolves tokens and answers everything else 503 (anti-entropy backs off:
/// the catalog only ever gets what the local state holds).
pub async fn fake_server() -> String {
    let app = Router::new()
        .route("/v1/internal/acl/authorizer", axum::routing::get(authorizer))
        .fallback(|| async { StatusCode::SERVICE_UNAVAILABLE });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr.to_string()
}

pub async fn call(app: &Router, who: Who, method: &str, uri: &str, body: &Value) -> (StatusCode, String) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = who.token() {
        req = req.header("X-Consul-Token", t);
    }
    let body = if body.is_null() {
        Body::empty()
    } else {
        Body::from(body.to_string())
    };
    let resp = app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}
