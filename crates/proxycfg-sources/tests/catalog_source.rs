//! The catalog source against a real store and Manager.
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use catalog::{Op, Store, StoreConfig};
use proxycfg::{Manager, ManagerConfig, ProxyId, WatchEvent, Watcher};
use proxycfg_sources::CatalogSource;
use std::time::Duration;
use structs::config_entry::ProxyDefaults;
use structs::*;

async fn setup() -> (Store, Manager, CatalogSource) {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let manager = Manager::new(
        ManagerConfig::default(),
        proxycfg_glue::server_data_sources(store.clone()),
    );
    let source = CatalogSource::new(store.clone(), manager.clone());
    (store, manager, source)
}

async fn register_sidecar(store: &Store, port: u16) {
    let svc = NodeService {
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
    };
    store
        .write(Op::Register(Box::new(RegisterRequest {
            node: "n1".into(),
            address: "10.0.0.1".into(),
            service: Some(svc),
            ..Default::default()
        })))
        .await
        .unwrap();
}

async fn next(w: &mut Watcher) -> WatchEvent {
    tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .unwrap()
        .unwrap()
}

async fn snapshot_where(w: &mut Watcher, pred: impl Fn(&proxycfg::ConfigSnapshot) -> bool) {
    loop {
        if let WatchEvent::Snapshot(s) = next(w).await
            && pred(&s)
        {
            return;
        }
    }
}

#[tokio::test]
async fn streams_share_one_sync_with_central_config_merged() {
    let (store, manager, source) = setup().await;
    register_sidecar(&store, 21000).await;
    let mut pd = ProxyDefaults {
        name: "global".into(),
        ..Default::default()
    };
    pd.config
        .insert("envoy_stats_flush_interval".into(), serde_json::Value::from("5s"));
    store
        .write(Op::ConfigSet {
            entry: Box::new(ConfigEntry::ProxyDefaults(pd)),
            cas: None,
        })
        .await
        .unwrap();

    let id = ProxyId::new("n1", "web-sidecar-proxy");
    let (mut w1, lease1) = source.watch(id.clone(), None);
    let (mut w2, lease2) = source.watch(id.clone(), None);
    assert_eq!(source.active(), 1, "one sync for both streams");
    snapshot_where(&mut w1, |s| {
        s.service.proxy.config.get("envoy_stats_flush_interval").is_some()
    })
    .await;
    snapshot_where(&mut w2, |s| s.service.port == 21000).await;

    // A registration change in the catalog reaches the Manager.
    register_sidecar(&store, 21005).await;
    snapshot_where(&mut w1, |s| s.service.port == 21005).await;

    drop(lease1);
    assert_eq!(
        manager.registered().await,
        vec![id.clone()],
        "still leased by the second stream"
    );
    drop(lease2);
    // The last lease gone, the sync deregisters the proxy.
    while !matches!(next(&mut w2).await, WatchEvent::Deregistered) {}
    assert!(manager.registered().await.is_empty());
    // A stream coming back right away gets a registration that stays.
    let (mut w3, _lease3) = source.watch(id.clone(), None);
    snapshot_where(&mut w3, |s| s.service.port == 21005).await;
    assert_eq!(manager.registered().await, vec![id]);
    source.shutdown().await;
    assert!(manager.registered().await.is_empty());
    assert_eq!(manager.metrics().live_watches, 0);
}

#[tokio::test]
async fn catalog_deregistration_withdraws_the_snapshot() {
    let (store, manager, source) = setup().await;
    register_sidecar(&store, 21000).await;
    let id = ProxyId::new("n1", "web-sidecar-proxy");
    let (mut w, _lease) = source.watch(id.clone(), None);
    snapshot_where(&mut w, |_| true).await;
    store
        .write(Op::Deregister(DeregisterRequest {
            node: "n1".into(),
            service_id: "web-sidecar-proxy".into(),
            ..Default::default()
        }))
        .await
        .unwrap();
    while !matches!(next(&mut w).await, WatchEvent::Deregistered) {}
    assert!(manager.registered().await.is_empty());
    // Registering it again brings it back.
    register_sidecar(&store, 21000).await;
    snapshot_where(&mut w, |_| true).await;
    source.shutdown().await;
}

#[tokio::test]
async fn a_stream_is_matched_to_its_proxy_by_id_and_node() {
    use proxycfg::{ProxyRequest, SnapshotSource, SourceError};
    let (store, _manager, source) = setup().await;
    let ask = |id: &'static str, node: Option<&'static str>| ProxyRequest {
        proxy_id: id,
        node_name: node,
        token: None,
    };
    let err = |r: Result<_, SourceError>| r.err().unwrap();
    assert_eq!(
        err(SnapshotSource::watch(&source, &ask("", None))),
        SourceError::MissingProxyId
    );
    assert_eq!(
        err(SnapshotSource::watch(&source, &ask("web-sidecar-proxy", None))),
        SourceError::NotFound("web-sidecar-proxy".into())
    );
    register_sidecar(&store, 21000).await;
    let (mut w, _lease) = SnapshotSource::watch(&source, &ask("web-sidecar-proxy", None)).unwrap();
    snapshot_where(&mut w, |s| s.proxy_id.node == "n1").await;
    // The same id on a second node: the stream must say which.
    store
        .write(Op::Register(Box::new(RegisterRequest {
            node: "n2".into(),
            address: "10.0.0.2".into(),
            service: Some(NodeService {
                kind: ServiceKind::ConnectProxy,
                id: "web-sidecar-proxy".into(),
                service: "web-sidecar-proxy".into(),
                port: 21000,
                proxy: ConnectProxyConfig {
                    destination_service_name: "web".into(),
                    ..Default::default()
                },
                ..Default::default()
            }),
            ..Default::default()
        })))
        .await
        .unwrap();
    assert_eq!(
        err(SnapshotSource::watch(&source, &ask("web-sidecar-proxy", None))),
        SourceError::Ambiguous("web-sidecar-proxy".into())
    );
    assert!(SnapshotSource::watch(&source, &ask("web-sidecar-proxy", Some("n2"))).is_ok());
}
