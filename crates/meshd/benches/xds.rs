//! xDS propagation benchmark (prints figures; asserts nothing). PERFORMANCE.md P1 and P3.
//!
//! A real `meshd server` process; N synthetic proxies, each a distinct sidecar registered in
//! the catalog with 10 upstreams drawn from 100 services, each holding an ADS stream (delta or
//! state of the world) that ACKs like Envoy. One service's endpoints change; every affected
//! stream's receipt of the new load assignment is timestamped. Printed: latency p50/p99/max,
//! bytes received, server CPU and RSS (and per proxy), and the ratio to a floor measured in
//! the same run: as many streams as were affected receiving pre-encoded identical bytes from
//! a minimal ADS server that does no snapshot or diff work, over as many rounds at the same
//! pace (so both p99s come from the same number of samples).
//!
//! Run: `cargo xtask bench xds`. Scale with `PROXIES=` (1000), `ROUNDS=` (10), `MODE=delta|sotw`;
//! it runs with default chains and then with L7 chains on every upstream (`L7=0` or `L7=1`
//! runs one of them). `ACL=1` runs the server with ACLs on (default deny): every proxy
//! presents its own token (a service identity), authorized on each snapshot. `STATUS=off`
//! runs it without the per-stream sync status (to measure its cost); otherwise a CSDS dump of
//! every proxy is timed too.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::Any;

use serde_json::json;
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use test_support::ads::{ENDPOINT, delta_proxy, proc_stat, sotw_proxy};
use test_support::figures::{env_usize, ms, percentile};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

/// Streams connecting at once (Envoys do not all dial in the same millisecond; 5,000
/// simultaneous handshakes overflow the accept queue of a 2-core host).
const CONNECTING: usize = 256;
const SERVICES: usize = 100;
const UPSTREAMS: usize = 10;

struct Server {
    child: Child,
    http: String,
    grpc: String,
    store: test_support::figures::BenchStore,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The management token of an `ACL=1` run.
const MANAGEMENT: &str = "6e1d0c2b-3a4f-4b5c-8d7e-0f1a2b3c4d5e";

fn start_server(acl: bool) -> Server {
    let store = test_support::figures::BenchStore::from_env();
    let mut args = store.args();
    args.extend(["-log-level".to_owned(), "error".to_owned()]);
    // Room for every stream (the default admits 20,000).
    let proxies = env_usize("PROXIES", 1000);
    args.extend(["-xds-max-streams".to_owned(), (proxies + 1000).max(20_000).to_string()]);
    // STATUS=off: without the per-stream sync status, to measure what tracking costs.
    if std::env::var("STATUS").is_ok_and(|s| s == "off") {
        args.push("-xds-status-tracking=false".to_owned());
    }
    if acl {
        let file = std::env::temp_dir().join(format!("meshd-bench-{}.token", std::process::id()));
        std::fs::write(&file, MANAGEMENT).unwrap();
        args.extend(
            [
                "-acl-enabled",
                "-acl-default-policy",
                "deny",
                "-acl-initial-management-token-file",
            ]
            .map(str::to_owned),
        );
        args.push(file.to_string_lossy().into_owned());
    }
    let test_support::process::ServerProcess { child, http, grpc, .. } =
        test_support::process::start_server(std::path::Path::new(env!("CARGO_BIN_EXE_meshd")), args);
    Server {
        child,
        http,
        grpc,
        store,
    }
}

fn svc(i: usize) -> String {
    format!("svc-{i:03}")
}

/// The floor: an ADS server that sends pre-encoded identical bytes to every stream on a
/// trigger, doing no snapshot or diff work.
#[derive(Clone)]
struct Floor {
    trigger: broadcast::Sender<Arc<DeltaDiscoveryResponse>>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Floor {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, tonic::Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, tonic::Status>>;
    async fn stream_aggregated_resources(
        &self,
        _r: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::StreamAggregatedResourcesStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("floor is delta only"))
    }
    async fn delta_aggregated_resources(
        &self,
        r: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::DeltaAggregatedResourcesStream>, tonic::Status> {
        let mut requests = r.into_inner();
        let mut trigger = self.trigger.subscribe();
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    req = requests.message() => if !matches!(req, Ok(Some(_))) { return },
                    msg = trigger.recv() => match msg {
                        Ok(m) => if tx.send(Ok((*m).clone())).await.is_err() { return },
                        Err(_) => return,
                    },
                }
            }
        });
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }
}

/// The floor over `rounds` pushes, paced like the meshd rounds: every receipt's latency.
async fn floor_run(n: usize, payload_bytes: usize, rounds: usize) -> Vec<Duration> {
    let (_, rss_before) = proc_stat(std::process::id());
    let (trigger, _) = broadcast::channel(4);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let floor = Floor {
        trigger: trigger.clone(),
    };
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(AggregatedDiscoveryServiceServer::new(floor))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
    });
    let (report, mut reports) = mpsc::unbounded_channel();
    let gate = Arc::new(tokio::sync::Semaphore::new(CONNECTING));
    for i in 0..n {
        let report = report.clone();
        let permit = Arc::clone(&gate).acquire_owned().await.unwrap();
        tokio::spawn(async move {
            let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
                .await
                .unwrap();
            let (tx, rx) = mpsc::channel(4);
            tx.send(DeltaDiscoveryRequest {
                node: Some(Node {
                    id: format!("floor-{i}"),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .unwrap();
            let mut stream = client
                .delta_aggregated_resources(ReceiverStream::new(rx))
                .await
                .unwrap()
                .into_inner();
            drop(permit);
            let _ = report.send(Instant::now()); // connected
            while let Ok(Some(_)) = stream.message().await {
                let _ = report.send(Instant::now());
            }
            drop(tx);
        });
    }
    for _ in 0..n {
        reports.recv().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // What a bare gRPC stream costs here (client and server side together, both in this
    // process): the transport share of the server's per-proxy figure is at most this.
    let (_, rss_after) = proc_stat(std::process::id());
    println!(
        "  floor transport: {:.1} KiB per stream (client + server side of one ADS stream on its own HTTP/2 connection)",
        rss_after.saturating_sub(rss_before) as f64 / n as f64
    );
    let msg = Arc::new(DeltaDiscoveryResponse {
        type_url: ENDPOINT.into(),
        resources: vec![Resource {
            name: "floor".into(),
            version: "1".into(),
            resource: Some(Any {
                type_url: ENDPOINT.into(),
                value: vec![7u8; payload_bytes],
            }),
            ..Default::default()
        }],
        nonce: "1".into(),
        ..Default::default()
    });
    let mut lat = Vec::with_capacity(n * rounds);
    for _ in 0..rounds {
        let t0 = Instant::now();
        trigger.send(Arc::clone(&msg)).unwrap();
        for _ in 0..n {
            lat.push(reports.recv().await.unwrap() - t0);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lat.sort();
    lat
}

/// L7 chains for every service: http, a resolver with three subsets (v1 default, failing
/// over to v2), a splitter over them and a router with 20 routes.
async fn write_l7_entries(http: &reqwest::Client, server: &str) {
    for s in 0..SERVICES {
        let name = svc(s);
        let routes: Vec<_> = (0..20)
            .map(|r| {
                let subset = ["v1", "v2", "v3"][r % 3];
                json!({"Match": {"HTTP": {"PathPrefix": format!("/r{r}"), "Header": [{"Name": "x-user", "Regex": "^u[0-9]+$"}]}},
                       "Destination": {"ServiceSubset": subset, "NumRetries": 2, "RetryOnStatusCodes": [503]}})
            })
            .collect();
        for entry in [
            json!({"Kind": "service-defaults", "Name": name, "Protocol": "http"}),
            json!({"Kind": "service-resolver", "Name": name, "DefaultSubset": "v1",
                "Subsets": {"v1": {"Filter": "Service.Meta.version == v1"}, "v2": {"Filter": "Service.Meta.version == v2"},
                            "v3": {"Filter": "Service.Meta.version == v3"}},
                "Failover": {"v1": {"ServiceSubset": "v2"}}}),
            json!({"Kind": "service-splitter", "Name": name, "Splits": [
                {"Weight": 50, "ServiceSubset": "v1"}, {"Weight": 30, "ServiceSubset": "v2"}, {"Weight": 20, "ServiceSubset": "v3"}]}),
            json!({"Kind": "service-router", "Name": name, "Routes": routes}),
        ] {
            http.put(format!("{server}/v1/config"))
                .json(&entry)
                .send()
                .await
                .unwrap()
                .error_for_status()
                .unwrap();
        }
    }
}

/// Times dry runs of a splitter change (50/30/20 -> 10/30/60) of one service on the whole
/// mesh: the answer lists every proxy with that upstream (`affected`), each with the
/// weights that would change; nothing is written.
async fn dry_runs(http: &reqwest::Client, server: &str, affected: usize) {
    let rounds = env_usize("DRY_RUNS", 10);
    let mut lat = Vec::new();
    let mut listed = Vec::new();
    for round in 0..rounds {
        let name = svc((round * 37) % SERVICES);
        let change = json!({"Kind": "service-splitter", "Name": name, "Splits": [
            {"Weight": 10, "ServiceSubset": "v1"}, {"Weight": 30, "ServiceSubset": "v2"}, {"Weight": 60, "ServiceSubset": "v3"}]});
        let t0 = Instant::now();
        let answer: serde_json::Value = http
            .put(format!("{server}/v1/config?dry-run&per-page=1000"))
            .json(&change)
            .send()
            .await
            .unwrap()
            .error_for_status()
            .unwrap()
            .json()
            .await
            .unwrap();
        lat.push(t0.elapsed());
        listed.push(answer["Proxies"]["Total"].as_u64().unwrap_or(0) as usize);
    }
    lat.sort();
    let exact = listed.iter().all(|l| *l == affected);
    println!(
        "  dry run of a splitter change on the whole mesh ({rounds} runs; {affected} proxies have the upstream, listed: {}): p50 {}  p99 {}   [target <= 500 ms at 1,000]",
        if exact {
            "all, each run".to_owned()
        } else {
            format!("{listed:?}")
        },
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99))
    );
}

/// Times CSDS dumps of every connected proxy over gRPC: the whole call, and apart from it
/// the server's build of the answer, written straight into its encoded bytes (its
/// `server-timing` metadata), and the client's decoding (timed here on the same bytes); what
/// remains is the transfer.
async fn csds_dump(server: &Server, n: usize) {
    use envoy_types::pb::envoy::service::status::v3::ClientStatusRequest;
    use envoy_types::pb::envoy::service::status::v3::client_status_discovery_service_client::ClientStatusDiscoveryServiceClient;
    use prost::Message;
    if std::env::var("STATUS").is_ok_and(|s| s == "off") {
        return;
    }
    // tonic's defaults (hyper's fixed HTTP/2 windows: 2 MiB a stream, 5 MiB the connection),
    // and a client whose windows grow with the bandwidth-delay product, as grpc-go's
    // (grpcurl's) do.
    let url = format!("http://{}", server.grpc);
    let plain = tonic::transport::Endpoint::from_shared(url.clone()).unwrap();
    let adaptive = tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .http2_adaptive_window(true);
    let runs = [
        (plain.clone(), true, "default windows"),
        (plain, false, "default windows"),
        (adaptive.clone(), true, "adaptive window"),
        (adaptive, false, "adaptive window"),
    ];
    for (endpoint, exclude, windows) in runs {
        let mut client = ClientStatusDiscoveryServiceClient::new(endpoint.connect().await.unwrap())
            .max_decoding_message_size(usize::MAX);
        let mut times = Vec::new();
        let (mut builds, mut decodes) = (Vec::new(), Vec::new());
        let mut size = (0, 0, 0);
        for _ in 0..10 {
            let t0 = Instant::now();
            let answer = client
                .fetch_client_status(ClientStatusRequest {
                    exclude_resource_contents: exclude,
                    ..Default::default()
                })
                .await
                .unwrap();
            times.push(t0.elapsed());
            let build = answer
                .metadata()
                .get("server-timing")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("build;dur="))
                .and_then(|ms| ms.parse::<f64>().ok())
                .expect("the server's build time");
            builds.push(Duration::from_secs_f64(build / 1000.0));
            let resp = answer.into_inner();
            let bytes = resp.encode_to_vec();
            let t2 = Instant::now();
            let again = envoy_types::pb::envoy::service::status::v3::ClientStatusResponse::decode(bytes.as_slice());
            decodes.push(t2.elapsed());
            assert!(again.is_ok());
            size = (
                resp.config.len(),
                resp.config.iter().map(|c| c.generic_xds_configs.len()).sum::<usize>(),
                bytes.len(),
            );
        }
        let first = times[0];
        for t in [&mut times, &mut builds, &mut decodes] {
            t.sort();
        }
        println!(
            "  CSDS dump of every proxy ({} of {n} streams, {} resources{}, client with {windows}): p50 {}  p90 {}  max {}  first {}   [target <= 50 ms at 1,000]",
            size.0,
            size.1,
            if exclude {
                ", contents excluded"
            } else {
                ", with contents"
            },
            ms(percentile(&times, 0.5)),
            ms(percentile(&times, 0.9)),
            ms(*times.last().unwrap()),
            ms(first)
        );
        println!(
            "    of which (p50): server build and encoding {}, client decoding {}; the rest is transfer ({:.1} MB)",
            ms(percentile(&builds, 0.5)),
            ms(percentile(&decodes, 0.5)),
            size.2 as f64 / 1e6
        );
    }
}

#[tokio::main(worker_threads = 2)]
async fn main() {
    // Both shapes unless L7=0 or L7=1 picks one: default chains, then L7 chains on every
    // upstream (router, splitter, resolver with subsets and failover).
    // KNOBS=1: L7 chains and HTTP services, plain and then with the production knobs on every
    // proxy (access logs, a Lua extension on every upstream listener, a JWT requirement on
    // every public listener), compared.
    if std::env::var("TRANSPARENT").is_ok_and(|t| t == "1") {
        run_transparent().await;
        return;
    }
    if std::env::var("KNOBS").is_ok_and(|k| k == "1") {
        let (plain_p99, plain_kib) = run(true, false).await;
        let (knobs_p99, knobs_kib) = run(true, true).await;
        let pct = |a: f64, b: f64| (b / a.max(1e-9) - 1.0) * 100.0;
        println!(
            "knobs (access logs + Lua + JWT) against plain (every service HTTP), same bench run: p99 {} -> {} ({:+.1} %), {:.1} -> {:.1} KiB per proxy ({:+.1} %)   [target within 15 %]",
            ms(plain_p99),
            ms(knobs_p99),
            pct(plain_p99.as_secs_f64(), knobs_p99.as_secs_f64()),
            plain_kib,
            knobs_kib,
            pct(plain_kib, knobs_kib)
        );
        return;
    }
    match std::env::var("L7").ok().as_deref() {
        Some("0") => drop(run(false, false).await),
        Some(_) => drop(run(true, false).await),
        None => {
            run(false, false).await;
            run(true, false).await;
        }
    }
}

/// The KNOBS=1 comparison's entries: every service speaks HTTP (both runs, so the public
/// listeners compared are HTTP ones); with `on`, access logs and a Lua extension on every
/// proxy (its upstream listeners) and a JWT requirement on every service (a provider with
/// inline keys, required by a `*` intention), checked by each public listener.
async fn write_knobs(http: &reqwest::Client, server: &str, on: bool) {
    let mut entries = vec![json!({"Kind": "proxy-defaults", "Name": "global", "Config": {"protocol": "http"}})];
    if on {
        // An RSA public key (RS256) as a JWKS, base64.
        let jwks = r#"{"keys":[{"kty":"RSA","alg":"RS256","kid":"bench","use":"sig","e":"AQAB","n":"yhraljK3lGcV5nu1gw0Sm09DgnByDTzUmSU4u7MQo1lwgU9TxKnkZoeR9JpuUWTbCsJbobCR5S0JH-n0nX1QricDud96dqgocnByVLaNvIIX6QXY3PVrHRhdReY4T5_0zLxjRjhX64-G5qGAW3cxtbrdhqcZRy72meK3QIpwIXnq4NMr5E40O2wgdGCOm6h0ZEJS5TV00TDMBG4FzsJVXJnfy5Ub_clXi-ui74viiHyfbiPAcXG1sBDsKkHpNUsDPYEIJ4ELdLrzOg7EFhaH2XDZmbZIirk9tqod2c_xsdU9I0X3aofaTHogBCFp7f3qvcIg3HVnuAcc13xnGt8tyQ"}]}"#;
        use base64::Engine;
        entries = vec![
            json!({"Kind": "proxy-defaults", "Name": "global", "Config": {"protocol": "http"},
                "AccessLogs": {"Enabled": true, "Type": "file", "Path": "/dev/null"},
                "EnvoyExtensions": [{"Name": "builtin/lua", "Arguments": {"Listener": "outbound",
                    "Script": "function envoy_on_request(h) h:headers():add('x-bench', '1') end"}}]}),
            json!({"Kind": "jwt-provider", "Name": "bench", "Issuer": "https://issuer.bench",
                "JSONWebKeySet": {"Local": {"JWKS": base64::engine::general_purpose::STANDARD.encode(jwks)}}}),
            json!({"Kind": "service-intentions", "Name": "*",
                "JWT": {"Providers": [{"Name": "bench", "VerifyClaims": [{"Path": ["role"], "Value": "app"}]}]},
                "Sources": [{"Name": "*", "Action": "allow"}]}),
        ];
    }
    for entry in entries {
        http.put(format!("{server}/v1/config"))
            .json(&entry)
            .send()
            .await
            .unwrap()
            .error_for_status()
            .unwrap();
    }
}

/// One run; returns the propagation p99 and the server's KiB per connected proxy.
async fn run(l7: bool, knobs: bool) -> (Duration, f64) {
    let n = env_usize("PROXIES", 1000);
    // Both ends of every stream are files of this machine: the load generator's and the
    // server's (which inherits the limit set here).
    match test_support::ads::raise_open_files(2 * n as u64 + 4096) {
        Ok(limit) if n > 10_000 => println!("  open-files limit of the load generator and the server: {limit}"),
        Ok(_) => {}
        Err(why) => {
            // Both ends of every connection are files here: as many connections as the
            // limit holds, the streams shared among them (each Envoy has its own).
            let limit = test_support::ads::raise_open_files(0).unwrap_or(1024);
            let connections = (limit.saturating_sub(4096) / 2).max(1) as usize;
            let per = n.div_ceil(connections);
            test_support::ads::share_connections(per);
            println!(
                "  {why}\n  so {per} streams share each HTTP/2 connection ({} connections): the server pays every per-stream cost, its per-connection ones once per {per} streams",
                n.div_ceil(per)
            );
        }
    }
    let rounds = env_usize("ROUNDS", 10);
    let sotw = std::env::var("MODE").is_ok_and(|m| m == "sotw");
    let acl = std::env::var("ACL").is_ok_and(|a| a == "1");
    let server = start_server(acl);
    // With ACLs every write carries the management token (harmless without).
    let http = reqwest::Client::builder()
        .default_headers(
            [(
                reqwest::header::HeaderName::from_static("x-consul-token"),
                reqwest::header::HeaderValue::from_static(MANAGEMENT),
            )]
            .into_iter()
            .collect(),
        )
        .build()
        .unwrap();
    let put = |body: serde_json::Value| {
        let req = http.put(format!("{}/v1/catalog/register", server.http)).json(&body);
        async move { req.send().await.unwrap().error_for_status().unwrap() }
    };
    if l7 {
        write_l7_entries(&http, &server.http).await;
    }
    if std::env::var("KNOBS").is_ok_and(|k| k == "1") {
        write_knobs(&http, &server.http, knobs).await;
    }
    // One sidecar instance per service (version v1), then the N proxies.
    for s in 0..SERVICES {
        put(
            json!({"Node": format!("svc-node-{s}"), "Address": "10.100.0.1", "Service": {"Kind": "connect-proxy",
            "ID": format!("{}-sidecar-proxy", svc(s)), "Service": format!("{}-sidecar-proxy", svc(s)), "Port": 21000,
            "Meta": {"version": "v1"}, "Proxy": {"DestinationServiceName": svc(s)}}}),
        )
        .await;
    }
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let upstreams: Vec<_> = (0..UPSTREAMS)
            .map(|j| json!({"DestinationName": svc((i + j * (SERVICES / UPSTREAMS)) % SERVICES), "LocalBindPort": 9000 + j}))
            .collect();
        let body = json!({"Node": format!("node-{i}"), "Address": "10.0.0.1", "Service": {"Kind": "connect-proxy",
            "ID": format!("app-{i}-sidecar-proxy"), "Service": format!("app-{i}-sidecar-proxy"), "Port": 21000,
            "Proxy": {"DestinationServiceName": format!("app-{i}"), "Upstreams": upstreams}}});
        let req = http.put(format!("{}/v1/catalog/register", server.http)).json(&body);
        tasks.spawn(async move { req.send().await.unwrap().error_for_status().unwrap() });
        if tasks.len() >= 64 {
            tasks.join_next().await;
        }
    }
    while tasks.join_next().await.is_some() {}
    // With ACLs: one token per proxy, its service identity.
    let mut tokens: Vec<Option<structs::Token>> = vec![None; n];
    if acl {
        let mut made = tokio::task::JoinSet::new();
        for i in 0..n {
            let req = http
                .put(format!("{}/v1/acl/token", server.http))
                .json(&json!({"ServiceIdentities": [{"ServiceName": format!("app-{i}")}]}));
            made.spawn(async move {
                let t: serde_json::Value = req
                    .send()
                    .await
                    .unwrap()
                    .error_for_status()
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                (i, structs::Token::new(t["SecretID"].as_str().unwrap()))
            });
            if made.len() >= 64
                && let Some(Ok((i, t))) = made.join_next().await
            {
                tokens[i] = t;
            }
        }
        while let Some(Ok((i, t))) = made.join_next().await {
            tokens[i] = t;
        }
    }
    let (_, rss_idle) = proc_stat(server.child.id());

    let marker = Arc::new(AtomicU64::new(0));
    let (report, mut reports) = mpsc::unbounded_channel();
    let (ready, mut readies) = mpsc::unbounded_channel();
    let start = Instant::now();
    let gate = Arc::new(tokio::sync::Semaphore::new(CONNECTING));
    for (i, token) in tokens.into_iter().enumerate() {
        let (grpc, marker, report, ready) = (server.grpc.clone(), Arc::clone(&marker), report.clone(), ready.clone());
        let permit = Arc::clone(&gate).acquire_owned().await.unwrap();
        if sotw {
            tokio::spawn(sotw_proxy(grpc, i, marker, report, ready, permit, token));
        } else {
            tokio::spawn(delta_proxy(grpc, i, marker, report, ready, permit, token));
        }
    }
    for _ in 0..n {
        readies.recv().await.unwrap();
    }
    let synced = start.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (cpu_steady, rss_steady) = proc_stat(server.child.id());

    println!(
        "xds propagation benchmark ({} ADS{}{}, {}, real meshd server process, {}, 2 cores shared with the load generator)",
        if sotw { "state-of-the-world" } else { "delta" },
        if acl { ", ACLs on (a token per proxy)" } else { "" },
        if knobs {
            ", access logs + Lua + JWT on every proxy"
        } else {
            ""
        },
        if l7 {
            "L7 chains on every upstream: router with 20 routes, splitter, resolver with 3 subsets + failover"
        } else {
            "default chains"
        },
        server.store.describe()
    );
    println!(
        "  proxies: {n}, upstreams each: {UPSTREAMS}, services: {SERVICES}; all streams synced (clusters + endpoints) in {}",
        ms(synced)
    );
    println!(
        "  server RSS: {:.1} MiB before streams, {:.1} MiB with {n} streams = {:.1} KiB per connected proxy   [target <= 100 KiB; <= 64 KiB at 50,000]",
        rss_idle as f64 / 1024.0,
        rss_steady as f64 / 1024.0,
        rss_steady.saturating_sub(rss_idle) as f64 / n as f64
    );
    // Idle: every stream synced, nothing changing.
    // CPU time comes in 10 ms ticks: the window must be long enough to tell 1 % apart.
    let idle_window = Duration::from_secs(env_usize("IDLE_S", 10) as u64);
    let (cpu_a, _) = proc_stat(server.child.id());
    tokio::time::sleep(idle_window).await;
    let (cpu_b, _) = proc_stat(server.child.id());
    println!(
        "  server CPU idle with {n} streams and no change: {:.2} % of one core over {} s   [target <= 1 %]",
        cpu_b.saturating_sub(cpu_a).as_secs_f64() / idle_window.as_secs_f64() * 100.0,
        idle_window.as_secs()
    );

    let affected = n * UPSTREAMS / SERVICES;
    let mut lat = Vec::new();
    let mut put_lat = Vec::new();
    let mut bytes = 0usize;
    let mut cpu_total = Duration::ZERO;
    for round in 1..=rounds {
        let s = (round * 37) % SERVICES;
        marker.store(round as u64, Ordering::Release);
        let (cpu0, _) = proc_stat(server.child.id());
        let t0 = Instant::now();
        put(json!({"Node": format!("extra-{round}"), "Address": format!("10.200.{}.{}", round / 250, round % 250), "Service": {"Kind": "connect-proxy",
            "ID": format!("{}-sidecar-proxy-{round}", svc(s)), "Service": format!("{}-sidecar-proxy", svc(s)), "Port": 21000,
            "Meta": {"version": "v1"}, "Proxy": {"DestinationServiceName": svc(s)}}}))
        .await;
        put_lat.push(t0.elapsed());
        let mut got = std::collections::BTreeSet::new();
        while got.len() < affected {
            match tokio::time::timeout(Duration::from_secs(10), reports.recv()).await {
                Ok(Some((at, b, idx))) => {
                    lat.push(at - t0);
                    bytes += b;
                    got.insert(idx);
                }
                _ => {
                    let missing: Vec<String> = (0..n)
                        .filter(|i| (0..UPSTREAMS).any(|j| (i + j * (SERVICES / UPSTREAMS)) % SERVICES == s))
                        .filter(|i| !got.contains(i))
                        .map(|i| format!("app-{i}-sidecar-proxy"))
                        .collect();
                    println!(
                        "  round {round}: only {} of {affected} affected streams received the change to {} within 10 s; missing: {}",
                        got.len(),
                        svc(s),
                        missing.join(" ")
                    );
                    break;
                }
            }
        }
        cpu_total += proc_stat(server.child.id()).0 - cpu0;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lat.sort();
    let p99 = percentile(&lat, 0.99);
    println!(
        "  endpoint change -> affected stream has the new load assignment ({affected} streams x {rounds} rounds): p50 {}  p99 {}  max {}   [target p99 <= 100 ms at 1,000; <= 1 s at 5,000 and 50,000]",
        ms(percentile(&lat, 0.5)),
        ms(p99),
        ms(*lat.last().unwrap())
    );
    println!(
        "  of which the write itself (HTTP register until its durable response): {}",
        test_support::figures::latency_summary(&mut put_lat)
    );
    println!(
        "  bytes received per affected stream per change: {}; server CPU per change: {} ({:.1} µs per affected stream); server CPU over the whole run {:.2} s",
        bytes / lat.len().max(1),
        ms(cpu_total / rounds as u32),
        cpu_total.as_secs_f64() * 1e6 / (rounds * affected) as f64,
        cpu_steady.as_secs_f64()
    );
    csds_dump(&server, n).await;
    if l7 {
        dry_runs(&http, &server.http, affected).await;
    }
    let floor = floor_run(affected, bytes / lat.len().max(1), rounds).await;
    let floor_p99 = percentile(&floor, 0.99);
    println!(
        "  floor (pre-encoded identical bytes to {affected} streams, {rounds} rounds): p50 {}  p99 {}; meshd p99 / floor p99 = {:.1}x   [target <= 3x]",
        ms(percentile(&floor, 0.5)),
        ms(floor_p99),
        p99.as_secs_f64() / floor_p99.as_secs_f64().max(1e-9)
    );
    (p99, rss_steady.saturating_sub(rss_idle) as f64 / n as f64)
}

/// `TRANSPARENT=1`: N transparent proxies (no declared upstream) among 100 services, each
/// reaching `REACHABLE` (10) of them by a `*` allow intention on each (its implicit
/// upstreams); each round
/// writes one allow intention to a service nobody could reach yet, which adds an implicit
/// upstream to every proxy, and times until each stream has the new upstream's load
/// assignment (its cluster pushed, subscribed to, and its endpoints sent).
async fn run_transparent() {
    let n = env_usize("PROXIES", 1000);
    let rounds = env_usize("ROUNDS", 10);
    let reachable = env_usize("REACHABLE", UPSTREAMS).min(SERVICES);
    let _ = test_support::ads::raise_open_files(2 * n as u64 + 4096);
    let server = start_server(false);
    let http = reqwest::Client::new();
    let put = |path: &str, body: serde_json::Value| {
        let req = http.put(format!("{}{path}", server.http)).json(&body);
        async move { req.send().await.unwrap().error_for_status().unwrap() }
    };
    // Every service reachable, and the round's services (registered now) not yet: a
    // wildcard deny, an allow from everyone on each reachable service.
    put(
        "/v1/config",
        json!({"Kind": "service-intentions", "Name": "*", "Sources": [{"Name": "*", "Action": "deny"}]}),
    )
    .await;
    let names: Vec<String> = (0..SERVICES)
        .map(svc)
        .chain((1..=rounds).map(|r| format!("late-{r:03}")))
        .collect();
    for (s, name) in names.iter().enumerate() {
        if s < reachable {
            put(
                "/v1/config",
                json!({"Kind": "service-intentions", "Name": name, "Sources": [{"Name": "*", "Action": "allow"}]}),
            )
            .await;
        }
        // A round's service has its instance at the round's marker address.
        let address = if s < SERVICES {
            "10.100.0.1".to_owned()
        } else {
            test_support::ads::marker_address((s - SERVICES + 1) as u64)
        };
        for service in [
            json!({"ID": name, "Service": name, "Port": 8080}),
            json!({"Kind": "connect-proxy",
            "ID": format!("{name}-sidecar-proxy"), "Service": format!("{name}-sidecar-proxy"), "Port": 21000,
            "Proxy": {"DestinationServiceName": name, "Mode": "transparent"}}),
        ] {
            put(
                "/v1/catalog/register",
                json!({"Node": format!("{name}-node"), "Address": address, "Service": service}),
            )
            .await;
        }
    }
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let body = json!({"Node": format!("node-{i}"), "Address": "10.0.0.1", "Service": {"Kind": "connect-proxy",
            "ID": format!("app-{i}-sidecar-proxy"), "Service": format!("app-{i}-sidecar-proxy"), "Port": 21000,
            "Proxy": {"DestinationServiceName": format!("app-{i}"), "Mode": "transparent"}}});
        tasks.spawn(put("/v1/catalog/register", body));
        if tasks.len() >= 64 {
            tasks.join_next().await;
        }
    }
    while tasks.join_next().await.is_some() {}
    let (_, rss_idle) = proc_stat(server.child.id());
    let marker = Arc::new(AtomicU64::new(0));
    let (report, mut reports) = mpsc::unbounded_channel();
    let (ready, mut readies) = mpsc::unbounded_channel();
    let start = Instant::now();
    let gate = Arc::new(tokio::sync::Semaphore::new(CONNECTING));
    for i in 0..n {
        let (grpc, marker, report, ready) = (server.grpc.clone(), Arc::clone(&marker), report.clone(), ready.clone());
        let permit = Arc::clone(&gate).acquire_owned().await.unwrap();
        tokio::spawn(delta_proxy(grpc, i, marker, report, ready, permit, None));
    }
    for _ in 0..n {
        readies.recv().await.unwrap();
    }
    let synced = start.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, rss_steady) = proc_stat(server.child.id());
    println!(
        "xds transparent-mode benchmark (delta ADS, real meshd server process, {}): {n} transparent proxies with {reachable} implicit upstreams each ({SERVICES} services), all synced in {}; {:.1} KiB per connected proxy",
        server.store.describe(),
        ms(synced),
        rss_steady.saturating_sub(rss_idle) as f64 / n as f64
    );
    let (lat, put_lat, cpu) = transparent_rounds(&server, &put, &marker, &mut reports, n, rounds).await;
    println!(
        "  allow intention -> every transparent proxy has the new implicit upstream's load assignment ({n} streams x {rounds} rounds): first {}  p50 {}  p99 {}  max {}   [target p99 <= 200 ms at 1,000]",
        ms(lat[0]),
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        ms(*lat.last().unwrap())
    );
    println!(
        "  of which the write itself (the intention's PUT until its durable response): {}; server CPU per change {} ({:.1} µs per proxy)",
        test_support::figures::latency_summary(&mut put_lat.clone()),
        ms(cpu / rounds as u32),
        cpu.as_secs_f64() * 1e6 / (rounds * n) as f64
    );
}

/// The rounds of [`run_transparent`]: the sorted latencies, the writes' latencies, the
/// server's CPU over the rounds.
async fn transparent_rounds<F, Fut>(
    server: &Server,
    put: &F,
    marker: &AtomicU64,
    reports: &mut mpsc::UnboundedReceiver<(Instant, usize, usize)>,
    n: usize,
    rounds: usize,
) -> (Vec<Duration>, Vec<Duration>, Duration)
where
    F: Fn(&str, serde_json::Value) -> Fut,
    Fut: std::future::Future<Output = reqwest::Response>,
{
    let (mut lat, mut put_lat, mut cpu) = (Vec::new(), Vec::new(), Duration::ZERO);
    for round in 1..=rounds {
        marker.store(round as u64, Ordering::Release);
        let (cpu0, _) = proc_stat(server.child.id());
        let t0 = Instant::now();
        put(
            "/v1/config",
            json!({"Kind": "service-intentions", "Name": format!("late-{round:03}"),
            "Sources": [{"Name": "*", "Action": "allow"}]}),
        )
        .await;
        put_lat.push(t0.elapsed());
        let mut got = std::collections::BTreeSet::new();
        while got.len() < n {
            match tokio::time::timeout(Duration::from_secs(10), reports.recv()).await {
                Ok(Some((at, _, idx))) => {
                    if got.insert(idx) {
                        lat.push(at - t0);
                    }
                }
                _ => {
                    println!(
                        "  round {round}: only {} of {n} streams received the new upstream within 10 s",
                        got.len()
                    );
                    break;
                }
            }
        }
        cpu += proc_stat(server.child.id()).0 - cpu0;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lat.sort();
    (lat, put_lat, cpu)
}
