//! State behaviour: what a proxy watches and how updates become snapshots (paused tokio time).

use crate::common::*;
use proxycfg::data_sources::*;
use proxycfg::*;
use std::sync::Arc;
use structs::*;

#[tokio::test(start_paused = true)]
async fn first_snapshot_is_valid_and_complete() {
    let f = fixture();
    let reg = sidecar("web", 21000, &[("api", 9191), ("db", 9192)]);
    f.fakes
        .health
        .set(&health_req("api", "dc1"), Arc::new(vec![instance("api", "10.0.0.1")]));
    let mut w = register_and_watch(&f, &reg).await;
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
    // roots, leaf, intentions, peers' trust bundles, mesh, proxy-defaults, resolved config,
    // 2 chains, 2 target health watches.
    assert_eq!(f.manager.metrics().live_watches, 11);
    assert_eq!(f.fakes.active(), 11);
}

#[tokio::test(start_paused = true)]
async fn chain_change_cancels_exactly_the_obsolete_target_watches() {
    let f = fixture();
    let reg = sidecar("web", 21000, &[("api", 9191)]);
    let mut w = register_and_watch(&f, &reg).await;
    next_snapshot(&mut w).await;
    assert_eq!(f.fakes.health.active_for(&health_req("api", "dc1")), 1);

    // New chain: keep the dc1 default target? No: it names v1 and v2 subsets (a target in another datacenter is reached through
    // mesh gateways, not watched: see `a_target_in_another_datacenter_goes_through_gateways`).
    // chain_with_targets' subsets say OnlyPassing.
    let v1 = HealthRequest {
        filter: "Service.Meta.version == v1".into(),
        passing_only: true,
        ..health_req("api", "dc1")
    };
    let v2 = HealthRequest {
        filter: "Service.Meta.version == v2".into(),
        passing_only: true,
        ..health_req("api", "dc1")
    };
    f.fakes.health.set(&v1, Arc::new(vec![instance("api", "10.0.1.1")]));
    f.fakes.health.set(
        &v2,
        Arc::new(vec![instance("api", "10.0.2.1"), instance("api", "10.0.2.2")]),
    );
    f.fakes.discovery_chain.set(
        &chain_req("api"),
        Arc::new(chain_with_targets("api", &[("v1", "dc1"), ("v2", "dc1")])),
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
    assert_eq!(
        targets,
        vec!["v1.api.default.default.dc1", "v2.api.default.default.dc1"]
    );
    assert_eq!(api.endpoints[&TargetId::new("v2", "api", "default", "dc1")].len(), 2);

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
async fn burst_is_coalesced_into_one_snapshot() {
    let f = fixture();
    let upstreams = [("a", 9001), ("b", 9002), ("c", 9003), ("d", 9004)];
    let reg = sidecar("web", 21000, &upstreams);
    let mut w = register_and_watch(&f, &reg).await;
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
            dns_sans: Vec::new(),
            token: None,
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
    let mut w = register_and_watch(&f, &reg).await;
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
        dns_sans: Vec::new(),
        token: None,
    };
    f.fakes.leaf.set_fallback(|_| None);
    let reg = sidecar("web", 21000, &[]);
    let mut w = register_and_watch(&f, &reg).await;
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
    let mut w = register_and_watch(&f, &reg).await;
    let snap = next_snapshot(&mut w).await;
    let (id, up) = snap.connect_proxy().unwrap().upstreams.iter().next().unwrap();
    assert_eq!(id.to_string(), "prepared_query:geo-db");
    assert_eq!(up.endpoints.values().next().unwrap()[0].node.address, "10.1.1.1");
}

#[tokio::test(start_paused = true)]
async fn after_the_first_snapshot_a_lone_change_goes_out_at_once_and_a_quick_second_waits_for_the_window() {
    let f = fixture();
    let reg = sidecar("web", 21000, &[("api", 9191)]);
    f.manager
        .register(reg.clone(), ProxySource::Local, false)
        .await
        .unwrap();
    let mut w = f.manager.watch(&reg.id);
    let first = next_snapshot(&mut w).await;
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;

    // A lone change after a quiet window: no coalescing delay at all.
    let t0 = tokio::time::Instant::now();
    f.fakes
        .health
        .set(&health_req("api", "dc1"), Arc::new(vec![instance("api", "10.9.9.1")]));
    let second = next_snapshot(&mut w).await;
    assert_eq!(t0.elapsed(), std::time::Duration::ZERO);
    assert_eq!(second.version, first.version + 1);

    // Another change 2 ms later falls in the window that publication opened: it goes out
    // when the window (10 ms) ends, together with a third one.
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    f.fakes
        .health
        .set(&health_req("api", "dc1"), Arc::new(vec![instance("api", "10.9.9.2")]));
    tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    f.fakes
        .health
        .set(&health_req("api", "dc1"), Arc::new(vec![instance("api", "10.9.9.3")]));
    let third = next_snapshot(&mut w).await;
    assert_eq!(t0.elapsed(), std::time::Duration::from_millis(10));
    assert_eq!(third.version, second.version + 1, "the two changes went out as one");
    let cp = third.connect_proxy().unwrap();
    let nodes = cp.upstreams[&upstream_id("api")].endpoints.values().next().unwrap();
    assert_eq!(nodes[0].address(), "10.9.9.3");
}

/// The JWT providers are watched while an intention requires a token, and the snapshot
/// waits for them; without such an intention the watch stops.
#[tokio::test(start_paused = true)]
async fn jwt_providers_are_watched_while_intentions_require_tokens() {
    let f = fixture();
    let ixn_req = IntentionsRequest {
        datacenter: "dc1".into(),
        destination: "web".into(),
    };
    let list_req = ConfigEntryListRequest::shared(ConfigEntryKind::JwtProvider);
    let reg = sidecar("web", 21000, &[]);
    let mut w = register_and_watch(&f, &reg).await;
    let first = next_snapshot(&mut w).await;
    assert!(first.connect_proxy().unwrap().jwt_providers.is_none());
    assert_eq!(f.fakes.config_entry_list.active_for(&list_req), 0);
    // An intention requiring a token: no snapshot until the providers are known.
    let mut ixn = Intention {
        source_ns: "default".into(),
        source_name: "api".into(),
        destination_ns: "default".into(),
        destination_name: "web".into(),
        action: Some(config_entry::IntentionAction::Allow),
        ..Default::default()
    };
    ixn.jwt = Some(config_entry::IntentionJwtRequirement {
        providers: vec![config_entry::IntentionJwtProvider {
            name: "okta".into(),
            verify_claims: vec![],
        }],
    });
    f.fakes.intentions.set(&ixn_req, Arc::new(vec![ixn]));
    settle().await;
    assert_eq!(f.fakes.config_entry_list.active_for(&list_req), 1);
    assert!(
        Arc::ptr_eq(&w.current().unwrap(), &first),
        "held back until the providers are known"
    );
    let okta = Arc::new(
        ConfigEntry::from_json(serde_json::json!({"Kind": "jwt-provider", "Name": "okta",
            "JSONWebKeySet": {"Remote": {"URI": "https://okta.example/keys"}}}))
        .unwrap(),
    );
    f.fakes.config_entry_list.set(&list_req, Arc::new(vec![okta]));
    let snap = next_snapshot(&mut w).await;
    let cp = snap.connect_proxy().unwrap();
    assert!(cp.jwt_provider("okta").is_some());
    assert!(cp.jwt_provider("auth0").is_none());
    // No token required any more: the watch goes, and the providers with it.
    f.fakes.intentions.set(&ixn_req, Arc::new(Vec::new()));
    let snap = next_snapshot(&mut w).await;
    assert!(snap.connect_proxy().unwrap().jwt_providers.is_none());
    assert_eq!(f.fakes.config_entry_list.active_for(&list_req), 0);
}

/// A transparent proxy's upstreams follow the service graph: the snapshot waits for the
/// services and intentions; an allow intention adds the service as an implicit upstream
/// (its chain and target watched as any upstream's), a deny removes it with its watches;
/// the default decision covers services no intention names; a declared upstream stays.
#[tokio::test(start_paused = true)]
async fn transparent_proxy_upstreams_follow_intentions() {
    let f = fixture();
    let services_req = ServiceListRequest {
        datacenter: "dc1".into(),
        typical_only: true,
    };
    let ixns_req = ConfigEntryListRequest::shared(ConfigEntryKind::ServiceIntentions);
    let mut reg = sidecar("web", 21000, &[("db", 9192)]);
    Arc::make_mut(&mut reg.service).proxy.mode = ProxyMode::Transparent;
    let mut w = register_and_watch(&f, &reg).await;
    settle().await;
    assert!(w.current().is_none(), "no snapshot before the service graph is known");
    assert_eq!(f.fakes.service_list.active_for(&services_req), 1);
    let names = |v: &[&str]| Arc::new(v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
    f.fakes
        .service_list
        .set(&services_req, ServiceNames(names(&["api", "cache", "db", "web"])));
    let entry = |dest: &str, action: &str| {
        Arc::new(
            ConfigEntry::from_json(serde_json::json!({"Kind": "service-intentions", "Name": dest,
                "Sources": [{"Name": "web", "Action": action}]}))
            .unwrap(),
        )
    };
    // The fixture's default decision is allow (ACLs off): everything but itself.
    f.fakes
        .config_entry_list
        .set(&ixns_req, Arc::new(vec![entry("cache", "deny")]));
    let snap = next_snapshot(&mut w).await;
    let cp = snap.connect_proxy().unwrap();
    assert!(cp.transparent);
    assert_eq!(cp.intention_upstreams.as_deref().unwrap(), &["api", "db"]);
    let ids: Vec<String> = cp.upstreams.keys().map(|id| id.name.clone()).collect();
    assert_eq!(ids, ["api", "db"]);
    assert!(ConnectProxySnapshot::is_implicit(&cp.upstreams[&upstream_id("api")]));
    assert!(!ConnectProxySnapshot::is_implicit(&cp.upstreams[&upstream_id("db")]));
    assert_eq!(f.fakes.discovery_chain.active_for(&chain_req("api")), 1);
    assert_eq!(f.fakes.health.active_for(&health_req("api", "dc1")), 1);

    // Deny api, allow cache: api's watches go, cache's start; db (declared) stays.
    f.fakes.config_entry_list.set(
        &ixns_req,
        Arc::new(vec![entry("cache", "allow"), entry("api", "deny"), entry("db", "deny")]),
    );
    let snap = next_snapshot(&mut w).await;
    let cp = snap.connect_proxy().unwrap();
    assert_eq!(cp.intention_upstreams.as_deref().unwrap(), &["cache"]);
    let ids: Vec<String> = cp.upstreams.keys().map(|id| id.name.clone()).collect();
    assert_eq!(ids, ["cache", "db"]);
    assert_eq!(f.fakes.discovery_chain.active_for(&chain_req("api")), 0);
    assert_eq!(f.fakes.health.active_for(&health_req("api", "dc1")), 0);
    assert_eq!(f.fakes.discovery_chain.active_for(&chain_req("cache")), 1);
    assert_eq!(f.fakes.discovery_chain.active_for(&chain_req("db")), 1);

    // A new service appears: allowed by default.
    f.fakes.service_list.set(
        &services_req,
        ServiceNames(names(&["api", "cache", "db", "search", "web"])),
    );
    let snap = next_snapshot(&mut w).await;
    let cp = snap.connect_proxy().unwrap();
    assert_eq!(cp.intention_upstreams.as_deref().unwrap(), &["cache", "search"]);

    // Deregistering the proxy ends every watch, implicit ones included.
    f.manager.deregister(&reg.id, ProxySource::Local).await;
    settle().await;
    assert_eq!(f.fakes.active(), 0);
}

/// An upstream added to a running proxy goes out in one snapshot with its chain and its
/// endpoints: the publication waits for the watches the change started (not three snapshots:
/// the upstream, its chain, its endpoints).
#[tokio::test(start_paused = true)]
async fn an_added_upstream_goes_out_with_its_chain_and_endpoints() {
    let f = fixture();
    let services_req = ServiceListRequest {
        datacenter: "dc1".into(),
        typical_only: true,
    };
    let mut reg = sidecar("web", 21000, &[]);
    Arc::make_mut(&mut reg.service).proxy.mode = ProxyMode::Transparent;
    let names = |v: &[&str]| ServiceNames(Arc::new(v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()));
    f.fakes.service_list.set(&services_req, names(&["web"]));
    f.fakes.config_entry_list.set(
        &ConfigEntryListRequest::shared(ConfigEntryKind::ServiceIntentions),
        Arc::new(vec![]),
    );
    let mut w = register_and_watch(&f, &reg).await;
    let first = next_snapshot(&mut w).await;
    assert!(first.connect_proxy().unwrap().upstreams.is_empty());
    settle().await;
    f.fakes
        .health
        .set(&health_req("api", "dc1"), Arc::new(vec![instance("api", "10.0.0.1")]));
    f.fakes.service_list.set(&services_req, names(&["api", "web"]));
    let snap = next_snapshot(&mut w).await;
    let api = &snap.connect_proxy().unwrap().upstreams[&upstream_id("api")];
    let chain = api.chain.as_ref().expect("the chain, in the same snapshot");
    let target = chain.targets.keys().next().unwrap();
    assert_eq!(api.endpoints.get(target).map(|e| e.len()), Some(1), "and the endpoints");
    assert_eq!(snap.version, first.version + 1, "one snapshot for the change");
    // Only the upstreams changed: every proxy-wide input is the last snapshot's very `Arc`,
    // so xds builds the new upstream's resources alone, not the whole proxy again.
    let (a, b) = (first.connect_proxy().unwrap(), snap.connect_proxy().unwrap());
    assert!(Arc::ptr_eq(&a.peer_targets, &b.peer_targets), "peer targets copied");
    assert!(Arc::ptr_eq(&a.peered, &b.peered), "peered upstreams copied");
    assert!(Arc::ptr_eq(&a.destinations, &b.destinations), "destinations copied");
    assert!(Arc::ptr_eq(&a.destination_gateways, &b.destination_gateways));
    assert!(Arc::ptr_eq(&a.http_checks, &b.http_checks));
}

/// Destinations outside the mesh: a service-defaults `Destination` the intentions allow
/// becomes one once the entries are known; the terminating-gateway entries are watched only
/// while some destination is reachable, then the instances of each gateway linking one
/// (by name or `*`); a deny drops the destination and every watch it needed.
#[tokio::test(start_paused = true)]
async fn transparent_proxy_destinations_follow_entries_and_intentions() {
    let f = fixture();
    let services_req = ServiceListRequest {
        datacenter: "dc1".into(),
        typical_only: true,
    };
    let list = |kind| ConfigEntryListRequest::shared(kind);
    let mut reg = sidecar("web", 21000, &[]);
    Arc::make_mut(&mut reg.service).proxy.mode = ProxyMode::Transparent;
    let mut w = register_and_watch(&f, &reg).await;
    f.fakes
        .service_list
        .set(&services_req, ServiceNames(Arc::new(vec!["web".to_owned()])));
    let entry = |v: serde_json::Value| Arc::new(ConfigEntry::from_json(v).unwrap());
    let deny_all = || {
        entry(
            serde_json::json!({"Kind": "service-intentions", "Name": "*", "Sources": [{"Name": "*", "Action": "deny"}]}),
        )
    };
    f.fakes
        .config_entry_list
        .set(&list(ConfigEntryKind::ServiceIntentions), Arc::new(vec![deny_all()]));
    f.fakes.config_entry_list.set(
        &list(ConfigEntryKind::ServiceDefaults),
        Arc::new(vec![
            entry(
                serde_json::json!({"Kind": "service-defaults", "Name": "ext", "Protocol": "http",
                "Destination": {"Addresses": ["192.0.2.10"], "Port": 80}}),
            ),
            entry(serde_json::json!({"Kind": "service-defaults", "Name": "api", "Protocol": "http"})),
        ]),
    );
    let snap = next_snapshot(&mut w).await;
    assert!(snap.connect_proxy().unwrap().destinations.is_empty(), "denied");
    assert_eq!(
        f.fakes
            .config_entry_list
            .active_for(&list(ConfigEntryKind::TerminatingGateway)),
        0
    );

    // Allowed: the destination is known, with no gateway yet; the gateway entries are watched.
    let allow = entry(
        serde_json::json!({"Kind": "service-intentions", "Name": "ext", "Sources": [{"Name": "web", "Action": "allow"}]}),
    );
    f.fakes.config_entry_list.set(
        &list(ConfigEntryKind::ServiceIntentions),
        Arc::new(vec![deny_all(), Arc::clone(&allow)]),
    );
    let snap = next_snapshot(&mut w).await;
    let cp = snap.connect_proxy().unwrap();
    let ext = &cp.destinations["ext"];
    assert_eq!(ext.destination.addresses, ["192.0.2.10"]);
    assert_eq!(ext.protocol, structs::Protocol::Http);
    assert!(ext.gateways.is_empty());
    assert_eq!(
        f.fakes
            .config_entry_list
            .active_for(&list(ConfigEntryKind::TerminatingGateway)),
        1
    );

    // Two gateways link it (one by `*`), a third links another service.
    f.fakes.config_entry_list.set(
        &list(ConfigEntryKind::TerminatingGateway),
        Arc::new(vec![
            entry(serde_json::json!({"Kind": "terminating-gateway", "Name": "tgw-a", "Services": [{"Name": "ext"}]})),
            entry(serde_json::json!({"Kind": "terminating-gateway", "Name": "tgw-b", "Services": [{"Name": "*"}]})),
            entry(
                serde_json::json!({"Kind": "terminating-gateway", "Name": "tgw-c", "Services": [{"Name": "billing"}]}),
            ),
        ]),
    );
    let gateway_req = |name: &str| HealthRequest {
        connect: false,
        kind: Some(structs::ServiceKind::TerminatingGateway),
        ..health_req(name, "dc1")
    };
    let snap = next_snapshot(&mut w).await;
    assert_eq!(
        snap.connect_proxy().unwrap().destinations["ext"].gateways,
        ["tgw-a", "tgw-b"]
    );
    assert_eq!(f.fakes.health.active_for(&gateway_req("tgw-a")), 1);
    assert_eq!(f.fakes.health.active_for(&gateway_req("tgw-b")), 1);
    assert_eq!(f.fakes.health.active_for(&gateway_req("tgw-c")), 0);
    let mut gw = instance("tgw-a", "10.0.0.9");
    gw.service.kind = structs::ServiceKind::TerminatingGateway;
    f.fakes.health.set(&gateway_req("tgw-a"), Arc::new(vec![gw]));
    let snap = next_snapshot(&mut w).await;
    assert_eq!(snap.connect_proxy().unwrap().destination_gateways["tgw-a"].len(), 1);

    // Denied again: the destination goes, and every watch it needed.
    f.fakes
        .config_entry_list
        .set(&list(ConfigEntryKind::ServiceIntentions), Arc::new(vec![deny_all()]));
    let snap = next_snapshot(&mut w).await;
    let cp = snap.connect_proxy().unwrap();
    assert!(cp.destinations.is_empty() && cp.destination_gateways.is_empty());
    assert_eq!(
        f.fakes
            .config_entry_list
            .active_for(&list(ConfigEntryKind::TerminatingGateway)),
        0
    );
    assert_eq!(f.fakes.health.active_for(&gateway_req("tgw-a")), 0);
    assert_eq!(f.fakes.health.active_for(&gateway_req("tgw-b")), 0);
    f.manager.deregister(&reg.id, ProxySource::Local).await;
    settle().await;
    assert_eq!(f.fakes.active(), 0);
}

/// The service graph under default deny: only allow intentions (exact or wildcard, an L7
/// one counting as allow) reach a service; the most precise intention decides.
#[test]
fn intention_upstreams_under_default_deny() {
    let entries: Vec<Arc<ConfigEntry>> = [
        serde_json::json!({"Kind": "service-intentions", "Name": "api",
            "Sources": [{"Name": "web", "Action": "allow"}]}),
        serde_json::json!({"Kind": "service-intentions", "Name": "*",
            "Sources": [{"Name": "web", "Action": "allow"}, {"Name": "*", "Action": "deny"}]}),
        serde_json::json!({"Kind": "service-intentions", "Name": "db",
            "Sources": [{"Name": "web", "Action": "deny"}]}),
        serde_json::json!({"Kind": "service-intentions", "Name": "search",
            "Sources": [{"Name": "web", "Permissions": [{"Action": "allow", "HTTP": {"PathPrefix": "/"}}]}]}),
    ]
    .into_iter()
    .map(|j| Arc::new(ConfigEntry::from_json(j).unwrap()))
    .collect();
    let candidates: Vec<String> = ["api", "cache", "db", "search", "web"].map(String::from).to_vec();
    let allowed = handler::intention_upstreams("web", &candidates, &entries, false);
    assert_eq!(allowed, ["api", "cache", "search"]);
    let allowed = handler::intention_upstreams("billing", &candidates, &entries, true);
    assert!(allowed.is_empty(), "{allowed:?}");
    let allowed = handler::intention_upstreams("web", &candidates, &entries[..1], false);
    assert_eq!(allowed, ["api"]);
}

#[tokio::test(start_paused = true)]
async fn a_target_in_another_datacenter_goes_through_gateways() {
    let f = fixture();
    let mut reg = sidecar("web", 21000, &[("api", 9191)]);
    let mut service = (*reg.service).clone();
    service.proxy.upstreams[0].mesh_gateway.mode = MeshGatewayMode::Local;
    reg.service = Arc::new(service);
    let gw = |dc: &str, lan: &str, wan: &str| {
        let mut node = instance("mesh-gateway", lan);
        node.service.kind = ServiceKind::MeshGateway;
        node.service.tagged_addresses.insert(
            "wan".into(),
            structs::service::ServiceAddress {
                address: wan.into(),
                port: 443,
            },
        );
        (dc.to_owned(), Arc::new(vec![node]))
    };
    let gateways = Arc::new(std::collections::BTreeMap::from([
        gw("dc1", "10.0.0.9", "198.51.100.1"),
        gw("dc2", "10.2.0.9", "198.51.100.2"),
    ]));
    let req = MeshGatewaysRequest {
        datacenter: "dc1".into(),
    };
    f.fakes.mesh_gateways.set(&req, MeshGatewaysByDc(gateways));
    // The chain is asked with the upstream's mode.
    let chain = DiscoveryChainRequest {
        override_mesh_gateway: MeshGatewayMode::Local,
        ..chain_req("api")
    };
    f.fakes
        .discovery_chain
        .set(&chain, Arc::new(chain_with_targets("api", &[("", "dc1"), ("", "dc2")])));
    let mut w = register_and_watch(&f, &reg).await;
    let in_dc2 = TargetId::new("", "api", "default", "dc2");
    let snap = loop {
        let s = next_snapshot(&mut w).await;
        if s.connect_proxy().unwrap().upstreams[&upstream_id("api")]
            .endpoints
            .contains_key(&in_dc2)
        {
            break s;
        }
    };
    settle().await;
    // Mode local: this datacenter's gateway, at its own address; dc2's target is not
    // watched (only dc1's is).
    let api = &snap.connect_proxy().unwrap().upstreams[&upstream_id("api")];
    assert_eq!(api.endpoints[&in_dc2][0].address(), "10.0.0.9");
    assert!(f.fakes.health.watched_requests().iter().all(|r| r.datacenter == "dc1"));
    assert_eq!(f.fakes.mesh_gateways.active(), 1);
    // Without a target elsewhere, the gateways are not followed.
    f.fakes
        .discovery_chain
        .set(&chain, Arc::new(chain_with_targets("api", &[("", "dc1")])));
    loop {
        let s = next_snapshot(&mut w).await;
        if s.connect_proxy().unwrap().mesh_gateways.is_none() {
            break;
        }
    }
    settle().await;
    assert_eq!(f.fakes.mesh_gateways.active(), 0);
}

/// An upstream with `DestinationPeer`: when only the exporter's mesh gateways or instances
/// move (same name, SNI, identities, protocol and bundle), the chain (and the `peered` entry)
/// stay the same `Arc`s and only the endpoints change, so the proxy's next build is of its
/// load assignments alone; a change of what the chain is built from builds it again.
#[tokio::test(start_paused = true)]
async fn a_peers_gateway_change_changes_only_the_peered_upstreams_endpoints() {
    peered_upstream_in_mode(MeshGatewayMode::Default).await;
}

/// In mesh gateway mode `local`, the peered upstream's connections go to this datacenter's
/// gateways (none until they are known), whatever the peer's gateways are.
#[tokio::test(start_paused = true)]
async fn a_peered_upstream_in_mode_local_goes_to_the_local_gateways() {
    peered_upstream_in_mode(MeshGatewayMode::Local).await;
}

#[allow(clippy::unwrap_used)] // a test's helper: a panic is the failure report
async fn peered_upstream_in_mode(mode: MeshGatewayMode) {
    let f = fixture();
    let local = mode == MeshGatewayMode::Local;
    if local {
        let req = MeshGatewaysRequest {
            datacenter: "dc1".into(),
        };
        let gateways = std::collections::BTreeMap::from([(
            "dc1".to_owned(),
            Arc::new(vec![instance("mesh-gateway", "10.0.0.100")]),
        )]);
        f.fakes.mesh_gateways.set(&req, MeshGatewaysByDc(Arc::new(gateways)));
    }
    let mut reg = sidecar("web", 21000, &[]);
    let mut svc = (*reg.service).clone();
    svc.proxy.upstreams.push(Upstream {
        destination_name: "api".into(),
        destination_peer: "cluster-a".into(),
        local_bind_port: 9300,
        mesh_gateway: MeshGatewayConfig { mode },
        ..Default::default()
    });
    reg.service = Arc::new(svc);
    let req = PeeredUpstreamRequest {
        peer: "cluster-a".into(),
        service: "api".into(),
        token: None,
    };
    let exported = |digest: &str, gateway: &str| {
        Arc::new(structs::peering::PeeredUpstream {
            service: Some(structs::peering::ImportedService {
                name: "api".into(),
                instances: vec![instance("api", &format!("10.9.0.{}", digest.len()))],
                mesh_gateways: vec![instance("mesh-gateway", gateway)],
                sni: "api.default.default.cluster-b.external.aaaa.consul".into(),
                spiffe_ids: vec!["spiffe://aaaa.consul/ns/default/dc/dc1/svc/api".into()],
                protocol: if digest == "http" { "http" } else { "tcp" }.into(),
                digest: digest.into(),
            }),
            bundle: Some(structs::peering::PeerTrustBundle {
                peer: "cluster-a".into(),
                trust_domain: "aaaa.consul".into(),
                datacenter: "dc1".into(),
                root_pems: vec!["-----BEGIN CERTIFICATE-----".into()],
            }),
        })
    };
    f.fakes.peered_upstream.set(&req, exported("d1", "192.0.2.1"));
    let mut w = register_and_watch(&f, &reg).await;
    let mut first = next_snapshot(&mut w).await;
    while local && first.connect_proxy().unwrap().mesh_gateways.is_none() {
        first = next_snapshot(&mut w).await;
    }
    let cp = first.connect_proxy().unwrap();
    let (id, up) = cp.upstreams.iter().next().unwrap();
    let chain = up.chain.clone().unwrap();
    let at = |snap: &ConfigSnapshot| {
        let up = &snap.connect_proxy().unwrap().upstreams[id];
        up.endpoints.values().next().unwrap()[0].address().to_owned()
    };
    // Mode local: this datacenter's gateway, whatever the peer's are.
    let expect = |peers: &str| {
        if local {
            "10.0.0.100".to_owned()
        } else {
            peers.to_owned()
        }
    };
    assert_eq!(at(&first), expect("192.0.2.1"));

    f.fakes.peered_upstream.set(&req, exported("d1", "192.0.2.2"));
    let second = next_snapshot(&mut w).await;
    let cp2 = second.connect_proxy().unwrap();
    assert!(
        Arc::ptr_eq(cp2.upstreams[id].chain.as_ref().unwrap(), &chain),
        "the chain is kept"
    );
    assert!(Arc::ptr_eq(&cp2.peered, &cp.peered), "so is what it was built from");
    assert_eq!(at(&second), expect("192.0.2.2"));

    // Another instance in the peer (a new digest): proxies here dial its gateways still.
    f.fakes.peered_upstream.set(&req, exported("d2-more", "192.0.2.2"));
    let third = next_snapshot(&mut w).await;
    assert!(Arc::ptr_eq(
        third.connect_proxy().unwrap().upstreams[id].chain.as_ref().unwrap(),
        &chain
    ));
    assert_eq!(at(&third), expect("192.0.2.2"));

    f.fakes.peered_upstream.set(&req, exported("http", "192.0.2.2"));
    let fourth = next_snapshot(&mut w).await;
    let cp4 = fourth.connect_proxy().unwrap();
    assert!(
        !Arc::ptr_eq(cp4.upstreams[id].chain.as_ref().unwrap(), &chain),
        "the protocol changed"
    );
    assert_eq!(cp4.peered[id].service.as_ref().unwrap().protocol, "http");
}
