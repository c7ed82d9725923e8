//! A synthetic Envoy for benchmarks: a delta ADS stream that subscribes and ACKs as Envoy
//! does and reports when a marker address reaches it; and a process's CPU time and RSS.

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest, Resource};
use prost::Message;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use structs::Token;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// A stream request carrying `token`, if any, as `x-consul-token`.
fn with_token<T>(stream: T, token: Option<&Token>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(stream);
    if let Some(v) = token.and_then(|t| t.secret().parse().ok()) {
        req.metadata_mut().insert(structs::wire::TOKEN_HEADER, v);
    }
    req
}

/// Cluster type URL.
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Load assignment type URL.
pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// The address a benchmark round `marker` registers (`10.200.x.y`).
pub fn marker_address(marker: u64) -> String {
    format!("10.200.{}.{}", marker / 250, marker % 250)
}

/// Streams per loopback source address: past this many, stream `idx` dials from
/// `127.0.0.(1 + idx / STREAMS_PER_SOURCE)`, so that tens of thousands of streams do not
/// run out of the ephemeral ports of one address (about 28,000 on Linux).
pub const STREAMS_PER_SOURCE: usize = 20_000;

/// Streams that share one HTTP/2 connection (1 unless [`share_connections`] said more).
static STREAMS_PER_CONNECTION: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

/// The shared connections, by server and connection number, when streams share them.
type SharedChannels = std::collections::HashMap<(String, usize), tonic::transport::Channel>;
static SHARED: std::sync::LazyLock<parking_lot::Mutex<SharedChannels>> = std::sync::LazyLock::new(Default::default);

/// Makes every `k` consecutive proxies share one HTTP/2 connection to the server, as they
/// would not (each Envoy dials its own): for a machine whose open-files limit cannot hold
/// one connection per stream on both ends. The server's per-stream costs are all still
/// paid; its per-connection ones are paid once per `k` streams.
pub fn share_connections(k: usize) {
    STREAMS_PER_CONNECTION.store(k.max(1), Ordering::Relaxed);
}

/// Proxy `idx`'s ADS client, dialled from its loopback source address (see
/// [`STREAMS_PER_SOURCE`]), on a connection of its own unless [`share_connections`] asked.
async fn connect(grpc: &str, idx: usize) -> AggregatedDiscoveryServiceClient<tonic::transport::Channel> {
    let per_connection = STREAMS_PER_CONNECTION.load(Ordering::Relaxed);
    let mut endpoint = tonic::transport::Endpoint::from_shared(format!("http://{grpc}")).unwrap();
    let source = idx / per_connection / STREAMS_PER_SOURCE;
    if source > 0 {
        let ip = std::net::Ipv4Addr::new(127, 0, 0, u8::try_from(1 + source).expect("at most 254 sources"));
        endpoint = endpoint.local_address(Some(ip.into()));
    }
    if per_connection == 1 {
        return AggregatedDiscoveryServiceClient::new(endpoint.connect().await.unwrap());
    }
    let channel = SHARED
        .lock()
        .entry((grpc.to_owned(), idx / per_connection))
        .or_insert_with(|| endpoint.connect_lazy())
        .clone();
    AggregatedDiscoveryServiceClient::new(channel)
}

/// The node of proxy `idx`'s first request, the size of Envoy's: Envoy names itself, its
/// build and locality, and lists every extension compiled in (about 300 in 1.40) and its
/// client features, about 40 KB the server decodes for every stream (`bench memory` sends
/// 60 KB, `NODE_KB`).
pub fn envoy_node(idx: usize) -> Node {
    use envoy_types::pb::envoy::config::core::v3::{BuildVersion, Extension, Locality, node::UserAgentVersionType};
    const CATEGORIES: [&str; 6] = [
        "envoy.filters.http",
        "envoy.filters.network",
        "envoy.filters.listener",
        "envoy.transport_sockets.upstream",
        "envoy.access_loggers",
        "envoy.tracers",
    ];
    let extensions = (0..300)
        .map(|i| {
            let category = CATEGORIES[i % CATEGORIES.len()];
            Extension {
                name: format!("{category}.extension_number_{i}"),
                category: category.to_owned(),
                type_urls: vec![format!("type.googleapis.com/envoy.extensions.filters.v3.Extension{i}")],
                ..Default::default()
            }
        })
        .collect();
    let id = format!("app-{idx}-sidecar-proxy");
    Node {
        cluster: id.trim_end_matches("-sidecar-proxy").to_owned(),
        id,
        user_agent_name: "envoy".into(),
        user_agent_version_type: Some(UserAgentVersionType::UserAgentBuildVersion(BuildVersion {
            version: Some(envoy_types::pb::envoy::r#type::v3::SemanticVersion {
                major_number: 1,
                minor_number: 40,
                patch: 0,
            }),
            ..Default::default()
        })),
        locality: Some(Locality {
            region: "bench".into(),
            zone: "bench-a".into(),
            ..Default::default()
        }),
        extensions,
        client_features: [
            "envoy.config.require-any-fields-contain-struct",
            "envoy.lb.does_not_support_overprovisioning",
            "envoy.lrs.supports_send_all_clusters",
            "fallback_to_protobuf_any",
            "xds.config.resource-in-sotw",
        ]
        .map(str::to_owned)
        .to_vec(),
        ..Default::default()
    }
}

/// Raises this process's open-files limit to at least `want` (soft and hard; beyond the hard
/// limit needs privilege), for a load generator holding that many connections; child
/// processes started after it (the server) inherit it. Returns the limit now, or why not.
pub fn raise_open_files(want: u64) -> Result<u64, String> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let now = getrlimit(Resource::Nofile);
    if now.current.is_none_or(|c| c >= want) {
        return Ok(now.current.unwrap_or(u64::MAX));
    }
    let maximum = now.maximum.map(|m| m.max(want));
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(want),
            maximum,
        },
    )
    .map_err(|e| {
        format!(
            "cannot raise the open-files limit to {want} (now {:?}, hard {:?}): {e}; raise it with `ulimit -n {want}` (as root or within the hard limit)",
            now.current, now.maximum
        )
    })?;
    Ok(want)
}

/// CPU time (user + system) and RSS (KiB) of process `pid`.
pub fn proc_stat(pid: u32) -> (Duration, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: u64 = f
        .get(11..13)
        .map(|x| x.iter().filter_map(|v| v.parse::<u64>().ok()).sum())
        .unwrap_or(0);
    (Duration::from_millis(ticks * 10), crate::figures::rss_kib(pid))
}

/// One synthetic proxy's delta stream: subscribe to clusters, then to their load
/// assignments, ACK everything, and report when a response carries the marker address.
pub async fn delta_proxy(
    grpc: String,
    idx: usize,
    marker: Arc<AtomicU64>,
    report: mpsc::UnboundedSender<(Instant, usize, usize)>,
    ready: mpsc::UnboundedSender<()>,
    gate: tokio::sync::OwnedSemaphorePermit,
    token: Option<Token>,
) {
    let mut client = connect(&grpc, idx).await;
    let (tx, rx) = mpsc::channel(16);
    let node = Some(envoy_node(idx));
    tx.send(DeltaDiscoveryRequest {
        node,
        type_url: CLUSTER.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut stream = client
        .delta_aggregated_resources(with_token(ReceiverStream::new(rx), token.as_ref()))
        .await
        .unwrap()
        .into_inner();
    let mut subscribed = std::collections::HashSet::new();
    let mut told_ready = false;
    let mut gate = Some(gate);
    let mut reported = 0;
    while let Ok(Some(resp)) = stream.message().await {
        let bytes = resp.encoded_len();
        let ack = DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            ..Default::default()
        };
        if tx.send(ack).await.is_err() {
            return;
        }
        if resp.type_url == CLUSTER {
            // Like Envoy: every cluster that appears gets its load assignment subscribed (a
            // proxy's first snapshot may not have every upstream yet).
            let names: Vec<String> = resp
                .resources
                .iter()
                .map(|r| r.name.clone())
                .filter(|n| n != "local_app" && !subscribed.contains(n))
                .collect();
            if !names.is_empty() {
                subscribed.extend(names.iter().cloned());
                tx.send(DeltaDiscoveryRequest {
                    type_url: ENDPOINT.into(),
                    resource_names_subscribe: names,
                    ..Default::default()
                })
                .await
                .unwrap();
            }
        } else if resp.type_url == ENDPOINT {
            if !told_ready {
                told_ready = true;
                // Synced: let the next stream connect.
                drop(gate.take());
                let _ = ready.send(());
            }
            let m = marker.load(Ordering::Acquire);
            if m != 0 && m != reported && resp.resources.iter().any(|r| contains_marker(r, m)) {
                reported = m;
                let _ = report.send((Instant::now(), bytes, idx));
            }
        }
    }
}

/// True when resource `r` carries round `marker`'s address.
pub fn contains_marker(r: &Resource, marker: u64) -> bool {
    let needle = marker_address(marker);
    r.resource
        .as_ref()
        .is_some_and(|a| a.value.windows(needle.len()).any(|w| w == needle.as_bytes()))
}

/// The same as [`delta_proxy`], state of the world: every cluster's load assignment asked
/// for, every response ACKed with its version.
pub async fn sotw_proxy(
    grpc: String,
    idx: usize,
    marker: Arc<AtomicU64>,
    report: mpsc::UnboundedSender<(Instant, usize, usize)>,
    ready: mpsc::UnboundedSender<()>,
    gate: tokio::sync::OwnedSemaphorePermit,
    token: Option<Token>,
) {
    let mut client = connect(&grpc, idx).await;
    let (tx, rx) = mpsc::channel(16);
    let node = Some(envoy_node(idx));
    tx.send(DiscoveryRequest {
        node,
        type_url: CLUSTER.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut stream = client
        .stream_aggregated_resources(with_token(ReceiverStream::new(rx), token.as_ref()))
        .await
        .unwrap()
        .into_inner();
    let mut eds_names: Vec<String> = Vec::new();
    let mut told_ready = false;
    let mut gate = Some(gate);
    let mut reported = 0;
    while let Ok(Some(resp)) = stream.message().await {
        let bytes = resp.encoded_len();
        if resp.type_url == CLUSTER {
            // Like Envoy: the load assignments of every cluster in the newest set.
            let names = eds_names_of(&resp.resources);
            if names != eds_names {
                eds_names = names;
                tx.send(DiscoveryRequest {
                    type_url: ENDPOINT.into(),
                    resource_names: eds_names.clone(),
                    ..Default::default()
                })
                .await
                .unwrap();
            }
        }
        let names = if resp.type_url == ENDPOINT {
            eds_names.clone()
        } else {
            Vec::new()
        };
        let ack = DiscoveryRequest {
            type_url: resp.type_url.clone(),
            version_info: resp.version_info.clone(),
            response_nonce: resp.nonce.clone(),
            resource_names: names,
            ..Default::default()
        };
        if tx.send(ack).await.is_err() {
            return;
        }
        if resp.type_url == ENDPOINT {
            if !told_ready {
                told_ready = true;
                // Synced: let the next stream connect.
                drop(gate.take());
                let _ = ready.send(());
            }
            let m = marker.load(Ordering::Acquire);
            // Every SotW response carries every load assignment: report a marker once.
            if m != 0 && m != reported && any_has_marker(&resp.resources, m) {
                reported = m;
                let _ = report.send((Instant::now(), bytes, idx));
            }
        }
    }
}

/// The load assignments a proxy asks for after a cluster response: every cluster's but
/// `local_app`'s, sorted.
fn eds_names_of(clusters: &[envoy_types::pb::google::protobuf::Any]) -> Vec<String> {
    let mut names: Vec<String> = clusters
        .iter()
        .filter_map(|a| envoy_types::pb::envoy::config::cluster::v3::Cluster::decode(a.value.as_slice()).ok())
        .map(|c| c.name)
        .filter(|n| n != "local_app")
        .collect();
    names.sort();
    names
}

/// Whether one of `resources` carries the address of marker `marker`.
fn any_has_marker(resources: &[envoy_types::pb::google::protobuf::Any], marker: u64) -> bool {
    let needle = marker_address(marker);
    resources
        .iter()
        .any(|a| a.value.windows(needle.len()).any(|w| w == needle.as_bytes()))
}

/// `n` synthetic delta proxies ([`delta_proxy`]) on one xDS address, timed round by round:
/// each round sets a new marker, makes a change carrying its address, and waits until every
/// proxy has it.
pub struct MarkerFleet {
    n: usize,
    marker: Arc<AtomicU64>,
    reports: mpsc::UnboundedReceiver<(Instant, usize, usize)>,
}

impl MarkerFleet {
    /// Connects `n` proxies to `grpc`, `connecting` at a time, nodes `0..n` of
    /// [`envoy_node`]; returns once every one is synced, with how long that took.
    pub async fn connect(grpc: &str, n: usize, connecting: usize) -> (Self, Duration) {
        let marker = Arc::new(AtomicU64::new(0));
        let (report, reports) = mpsc::unbounded_channel();
        let (ready, mut readies) = mpsc::unbounded_channel();
        let gate = Arc::new(tokio::sync::Semaphore::new(connecting));
        let start = Instant::now();
        for i in 0..n {
            let (grpc, marker, report, ready) = (grpc.to_owned(), Arc::clone(&marker), report.clone(), ready.clone());
            let permit = Arc::clone(&gate)
                .acquire_owned()
                .await
                .expect("the gate is never closed");
            tokio::spawn(delta_proxy(grpc, i, marker, report, ready, permit, None));
        }
        for _ in 0..n {
            readies.recv().await.expect("a proxy ended before it synced");
        }
        (Self { n, marker, reports }, start.elapsed())
    }

    /// Round `round` (from 1): `change` makes a change carrying [`marker_address`]`(round)`;
    /// pushes, per proxy, the time from the start of the change until it had it (10 s at
    /// most, else says how many did), and adds the CPU each of `pids` spent meanwhile.
    #[allow(clippy::print_stdout)] // part of a benchmark's printed figures
    pub async fn round(
        &mut self,
        round: u64,
        change: impl std::future::Future<Output = ()>,
        pids: &[u32],
        latencies: &mut Vec<Duration>,
        cpu: &mut [Duration],
    ) {
        self.marker.store(round, Ordering::Release);
        let before: Vec<Duration> = pids.iter().map(|p| proc_stat(*p).0).collect();
        let t0 = Instant::now();
        change.await;
        let mut got = std::collections::BTreeSet::new();
        while got.len() < self.n {
            match tokio::time::timeout(Duration::from_secs(10), self.reports.recv()).await {
                Ok(Some((at, _, idx))) => {
                    latencies.push(at - t0);
                    got.insert(idx);
                }
                _ => {
                    println!(
                        "  round {round}: only {} of {} streams received the change within 10 s",
                        got.len(),
                        self.n
                    );
                    break;
                }
            }
        }
        for ((spent, pid), was) in cpu.iter_mut().zip(pids).zip(before) {
            *spent += proc_stat(*pid).0 - was;
        }
    }
}
