//! Who may change what through the agent's API with ACLs on (default deny): every identity
//! (no token, a `web` service identity, a node identity, a management token) against every
//! endpoint that names something already registered: a service `api` with a sidecar, their
//! checks, and a node check. Each request runs against a fresh agent (in process; a fake
//! server answers token lookups) and must answer the expected status; a refused one must
//! leave everything as it was: the local state (what anti-entropy pushes to the catalog) and
//! the files under the data dir.
#![allow(clippy::unwrap_used)]

use crate::support::{self, NODE, Who, call, fake_server};
use agent::acl::AclConfig;
use agent::{Agent, AgentConfig};
use axum::Router;
use axum::http::StatusCode;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;

/// An agent with `api` (and its sidecar), `web` and a node check, registered by management.
async fn setup(server: &str, dir: &Path) -> (Router, Agent) {
    let agent = Agent::start(AgentConfig {
        node: NODE.into(),
        servers: vec![server.to_owned()],
        data_dir: Some(dir.to_owned()),
        acl: AclConfig {
            enabled: true,
            default_allow: false,
            ..AclConfig::default()
        },
        ..AgentConfig::default()
    })
    .await
    .unwrap();
    let app = agent::http::router(agent.clone());
    for (uri, body) in [
        (
            "/v1/agent/service/register",
            json!({"ID": "api", "Name": "api", "Port": 8080,
                   "Check": {"CheckID": "api-ttl", "TTL": "1h", "Status": "passing"},
                   "Connect": {"SidecarService": {"Port": 21000,
                       "Check": {"CheckID": "api-sidecar-ttl", "TTL": "1h", "Status": "passing"}}}}),
        ),
        (
            "/v1/agent/service/register",
            json!({"ID": "web", "Name": "web", "Port": 8081,
                   "Check": {"CheckID": "web-ttl", "TTL": "1h", "Status": "passing"}}),
        ),
        (
            "/v1/agent/check/register",
            json!({"ID": "node-ttl", "Name": "node", "TTL": "1h", "Status": "passing"}),
        ),
    ] {
        let (status, text) = call(&app, Who::Management, "PUT", uri, &body).await;
        assert_eq!(status, StatusCode::OK, "setup {uri}: {text}");
    }
    (app, agent)
}

/// Everything a request could change: the local state (generations included: what
/// anti-entropy would push) and every file under the data dir.
fn snapshot(agent: &Agent, dir: &Path) -> String {
    fn files(dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files(&path, out);
            } else {
                out.insert(path.display().to_string(), std::fs::read(&path).unwrap());
            }
        }
    }
    let mut disk = BTreeMap::new();
    files(dir, &mut disk);
    format!(
        "{:?}\n{:?}\n{:?}\n{disk:?}",
        agent.state().services(),
        agent.state().checks(),
        agent.state().pending()
    )
}

use Who::{Management as M, Node as N, Web as W};

/// What a row tries, how, and who may.
type Row = (&'static str, &'static str, &'static str, Value, Vec<Who>);

/// (what, method, path, body, who may): every endpoint that takes the id of something
/// existing, aimed at what the `web` token does not own.
fn rows() -> Vec<Row> {
    let n = Value::Null;
    let register = "/v1/agent/service/register";
    let check = "/v1/agent/check/register";
    vec![
        (
            "register over api",
            "PUT",
            register,
            json!({"ID": "api", "Name": "web", "Port": 8081}),
            vec![M],
        ),
        (
            "register over api's sidecar",
            "PUT",
            register,
            json!({"ID": "api-sidecar-proxy", "Name": "web-sidecar-proxy", "Kind": "connect-proxy", "Port": 21005,
                   "Proxy": {"DestinationServiceName": "web", "DestinationServiceID": "web"}}),
            vec![M],
        ),
        (
            "a sidecar over api's, through SidecarService.ID",
            "PUT",
            register,
            json!({"ID": "web", "Name": "web", "Port": 8081,
                   "Connect": {"SidecarService": {"ID": "api-sidecar-proxy", "Port": 21006}}}),
            vec![M],
        ),
        (
            "a service check reusing api's check id",
            "PUT",
            register,
            json!({"ID": "web", "Name": "web", "Port": 8081, "Check": {"CheckID": "api-ttl", "TTL": "1h"}}),
            vec![M],
        ),
        (
            "deregister api",
            "PUT",
            "/v1/agent/service/deregister/api",
            n.clone(),
            vec![M],
        ),
        (
            "deregister api's sidecar",
            "PUT",
            "/v1/agent/service/deregister/api-sidecar-proxy",
            n.clone(),
            vec![M],
        ),
        (
            "check over api's, for web",
            "PUT",
            check,
            json!({"ID": "api-ttl", "Name": "x", "TTL": "1h", "ServiceID": "web"}),
            vec![M],
        ),
        (
            "check over api's, as a node check",
            "PUT",
            check,
            json!({"ID": "api-ttl", "Name": "x", "TTL": "1h"}),
            vec![M],
        ),
        (
            "check over the node's, for web",
            "PUT",
            check,
            json!({"ID": "node-ttl", "Name": "x", "TTL": "1h", "ServiceID": "web"}),
            vec![M],
        ),
        (
            "check over the node's, as a node check",
            "PUT",
            check,
            json!({"ID": "node-ttl", "Name": "x", "TTL": "1h"}),
            vec![N, M],
        ),
        (
            "deregister api's check",
            "PUT",
            "/v1/agent/check/deregister/api-ttl",
            n.clone(),
            vec![M],
        ),
        (
            "deregister the node check",
            "PUT",
            "/v1/agent/check/deregister/node-ttl",
            n.clone(),
            vec![N, M],
        ),
        (
            "pass api's check",
            "PUT",
            "/v1/agent/check/pass/api-ttl?note=x",
            n.clone(),
            vec![M],
        ),
        (
            "warn api's check",
            "PUT",
            "/v1/agent/check/warn/api-ttl?note=x",
            n.clone(),
            vec![M],
        ),
        (
            "fail api's check",
            "PUT",
            "/v1/agent/check/fail/api-ttl?note=x",
            n.clone(),
            vec![M],
        ),
        (
            "update api's check",
            "PUT",
            "/v1/agent/check/update/api-ttl",
            json!({"Status": "warning", "Output": "x"}),
            vec![M],
        ),
        (
            "pass the node check",
            "PUT",
            "/v1/agent/check/pass/node-ttl?note=x",
            n.clone(),
            vec![N, M],
        ),
        (
            "warn the node check",
            "PUT",
            "/v1/agent/check/warn/node-ttl?note=x",
            n.clone(),
            vec![N, M],
        ),
        (
            "fail the node check",
            "PUT",
            "/v1/agent/check/fail/node-ttl?note=x",
            n.clone(),
            vec![N, M],
        ),
        (
            "update the node check",
            "PUT",
            "/v1/agent/check/update/node-ttl",
            json!({"Status": "warning", "Output": "x"}),
            vec![N, M],
        ),
        (
            "api into maintenance",
            "PUT",
            "/v1/agent/service/maintenance/api?enable=true",
            n.clone(),
            vec![M],
        ),
        (
            "api's sidecar into maintenance",
            "PUT",
            "/v1/agent/service/maintenance/api-sidecar-proxy?enable=true",
            n.clone(),
            vec![M],
        ),
        (
            "the node into maintenance",
            "PUT",
            "/v1/agent/maintenance?enable=true",
            n.clone(),
            vec![N, M],
        ),
        // What the web token owns, it may change.
        (
            "web re-registers web",
            "PUT",
            register,
            json!({"ID": "web", "Name": "web", "Port": 8082, "Check": {"CheckID": "web-ttl", "TTL": "1h"}}),
            vec![W, M],
        ),
        (
            "pass web's check",
            "PUT",
            "/v1/agent/check/pass/web-ttl?note=x",
            n.clone(),
            vec![W, M],
        ),
        (
            "web into maintenance",
            "PUT",
            "/v1/agent/service/maintenance/web?enable=true",
            n,
            vec![W, M],
        ),
    ]
}

/// One request against a fresh agent: the expected status, and a change exactly when allowed.
async fn run_case(server: String, row: Row, who: Who) {
    let (what, method, path, body, allowed) = row;
    let dir = tempfile::tempdir().unwrap();
    let (app, agent) = setup(&server, dir.path()).await;
    let before = snapshot(&agent, dir.path());
    let (status, text) = call(&app, who, method, path, &body).await;
    let after = snapshot(&agent, dir.path());
    agent.shutdown().await;
    if allowed.contains(&who) {
        assert_eq!(status, StatusCode::OK, "{what} as {who:?}: {text}");
        assert_ne!(before, after, "{what} as {who:?}: allowed, yet nothing changed");
    } else {
        assert_eq!(status, StatusCode::FORBIDDEN, "{what} as {who:?}: {text}");
        assert!(
            text.starts_with("Permission denied: token with AccessorID '") && text.contains("' lacks permission '"),
            "{what} as {who:?}: {text}"
        );
        assert_eq!(before, after, "{what} as {who:?}: refused, yet something changed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_identity_against_every_endpoint_that_takes_an_existing_id() {
    let server = fake_server().await;
    let mut cases = tokio::task::JoinSet::new();
    for row in rows() {
        for who in Who::ALL {
            cases.spawn(run_case(server.clone(), row.clone(), who));
        }
    }
    while let Some(done) = cases.join_next().await {
        if let Err(e) = done {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

/// A service identity manages its own service and sidecar: the sidecar goes with its
/// service on the service's permission, as in Consul.
#[tokio::test]
async fn a_service_identity_registers_and_removes_its_service_with_its_sidecar() {
    let server = fake_server().await;
    let dir = tempfile::tempdir().unwrap();
    let (app, agent) = setup(&server, dir.path()).await;
    let reg = json!({"ID": "web", "Name": "web", "Port": 8081, "Connect": {"SidecarService": {}}});
    let (status, text) = call(&app, Who::Web, "PUT", "/v1/agent/service/register", &reg).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(agent.state().service("web-sidecar-proxy").is_some());
    // Re-registering without the sidecar drops it; registering it again brings it back.
    let plain = json!({"ID": "web", "Name": "web", "Port": 8081});
    let (status, text) = call(&app, Who::Web, "PUT", "/v1/agent/service/register", &plain).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(agent.state().service("web-sidecar-proxy").is_none());
    let (status, text) = call(&app, Who::Web, "PUT", "/v1/agent/service/register", &reg).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let (status, text) = call(&app, Who::Web, "PUT", "/v1/agent/service/deregister/web", &Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(agent.state().service("web").is_none() && agent.state().service("web-sidecar-proxy").is_none());
    // api and its sidecar are untouched.
    assert!(agent.state().service("api").is_some() && agent.state().service("api-sidecar-proxy").is_some());
    // A managed proxy (Consul 1.4's `Connect.Proxy`) is an instance named `web-proxy`, which
    // a web identity does not cover (the servers would refuse its sync just the same).
    let managed = json!({"ID": "web", "Name": "web", "Port": 8081, "Connect": {"Proxy": {}}});
    let (status, text) = call(&app, Who::Web, "PUT", "/v1/agent/service/register", &managed).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert!(text.contains("\"web-proxy\""), "{text}");
    agent.shutdown().await;
}

/// Taking over an existing proxy's id needs write on its destination too, not only on its
/// name: a proxy named `web-sidecar-proxy` that fronts `api` stays `api`'s.
#[tokio::test]
async fn an_existing_proxy_needs_write_on_its_destination_too() {
    let server = fake_server().await;
    let dir = tempfile::tempdir().unwrap();
    let (app, agent) = setup(&server, dir.path()).await;
    let proxy = json!({"ID": "edge", "Name": "web-sidecar-proxy", "Kind": "connect-proxy", "Port": 21010,
        "Proxy": {"DestinationServiceName": "api", "DestinationServiceID": "api"}});
    let (status, text) = call(&app, Who::Management, "PUT", "/v1/agent/service/register", &proxy).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let before = snapshot(&agent, dir.path());
    let takeover = json!({"ID": "edge", "Name": "web-sidecar-proxy", "Kind": "connect-proxy", "Port": 21010,
        "Proxy": {"DestinationServiceName": "web", "DestinationServiceID": "web"}});
    for (method, path, body) in [
        ("PUT", "/v1/agent/service/register", takeover),
        ("PUT", "/v1/agent/service/deregister/edge", Value::Null),
        ("PUT", "/v1/agent/service/maintenance/edge?enable=true", Value::Null),
    ] {
        let (status, text) = call(&app, Who::Web, method, path, &body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {text}");
        assert!(
            text.ends_with("lacks permission 'service:write' on \"api\"\n"),
            "{path}: {text:?}"
        );
    }
    assert_eq!(before, snapshot(&agent, dir.path()));
    agent.shutdown().await;
}

/// The check ids the agent derives from a service id belong to that service: nobody may
/// register them for another (a squatter would block the owner's next registration), while
/// the owner's own registrations keep working.
#[tokio::test]
async fn check_ids_derived_from_a_service_cannot_be_squatted() {
    let server = fake_server().await;
    let dir = tempfile::tempdir().unwrap();
    let (app, agent) = setup(&server, dir.path()).await;
    let before = snapshot(&agent, dir.path());
    let squat = |id: &str| json!({"ID": "web", "Name": "web", "Port": 8081, "Checks": [{"TTL": "1h"}, {"CheckID": id, "TTL": "1h"}]});
    for (who, uri, body, field) in [
        (
            Who::Web,
            "/v1/agent/service/register",
            squat("service:db"),
            "Checks[1].CheckID",
        ),
        (
            Who::Web,
            "/v1/agent/service/register",
            squat("service:db:2"),
            "Checks[1].CheckID",
        ),
        (
            Who::Web,
            "/v1/agent/check/register",
            json!({"ID": "_service_maintenance:db", "Name": "x", "TTL": "1h", "ServiceID": "web"}),
            "ID",
        ),
        (
            Who::Management,
            "/v1/agent/check/register",
            json!({"CheckID": "_node_maintenance", "Name": "x", "TTL": "1h"}),
            "CheckID",
        ),
    ] {
        let (status, text) = call(&app, who, "PUT", uri, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {text}");
        assert!(
            text.starts_with(&format!("{field}: ")) && text.contains("is reserved"),
            "{body}: {text}"
        );
    }
    assert_eq!(before, snapshot(&agent, dir.path()));
    // The owner's derived ids are its own.
    let own = json!({"ID": "web", "Name": "web", "Port": 8081, "Checks": [{"TTL": "1h"}, {"CheckID": "service:web:9", "TTL": "1h"}]});
    let (status, text) = call(&app, Who::Web, "PUT", "/v1/agent/service/register", &own).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(agent.state().check("service:web:1").is_some() && agent.state().check("service:web:9").is_some());
    agent.shutdown().await;
}

/// `PUT /v1/agent/token/default` needs `acl:write`; the new default token is what requests
/// naming none run with, until it is cleared.
#[tokio::test]
async fn the_default_token_changes_over_the_api_with_acl_write_only() {
    let server = fake_server().await;
    let dir = tempfile::tempdir().unwrap();
    let (app, agent) = setup(&server, dir.path()).await;
    let services = |app: Router| async move {
        let (status, text) = call(&app, Who::Anonymous, "GET", "/v1/agent/services", &Value::Null).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        v.as_object().unwrap().keys().cloned().collect::<Vec<_>>()
    };
    assert!(
        services(app.clone()).await.is_empty(),
        "the anonymous token reads nothing"
    );
    let set = json!({"Token": support::WEB});
    for who in [Who::Anonymous, Who::Web, Who::Node] {
        let (status, text) = call(&app, who, "PUT", "/v1/agent/token/default", &set).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{who:?}: {text}");
    }
    assert!(services(app.clone()).await.is_empty());
    let (status, text) = call(&app, Who::Management, "PUT", "/v1/agent/token/default", &set).await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, ""));
    assert!(
        services(app.clone()).await.contains(&"web".to_owned()),
        "runs as web now"
    );
    // Consul's older name; an empty token clears it.
    let clear = json!({"Token": ""});
    let (status, _) = call(&app, Who::Management, "PUT", "/v1/agent/token/acl_token", &clear).await;
    assert_eq!(status, StatusCode::OK);
    assert!(services(app.clone()).await.is_empty());
    for (uri, body, want) in [
        (
            "/v1/agent/token/nope",
            &set,
            (StatusCode::NOT_FOUND, "Token \"nope\" is unknown"),
        ),
        (
            "/v1/agent/token/dns",
            &set,
            (
                StatusCode::BAD_REQUEST,
                "dns: not supported: a meshd agent has a default and an agent token only",
            ),
        ),
        (
            "/v1/agent/token/agent",
            &json!({"Token": "a b"}),
            (
                StatusCode::BAD_REQUEST,
                "Token: must be at most 256 visible ASCII characters without spaces",
            ),
        ),
    ] {
        let (status, text) = call(&app, Who::Management, "PUT", uri, body).await;
        assert_eq!((status, text.trim()), want, "{uri}");
    }
    agent.shutdown().await;
}
