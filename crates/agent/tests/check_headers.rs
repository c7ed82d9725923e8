//! An HTTP check's header values (credentials, often) are shown only to tokens that may
//! write the check's service (the node, for a node check), and never leave the agent: the
//! check anti-entropy pushes to the catalog carries `<hidden>`.
#![allow(clippy::unwrap_used)]

use crate::support::{NODE, Who, call, fake_server};
use agent::acl::AclConfig;
use agent::{Agent, AgentConfig};
use axum::http::StatusCode;
use serde_json::{Value, json};

const SECRET: &str = "Bearer s3cret";

/// The headers of check `id` in a local-health answer.
fn in_health(v: &Value, id: &str) -> Value {
    let checks = v["Checks"].as_array().unwrap();
    checks.iter().find(|c| c["CheckID"] == id).unwrap()["Definition"]["Header"].clone()
}

/// An agent with `web`'s HTTP check and an HTTP node check, both with a secret header.
async fn setup() -> (axum::Router, Agent) {
    let server = fake_server().await;
    let agent = Agent::start(AgentConfig {
        node: NODE.into(),
        servers: vec![server],
        acl: AclConfig {
            enabled: true,
            default_allow: false,
            ..AclConfig::default()
        },
        check_allowed_targets: agent::check_targets::Cidr::parse_list("127.0.0.1").unwrap(),
        ..AgentConfig::default()
    })
    .await
    .unwrap();
    let app = agent::http::router(agent.clone());
    let reg = json!({"ID": "web", "Name": "web", "Port": 8081, "Check": {"CheckID": "web-http",
        "HTTP": "http://127.0.0.1:8081/health", "Interval": "10s", "Header": {"Authorization": [SECRET]}}});
    let (st, text) = call(&app, Who::Web, "PUT", "/v1/agent/service/register", &reg).await;
    assert_eq!(st, StatusCode::OK, "{text}");
    let node_check = json!({"ID": "node-http", "Name": "node", "HTTP": "http://127.0.0.1:9/",
        "Interval": "10s", "Header": {"X-Key": [SECRET]}});
    let (st, text) = call(&app, Who::Management, "PUT", "/v1/agent/check/register", &node_check).await;
    assert_eq!(st, StatusCode::OK, "{text}");
    (app, agent)
}

#[tokio::test]
async fn header_values_are_hidden_from_readers_and_from_the_catalog() {
    let (app, agent) = setup().await;

    let header = |who, path: &str, pick: fn(&Value) -> Value| {
        let app = app.clone();
        let path = path.to_owned();
        async move {
            let (st, text) = call(&app, who, "GET", &path, &Value::Null).await;
            assert!(
                st.is_success() || st == StatusCode::SERVICE_UNAVAILABLE,
                "{path}: {text}"
            );
            pick(&serde_json::from_str(&text).unwrap())
        }
    };
    let web_check = |v: &Value| v["web-http"]["Definition"]["Header"].clone();
    let node_header = |v: &Value| v["node-http"]["Definition"]["Header"].clone();
    // The writer sees the values; a reader (the node identity reads every service) does not.
    assert_eq!(
        header(Who::Web, "/v1/agent/checks", web_check).await,
        json!({"Authorization": [SECRET]})
    );
    assert_eq!(
        header(Who::Node, "/v1/agent/checks", web_check).await,
        json!({"Authorization": ["<hidden>"]})
    );
    let health = "/v1/agent/health/service/id/web";
    let web_in_health = |v: &Value| in_health(v, "web-http");
    assert_eq!(
        header(Who::Web, health, web_in_health).await,
        json!({"Authorization": [SECRET]})
    );
    assert_eq!(
        header(Who::Node, health, web_in_health).await,
        json!({"Authorization": ["<hidden>"]})
    );
    let by_name = |v: &Value| in_health(&v[0], "web-http");
    assert_eq!(
        header(Who::Node, "/v1/agent/health/service/name/web", by_name).await,
        json!({"Authorization": ["<hidden>"]})
    );
    // A node check's values: node:write (the node identity), not the web token.
    assert_eq!(
        header(Who::Node, "/v1/agent/checks", node_header).await,
        json!({"X-Key": [SECRET]})
    );
    assert_eq!(
        header(Who::Management, "/v1/agent/checks", node_header).await,
        json!({"X-Key": [SECRET]})
    );
    let in_web_health = |v: &Value| in_health(v, "node-http");
    assert_eq!(
        header(Who::Web, health, in_web_health).await,
        json!({"X-Key": ["<hidden>"]})
    );
    // What anti-entropy pushes to the catalog, and the state's own copy, have no value.
    let pending = format!("{:?}", agent.state().pending());
    assert!(pending.contains("<hidden>") && !pending.contains("s3cret"), "{pending}");
    assert!(!format!("{:?}", agent.state().check("web-http").unwrap().check).contains("s3cret"));
    agent.shutdown().await;
}
