//! Cluster peering (prints figures; asserts nothing): the targets of `docs/peering.md`.
//!
//! Two independent real `meshd server` processes, cluster A (exporting) and cluster B
//! (importing), each on a fresh data dir (durable; `DEV=1` for `-dev`), sharing the 2 cores
//! with the load generator.
//!
//! 1. Establishing: A holds `SERVICES` (1,000) services, one instance each, all exported to
//!    B (`exported-services` with `*`). Timed from the start of B's `establish` until B's
//!    peering counts every one of them imported. [target <= 5 s]
//! 2. Propagation: `PROXIES` (1,000) synthetic sidecars in B, each holding a delta ADS
//!    stream that ACKs like Envoy, each with one upstream: `svc-0` of the peer A (its
//!    endpoints are A's mesh gateways). Each of `ROUNDS` (10) rounds registers another mesh
//!    gateway in A with a new WAN address and times, from the start of that write, until
//!    every stream has a load assignment holding it: A's exports recomputed and streamed to
//!    B, B's import stored, B's proxies rebuilt and pushed. [target p99 <= 200 ms]
//! 3. Export cost: `ROUNDS` writes in A that change nothing exported (an instance of a
//!    service exported to nobody): A's CPU per write, with the peering stream up.
//!
//! Run: `cargo xtask bench peering`.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use serde_json::{Value, json};
use std::process::Child;
use std::time::{Duration, Instant};
use test_support::ads::{MarkerFleet, marker_address, proc_stat};
use test_support::figures::{BenchStore, env_usize, ms, percentile};

/// Streams connecting at once.
const CONNECTING: usize = 256;

struct Server {
    child: Child,
    http: String,
    grpc: String,
    _store: BenchStore,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(name: &str) -> Server {
    let store = BenchStore::from_env();
    let mut args = store.args();
    // The peering calls run over the servers' gRPC TLS listener.
    args.extend(
        [
            "-node",
            &format!("server-{name}"),
            "-log-level",
            "error",
            "-grpc-tls-addr",
            "127.0.0.1:0",
        ]
        .map(str::to_owned),
    );
    let test_support::process::ServerProcess { child, http, grpc, .. } =
        test_support::process::start_server(std::path::Path::new(env!("CARGO_BIN_EXE_meshd")), args);
    Server {
        child,
        http,
        grpc,
        _store: store,
    }
}

async fn send(client: &reqwest::Client, method: reqwest::Method, url: String, body: Value) -> Value {
    let resp = client.request(method, url).json(&body).send().await.unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert!(status.is_success(), "{status}: {text}");
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

async fn put(client: &reqwest::Client, url: String, body: Value) {
    send(client, reqwest::Method::PUT, url, body).await;
}

/// Runs `writes` with at most 64 in flight.
async fn in_parallel(client: &reqwest::Client, url: &str, writes: impl Iterator<Item = Value>) {
    let mut tasks = tokio::task::JoinSet::new();
    for body in writes {
        let (client, url) = (client.clone(), url.to_owned());
        tasks.spawn(async move { put(&client, url, body).await });
        if tasks.len() >= 64 {
            tasks.join_next().await;
        }
    }
    while tasks.join_next().await.is_some() {}
}

/// A mesh gateway instance of A on its own node, reached from the peer at `wan`.
fn gateway(round: u64, wan: &str) -> Value {
    json!({"Node": format!("gateway-node-{round}"), "Address": "10.1.0.1",
        "Service": {"Kind": "mesh-gateway", "ID": "mesh-gateway", "Service": "mesh-gateway", "Port": 8443,
            "TaggedAddresses": {"lan": {"Address": "10.1.0.1", "Port": 8443}, "wan": {"Address": wan, "Port": 8443}}}})
}

#[tokio::main]
async fn main() {
    let (a, b) = (start("a"), start("b"));
    let client = reqwest::Client::new();
    println!(
        "peering benchmark (two real meshd server processes, A exporting and B importing, {}, 2 cores shared with the load generator)",
        a._store.describe()
    );
    establish(&client, &a, &b).await;
    propagation(&client, &a, &b).await;
    export_cost(&client, &a).await;
}

/// Part 1 (see the module docs).
async fn establish(client: &reqwest::Client, a: &Server, b: &Server) {
    let services = env_usize("SERVICES", 1000);
    let register = format!("{}/v1/catalog/register", a.http);
    put(client, register.clone(), gateway(0, "10.1.255.1")).await;
    let instances = (0..services).map(|i| {
        json!({"Node": format!("node-{}", i % 50), "Address": format!("10.1.1.{}", i % 50),
            "Service": {"Service": format!("svc-{i}"), "ID": format!("svc-{i}"), "Port": 8080}})
    });
    in_parallel(client, &register, instances).await;
    put(
        client,
        format!("{}/v1/config", a.http),
        json!({"Kind": "exported-services", "Name": "default",
            "Services": [{"Name": "*", "Consumers": [{"Peer": "cluster-b"}]}]}),
    )
    .await;
    let token = send(
        client,
        reqwest::Method::POST,
        format!("{}/v1/peering/token", a.http),
        json!({"PeerName": "cluster-b"}),
    )
    .await["PeeringToken"]
        .clone();
    let t0 = Instant::now();
    send(
        client,
        reqwest::Method::POST,
        format!("{}/v1/peering/establish", b.http),
        json!({"PeerName": "cluster-a", "PeeringToken": token}),
    )
    .await;
    let answered = t0.elapsed();
    let url = format!("{}/v1/peering/cluster-a", b.http);
    let mut index = 0;
    loop {
        let resp = client
            .get(format!("{url}?index={index}&wait=10s"))
            .send()
            .await
            .unwrap();
        index = resp
            .headers()
            .get("x-consul-index")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(0);
        let peering: Value = resp.json().await.unwrap();
        if peering["ImportedServiceCount"].as_u64() == Some(services as u64) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "not imported: {peering}");
    }
    println!(
        "  {services} services exported by A imported in B: {} from the start of B's establish (its answer {})   [target <= 5 s]",
        ms(t0.elapsed()),
        ms(answered)
    );
}

/// Part 2 (see the module docs).
async fn propagation(client: &reqwest::Client, a: &Server, b: &Server) {
    let n = env_usize("PROXIES", 1000);
    let rounds = env_usize("ROUNDS", 10) as u64;
    test_support::ads::raise_open_files(2 * n as u64 + 4096).unwrap();
    let proxies = (0..n).map(|i| {
        json!({"Node": format!("node-{i}"), "Address": "10.0.0.1", "Service": {"Kind": "connect-proxy",
            "ID": format!("app-{i}-sidecar-proxy"), "Service": format!("app-{i}-sidecar-proxy"), "Port": 21000,
            "Proxy": {"DestinationServiceName": format!("app-{i}"), "Upstreams": [
                {"DestinationName": "svc-0", "DestinationPeer": "cluster-a", "LocalBindPort": 9000}]}}})
    });
    in_parallel(client, &format!("{}/v1/catalog/register", b.http), proxies).await;

    let (mut fleet, synced) = MarkerFleet::connect(&b.grpc, n, CONNECTING).await;
    println!(
        "  {n} proxies in B, each with svc-0 of the peer A as its upstream (through A's mesh gateways): all streams synced in {}",
        ms(synced)
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut lat = Vec::new();
    let mut cpu = [Duration::ZERO; 2];
    for round in 1..=rounds {
        let register = put(
            client,
            format!("{}/v1/catalog/register", a.http),
            gateway(round, &marker_address(round)),
        );
        let pids = [a.child.id(), b.child.id()];
        fleet.round(round, register, &pids, &mut lat, &mut cpu).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let [cpu_a, cpu_b] = cpu;
    lat.sort();
    println!(
        "  a mesh gateway registered in A -> every B stream has it in its load assignment ({n} streams x {rounds} rounds): p50 {}  p99 {}  max {}   [target p99 <= 200 ms]",
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        ms(*lat.last().unwrap())
    );
    println!(
        "  server CPU per change: A {} (its write, the exports recomputed, the change sent), B {} (the import stored, {n} streams rebuilt and pushed)",
        ms(cpu_a / rounds as u32),
        ms(cpu_b / rounds as u32)
    );
}

/// Part 3 (see the module docs).
async fn export_cost(client: &reqwest::Client, a: &Server) {
    let rounds = env_usize("ROUNDS", 10) as u64;
    put(
        client,
        format!("{}/v1/config", a.http),
        json!({"Kind": "exported-services", "Name": "default",
            "Services": [{"Name": "svc-0", "Consumers": [{"Peer": "cluster-b"}]}]}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (before, _) = proc_stat(a.child.id());
    let t0 = Instant::now();
    for round in 0..rounds * 10 {
        put(
            client,
            format!("{}/v1/catalog/register", a.http),
            json!({"Node": "node-other", "Address": "10.1.2.1",
                "Service": {"Service": "unexported", "ID": format!("unexported-{round}"), "Port": 8080}}),
        )
        .await;
    }
    let writes = rounds * 10;
    let took = t0.elapsed();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cpu = proc_stat(a.child.id()).0 - before;
    println!(
        "  a write in A exporting nothing new (one service exported, the others held; {writes} writes): A's CPU {} per write, {} per write end to end",
        ms(cpu / writes as u32),
        ms(took / writes as u32)
    );
}
