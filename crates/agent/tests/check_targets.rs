//! Where checks registered through the API may point, with ACLs on and a `web` token: its
//! own address and port only (loopback included, the agent being local), GET or HEAD only
//! elsewhere, node checks nowhere unless `-check-allowed-targets` says so. The attacks: an
//! Envoy admin's `POST /quitquitquit`, and reading another local service into a check's
//! output.
#![allow(clippy::unwrap_used)]

use crate::support::{NODE, Who, call, fake_server};
use agent::acl::AclConfig;
use agent::check_targets::Cidr;
use agent::{Agent, AgentConfig};
use axum::Router;
use axum::http::StatusCode;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// An agent with `api` (port 8080) registered by management.
async fn setup(server: &str, allowed: &str, dir: Option<&std::path::Path>) -> (Router, Agent) {
    let agent = Agent::start(AgentConfig {
        node: NODE.into(),
        servers: vec![server.to_owned()],
        data_dir: dir.map(ToOwned::to_owned),
        acl: AclConfig {
            enabled: true,
            default_allow: false,
            ..AclConfig::default()
        },
        check_allowed_targets: Cidr::parse_list(allowed).unwrap(),
        listeners: vec!["127.0.0.1:8500".parse().unwrap()],
        ..AgentConfig::default()
    })
    .await
    .unwrap();
    let app = agent::http::router(agent.clone());
    let api = json!({"ID": "api", "Name": "api", "Port": 8080});
    let (status, text) = call(&app, Who::Management, "PUT", "/v1/agent/service/register", &api).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    (app, agent)
}

/// A stand-in for an Envoy admin listener: counts every request it gets.
async fn admin() -> (u16, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&hits);
    let app = Router::new().fallback(move || {
        let counted = Arc::clone(&counted);
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            "admin"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, hits)
}

fn web(port: u16, check: Value) -> Value {
    json!({"ID": "web", "Name": "web", "Port": port, "Check": check})
}

async fn put(app: &Router, who: Who, uri: &str, body: Value) -> (StatusCode, String) {
    call(app, who, "PUT", uri, &body).await
}

#[tokio::test]
async fn a_web_token_may_check_its_own_port_and_nothing_else() {
    let server = fake_server().await;
    let (app, agent) = setup(&server, "", None).await;
    let (admin_port, hits) = admin().await;
    let register = "/v1/agent/service/register";
    let quit = format!("http://127.0.0.1:{admin_port}/quitquitquit");
    let post = json!({"CheckID": "q", "HTTP": quit, "Method": "POST", "Interval": "1s"});
    // POST to an admin port, in a service registration and on its own.
    let (st, text) = put(&app, Who::Web, register, web(8081, post.clone())).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{text}");
    assert!(
        text.starts_with("Check.Method: POST is allowed only against the service's own address and port"),
        "{text}"
    );
    let (st, text) = put(
        &app,
        Who::Web,
        register,
        web(8081, json!({"CheckID": "t", "TTL": "1h"})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{text}");
    let mut standalone = post.clone();
    standalone["ServiceID"] = json!("web");
    standalone["Name"] = json!("quit");
    let (st, text) = put(&app, Who::Web, "/v1/agent/check/register", standalone).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.starts_with("Method: POST"), "{text}");
    // GET of another loopback port (api's), to read it into the output.
    let read = json!({"CheckID": "r", "HTTP": "http://127.0.0.1:8080/secrets", "Interval": "1s"});
    let (st, text) = put(&app, Who::Web, register, web(8081, read.clone())).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{text}");
    assert!(
        text.starts_with("Check.HTTP: 127.0.0.1:8080 is not the service's own port on this host"),
        "{text}"
    );
    // Nor by claiming api's port for web.
    let (st, text) = put(&app, Who::Web, register, web(8080, read)).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("also those of service \"api\""), "{text}");
    // Nor the agent's own API, by claiming its port: a token-less check would run with the
    // default token.
    let own_api = json!({"CheckID": "a", "HTTP": "http://127.0.0.1:8500/v1/agent/service/deregister/api",
                         "Method": "PUT", "Interval": "1s"});
    let (st, text) = put(&app, Who::Web, register, web(8500, own_api)).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("this agent's own listener"), "{text}");
    // A TCP check of the admin port, through a sidecar's checks.
    let sidecar = json!({"ID": "web", "Name": "web", "Port": 8081, "Connect": {"SidecarService": {
        "Checks": [{"TTL": "1h"}, {"TCP": format!("127.0.0.1:{admin_port}"), "Interval": "1s"}]}}});
    let (st, text) = put(&app, Who::Web, register, sidecar).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.starts_with("Connect.SidecarService.Checks[1].TCP: "), "{text}");
    // Nothing of it was applied.
    assert!(
        agent.state().checks().keys().eq(["t"]),
        "{:?}",
        agent.state().checks().keys()
    );
    assert_eq!(agent.state().service("web").unwrap().service.port, 8081);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(hits.load(Ordering::SeqCst), 0, "the admin port was reached");
    agent.shutdown().await;
}

#[tokio::test]
async fn node_checks_probe_only_the_allowlist_and_it_never_opens_other_methods() {
    let server = fake_server().await;
    let (app, agent) = setup(&server, "", None).await;
    let node_tcp = json!({"ID": "ssh", "Name": "ssh", "TCP": "127.0.0.1:22", "Interval": "10s"});
    let (st, text) = put(&app, Who::Node, "/v1/agent/check/register", node_tcp.clone()).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.starts_with("TCP: 127.0.0.1:22 is a node check's target"), "{text}");
    agent.shutdown().await;

    let (app, agent) = setup(&server, "127.0.0.1/32", None).await;
    let (st, text) = put(&app, Who::Node, "/v1/agent/check/register", node_tcp).await;
    assert_eq!(st, StatusCode::OK, "{text}");
    let (admin_port, _) = admin().await;
    let get = json!({"CheckID": "stats", "HTTP": format!("http://127.0.0.1:{admin_port}/stats"), "Interval": "10s"});
    let (st, text) = put(&app, Who::Web, "/v1/agent/service/register", web(8081, get)).await;
    assert_eq!(st, StatusCode::OK, "{text}");
    let post = json!({"CheckID": "q", "HTTP": format!("http://127.0.0.1:{admin_port}/quitquitquit"),
                      "Method": "POST", "Interval": "10s"});
    let (st, text) = put(&app, Who::Web, "/v1/agent/service/register", web(8081, post)).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.starts_with("Check.Method: "), "{text}");
    agent.shutdown().await;
}

#[tokio::test]
async fn config_file_checks_are_not_limited_and_refused_persisted_ones_are_dropped() {
    let server = fake_server().await;
    // The operator's checks may point anywhere.
    let (_, agent) = setup(&server, "", None).await;
    let ssh = json!({"ID": "ssh", "Name": "ssh", "TCP": "127.0.0.1:22", "Interval": "10s"});
    agent
        .load_config(vec![], vec![structs::json::from_value(ssh.clone()).unwrap()])
        .await
        .unwrap();
    assert!(agent.state().check("ssh").is_some());
    agent.shutdown().await;
    // A check registered while the allowlist allowed it is dropped once it no longer does.
    let dir = tempfile::tempdir().unwrap();
    let (app, agent) = setup(&server, "127.0.0.0/8", Some(dir.path())).await;
    let (st, text) = put(&app, Who::Node, "/v1/agent/check/register", ssh).await;
    assert_eq!(st, StatusCode::OK, "{text}");
    agent.shutdown().await;
    let (_, agent) = setup(&server, "", Some(dir.path())).await;
    assert!(agent.state().check("ssh").is_none());
    assert!(agent.state().service("api").is_some());
    agent.shutdown().await;
    // Gone for good: allowing it again does not bring it back.
    let (_, agent) = setup(&server, "127.0.0.0/8", Some(dir.path())).await;
    assert!(agent.state().check("ssh").is_none());
    agent.shutdown().await;
}

#[tokio::test]
async fn a_web_token_may_check_its_own_port_on_this_host_with_any_method() {
    let server = fake_server().await;
    let (app, agent) = setup(&server, "", None).await;
    let register = "/v1/agent/service/register";
    // Its own port on loopback (any spelling), any method there.
    for url in [
        "http://127.0.0.1:8081/health",
        "http://localhost:8081/",
        "http://[::1]:8081/",
    ] {
        let own = json!({"CheckID": "own", "HTTP": url, "Method": "POST", "Interval": "1s"});
        let (st, text) = put(&app, Who::Web, register, web(8081, own)).await;
        assert_eq!(st, StatusCode::OK, "{url}: {text}");
    }
    let (st, text) = put(
        &app,
        Who::Web,
        "/v1/agent/check/register",
        json!({"ID": "tcp", "Name": "tcp", "ServiceID": "web", "TCP": "127.0.0.1:8081", "Interval": "1s"}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{text}");
    agent.shutdown().await;
}
