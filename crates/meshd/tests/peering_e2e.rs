//! Cluster peering between two independent clusters (each its own `meshd server`, CA and
//! agent, both calling their datacenter `dc1`): cluster A exports `api` to B through A's
//! mesh gateway; `web` in B (its sidecar configured by B's agent) calls it with an upstream
//! naming the peer, over mTLS verified against A's roots (real Envoys). Intentions in A
//! decide by the caller's cluster: one naming B's `web` lets it in, one for A's own `web`
//! does not. Deleting the peering in A terminates it in B, whose imports go: web's requests
//! fail closed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use crate::mesh::{Mesh, Proc, wait_for};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use test_support::process::{start_agent, start_server};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_meshd"))
}

/// A cluster: a server, and an agent joined to it, ACLs on in both (default deny). The
/// meshes' clients carry the cluster's management token; each proxy runs with its own.
struct Cluster {
    server: Mesh,
    agent: Mesh,
    /// A token with `peering = "write"` only, for the CLI.
    peering: std::path::PathBuf,
}

/// A client sending `token` with every request.
fn client_with(token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("X-Consul-Token", token.parse().unwrap());
    reqwest::Client::builder().default_headers(headers).build().unwrap()
}

const ACL: [&str; 4] = ["-acl-enabled", "-acl-default-policy", "deny", "-log-level"];

async fn cluster(name: &str, dir: &Path) -> Cluster {
    let management = format!("{name}{}", &"0f3c9a6e-5b1d-4e7a-9c2f-8d4b6a1e3c5f"[name.len()..]);
    let file = dir.join(format!("management-{name}"));
    std::fs::write(&file, &management).unwrap();
    let mut server = Mesh::of(start_server(
        bin(),
        ACL.into_iter().chain([
            "warn",
            "-dev",
            "-grpc-tls-addr",
            "127.0.0.1:0",
            "-node",
            &format!("server-{name}"),
            "-acl-initial-management-token-file",
            file.to_str().unwrap(),
        ]),
    ));
    server.client = client_with(&management);
    let node = format!("agent-{name}");
    let agent_token = token_file(
        &server,
        dir,
        &node,
        json!({"NodeIdentities": [{"NodeName": node, "Datacenter": "dc1"}]}),
    )
    .await;
    let mut agent = Mesh::of(start_agent(
        bin(),
        ACL.into_iter().chain([
            "warn",
            "-dev",
            "-node",
            &node,
            "-advertise",
            "127.0.0.1",
            "-retry-join",
            server.http.trim_start_matches("http://"),
            "-acl-agent-token-file",
            agent_token.to_str().unwrap(),
        ]),
    ));
    agent.client = client_with(&management);
    let peering = rules_file(&server, dir, &format!("peering-{name}"), r#"peering = "write""#).await;
    Cluster { server, agent, peering }
}

/// A new token of `mesh` (the body of `PUT /v1/acl/token`), written to a file in `dir`.
async fn token_file(mesh: &Mesh, dir: &Path, name: &str, body: Value) -> std::path::PathBuf {
    let (status, text) = call(
        &mesh.client,
        reqwest::Method::PUT,
        &format!("{}/v1/acl/token", mesh.http),
        Some(body),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let secret = serde_json::from_str::<Value>(&text).unwrap()["SecretID"]
        .as_str()
        .unwrap()
        .to_owned();
    let file = dir.join(format!("{name}.token"));
    std::fs::write(&file, secret).unwrap();
    file
}

/// A token of `mesh` holding exactly `rules` (a policy of its own), in a file in `dir`.
async fn rules_file(mesh: &Mesh, dir: &Path, name: &str, rules: &str) -> std::path::PathBuf {
    let (status, text) = call(
        &mesh.client,
        reqwest::Method::PUT,
        &format!("{}/v1/acl/policy", mesh.http),
        Some(json!({"Name": name, "Rules": rules})),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    token_file(mesh, dir, name, json!({"Policies": [{"Name": name}]})).await
}

/// A sidecar's token: the service identity of `service`.
async fn identity(mesh: &Mesh, dir: &Path, service: &str) -> std::path::PathBuf {
    let name = format!("{service}-{}", mesh.http.rsplit(':').next().unwrap());
    token_file(
        mesh,
        dir,
        &name,
        json!({"ServiceIdentities": [{"ServiceName": service}]}),
    )
    .await
}

/// A mesh gateway's token, as Consul documents it for peering.
const GATEWAY_RULES: &str = r#"
service "mesh-gateway" { policy = "write" }
service_prefix "" { policy = "read" }
node_prefix "" { policy = "read" }
agent_prefix "" { policy = "read" }
mesh = "read"
peering = "read"
"#;

/// Runs a sidecar's Envoy (its service registered on `node` in `mesh`'s catalog) with the
/// service's identity.
async fn sidecar(mesh: &Mesh, service: &str, node: &str, dir: &Path) -> Proc {
    let token = identity(mesh, dir, service).await;
    let xds = ["-grpc-addr", &mesh.grpc, "-token-file", token.to_str().unwrap()];
    let run_dir = dir.join(format!("{service}-{node}"));
    crate::mesh::run_envoy(service, node, &mesh.http, &xds, &run_dir)
        .await
        .0
}

/// A mesh gateway registered through the cluster's agent, with its own token; its Envoy
/// and admin URL.
async fn mesh_gateway(cluster: &Cluster, dir: &Path, address: &str) -> (Proc, String) {
    let agent = &cluster.agent;
    let name = format!("gateway-{}", agent.http.rsplit(':').next().unwrap());
    let token = rules_file(&cluster.server, dir, &name, GATEWAY_RULES).await;
    crate::mesh::run_proxy(
        &["-gateway", "mesh", "-register", "-address", address],
        &agent.http,
        &["-grpc-addr", &agent.grpc, "-token-file", token.to_str().unwrap()],
        &dir.join(name),
    )
    .await
}

async fn call(client: &reqwest::Client, method: reqwest::Method, url: &str, body: Option<Value>) -> (u16, String) {
    let mut req = client.request(method, url);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// `meshd peering ...` against the cluster's API, with its peering token; its stdout, or
/// the failure's one line.
fn cli(cluster: &Cluster, args: &[&str]) -> Result<String, String> {
    cli_as(&cluster.server.http, &cluster.peering, args)
}

/// `meshd peering ...` against the API at `http` with the token in `token`.
fn cli_as(http: &str, token: &Path, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(bin())
        .arg("peering")
        .args(args)
        .args(["-http-addr", http.trim_start_matches("http://")])
        .arg("-token-file")
        .arg(token)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8(out.stderr).unwrap())
    }
}

/// A's token for `cluster-b` (`meshd peering generate-token`, to a file), established in B
/// as `cluster-a` (`meshd peering establish`, from the file).
async fn peer(a: &Cluster, b: &Cluster, dir: &Path) {
    let file = dir.join("token");
    let file = file.to_str().unwrap();
    let said = cli(
        a,
        &[
            "generate-token",
            "-name",
            "cluster-b",
            "-meta",
            "team=payments",
            "-out",
            file,
        ],
    )
    .unwrap();
    assert!(said.starts_with("Wrote the peering token"), "{said}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(file).unwrap().permissions().mode() & 0o777, 0o600);
    let said = cli(b, &["establish", "-name", "cluster-a", "-peering-token-file", file]).unwrap();
    assert_eq!(said, "Successfully established peering connection with cluster-a\n");
    // The secret is spent: a second establish with the token is refused, naming it.
    let err = cli(b, &["establish", "-name", "cluster-a2", "-peering-token-file", file]).unwrap_err();
    assert!(err.starts_with("meshd: PeeringToken:"), "{err}");
    let token = std::fs::read_to_string(file).unwrap();
    let (status, body) = call(
        &b.server.client,
        reqwest::Method::POST,
        &format!("{}/v1/peering/establish", b.server.http),
        Some(json!({"PeerName": "cluster-a2", "PeeringToken": token})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    // A token without `peering` may not generate one.
    let weak = rules_file(&a.server, dir, "weak", r#"service_prefix "" { policy = "read" }"#).await;
    let err = cli_as(&a.server.http, &weak, &["generate-token", "-name", "cluster-c"]).unwrap_err();
    assert!(err.contains("Permission denied"), "{err}");
}

async fn state_of(mesh: &Mesh, name: &str) -> Option<String> {
    let body = crate::mesh::get(&mesh.client, &format!("{}/v1/peering/{name}", mesh.http)).await?;
    let peering: Value = serde_json::from_str(&body).ok()?;
    peering["State"].as_str().map(str::to_owned)
}

/// web in B, on B's agent, its upstreams `api` of the peer `cluster-a`, B's own `api` and
/// `api-remote`; returns its Envoy, its admin URL and the upstreams' local ports.
async fn web_in_b(b: &Cluster, dir: &Path) -> (Proc, String, [u16; 3]) {
    let binds = [(); 3].map(|()| test_support::reserve_port());
    b.agent
        .put("/v1/agent/service/register", web_registration(binds, "remote"))
        .await;
    let token = identity(&b.server, dir, "web").await;
    let (proc, admin) = crate::mesh::run_proxy(
        &["-sidecar-for", "web"],
        &b.agent.http,
        &["-grpc-addr", &b.agent.grpc, "-token-file", token.to_str().unwrap()],
        &dir.join("web-b"),
    )
    .await;
    (proc, admin, binds)
}

/// web's registration: its upstreams on `binds`, through mesh gateway mode `mode` (the
/// proxy's: every upstream reaching the peer, directly or by failover and redirect, goes the
/// same way; they share the peer's cluster).
fn web_registration(binds: [u16; 3], mode: &str) -> Value {
    json!({"Name": "web", "ID": "web", "Port": 9, "Connect": {"SidecarService": {
        "Port": WEB_SIDECAR.get_or_init(test_support::reserve_port),
        "Proxy": {"MeshGateway": {"Mode": mode}, "Upstreams": [
            {"DestinationName": "api", "DestinationPeer": "cluster-a", "LocalBindPort": binds[0]},
            {"DestinationName": "api", "LocalBindPort": binds[1]},
            {"DestinationName": "api-remote", "LocalBindPort": binds[2]}]}}}})
}

/// The port of web's sidecar (the same in every registration of it).
static WEB_SIDECAR: std::sync::OnceLock<u16> = std::sync::OnceLock::new();

/// Mesh gateway mode `local` for web's upstream of the peer's `api`: its connections go
/// to B's own gateway, which sends them (by their SNI) to A's; the requests still work.
async fn through_the_local_gateway(b: &Cluster, web_admin: &str, gateway_b: (&str, &str), bind: u16, binds: [u16; 3]) {
    let (address, admin) = gateway_b;
    b.agent
        .put("/v1/agent/service/register", web_registration(binds, "local"))
        .await;
    let client = &b.server.client;
    wait_for(|| async {
        let clusters = crate::mesh::get(client, &format!("{web_admin}/clusters")).await?;
        clusters
            .lines()
            .any(|l| l.contains(".external.") && l.contains(&format!("::{address}::")))
            .then_some(())
    })
    .await;
    let plain = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let url = format!("http://127.0.0.1:{bind}/local");
    let ok = wait_for(|| async {
        let resp = plain.get(&url).timeout(Duration::from_secs(5)).send().await.ok()?;
        (resp.status() == 200).then_some(resp.text().await.ok()?)
    })
    .await;
    assert_eq!(ok, "api /local x-from=");
    let stats = crate::mesh::get(client, &format!("{admin}/stats?filter=external.*upstream_cx_total"))
        .await
        .unwrap();
    assert!(
        stats.lines().any(|l| l.split(": ").nth(1).is_some_and(|n| n != "0")),
        "B's gateway carried web's connection:\n{stats}"
    );
}

/// api in B too, with a resolver there failing it over to the peer A: web's requests to its
/// own api move to A's within 5 s of B's instance turning critical, and back. Returns the
/// Envoy of B's api.
async fn failover_to_the_peer(b: &Cluster, dir: &Path, local_bind: u16) -> Proc {
    let port = crate::gateway_e2e::backend("api-b");
    b.server
        .register(
            "node-api-b",
            "api",
            port,
            test_support::reserve_port(),
            json!([]),
            json!({}),
        )
        .await;
    let check = |status: &str| {
        json!({"Node": "node-api-b", "Address": "127.0.0.1", "SkipNodeUpdate": true,
            "Check": {"CheckID": "api-alive", "Name": "alive", "ServiceID": "api-sidecar-proxy", "Status": status}})
    };
    b.server.put("/v1/catalog/register", check("passing")).await;
    b.server
        .put(
            "/v1/config",
            json!({"Kind": "service-defaults", "Name": "api", "Protocol": "http"}),
        )
        .await;
    // ACLs deny by default: so do intentions.
    b.server
        .put(
            "/v1/config",
            json!({"Kind": "service-intentions", "Name": "api", "Sources": [{"Name": "web", "Action": "allow"}]}),
        )
        .await;
    b.server
        .put(
            "/v1/config",
            json!({"Kind": "service-resolver", "Name": "api",
                "Failover": {"*": {"Targets": [{"Peer": "cluster-a"}]}}}),
        )
        .await;
    let api_b = sidecar(&b.server, "api", "node-api-b", dir).await;
    let plain = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let from = || {
        let (plain, url) = (plain.clone(), format!("http://127.0.0.1:{local_bind}/failover"));
        async move {
            let body = plain
                .get(&url)
                .timeout(Duration::from_secs(5))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            body.split_whitespace().next().map(str::to_owned)
        }
    };
    wait_for(|| async { from().await.filter(|b| b == "api-b") }).await;
    b.server.put("/v1/catalog/register", check("critical")).await;
    let moved = Instant::now();
    wait_for(|| async { from().await.filter(|b| b == "api") }).await;
    let took = moved.elapsed();
    println!("        failed over to the peer in {took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    for _ in 0..5 {
        assert_eq!(
            from().await.as_deref(),
            Some("api"),
            "every request goes to the peer now"
        );
    }
    b.server.put("/v1/catalog/register", check("passing")).await;
    wait_for(|| async { from().await.filter(|b| b == "api-b") }).await;
    api_b
}

/// With `PeerThroughMeshGateways` in both clusters: A's token names A's gateway (not its
/// server), and the stream runs B's server → B's gateway → A's gateway → A's server, each
/// gateway routing A's server name (`server.dc1.peering.<A's trust domain>`) to its cluster.
async fn through_the_gateways(a: &Cluster, dir: &Path, gateway_a: &str, admins: [&str; 2]) {
    use base64::Engine as _;
    let token = std::fs::read_to_string(dir.join("token")).unwrap();
    let token: Value =
        serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(token.trim()).unwrap()).unwrap();
    assert_eq!(token["ServerAddresses"], json!([gateway_a]), "{token}");
    let server_name = token["ServerName"].as_str().unwrap().to_owned();
    assert!(!token["CA"].as_array().unwrap().is_empty(), "{token}");
    xds_not_served_for_the_peering_name(gateway_a, &server_name, &token["CA"]).await;
    for admin in admins {
        wait_for(|| async {
            let stats = crate::mesh::get(&a.server.client, &format!("{admin}/stats?filter=upstream_cx_total")).await?;
            let line = format!("cluster.{server_name}.upstream_cx_total: ");
            let total: u64 = stats.lines().find_map(|l| l.strip_prefix(&line))?.parse().ok()?;
            (total > 0).then_some(())
        })
        .await;
    }
}

/// What a peer's server reaches with the peering name (here through A's gateway, as a peer
/// does) is the peering service alone: an ADS stream there is `Unimplemented`, whatever
/// the ACLs (xDS is for this cluster's proxies, on its own names).
async fn xds_not_served_for_the_peering_name(address: &str, server_name: &str, ca: &Value) {
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
    use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
    let roots = ca
        .as_array()
        .unwrap()
        .iter()
        .map(|pem| tonic::transport::Certificate::from_pem(pem.as_str().unwrap()));
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificates(roots)
        .domain_name(server_name);
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{address}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("the peering name's TLS verifies with the token's CA");
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let request = DiscoveryRequest {
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
        ..Default::default()
    };
    let answer = match client.stream_aggregated_resources(tokio_stream::iter([request])).await {
        Ok(stream) => stream.into_inner().message().await.err(),
        Err(status) => Some(status),
    };
    assert_eq!(answer.map(|s| s.code()), Some(tonic::Code::Unimplemented));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_calls_an_exported_service_through_the_exporters_gateway() {
    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (cluster("a", dir.path()).await, cluster("b", dir.path()).await);

    // A: api with its sidecar (on A's server), A's mesh gateway (through A's agent).
    let api_port = crate::gateway_e2e::backend("api");
    let api_sidecar = test_support::reserve_port();
    a.server
        .register("node-api", "api", api_port, api_sidecar, json!([]), json!({}))
        .await;
    a.server
        .put(
            "/v1/config",
            json!({"Kind": "service-defaults", "Name": "api", "Protocol": "http"}),
        )
        .await;
    let api = sidecar(&a.server, "api", "node-api", dir.path()).await;
    let gateway_port = test_support::reserve_port();
    let gateway_address = format!("127.0.0.1:{gateway_port}");
    let (gateway, gateway_admin) = mesh_gateway(&a, dir.path(), &gateway_address).await;
    // B's own mesh gateway (its side of the mesh; web's connections go to A's).
    let other = format!("127.0.0.1:{}", test_support::reserve_port());
    let (gateway_b, gateway_b_admin) = mesh_gateway(&b, dir.path(), &other).await;
    a.server
        .put(
            "/v1/config",
            json!({"Kind": "exported-services", "Name": "default",
                "Services": [{"Name": "api", "Consumers": [{"Peer": "cluster-b"}]}]}),
        )
        .await;
    let allow_peer_web = json!({"Kind": "service-intentions", "Name": "api", "Sources": [
        {"Name": "web", "Peer": "cluster-b", "Action": "allow"},
        {"Name": "*", "Peer": "cluster-b", "Action": "deny"}]});
    a.server.put("/v1/config", allow_peer_web).await;
    // The peering calls cross both clusters' mesh gateways.
    let through = json!({"Kind": "mesh", "Peering": {"PeerThroughMeshGateways": true}});
    for cluster in [&a, &b] {
        cluster.server.put("/v1/config", through.clone()).await;
    }
    peer(&a, &b, dir.path()).await;
    wait_for(|| async {
        let a_side = state_of(&a.server, "cluster-b").await?;
        let b_side = state_of(&b.server, "cluster-a").await?;
        (a_side == "ACTIVE" && b_side == "ACTIVE").then_some(())
    })
    .await;
    println!("{:>5.1} s peered", t0.elapsed().as_secs_f64());
    through_the_gateways(&a, dir.path(), &gateway_address, [&gateway_admin, &gateway_b_admin]).await;
    let listed = cli(&b, &["list"]).unwrap();
    assert!(
        listed
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("cluster-a") && l.contains("ACTIVE")),
        "{listed}"
    );
    let read = cli(&a, &["read", "-name", "cluster-b"]).unwrap();
    assert!(
        read.contains("State: ACTIVE") && read.contains("Meta team: payments"),
        "{read}"
    );
    // B sees api as A exports it.
    let health = wait_for(|| async {
        let body = crate::mesh::get(
            &b.server.client,
            &format!("{}/v1/health/service/api?peer=cluster-a", b.server.http),
        )
        .await?;
        let v: Value = serde_json::from_str(&body).ok()?;
        (v.as_array()?.len() == 1).then_some(v)
    })
    .await;
    assert_eq!(health[0]["Service"]["PeerName"], "cluster-a", "{health}");
    assert_eq!(health[0]["Service"]["Port"], api_port, "{health}");

    // web in B calls api in A: through A's gateway, verified as A's api.
    let (web, web_admin, [bind, local_bind, remote_bind]) = web_in_b(&b, dir.path()).await;
    let plain = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let at = |port: u16, path: &'static str| {
        let (plain, url) = (plain.clone(), format!("http://127.0.0.1:{port}{path}"));
        async move {
            let resp = plain.get(&url).timeout(Duration::from_secs(5)).send().await.ok()?;
            Some((resp.status().as_u16(), resp.text().await.ok()?))
        }
    };
    let through = |path: &'static str| at(bind, path);
    let body = wait_for(|| async { through("/hello").await.filter(|(s, _)| *s == 200) }).await;
    assert_eq!(body.1, "api /hello x-from=");
    println!("{:>5.1} s web in B reached api in A", t0.elapsed().as_secs_f64());
    // A resolver in B redirecting api-remote to A's api: web's api-remote reaches A.
    b.server
        .put(
            "/v1/config",
            json!({"Kind": "service-resolver", "Name": "api-remote",
                "Redirect": {"Service": "api", "Peer": "cluster-a"}}),
        )
        .await;
    let body = wait_for(|| async { at(remote_bind, "/redirected").await.filter(|(s, _)| *s == 200) }).await;
    assert_eq!(body.1, "api /redirected x-from=");
    let roots = crate::mesh::get(&a.server.client, &format!("{}/v1/connect/ca/roots", a.server.http))
        .await
        .unwrap();
    let roots: Value = serde_json::from_str(&roots).unwrap();
    let cluster = format!(
        "api.default.default.cluster-b.external.{}",
        roots["TrustDomain"].as_str().unwrap()
    );
    let clusters = crate::mesh::get(&b.server.client, &format!("{web_admin}/clusters"))
        .await
        .unwrap();
    assert!(
        clusters
            .lines()
            .any(|l| l.starts_with(&format!("{cluster}::127.0.0.1:{gateway_port}::"))),
        "web's cluster for api is A's gateway:\n{clusters}"
    );
    let stats = crate::mesh::get(
        &a.server.client,
        &format!("{gateway_admin}/stats?filter=mesh_gateway_local"),
    )
    .await
    .unwrap();
    assert!(!stats.contains("downstream_cx_total: 0"), "{stats}");

    let api_b = failover_to_the_peer(&b, dir.path(), local_bind).await;
    println!("{:>5.1} s failover to the peer and back", t0.elapsed().as_secs_f64());
    let binds = [bind, local_bind, remote_bind];
    through_the_local_gateway(&b, &web_admin, (&other, &gateway_b_admin), bind, binds).await;
    println!("{:>5.1} s mesh gateway mode local", t0.elapsed().as_secs_f64());

    // Only B's web is let in: an intention for A's own web is not one for B's (checked on
    // new connections: those open keep the rules they were accepted under, as Envoy does).
    a.server
        .put(
            "/v1/config",
            json!({"Kind": "service-intentions", "Name": "api", "Sources": [
                {"Name": "web", "Action": "allow"},
                {"Name": "*", "Peer": "cluster-b", "Action": "deny"}]}),
        )
        .await;
    let denied = wait_for(|| async { through("/denied").await.filter(|(s, _)| *s == 403) }).await;
    assert_eq!(denied.0, 403);
    println!("{:>5.1} s intentions by peer", t0.elapsed().as_secs_f64());

    // A deletes the peering: B is told, its import goes, web's requests fail closed.
    let deleted_at = Instant::now();
    let said = cli(&a, &["delete", "-name", "cluster-b"]).unwrap();
    assert_eq!(
        said,
        "Successfully submitted peering connection, cluster-b, for deletion\n"
    );
    wait_for(|| async {
        match through("/after-delete").await {
            Some((200, _)) => None,
            _ => Some(()),
        }
    })
    .await;
    let closed = deleted_at.elapsed();
    println!("        requests failing {closed:?} after the delete");
    assert!(closed < Duration::from_secs(5), "{closed:?}");
    wait_for(|| async { (state_of(&b.server, "cluster-a").await? == "TERMINATED").then_some(()) }).await;
    // web's status says why its upstream has no listener.
    wait_for(|| async {
        let status = crate::mesh::get(&b.agent.client, &format!("{}/v1/internal/xds-status", b.agent.http)).await?;
        status
            .contains("does not export \\\"api\\\" to this cluster")
            .then_some(())
    })
    .await;
    wait_for(|| async { state_of(&a.server, "cluster-b").await.is_none().then_some(()) }).await;
    let (status, body) = call(
        &b.server.client,
        reqwest::Method::GET,
        &format!("{}/v1/health/service/api?peer=cluster-a", b.server.http),
        None,
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "[]"));
    println!("{:>5.1} s deleted", t0.elapsed().as_secs_f64());
    crate::mesh::stop_together(vec![web, api, api_b, gateway, gateway_b]);
}

/// Which of `servers` holds the stream of the peering `name` (has heard from the peer).
async fn holder(client: &reqwest::Client, servers: &[crate::ha::Server], name: &str) -> Option<usize> {
    for (i, server) in servers.iter().enumerate() {
        let Some(body) = crate::mesh::get(client, &format!("{}/v1/peering/{name}", server.http())).await else {
            continue;
        };
        let peering: Value = serde_json::from_str(&body).ok()?;
        if peering["StreamStatus"]["LastReceive"].is_string() {
            return Some(i);
        }
    }
    None
}

/// A mesh gateway instance of A at `port` (registered in the catalog: B's Envoy sees it as
/// an endpoint of the exported service, the instance itself is never dialed here).
fn gateway_at(node: &str, port: u16) -> Value {
    json!({"Node": node, "Address": "127.0.0.1", "Service": {"Kind": "mesh-gateway",
        "Service": "mesh-gateway", "ID": format!("gateway-{node}"), "Port": port}})
}

/// Cluster A is three servers sharing etcd; B dials one of them. That server is killed: B's
/// stream moves to another of A's servers, and what A changes next still reaches B's Envoy
/// (an endpoint of the exported service, within 2 s of the kill).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_moves_to_another_server_when_its_holder_dies() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = crate::ha::cluster(1).await;
    let mut a = crate::ha::servers_with(&etcd, 3, &["-grpc-tls-addr", "127.0.0.1:0"]).await;
    let b = Mesh::of(start_server(bin(), ["-dev", "-node", "server-b", "-log-level", "warn"]));
    let client = reqwest::Client::new();
    let a0 = a[0].http();
    wait_for(|| async {
        crate::mesh::get(&client, &format!("{a0}/v1/status/leader"))
            .await
            .filter(|l| l.len() > 2)
    })
    .await;
    let put = |server: String, path: &'static str, body: Value| {
        let client = client.clone();
        async move {
            let resp = client.put(format!("{server}{path}")).json(&body).send().await.unwrap();
            assert!(resp.status().is_success(), "{path}: {}", resp.text().await.unwrap());
        }
    };
    let gateway = test_support::reserve_port();
    put(a0.clone(), "/v1/catalog/register", gateway_at("gateway-1", gateway)).await;
    put(
        a0.clone(),
        "/v1/catalog/register",
        json!({"Node": "node-api", "Address": "127.0.0.1", "Service": {"Service": "api", "Port": 8080}}),
    )
    .await;
    put(
        a0.clone(),
        "/v1/config",
        json!({"Kind": "exported-services", "Name": "default",
            "Services": [{"Name": "api", "Consumers": [{"Peer": "cluster-b"}]}]}),
    )
    .await;
    let (status, body) = call(
        &client,
        reqwest::Method::POST,
        &format!("{a0}/v1/peering/token"),
        Some(json!({"PeerName": "cluster-b"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let token = serde_json::from_str::<Value>(&body).unwrap()["PeeringToken"].clone();
    let (status, body) = call(
        &client,
        reqwest::Method::POST,
        &format!("{}/v1/peering/establish", b.http),
        Some(json!({"PeerName": "cluster-a", "PeeringToken": token})),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // web in B, its upstream api of the peer A: one endpoint, A's gateway.
    let bind = test_support::reserve_port();
    b.register(
        "node-web",
        "web",
        9,
        test_support::reserve_port(),
        json!([{"DestinationName": "api", "DestinationPeer": "cluster-a", "LocalBindPort": bind}]),
        json!({}),
    )
    .await;
    let (web, web_admin) = b.envoy("web", "node-web", dir.path()).await;
    let roots = crate::mesh::get(&client, &format!("{a0}/v1/connect/ca/roots"))
        .await
        .unwrap();
    let trust_domain = serde_json::from_str::<Value>(&roots).unwrap()["TrustDomain"]
        .as_str()
        .unwrap()
        .to_owned();
    let cluster = format!("api.default.default.cluster-b.external.{trust_domain}");
    let endpoint_of = |port: u16| {
        let (client, url, line) = (
            client.clone(),
            format!("{web_admin}/clusters"),
            format!("{cluster}::127.0.0.1:{port}::cx_active"),
        );
        async move {
            let clusters = crate::mesh::get(&client, &url).await?;
            clusters.lines().any(|l| l.starts_with(&line)).then_some(())
        }
    };
    wait_for(|| endpoint_of(gateway)).await;

    let held = wait_for(|| holder(&client, &a, "cluster-b")).await;
    a[held].kill();
    let killed = Instant::now();
    let survivor = a[(held + 1) % 3].http();
    let second = test_support::reserve_port();
    put(
        survivor.clone(),
        "/v1/catalog/register",
        gateway_at("gateway-2", second),
    )
    .await;
    wait_for(|| endpoint_of(second)).await;
    let took = killed.elapsed();
    println!("        a new endpoint in A reached B's Envoy {took:?} after the stream's server died");
    assert!(took <= Duration::from_secs(2), "{took:?}");
    let now = wait_for(|| holder(&client, &a, "cluster-b")).await;
    assert_ne!(now, held);
    // B's imports follow A's catalog through the new holder.
    put(
        survivor,
        "/v1/catalog/register",
        json!({"Node": "node-api-2", "Address": "127.0.0.1", "Service": {"Service": "api", "Port": 8081}}),
    )
    .await;
    wait_for(|| async {
        let body = crate::mesh::get(&client, &format!("{}/v1/health/service/api?peer=cluster-a", b.http)).await?;
        (serde_json::from_str::<Value>(&body).ok()?.as_array()?.len() == 2).then_some(())
    })
    .await;
    assert_eq!(state_of(&b, "cluster-a").await.as_deref(), Some("ACTIVE"));
    crate::mesh::stop_together(vec![web]);
}
