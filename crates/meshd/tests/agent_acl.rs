//! ACLs in agent mode: a `meshd server` with ACLs on (default deny) and a `meshd agent` with
//! its own token (a node identity). Every agent route answers no token, a wrong token and the
//! right token with 403/403/2xx (or filters); a service registered with its own token is
//! synced to the servers with that token; the agent's xDS serves a proxy only to a token with
//! `service:write` on its service.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::agents;
use agents::{Proc, meshd, wait_for};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use serde_json::{Value, json};
use std::path::Path;

const MANAGEMENT: &str = "5b0c4a9e-2f3d-4e1a-8b7c-9d0e1f2a3b4c";

struct Cluster {
    _server: Proc,
    _agent: Proc,
    server: String,
    agent: String,
    agent_grpc: String,
    client: reqwest::Client,
}

async fn call(
    client: &reqwest::Client,
    method: &str,
    url: &str,
    token: Option<&str>,
    body: &Value,
) -> (u16, bool, String) {
    let mut req = client.request(method.parse().unwrap(), url);
    if let Some(t) = token {
        req = req.header("X-Consul-Token", t);
    }
    if !body.is_null() {
        req = req.json(body);
    }
    let resp = req.send().await.unwrap();
    let filtered = resp.headers().contains_key("x-consul-results-filtered-by-acls");
    (resp.status().as_u16(), filtered, resp.text().await.unwrap())
}

impl Cluster {
    async fn start(dir: &Path) -> Cluster {
        let management = dir.join("management.token");
        std::fs::write(&management, MANAGEMENT).unwrap();
        let server = test_support::process::start_server(
            meshd(),
            [
                "-dev",
                "-log-level",
                "warn",
                "-acl-enabled",
                "-acl-default-policy",
                "deny",
                "-acl-initial-management-token-file",
                management.to_str().unwrap(),
            ],
        );
        // Owned at once: a panic before the agent starts must not leave the server running.
        let server_proc = Proc(server.child);
        let client = reqwest::Client::new();
        // The agent's token: a node identity for its node.
        let (status, _, text) = call(
            &client,
            "PUT",
            &format!("{}/v1/acl/token", server.http),
            Some(MANAGEMENT),
            &json!({"NodeIdentities": [{"NodeName": "acl-node", "Datacenter": "dc1"}]}),
        )
        .await;
        assert_eq!(status, 200, "{text}");
        let agent_token: Value = serde_json::from_str(&text).unwrap();
        let agent_file = dir.join("agent.token");
        std::fs::write(&agent_file, agent_token["SecretID"].as_str().unwrap()).unwrap();
        // A config-file service whose token may only read it: its sidecar's leaf is refused
        // by the servers (signing needs service:write).
        let weak = create_token(&client, &server.http, "weak-read", WEAK_READ).await;
        let services = dir.join("services.json");
        std::fs::write(
            &services,
            json!({"service": {"name": "weak", "id": "weak1", "port": 81, "token": weak,
                    "connect": {"sidecar_service": {"proxy": {"upstreams": [
                        {"destination_name": "api", "local_bind_port": 9191}]}}}}})
            .to_string(),
        )
        .unwrap();
        let agent = test_support::process::start_agent(
            meshd(),
            [
                "-dev",
                "-node",
                "acl-node",
                "-retry-join",
                server.http.trim_start_matches("http://"),
                "-log-level",
                "warn",
                "-acl-enabled",
                "-acl-default-policy",
                "deny",
                "-acl-agent-token-file",
                agent_file.to_str().unwrap(),
                "-config-file",
                services.to_str().unwrap(),
                // web's sidecar runs as a managed proxy, with a local token.
                "-managed-sidecars",
                // CI runs as root; the proxy is this test's own process.
                "-allow-managed-root",
                "-envoy-binary",
                test_support::envoy().to_str().unwrap(),
            ],
        );
        Cluster {
            _server: server_proc,
            _agent: Proc(agent.child),
            server: server.http,
            agent: agent.http,
            agent_grpc: agent.grpc,
            client,
        }
    }

    /// A token with exactly `rules`.
    async fn token(&self, rules: &str) -> String {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let name = format!("p{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        create_token(&self.client, &self.server, &name, rules).await
    }
}

/// A new token at `server` with one new policy `name` holding `rules`.
async fn create_token(client: &reqwest::Client, server: &str, name: &str, rules: &str) -> String {
    let (status, _, text) = call(
        client,
        "PUT",
        &format!("{server}/v1/acl/policy"),
        Some(MANAGEMENT),
        &json!({"Name": name, "Rules": rules}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let (status, _, text) = call(
        client,
        "PUT",
        &format!("{server}/v1/acl/token"),
        Some(MANAGEMENT),
        &json!({"Policies": [{"Name": name}]}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str::<Value>(&text).unwrap()["SecretID"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Without {
    Denied,
    Filtered,
    Open,
}

const WEB_WRITE: &str = "service \"web\" { policy = \"write\" }";
const WEB_READ: &str = "service \"web\" { policy = \"read\" }";
const NODE_READ: &str = "node \"acl-node\" { policy = \"read\" }";
const NODE_WRITE: &str = "node \"acl-node\" { policy = \"write\" }";
const AGENT_READ: &str = "agent \"acl-node\" { policy = \"read\" }";
const OPERATOR_READ: &str = "operator = \"read\"";
const WEAK_READ: &str = "service \"weak\" { policy = \"read\" }\nservice \"weak-sidecar-proxy\" { policy = \"read\" }";

/// The agent's own routes (the rest is forwarded to a server, whose table is in the
/// http-api tests). `GET /v1/agent/connect/proxy/{id}` is checked apart: it answers only for
/// a proxy the agent runs.
fn rows() -> Vec<(&'static str, &'static str, Value, &'static str, Without)> {
    use Without::*;
    let n = Value::Null;
    vec![
        ("GET", "/v1/agent/services", n.clone(), WEB_READ, Filtered),
        ("GET", "/v1/agent/service/web1", n.clone(), WEB_READ, Denied),
        ("GET", "/v1/agent/checks", n.clone(), WEB_READ, Filtered),
        ("GET", "/v1/agent/health/service/name/web", n.clone(), WEB_READ, Denied),
        ("GET", "/v1/agent/health/service/id/web1", n.clone(), WEB_READ, Denied),
        ("GET", "/v1/agent/self", n.clone(), AGENT_READ, Denied),
        ("GET", "/v1/agent/members", n.clone(), NODE_READ, Filtered),
        (
            "GET",
            "/v1/agent/metrics?format=prometheus",
            n.clone(),
            AGENT_READ,
            Denied,
        ),
        (
            "GET",
            "/v1/internal/proxy-status/web1-sidecar-proxy",
            n.clone(),
            OPERATOR_READ,
            Denied,
        ),
        ("GET", "/v1/agent/connect/ca/roots", n.clone(), "", Open),
        ("GET", "/v1/agent/connect/ca/leaf/web", n.clone(), WEB_WRITE, Denied),
        ("PUT", "/v1/agent/check/pass/web-ttl", n.clone(), WEB_WRITE, Denied),
        ("PUT", "/v1/agent/check/warn/web-ttl", n.clone(), WEB_WRITE, Denied),
        ("PUT", "/v1/agent/check/fail/web-ttl", n.clone(), WEB_WRITE, Denied),
        (
            "PUT",
            "/v1/agent/check/update/web-ttl",
            json!({"Status": "passing"}),
            WEB_WRITE,
            Denied,
        ),
        (
            "PUT",
            "/v1/agent/check/register",
            json!({"CheckID": "node-ttl", "Name": "node", "TTL": "1h"}),
            NODE_WRITE,
            Denied,
        ),
        (
            "PUT",
            "/v1/agent/check/register",
            json!({"CheckID": "web-ttl2", "Name": "web2", "TTL": "1h", "ServiceID": "web1"}),
            WEB_WRITE,
            Denied,
        ),
        (
            "PUT",
            "/v1/agent/service/maintenance/web1?enable=true",
            n.clone(),
            WEB_WRITE,
            Denied,
        ),
        (
            "PUT",
            "/v1/agent/maintenance?enable=false",
            n.clone(),
            NODE_WRITE,
            Denied,
        ),
        (
            "PUT",
            "/v1/agent/check/deregister/web-ttl",
            n.clone(),
            WEB_WRITE,
            Denied,
        ),
        (
            "PUT",
            "/v1/agent/service/register",
            json!({"Name": "web", "ID": "web2", "Port": 81}),
            WEB_WRITE,
            Denied,
        ),
        ("PUT", "/v1/agent/service/deregister/web1", n.clone(), WEB_WRITE, Denied),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_routes_sync_and_xds_enforce_acls() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    let web_token = c.token("service \"web\" { policy = \"write\" }\nservice \"web-sidecar-proxy\" { policy = \"write\" }\nservice_prefix \"\" { policy = \"read\" }\nnode_prefix \"\" { policy = \"read\" }").await;
    let wrong = c
        .token("service \"other\" { policy = \"write\" }\nnode \"other\" { policy = \"write\" }\nagent \"other\" { policy = \"write\" }")
        .await;

    // proxy-defaults' bootstrap keys reach the managed sidecar's bootstrap, though the
    // servers do not know its local token (the agent reads the entry for it).
    let (status, _, text) = call(
        &c.client,
        "PUT",
        &format!("{}/v1/config", c.server),
        Some(MANAGEMENT),
        &json!({"Kind": "proxy-defaults", "Name": "global", "Config": {"envoy_stats_flush_interval": "7s"}}),
    )
    .await;
    assert_eq!(status, 200, "{text}");

    // web registers with its own token: synced to the servers with that token (the agent's
    // node identity could not write web).
    let (status, _, text) = call(
        &c.client,
        "PUT",
        &format!("{}/v1/agent/service/register", c.agent),
        Some(&web_token),
        &json!({"Name": "web", "ID": "web1", "Port": 80,
                "Check": {"CheckID": "web-ttl", "Name": "web ttl", "TTL": "1h", "Status": "passing"},
                "Connect": {"SidecarService": {}}}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let catalog = format!("{}/v1/catalog/service/web", c.server);
    wait_for("web synced with its token", || async {
        let (_, _, text) = call(&c.client, "GET", &catalog, Some(MANAGEMENT), &Value::Null).await;
        (text.contains("\"ServiceID\":\"web1\"")).then_some(())
    })
    .await;

    // The agent's xDS: web's sidecar for web's token, nothing for another.
    let denied = ads_first(&c.agent_grpc, "web1-sidecar-proxy", &wrong).await;
    assert_eq!(denied.err(), Some(tonic::Code::PermissionDenied));
    let served = ads_first(&c.agent_grpc, "web1-sidecar-proxy", &web_token).await;
    assert!(served.is_ok(), "web's token is refused: {served:?}");

    // The managed sidecar connects with its local token (never the registration's) and is
    // served: its listener is sent.
    let metrics_token = c.token(AGENT_READ).await;
    let metrics = format!("{}/v1/agent/metrics?format=prometheus", c.agent);
    wait_for("the managed proxy served over the agent's xDS", || async {
        let (_, _, text) = call(&c.client, "GET", &metrics, Some(&metrics_token), &Value::Null).await;
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
                .unwrap_or(0.0)
        };
        (value("meshd_xds_responses_total{type=\"Listener\"}") >= 1.0).then_some(())
    })
    .await;
    let status_url = format!("{}/v1/agent/connect/proxy/web1-sidecar-proxy", c.agent);
    let (_, _, text) = call(&c.client, "GET", &status_url, Some(&web_token), &Value::Null).await;
    let view: Value = serde_json::from_str(&text).unwrap();
    let pid = view["Status"]["Pid"].as_u64().expect("the managed proxy's pid") as u32;
    let bootstrap = wait_for("the managed Envoy's bootstrap", || async { envoy_bootstrap_of(pid) }).await;
    assert_eq!(
        bootstrap["stats_flush_interval"], "7.000000000s",
        "proxy-defaults' envoy_stats_flush_interval"
    );

    // Every agent route: 403/403/2xx (or filtered, or open).
    for (method, path, body, rules, without) in rows() {
        let url = format!("{}{path}", c.agent);
        let what = format!("{method} {path}");
        for (who, token) in [("no token", None), ("a wrong token", Some(wrong.as_str()))] {
            let (status, filtered, text) = call(&c.client, method, &url, token, &body).await;
            match without {
                Without::Denied => {
                    assert_eq!(status, 403, "{what} with {who}: {text}");
                    assert!(text.starts_with("Permission denied"), "{what} with {who}: {text}");
                }
                Without::Filtered => {
                    assert_eq!(status, 200, "{what} with {who}: {text}");
                    assert!(filtered, "{what} with {who}: not marked filtered");
                    assert!(text == "{}" || text == "[]", "{what} with {who} leaked: {text}");
                }
                Without::Open => assert!((200..300).contains(&status), "{what} with {who}: {text}"),
            }
        }
        let right = if rules.is_empty() {
            wrong.clone()
        } else {
            c.token(rules).await
        };
        let (status, _, text) = call(&c.client, method, &url, Some(&right), &body).await;
        assert!(
            (200..300).contains(&status),
            "{what} with the right token: {status} {text}"
        );
        if without != Without::Open {
            let (status, _, text) = call(&c.client, method, &url, Some("not-a-token"), &body).await;
            assert_eq!(
                (status, text.trim()),
                (403, "ACL not found"),
                "{what} with an unknown token"
            );
        }
    }

    // Forwarded requests run with the caller's token at the server: a service the wrong
    // token may not read is left out (registered at the server directly, so the check does
    // not depend on what the routes above left in the agent's sync).
    let (status, _, text) = call(
        &c.client,
        "PUT",
        &format!("{}/v1/catalog/register", c.server),
        Some(MANAGEMENT),
        &json!({"Node": "hidden-node", "Address": "10.9.9.9", "Service": {"Service": "hidden", "Port": 1}}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let (status, filtered, text) = call(
        &c.client,
        "GET",
        &format!("{}/v1/catalog/services", c.agent),
        Some(&wrong),
        &Value::Null,
    )
    .await;
    assert_eq!((status, filtered, text.as_str()), (200, true, "{}"));

    // The servers refuse to sign weak's leaf for weak's read-only token: its sidecar's status
    // says permission denied, naming the service (not "unavailable").
    let operator = c.token(OPERATOR_READ).await;
    let status_url = format!("{}/v1/internal/proxy-status/weak1-sidecar-proxy", c.agent);
    let errors = wait_for("weak's sidecar shows the refused leaf", || async {
        let (status, _, text) = call(&c.client, "GET", &status_url, Some(&operator), &Value::Null).await;
        let body: Value = serde_json::from_str(&text).ok()?;
        let errors = body["Errors"].to_string();
        (status == 200 && errors.contains("leaf")).then_some(errors)
    })
    .await;
    assert!(
        errors.contains("permission denied") && errors.contains("lacks permission 'service:write' on \\\"weak\\\""),
        "{errors}"
    );
    assert!(!errors.contains("unavailable"), "{errors}");
}

/// The first answer of an ADS stream for `proxy` with `token`: `Ok` with a response, or the
/// status code that ended it.
async fn ads_first(grpc: &str, proxy: &str, token: &str) -> Result<(), tonic::Code> {
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(DiscoveryRequest {
        node: Some(Node {
            id: proxy.to_owned(),
            ..Default::default()
        }),
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    req.metadata_mut().insert("x-consul-token", token.parse().unwrap());
    let mut stream = match client.stream_aggregated_resources(req).await {
        Ok(s) => s.into_inner(),
        Err(status) => return Err(status.code()),
    };
    let first = tokio::time::timeout(std::time::Duration::from_secs(30), stream.message())
        .await
        .expect("an answer within 30 s");
    drop(tx);
    match first {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(tonic::Code::Ok),
        Err(status) => Err(status.code()),
    }
}

/// `meshd connect envoy -sidecar-for SERVICE -bootstrap` against the agent at `agent` with
/// `token` (`None`: neither `-token` nor `CONNECT_PROXY_TOKEN`): success, stdout, stderr.
fn connect_bootstrap(agent: &str, service: &str, token: Option<&str>) -> (bool, String, String) {
    let mut cmd = std::process::Command::new(meshd());
    cmd.args(["connect", "envoy", "-sidecar-for", service, "-bootstrap"])
        .args([
            "-admin-bind",
            "127.0.0.1:19000",
            "-http-addr",
            agent.trim_start_matches("http://"),
        ])
        .env_remove("CONNECT_PROXY_TOKEN");
    if let Some(token) = token {
        cmd.args(["-token", token]);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_envoy_says_when_its_token_cannot_see_the_sidecar() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    let web_token = c
        .token("service \"web\" { policy = \"write\" }\nservice \"web-sidecar-proxy\" { policy = \"write\" }")
        .await;
    let (status, _, text) = call(
        &c.client,
        "PUT",
        &format!("{}/v1/agent/service/register", c.agent),
        Some(&web_token),
        &json!({"Name": "web", "ID": "web1", "Port": 80, "Connect": {"SidecarService": {}}}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let failure = |(ok, _, stderr): (bool, String, String)| {
        assert!(!ok && stderr.lines().count() == 1, "{stderr}");
        assert!(!stderr.contains("node \"\""), "{stderr}");
        stderr
    };

    // No token: the agent hides web's sidecar from anonymous requests. It used to say that
    // no sidecar was registered (node "").
    let err = failure(connect_bootstrap(&c.agent, "web", None));
    let agent = c.agent.trim_start_matches("http://");
    assert_eq!(
        err.trim_end(),
        format!(
            "meshd: no token was given (-token-file, -token or CONNECT_PROXY_TOKEN), and without one the sidecar \
             proxy of service \"web\" cannot be seen (the agent at {agent} filtered its answer by ACLs): give a \
             token with service:read on it"
        )
    );
    // A token that may read other services only.
    let other = c.token("service \"other\" { policy = \"read\" }").await;
    let err = failure(connect_bootstrap(&c.agent, "web", Some(&other)));
    assert_eq!(
        err.trim_end(),
        format!(
            "meshd: the token cannot see the sidecar proxy of service \"web\" (the agent at {agent} filtered its \
             answer by ACLs): give one with service:read on it through -token-file, -token or CONNECT_PROXY_TOKEN"
        )
    );
    // A token the servers do not know: refused outright.
    let err = failure(connect_bootstrap(
        &c.agent,
        "web",
        Some("00000000-0000-4000-8000-000000000000"),
    ));
    assert!(
        err.contains(&format!(
            "the token cannot see the sidecar proxy of service \"web\" (the agent at {agent} refused it: "
        )) && err.contains("ACL not found"),
        "{err}"
    );
    // A token that may read every service, though not the agent (no node name): web's
    // sidecar is found; a service without one is simply not registered.
    let reader = c.token("service_prefix \"\" { policy = \"read\" }").await;
    let (ok, stdout, stderr) = connect_bootstrap(&c.agent, "web", Some(&reader));
    assert!(ok, "{stderr}");
    let bootstrap: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(bootstrap["node"]["id"], "web1-sidecar-proxy");
    let err = failure(connect_bootstrap(&c.agent, "db", Some(&reader)));
    assert_eq!(
        err.trim_end(),
        format!("meshd: no sidecar proxy for service \"db\" is registered with the agent at {agent}")
    );
}

/// The bootstrap of the Envoy that the `meshd connect envoy` process `pid` runs (its child,
/// started with `-c <file>`), once there is one.
fn envoy_bootstrap_of(pid: u32) -> Option<Value> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`: the parent is the second field after the name.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(pid) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{child}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if let Some(i) = args.iter().position(|a| a == "-c")
            && let Some(path) = args.get(i + 1)
            && let Ok(text) = std::fs::read_to_string(path)
        {
            return serde_json::from_str(&text).ok();
        }
    }
    None
}
