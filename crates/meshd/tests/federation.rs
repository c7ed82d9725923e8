//! Two datacenters, each a real `meshd server`: dc2 joins dc1 (the primary) with
//! `-retry-join-wan`; both list both datacenters and their federation states; a request
//! naming the other datacenter (`?dc=`), a blocking one and a write included, is served by a
//! server there with the caller's token; an unknown datacenter is Consul's 500; dc2's CA
//! follows dc1's (one trust domain, a rotation included); a connection from dc1 reaches
//! api in dc2 through both datacenters' mesh gateways (real Envoys); dc2 copies dc1's
//! config entries, intentions and ACLs, and sends its writes of them to dc1; dc2 (over
//! etcd) survives a kill -9; a primary that restarts (its states are soft) hears from dc2
//! again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::mesh::{Mesh, wait_for};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;
use test_support::process::{start_server, start_server_at};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_meshd"))
}

/// `host:port` of an API at `http://host:port`.
fn host_port(http: &str) -> &str {
    http.trim_start_matches("http://")
}

async fn get(client: &reqwest::Client, url: &str) -> (u16, Option<u64>, Value) {
    let resp = client.get(url).send().await.unwrap();
    let status = resp.status().as_u16();
    let index = resp
        .headers()
        .get("x-consul-index")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let text = resp.text().await.unwrap();
    (
        status,
        index,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn put(client: &reqwest::Client, url: &str, body: Value) -> (u16, String) {
    let resp = client.put(url).json(&body).send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// Waits until `server` lists exactly `want` as its datacenters.
async fn until_datacenters(client: &reqwest::Client, server: &str, want: &[&str]) {
    let want = json!(want);
    wait_for(|| async {
        let (_, _, dcs) = get(client, &format!("{server}/v1/catalog/datacenters")).await;
        (dcs == want).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_datacenters_know_each_other_and_forward_requests() {
    let t0 = std::time::Instant::now();
    let client = reqwest::Client::new();
    let (http1, grpc1) = (
        format!("127.0.0.1:{}", test_support::reserve_port()),
        format!("127.0.0.1:{}", test_support::reserve_port()),
    );
    let dc1_args = [
        "-dev",
        "-datacenter",
        "dc1",
        "-node",
        "server-dc1",
        "-log-level",
        "warn",
    ];
    let dc1 = Mesh::of(start_server_at(bin(), &http1, &grpc1, dc1_args));
    // An agent in dc1: dc1's mesh gateway and a second web run through it.
    let agent1 = Mesh::of(test_support::process::start_agent(
        bin(),
        [
            "-dev",
            "-datacenter",
            "dc1",
            "-node",
            "agent-dc1",
            "-advertise",
            "127.0.0.1",
            "-retry-join",
            &http1,
            "-log-level",
            "warn",
        ],
    ));
    // dc2 keeps its catalog in etcd (dc1 in memory): it comes back whole after a kill -9.
    let etcd = test_support::etcd::EtcdCluster::start(1);
    let (http2, grpc2) = (
        format!("127.0.0.1:{}", test_support::reserve_port()),
        format!("127.0.0.1:{}", test_support::reserve_port()),
    );
    let endpoints = etcd.endpoints_arg();
    let dc2_args = [
        "-store",
        "etcd",
        "-etcd-endpoints",
        &endpoints,
        "-datacenter",
        "dc2",
        "-primary-datacenter",
        "dc1",
        "-retry-join-wan",
        &http1,
        "-node",
        "server-dc2",
        "-log-level",
        "warn",
    ];
    let start_dc2 = || Mesh::of(start_server_at(bin(), &http2, &grpc2, dc2_args));
    let mut dc2 = start_dc2();
    // An agent in dc2: dc2's mesh gateway runs through it.
    let agent2 = Mesh::of(test_support::process::start_agent(
        bin(),
        [
            "-dev",
            "-datacenter",
            "dc2",
            "-node",
            "agent-dc2",
            "-advertise",
            "127.0.0.1",
            "-retry-join",
            &http2,
            "-log-level",
            "warn",
        ],
    ));
    until_datacenters(&client, &dc1.http, &["dc1", "dc2"]).await;
    until_datacenters(&client, &dc2.http, &["dc2", "dc1"]).await;
    println!("{:>5.1} s federated", t0.elapsed().as_secs_f64());
    let (status, _, states) = get(&client, &format!("{}/v1/internal/federation-states", dc1.http)).await;
    assert_eq!(status, 200);
    let servers: Vec<(&str, &str)> = states
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["Datacenter"].as_str().unwrap(), s["Servers"][0].as_str().unwrap()))
        .collect();
    assert_eq!(servers, [("dc1", http1.as_str()), ("dc2", host_port(&dc2.http))]);

    // A write for dc2 through dc1 lands in dc2 only.
    let register = json!({"Node": "n2", "Address": "10.2.0.1", "Service": {"Service": "api", "Port": 80}});
    let (status, body) = put(&client, &format!("{}/v1/catalog/register?dc=dc2", dc1.http), register).await;
    assert_eq!(status, 200, "{body}");
    let (_, _, here) = get(&client, &format!("{}/v1/catalog/service/api", dc1.http)).await;
    assert_eq!(here, json!([]));
    let (status, index, there) = get(&client, &format!("{}/v1/health/service/api?dc=dc2", dc1.http)).await;
    assert_eq!(status, 200);
    assert_eq!(there[0]["Node"]["Node"], "n2", "{there}");
    assert_eq!(there[0]["Node"]["Datacenter"], "dc2", "{there}");

    // A blocking query for dc2 through dc1 waits there and wakes on dc2's change.
    let index = index.expect("an index from dc2");
    let blocked = tokio::spawn({
        let (client, url) = (
            client.clone(),
            format!("{}/v1/health/service/api?dc=dc2&index={index}&wait=60s", dc1.http),
        );
        async move { get(&client, &url).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!blocked.is_finished(), "the query waits for dc2's next change");
    let second = json!({"Node": "n3", "Address": "10.2.0.2", "Service": {"Service": "api", "Port": 80}});
    let (status, _) = put(&client, &format!("{}/v1/catalog/register", dc2.http), second).await;
    assert_eq!(status, 200);
    let (status, woke_at, woken) = tokio::time::timeout(Duration::from_secs(10), blocked)
        .await
        .expect("woken by dc2's write")
        .unwrap();
    assert_eq!(status, 200);
    assert!(woke_at.unwrap() > index);
    assert_eq!(woken.as_array().unwrap().len(), 2, "{woken}");

    // A datacenter nobody knows: Consul's answer.
    let (status, _, body) = get(&client, &format!("{}/v1/catalog/nodes?dc=dc9", dc1.http)).await;
    assert_eq!(status, 500);
    assert!(
        body.as_str().unwrap().starts_with("No path to datacenter \"dc9\""),
        "{body}"
    );
    // Only the primary takes states, and never its own.
    let fake = json!({"Datacenter": "dc1", "Servers": ["10.9.9.9:8500"]});
    let (status, body) = put(&client, &format!("{}/v1/internal/federation-state", dc1.http), fake).await;
    assert_eq!(status, 400, "{body}");
    let other = json!({"Datacenter": "dc3", "Servers": ["10.9.9.9:8500"]});
    let (status, body) = put(&client, &format!("{}/v1/internal/federation-state", dc2.http), other).await;
    assert_eq!((status, body.contains("sent to the primary")), (400, true), "{body}");

    println!("{:>5.1} s forwarded", t0.elapsed().as_secs_f64());
    config_replicated(&client, &dc1.http, &dc2.http).await;
    println!("{:>5.1} s config entries replicated", t0.elapsed().as_secs_f64());
    one_trust_domain(&client, &dc1.http, &dc2.http).await;
    println!("{:>5.1} s one trust domain, rotated", t0.elapsed().as_secs_f64());
    let dir = tempfile::tempdir().unwrap();
    through_both_gateways([&dc1, &agent1, &agent2], &mut dc2, &start_dc2, dir.path()).await;
    println!("{:>5.1} s through both mesh gateways", t0.elapsed().as_secs_f64());
    // The primary restarts with nothing (-dev): dc2 tells it again; dc2 kept dc1 meanwhile.
    drop(dc1);
    let (_, _, dcs) = get(&client, &format!("{}/v1/catalog/datacenters", dc2.http)).await;
    assert_eq!(dcs, json!(["dc2", "dc1"]));
    let dc1 = Mesh::of(start_server_at(bin(), &http1, &grpc1, dc1_args));
    until_datacenters(&client, &dc1.http, &["dc1", "dc2"]).await;
    println!(
        "{:>5.1} s the restarted primary knows dc2 again",
        t0.elapsed().as_secs_f64()
    );
    let (status, _, there) = get(&client, &format!("{}/v1/catalog/service/api?dc=dc2", dc1.http)).await;
    assert_eq!(status, 200);
    assert_eq!(there.as_array().unwrap().len(), 3, "n2, n3 and node-api: {there}");
    // It came back with a CA of its own (nothing kept): dc2 follows it.
    let (_, _, roots) = get(&client, &format!("{}/v1/connect/ca/roots", dc1.http)).await;
    until_roots(&client, &dc2.http, &roots["ActiveRootID"]).await;
}

async fn delete(client: &reqwest::Client, url: &str) -> u16 {
    client.delete(url).send().await.unwrap().status().as_u16()
}

#[allow(clippy::print_stdout)]
/// dc2 copies dc1's config entries (intentions among them): a write in dc1 appears in dc2;
/// a write made in dc2 is the primary's, read back in both at once; a delete in dc1 goes
/// from dc2; the copy's status and metrics say how it is doing.
async fn config_replicated(client: &reqwest::Client, dc1: &str, dc2: &str) {
    let started = std::time::Instant::now();
    let entry = json!({"Kind": "service-defaults", "Name": "billing", "Protocol": "http"});
    let (status, body) = put(client, &format!("{dc1}/v1/config"), entry).await;
    assert_eq!(status, 200, "{body}");
    let in_dc2 = format!("{dc2}/v1/config/service-defaults/billing");
    wait_for(|| async {
        let (status, _, entry) = get(client, &in_dc2).await;
        (status == 200 && entry["Protocol"] == "http").then_some(())
    })
    .await;
    println!("        dc1's write read in dc2 after {:?}", started.elapsed());

    // Written in dc2: the primary's; read back in dc2 as soon as the write answers.
    let entry = json!({"Kind": "service-defaults", "Name": "billing", "Protocol": "grpc"});
    let (status, body) = put(client, &format!("{dc2}/v1/config"), entry).await;
    assert_eq!(status, 200, "{body}");
    let (_, _, here) = get(client, &in_dc2).await;
    assert_eq!(here["Protocol"], "grpc", "{here}");
    let (_, _, there) = get(client, &format!("{dc1}/v1/config/service-defaults/billing")).await;
    assert_eq!(there["Protocol"], "grpc", "{there}");
    // An intention written in dc2 (legacy API): held by dc1.
    let exact = "/v1/connect/intentions/exact?source=web&destination=billing";
    let (status, body) = put(client, &format!("{dc2}{exact}"), json!({"Action": "deny"})).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, ixn) = get(client, &format!("{dc1}{exact}")).await;
    assert_eq!((status, &ixn["Action"]), (200, &json!("deny")), "{ixn}");
    // Checked where it is written: a bad entry written in dc2 is dc1's 400.
    let bad = json!({"Kind": "service-defaults", "Name": "billing", "Protocol": "smtp"});
    let (status, body) = put(client, &format!("{dc2}/v1/config"), bad).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("Protocol"), "{body}");

    // Deleted in dc1 (the intention through dc2): gone from dc2.
    assert_eq!(delete(client, &format!("{dc2}{exact}")).await, 200);
    assert_eq!(
        delete(client, &format!("{dc1}/v1/config/service-defaults/billing")).await,
        200
    );
    wait_for(|| async { (get(client, &in_dc2).await.0 == 404).then_some(()) }).await;
    let (status, _, _) = get(client, &format!("{dc2}{exact}")).await;
    assert_eq!(status, 404);

    let (_, _, replication) = get(client, &format!("{dc2}/v1/operator/replication")).await;
    let copy = &replication["ConfigEntries"];
    assert_eq!(copy["Running"], true, "{replication}");
    assert!(copy["ReplicatedIndex"].as_u64().unwrap() > 0, "{replication}");
    assert!(copy["LastSuccess"].is_string(), "{replication}");
    assert_eq!(replication["Acl"]["Running"], false, "ACLs are off: {replication}");
    let metrics = client
        .get(format!("{dc2}/v1/agent/metrics?format=prometheus"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("meshd_replication_lag_seconds_count{kind=\"config-entries\"}"),
        "{metrics}"
    );
    let (_, _, primary) = get(client, &format!("{dc1}/v1/operator/replication")).await;
    assert_eq!(primary["ConfigEntries"]["Running"], false, "{primary}");
}

/// Waits until `server`'s active root is `active`; returns its roots.
async fn until_roots(client: &reqwest::Client, server: &str, active: &Value) -> Value {
    wait_for(|| async {
        let (_, _, roots) = get(client, &format!("{server}/v1/connect/ca/roots")).await;
        (roots["ActiveRootID"] == *active).then_some(roots)
    })
    .await
}

/// The certificates of a PEM bundle, DER.
fn ders(pem: &str) -> Vec<Vec<u8>> {
    x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes())
        .map(|p| p.unwrap().contents)
        .collect()
}

/// Whether `leaf_pem` (a leaf, then its intermediate) chains to the root `root_pem`.
fn chains_to(leaf_pem: &str, root_pem: &str) -> bool {
    use x509_parser::prelude::*;
    let (chain, root) = (ders(leaf_pem), ders(root_pem));
    let (_, root) = X509Certificate::from_der(&root[0]).unwrap();
    let (_, leaf) = X509Certificate::from_der(&chain[0]).unwrap();
    let (_, inter) = X509Certificate::from_der(&chain[1]).unwrap();
    inter.verify_signature(Some(root.public_key())).is_ok() && leaf.verify_signature(Some(inter.public_key())).is_ok()
}

/// dc2's CA follows dc1's: one trust domain and dc1's roots; dc2's leaves are signed by an
/// intermediate dc1's root signed. A rotation in dc1 gives dc2 a new intermediate, and
/// dc2's leaves from before still chain to a root dc2 trusts. dc2 takes no CA configuration.
async fn one_trust_domain(client: &reqwest::Client, dc1: &str, dc2: &str) {
    let (_, _, roots1) = get(client, &format!("{dc1}/v1/connect/ca/roots")).await;
    let roots2 = until_roots(client, dc2, &roots1["ActiveRootID"]).await;
    assert_eq!(roots2["TrustDomain"], roots1["TrustDomain"]);
    let root_pem = roots1["Roots"][0]["RootCert"].as_str().unwrap().to_owned();
    assert_eq!(roots2["Roots"][0]["RootCert"], root_pem.as_str());
    let leaf = |server: &str| {
        let url = format!("{server}/v1/agent/connect/ca/leaf/api");
        async move { get(client, &url).await.2["CertPEM"].as_str().unwrap().to_owned() }
    };
    let before = leaf(dc2).await;
    assert_eq!(ders(&before).len(), 2, "a dc2 leaf carries its intermediate");
    assert!(chains_to(&before, &root_pem), "dc2's leaf chains to dc1's root");
    assert_eq!(
        ders(roots2["Roots"][0]["IntermediateCerts"][0].as_str().unwrap()),
        ders(&before)[1..],
        "dc2's bundle names the intermediate its leaves carry"
    );

    let (status, body) = put(
        client,
        &format!("{dc2}/v1/connect/ca/configuration"),
        json!({"Provider": "consul", "Config": {"PrivateKeyBits": 384}}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("follows the primary"), "{body}");

    // A new key size in dc1 rotates its root.
    let (status, body) = put(
        client,
        &format!("{dc1}/v1/connect/ca/configuration"),
        json!({"Provider": "consul", "Config": {"PrivateKeyBits": 384}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (_, _, rotated) = get(client, &format!("{dc1}/v1/connect/ca/roots")).await;
    assert_ne!(rotated["ActiveRootID"], roots1["ActiveRootID"]);
    let roots2 = until_roots(client, dc2, &rotated["ActiveRootID"]).await;
    let trusted: Vec<&str> = roots2["Roots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["RootCert"].as_str().unwrap())
        .collect();
    assert!(
        trusted.contains(&root_pem.as_str()),
        "the old root stays trusted in dc2"
    );
    let new_root = rotated["Roots"][0]["RootCert"].as_str().unwrap();
    let after = wait_for(|| async { Some(leaf(dc2).await).filter(|l| *l != before) }).await;
    assert!(chains_to(&after, new_root), "dc2's new leaves chain to dc1's new root");
    assert!(
        chains_to(&before, &root_pem),
        "and its old ones still to a root it trusts"
    );
}

/// A mesh gateway in each datacenter (`-gateway mesh -register`); api in dc2 behind its
/// sidecar. A client holding dc1's leaf for web dials dc1's gateway with api's name in dc2
/// (`api.default.dc2.internal.<trust-domain>`): dc1's gateway sends it to dc2's (known from
/// dc2's federation state), which sends it to api's sidecar, which checks the certificate
/// (one trust domain) and hands the request to api.
/// An Envoy counter from its admin at `admin` (0 while it has none).
async fn counter(client: &reqwest::Client, admin: &str, name: &str) -> u64 {
    let stats = crate::mesh::get(client, &format!("{admin}/stats?filter={name}"))
        .await
        .unwrap_or_default();
    let prefix = format!("{name}: ");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
        .unwrap_or(0)
}

async fn through_both_gateways(
    [dc1, agent1, agent2]: [&Mesh; 3],
    dc2: &mut Mesh,
    restart_dc2: &dyn Fn() -> Mesh,
    dir: &Path,
) {
    let api_port = crate::gateway_e2e::backend("api");
    let api_sidecar = test_support::reserve_port();
    dc2.register("node-api", "api", api_port, api_sidecar, json!([]), json!({}))
        .await;
    let (api, _) = dc2.envoy("api", "node-api", dir).await;
    // Registered in a server's catalog on a node given, or with an agent (on its node).
    let gateway = |mesh: &Mesh, name: &str, node: Option<&'static str>| {
        let port = test_support::reserve_port();
        let address = format!("127.0.0.1:{port}");
        let (http, grpc, run_dir) = (mesh.http.clone(), mesh.grpc.clone(), dir.join(name));
        async move {
            let mut which = vec!["-gateway", "mesh", "-register", "-address", &address];
            which.extend(node.iter().flat_map(|n| ["-node", *n]));
            let (proc, admin) = crate::mesh::run_proxy(&which, &http, &["-grpc-addr", &grpc], &run_dir).await;
            (proc, admin, port)
        }
    };
    // dc2's through its agent too.
    let (gw2, admin2, port2) = gateway(agent2, "gateway-dc2", None).await;
    // dc1's through its agent (which follows every datacenter's gateways from dc1's server).
    let (gw1, admin1, port1) = gateway(agent1, "gateway-dc1", None).await;

    let (_, _, roots) = get(&dc1.client, &format!("{}/v1/connect/ca/roots", dc1.http)).await;
    let host = format!("api.default.dc2.internal.{}", roots["TrustDomain"].as_str().unwrap());
    let (_, _, leaf) = get(&dc1.client, &format!("{}/v1/agent/connect/ca/leaf/web", dc1.http)).await;
    let pem = format!(
        "{}{}",
        leaf["CertPEM"].as_str().unwrap(),
        leaf["PrivateKeyPEM"].as_str().unwrap()
    );
    // api's certificate names its SPIFFE id, no host: not checked here; api's sidecar checks
    // this side's against the roots both datacenters share.
    let web = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .resolve(&host, ([127, 0, 0, 1], port1).into())
        .identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap())
        .build()
        .unwrap();
    let url = format!("https://{host}:{port1}/across");
    let body = wait_for(|| async {
        let resp = web.get(&url).timeout(Duration::from_secs(5)).send().await.ok()?;
        (resp.status().as_u16() == 200).then_some(())?;
        resp.text().await.ok()
    })
    .await;
    assert_eq!(body, "api /across x-from=");
    // dc1's gateway sent it on to dc2's, not anywhere local.
    let stats = crate::mesh::get(&dc1.client, &format!("{admin1}/stats?filter=mesh_gateway_remote.dc2"))
        .await
        .unwrap();
    assert!(
        stats.contains("tcp.mesh_gateway_remote.dc2.downstream_cx_total: "),
        "{stats}"
    );
    assert!(!stats.contains("downstream_cx_total: 0"), "{stats}");

    // web in dc1, its upstream api in dc2: through dc1's gateway (mode local), then straight
    // to dc2's (remote), as web's Envoy's endpoints for api's cluster show. Its second
    // upstream is api in dc1, failing over to dc2 (a resolver in dc1).
    let (bind, local_bind) = (test_support::reserve_port(), test_support::reserve_port());
    let web_proxy = test_support::reserve_port();
    let register_web = |mode: &'static str| {
        let upstreams = json!([
            {"DestinationName": "api", "Datacenter": "dc2", "LocalBindPort": bind, "MeshGateway": {"Mode": mode}},
            {"DestinationName": "api", "LocalBindPort": local_bind, "MeshGateway": {"Mode": "local"}}]);
        dc1.register("node-web", "web", 9, web_proxy, upstreams, json!({}))
    };
    register_web("local").await;
    let (web, web_admin) = dc1.envoy("web", "node-web", dir).await;
    // A connection per request: each takes the path web's Envoy has now.
    let plain = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let through = |path: &'static str| {
        let (plain, url) = (plain.clone(), format!("http://127.0.0.1:{bind}{path}"));
        async move {
            let resp = plain.get(&url).timeout(Duration::from_secs(5)).send().await.ok()?;
            resp.text().await.ok()
        }
    };
    let endpoint_of_api = |port: u16| {
        let (client, url) = (dc1.client.clone(), format!("{web_admin}/clusters"));
        let cluster = host.clone();
        async move {
            let clusters = crate::mesh::get(&client, &url).await?;
            clusters
                .lines()
                .any(|l| l.starts_with(&format!("{cluster}::127.0.0.1:{port}::")))
                .then_some(())
        }
    };
    // Which gateways one request went through, from their stats: (dc1's sent on to dc2,
    // dc2's sent to a local service).
    let one_request = |path: &'static str| {
        let (client, admin1, admin2) = (dc1.client.clone(), admin1.clone(), admin2.clone());
        let through = &through;
        async move {
            let counters = || async {
                (
                    counter(&client, &admin1, "tcp.mesh_gateway_remote.dc2.downstream_cx_total").await,
                    counter(&client, &admin2, "tcp.mesh_gateway_local.default.downstream_cx_total").await,
                )
            };
            let before = counters().await;
            let body = through(path).await.unwrap_or_default();
            let after = counters().await;
            (body, after.0 - before.0, after.1 - before.1)
        }
    };
    wait_for(|| endpoint_of_api(port1)).await;
    let body = wait_for(|| async { through("/via-local").await.filter(|b| b.starts_with("api")) }).await;
    assert_eq!(body, "api /via-local x-from=");
    assert_eq!(
        one_request("/local").await,
        ("api /local x-from=".into(), 1, 1),
        "mode local: through both gateways"
    );
    register_web("remote").await;
    wait_for(|| endpoint_of_api(port2)).await;
    let body = wait_for(|| async { through("/via-remote").await.filter(|b| b.starts_with("api")) }).await;
    assert_eq!(body, "api /via-remote x-from=");
    assert_eq!(
        one_request("/remote").await,
        ("api /remote x-from=".into(), 0, 1),
        "mode remote: through dc2's gateway only"
    );
    // Mode none: straight to api's sidecar in dc2 (its instances followed at dc2's server).
    register_web("none").await;
    wait_for(|| endpoint_of_api(api_sidecar)).await;
    let body = wait_for(|| async { through("/direct").await.filter(|b| b.starts_with("api")) }).await;
    assert_eq!(body, "api /direct x-from=");
    assert_eq!(
        one_request("/none").await,
        ("api /none x-from=".into(), 0, 0),
        "mode none: through no gateway"
    );
    register_web("remote").await;
    wait_for(|| endpoint_of_api(port2)).await;
    deny_in_the_primary(dc1, &through).await;
    let web_agent = web_on_the_agent(agent1, dir).await;
    let (api1, ingress) = failover_to_dc2(dc1, dir, local_bind).await;
    dc2_killed_and_back(dc2, restart_dc2, &through, local_bind).await;
    crate::mesh::stop_together(vec![api, gw2, gw1, web, api1, web_agent, ingress]);
}

/// A web registered with dc1's agent, its upstream api in dc2 through dc1's gateway: its
/// sidecar (configured by the agent) reaches dc2. Returns its Envoy.
async fn web_on_the_agent(agent1: &Mesh, dir: &Path) -> crate::mesh::Proc {
    let bind = test_support::reserve_port();
    let web = json!({"Name": "web", "ID": "web-agent", "Port": 9, "Connect": {"SidecarService": {
        "Port": test_support::reserve_port(),
        "Proxy": {"Upstreams": [{"DestinationName": "api", "Datacenter": "dc2", "LocalBindPort": bind,
                                 "MeshGateway": {"Mode": "local"}}]}}}});
    agent1.put("/v1/agent/service/register", web).await;
    let (proc, _) = crate::mesh::run_proxy(
        &["-sidecar-for", "web-agent"],
        &agent1.http,
        &["-grpc-addr", &agent1.grpc],
        &dir.join("web-agent"),
    )
    .await;
    let plain = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{bind}/from-the-agent");
    let body = wait_for(|| async {
        let resp = plain.get(&url).timeout(Duration::from_secs(5)).send().await.ok()?;
        resp.text().await.ok().filter(|b| b.starts_with("api"))
    })
    .await;
    assert_eq!(body, "api /from-the-agent x-from=");
    proc
}

#[allow(clippy::print_stdout)]
/// dc2's server killed with SIGKILL: web's requests to api in dc1 go on unaffected; once
/// dc2's server is back (its catalog in etcd), requests from dc1 to dc2 get through.
async fn dc2_killed_and_back<F: std::future::Future<Output = Option<String>>>(
    dc2: &mut Mesh,
    restart_dc2: &dyn Fn() -> Mesh,
    through: &impl Fn(&'static str) -> F,
    local_bind: u16,
) {
    dc2.kill_server();
    let plain = reqwest::Client::new();
    let local = format!("http://127.0.0.1:{local_bind}/local");
    for _ in 0..10 {
        let resp = plain.get(&local).timeout(Duration::from_secs(5)).send().await.unwrap();
        assert!(resp.text().await.unwrap().starts_with("api-dc1 "), "dc1's own traffic");
    }
    let meanwhile = through("/while-dc2-is-down").await;
    println!("        dc1 -> dc2 while dc2's server is down: {meanwhile:?}");
    *dc2 = restart_dc2();
    let body = wait_for(|| async { through("/dc2-back").await.filter(|b| b.starts_with("api")) }).await;
    assert_eq!(body, "api /dc2-back x-from=");
    // dc2's restarted server serves what it had: api, its gateway.
    let (status, _, api) = get(&dc2.client, &format!("{}/v1/health/service/api?passing", dc2.http)).await;
    assert_eq!(status, 200);
    assert_eq!(api.as_array().unwrap().len(), 3, "n2, n3, node-api: {api}");
}

/// A deny intention web -> api written in dc1 is copied to dc2, where api's sidecar
/// enforces it against web's identity (which names dc1); deleting it lets web through again.
async fn deny_in_the_primary<F: std::future::Future<Output = Option<String>>>(
    dc1: &Mesh,
    through: &impl Fn(&'static str) -> F,
) {
    let exact = "/v1/connect/intentions/exact?source=web&destination=api";
    dc1.put(exact, json!({"Action": "deny"})).await;
    let in_dc2 = format!("{}{exact}&dc=dc2", dc1.http);
    wait_for(|| async {
        let (status, _, copied) = get(&dc1.client, &in_dc2).await;
        (status == 200 && copied["Action"] == "deny").then_some(())
    })
    .await;
    wait_for(|| async { through("/denied").await.is_none().then_some(()) }).await;
    for _ in 0..3 {
        assert_eq!(through("/denied").await, None, "every connection is refused in dc2");
    }
    let resp = dc1.client.delete(format!("{}{exact}", dc1.http)).send().await.unwrap();
    assert!(resp.status().is_success());
    let body = wait_for(|| async { through("/allowed").await.filter(|b| b.starts_with("api")) }).await;
    assert_eq!(body, "api /allowed x-from=");
}

/// api also runs in dc1, where a resolver fails it over to dc2: web's second upstream
/// reaches dc1's api, then dc2's once dc1's instance turns critical, then dc1's again.
/// An ingress gateway of dc1 exposing api (`MeshGateway.Mode` unset: dc2's instances
/// dialled directly) fails over the same way. Returns the Envoys of api's sidecar in dc1
/// and of the ingress gateway.
async fn failover_to_dc2(dc1: &Mesh, dir: &Path, bind: u16) -> (crate::mesh::Proc, crate::mesh::Proc) {
    let api1_port = crate::gateway_e2e::backend("api-dc1");
    let proxy_port = test_support::reserve_port();
    dc1.register("node-api1", "api", api1_port, proxy_port, json!([]), json!({}))
        .await;
    let check = |status: &str| {
        json!({"Node": "node-api1", "Address": "127.0.0.1", "SkipNodeUpdate": true,
            "Check": {"CheckID": "api-alive", "Name": "alive", "ServiceID": "api-sidecar-proxy", "Status": status}})
    };
    dc1.put("/v1/catalog/register", check("passing")).await;
    let (api1, _) = dc1.envoy("api", "node-api1", dir).await;
    dc1.put(
        "/v1/config",
        json!({"Kind": "service-resolver", "Name": "api", "Failover": {"*": {"Datacenters": ["dc2"]}}}),
    )
    .await;
    let plain = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{bind}/failover");
    let from = || {
        let (plain, url) = (plain.clone(), url.clone());
        async move {
            let resp = plain.get(&url).timeout(Duration::from_secs(5)).send().await;

            let body = resp.ok()?.text().await.ok()?;

            body.split_whitespace().next().map(str::to_owned)
        }
    };
    wait_for(|| async { from().await.filter(|b| b == "api-dc1") }).await;
    let ingress_port = test_support::reserve_port();
    dc1.put(
        "/v1/config",
        json!({"Kind": "ingress-gateway", "Name": "ingress",
               "Listeners": [{"Port": ingress_port, "Protocol": "tcp", "Services": [{"Name": "api"}]}]}),
    )
    .await;
    let address = format!("127.0.0.1:{}", test_support::reserve_port());
    let which = [
        "-gateway",
        "ingress",
        "-service",
        "ingress",
        "-register",
        "-address",
        &address,
        "-node",
        "node-ingress",
    ];
    let (ingress, _) =
        crate::mesh::run_proxy(&which, &dc1.http, &["-grpc-addr", &dc1.grpc], &dir.join("ingress")).await;
    let through_ingress = || {
        let (plain, url) = (plain.clone(), format!("http://127.0.0.1:{ingress_port}/ingress"));
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
    wait_for(|| async { through_ingress().await.filter(|b| b == "api-dc1") }).await;
    dc1.put("/v1/catalog/register", check("critical")).await;
    let moved = std::time::Instant::now();
    wait_for(|| async { from().await.filter(|b| b == "api") }).await;
    assert!(moved.elapsed() < Duration::from_secs(5), "{:?}", moved.elapsed());
    for _ in 0..5 {
        assert_eq!(from().await.as_deref(), Some("api"), "every request goes to dc2 now");
    }
    wait_for(|| async { through_ingress().await.filter(|b| b == "api") }).await;
    dc1.put("/v1/catalog/register", check("passing")).await;
    wait_for(|| async { from().await.filter(|b| b == "api-dc1") }).await;
    wait_for(|| async { through_ingress().await.filter(|b| b == "api-dc1") }).await;
    (api1, ingress)
}

/// With ACLs in both datacenters, dc2 copies dc1's policies, roles and global tokens (its
/// replication token is dc1's): a token made in dc1 works in dc2 and stops working there
/// when deleted; a policy written in dc2 is dc1's; a local token made in dc2 stays there;
/// `/v1/acl/replication` shows the copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acls_replicate_from_the_primary() {
    let dir = tempfile::tempdir().unwrap();
    let management = "5d1c7f3a-8a8e-4f0e-9a43-0b6c2d7e9f10";
    let file = dir.path().join("management.token");
    std::fs::write(&file, management).unwrap();
    let file = file.to_str().unwrap();
    let acl = ["-acl-enabled", "-acl-default-policy", "deny"];
    let dc1 = Mesh::of(start_server(
        bin(),
        ["-dev", "-datacenter", "dc1", "-node", "acl-dc1", "-log-level", "warn"]
            .into_iter()
            .chain(acl)
            .chain(["-acl-initial-management-token-file", file]),
    ));
    let join = host_port(&dc1.http).to_owned();
    let dc2 = Mesh::of(start_server(
        bin(),
        [
            "-dev",
            "-datacenter",
            "dc2",
            "-primary-datacenter",
            "dc1",
            "-retry-join-wan",
            &join,
            "-node",
            "acl-dc2",
            "-log-level",
            "warn",
            "-acl-replication-token-file",
            file,
        ]
        .into_iter()
        .chain(acl),
    ));
    let client = reqwest::Client::new();
    let call = |method: reqwest::Method, url: String, token: &str, body: Value| {
        let req = client.request(method, url).header("X-Consul-Token", token);
        let req = if body.is_null() { req } else { req.json(&body) };
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap();
            (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
        }
    };
    use reqwest::Method;

    // A policy and a token made in dc1: the token works in dc2 once copied.
    let (status, policy) = call(
        Method::PUT,
        format!("{}/v1/acl/policy", dc1.http),
        management,
        json!({"Name": "kv-app", "Rules": "key_prefix \"app/\" { policy = \"write\" }"}),
    )
    .await;
    assert_eq!(status, 200, "{policy}");
    let (status, token) = call(
        Method::PUT,
        format!("{}/v1/acl/token", dc1.http),
        management,
        json!({"Description": "app", "Policies": [{"Name": "kv-app"}]}),
    )
    .await;
    assert_eq!(status, 200, "{token}");
    let secret = token["SecretID"].as_str().unwrap().to_owned();
    let accessor = token["AccessorID"].as_str().unwrap().to_owned();
    let started = std::time::Instant::now();
    let kv = format!("{}/v1/kv/app/x", dc2.http);
    wait_for(|| async {
        let (status, _) = call(Method::PUT, kv.clone(), &secret, json!("v")).await;
        (status == 200).then_some(())
    })
    .await;
    println!("dc1's token works in dc2 after {:?}", started.elapsed());
    // Only what its policy grants.
    let (status, _) = call(Method::PUT, format!("{}/v1/kv/other", dc2.http), &secret, json!("v")).await;
    assert_eq!(status, 403);

    // A policy written in dc2 is dc1's, and read back in dc2 at once.
    let (status, made) = call(
        Method::PUT,
        format!("{}/v1/acl/policy", dc2.http),
        management,
        json!({"Name": "made-in-dc2", "Rules": "node_prefix \"\" { policy = \"read\" }"}),
    )
    .await;
    assert_eq!(status, 200, "{made}");
    let id = made["ID"].as_str().unwrap();
    for server in [&dc1.http, &dc2.http] {
        let (status, read) = call(
            Method::GET,
            format!("{server}/v1/acl/policy/{id}"),
            management,
            Value::Null,
        )
        .await;
        assert_eq!(
            (status, &read["Name"]),
            (200, &json!("made-in-dc2")),
            "{server}: {read}"
        );
    }
    // The secret of dc1's token cannot write ACLs, here or there.
    let (status, _) = call(
        Method::PUT,
        format!("{}/v1/acl/policy", dc2.http),
        &secret,
        json!({"Name": "sneaky", "Rules": "acl = \"write\""}),
    )
    .await;
    assert_eq!(status, 403);

    // A local token made in dc2 stays in dc2.
    let (status, local) = call(
        Method::PUT,
        format!("{}/v1/acl/token", dc2.http),
        management,
        json!({"Description": "dc2 only", "Local": true, "Policies": [{"Name": "kv-app"}]}),
    )
    .await;
    assert_eq!(status, 200, "{local}");
    let local_accessor = local["AccessorID"].as_str().unwrap();
    let (status, missing) = call(
        Method::GET,
        format!("{}/v1/acl/token/{local_accessor}", dc1.http),
        management,
        Value::Null,
    )
    .await;
    // Consul's answer for a token it does not have.
    assert_eq!(status, 403, "dc1 never sees dc2's local token: {missing}");
    assert!(missing.as_str().unwrap().contains("not found"), "{missing}");

    // dc1's token deleted in dc1: it stops working in dc2; dc2's local token is kept.
    let (status, _) = call(
        Method::DELETE,
        format!("{}/v1/acl/token/{accessor}", dc1.http),
        management,
        Value::Null,
    )
    .await;
    assert_eq!(status, 200);
    wait_for(|| async {
        let (status, _) = call(Method::PUT, kv.clone(), &secret, json!("v")).await;
        (status == 403).then_some(())
    })
    .await;
    let (status, kept) = call(
        Method::GET,
        format!("{}/v1/acl/token/{local_accessor}", dc2.http),
        management,
        Value::Null,
    )
    .await;
    assert_eq!((status, &kept["Local"]), (200, &json!(true)), "{kept}");

    let (status, replication) = call(
        Method::GET,
        format!("{}/v1/acl/replication", dc2.http),
        management,
        Value::Null,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(replication["Enabled"], true, "{replication}");
    assert_eq!(replication["Running"], true, "{replication}");
    assert_eq!(replication["SourceDatacenter"], "dc1", "{replication}");
    assert!(replication["ReplicatedIndex"].as_u64().unwrap() > 0, "{replication}");
    assert_eq!(replication["LastErrorMessage"], "", "{replication}");
}

/// Two datacenters whose servers serve HTTPS only (`-http-addr off`, a CA of `meshd tls`):
/// each advertises `https://`, joins and is joined over it, verifies the other's certificate
/// with `-tls-ca-file`; states, `?dc=` relays, replication and the CA's intermediate all
/// travel over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datacenters_federate_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = crate::tls_e2e::certificates(&dir.path().join("tls"));
    let (ca, cert, key) = (ca.to_str().unwrap(), cert.to_str().unwrap(), key.to_str().unwrap());
    let start = |dc: &str, https: &str, more: &[&str]| {
        let advertise = format!("https://{https}");
        let mut args = vec![
            "server",
            "-dev",
            "-log-level",
            "warn",
            "-datacenter",
            dc,
            "-node",
            dc,
            "-http-addr",
            "off",
            "-grpc-addr",
            "127.0.0.1:0",
            "-dns-addr",
            "off",
            "-https-addr",
            https,
            "-tls-cert-file",
            cert,
            "-tls-key-file",
            key,
            "-tls-ca-file",
            ca,
            "-advertise-wan",
            &advertise,
        ];
        args.extend(more);
        let (child, _) = test_support::process::start_reading(bin(), &args, &["meshd server listening on https://"]);
        crate::mesh::Proc(child)
    };
    let (https1, https2) = (
        format!("127.0.0.1:{}", test_support::reserve_port()),
        format!("127.0.0.1:{}", test_support::reserve_port()),
    );
    let _dc1 = start("dc1", &https1, &[]);
    let join = format!("https://{https1}");
    let _dc2 = start(
        "dc2",
        &https2,
        &["-primary-datacenter", "dc1", "-retry-join-wan", &join],
    );
    let ca_cert = reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(ca_cert)
        .build()
        .unwrap();
    let (dc1, dc2) = (format!("https://{https1}"), format!("https://{https2}"));
    until_datacenters(&client, &dc1, &["dc1", "dc2"]).await;
    let (_, _, states) = get(&client, &format!("{dc1}/v1/internal/federation-states")).await;
    let servers: Vec<&str> = states
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["Servers"][0].as_str().unwrap())
        .collect();
    assert_eq!(servers, [dc1.as_str(), dc2.as_str()]);

    // ?dc= relayed over HTTPS both ways.
    let register = json!({"Node": "n2", "Address": "10.2.0.1", "Service": {"Service": "api", "Port": 80}});
    let (status, body) = put(&client, &format!("{dc1}/v1/catalog/register?dc=dc2"), register).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, there) = get(&client, &format!("{dc2}/v1/catalog/service/api")).await;
    assert_eq!((status, there[0]["Node"].as_str()), (200, Some("n2")), "{there}");
    // Replication, and a write in dc2 sent to dc1.
    let entry = json!({"Kind": "service-defaults", "Name": "api", "Protocol": "http"});
    let (status, body) = put(&client, &format!("{dc2}/v1/config"), entry).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, held) = get(&client, &format!("{dc1}/v1/config/service-defaults/api")).await;
    assert_eq!((status, &held["Protocol"]), (200, &json!("http")), "{held}");
    // dc2's CA follows dc1's: an intermediate asked for over HTTPS.
    let (_, _, roots) = get(&client, &format!("{dc1}/v1/connect/ca/roots")).await;
    until_roots(&client, &dc2, &roots["ActiveRootID"]).await;

    // HTTPS only, advertising a plain address: refused at start, in one line.
    let out = std::process::Command::new(bin())
        .args([
            "server",
            "-dev",
            "-log-level",
            "off",
            "-datacenter",
            "dc3",
            "-primary-datacenter",
            "dc1",
        ])
        .args([
            "-retry-join-wan",
            &join,
            "-http-addr",
            "off",
            "-https-addr",
            "127.0.0.1:0",
        ])
        .args([
            "-grpc-addr",
            "127.0.0.1:0",
            "-dns-addr",
            "off",
            "-tls-cert-file",
            cert,
            "-tls-key-file",
            key,
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!((out.status.code(), err.lines().count()), (Some(1), 1), "{err}");
    assert!(err.contains("-advertise-wan https://HOST:PORT"), "{err}");
}
