//! ACLs end to end with the real Envoy: a server with ACLs on and a default policy of deny;
//! proxies whose tokens hold `service:write` on their service get config and traffic flows
//! over mTLS; a proxy whose token does not receives no listener and no secret; deleting a
//! connected proxy's token ends its stream.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use std::path::Path;
use test_support::http::named_backend as backend;
use test_support::reserve_port as free_port;

use crate::mesh;
use mesh::{Proc, get, run_envoy, wait_for};

struct Secure {
    _server: Proc,
    http: String,
    grpc: String,
    management: String,
    client: reqwest::Client,
}

impl Secure {
    fn start(dir: &Path) -> Secure {
        let management = "8f8c8a2e-1c7e-4c55-9d0a-6a1b2c3d4e5f".to_owned();
        let file = dir.join("management.token");
        std::fs::write(&file, &management).unwrap();
        let test_support::process::ServerProcess { child, http, grpc, .. } = test_support::process::start_server(
            Path::new(env!("CARGO_BIN_EXE_meshd")),
            [
                "-dev",
                "-log-level",
                "warn",
                "-acl-enabled",
                "-acl-default-policy",
                "deny",
                "-acl-initial-management-token-file",
                file.to_str().unwrap(),
            ],
        );
        Secure {
            _server: Proc(child),
            http,
            grpc,
            management,
            client: reqwest::Client::new(),
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, token: &str, body: Value) -> (u16, String) {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.http))
            .header("X-Consul-Token", token);
        if !body.is_null() {
            req = req.json(&body);
        }
        let resp = req.send().await.unwrap();
        (resp.status().as_u16(), resp.text().await.unwrap())
    }

    async fn put(&self, path: &str, body: Value) -> Value {
        let (status, text) = self.call(reqwest::Method::PUT, path, &self.management, body).await;
        assert_eq!(status, 200, "{path}: {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    async fn register(&self, node: &str, service: &str, port: u16, proxy_port: u16, upstreams: Value) {
        self.put(
            "/v1/catalog/register",
            json!({"Node": node, "Address": "127.0.0.1", "Service": {"Service": service, "Port": port}}),
        )
        .await;
        let proxy = json!({"Kind": "connect-proxy", "ID": format!("{service}-sidecar-proxy"), "Service": format!("{service}-sidecar-proxy"),
            "Port": proxy_port, "Proxy": {"DestinationServiceName": service, "LocalServicePort": port, "Upstreams": upstreams}});
        self.put(
            "/v1/catalog/register",
            json!({"Node": node, "Address": "127.0.0.1", "Service": proxy}),
        )
        .await;
    }

    /// A token with the service identity of `service`: (accessor, secret).
    async fn identity(&self, service: &str) -> (String, String) {
        let t = self
            .put(
                "/v1/acl/token",
                json!({"ServiceIdentities": [{"ServiceName": service}]}),
            )
            .await;
        (
            t["AccessorID"].as_str().unwrap().to_owned(),
            t["SecretID"].as_str().unwrap().to_owned(),
        )
    }

    async fn metric(&self, name: &str) -> f64 {
        let (_, text) = self
            .call(
                reqwest::Method::GET,
                "/v1/agent/metrics?format=prometheus",
                &self.management,
                Value::Null,
            )
            .await;
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0)
    }

    /// Envoy for `service`'s sidecar with the token in a file (never on a command line).
    async fn envoy(&self, service: &str, node: &str, token: &str, dir: &Path) -> (Proc, String) {
        let token_file = dir.join(format!("{service}.token"));
        std::fs::write(&token_file, token).unwrap();
        let xds = ["-grpc-addr", &self.grpc, "-token-file", token_file.to_str().unwrap()];
        run_envoy(service, node, &self.http, &xds, &dir.join(format!("{service}-{node}"))).await
    }
}

/// Envoy's stat `name` (0 when absent).
async fn stat(client: &reqwest::Client, admin: &str, name: &str) -> Option<u64> {
    let text = get(client, &format!("{admin}/stats?filter=^{name}$")).await?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: "))?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_streams_need_service_write_and_end_when_the_token_goes() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = Secure::start(dir.path());
    let client = reqwest::Client::new();
    let (api_port, web_port, db_port) = (backend("api-1"), backend("web"), backend("db"));
    let (api_proxy, web_proxy, db_proxy, upstream) = (free_port(), free_port(), free_port(), free_port());
    mesh.register("node-api", "api", api_port, api_proxy, json!([])).await;
    mesh.register(
        "node-web",
        "web",
        web_port,
        web_proxy,
        json!([{"DestinationName": "api", "LocalBindPort": upstream}]),
    )
    .await;
    mesh.register("node-db", "db", db_port, db_proxy, json!([])).await;
    // Default deny: web reaches api only through an allow intention.
    mesh.put(
        "/v1/connect/intentions/exact?source=web&destination=api",
        json!({"Action": "allow"}),
    )
    .await;
    let (_, api_token) = mesh.identity("api").await;
    let (web_accessor, web_token) = mesh.identity("web").await;
    let (_, other_token) = mesh.identity("other").await;

    // db's proxy presents a token for another service: it gets nothing.
    let denied_before = mesh.metric("meshd_xds_streams_denied_total").await;
    let (_db_envoy, db_admin) = mesh.envoy("db", "node-db", &other_token, dir.path()).await;
    wait_for(|| async { (mesh.metric("meshd_xds_streams_denied_total").await > denied_before).then_some(()) }).await;

    let (_api_envoy, _api_admin) = mesh.envoy("api", "node-api", &api_token, dir.path()).await;
    let (_web_envoy, web_admin) = mesh.envoy("web", "node-web", &web_token, dir.path()).await;
    let through_mesh = format!("http://127.0.0.1:{upstream}/");
    let body = wait_for(|| get(&client, &through_mesh)).await;
    assert_eq!(body, "api-1", "traffic flows over mTLS with the right tokens");
    let certs = get(&client, &format!("{web_admin}/certs")).await.unwrap();
    assert!(certs.contains("/svc/web"), "web's leaf is loaded");

    // Default deny: without the allow intention the call is refused (api's RBAC denies it).
    let (status, text) = mesh
        .call(
            reqwest::Method::DELETE,
            "/v1/connect/intentions/exact?source=web&destination=api",
            &mesh.management,
            Value::Null,
        )
        .await;
    assert_eq!(status, 200, "{text}");
    wait_for(|| async { get(&client, &through_mesh).await.is_none().then_some(()) }).await;

    // Still nothing for db: no listener, no certificate.
    let dump = get(&client, &format!("{db_admin}/config_dump")).await.unwrap();
    assert!(!dump.contains("public_listener"), "db's proxy got a listener");
    let certs = get(&client, &format!("{db_admin}/certs")).await.unwrap();
    assert!(!certs.contains("/svc/db"), "db's proxy got a secret: {certs}");

    // Deleting web's token ends its stream: Envoy is no longer connected.
    assert_eq!(
        stat(&client, &web_admin, "control_plane.connected_state").await,
        Some(1)
    );
    // Counted before the deletion: Envoy's first reconnection comes at once, its later ones
    // after a back-off that grows towards 30 s.
    let denied = mesh.metric("meshd_xds_streams_denied_total").await;
    let (status, text) = mesh
        .call(
            reqwest::Method::DELETE,
            &format!("/v1/acl/token/{web_accessor}"),
            &mesh.management,
            Value::Null,
        )
        .await;
    assert_eq!(status, 200, "{text}");
    wait_for(|| async { (stat(&client, &web_admin, "control_plane.connected_state").await == Some(0)).then_some(()) })
        .await;
    // And its reconnections are refused.
    wait_for(|| async { (mesh.metric("meshd_xds_streams_denied_total").await > denied).then_some(()) }).await;

    // The proxy-status view needs operator:read.
    let (status, _) = mesh
        .call(
            reqwest::Method::GET,
            "/v1/internal/proxy-status/api-sidecar-proxy",
            &api_token,
            Value::Null,
        )
        .await;
    assert_eq!(status, 403);
    let (status, text) = mesh
        .call(
            reqwest::Method::GET,
            "/v1/internal/proxy-status/api-sidecar-proxy",
            &mesh.management,
            Value::Null,
        )
        .await;
    assert_eq!(status, 200, "{text}");
}
