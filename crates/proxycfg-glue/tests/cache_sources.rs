//! The `Cache*` data sources against a real meshd server (its catalog store and HTTP API, in
//! this process): each delivers its first value, then a change made at the server.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use agent_cache::{AgentCaches, CachesConfig};
use api_client::Servers;
use catalog::{Op, Store, StoreConfig};
use proxycfg::data_sources::*;
use proxycfg::fake::event_channel;
use proxycfg::{CorrelationId, DataSource, DataSources, Subscription, UpdateEvent, UpdatePayload};
use proxycfg_glue::{LocalChecks, cache_data_sources, cache_data_sources_tracked};
use std::sync::Arc;
use std::time::Duration;
use structs::config_entry::{ServiceDefaults, ServiceSplitter};
use structs::*;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A server: store and HTTP API on an ephemeral port.
async fn server() -> (Store, String) {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let app = http_api::router(store.clone(), http_api::ApiConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (store, addr)
}

/// The agent's checks, settable.
struct Checks(watch::Sender<u64>, parking_lot::Mutex<Vec<HealthCheck>>);

impl LocalChecks for Checks {
    fn http_checks(&self, service_id: &str) -> Vec<HealthCheck> {
        self.1
            .lock()
            .iter()
            .filter(|c| c.service_id == service_id)
            .cloned()
            .collect()
    }
    fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }
}

struct Fixture {
    store: Store,
    sources: DataSources,
    checks: Arc<Checks>,
    caches: AgentCaches,
    cancel: CancellationToken,
}

async fn fixture() -> Fixture {
    let (store, addr) = server().await;
    let servers = Arc::new(Servers::new(&[addr]));
    let caches = AgentCaches::new(servers, CachesConfig::default(), CancellationToken::new());
    let checks = Arc::new(Checks(watch::Sender::new(0), parking_lot::Mutex::new(Vec::new())));
    let sources = cache_data_sources(caches.clone(), Arc::clone(&checks) as Arc<dyn LocalChecks>);
    Fixture {
        store,
        sources,
        checks,
        caches,
        cancel: CancellationToken::new(),
    }
}

/// One running watch and what it received.
struct Received(mpsc::Receiver<Box<UpdateEvent>>);

impl Received {
    /// Waits for a payload `pred` accepts (errors fail the test).
    async fn until(&mut self, what: &str, pred: impl Fn(&UpdatePayload) -> bool) -> UpdatePayload {
        loop {
            let event = tokio::time::timeout(Duration::from_secs(10), self.0.recv())
                .await
                .unwrap_or_else(|_| panic!("{what}: nothing within 10 s"))
                .expect("the watch ended");
            match event.result {
                Ok(p) if pred(&p) => return p,
                Ok(_) => {}
                Err(e) => panic!("{what}: {e}"),
            }
        }
    }
}

fn start<R: WatchRequest>(f: &Fixture, source: &Arc<dyn DataSource<R>>, req: R) -> Received {
    let (tx, rx) = event_channel::<R::Response>(16);
    let fut = Arc::clone(source).notify(req, CorrelationId::Roots, tx, f.cancel.clone());
    tokio::spawn(fut);
    Received(rx)
}

async fn register(store: &Store, node: &str, svc: NodeService) {
    store
        .write(Op::Register(Box::new(RegisterRequest {
            node: node.into(),
            address: "10.0.0.1".into(),
            service: Some(svc),
            ..Default::default()
        })))
        .await
        .unwrap();
}

async fn set_entry(store: &Store, entry: ConfigEntry) {
    store
        .write(Op::ConfigSet {
            entry: Box::new(entry),
            cas: None,
        })
        .await
        .unwrap();
}

fn dc1() -> String {
    "dc1".into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roots_and_leaves_follow_a_root_rotation() {
    let f = fixture().await;
    let mut roots = start(&f, &f.sources.ca_roots, CaRootsRequest { datacenter: dc1() });
    let mut leaf = start(
        &f,
        &f.sources.leaf,
        LeafRequest {
            datacenter: dc1(),
            service: "web".into(),
            dns_sans: Vec::new(),
            token: None,
        },
    );
    let UpdatePayload::CaRoots(first) = roots.until("roots", |p| matches!(p, UpdatePayload::CaRoots(_))).await else {
        unreachable!()
    };
    let UpdatePayload::Leaf(cert) = leaf.until("leaf", |p| matches!(p, UpdatePayload::Leaf(_))).await else {
        unreachable!()
    };
    assert!(
        cert.service_uri.ends_with("/ns/default/dc/dc1/svc/web"),
        "{}",
        cert.service_uri
    );
    assert!(
        cert.private_key_pem.contains("PRIVATE KEY"),
        "the agent holds its own key"
    );

    // A new root (key size changed): new roots, and the leaf is renewed at once.
    let state = f.store.read();
    let mut config = state.ca().unwrap().config.clone();
    drop(state);
    config.private_key_bits = 384;
    f.store.write(Op::CaConfigure(config)).await.unwrap();
    let changed = roots
        .until(
            "rotated roots",
            |p| matches!(p, UpdatePayload::CaRoots(r) if r.active_root_id != first.active_root_id),
        )
        .await;
    let UpdatePayload::CaRoots(rotated) = changed else {
        unreachable!()
    };
    leaf.until(
        "renewed leaf",
        |p| matches!(p, UpdatePayload::Leaf(c) if c.serial_number != cert.serial_number),
    )
    .await;
    assert_eq!(rotated.roots.len(), 2, "the old root stays trusted");
    f.cancel.cancel();
    f.caches.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_sources_deliver_a_first_value_and_a_change() {
    let f = fixture().await;
    let mut intentions = start(
        &f,
        &f.sources.intentions,
        IntentionsRequest {
            datacenter: dc1(),
            destination: "api".into(),
        },
    );
    let mut health = start(
        &f,
        &f.sources.health,
        HealthRequest {
            datacenter: dc1(),
            service: "api".into(),
            connect: false,
            passing_only: true,
            healthy_only: true,
            filter: String::new(),
            kind: None,
            token: None,
        },
    );
    let mut services = start(
        &f,
        &f.sources.service_list,
        ServiceListRequest {
            datacenter: dc1(),
            typical_only: false,
        },
    );
    let mut dcs = start(&f, &f.sources.datacenters, DatacentersRequest);
    let entry_req = ConfigEntryRequest {
        kind: ConfigEntryKind::ServiceDefaults,
        name: "api".into(),
    };
    let mut entry = start(&f, &f.sources.config_entry, entry_req);
    let mut entries = start(
        &f,
        &f.sources.config_entry_list,
        ConfigEntryListRequest::shared(ConfigEntryKind::ServiceDefaults),
    );
    let chain_req = DiscoveryChainRequest {
        datacenter: dc1(),
        name: "api".into(),
        namespace: "default".into(),
        override_protocol: None,
        override_connect_timeout_ms: 0,
        override_mesh_gateway: MeshGatewayMode::Default,
    };
    let mut chain = start(&f, &f.sources.discovery_chain, chain_req);
    let mut resolved = start(
        &f,
        &f.sources.resolved_service_config,
        ResolvedServiceConfigRequest {
            datacenter: dc1(),
            name: "web".into(),
            upstreams: vec![],
        },
    );
    let mut checks = start(
        &f,
        &f.sources.http_checks,
        HttpChecksRequest {
            service_id: "web".into(),
        },
    );

    // First values.
    intentions
        .until(
            "intentions",
            |p| matches!(p, UpdatePayload::Intentions(i) if i.is_empty()),
        )
        .await;
    health
        .until("health", |p| matches!(p, UpdatePayload::Health(h) if h.is_empty()))
        .await;
    services
        .until(
            "services",
            |p| matches!(p, UpdatePayload::ServiceList(s) if !s.contains(&"api".to_owned())),
        )
        .await;
    dcs.until(
        "datacenters",
        |p| matches!(p, UpdatePayload::Datacenters(d) if **d == ["dc1"]),
    )
    .await;
    entry
        .until("config entry", |p| matches!(p, UpdatePayload::ConfigEntry(None)))
        .await;
    entries
        .until(
            "config entries",
            |p| matches!(p, UpdatePayload::ConfigEntryList(l) if l.is_empty()),
        )
        .await;
    chain
        .until(
            "chain",
            |p| matches!(p, UpdatePayload::DiscoveryChain(c) if c.protocol == Protocol::Tcp),
        )
        .await;
    resolved
        .until("resolved config", |p| {
            matches!(p, UpdatePayload::ResolvedServiceConfig(_))
        })
        .await;
    checks
        .until(
            "http checks",
            |p| matches!(p, UpdatePayload::HttpChecks(c) if c.is_empty()),
        )
        .await;

    // Changes at the server (and in the agent's own checks).
    register(
        &f.store,
        "n1",
        NodeService {
            service: "api".into(),
            id: "api-1".into(),
            port: 8080,
            ..Default::default()
        },
    )
    .await;
    f.store
        .write(Op::IntentionUpsert {
            source: "web".into(),
            destination: "api".into(),
            action: Some(config_entry::IntentionAction::Deny),
            permissions: vec![],
            description: String::new(),
            meta: Default::default(),
            create: false,
        })
        .await
        .unwrap();
    set_entry(
        &f.store,
        ConfigEntry::ServiceDefaults(ServiceDefaults {
            name: "api".into(),
            protocol: "http".into(),
            ..Default::default()
        }),
    )
    .await;
    f.checks.1.lock().push(HealthCheck {
        check_id: "web-http".into(),
        service_id: "web".into(),
        check_type: "http".into(),
        ..Default::default()
    });
    f.checks.0.send_modify(|v| *v += 1);

    health
        .until(
            "a new instance",
            |p| matches!(p, UpdatePayload::Health(h) if h.len() == 1),
        )
        .await;
    intentions
        .until(
            "a new intention",
            |p| matches!(p, UpdatePayload::Intentions(i) if i.len() == 1),
        )
        .await;
    services
        .until(
            "a new service",
            |p| matches!(p, UpdatePayload::ServiceList(s) if s.contains(&"api".to_owned())),
        )
        .await;
    entry
        .until("the entry written", |p| {
            matches!(p, UpdatePayload::ConfigEntry(Some(_)))
        })
        .await;
    entries
        .until(
            "the list grown",
            |p| matches!(p, UpdatePayload::ConfigEntryList(l) if l.len() == 1),
        )
        .await;
    chain
        .until(
            "the chain recompiled",
            |p| matches!(p, UpdatePayload::DiscoveryChain(c) if c.protocol == Protocol::Http),
        )
        .await;
    resolved
        .until("resolved again", |p| {
            matches!(p, UpdatePayload::ResolvedServiceConfig(_))
        })
        .await;
    checks
        .until(
            "the agent's check",
            |p| matches!(p, UpdatePayload::HttpChecks(c) if c.len() == 1),
        )
        .await;

    // Routing entries recompile the chain: a splitter becomes its start node.
    set_entry(
        &f.store,
        ConfigEntry::ServiceSplitter(ServiceSplitter {
            name: "api".into(),
            splits: vec![config_entry::ServiceSplit {
                weight: 100.0,
                ..Default::default()
            }],
            ..Default::default()
        }),
    )
    .await;
    chain
        .until(
            "the splitter compiled",
            |p| matches!(p, UpdatePayload::DiscoveryChain(c) if c.start_node == "splitter:api.default.default"),
        )
        .await;
    f.cancel.cancel();
    f.caches.shutdown().await;
}

/// The next result of a subscription, as a State polls it.
async fn next_of(sub: &mut Box<dyn Subscription>) -> UpdatePayload {
    let next = std::future::poll_fn(|cx| sub.poll_next(cx));
    let result = tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("nothing within 10 s");
    result.expect("the subscription ended").unwrap()
}

/// Proxies of one agent watching the same chain share it: compiled once, one `Arc` for all
/// (as on servers). When the last watch goes, its follower stops: nothing is left running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_proxies_share_one_chain_and_nothing_outlives_them() {
    let (_store, addr) = server().await;
    let caches = AgentCaches::new(
        Arc::new(Servers::new(&[addr])),
        CachesConfig::default(),
        CancellationToken::new(),
    );
    let checks = Arc::new(Checks(watch::Sender::new(0), parking_lot::Mutex::new(Vec::new())));
    let tasks = TaskTracker::new();
    let sources = cache_data_sources_tracked(caches.clone(), checks, &tasks);
    let req = DiscoveryChainRequest {
        datacenter: dc1(),
        name: "api".into(),
        namespace: "default".into(),
        override_protocol: None,
        override_connect_timeout_ms: 0,
        override_mesh_gateway: MeshGatewayMode::Default,
    };
    let mut a = sources.discovery_chain.subscribe(&req).expect("chains are shared");
    let mut b = sources.discovery_chain.subscribe(&req).expect("chains are shared");
    let (UpdatePayload::DiscoveryChain(one), UpdatePayload::DiscoveryChain(other)) =
        (next_of(&mut a).await, next_of(&mut b).await)
    else {
        panic!("not chains")
    };
    assert!(Arc::ptr_eq(&one, &other), "one compiled chain for both proxies");

    drop((a, b));
    tasks.close();
    tokio::time::timeout(Duration::from_secs(10), tasks.wait())
        .await
        .expect("the shared follower stopped with its last watch");
    caches.shutdown().await;
}

/// A server with ACLs on (default deny), bootstrapped: its store, address and management
/// token.
async fn acl_server() -> (Store, String, String) {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let resolver = Arc::new(catalog::acl::Resolver::new(catalog::acl::AclSettings {
        enabled: true,
        default_allow: false,
        datacenter: "dc1".into(),
    }));
    store.write(Op::AclInit).await.unwrap();
    let app = http_api::router(
        store.clone(),
        http_api::ApiConfig {
            acl: resolver,
            ..Default::default()
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let boot: serde_json::Value = reqwest::Client::new()
        .put(format!("http://{addr}/v1/acl/bootstrap"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (store, addr, boot["SecretID"].as_str().unwrap().to_owned())
}

/// A token of the server at `addr` holding exactly `rules`.
async fn token_with(addr: &str, management: &str, name: &str, rules: &str) -> Token {
    let client = reqwest::Client::new();
    let put = |path: &str, body: serde_json::Value| {
        client
            .put(format!("http://{addr}{path}"))
            .header("X-Consul-Token", management)
            .json(&body)
            .send()
    };
    let policy = put("/v1/acl/policy", serde_json::json!({"Name": name, "Rules": rules}))
        .await
        .unwrap();
    assert!(policy.status().is_success(), "{}", policy.text().await.unwrap());
    let token: serde_json::Value = put("/v1/acl/token", serde_json::json!({"Policies": [{"Name": name}]}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    Token::new(token["SecretID"].as_str().unwrap()).unwrap()
}

/// Entries only `mesh:read` may read (a gateway's exports) are read with the proxy's token:
/// the agent's (a node identity's rules) cannot see them, and a token that may not read
/// them gets "permission denied", never an empty list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mesh_scoped_lists_are_read_with_the_proxys_token_and_refusals_are_not_empty_lists() {
    let (store, addr, management) = acl_server().await;
    set_entry(
        &store,
        ConfigEntry::from_json(serde_json::json!({"Kind": "exported-services", "Name": "default",
            "Services": [{"Name": "api", "Consumers": [{"Peer": "cluster-b"}]}]}))
        .unwrap(),
    )
    .await;
    let agent = token_with(
        &addr,
        &management,
        "agent",
        "node_prefix \"\" { policy = \"write\" }\nservice_prefix \"\" { policy = \"read\" }",
    )
    .await;
    let gateway = token_with(
        &addr,
        &management,
        "gateway",
        "service \"mesh-gateway\" { policy = \"write\" }\nmesh = \"read\"",
    )
    .await;
    let servers = Arc::new(Servers::new(&[addr]));
    servers.set_token(Some(agent.clone()));
    let caches = AgentCaches::new(servers, CachesConfig::default(), CancellationToken::new());
    let checks = Arc::new(Checks(watch::Sender::new(0), parking_lot::Mutex::new(Vec::new())));
    let sources = cache_data_sources(caches.clone(), checks as Arc<dyn LocalChecks>);
    let f = Fixture {
        store,
        sources,
        checks: Arc::new(Checks(watch::Sender::new(0), parking_lot::Mutex::new(Vec::new()))),
        caches,
        cancel: CancellationToken::new(),
    };
    let list = |token: Option<&Token>| ConfigEntryListRequest::for_proxy(ConfigEntryKind::ExportedServices, token);
    let mut theirs = start(&f, &f.sources.config_entry_list, list(Some(&gateway)));
    theirs
        .until(
            "the gateway's exports",
            |p| matches!(p, UpdatePayload::ConfigEntryList(l) if l.len() == 1),
        )
        .await;
    // The agent's own token may not: refused, not an empty list.
    let mut agents = start(&f, &f.sources.config_entry_list, list(None));
    let event = tokio::time::timeout(Duration::from_secs(10), agents.0.recv())
        .await
        .unwrap()
        .unwrap();
    match event.result {
        Err(DataSourceError::PermissionDenied(m)) => assert!(m.contains("exported-services"), "{m}"),
        other => panic!("expected permission denied, got {other:?}"),
    }
    // Lists any token may read stay shared (one watch with the agent's token).
    assert_eq!(
        ConfigEntryListRequest::for_proxy(ConfigEntryKind::ServiceResolver, Some(&gateway)),
        ConfigEntryListRequest::shared(ConfigEntryKind::ServiceResolver)
    );
    f.cancel.cancel();
}
