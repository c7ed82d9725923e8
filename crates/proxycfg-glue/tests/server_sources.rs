//! The proxycfg engine on server data sources over a real catalog store.
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use catalog::{Op, Store, StoreConfig};
use proxycfg::{ConfigSnapshot, Manager, ManagerConfig, ProxyId, ProxyRegistration, ProxySource, WatchEvent, Watcher};
use std::{sync::Arc, time::Duration};
use structs::config_entry::{IntentionAction, ServiceDefaults};
use structs::*;

fn sidecar(dest: &str, port: u16, upstreams: &[(&str, u16)]) -> NodeService {
    NodeService {
        kind: ServiceKind::ConnectProxy,
        id: format!("{dest}-sidecar-proxy"),
        service: format!("{dest}-sidecar-proxy"),
        port,
        proxy: ConnectProxyConfig {
            destination_service_name: dest.into(),
            destination_service_id: dest.into(),
            local_service_port: 8080,
            upstreams: upstreams
                .iter()
                .map(|(n, p)| Upstream {
                    destination_name: (*n).into(),
                    local_bind_port: *p,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn register(store: &Store, node: &str, addr: &str, svc: NodeService) {
    store
        .write(Op::Register(Box::new(RegisterRequest {
            node: node.into(),
            address: addr.into(),
            service: Some(svc),
            ..Default::default()
        })))
        .await
        .unwrap();
}

/// A Manager over `store`'s server data sources with `proxies` (node, service id) registered
/// from the catalog, and a watcher of each.
async fn manage(store: &Store, proxies: &[(&str, &str)]) -> (Manager, Vec<Watcher>) {
    let manager = Manager::new(
        ManagerConfig::default(),
        proxycfg_glue::server_data_sources(store.clone()),
    );
    let mut watchers = Vec::new();
    for (node, name) in proxies {
        let id = ProxyId::new(*node, *name);
        watchers.push(manager.watch(&id));
        let service = store.read().service(node, name).unwrap();
        let registration = ProxyRegistration {
            id,
            service,
            token: None,
        };
        manager
            .register(registration, ProxySource::Catalog, false)
            .await
            .unwrap();
    }
    (manager, watchers)
}

/// Writes `entry` to the catalog.
async fn set_entry(store: &Store, entry: ConfigEntry) {
    store
        .write(Op::ConfigSet {
            entry: Box::new(entry),
            cas: None,
        })
        .await
        .unwrap();
}

async fn next(w: &mut Watcher) -> Arc<ConfigSnapshot> {
    match tokio::time::timeout(Duration::from_secs(10), w.next()).await {
        Ok(Some(WatchEvent::Snapshot(s))) => s,
        other => panic!("expected a snapshot, got {other:?}"),
    }
}

async fn next_where(w: &mut Watcher, pred: impl Fn(&ConfigSnapshot) -> bool) -> Arc<ConfigSnapshot> {
    loop {
        let s = next(w).await;
        if pred(&s) {
            return s;
        }
    }
}

fn api_endpoints(s: &ConfigSnapshot) -> Vec<String> {
    let cp = s.connect_proxy().unwrap();
    cp.upstreams
        .values()
        .flat_map(|u| {
            u.endpoints
                .values()
                .flat_map(|e| e.iter().map(|n| n.address().to_owned()))
        })
        .collect()
}

#[tokio::test]
async fn sidecar_snapshot_from_the_catalog() {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    register(
        &store,
        "n1",
        "10.0.0.1",
        NodeService {
            service: "web".into(),
            port: 8080,
            ..Default::default()
        },
    )
    .await;
    register(&store, "n1", "10.0.0.1", sidecar("web", 21000, &[("api", 9191)])).await;
    register(
        &store,
        "n2",
        "10.0.0.2",
        NodeService {
            service: "api".into(),
            port: 8080,
            ..Default::default()
        },
    )
    .await;
    register(&store, "n2", "10.0.0.2", sidecar("api", 21000, &[])).await;

    let manager = Manager::new(
        ManagerConfig::default(),
        proxycfg_glue::server_data_sources(store.clone()),
    );
    let svc = store.read().service("n1", "web-sidecar-proxy").unwrap();
    let id = ProxyId::new("n1", "web-sidecar-proxy");
    let mut w = manager.watch(&id);
    manager
        .register(
            ProxyRegistration {
                id: id.clone(),
                service: svc,
                token: None,
            },
            ProxySource::Catalog,
            false,
        )
        .await
        .unwrap();

    let snap = next_where(&mut w, |s| !api_endpoints(s).is_empty()).await;
    let roots = snap.roots.as_ref().unwrap();
    assert_eq!(roots.trust_domain, store.read().ca_roots().trust_domain);
    let cp = snap.connect_proxy().unwrap();
    let leaf = cp.leaf.as_ref().unwrap();
    assert_eq!(
        leaf.service_uri,
        format!("spiffe://{}/ns/default/dc/dc1/svc/web", roots.trust_domain)
    );
    assert_eq!(api_endpoints(&snap), vec!["10.0.0.2"]);
    let chain = cp.upstreams.values().next().unwrap().chain.clone().unwrap();
    assert_eq!(chain.protocol, structs::Protocol::Tcp);
    assert_eq!(
        chain.targets.values().next().unwrap().sni,
        format!("api.default.dc1.internal.{}", roots.trust_domain)
    );

    // A second api instance appears.
    register(&store, "n3", "10.0.0.3", sidecar("api", 21000, &[])).await;
    let snap = next_where(&mut w, |s| api_endpoints(s).len() == 2).await;
    assert_eq!(api_endpoints(&snap), vec!["10.0.0.2", "10.0.0.3"]);

    // An intention for web arrives.
    store
        .write(Op::IntentionUpsert {
            source: "*".into(),
            destination: "web".into(),
            action: Some(IntentionAction::Deny),
            permissions: vec![],
            description: String::new(),
            meta: Default::default(),
            create: false,
        })
        .await
        .unwrap();
    let snap = next_where(&mut w, |s| {
        s.connect_proxy()
            .unwrap()
            .intentions
            .as_ref()
            .is_some_and(|i| !i.is_empty())
    })
    .await;
    assert_eq!(
        snap.connect_proxy().unwrap().intentions.as_ref().unwrap()[0].source_name,
        "*"
    );

    // service-defaults makes api speak http: the chain follows.
    set_entry(
        &store,
        ConfigEntry::ServiceDefaults(ServiceDefaults {
            name: "api".into(),
            protocol: "http".into(),
            ..Default::default()
        }),
    )
    .await;
    next_where(&mut w, |s| {
        s.connect_proxy()
            .unwrap()
            .upstreams
            .values()
            .next()
            .unwrap()
            .chain
            .as_ref()
            .is_some_and(|c| c.protocol == structs::Protocol::Http)
    })
    .await;

    // An unhealthy instance drops out (passing only).
    store
        .write(Op::Register(Box::new(RegisterRequest {
            node: "n3".into(),
            address: "10.0.0.3".into(),
            check: Some(HealthCheck {
                check_id: "sick".into(),
                service_id: "api-sidecar-proxy".into(),
                status: HealthStatus::Critical,
                ..Default::default()
            }),
            ..Default::default()
        })))
        .await
        .unwrap();
    let snap = next_where(&mut w, |s| api_endpoints(s).len() == 1).await;
    assert_eq!(api_endpoints(&snap), vec!["10.0.0.2"]);

    manager.shutdown().await;
    assert_eq!(manager.metrics().live_watches, 0);
}

#[tokio::test]
async fn proxies_watching_the_same_service_share_one_result() {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    register(&store, "n9", "10.0.0.9", sidecar("api", 21000, &[])).await;
    register(&store, "n1", "10.0.0.1", sidecar("web", 21000, &[("api", 9191)])).await;
    register(&store, "n2", "10.0.0.2", sidecar("billing", 21000, &[("api", 9191)])).await;
    let (manager, mut watchers) = manage(&store, &[("n1", "web-sidecar-proxy"), ("n2", "billing-sidecar-proxy")]).await;
    let mut endpoints = Vec::new();
    for w in &mut watchers {
        let s = next_where(w, |s| !api_endpoints(s).is_empty()).await;
        let up = s.connect_proxy().unwrap().upstreams.values().next().unwrap().clone();
        endpoints.push(up.endpoints.values().next().unwrap().clone());
    }
    assert!(
        Arc::ptr_eq(&endpoints[0], &endpoints[1]),
        "one materialized result for both proxies"
    );
    manager.shutdown().await;
}

/// A proxy's leaf follows the CA: after a rotation its snapshot carries a leaf from the new
/// root, with both roots trusted; a second proxy of another service sharing the roots
/// follower gets its own new leaf too. Service defaults written after the start reach the
/// resolved config (the shared defaults follower), and the `mesh` entry reaches every proxy.
#[tokio::test]
async fn leaves_follow_a_ca_rotation_and_defaults_follow_their_entries() {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    register(&store, "n1", "10.0.0.1", sidecar("web", 21000, &[("api", 9191)])).await;
    register(&store, "n2", "10.0.0.2", sidecar("api", 21000, &[])).await;
    let (manager, mut watchers) = manage(&store, &[("n1", "web-sidecar-proxy"), ("n2", "api-sidecar-proxy")]).await;
    let leaf_of = |s: &ConfigSnapshot| s.connect_proxy().unwrap().leaf.clone().unwrap();
    let mut first = Vec::new();
    for w in &mut watchers {
        let snap = next_where(w, |s| s.connect_proxy().is_some_and(|c| c.leaf.is_some())).await;
        first.push(leaf_of(&snap));
    }

    let mut config = store.read().ca().unwrap().config.clone();
    config.private_key_type = "ec".into();
    config.private_key_bits = 384;
    store.write(Op::CaConfigure(config)).await.unwrap();
    let active = store.read().ca_roots().active_root_id.clone();
    for (w, before) in watchers.iter_mut().zip(&first) {
        let snap = next_where(w, |s| {
            s.roots.as_ref().is_some_and(|r| r.active_root_id == active) && leaf_of(s).cert_pem != before.cert_pem
        })
        .await;
        assert_eq!(
            snap.roots.as_ref().unwrap().roots.len(),
            2,
            "the old root is still trusted"
        );
        assert_eq!(leaf_of(&snap).service_uri, before.service_uri);
    }

    set_entry(
        &store,
        ConfigEntry::ServiceDefaults(ServiceDefaults {
            name: "api".into(),
            protocol: "http".into(),
            ..Default::default()
        }),
    )
    .await;
    next_where(&mut watchers[1], |s| {
        s.connect_proxy()
            .and_then(|c| c.resolved_config.as_ref())
            .is_some_and(|r| r.proxy_config.get("protocol").and_then(|p| p.as_str()) == Some("http"))
    })
    .await;

    set_entry(
        &store,
        ConfigEntry::Mesh(structs::config_entry::MeshConfig {
            name: "mesh".into(),
            ..Default::default()
        }),
    )
    .await;
    for w in &mut watchers {
        next_where(w, |s| {
            s.connect_proxy()
                .and_then(|c| c.mesh_config.as_ref())
                .is_some_and(|m| m.is_some())
        })
        .await;
    }
    // 2 proxies of 7 watches each (roots, mesh, proxy-defaults, leaf, intentions, peers'
    // trust bundles, resolved config) and 2 of web's upstream (chain, health), all
    // subscriptions but the intentions; counted out whole when their States stop.
    assert_eq!(manager.metrics().live_watches, 16);
    for (node, name) in [("n1", "web-sidecar-proxy"), ("n2", "api-sidecar-proxy")] {
        manager
            .deregister(&ProxyId::new(node, name), ProxySource::Catalog)
            .await;
    }
    assert_eq!(manager.metrics().live_watches, 0);
}
