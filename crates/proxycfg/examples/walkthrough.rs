//! A walk through the proxycfg engine with in-memory data sources: register a sidecar,
//! watch its snapshots, change what it depends on, and deregister it, printing each step.
//!
//! Run: `cargo xtask demo` (or `cargo run -p proxycfg --example walkthrough`).
#![allow(clippy::print_stdout, clippy::unwrap_used, missing_docs)]

use proxycfg::data_sources::*;
use proxycfg::fake::FakeDataSources;
use proxycfg::*;
use std::sync::Arc;
use structs::config_entry::IntentionAction;
use structs::*;

const TRUST: &str = "7a3c0f2e-demo.consul";

fn health(service: &str) -> HealthRequest {
    HealthRequest {
        datacenter: "dc1".into(),
        service: service.into(),
        connect: true,
        passing_only: false,
        healthy_only: true,
        filter: String::new(),
        kind: None,
        token: None,
    }
}

fn instances(service: &str, addrs: &[&str]) -> Arc<Vec<CheckServiceNode>> {
    Arc::new(
        addrs
            .iter()
            .map(|a| CheckServiceNode {
                node: Node {
                    node: format!("node-{a}"),
                    address: (*a).into(),
                    ..Default::default()
                },
                service: NodeService {
                    kind: ServiceKind::ConnectProxy,
                    service: format!("{service}-sidecar-proxy"),
                    port: 21000,
                    ..Default::default()
                },
                checks: Vec::new(),
            })
            .collect(),
    )
}

fn describe(snap: &ConfigSnapshot) {
    let cp = snap.connect_proxy().unwrap();
    println!(
        "    snapshot v{} for {}: roots {} (trust domain {}), leaf for {:?}, {} intention(s)",
        snap.version,
        snap.proxy_id,
        snap.roots.as_ref().map_or(0, |r| r.roots.len()),
        snap.roots.as_ref().map_or("?", |r| r.trust_domain.as_str()),
        cp.leaf.as_ref().map(|l| l.service.as_str()),
        cp.intentions.as_ref().map_or(0, |i| i.len()),
    );
    for (id, up) in cp.upstreams.iter() {
        let config = snap.upstream_config(up).unwrap();
        for (target, nodes) in up.endpoints.iter() {
            let addrs: Vec<&str> = nodes.iter().map(|n| n.address()).collect();
            println!(
                "      upstream {id} (127.0.0.1:{}) -> target {target}: {addrs:?}",
                config.local_bind_port
            );
        }
    }
}

async fn next(w: &mut Watcher) -> Arc<ConfigSnapshot> {
    match w.next().await {
        Some(WatchEvent::Snapshot(s)) => s,
        other => panic!("unexpected {other:?}"),
    }
}

/// The CA roots, and one healthy `api` instance.
fn seed(fakes: &FakeDataSources) {
    let roots = IndexedCaRoots {
        active_root_id: "root-1".into(),
        trust_domain: TRUST.into(),
        roots: vec![CaRoot {
            id: "root-1".into(),
            active: true,
            ..Default::default()
        }],
        ..Default::default()
    };
    fakes.ca_roots.set(
        &CaRootsRequest {
            datacenter: "dc1".into(),
        },
        Arc::new(roots),
    );
    fakes.health.set(&health("api"), instances("api", &["10.0.0.1"]));
}

/// An intention denying every source to `web`, and a new leaf for `web`.
fn deny_all_and_renew_leaf(fakes: &FakeDataSources) {
    let deny = Intention {
        source_name: "*".into(),
        action: Some(IntentionAction::Deny),
        ..Default::default()
    };
    fakes.intentions.set(
        &IntentionsRequest {
            datacenter: "dc1".into(),
            destination: "web".into(),
        },
        Arc::new(vec![deny]),
    );
    fakes.leaf.set(
        &LeafRequest {
            datacenter: "dc1".into(),
            service: "web".into(),
            dns_sans: Vec::new(),
            token: None,
        },
        Arc::new(IssuedCert {
            service: "web".into(),
            serial_number: "2".into(),
            ..Default::default()
        }),
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let fakes = FakeDataSources::with_defaults(TRUST);
    seed(&fakes);

    let manager = Manager::new(ManagerConfig::default(), fakes.data_sources());
    let body = br#"{"kind": "connect-proxy", "id": "web-sidecar-proxy", "service": "web-sidecar-proxy", "port": 21000,
        "proxy": {"destination_service_name": "web", "local_service_port": 8080,
                  "upstreams": [{"destinationName": "api", "localBindPort": 9191}]}}"#;
    let service: NodeService = structs::json::from_slice(body).unwrap();
    service.validate().unwrap();
    let id = ProxyId::new("node-1", service.id.clone());
    println!("1. watch {id} before it is registered, then register it (JSON in mixed key casing)");
    let mut w = manager.watch(&id);
    let reg = ProxyRegistration {
        id: id.clone(),
        service: Arc::new(service),
        token: None,
    };
    manager.register(reg, ProxySource::Local, false).await.unwrap();
    describe(&*next(&mut w).await);

    println!("2. a second api instance becomes healthy");
    fakes
        .health
        .set(&health("api"), instances("api", &["10.0.0.1", "10.0.0.2"]));
    describe(&*next(&mut w).await);

    println!("3. an intention and a new leaf arrive in the same instant: one snapshot");
    deny_all_and_renew_leaf(&fakes);
    describe(&*next(&mut w).await);

    println!("4. the data source for api fails: the last good endpoints stay");
    fakes.health.fail(
        &health("api"),
        DataSourceError::Unavailable("catalog unreachable".into()),
    );
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    describe(&w.current().unwrap());

    println!("5. deregister: every watch stops");
    manager.deregister(&id, ProxySource::Local).await;
    let m = manager.metrics();
    println!(
        "    watcher sees {:?}; live watches {}, live states {}, snapshots built {}, data source errors {}",
        w.next()
            .await
            .map(|e| matches!(e, WatchEvent::Deregistered))
            .map(|_| "Deregistered"),
        m.live_watches,
        m.live_states,
        m.snapshots_built,
        m.data_source_errors
    );
}
