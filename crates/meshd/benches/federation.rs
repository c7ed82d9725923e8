//! Several datacenters (prints figures; asserts nothing): the targets of `docs/federation.md`.
//!
//! Two real `meshd server` processes, dc1 the primary and dc2 joining it, each on a fresh data
//! dir (durable; `DEV=1` for `-dev`), sharing the 2 cores with the load generator.
//!
//! 1. Replication lag: `ENTRIES` (100) config entries written in dc1 one after the other, each
//!    timed from the start of its write in dc1 until a blocking query on dc2 returns it.
//!    [target p99 <= 100 ms]
//! 2. Cross-datacenter propagation: `PROXIES` (1,000) synthetic sidecars in dc1, each holding a
//!    delta ADS stream that ACKs like Envoy, each with one upstream: `api` in dc2 through dc2's
//!    mesh gateways (`MeshGateway.Mode` remote: the upstream's endpoints are dc2's gateways).
//!    Each of `ROUNDS` (10) rounds registers another mesh gateway in dc2 with a new WAN
//!    address and times, from the start of that write, until every stream has a load
//!    assignment holding it: dc2's state recomputed and sent to dc1, dc1's proxies rebuilt
//!    and pushed. [target p99 <= 200 ms]
//!
//! Run: `cargo xtask bench federation`.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use serde_json::{Value, json};
use std::process::Child;
use std::time::{Duration, Instant};
use test_support::ads::{MarkerFleet, marker_address};
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

fn start(dc: &str, extra: &[&str]) -> Server {
    let store = BenchStore::from_env();
    let mut args = store.args();
    args.extend(
        [
            "-datacenter",
            dc,
            "-node",
            &format!("server-{dc}"),
            "-log-level",
            "error",
        ]
        .map(str::to_owned),
    );
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let test_support::process::ServerProcess { child, http, grpc, .. } =
        test_support::process::start_server(std::path::Path::new(env!("CARGO_BIN_EXE_meshd")), args);
    Server {
        child,
        http,
        grpc,
        _store: store,
    }
}

async fn put(client: &reqwest::Client, url: String, body: Value) {
    client
        .put(url)
        .json(&body)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
}

/// A GET's status and `X-Consul-Index`.
async fn get_index(client: &reqwest::Client, url: &str) -> (u16, u64) {
    let resp = client.get(url).send().await.unwrap();
    let index = resp
        .headers()
        .get("x-consul-index")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    (resp.status().as_u16(), index)
}

/// A mesh gateway instance of dc2 on its own node, reached from other datacenters at `wan`.
fn gateway(round: u64, wan: &str) -> Value {
    json!({"Node": format!("gateway-node-{round}"), "Address": "10.2.0.1",
        "Service": {"Kind": "mesh-gateway", "ID": "mesh-gateway", "Service": "mesh-gateway", "Port": 8443,
            "TaggedAddresses": {"lan": {"Address": "10.2.0.1", "Port": 8443}, "wan": {"Address": wan, "Port": 8443}}}})
}

#[tokio::main]
async fn main() {
    let dc1 = start("dc1", &[]);
    let join = dc1.http.trim_start_matches("http://").to_owned();
    let dc2 = start("dc2", &["-primary-datacenter", "dc1", "-retry-join-wan", &join]);
    let client = reqwest::Client::new();
    // dc2 is known in dc1 once it has linked.
    let states = format!("{}/v1/internal/federation-states", dc1.http);
    for _ in 0..600 {
        let listed: Value = client.get(&states).send().await.unwrap().json().await.unwrap();
        if listed.as_array().is_some_and(|a| a.len() == 2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "federation benchmark (two real meshd server processes, dc1 primary and dc2, {}, 2 cores shared with the load generator)",
        dc1._store.describe()
    );
    replication_lag(&client, &dc1, &dc2).await;
    propagation(&client, &dc1, &dc2).await;
}

/// Part 1 (see the module docs).
async fn replication_lag(client: &reqwest::Client, dc1: &Server, dc2: &Server) {
    let entries = env_usize("ENTRIES", 100);
    let mut lag = Vec::with_capacity(entries);
    let mut writes = Vec::with_capacity(entries);
    for i in 0..entries {
        let name = format!("bench-{i}");
        let in_dc2 = format!("{}/v1/config/service-defaults/{name}", dc2.http);
        let (_, mut index) = get_index(client, &in_dc2).await;
        let t0 = Instant::now();
        put(
            client,
            format!("{}/v1/config", dc1.http),
            json!({"Kind": "service-defaults", "Name": name, "Protocol": "http"}),
        )
        .await;
        writes.push(t0.elapsed());
        loop {
            let (status, next) = get_index(client, &format!("{in_dc2}?index={index}&wait=10s")).await;
            if status == 200 {
                break;
            }
            index = next;
        }
        lag.push(t0.elapsed());
    }
    lag.sort();
    writes.sort();
    println!(
        "  replication lag of a config entry ({entries} entries, each from the start of its write in dc1 until a blocking query on dc2 returns it): p50 {}  p99 {}  max {}   [target p99 <= 100 ms]",
        ms(percentile(&lag, 0.5)),
        ms(percentile(&lag, 0.99)),
        ms(*lag.last().unwrap())
    );
    println!(
        "  of which the write in dc1 (durable answer): p50 {}  p99 {}",
        ms(percentile(&writes, 0.5)),
        ms(percentile(&writes, 0.99))
    );
    let status: Value = client
        .get(format!("{}/v1/operator/replication", dc2.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    println!(
        "  dc2's own view (/v1/operator/replication): ReplicatedIndex {}, LastLagMs {} (from dc1's answer to dc2's write)",
        status["ConfigEntries"]["ReplicatedIndex"], status["ConfigEntries"]["LastLagMs"]
    );
}

/// Part 2 (see the module docs).
async fn propagation(client: &reqwest::Client, dc1: &Server, dc2: &Server) {
    let n = env_usize("PROXIES", 1000);
    let rounds = env_usize("ROUNDS", 10) as u64;
    test_support::ads::raise_open_files(2 * n as u64 + 4096).unwrap();
    // dc2's first gateway, then dc1's proxies, each with api in dc2 as its upstream.
    put(
        client,
        format!("{}/v1/catalog/register", dc2.http),
        gateway(0, "10.2.255.1"),
    )
    .await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let body = json!({"Node": format!("node-{i}"), "Address": "10.0.0.1", "Service": {"Kind": "connect-proxy",
            "ID": format!("app-{i}-sidecar-proxy"), "Service": format!("app-{i}-sidecar-proxy"), "Port": 21000,
            "Proxy": {"DestinationServiceName": format!("app-{i}"), "Upstreams": [
                {"DestinationName": "api", "Datacenter": "dc2", "LocalBindPort": 9000, "MeshGateway": {"Mode": "remote"}}]}}});
        let (client, url) = (client.clone(), format!("{}/v1/catalog/register", dc1.http));
        tasks.spawn(async move { put(&client, url, body).await });
        if tasks.len() >= 64 {
            tasks.join_next().await;
        }
    }
    while tasks.join_next().await.is_some() {}

    let (mut fleet, synced) = MarkerFleet::connect(&dc1.grpc, n, CONNECTING).await;
    println!(
        "  {n} proxies in dc1, each with api in dc2 as its upstream (through dc2's mesh gateways): all streams synced in {}",
        ms(synced)
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut lat = Vec::new();
    let mut cpu = [Duration::ZERO; 2];
    for round in 1..=rounds {
        let register = put(
            client,
            format!("{}/v1/catalog/register", dc2.http),
            gateway(round, &marker_address(round)),
        );
        let pids = [dc1.child.id(), dc2.child.id()];
        fleet.round(round, register, &pids, &mut lat, &mut cpu).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let [cpu1, cpu2] = cpu;
    lat.sort();
    println!(
        "  a mesh gateway registered in dc2 -> every dc1 stream has it in its load assignment ({n} streams x {rounds} rounds): p50 {}  p99 {}  max {}   [target p99 <= 200 ms]",
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        ms(*lat.last().unwrap())
    );
    println!(
        "  server CPU per change: dc1 {} (rebuild and push to {n} streams), dc2 {} (its write, its state recomputed and sent)",
        ms(cpu1 / rounds as u32),
        ms(cpu2 / rounds as u32)
    );
}
