//! Manager and State behaviour, driven by fake data sources under paused tokio time.

use proxycfg::data_sources::*;
use proxycfg::fake::FakeDataSources;
use proxycfg::*;
use std::{sync::Arc, time::Duration};
use structs::discovery_chain::{ChainNode, DiscoveryTarget, TargetSubset, target_sni};
use structs::*;

const TRUST: &str = "11111111-2222-3333-4444-555555555555.consul";

struct Fixture {
    fakes: FakeDataSources,
    manager: Manager,
}

fn fixture() -> Fixture {
    fixture_with(ManagerConfig::default())
}

fn fixture_with(config: ManagerConfig) -> Fixture {
    let fakes = FakeDataSources::default();
    fakes.ca_roots.set_fallback(|_| {
        Some(Arc::new(IndexedCaRoots {
            active_root_id: "root-1".into(),
            trust_domain: TRUST.into(),
            ..Default::default()
        }))
    });
    fakes.leaf.set_fallback(|req| {
        Some(Arc::new(IssuedCert {
            service: req.service.clone(),
            ..Default::default()
        }))
    });
    fakes.intentions.set_fallback(|_| Some(Arc::new(Vec::new())));
    fakes.config_entry.set_fallback(|_| Some(None));
    fakes
        .resolved_service_config
        .set_fallback(|_| Some(Arc::new(ResolvedServiceConfig::default())));
    fakes.discovery_chain.set_fallback(|req| {
        Some(Arc::new(CompiledDiscoveryChain::default_for(
            &req.name,
            &req.datacenter,
            TRUST,
            &req.override_protocol,
        )))
    });
    fakes.health.set_fallback(|_| Some(Arc::new(Vec::new())));
    let manager = Manager::new(config, fakes.data_sources());
    Fixture { fakes, manager }
}

fn sidecar(service: &str, port: u16, upstreams: &[(&str, u16)]) -> ProxyRegistration {
    let svc = NodeService {
        kind: ServiceKind::ConnectProxy,
        id: format!("{service}-sidecar-proxy"),
        service: format!("{service}-sidecar-proxy"),
        port,
        proxy: ConnectProxyConfig {
            destination_service_name: service.into(),
            destination_service_id: service.into(),
            local_service_port: 8080,
            upstreams: upstreams
                .iter()
                .map(|(name, port)| Upstream {
                    destination_name: (*name).into(),
                    local_bind_port: *port,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        },
        ..Default::default()
    };
    ProxyRegistration {
        id: ProxyId::new("node-1", svc.id.clone()),
        service: Arc::new(svc),
        token: String::new(),
    }
}

fn health_req(service: &str, dc: &str) -> HealthRequest {
    HealthRequest {
        datacenter: dc.into(),
        service: service.into(),
        connect: true,
        passing_only: true,
        filter: String::new(),
        kind: None,
    }
}

fn chain_req(name: &str) -> DiscoveryChainRequest {
    DiscoveryChainRequest {
        datacenter: "dc1".into(),
        name: name.into(),
        namespace: "default".into(),
        override_protocol: String::new(),
        override_connect_timeout_ms: 0,
        override_mesh_gateway: MeshGatewayMode::Default,
    }
}

fn instance(service: &str, addr: &str) -> CheckServiceNode {
    CheckServiceNode {
        node: Node {
            node: format!("node-{addr}"),
            address: addr.into(),
            ..Default::default()
        },
        service: NodeService {
            kind: ServiceKind::ConnectProxy,
            service: format!("{service}-sidecar-proxy"),
            port: 21000,
            ..Default::default()
        },
        checks: Vec::new(),
    }
}

/// A chain for `service` whose targets are the given (subset, datacenter) pairs.
fn chain_with_targets(service: &str, targets: &[(&str, &str)]) -> CompiledDiscoveryChain {
    let mut chain = CompiledDiscoveryChain::default_for(service, "dc1", TRUST, "tcp");
    chain.targets.clear();
    chain.nodes.clear();
    for (subset, dc) in targets {
        let id = TargetId::new(subset, service, "default", dc);
        chain.targets.insert(
            id.clone(),
            DiscoveryTarget {
                id: id.clone(),
                service: service.into(),
                service_subset: (*subset).into(),
                namespace: "default".into(),
                datacenter: (*dc).into(),
                subset: TargetSubset {
                    filter: format!("Service.Meta.version == {subset}"),
                    only_passing: true,
                },
                sni: target_sni(subset, service, "default", dc, TRUST),
                connect_timeout_ms: 5000,
            },
        );
        chain.nodes.insert(
            format!("resolver:{id}"),
            ChainNode::Resolver {
                name: format!("resolver:{id}"),
                target: id,
                failover: vec![],
                connect_timeout_ms: 5000,
            },
        );
    }
    chain.default = false;
    chain
}

/// Lets every task run and the coalescing window pass (paused time: no real waiting).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}

async fn next_snapshot(w: &mut Watcher) -> Arc<ConfigSnapshot> {
    match tokio::time::timeout(Duration::from_secs(5), w.next()).await {
        Ok(Some(WatchEvent::Snapshot(s))) => s,
        other => panic!("expected a snapshot, got {other:?}"),
    }
}

fn upstream_id(name: &str) -> UpstreamId {
    Upstream {
        destination_name: name.into(),
        ..Default::default()
    }
    .id()
}

#[tokio::test(start_paused = true)]
async fn first_snapshot_is_valid_and_complete() {
    let f = fixture();
    let reg = sidecar("web", 21000, &[("api", 9191), ("db", 9192)]);
    f.fakes
        .health
        .set(&health_req("api", "dc1"), Arc::new(vec![instance("api", "10.0.0.1")]));
    f.manager
        .register(reg.clone(), ProxySource::Local, false)
        .await
        .unwrap();
    let mut w = f.manager.watch(&reg.id);
    let snap = next_snapshot(&mut w).await;
    assert!(snap.is_valid());
    assert_eq!(snap.roots.as_ref().unwrap().trust_domain, TRUST);
    let cp = snap.connect_proxy().unwrap();
    assert_eq!(cp.leaf.as_ref().unwrap().service, "web");
    assert_eq!(cp.upstreams.len(), 2);
    let api = &cp.upstreams[&upstream_id("api")];
    let target = TargetId::new("", "api", "default", "dc1");
    assert_eq!(api.endpoints[&target].len(), 1);
    assert_eq!(api.chain.as_ref().unwrap().targets.len(), 1);
    // roots, leaf, intentions, mesh, resolved config, 2 chains, 2 target health watches.
    assert_eq!(f.manager.metrics().live_watches, 9);
    assert_eq!(f.fakes.active(), 9);
}

#[tokio::test(start_paused = true)]
async fn chain_change_cancels_exactly_the_obsolete_target_watches() {
    let f = fixture();
    let reg = sidecar("web", 21000, &[("api", 9191)]);
    f.manager
        .register(reg.clone(), ProxySource::Local, false)
        .await
        .unwrap();
    let mut w = f.manager.watch(&reg.id);
    next_snapshot(&mut w).await;
    assert_eq!(f.fakes.health.active_for(&health_req("api", "dc1")), 1);

    // New chain: keep the dc1 default target? No: it names v1 and v2 subsets in dc1 and dc2.
    let v1 = HealthRequest {
        filter: "Service.Meta.version == v1".into(),
        ..health_req("api", "dc1")
    };
    let v2 = HealthRequest {
        filter: "Service.Meta.version == v2".into(),
        ..health_req("api", "dc2")
    };
    f.fakes.health.set(&v1, Arc::new(vec![instance("api", "10.0.1.1")]));
    f.fakes.health.set(
        &v2,
        Arc::new(vec![instance("api", "10.0.2.1"), instance("api", "10.0.2.2")]),
    );
    f.fakes.discovery_chain.set(
        &chain_req("api"),
        Arc::new(chain_with_targets("api", &[("v1", "dc1"), ("v2", "dc2")])),
    );
    let snap = next_snapshot(&mut w).await;
    assert_eq!(
        f.fakes.health.active_for(&health_req("api", "dc1")),
        0,
        "old target watch must be gone"
    );
    assert_eq!(f.fakes.health.active_for(&v1), 1);
    assert_eq!(f.fakes.health.active_for(&v2), 1);
    let api = &snap.connect_proxy().unwrap().upstreams[&upstream_id("api")];
    let targets: Vec<String> = api.endpoints.keys().map(|t| t.to_string()).collect();
    assert_eq!(targets, vec!["v1.api.default.dc1", "v2.api.default.dc2"]);
    assert_eq!(api.endpoints[&TargetId::new("v2", "api", "default", "dc2")].len(), 2);

    // Drop only v2: v1's watch keeps running (not restarted), v2's is cancelled.
    let started = f.fakes.health.started();
    f.fakes
        .discovery_chain
        .set(&chain_req("api"), Arc::new(chain_with_targets("api", &[("v1", "dc1")])));
    let snap = next_snapshot(&mut w).await;
    assert_eq!(f.fakes.health.started(), started, "no target watch restarted");
    assert_eq!(f.fakes.health.active_for(&v1), 1);
    assert_eq!(f.fakes.health.active_for(&v2), 0);
    let api = &snap.connect_proxy().unwrap().upstreams[&upstream_id("api")];
    assert_eq!(api.endpoints.len(), 1);

    // A late update from the cancelled v2 watch never reaches the snapshot.
    f.fakes.health.set(&v2, Arc::new(vec![instance("api", "10.0.2.9")]));
    settle().await;
    let current = w.current().unwrap();
    let api = &current.connect_proxy().unwrap().upstreams[&upstream_id("api")];
    assert!(
        !api.endpoints
            .contains_key(&TargetId::new("v2", "api", "default", "dc2"))
    );
}

#[tokio::test(start_paused = true)]
async fn registration_change_rebuilds_the_state() {
    let f = fixture();
    let reg = sidecar("web", 21000, &[("api", 9191)]);
    assert_eq!(
        f.manager
            .register(reg.clone(), ProxySource::Local, false)
            .await
            .unwrap(),
        Registered::Started
    );
    let mut w = f.manager.watch(&reg.id);
    let first = next_snapshot(&mut w).await;

    // Tags do not affect the proxy's config: the State keeps running.
    let mut tagged = (*reg.service).clone();
    tagged.tags = vec!["blue".into()];
    let tagged = ProxyRegistration {
        service: Arc::new(tagged),
        ..reg.clone()
    };
    assert_eq!(
        f.manager.register(tagged, ProxySource::Local, false).await.unwrap(),
        Registered::Unchanged
    );
    assert_eq!(f.manager.metrics().states_started, 1);

    // A new upstream and port change the config: a fresh State with the new watches.
    let changed = sidecar("web", 21001, &[("api", 9191), ("cache", 9193)]);
    assert_eq!(
        f.manager.register(changed, ProxySource::Local, false).await.unwrap(),
        Registered::Rebuilt
    );
    let snap = next_snapshot(&mut w).await;
    assert_eq!(snap.service.port, 21001);
    assert!(snap.version > first.version, "versions keep increasing across rebuilds");
    assert_eq!(snap.connect_proxy().unwrap().upstreams.len(), 2);
    let m = f.manager.metrics();
    assert_eq!((m.states_started, m.live_states), (2, 1));
    // Only the new State's watches are alive: 5 base + 2 chains + 2 targets.
    assert_eq!(m.live_watches, 9);
    assert_eq!(f.fakes.active(), 9);

    // A token change rebuilds too.
    let with_token = ProxyRegistration {
        token: "secret".into(),
        ..sidecar("web", 21001, &[("api", 9191), ("cache", 9193)])
    };
    assert_eq!(
        f.manager.register(with_token, ProxySource::Local, false).await.unwrap(),
        Registered::Rebuilt
    );
    settle().await;
    assert_eq!(
        f.fakes
            .leaf
            .watched_requests()
            .iter()
            .map(|r| r.token.as_str())
            .collect::<Vec<_>>(),
        vec!["secret"]
    );
}

#[tokio::test(start_paused = true)]
async fn deregistration_leaves_no_watch_task() {
    let f = fixture();
    let regs = [
        sidecar("web", 21000, &[("api", 9191)]),
        sidecar("api", 21001, &[("db", 9191), ("cache", 9192)]),
    ];
    for reg in &regs {
        f.manager
            .register(reg.clone(), ProxySource::Local, false)
            .await
            .unwrap();
    }
    settle().await;
    assert!(f.fakes.active() > 0);
    let mut w = f.manager.watch(&regs[0].id);
    next_snapshot(&mut w).await;
    for reg in &regs {
        assert!(f.manager.deregister(&reg.id, ProxySource::Local).await);
    }
    // deregister returns after every watch task has ended: counted, no waiting needed.
    assert_eq!(f.fakes.active(), 0);
    let m = f.manager.metrics();
    assert_eq!((m.live_watches, m.live_states), (0, 0));
    assert!(matches!(w.next().await, Some(WatchEvent::Deregistered)));
    assert!(f.manager.registered().await.is_empty());
    assert!(
        !f.manager.deregister(&regs[0].id, ProxySource::Local).await,
        "second deregister is a no-op"
    );
}

#[tokio::test(start_paused = true)]
async fn watchers_share_one_snapshot() {
    let f = fixture();
    let reg = sidecar("web", 21000, &[("api", 9191)]);
    let mut a = f.manager.watch(&reg.id);
    let mut b = f.manager.watch(&reg.id);
    f.manager
        .register(reg.clone(), ProxySource::Local, false)
        .await
        .unwrap();
    let (sa, sb) = (next_snapshot(&mut a).await, next_snapshot(&mut b).await);
    assert!(Arc::ptr_eq(&sa, &sb));
    // A late watcher gets the current snapshot at once, the same allocation.
    let mut c = f.manager.watch(&reg.id);
    assert!(Arc::ptr_eq(&next_snapshot(&mut c).await, &sa));
    assert_eq!(f.manager.metrics().watchers, 3);
    drop((a, b, c));
    assert_eq!(f.manager.metrics().watchers, 0);
}

#[tokio::test(start_paused = true)]
async fn slow_watcher_gets_only_the_latest() {
    let f = fixture();
    let reg = sidecar("web", 21000, &[("api", 9191)]);
    f.manager
        .register(reg.clone(), ProxySource::Local, false)
        .await
        .unwrap();
    let mut slow = f.manager.watch(&reg.id);
    let first = next_snapshot(&mut slow).await;
    for i in 1..=5 {
        f.fakes.health.set(
            &health_req("api", "dc1"),
            Arc::new(vec![instance("api", &format!("10.0.0.{i}"))]),
        );
        settle().await; // each change is published on its own
    }
    assert_eq!(f.manager.metrics().snapshots_built, first.version + 5);
    let latest = next_snapshot(&mut slow).await;
    assert_eq!(latest.version, first.version + 5);
    let api = &latest.connect_proxy().unwrap().upstreams[&upstream_id("api")];
    assert_eq!(
        api.endpoints[&TargetId::new("", "api", "default", "dc1")][0]
            .node
            .address,
        "10.0.0.5"
    );
    // Nothing is queued behind it.
    assert!(tokio::time::timeout(Duration::from_secs(1), slow.next()).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn watch_before_register() {
    let f = fixture();
    let reg = sidecar("web", 21000, &[]);
    let mut w = f.manager.watch(&reg.id);
    assert!(w.current().is_none());
    assert!(
        tokio::time::timeout(Duration::from_secs(1), w.next()).await.is_err(),
        "nothing before registration"
    );
    f.manager
        .register(reg.clone(), ProxySource::Catalog, false)
        .await
        .unwrap();
    let snap = next_snapshot(&mut w).await;
    assert_eq!(*snap.proxy_id, reg.id);
}

#[tokio::test(start_paused = true)]
async fn burst_is_coalesced_into_one_snapshot() {
    let f = fixture();
    let upstreams = [("a", 9001), ("b", 9002), ("c", 9003), ("d", 9004)];
    let reg = sidecar("web", 21000, &upstreams);
    f.manager
        .register(reg.clone(), ProxySource::Local, false)
        .await
        .unwrap();
    let mut w = f.manager.watch(&reg.id);
    let before = next_snapshot(&mut w).await;
    let built = f.manager.metrics().snapshots_built;
    // Six changes from six different watches inside one coalescing window.
    for (name, _) in upstreams {
        f.fakes
            .health
            .set(&health_req(name, "dc1"), Arc::new(vec![instance(name, "10.9.9.9")]));
    }
    let allow = Intention {
        source_name: "*".into(),
        action: Some(config_entry::IntentionAction::Allow),
        ..Default::default()
    };
    f.fakes.intentions.set(
        &IntentionsRequest {
            datacenter: "dc1".into(),
            destination: "web".into(),
        },
        Arc::new(vec![allow]),
    );
    f.fakes.leaf.set(
        &LeafRequest {
            datacenter: "dc1".into(),
            service: "web".into(),
            token: String::new(),
        },
        Arc::new(IssuedCert {
            service: "web".into(),
            serial_number: "02".into(),
            ..Default::default()
        }),
    );
    let after = next_snapshot(&mut w).await;
    settle().await;
    assert_eq!(
        f.manager.metrics().snapshots_built,
        built + 1,
        "one snapshot for the whole burst"
    );
    assert_eq!(after.version, before.version + 1);
    let cp = after.connect_proxy().unwrap();
    assert_eq!(cp.intentions.as_ref().unwrap().len(), 1);
    assert_eq!(cp.leaf.as_ref().unwrap().serial_number, "02");
    for (name, _) in upstreams {
        assert_eq!(
            cp.upstreams[&upstream_id(name)]
                .endpoints
                .values()
                .next()
                .unwrap()
                .len(),
            1
        );
    }
    // Unchanged parts are shared with the previous snapshot, not copied.
    assert!(Arc::ptr_eq(
        before.roots.as_ref().unwrap(),
        after.roots.as_ref().unwrap()
    ));
    let chain = |s: &ConfigSnapshot| {
        s.connect_proxy().unwrap().upstreams[&upstream_id("a")]
            .chain
            .clone()
            .unwrap()
    };
    assert!(Arc::ptr_eq(&chain(&before), &chain(&after)));
}

#[tokio::test(start_paused = true)]
async fn data_source_error_keeps_last_good_data() {
    let f = fixture();
    let reg = sidecar("web", 21000, &[("api", 9191)]);
    f.manager
        .register(reg.clone(), ProxySource::Local, false)
        .await
        .unwrap();
    let mut w = f.manager.watch(&reg.id);
    let good = next_snapshot(&mut w).await;
    let req = health_req("api", "dc1");
    f.fakes.health.set(&req, Arc::new(vec![instance("api", "10.0.0.1")]));
    let good = {
        let s = next_snapshot(&mut w).await;
        assert!(s.version > good.version);
        s
    };
    f.fakes
        .health
        .fail(&req, DataSourceError::Unavailable("server gone".into()));
    settle().await;
    let m = f.manager.metrics();
    assert_eq!(m.data_source_errors, 1);
    assert_eq!(m.live_states, 1, "the State survives");
    assert_eq!(w.current().unwrap().version, good.version, "an error publishes nothing");
    // The watch still works afterwards.
    f.fakes.health.set(
        &req,
        Arc::new(vec![instance("api", "10.0.0.2"), instance("api", "10.0.0.3")]),
    );
    let snap = next_snapshot(&mut w).await;
    let api = &snap.connect_proxy().unwrap().upstreams[&upstream_id("api")];
    assert_eq!(api.endpoints.values().next().unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn snapshot_waits_for_roots_leaf_intentions_and_config() {
    let f = fixture();
    let leaf_req = LeafRequest {
        datacenter: "dc1".into(),
        service: "web".into(),
        token: String::new(),
    };
    f.fakes.leaf.set_fallback(|_| None);
    let reg = sidecar("web", 21000, &[]);
    f.manager
        .register(reg.clone(), ProxySource::Local, false)
        .await
        .unwrap();
    let mut w = f.manager.watch(&reg.id);
    settle().await;
    assert!(w.current().is_none(), "no snapshot without a leaf");
    f.fakes.leaf.set(
        &leaf_req,
        Arc::new(IssuedCert {
            service: "web".into(),
            ..Default::default()
        }),
    );
    assert!(next_snapshot(&mut w).await.is_valid());
}

#[tokio::test(start_paused = true)]
async fn source_precedence() {
    let f = fixture();
    let reg = sidecar("web", 21000, &[]);
    f.manager
        .register(reg.clone(), ProxySource::Local, false)
        .await
        .unwrap();
    let err = f
        .manager
        .register(sidecar("web", 21005, &[]), ProxySource::Catalog, false)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        RegisterError::SourceConflict {
            id: reg.id.clone(),
            existing: ProxySource::Local
        }
    );
    assert!(
        !f.manager.deregister(&reg.id, ProxySource::Catalog).await,
        "another source cannot deregister it"
    );
    f.manager
        .register(sidecar("web", 21005, &[]), ProxySource::Catalog, true)
        .await
        .unwrap();
    assert_eq!(f.manager.registration(&reg.id).await.unwrap().1, ProxySource::Catalog);

    let typical = ProxyRegistration {
        service: Arc::new(NodeService {
            service: "web".into(),
            ..Default::default()
        }),
        ..reg.clone()
    };
    assert!(matches!(
        f.manager.register(typical, ProxySource::Local, false).await,
        Err(RegisterError::NotAProxy { .. })
    ));
    let gateway = ProxyRegistration {
        service: Arc::new(NodeService {
            kind: ServiceKind::MeshGateway,
            service: "gw".into(),
            port: 443,
            ..Default::default()
        }),
        id: ProxyId::new("node-1", "gw"),
        token: String::new(),
    };
    assert!(matches!(
        f.manager.register(gateway, ProxySource::Local, false).await,
        Err(RegisterError::Unsupported(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn prepared_query_upstream() {
    let f = fixture();
    let mut reg = sidecar("web", 21000, &[]);
    let mut svc = (*reg.service).clone();
    svc.proxy.upstreams.push(Upstream {
        destination_type: DestinationType::PreparedQuery,
        destination_name: "geo-db".into(),
        local_bind_port: 9300,
        ..Default::default()
    });
    reg.service = Arc::new(svc);
    let req = PreparedQueryRequest {
        datacenter: "dc1".into(),
        query: "geo-db".into(),
    };
    f.fakes
        .prepared_query
        .set(&req, PreparedQueryResult(Arc::new(vec![instance("db", "10.1.1.1")])));
    f.manager
        .register(reg.clone(), ProxySource::Local, false)
        .await
        .unwrap();
    let mut w = f.manager.watch(&reg.id);
    let snap = next_snapshot(&mut w).await;
    let (id, up) = snap.connect_proxy().unwrap().upstreams.iter().next().unwrap();
    assert_eq!(id.to_string(), "prepared_query:geo-db");
    assert_eq!(up.endpoints.values().next().unwrap()[0].node.address, "10.1.1.1");
}

#[tokio::test(start_paused = true)]
async fn global_rate_limit_spaces_deliveries() {
    let f = fixture_with(ManagerConfig {
        rate_limit: Some(RateLimit {
            per_second: 10.0,
            burst: 1,
        }),
        ..Default::default()
    });
    let regs: Vec<_> = (0..4).map(|i| sidecar(&format!("svc{i}"), 21000 + i, &[])).collect();
    let start = tokio::time::Instant::now();
    let mut watchers = Vec::new();
    for reg in &regs {
        watchers.push(f.manager.watch(&reg.id));
        f.manager
            .register(reg.clone(), ProxySource::Local, false)
            .await
            .unwrap();
    }
    let mut times = Vec::new();
    for w in &mut watchers {
        next_snapshot(w).await;
        times.push(tokio::time::Instant::now() - start);
    }
    times.sort();
    // Four first snapshots at 10/s: the last one at least 300 ms after the first.
    assert!(times[3] - times[0] >= Duration::from_millis(300), "{times:?}");
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_everything_and_refuses_new_work() {
    let f = fixture();
    f.manager
        .register(sidecar("web", 21000, &[("api", 9191)]), ProxySource::Local, false)
        .await
        .unwrap();
    settle().await;
    f.manager.shutdown().await;
    assert_eq!(f.fakes.active(), 0);
    assert_eq!(f.manager.metrics().live_states, 0);
    assert_eq!(
        f.manager
            .register(sidecar("api", 21001, &[]), ProxySource::Local, false)
            .await
            .unwrap_err(),
        RegisterError::Closed
    );
}
