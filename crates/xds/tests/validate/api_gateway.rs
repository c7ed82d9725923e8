//! The API gateway's resources: an http listener with a hostname, two http-routes (one
//! with a path prefix, rewrite, retries and timeouts to a service whose own splitter
//! divides it between subsets; one with a header match split 3:1 between two services, one
//! of them with its own header change), a tcp listener with a tcp-route, and a listener
//! nothing binds to. Golden, accepted by `envoy --mode validate`.

use super::*;
use envoy_types::pb::envoy::config::route::v3::{route, route_action};
use serde_json::json;
use structs::ConfigEntry;

fn entry(v: serde_json::Value) -> Arc<ConfigEntry> {
    let e = ConfigEntry::from_json(v).unwrap();
    structs::Validate::validate(&e).unwrap();
    Arc::new(e)
}

fn snapshot(ca: &Ca) -> ConfigSnapshot {
    let roots = ca.roots();
    let chains = discovery_chain::fixture::EntrySet::default()
        .http("api")
        .with(json!({"Kind": "service-resolver", "Name": "api", "Subsets": {
            "v1": {"Filter": "Service.Meta.version == v1"}, "v2": {"Filter": "Service.Meta.version == v2"}}}))
        .with(json!({"Kind": "service-splitter", "Name": "api", "Splits": [
            {"Weight": 80, "ServiceSubset": "v1"}, {"Weight": 20, "ServiceSubset": "v2"}]}));
    let gateway = entry(json!({"Kind": "api-gateway", "Name": "gw", "Listeners": [
        {"Name": "web", "Port": 8080, "Protocol": "http", "Hostname": "*.example.com"},
        {"Name": "db", "Port": 9090, "Protocol": "tcp"},
        {"Name": "idle", "Port": 9091, "Protocol": "tcp"}]}));
    let http = vec![
        entry(
            json!({"Kind": "http-route", "Name": "api-route", "Parents": [{"Name": "gw"}],
            "Hostnames": ["api.example.com"],
            "Rules": [{"Matches": [{"Path": {"Match": "prefix", "Value": "/v1"}}, {"Path": {"Match": "exact", "Value": "/health"}, "Method": "GET"}, {"Path": {"Match": "regex", "Value": "/v[0-9]+/x"}}],
                       "Filters": {"Headers": [{"Add": {"x-from": "gw"}, "Remove": ["x-debug"]}],
                                   "URLRewrite": {"Path": "/"},
                                   "RetryFilter": {"NumRetries": 2, "RetryOnConnectFailure": true, "RetryOnStatusCodes": [503]},
                                   "TimeoutFilter": {"RequestTimeout": "5s", "IdleTimeout": "30s"}},
                       "ResponseFilters": {"Headers": [{"Set": {"x-served-by": "meshd"}}]},
                       "Services": [{"Name": "api"}]}]}),
        ),
        entry(
            json!({"Kind": "http-route", "Name": "admin-route", "Parents": [{"Name": "gw", "SectionName": "web"}],
            "Rules": [{"Matches": [{"Headers": [{"Match": "exact", "Name": "x-admin", "Value": "yes"}],
                                    "Query": [{"Match": "present", "Name": "debug"}]}],
                       "Services": [{"Name": "admin", "Weight": 3},
                                    {"Name": "admin-canary", "Weight": 1, "Filters": {"Headers": [{"Set": {"x-canary": "1"}}]}}]}]}),
        ),
    ];
    let tcp = vec![entry(json!({"Kind": "tcp-route", "Name": "db-route",
        "Parents": [{"Name": "gw", "SectionName": "db"}], "Services": [{"Name": "db"}]}))];
    let mut upstreams = BTreeMap::new();
    // As the handler compiles them: http-routes' services as their own protocol (admin is
    // grpc: its cluster speaks HTTP/2), tcp-routes' as tcp.
    let chains = chains.protocol("admin", "grpc");
    for (name, protocol) in [
        ("api", None),
        ("admin", None),
        ("admin-canary", None),
        ("db", Some("tcp")),
    ] {
        let chain = Arc::new(
            chains
                .compile_with(name, &roots.trust_domain, protocol.map(|p| p.parse().unwrap()), None)
                .unwrap(),
        );
        let mut up = proxycfg::UpstreamSnapshot::new(usize::MAX);
        for target in chain.targets.keys() {
            up.endpoints.insert(
                target.clone(),
                Arc::new(vec![instance(&format!("{name}-sidecar-proxy"), "10.0.0.1", 21000)]),
            );
        }
        up.chain = Some(chain);
        upstreams.insert(Arc::new(proxycfg::handler::api_gateway_backend_id(name)), Arc::new(up));
    }
    let part = KindSnapshot::ApiGateway(proxycfg::ApiGatewaySnapshot {
        leaf: Some(ca.leaf("gw")),
        entry: Some(Some(gateway)),
        mesh_config: Some(None),
        routes: BTreeMap::from([
            (structs::ConfigEntryKind::HttpRoute, Arc::new(http)),
            (structs::ConfigEntryKind::TcpRoute, Arc::new(tcp)),
        ]),
        certificates: BTreeMap::from([
            (structs::ConfigEntryKind::InlineCertificate, Arc::new(Vec::new())),
            (structs::ConfigEntryKind::FileSystemCertificate, Arc::new(Vec::new())),
        ]),
        upstreams: Arc::new(upstreams),
    });
    gateway_snapshot(ca, structs::ServiceKind::ApiGateway, "gw", part)
}

#[test]
fn api_gateway_listeners_routes_splits_and_a_tcp_route() {
    let ca = Ca::new();
    let snap = snapshot(&ca);
    assert!(snap.is_valid());
    let r = resources::build(&snap).unwrap();
    let admin: envoy_types::pb::envoy::config::cluster::v3::Cluster = unpack(
        r.of(CLUSTER)
            .unwrap()
            .iter()
            .find(|(n, _)| n.starts_with("admin.default"))
            .unwrap()
            .1,
    );
    assert!(
        !admin.typed_extension_protocol_options.is_empty(),
        "admin is grpc: HTTP/2 to it"
    );
    let r = validate_snapshot("gateway-api", &snap);
    // The listener nothing binds to is not served, and says so.
    let problems: Vec<(&String, &String)> = r.problems.iter().collect();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].1.contains("idle") && problems[0].1.contains("no route is bound"),
        "{problems:?}"
    );
    let listeners: Vec<&String> = r.of(LISTENER).unwrap().keys().collect();
    assert_eq!(listeners, ["db:127.0.0.1:9090", "web:127.0.0.1:8080"]);
    let route: RouteConfiguration = unpack(&r.of(ROUTE).unwrap()["web"]);
    let hosts: Vec<(&str, Vec<&str>)> = route
        .virtual_hosts
        .iter()
        .map(|v| (v.name.as_str(), v.domains.iter().map(String::as_str).collect()))
        .collect();
    // api-route answers its own hostname; admin-route, naming none, the listener's.
    assert_eq!(
        hosts,
        [
            ("web:*.example.com", vec!["*.example.com:8080", "*.example.com"]),
            ("web:api.example.com", vec!["api.example.com:8080", "api.example.com"]),
        ]
    );
    // The exact path ranks before the prefix, the prefix before the regex; api's splitter is multiplied in (80/20);
    // admin-route's rule, answering every host of the listener, follows api-route's own on
    // api.example.com (Envoy picks that host's virtual host alone).
    let api = &route.virtual_hosts[1].routes;
    assert_eq!(api.len(), 4);
    assert!(
        format!("{:?}", api[2].r#match).contains("SafeRegex"),
        "{:?}",
        api[2].r#match
    );
    assert_eq!(api[3], route.virtual_hosts[0].routes[0]);
    let weights = |r: &envoy_types::pb::envoy::config::route::v3::Route| -> Vec<(String, u32)> {
        let Some(route::Action::Route(a)) = &r.action else {
            panic!()
        };
        match a.cluster_specifier.as_ref().unwrap() {
            route_action::ClusterSpecifier::WeightedClusters(w) => w
                .clusters
                .iter()
                .map(|c| {
                    (
                        c.name.split('.').take(2).collect::<Vec<_>>().join("."),
                        c.weight.unwrap().value,
                    )
                })
                .collect(),
            other => panic!("{other:?}"),
        }
    };
    assert!(
        format!("{:?}", api[0].r#match).contains("/health"),
        "{:?}",
        api[0].r#match
    );
    assert_eq!(
        weights(&api[1]),
        [("v1.api".to_owned(), 8000), ("v2.api".to_owned(), 2000)]
    );
    assert_eq!(
        weights(&route.virtual_hosts[0].routes[0]),
        [
            ("admin.default".to_owned(), 30000),
            ("admin-canary.default".to_owned(), 10000)
        ]
    );
}
