//! Golden tests of discovery chains: routers, splitters and resolvers (subsets, failover,
//! redirects, load balancers), upstream limits and outlier detection, the mesh's TLS
//! parameters and request normalization, and HTTP/2 upstreams. Each chain is compiled by the real compiler from config
//! entries decoded as the HTTP API decodes them, put in a snapshot with endpoints for every
//! target, built into resources, checked against its golden and validated by Envoy; then a
//! few facts are asserted on the resources themselves.

use super::*;
use envoy_types::pb::envoy::config::cluster::v3::cluster::LbPolicy;
use envoy_types::pb::envoy::config::route::v3::{
    HeaderMatcher, Route, RouteAction, header_matcher, query_parameter_matcher, route, route_action, route_match,
};
use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig as AggregateClusterConfig;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::TlsParameters;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::tls_parameters::TlsProtocol;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{HttpProtocolOptions, http_protocol_options};
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher;
use proxycfg::UpstreamSnapshot;
use serde_json::{Value, json};
use std::time::Duration;
use structs::discovery_chain::target_sni;
use structs::{CompiledDiscoveryChain, ConfigEntry, Upstream};

/// Config entries by kind, decoded from JSON and validated as the HTTP API would.
type Fixture = discovery_chain::fixture::EntrySet;

/// The chain of `upstream` as proxycfg compiles it: the upstream's `Config.protocol` and
/// `Config.connect_timeout_ms` override the chain's.
fn compile(entries: &Fixture, upstream: &Upstream, trust_domain: &str) -> CompiledDiscoveryChain {
    let options = upstream.options();
    entries
        .compile_with(
            &upstream.destination_name,
            trust_domain,
            options.protocol,
            options
                .connect_timeout_ms
                .map(|ms| Duration::from_millis(u64::from(ms))),
        )
        .unwrap()
}

/// An upstream of `web`: name, local bind port and its `Config`.
struct Up {
    name: &'static str,
    port: u16,
    config: Value,
}

fn up(name: &'static str, port: u16) -> Up {
    Up {
        name,
        port,
        config: json!({}),
    }
}

/// A snapshot of `web` (speaking `local_protocol`) with `upstreams`, each following the
/// chain `entries` compile for it, every chain target with two instances of its own, and
/// the `mesh` config entry if given.
fn chain_snapshot(
    ca: &Ca,
    local_protocol: &'static str,
    entries: &Fixture,
    upstreams: &[Up],
    mesh: Option<Value>,
) -> ConfigSnapshot {
    let mut snap = snapshot(
        ca,
        &Scenario {
            protocol: local_protocol,
            upstreams: vec![],
            intentions: vec![],
            instances: vec![],
        },
    );
    let trust_domain = snap.roots.as_ref().unwrap().trust_domain.clone();
    let service = Arc::make_mut(&mut snap.service);
    let mut map = BTreeMap::new();
    for (index, u) in upstreams.iter().enumerate() {
        let Value::Object(config) = u.config.clone() else {
            panic!("upstream config must be an object")
        };
        let upstream = Upstream {
            destination_name: u.name.into(),
            local_bind_port: u.port,
            config,
            ..Default::default()
        };
        let chain = compile(entries, &upstream, &trust_domain);
        let mut us = UpstreamSnapshot::new(index);
        for (t, target) in chain.targets.keys().enumerate() {
            let service = &chain.targets[target].service;
            let nodes = (1..=2)
                .map(|host| instance(service, &format!("10.{}.{t}.{host}", index + 1), 21000))
                .collect();
            us.endpoints.insert(target.clone(), Arc::new(nodes));
        }
        us.chain = Some(Arc::new(chain));
        let id = Upstream {
            destination_name: u.name.into(),
            ..Default::default()
        }
        .id();
        map.insert(Arc::new(id), Arc::new(us));
        service.proxy.upstreams.push(upstream);
    }
    let KindSnapshot::ConnectProxy(cp) = &mut snap.kind else {
        unreachable!("a sidecar snapshot")
    };
    cp.upstreams = Arc::new(map);
    if let Some(mesh) = mesh {
        let entry = ConfigEntry::from_json(mesh).unwrap();
        structs::Validate::validate(&entry).unwrap();
        cp.mesh_config = Some(Some(Arc::new(entry)));
    }
    snap
}

fn trust_domain(snap: &ConfigSnapshot) -> String {
    snap.roots.as_ref().unwrap().trust_domain.clone()
}

/// The cluster name (SNI) of a target.
fn sni(snap: &ConfigSnapshot, subset: &str, service: &str) -> String {
    target_sni(subset, service, "default", "dc1", &trust_domain(snap))
}

fn resource<T: Message + Name + Default>(r: &resources::Resources, type_url: &str, name: &str) -> T {
    let any = r
        .of(type_url)
        .and_then(|m| m.get(name))
        .unwrap_or_else(|| panic!("no {type_url} named {name:?}"));
    unpack(any)
}

fn cluster_named(r: &resources::Resources, name: &str) -> Cluster {
    resource(r, CLUSTER, name)
}

fn cluster_names(r: &resources::Resources) -> Vec<String> {
    r.of(CLUSTER).unwrap().keys().cloned().collect()
}

/// The routes of the route configuration `name` (one virtual host).
fn routes_of(r: &resources::Resources, name: &str) -> Vec<Route> {
    let rc: RouteConfiguration = resource(r, ROUTE, name);
    assert_eq!(rc.virtual_hosts.len(), 1);
    rc.virtual_hosts.into_iter().next().unwrap().routes
}

fn action(route: &Route) -> &RouteAction {
    match &route.action {
        Some(route::Action::Route(a)) => a,
        other => panic!("not a route action: {other:?}"),
    }
}

/// The single cluster a route sends to.
fn cluster_of(route: &Route) -> &str {
    match &action(route).cluster_specifier {
        Some(route_action::ClusterSpecifier::Cluster(c)) => c,
        other => panic!("not a single cluster: {other:?}"),
    }
}

/// The weighted clusters of a route: (cluster, weight).
fn weights_of(route: &Route) -> Vec<(String, u32)> {
    match &action(route).cluster_specifier {
        Some(route_action::ClusterSpecifier::WeightedClusters(w)) => w
            .clusters
            .iter()
            .map(|c| (c.name.clone(), c.weight.unwrap().value))
            .collect(),
        other => panic!("not weighted clusters: {other:?}"),
    }
}

/// The members of the aggregate cluster `name`, in order.
fn aggregate_members(r: &resources::Resources, name: &str) -> Vec<String> {
    let c = cluster_named(r, name);
    assert_eq!(c.lb_policy, LbPolicy::ClusterProvided as i32);
    match c.cluster_discovery_type {
        Some(cluster::ClusterDiscoveryType::ClusterType(t)) => {
            assert_eq!(t.name, "envoy.clusters.aggregate");
            unpack::<AggregateClusterConfig>(t.typed_config.as_ref().unwrap()).clusters
        }
        other => panic!("{name} is not an aggregate cluster: {other:?}"),
    }
}

/// The cluster the tcp_proxy of the outbound listener of `upstream` sends to.
fn tcp_cluster(r: &resources::Resources, upstream: &str, port: u16) -> String {
    let l: Listener = resource(r, LISTENER, &format!("{upstream}:127.0.0.1:{port}"));
    let f = &l.filter_chains[0].filters[0];
    let Some(filter::ConfigType::TypedConfig(cfg)) = &f.config_type else {
        panic!("no typed config")
    };
    match unpack::<TcpProxy>(cfg).cluster_specifier {
        Some(tcp_proxy::ClusterSpecifier::Cluster(c)) => c,
        other => panic!("not one cluster: {other:?}"),
    }
}

/// Every cluster a route or tcp_proxy can name exists, and so does every aggregate member;
/// every EDS cluster has its load assignment with instances.
fn assert_references_resolve(r: &resources::Resources) {
    let clusters = r.of(CLUSTER).unwrap();
    let endpoints = r.of(ENDPOINT).unwrap();
    for (name, any) in clusters {
        let c: Cluster = unpack(any);
        if c.eds_cluster_config.is_some() {
            let cla: ClusterLoadAssignment = unpack(&endpoints[name]);
            assert_eq!(cla.cluster_name, *name);
            assert!(!cla.endpoints.is_empty(), "{name} has no instances");
        }
        if let Some(cluster::ClusterDiscoveryType::ClusterType(_)) = c.cluster_discovery_type {
            for m in aggregate_members(r, name) {
                assert!(clusters.contains_key(&m), "aggregate {name} names unknown {m}");
            }
        }
    }
    for name in endpoints.keys() {
        assert!(clusters.contains_key(name), "load assignment {name} without a cluster");
    }
    for rc in r.of(ROUTE).into_iter().flat_map(|m| m.keys()) {
        for route in routes_of(r, rc) {
            let names: Vec<String> = match &action(&route).cluster_specifier {
                Some(route_action::ClusterSpecifier::Cluster(c)) => vec![c.clone()],
                _ => weights_of(&route).into_iter().map(|(c, _)| c).collect(),
            };
            for n in names {
                assert!(clusters.contains_key(&n), "route {rc} names unknown cluster {n}");
            }
        }
    }
}

fn header<'a>(route: &'a Route, name: &str) -> &'a HeaderMatcher {
    route
        .r#match
        .as_ref()
        .unwrap()
        .headers
        .iter()
        .find(|h| h.name == name)
        .unwrap_or_else(|| panic!("no matcher of header {name}"))
}

fn string_pattern(h: &HeaderMatcher) -> &string_matcher::MatchPattern {
    match &h.header_match_specifier {
        Some(header_matcher::HeaderMatchSpecifier::StringMatch(m)) => m.match_pattern.as_ref().unwrap(),
        other => panic!("not a string match: {other:?}"),
    }
}

fn pb_secs(secs: i64) -> Option<envoy_types::pb::google::protobuf::Duration> {
    Some(envoy_types::pb::google::protobuf::Duration {
        seconds: secs,
        nanos: 0,
    })
}

/// (key, value, append action) of header changes.
fn header_adds(adds: &[envoy_types::pb::envoy::config::core::v3::HeaderValueOption]) -> Vec<(String, String, i32)> {
    adds.iter()
        .map(|h| {
            let hv = h.header.as_ref().unwrap();
            (hv.key.clone(), hv.value.clone(), h.append_action)
        })
        .collect()
}

const APPEND: i32 =
    envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction::AppendIfExistsOrAdd as i32;
const OVERWRITE: i32 =
    envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction::OverwriteIfExistsOrAdd as i32;

fn kv(k: &str, v: &str, action: i32) -> (String, String, i32) {
    (k.to_owned(), v.to_owned(), action)
}

/// A router using every kind of match, destinations to a subset, another service and the
/// service itself, a prefix rewrite, timeouts, retries and header changes.
#[test]
fn chain_router_with_every_match_kind() {
    let f = Fixture::default()
        .http("api")
        .http("admin")
        .with(json!({"Kind": "service-resolver", "Name": "api", "Subsets": {
            "v1": {"Filter": "Service.Meta.version == v1"},
            "v2": {"Filter": "Service.Meta.version == v2"}}}))
        .with(json!({"Kind": "service-router", "Name": "api", "Routes": [
            {"Match": {"HTTP": {"PathExact": "/healthz"}},
             "Destination": {"ServiceSubset": "v1", "RequestTimeout": "2s", "IdleTimeout": "30s"}},
            {"Match": {"HTTP": {"PathPrefix": "/admin", "Methods": ["GET", "POST"]}},
             "Destination": {"Service": "admin", "PrefixRewrite": "/", "NumRetries": 3, "RetryOnConnectFailure": true}},
            {"Match": {"HTTP": {"PathRegex": "/api/v[0-9]+/.*"}},
             "Destination": {"ServiceSubset": "v2", "NumRetries": 5,
                "RetryOn": ["5xx", "gateway-error", "connect-failure"], "RetryOnConnectFailure": true,
                "RetryOnStatusCodes": [503, 429]}},
            {"Match": {"HTTP": {"Header": [
                {"Name": "x-debug", "Present": true},
                {"Name": "x-version", "Exact": "2"},
                {"Name": "x-user", "Prefix": "al"},
                {"Name": "x-origin", "Suffix": ".internal", "Invert": true},
                {"Name": "x-tenant", "Regex": "^t-[0-9]+$"}]}},
             "Destination": {"ServiceSubset": "v2",
                "RequestHeaders": {"Add": {"x-added": "1"}, "Set": {"x-set": "2"}, "Remove": ["x-secret"]},
                "ResponseHeaders": {"Add": {"x-served-by": "v2"}, "Set": {"cache-control": "no-store"}, "Remove": ["server"]}}},
            {"Match": {"HTTP": {"QueryParam": [
                {"Name": "debug", "Present": true},
                {"Name": "env", "Exact": "canary"},
                {"Name": "id", "Regex": "^[0-9]+$"}]}},
             "Destination": {"Service": "api", "NumRetries": 2}},
            {"Match": {"HTTP": {"PathPrefix": "/v1", "Methods": ["DELETE"],
                "Header": [{"Name": "x-region", "Present": true, "Invert": true}]}},
             "Destination": {"ServiceSubset": "v1", "PrefixRewrite": "/", "RetryOn": ["reset", "retriable-4xx"]}}
        ]}));
    let ca = Ca::new();
    let snap = chain_snapshot(&ca, "http", &f, &[up("api", 9191)], None);
    let r = validate_snapshot("chain-router", &snap);
    assert_references_resolve(&r);

    let (api, v1, v2, admin) = (
        sni(&snap, "", "api"),
        sni(&snap, "v1", "api"),
        sni(&snap, "v2", "api"),
        sni(&snap, "", "admin"),
    );
    let mut expected = vec![
        admin.clone(),
        api.clone(),
        "local_app".to_owned(),
        v1.clone(),
        v2.clone(),
    ];
    expected.sort();
    assert_eq!(cluster_names(&r), expected);

    let routes = routes_of(&r, "api");
    let clusters: Vec<&str> = routes.iter().map(cluster_of).collect();
    assert_eq!(clusters, [&v1, &admin, &v2, &v2, &api, &v1, &api]);

    // Path exact, with both timeouts and no retries.
    let m = routes[0].r#match.as_ref().unwrap();
    assert_eq!(
        m.path_specifier,
        Some(route_match::PathSpecifier::Path("/healthz".into()))
    );
    assert_eq!(action(&routes[0]).timeout, pb_secs(2));
    assert_eq!(action(&routes[0]).idle_timeout, pb_secs(30));
    assert_eq!(action(&routes[0]).retry_policy, None);

    // Path prefix with methods (upper-cased), rewrite and connect-failure retries.
    assert_eq!(
        routes[1].r#match.as_ref().unwrap().path_specifier,
        Some(route_match::PathSpecifier::Prefix("/admin".into()))
    );
    match string_pattern(header(&routes[1], ":method")) {
        string_matcher::MatchPattern::SafeRegex(re) => assert_eq!(re.regex, "GET|POST"),
        other => panic!("{other:?}"),
    }
    assert_eq!(action(&routes[1]).prefix_rewrite, "/");
    let retry = action(&routes[1]).retry_policy.as_ref().unwrap();
    assert_eq!(retry.retry_on, "connect-failure");
    assert_eq!(retry.num_retries.unwrap().value, 3);

    // Path regex; connect-failure named twice is retried on once, status codes last.
    match &routes[2].r#match.as_ref().unwrap().path_specifier {
        Some(route_match::PathSpecifier::SafeRegex(re)) => assert_eq!(re.regex, "/api/v[0-9]+/.*"),
        other => panic!("{other:?}"),
    }
    let retry = action(&routes[2]).retry_policy.as_ref().unwrap();
    assert_eq!(
        retry.retry_on,
        "5xx,gateway-error,connect-failure,retriable-status-codes"
    );
    assert_eq!(retry.retriable_status_codes, [503, 429]);
    assert_eq!(retry.num_retries.unwrap().value, 5);

    // Every header match kind, and header changes on the route.
    let h = &routes[3];
    assert_eq!(
        header(h, "x-debug").header_match_specifier,
        Some(header_matcher::HeaderMatchSpecifier::PresentMatch(true))
    );
    assert_eq!(
        string_pattern(header(h, "x-version")),
        &string_matcher::MatchPattern::Exact("2".into())
    );
    assert_eq!(
        string_pattern(header(h, "x-user")),
        &string_matcher::MatchPattern::Prefix("al".into())
    );
    assert_eq!(
        string_pattern(header(h, "x-origin")),
        &string_matcher::MatchPattern::Suffix(".internal".into())
    );
    assert!(header(h, "x-origin").invert_match);
    assert!(!header(h, "x-user").invert_match);
    assert!(matches!(
        string_pattern(header(h, "x-tenant")),
        string_matcher::MatchPattern::SafeRegex(re) if re.regex == "^t-[0-9]+$"
    ));
    assert_eq!(
        header_adds(&h.request_headers_to_add),
        [kv("x-added", "1", APPEND), kv("x-set", "2", OVERWRITE)]
    );
    assert_eq!(h.request_headers_to_remove, ["x-secret"]);
    assert_eq!(
        header_adds(&h.response_headers_to_add),
        [
            kv("x-served-by", "v2", APPEND),
            kv("cache-control", "no-store", OVERWRITE)
        ]
    );
    assert_eq!(h.response_headers_to_remove, ["server"]);

    // Query parameters: present, exact, regex. NumRetries alone still sets the retry
    // count (as Consul does): retries the application asks for with x-envoy-retry-on.
    let q = &routes[4].r#match.as_ref().unwrap().query_parameters;
    assert_eq!(q.len(), 3);
    assert_eq!(
        q[0].query_parameter_match_specifier,
        Some(query_parameter_matcher::QueryParameterMatchSpecifier::PresentMatch(
            true
        ))
    );
    assert!(matches!(
        &q[1].query_parameter_match_specifier,
        Some(query_parameter_matcher::QueryParameterMatchSpecifier::StringMatch(m))
            if m.match_pattern == Some(string_matcher::MatchPattern::Exact("canary".into()))
    ));
    assert!(matches!(
        &q[2].query_parameter_match_specifier,
        Some(query_parameter_matcher::QueryParameterMatchSpecifier::StringMatch(m))
            if matches!(&m.match_pattern, Some(string_matcher::MatchPattern::SafeRegex(re)) if re.regex == "^[0-9]+$")
    ));
    let retry = action(&routes[4]).retry_policy.as_ref().unwrap();
    assert_eq!(retry.retry_on, "");
    assert_eq!(retry.num_retries.unwrap().value, 2);

    // An inverted presence match with a method.
    let region = header(&routes[5], "x-region");
    assert!(region.invert_match);
    assert_eq!(
        region.header_match_specifier,
        Some(header_matcher::HeaderMatchSpecifier::PresentMatch(true))
    );
    assert_eq!(
        action(&routes[5]).retry_policy.as_ref().unwrap().retry_on,
        "reset,retriable-4xx"
    );

    // The catch-all last.
    assert_eq!(
        routes[6].r#match.as_ref().unwrap().path_specifier,
        Some(route_match::PathSpecifier::Prefix("/".into()))
    );
    assert!(routes[6].r#match.as_ref().unwrap().headers.is_empty());
}

/// A splitter of three legs (two subsets and a service with its own splitter, flattened),
/// each leg with its own header changes.
#[test]
fn chain_splitter_with_three_legs_and_a_nested_splitter() {
    let f = Fixture::default()
        .http("api")
        .http("api-canary")
        .http("api-canary-b")
        .with(json!({"Kind": "service-resolver", "Name": "api", "Subsets": {
            "v1": {"Filter": "Service.Meta.version == v1"},
            "v2": {"Filter": "Service.Meta.version == v2"}}}))
        .with(json!({"Kind": "service-splitter", "Name": "api", "Splits": [
            {"Weight": 33.33, "ServiceSubset": "v1", "RequestHeaders": {"Set": {"x-leg": "v1"}}},
            {"Weight": 33.33, "ServiceSubset": "v2",
             "ResponseHeaders": {"Add": {"x-leg": "v2"}, "Remove": ["x-internal"]}},
            {"Weight": 33.34, "Service": "api-canary",
             "RequestHeaders": {"Add": {"x-canary": "1"}, "Remove": ["x-debug"]}}]}))
        .with(json!({"Kind": "service-splitter", "Name": "api-canary", "Splits": [
            {"Weight": 50, "Service": "api-canary"},
            {"Weight": 50, "Service": "api-canary-b"}]}));
    let ca = Ca::new();
    let snap = chain_snapshot(&ca, "http", &f, &[up("api", 9191)], None);
    let r = validate_snapshot("chain-splitter", &snap);
    assert_references_resolve(&r);

    let routes = routes_of(&r, "api");
    assert_eq!(routes.len(), 1);
    let weights = weights_of(&routes[0]);
    assert_eq!(
        weights,
        [
            (sni(&snap, "v1", "api"), 3333),
            (sni(&snap, "v2", "api"), 3333),
            (sni(&snap, "", "api-canary"), 1667),
            (sni(&snap, "", "api-canary-b"), 1667),
        ]
    );
    assert_eq!(weights.iter().map(|(_, w)| w).sum::<u32>(), 10000);

    let Some(route_action::ClusterSpecifier::WeightedClusters(w)) = &action(&routes[0]).cluster_specifier else {
        unreachable!()
    };
    let legs = &w.clusters;
    assert_eq!(
        header_adds(&legs[0].request_headers_to_add),
        [kv("x-leg", "v1", OVERWRITE)]
    );
    assert!(legs[0].response_headers_to_add.is_empty());
    assert_eq!(
        header_adds(&legs[1].response_headers_to_add),
        [kv("x-leg", "v2", APPEND)]
    );
    assert_eq!(legs[1].response_headers_to_remove, ["x-internal"]);
    assert!(legs[1].request_headers_to_add.is_empty());
    // The nested splitter's legs carry the changes of the leg that led to it.
    for leg in &legs[2..] {
        assert_eq!(header_adds(&leg.request_headers_to_add), [kv("x-canary", "1", APPEND)]);
        assert_eq!(leg.request_headers_to_remove, ["x-debug"]);
    }
}

/// A resolver with a default subset and subsets: one EDS cluster and one load assignment
/// per target the chain reaches (an unused subset has neither), the resolver's connect and
/// request timeouts; a tcp upstream with a default subset.
#[test]
fn chain_resolver_with_default_subset_and_subsets() {
    let f = Fixture::default()
        .http("api")
        .with(json!({"Kind": "service-resolver", "Name": "api", "DefaultSubset": "v1",
            "ConnectTimeout": "2s", "RequestTimeout": "15s", "Subsets": {
            "v1": {"Filter": "Service.Meta.version == v1", "OnlyPassing": true},
            "v2": {"Filter": "Service.Meta.version == v2"},
            "v3": {"Filter": "Service.Meta.version == v3"}}}))
        .with(json!({"Kind": "service-router", "Name": "api", "Routes": [
            {"Match": {"HTTP": {"Header": [{"Name": "x-canary", "Exact": "1"}]}},
             "Destination": {"ServiceSubset": "v2"}}]}))
        .with(
            json!({"Kind": "service-resolver", "Name": "db", "DefaultSubset": "primary", "Subsets": {
            "primary": {"Filter": "Service.Meta.role == primary"},
            "replica": {"Filter": "Service.Meta.role == replica"}}}),
        );
    let ca = Ca::new();
    let snap = chain_snapshot(&ca, "tcp", &f, &[up("api", 9191), up("db", 9192)], None);
    let r = validate_snapshot("chain-resolver-subsets", &snap);
    assert_references_resolve(&r);

    let (v1, v2, primary) = (
        sni(&snap, "v1", "api"),
        sni(&snap, "v2", "api"),
        sni(&snap, "primary", "db"),
    );
    let mut expected = vec![v1.clone(), v2.clone(), primary.clone(), "local_app".to_owned()];
    expected.sort();
    assert_eq!(cluster_names(&r), expected);
    let mut eds: Vec<String> = r.of(ENDPOINT).unwrap().keys().cloned().collect();
    eds.sort();
    let mut want_eds = vec![v1.clone(), v2.clone(), primary.clone()];
    want_eds.sort();
    assert_eq!(eds, want_eds);
    for name in [&v1, &v2] {
        let c = cluster_named(&r, name);
        assert_eq!(
            c.cluster_discovery_type,
            Some(cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::Eds as i32))
        );
        assert_eq!(c.connect_timeout, pb_secs(2));
    }
    assert_eq!(cluster_named(&r, &primary).connect_timeout, pb_secs(5));

    let routes = routes_of(&r, "api");
    assert_eq!(routes.len(), 2);
    assert_eq!(cluster_of(&routes[0]), v2);
    // The catch-all goes to the default subset, with the resolver's request timeout.
    assert_eq!(cluster_of(&routes[1]), v1);
    assert_eq!(action(&routes[1]).timeout, pb_secs(15));
    assert_eq!(tcp_cluster(&r, "db", 9192), primary);
}

/// http `api` with subsets `a` (the default) and `b`, failing over per subset (`a` to `b`,
/// then to `api-dr`) and for any subset (`*` to `api-backup`), routed to `b` by path; tcp
/// `db` failing over to `db-replica`.
fn failover_fixture() -> Fixture {
    Fixture::default()
        .http("api")
        .http("api-dr")
        .http("api-backup")
        .with(
            json!({"Kind": "service-resolver", "Name": "api", "DefaultSubset": "a", "Subsets": {
                "a": {"Filter": "Service.Meta.zone == a"},
                "b": {"Filter": "Service.Meta.zone == b"}},
            "Failover": {
                "a": {"Targets": [{"ServiceSubset": "b"}, {"Service": "api-dr"}]},
                "*": {"Service": "api-backup"}}}),
        )
        .with(json!({"Kind": "service-router", "Name": "api", "Routes": [
            {"Match": {"HTTP": {"PathPrefix": "/b"}}, "Destination": {"ServiceSubset": "b"}}]}))
        .with(json!({"Kind": "service-resolver", "Name": "db", "ConnectTimeout": "3s",
            "Failover": {"*": {"Service": "db-replica"}}}))
}

/// Failover per subset (the Targets form) and for any subset (`*`): aggregate clusters
/// listing the primary then the failover targets in order, routed to in place of the
/// primary; the same for a tcp upstream.
#[test]
fn chain_resolver_failover_to_aggregate_clusters() {
    let f = failover_fixture();
    let ca = Ca::new();
    let snap = chain_snapshot(&ca, "tcp", &f, &[up("api", 9191), up("db", 9192)], None);
    let r = validate_snapshot("chain-failover", &snap);
    assert_references_resolve(&r);

    let (a, b, dr, backup) = (
        sni(&snap, "a", "api"),
        sni(&snap, "b", "api"),
        sni(&snap, "", "api-dr"),
        sni(&snap, "", "api-backup"),
    );
    let (db, replica) = (sni(&snap, "", "db"), sni(&snap, "", "db-replica"));
    assert_eq!(
        aggregate_members(&r, &format!("failover~{a}")),
        [a.clone(), b.clone(), dr.clone()]
    );
    assert_eq!(
        aggregate_members(&r, &format!("failover~{b}")),
        [b.clone(), backup.clone()]
    );
    assert_eq!(
        aggregate_members(&r, &format!("failover~{db}")),
        [db.clone(), replica.clone()]
    );
    // Every target keeps its own EDS cluster with its own identity to verify.
    for (name, service) in [(&dr, "api-dr"), (&backup, "api-backup"), (&replica, "db-replica")] {
        let c = cluster_named(&r, name);
        assert!(c.eds_cluster_config.is_some());
        let tls = decode_cluster(&r.of(CLUSTER).unwrap()[name]);
        assert!(
            tls.contains(&format!("/ns/default/dc/dc1/svc/{service}\"")),
            "{name}: {tls}"
        );
    }
    assert_eq!(cluster_named(&r, &format!("failover~{db}")).connect_timeout, pb_secs(3));

    let routes = routes_of(&r, "api");
    assert_eq!(cluster_of(&routes[0]), format!("failover~{b}"));
    assert_eq!(cluster_of(&routes[1]), format!("failover~{a}"));
    assert_eq!(tcp_cluster(&r, "db", 9192), format!("failover~{db}"));
}

/// Redirects: to a subset of another service (tcp) and to another service's default subset
/// (http). The clusters are the redirect targets', verified as that service.
#[test]
fn chain_resolver_redirect() {
    let f = Fixture::default()
        .http("api")
        .http("legacy")
        .http("old-api")
        .with(
            json!({"Kind": "service-resolver", "Name": "api", "DefaultSubset": "v1", "Subsets": {
            "v1": {"Filter": "Service.Meta.version == v1"},
            "v2": {"Filter": "Service.Meta.version == v2"}}}),
        )
        .with(json!({"Kind": "service-resolver", "Name": "old-api",
            "Redirect": {"Service": "api", "ServiceSubset": "v2"}}))
        .with(json!({"Kind": "service-resolver", "Name": "legacy", "Redirect": {"Service": "api"}}));
    let ca = Ca::new();
    let mut old = up("old-api", 9191);
    // A tcp upstream of an http service.
    old.config = json!({"protocol": "tcp"});
    let snap = chain_snapshot(&ca, "tcp", &f, &[old, up("legacy", 9192)], None);
    let r = validate_snapshot("chain-redirect", &snap);
    assert_references_resolve(&r);

    let (v1, v2) = (sni(&snap, "v1", "api"), sni(&snap, "v2", "api"));
    let mut expected = vec![v1.clone(), v2.clone(), "local_app".to_owned()];
    expected.sort();
    assert_eq!(cluster_names(&r), expected);
    assert_eq!(tcp_cluster(&r, "old-api", 9191), v2);
    let routes = routes_of(&r, "legacy");
    assert_eq!(routes.len(), 1);
    assert_eq!(cluster_of(&routes[0]), v1);
    let tls = decode_cluster(&r.of(CLUSTER).unwrap()[&v2]);
    assert!(tls.contains("/ns/default/dc/dc1/svc/api\""), "{tls}");
    assert!(tls.contains(&format!("sni: \"{v2}\"")) || tls.contains("sni: \"v2.api.default.dc1.internal."));
}

fn lb_of(r: &resources::Resources, name: &str) -> (i32, Option<cluster::LbConfig>) {
    let c = cluster_named(r, name);
    (c.lb_policy, c.lb_config)
}

/// Every load-balancer policy: least_request with a choice count, ring_hash with ring
/// sizes and every kind of hash policy, maglev (behind a splitter: the hash policies go on
/// the split route) and random.
#[test]
fn chain_load_balancer_policies() {
    use route_action::hash_policy::PolicySpecifier;
    let f = Fixture::default()
        .http("rh")
        .http("mg")
        .with(json!({"Kind": "service-resolver", "Name": "lr",
            "LoadBalancer": {"Policy": "least_request", "LeastRequestConfig": {"ChoiceCount": 3}}}))
        .with(json!({"Kind": "service-resolver", "Name": "rh",
            "LoadBalancer": {"Policy": "ring_hash",
                "RingHashConfig": {"MinimumRingSize": 1024, "MaximumRingSize": 8192},
                "HashPolicies": [
                    {"Field": "header", "FieldValue": "x-user-id"},
                    {"Field": "cookie", "FieldValue": "session", "CookieConfig": {"TTL": "30m", "Path": "/app"}},
                    {"Field": "cookie", "FieldValue": "sticky", "CookieConfig": {"Session": true}},
                    {"Field": "query_parameter", "FieldValue": "uid"},
                    {"SourceIP": true, "Terminal": true}]}}))
        .with(json!({"Kind": "service-resolver", "Name": "mg",
            "Subsets": {"v1": {"Filter": "Service.Meta.version == v1"}, "v2": {"Filter": "Service.Meta.version == v2"}},
            "LoadBalancer": {"Policy": "maglev",
                "HashPolicies": [{"Field": "header", "FieldValue": "x-tenant", "Terminal": true}]}}))
        .with(json!({"Kind": "service-splitter", "Name": "mg", "Splits": [
            {"Weight": 90, "ServiceSubset": "v1"}, {"Weight": 10, "ServiceSubset": "v2"}]}))
        .with(json!({"Kind": "service-resolver", "Name": "rnd", "LoadBalancer": {"Policy": "random"}}));
    let ca = Ca::new();
    let snap = chain_snapshot(
        &ca,
        "tcp",
        &f,
        &[up("lr", 9191), up("rh", 9192), up("mg", 9193), up("rnd", 9194)],
        None,
    );
    let r = validate_snapshot("chain-load-balancers", &snap);
    assert_references_resolve(&r);

    assert_eq!(
        lb_of(&r, &sni(&snap, "", "lr")),
        (
            LbPolicy::LeastRequest as i32,
            Some(cluster::LbConfig::LeastRequestLbConfig(cluster::LeastRequestLbConfig {
                choice_count: Some(envoy_types::pb::google::protobuf::UInt32Value { value: 3 }),
                ..Default::default()
            }))
        )
    );
    let (policy, config) = lb_of(&r, &sni(&snap, "", "rh"));
    assert_eq!(policy, LbPolicy::RingHash as i32);
    let Some(cluster::LbConfig::RingHashLbConfig(ring)) = config else {
        panic!("{config:?}")
    };
    assert_eq!(ring.minimum_ring_size.unwrap().value, 1024);
    assert_eq!(ring.maximum_ring_size.unwrap().value, 8192);
    for subset in ["v1", "v2"] {
        assert_eq!(lb_of(&r, &sni(&snap, subset, "mg")), (LbPolicy::Maglev as i32, None));
    }
    assert_eq!(lb_of(&r, &sni(&snap, "", "rnd")), (LbPolicy::Random as i32, None));

    let rh = routes_of(&r, "rh");
    let hashes = &action(&rh[0]).hash_policy;
    assert_eq!(hashes.len(), 5);
    assert!(matches!(&hashes[0].policy_specifier, Some(PolicySpecifier::Header(h)) if h.header_name == "x-user-id"));
    match &hashes[1].policy_specifier {
        Some(PolicySpecifier::Cookie(c)) => {
            assert_eq!(
                (c.name.as_str(), c.path.as_str(), c.ttl),
                ("session", "/app", pb_secs(1800))
            );
        }
        other => panic!("{other:?}"),
    }
    // A session cookie: a TTL of zero.
    match &hashes[2].policy_specifier {
        Some(PolicySpecifier::Cookie(c)) => assert_eq!((c.name.as_str(), c.ttl), ("sticky", pb_secs(0))),
        other => panic!("{other:?}"),
    }
    assert!(matches!(&hashes[3].policy_specifier, Some(PolicySpecifier::QueryParameter(q)) if q.name == "uid"));
    assert!(matches!(
        &hashes[4].policy_specifier,
        Some(PolicySpecifier::ConnectionProperties(p)) if p.source_ip
    ));
    assert!(hashes[4].terminal && !hashes[0].terminal);

    // Behind a splitter, the legs' hash policies still apply (Consul: the first hash-based
    // load balancer of the legs' resolvers).
    let mg = routes_of(&r, "mg");
    assert_eq!(
        weights_of(&mg[0]),
        [(sni(&snap, "v1", "mg"), 9000), (sni(&snap, "v2", "mg"), 1000)]
    );
    let hashes = &action(&mg[0]).hash_policy;
    assert_eq!(hashes.len(), 1);
    assert!(matches!(&hashes[0].policy_specifier, Some(PolicySpecifier::Header(h)) if h.header_name == "x-tenant"));
    assert!(hashes[0].terminal);
}

/// The upstream's `limits` and `passive_health_check` become circuit breakers and outlier
/// detection on every target cluster of its chain (not on the aggregate cluster); its
/// `connect_timeout_ms` overrides the resolver's.
#[test]
fn chain_upstream_limits_and_passive_health_check() {
    let f = Fixture::default().http("api").http("api-backup").with(
        json!({"Kind": "service-resolver", "Name": "api", "ConnectTimeout": "10s",
            "Failover": {"*": {"Service": "api-backup"}}}),
    );
    let ca = Ca::new();
    let mut api = up("api", 9191);
    api.config = json!({
        "connect_timeout_ms": 1500,
        "limits": {"max_connections": 512, "max_pending_requests": 64, "max_concurrent_requests": 256},
        "passive_health_check": {"interval": "10s", "max_failures": 3, "enforcing_consecutive_5xx": 80,
            "max_ejection_percent": 50, "base_ejection_time": "45s"}
    });
    Upstream {
        config: api.config.as_object().unwrap().clone(),
        ..Default::default()
    }
    .options()
    .limits
    .expect("limits parse");
    let snap = chain_snapshot(&ca, "http", &f, &[api, up("db", 9192)], None);
    let r = validate_snapshot("chain-limits", &snap);
    assert_references_resolve(&r);

    let (api, backup) = (sni(&snap, "", "api"), sni(&snap, "", "api-backup"));
    for name in [&api, &backup] {
        let c = cluster_named(&r, name);
        let t = &c.circuit_breakers.as_ref().unwrap().thresholds;
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].max_connections.unwrap().value, 512);
        assert_eq!(t[0].max_pending_requests.unwrap().value, 64);
        assert_eq!(t[0].max_requests.unwrap().value, 256);
        let od = c.outlier_detection.as_ref().unwrap();
        assert_eq!(od.interval, pb_secs(10));
        assert_eq!(od.consecutive_5xx.unwrap().value, 3);
        assert_eq!(od.enforcing_consecutive_5xx.unwrap().value, 80);
        assert_eq!(od.max_ejection_percent.unwrap().value, 50);
        assert_eq!(od.base_ejection_time, pb_secs(45));
        assert_eq!(
            c.connect_timeout,
            Some(envoy_types::pb::google::protobuf::Duration {
                seconds: 1,
                nanos: 500_000_000
            })
        );
    }
    let aggregate = cluster_named(&r, &format!("failover~{api}"));
    assert_eq!(aggregate.circuit_breakers, None);
    assert_eq!(aggregate.outlier_detection, None);
    // Another upstream keeps Envoy's defaults: no limits, default outlier detection (as
    // Consul sets it).
    let db = cluster_named(&r, &sni(&snap, "", "db"));
    assert_eq!(
        (db.circuit_breakers, db.outlier_detection),
        (None, Some(Default::default()))
    );
}

fn tls_params_of_cluster(r: &resources::Resources, name: &str) -> Option<TlsParameters> {
    let mut c = cluster_named(r, name);
    let ts = c.transport_socket.take().unwrap();
    let Some(transport_socket::ConfigType::TypedConfig(cfg)) = ts.config_type else {
        panic!("no tls")
    };
    unpack::<UpstreamTlsContext>(&cfg)
        .common_tls_context
        .unwrap()
        .tls_params
}

/// The mesh config entry's TLS versions and cipher suites: Incoming on the public listener,
/// Outgoing on every upstream cluster.
#[test]
fn chain_mesh_tls_versions_and_cipher_suites() {
    let f = Fixture::default()
        .http("api")
        .http("api-backup")
        .with(json!({"Kind": "service-resolver", "Name": "api",
        "Failover": {"*": {"Service": "api-backup"}}}));
    let mesh = json!({"Kind": "mesh", "Name": "mesh", "TLS": {
        "Incoming": {"TLSMinVersion": "TLSv1_2", "TLSMaxVersion": "TLSv1_3",
            "CipherSuites": ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"]},
        "Outgoing": {"TLSMinVersion": "TLSv1_1", "TLSMaxVersion": "TLSv1_2",
            "CipherSuites": ["ECDHE-ECDSA-AES256-GCM-SHA384", "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"]}}});
    let ca = Ca::new();
    let snap = chain_snapshot(&ca, "http", &f, &[up("api", 9191), up("db", 9192)], Some(mesh));
    let r = validate_snapshot("chain-mesh-tls", &snap);
    assert_references_resolve(&r);

    let outgoing = TlsParameters {
        tls_minimum_protocol_version: TlsProtocol::TlSv11 as i32,
        tls_maximum_protocol_version: TlsProtocol::TlSv12 as i32,
        cipher_suites: vec![
            "ECDHE-ECDSA-AES256-GCM-SHA384".into(),
            "ECDHE-ECDSA-CHACHA20-POLY1305".into(),
        ],
        ..Default::default()
    };
    for name in [
        sni(&snap, "", "api"),
        sni(&snap, "", "api-backup"),
        sni(&snap, "", "db"),
    ] {
        assert_eq!(tls_params_of_cluster(&r, &name), Some(outgoing.clone()), "{name}");
    }
    let public: Listener = resource(&r, LISTENER, "public_listener:0.0.0.0:21000");
    let ts = public.filter_chains[0].transport_socket.as_ref().unwrap();
    let Some(transport_socket::ConfigType::TypedConfig(cfg)) = &ts.config_type else {
        panic!("no tls")
    };
    let incoming = unpack::<DownstreamTlsContext>(cfg)
        .common_tls_context
        .unwrap()
        .tls_params
        .unwrap();
    assert_eq!(
        (
            incoming.tls_minimum_protocol_version,
            incoming.tls_maximum_protocol_version
        ),
        (TlsProtocol::TlSv12 as i32, TlsProtocol::TlSv13 as i32)
    );
    assert_eq!(
        incoming.cipher_suites,
        ["ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384"]
    );
}

/// The HTTP connection manager of a listener's first filter chain.
fn hcm_of(r: &resources::Resources, listener: &str) -> HttpConnectionManager {
    let l: Listener = resource(r, LISTENER, listener);
    let Some(filter::ConfigType::TypedConfig(cfg)) = &l.filter_chains[0].filters[0].config_type else {
        panic!("{listener}: no typed filter")
    };
    unpack(cfg)
}

/// The mesh config entry's request normalization, every field set, on the public listener
/// (inbound); the upstream listeners pass requests on untouched.
#[test]
fn mesh_request_normalization_on_the_public_listener_only() {
    use envoy_types::pb::envoy::config::core::v3::http_protocol_options::HeadersWithUnderscoresAction;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::PathWithEscapedSlashesAction;
    let f = Fixture::default().http("api");
    let mesh = json!({"Kind": "mesh", "HTTP": {"Incoming": {"RequestNormalization": {
        "InsecureDisablePathNormalization": true, "MergeSlashes": true,
        "PathWithEscapedSlashesAction": "UNESCAPE_AND_FORWARD", "HeadersWithUnderscoresAction": "DROP_HEADER"}}}});
    let ca = Ca::new();
    let snap = chain_snapshot(&ca, "http", &f, &[up("api", 9191)], Some(mesh));
    let r = validate_snapshot("mesh-request-normalization", &snap);
    let public = hcm_of(&r, "public_listener:0.0.0.0:21000");
    assert_eq!(public.normalize_path.map(|b| b.value), Some(false));
    assert!(public.merge_slashes);
    assert_eq!(
        public.path_with_escaped_slashes_action,
        PathWithEscapedSlashesAction::UnescapeAndForward as i32
    );
    assert_eq!(
        public
            .common_http_protocol_options
            .map(|o| o.headers_with_underscores_action),
        Some(HeadersWithUnderscoresAction::DropHeader as i32)
    );
    let upstream = hcm_of(&r, "api:127.0.0.1:9191");
    assert_eq!(upstream.normalize_path, None);
    assert!(!upstream.merge_slashes);
    assert_eq!(upstream.path_with_escaped_slashes_action, 0);
    assert_eq!(upstream.common_http_protocol_options, None);

    // Without the entry: Consul's defaults, the path normalized and nothing else.
    let snap = chain_snapshot(&ca, "http", &f, &[up("api", 9191)], None);
    let r = resources::build(&snap).unwrap();
    let public = hcm_of(&r, "public_listener:0.0.0.0:21000");
    assert_eq!(public.normalize_path.map(|b| b.value), Some(true));
    assert!(!public.merge_slashes);
    assert_eq!(
        public.path_with_escaped_slashes_action,
        PathWithEscapedSlashesAction::ImplementationSpecificDefault as i32
    );
    assert_eq!(public.common_http_protocol_options, None);
}

fn speaks_http2(r: &resources::Resources, name: &str) -> bool {
    let c = cluster_named(r, name);
    let Some(any) = c
        .typed_extension_protocol_options
        .get("envoy.extensions.upstreams.http.v3.HttpProtocolOptions")
    else {
        return false;
    };
    matches!(
        unpack::<HttpProtocolOptions>(any).upstream_protocol_options,
        Some(http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
            http_protocol_options::ExplicitHttpConfig {
                protocol_config: Some(
                    http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(_)
                )
            }
        ))
    )
}

/// A gRPC service with a gRPC upstream (routed by method path to a subset) and an http2
/// upstream (split): HTTP/2 to the local app and to every target of both chains, not to a
/// tcp upstream.
#[test]
fn chain_http2_and_grpc_upstreams_and_local_app() {
    let f = Fixture::default()
        .protocol("billing", "grpc")
        .protocol("search", "http2")
        .protocol("search-next", "http2")
        .with(json!({"Kind": "service-resolver", "Name": "billing", "Subsets": {
            "v2": {"Filter": "Service.Meta.version == v2"}}}))
        .with(json!({"Kind": "service-router", "Name": "billing", "Routes": [
            {"Match": {"HTTP": {"PathPrefix": "/billing.v2.Billing/"}},
             "Destination": {"ServiceSubset": "v2", "RetryOn": ["cancelled", "deadline-exceeded", "unavailable"]}}]}))
        .with(json!({"Kind": "service-splitter", "Name": "search", "Splits": [
            {"Weight": 75, "Service": "search"}, {"Weight": 25, "Service": "search-next"}]}));
    let ca = Ca::new();
    let snap = chain_snapshot(
        &ca,
        "grpc",
        &f,
        &[up("billing", 9191), up("search", 9192), up("db", 9193)],
        None,
    );
    let r = validate_snapshot("chain-grpc-http2", &snap);
    assert_references_resolve(&r);

    assert!(speaks_http2(&r, "local_app"));
    for name in [
        sni(&snap, "", "billing"),
        sni(&snap, "v2", "billing"),
        sni(&snap, "", "search"),
        sni(&snap, "", "search-next"),
    ] {
        assert!(speaks_http2(&r, &name), "{name}");
    }
    assert!(!speaks_http2(&r, &sni(&snap, "", "db")));
    let billing = routes_of(&r, "billing");
    assert_eq!(
        action(&billing[0]).retry_policy.as_ref().unwrap().retry_on,
        "cancelled,deadline-exceeded,unavailable"
    );
    assert_eq!(weights_of(&routes_of(&r, "search")[0]).len(), 2);
}

/// Validation is real for what the chains add: Envoy refuses a route to a cluster that does
/// not exist (route configurations are inlined, so their clusters are checked).
#[test]
fn envoy_validation_rejects_a_route_to_an_unknown_cluster() {
    let f = Fixture::default().http("api");
    let ca = Ca::new();
    let snap = chain_snapshot(&ca, "tcp", &f, &[up("api", 9191)], None);
    let mut r = resources::build(&snap).unwrap();
    envoy_validate("route-ok", &static_bootstrap(&r)).unwrap();
    let routes = r.by_type.get_mut(ROUTE).unwrap();
    let mut rc: RouteConfiguration = unpack(&routes["api"]);
    let Some(route::Action::Route(a)) = &mut rc.virtual_hosts[0].routes[0].action else {
        unreachable!()
    };
    a.cluster_specifier = Some(route_action::ClusterSpecifier::Cluster("nowhere".into()));
    routes.insert("api".into(), pack_any(rc));
    let err = envoy_validate("route-unknown-cluster", &static_bootstrap(&r)).unwrap_err();
    assert!(err.contains("nowhere"), "{err}");
}

/// Envoy does not look up an aggregate cluster's members when validating: the static
/// bootstrap conversion refuses an aggregate cluster whose member is missing.
#[test]
#[should_panic(expected = "which is not a (non-aggregate) cluster")]
fn an_aggregate_cluster_with_a_missing_member_is_refused() {
    let f = Fixture::default().with(json!({"Kind": "service-resolver", "Name": "db",
        "Failover": {"*": {"Service": "db-replica"}}}));
    let ca = Ca::new();
    let snap = chain_snapshot(&ca, "tcp", &f, &[up("db", 9191)], None);
    let mut r = resources::build(&snap).unwrap();
    let member = sni(&snap, "", "db-replica");
    r.by_type.get_mut(CLUSTER).unwrap().remove(&member);
    r.by_type.get_mut(ENDPOINT).unwrap().remove(&member);
    static_bootstrap(&r);
}

/// Load-balancer settings the entries allow but Envoy refuses (refusing every cluster of
/// the proxy with them) are brought within Envoy's bounds.
#[test]
fn load_balancer_values_envoy_refuses_are_brought_within_its_bounds() {
    let entries = [
        json!({"Kind": "service-resolver", "Name": "one-choice",
            "LoadBalancer": {"Policy": "least_request", "LeastRequestConfig": {"ChoiceCount": 1}}}),
        json!({"Kind": "service-resolver", "Name": "huge-ring",
            "LoadBalancer": {"Policy": "ring_hash",
                "RingHashConfig": {"MinimumRingSize": 10000000, "MaximumRingSize": 20000000}}}),
        json!({"Kind": "service-resolver", "Name": "small-ring",
            "LoadBalancer": {"Policy": "ring_hash", "RingHashConfig": {"MaximumRingSize": 512}}}),
    ];
    // Refused at write time, each naming its field...
    let fields: Vec<String> = entries
        .iter()
        .map(|e| {
            structs::Validate::validate(&ConfigEntry::from_json(e.clone()).unwrap())
                .unwrap_err()
                .field
        })
        .collect();
    assert_eq!(
        fields,
        [
            "LoadBalancer.LeastRequestConfig.ChoiceCount",
            "LoadBalancer.RingHashConfig.MinimumRingSize",
            "LoadBalancer.RingHashConfig.MaximumRingSize"
        ]
    );
    // ...and should one get past, the builder still keeps Envoy's bounds.
    let f = entries.into_iter().fold(Fixture::default(), Fixture::with_unchecked);
    let ca = Ca::new();
    let snap = chain_snapshot(
        &ca,
        "tcp",
        &f,
        &[up("one-choice", 9191), up("huge-ring", 9192), up("small-ring", 9193)],
        None,
    );
    let r = resources::build(&snap).unwrap();
    envoy_validate("lb-bounds", &static_bootstrap(&r)).unwrap();
    assert_eq!(
        lb_of(&r, &sni(&snap, "", "one-choice")),
        (LbPolicy::LeastRequest as i32, None)
    );
    let ring = |name: &str| match lb_of(&r, &sni(&snap, "", name)) {
        (p, Some(cluster::LbConfig::RingHashLbConfig(c))) if p == LbPolicy::RingHash as i32 => (
            c.minimum_ring_size.map(|v| v.value),
            c.maximum_ring_size.map(|v| v.value),
        ),
        other => panic!("{other:?}"),
    };
    assert_eq!(ring("huge-ring"), (Some(8_388_608), Some(8_388_608)));
    assert_eq!(ring("small-ring"), (Some(512), Some(512)));
}

mod proxyless;
