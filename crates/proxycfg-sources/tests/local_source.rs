//! The local source against a real Manager, with central config read through the agent cache
//! from a real server (store and HTTP API in this process).
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use agent_cache::{AgentCaches, CachesConfig};
use api_client::Servers;
use catalog::{Op, Store, StoreConfig};
use parking_lot::Mutex;
use proxycfg::{Manager, ManagerConfig, ProxyId, ProxyRequest, ProxySource, SnapshotSource, SourceError};
use proxycfg_sources::{LocalProxy, LocalServices, LocalSource};
use std::sync::Arc;
use std::time::Duration;
use structs::config_entry::ProxyDefaults;
use structs::*;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// An agent's local state, settable.
struct Local {
    proxies: Mutex<Vec<LocalProxy>>,
    version: watch::Sender<u64>,
}

impl Local {
    fn set(&self, proxies: Vec<NodeService>) {
        *self.proxies.lock() = proxies
            .into_iter()
            .map(|service| LocalProxy { service, token: None })
            .collect();
        self.version.send_modify(|v| *v += 1);
    }
}

impl LocalServices for Local {
    fn node(&self) -> String {
        "agent-1".into()
    }
    fn proxies(&self) -> Vec<LocalProxy> {
        self.proxies.lock().clone()
    }
    fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }
}

fn sidecar(port: u16) -> NodeService {
    NodeService {
        kind: ServiceKind::ConnectProxy,
        id: "web-sidecar-proxy".into(),
        service: "web-sidecar-proxy".into(),
        port,
        proxy: ConnectProxyConfig {
            destination_service_name: "web".into(),
            local_service_port: 8080,
            ..Default::default()
        },
        ..Default::default()
    }
}

struct Fixture {
    store: Store,
    manager: Manager,
    local: Arc<Local>,
    source: LocalSource,
    caches: AgentCaches,
}

async fn fixture() -> Fixture {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let app = http_api::router(store.clone(), http_api::ApiConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let caches = AgentCaches::new(
        Arc::new(Servers::new(&[addr])),
        CachesConfig::default(),
        CancellationToken::new(),
    );
    // The Manager's data come from the server's store directly: this test is about what the
    // local source registers, not about the data sources.
    let manager = Manager::new(
        ManagerConfig::default(),
        proxycfg_glue::server_data_sources(store.clone()),
    );
    let local = Arc::new(Local {
        proxies: Mutex::new(Vec::new()),
        version: watch::Sender::new(0),
    });
    let source = LocalSource::start(
        manager.clone(),
        Arc::clone(&local) as Arc<dyn LocalServices>,
        caches.clone(),
    );
    Fixture {
        store,
        manager,
        local,
        source,
        caches,
    }
}

fn id() -> ProxyId {
    ProxyId::new("agent-1", "web-sidecar-proxy")
}

/// Waits until the Manager's registration of the proxy satisfies `pred` (`None`: absent).
async fn registered_where(manager: &Manager, pred: impl Fn(Option<&(ProxyRegistration, ProxySource)>) -> bool) {
    for _ in 0..200 {
        if pred(manager.registration(&id()).await.as_ref()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the registration never reached the expected state");
}

use proxycfg::ProxyRegistration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_proxies_are_registered_with_central_config_and_follow_the_local_state() {
    let f = fixture().await;
    let mut pd = ProxyDefaults {
        name: "global".into(),
        ..Default::default()
    };
    pd.config.insert("protocol".into(), serde_json::Value::from("http"));
    f.store
        .write(Op::ConfigSet {
            entry: Box::new(ConfigEntry::ProxyDefaults(pd)),
            cas: None,
        })
        .await
        .unwrap();

    // Registered, with proxy-defaults merged in.
    f.local.set(vec![sidecar(21000)]);
    registered_where(&f.manager, |r| {
        r.is_some_and(|(reg, source)| {
            *source == ProxySource::Local
                && reg.service.port == 21000
                && reg.service.proxy.config.get("protocol") == Some(&serde_json::Value::from("http"))
        })
    })
    .await;
    assert_eq!(f.source.registered(), vec!["web-sidecar-proxy".to_owned()]);

    // The entry changes: re-registered with the new value.
    let mut pd = ProxyDefaults {
        name: "global".into(),
        ..Default::default()
    };
    pd.config.insert("protocol".into(), serde_json::Value::from("grpc"));
    f.store
        .write(Op::ConfigSet {
            entry: Box::new(ConfigEntry::ProxyDefaults(pd)),
            cas: None,
        })
        .await
        .unwrap();
    registered_where(&f.manager, |r| {
        r.is_some_and(|(reg, _)| reg.service.proxy.config.get("protocol") == Some(&serde_json::Value::from("grpc")))
    })
    .await;

    // The service changes: re-registered; it goes: deregistered.
    f.local.set(vec![sidecar(21001)]);
    registered_where(&f.manager, |r| r.is_some_and(|(reg, _)| reg.service.port == 21001)).await;
    f.local.set(vec![]);
    registered_where(&f.manager, |r| r.is_none()).await;

    f.source.shutdown().await;
    f.manager.shutdown().await;
    f.caches.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_registrations_win_over_the_catalogs_and_streams_must_name_a_local_proxy() {
    let f = fixture().await;
    // Another source registered it first (as a server's catalog source would).
    let reg = ProxyRegistration {
        id: id(),
        service: Arc::new(sidecar(22000)),
        token: None,
    };
    f.manager.register(reg, ProxySource::Catalog, false).await.unwrap();
    f.local.set(vec![sidecar(21000)]);
    registered_where(&f.manager, |r| {
        r.is_some_and(|(reg, source)| *source == ProxySource::Local && reg.service.port == 21000)
    })
    .await;

    let ask = |proxy_id: &'static str, node: Option<&'static str>| {
        f.source
            .watch(&ProxyRequest {
                proxy_id,
                node_name: node,
                token: None,
            })
            .map(|_| ())
    };
    assert_eq!(ask("web-sidecar-proxy", None), Ok(()));
    assert_eq!(ask("web-sidecar-proxy", Some("agent-1")), Ok(()));
    assert!(matches!(
        ask("web-sidecar-proxy", Some("other-node")),
        Err(SourceError::NotFound(_))
    ));
    assert!(matches!(ask("db-sidecar-proxy", None), Err(SourceError::NotFound(_))));
    assert_eq!(ask("", None), Err(SourceError::MissingProxyId));

    f.source.shutdown().await;
    assert!(f.manager.registration(&id()).await.is_none(), "shutdown deregisters");
    f.manager.shutdown().await;
    f.caches.shutdown().await;
}
