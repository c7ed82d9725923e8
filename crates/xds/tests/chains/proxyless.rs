//! The same chains served to a proxyless gRPC client (a connect-native instance): every
//! cluster a route names exists in the client's resources — the aggregate cluster of a
//! resolver with failover included, with a policy gRPC accepts — and every EDS cluster has
//! its load assignment.

use super::*;
use envoy_types::pb::envoy::config::listener::v3::ApiListener;

/// The chain snapshot of `web` made a connect-native instance, built as a proxyless
/// client's resources.
fn proxyless(snap: &mut ConfigSnapshot) -> resources::Resources {
    Arc::make_mut(&mut snap.service).connect.native = true;
    resources::build(snap).unwrap()
}

/// The clusters the route configuration `name` can send to, in route order.
fn routed_clusters(r: &resources::Resources, name: &str) -> Vec<String> {
    routes_of(r, name)
        .iter()
        .flat_map(|route| match &action(route).cluster_specifier {
            Some(route_action::ClusterSpecifier::Cluster(c)) => vec![c.clone()],
            _ => weights_of(route).into_iter().map(|(c, _)| c).collect(),
        })
        .collect()
}

/// The members of the aggregate cluster `name` as gRPC reads them: round robin (gRPC NACKs
/// Envoy's CLUSTER_PROVIDED), the members in order.
fn grpc_aggregate_members(r: &resources::Resources, name: &str) -> Vec<String> {
    let c = cluster_named(r, name);
    assert_eq!(c.lb_policy, LbPolicy::RoundRobin as i32, "{name}");
    match c.cluster_discovery_type {
        Some(cluster::ClusterDiscoveryType::ClusterType(t)) => {
            assert_eq!(t.name, "envoy.clusters.aggregate");
            unpack::<AggregateClusterConfig>(t.typed_config.as_ref().unwrap()).clusters
        }
        other => panic!("{name} is not an aggregate cluster: {other:?}"),
    }
}

/// A proxyless client's resources are whole: for each target asked for, an API listener
/// whose RDS names a route configuration that exists; every cluster a route names exists;
/// every aggregate member is an EDS cluster with instances; no sidecar listener.
fn assert_proxyless_resources_resolve(r: &resources::Resources, targets: &[&str]) {
    let clusters = r.of(CLUSTER).unwrap();
    let endpoints = r.of(ENDPOINT).unwrap();
    let listeners = r.of(LISTENER).unwrap();
    assert_eq!(
        listeners.keys().map(String::as_str).collect::<Vec<_>>(),
        targets,
        "one API listener per target, nothing else"
    );
    for target in targets {
        let l: Listener = resource(r, LISTENER, target);
        let api: ApiListener = l.api_listener.expect("an API listener");
        let hcm: HttpConnectionManager = unpack(api.api_listener.as_ref().unwrap());
        let Some(http_connection_manager::RouteSpecifier::Rds(rds)) = hcm.route_specifier else {
            panic!("{target}: RDS expected")
        };
        assert_eq!(rds.route_config_name, *target);
        for name in routed_clusters(r, target) {
            let c = cluster_named(r, &name);
            let members = match c.cluster_discovery_type {
                Some(cluster::ClusterDiscoveryType::ClusterType(_)) => grpc_aggregate_members(r, &name),
                _ => vec![name.clone()],
            };
            for m in members {
                let member = cluster_named(r, &m);
                assert!(member.eds_cluster_config.is_some(), "{m} is an EDS cluster");
                let cla: ClusterLoadAssignment = unpack(&endpoints[&m]);
                assert!(!cla.endpoints.is_empty(), "{m} has instances");
            }
        }
    }
    for name in endpoints.keys() {
        assert!(clusters.contains_key(name), "load assignment {name} without a cluster");
    }
}

/// Failover (per subset, for any subset, on a tcp chain): the routes name the aggregate
/// clusters, which the proxyless build now emits — before, the client was routed to a
/// cluster that did not exist.
#[test]
fn proxyless_failover_chain_has_its_aggregate_clusters() {
    let f = failover_fixture();
    let ca = Ca::new();
    let mut snap = chain_snapshot(&ca, "tcp", &f, &[up("api", 9191), up("db", 9192)], None);
    let r = proxyless(&mut snap);
    assert_proxyless_resources_resolve(&r, &["api", "db"]);

    let (a, b, dr, backup) = (
        sni(&snap, "a", "api"),
        sni(&snap, "b", "api"),
        sni(&snap, "", "api-dr"),
        sni(&snap, "", "api-backup"),
    );
    let (db, replica) = (sni(&snap, "", "db"), sni(&snap, "", "db-replica"));
    assert_eq!(
        routed_clusters(&r, "api"),
        [format!("failover~{b}"), format!("failover~{a}")]
    );
    assert_eq!(routed_clusters(&r, "db"), [format!("failover~{db}")]);
    assert_eq!(
        grpc_aggregate_members(&r, &format!("failover~{a}")),
        [a.clone(), b.clone(), dr]
    );
    assert_eq!(grpc_aggregate_members(&r, &format!("failover~{b}")), [b, backup]);
    assert_eq!(grpc_aggregate_members(&r, &format!("failover~{db}")), [db, replica]);
    assert_eq!(cluster_named(&r, &format!("failover~{a}")).connect_timeout, pb_secs(5));
}

/// A splitter (flattened through a nested one) and a router: every leg and every route
/// names a cluster of the client's.
#[test]
fn proxyless_splitter_and_router_chains_resolve() {
    let f = Fixture::default()
        .http("api")
        .http("api-canary")
        .http("search")
        .http("search-v2")
        .with(json!({"Kind": "service-resolver", "Name": "api", "Subsets": {
            "v1": {"Filter": "Service.Meta.version == v1"},
            "v2": {"Filter": "Service.Meta.version == v2"}}}))
        .with(json!({"Kind": "service-splitter", "Name": "api", "Splits": [
            {"Weight": 50, "ServiceSubset": "v1"},
            {"Weight": 25, "ServiceSubset": "v2"},
            {"Weight": 25, "Service": "api-canary"}]}))
        .with(json!({"Kind": "service-router", "Name": "search", "Routes": [
            {"Match": {"HTTP": {"PathPrefix": "/v2"}}, "Destination": {"Service": "search-v2"}},
            {"Match": {"HTTP": {"Header": [{"Name": "x-beta", "Present": true}]}},
             "Destination": {"Service": "search-v2", "RequestTimeout": "2s"}}]}));
    let ca = Ca::new();
    let mut snap = chain_snapshot(&ca, "http", &f, &[up("api", 9191), up("search", 9192)], None);
    let r = proxyless(&mut snap);
    assert_proxyless_resources_resolve(&r, &["api", "search"]);

    let routes = routes_of(&r, "api");
    assert_eq!(
        weights_of(&routes[0]),
        [
            (sni(&snap, "v1", "api"), 5000),
            (sni(&snap, "v2", "api"), 2500),
            (sni(&snap, "", "api-canary"), 2500),
        ]
    );
    let (search, v2) = (sni(&snap, "", "search"), sni(&snap, "", "search-v2"));
    assert_eq!(routed_clusters(&r, "search"), [v2.clone(), v2, search]);
    // No failover: no aggregate cluster.
    assert!(cluster_names(&r).iter().all(|n| !n.starts_with("failover~")));
}

/// `proxy-defaults`' access logs are for Envoys: a proxyless gRPC client's listeners carry
/// none.
#[test]
fn a_proxyless_client_gets_no_access_logs() {
    use envoy_types::pb::envoy::config::listener::v3::Listener;
    let f = Fixture::default().http("api");
    let ca = Ca::new();
    let mut snap = chain_snapshot(&ca, "http", &f, &[up("api", 9191)], None);
    let entry = r#"{"Kind": "proxy-defaults", "Name": "global", "AccessLogs": {"Enabled": true}}"#;
    snap.proxy_defaults = Some(Some(Arc::new(serde_json::from_str(entry).unwrap())));
    let r = proxyless(&mut snap);
    let listeners = r.of(resources::LISTENER).unwrap();
    assert!(!listeners.is_empty());
    for any in listeners.values() {
        let listener: Listener = unpack(any);
        assert!(listener.access_log.is_empty());
        use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
        let api: ApiListener = listener.api_listener.unwrap();
        let hcm: HttpConnectionManager = unpack(api.api_listener.as_ref().unwrap());
        assert!(hcm.access_log.is_empty());
    }
}
