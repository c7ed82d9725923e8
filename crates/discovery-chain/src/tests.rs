use super::*;
use serde_json::json;
use structs::discovery_chain::NodeType;
use structs::{CompiledDiscoveryChain, ConfigEntry, Protocol};

type Fixture = crate::fixture::EntrySet;

/// Compiling in `dc1` with the trust domain `td.consul`, no overrides.
trait Compile {
    fn compile(&self, service: &str) -> Result<CompiledDiscoveryChain, ChainError>;
    fn validate(&self, also: &str) -> Result<(), ChainError>;
}

impl Compile for Fixture {
    fn compile(&self, service: &str) -> Result<CompiledDiscoveryChain, ChainError> {
        self.compile_with(service, "td.consul", None, None)
    }

    fn validate(&self, also: &str) -> Result<(), ChainError> {
        validate_graph(&self.entries(), "dc1", also)
    }
}

fn targets(chain: &CompiledDiscoveryChain) -> Vec<&str> {
    chain.targets.keys().map(|t| t.as_str()).collect()
}

#[test]
fn a_service_without_entries_compiles_to_the_default_chain() {
    let chain = Fixture::default().compile("api").unwrap();
    assert_eq!(
        chain,
        CompiledDiscoveryChain::default_for("api", "dc1", "td.consul", Protocol::Tcp)
    );
    assert!(chain.default);
    assert_eq!(chain.start_node, "resolver:api.default.default.dc1");
}

#[test]
fn a_router_compiles_routes_in_order_with_a_catch_all() {
    let f = Fixture::default()
        .http("web")
        .http("admin")
        .with(json!({"Kind": "service-resolver", "Name": "web",
            "Subsets": {"v1": {"Filter": "Service.Meta.version == v1"}, "v2": {"Filter": "Service.Meta.version == v2"}}}))
        .with(json!({"Kind": "service-router", "Name": "web", "Routes": [
            {"Match": {"HTTP": {"Header": [{"Name": "x-version", "Exact": "2"}]}},
             "Destination": {"ServiceSubset": "v2", "NumRetries": 3, "RetryOnStatusCodes": [503]}},
            {"Match": {"HTTP": {"PathPrefix": "/admin"}},
             "Destination": {"Service": "admin", "PrefixRewrite": "/"}}
        ]}));
    let chain = f.compile("web").unwrap();
    assert_eq!(chain.protocol, Protocol::Http);
    assert!(!chain.default);
    assert_eq!(chain.start_node, "router:web.default.default");
    let router = &chain.nodes[&chain.start_node];
    assert_eq!(router.node_type, NodeType::Router);
    let next: Vec<&str> = router.routes.iter().map(|r| r.next_node.as_str()).collect();
    assert_eq!(
        next,
        [
            "resolver:v2.web.default.default.dc1",
            "resolver:admin.default.default.dc1",
            "resolver:web.default.default.dc1"
        ]
    );
    let last = &router.routes[2].definition;
    assert_eq!(last.match_.as_ref().unwrap().http.as_ref().unwrap().path_prefix, "/");
    assert_eq!(
        targets(&chain),
        [
            "admin.default.default.dc1",
            "v2.web.default.default.dc1",
            "web.default.default.dc1"
        ]
    );
    let v2 = &chain.targets[&structs::TargetId::new("v2", "web", "default", "dc1")];
    assert_eq!(v2.subset.filter, "Service.Meta.version == v2");
    assert_eq!(v2.sni, "v2.web.default.dc1.internal.td.consul");
}

#[test]
fn splitters_flatten_nested_splitters_and_keep_two_decimals() {
    let f = Fixture::default()
        .http("web")
        .http("web-v2")
        .with(json!({"Kind": "service-resolver", "Name": "web",
            "Subsets": {"v1": {"Filter": "Service.Meta.version == v1"}}}))
        .with(json!({"Kind": "service-splitter", "Name": "web", "Splits": [
            {"Weight": 80, "ServiceSubset": "v1", "RequestHeaders": {"Set": {"x-leg": "v1"}}},
            {"Weight": 20, "Service": "web-v2"}]}))
        .with(json!({"Kind": "service-splitter", "Name": "web-v2", "Splits": [
            {"Weight": 33.33, "Service": "web-v2"},
            {"Weight": 66.67, "Service": "web-v2", "ResponseHeaders": {"Add": {"x-inner": "1"}}}]}));
    let chain = f.compile("web").unwrap();
    let splitter = &chain.nodes[&chain.start_node];
    assert_eq!(splitter.node_type, NodeType::Splitter);
    let legs: Vec<(f32, &str)> = splitter
        .splits
        .iter()
        .map(|s| (s.weight, s.next_node.as_str()))
        .collect();
    assert_eq!(
        legs,
        [
            (80.0, "resolver:v1.web.default.default.dc1"),
            (6.67, "resolver:web-v2.default.default.dc1"),
            (13.33, "resolver:web-v2.default.default.dc1")
        ]
    );
    assert!(splitter.splits[0].definition.request_headers.is_some());
    assert!(splitter.splits[2].definition.response_headers.is_some());
}

#[test]
fn nested_splitter_legs_merge_header_changes_inner_on_top() {
    let f = Fixture::default()
        .http("web")
        .http("web-v2")
        .with(json!({"Kind": "service-splitter", "Name": "web", "Splits": [
            {"Weight": 50},
            {"Weight": 50, "Service": "web-v2", "RequestHeaders": {"Set": {"x-a": "outer", "x-b": "outer"}, "Remove": ["x-r1"]}}]}))
        .with(json!({"Kind": "service-splitter", "Name": "web-v2", "Splits": [
            {"Weight": 100, "RequestHeaders": {"Set": {"x-b": "inner"}, "Remove": ["x-r2"]}}]}));
    let chain = f.compile("web").unwrap();
    let legs = &chain.nodes[&chain.start_node].splits;
    let h = legs[1].definition.request_headers.as_ref().unwrap();
    assert_eq!(h.set["x-a"], "outer");
    assert_eq!(h.set["x-b"], "inner");
    assert_eq!(h.remove, ["x-r1", "x-r2"]);
}

#[test]
fn resolver_default_subset_redirect_failover_and_load_balancer() {
    let f = Fixture::default()
        .with(json!({"Kind": "service-resolver", "Name": "api", "DefaultSubset": "v1",
            "ConnectTimeout": "2s", "RequestTimeout": "10s",
            "Subsets": {"v1": {"Filter": "Service.Meta.version == v1", "OnlyPassing": true},
                        "v2": {"Filter": "Service.Meta.version == v2"}},
            "Failover": {"v1": {"ServiceSubset": "v2"}, "*": {"Service": "api-backup"}},
            "LoadBalancer": {"Policy": "ring_hash", "HashPolicies": [{"Field": "header", "FieldValue": "x-user"}]}}))
        .with(json!({"Kind": "service-resolver", "Name": "old-api", "Redirect": {"Service": "api", "ServiceSubset": "v2"}}));
    let chain = f.compile("api").unwrap();
    assert_eq!(chain.start_node, "resolver:v1.api.default.default.dc1");
    let node = &chain.nodes[&chain.start_node];
    let r = node.resolver.as_ref().unwrap();
    assert_eq!(r.connect_timeout.0, std::time::Duration::from_secs(2));
    assert_eq!(r.request_timeout.0, std::time::Duration::from_secs(10));
    assert_eq!(
        r.failover.as_ref().unwrap().targets,
        [structs::TargetId::new("v2", "api", "default", "dc1")]
    );
    assert_eq!(node.load_balancer.as_ref().unwrap().policy, "ring_hash");
    let primary = &chain.targets[&r.target];
    assert!(primary.subset.only_passing);
    assert_eq!(primary.connect_timeout_ms, 2000);
    assert_eq!(primary.load_balancer.as_ref().unwrap().policy, "ring_hash");

    let redirected = f.compile("old-api").unwrap();
    assert_eq!(redirected.start_node, "resolver:v2.api.default.default.dc1");
    assert_eq!(redirected.service_name, "old-api");
    // v2 has no own failover: "*" applies.
    let r = redirected.nodes[&redirected.start_node].resolver.as_ref().unwrap();
    assert_eq!(
        r.failover.as_ref().unwrap().targets,
        [structs::TargetId::new("", "api-backup", "default", "dc1")]
    );
    assert_eq!(
        targets(&redirected),
        ["api-backup.default.default.dc1", "v2.api.default.default.dc1"]
    );
}

#[test]
fn a_redirect_to_a_peer_targets_the_service_as_the_peer_exports_it() {
    let f = Fixture::default()
        .with(
            json!({"Kind": "service-resolver", "Name": "api", "ConnectTimeout": "3s",
            "Redirect": {"Peer": "cluster-a"}}),
        )
        .with(json!({"Kind": "service-resolver", "Name": "web",
            "Redirect": {"Service": "web-v2", "Peer": "cluster-a"}}))
        .with(json!({"Kind": "service-resolver", "Name": "db",
            "Failover": {"*": {"Targets": [{"Service": "api"}]}}}));
    let chain = f.compile("api").unwrap();
    assert_eq!(targets(&chain), ["api.default.default.external.cluster-a"]);
    let target = chain.targets.values().next().unwrap();
    assert_eq!((target.peer.as_str(), target.connect_timeout_ms), ("cluster-a", 3000));
    let r = chain.nodes[&chain.start_node].resolver.as_ref().unwrap();
    assert!(r.failover.is_none());
    let chain = f.compile("web").unwrap();
    assert_eq!(targets(&chain), ["web-v2.default.default.external.cluster-a"]);
    // A failover target redirected to a peer fails over to the peer.
    let chain = f.compile("db").unwrap();
    let r = chain.nodes[&chain.start_node].resolver.as_ref().unwrap();
    assert_eq!(
        r.failover.as_ref().unwrap().targets,
        [structs::TargetId("api.default.default.external.cluster-a".into())]
    );
}

#[test]
fn failover_targets_keep_order_and_drop_the_primary() {
    let f = Fixture::default().with(json!({"Kind": "service-resolver", "Name": "api",
        "Subsets": {"a": {"Filter": "Service.Meta.zone == a"}, "b": {"Filter": "Service.Meta.zone == b"}},
        "DefaultSubset": "a",
        "Failover": {"a": {"Targets": [{"ServiceSubset": "a"}, {"ServiceSubset": "b"}, {"Service": "api-dr"}, {"ServiceSubset": "b"}]}}}));
    let chain = f.compile("api").unwrap();
    let r = chain.nodes[&chain.start_node].resolver.as_ref().unwrap();
    let ids: Vec<&str> = r
        .failover
        .as_ref()
        .unwrap()
        .targets
        .iter()
        .map(|t| t.as_str())
        .collect();
    assert_eq!(ids, ["b.api.default.default.dc1", "api-dr.default.default.dc1"]);
}

#[test]
fn overrides_apply_to_protocol_and_connect_timeout() {
    let f = Fixture::default().http("web");
    let chain = compile(
        &CompileRequest {
            service: "web",
            datacenter: "dc1",
            trust_domain: "td",
            override_protocol: Some(Protocol::Grpc),
            override_connect_timeout: Some(std::time::Duration::from_millis(300)),
        },
        &f.entries(),
    )
    .unwrap();
    assert_eq!(chain.protocol, Protocol::Grpc);
    assert_eq!(chain.targets.values().next().unwrap().connect_timeout_ms, 300);
}

fn err(f: &Fixture, service: &str) -> String {
    f.compile(service).unwrap_err().to_string()
}

#[test]
fn a_router_or_splitter_on_a_tcp_service_is_refused() {
    let f = Fixture::default()
        .with(json!({"Kind": "service-router", "Name": "db", "Routes": [{"Match": {"HTTP": {"PathPrefix": "/x"}}}]}));
    let e = err(&f, "db");
    assert!(
        e.starts_with("service-router \"db\": Name: a service-router needs the service to speak http"),
        "{e}"
    );
    let f = Fixture::default().with(json!({"Kind": "service-splitter", "Name": "db", "Splits": [{"Weight": 100}]}));
    let e = err(&f, "db");
    assert!(e.starts_with("service-splitter \"db\": Name:"), "{e}");
    assert!(f.validate("").is_err());
}

#[test]
fn an_unknown_subset_names_the_entry_and_field_that_asks_for_it() {
    let f = Fixture::default()
        .http("web")
        .with(json!({"Kind": "service-resolver", "Name": "web", "Subsets": {"v1": {"Filter": "Service.Meta.v == 1"}}}))
        .with(json!({"Kind": "service-router", "Name": "web", "Routes": [
            {"Match": {"HTTP": {"PathPrefix": "/a"}}, "Destination": {"ServiceSubset": "v1"}},
            {"Match": {"HTTP": {"PathPrefix": "/b"}}, "Destination": {"ServiceSubset": "v3"}}]}));
    assert_eq!(
        err(&f, "web"),
        "service-router \"web\": Routes[1].Destination.ServiceSubset: service-resolver \"web\" defines no subset \"v3\""
    );
    let f = Fixture::default()
        .http("web")
        .with(json!({"Kind": "service-splitter", "Name": "web", "Splits": [{"Weight": 100, "ServiceSubset": "v9"}]}));
    assert_eq!(
        err(&f, "web"),
        "service-splitter \"web\": Splits[0].ServiceSubset: subset \"v9\" of \"web\" is not defined: \"web\" has no service-resolver"
    );
    let f = Fixture::default().with(json!({"Kind": "service-resolver", "Name": "api",
        "Failover": {"*": {"Service": "other", "ServiceSubset": "x"}}}));
    assert_eq!(
        err(&f, "api"),
        "service-resolver \"api\": Failover[\"*\"].ServiceSubset: subset \"x\" of \"other\" is not defined: \"other\" has no service-resolver"
    );
}

#[test]
fn a_loop_of_redirects_is_refused() {
    let f = Fixture::default()
        .with(json!({"Kind": "service-resolver", "Name": "a", "Redirect": {"Service": "b"}}))
        .with(json!({"Kind": "service-resolver", "Name": "b", "Redirect": {"Service": "c"}}))
        .with(json!({"Kind": "service-resolver", "Name": "c", "Redirect": {"Service": "a"}}));
    assert_eq!(
        err(&f, "a"),
        "service-resolver \"c\": Redirect.Service: redirects form a loop: a -> b -> c -> a"
    );
    assert!(f.validate("").is_err());
}

#[test]
fn a_loop_of_splitters_is_refused() {
    let f = Fixture::default()
        .http("a")
        .http("b")
        .with(json!({"Kind": "service-splitter", "Name": "a", "Splits": [{"Weight": 50, "Service": "b"}, {"Weight": 50}]}))
        .with(json!({"Kind": "service-splitter", "Name": "b", "Splits": [{"Weight": 50, "Service": "a"}, {"Weight": 50}]}));
    let e = err(&f, "a");
    assert!(e.contains("splitters form a loop: a -> b -> a"), "{e}");
}

#[test]
fn other_datacenters_become_targets_there() {
    let f = Fixture::default().with(json!({"Kind": "service-resolver", "Name": "api",
        "Failover": {"*": {"Datacenters": ["dc1", "dc2"]}}}));
    let chain = f.compile("api").unwrap();
    let dc2 = &chain.targets[&structs::TargetId::new("", "api", "default", "dc2")];
    assert_eq!(
        (dc2.datacenter.as_str(), dc2.sni.as_str()),
        ("dc2", "api.default.dc2.internal.td.consul")
    );
    let failover = chain.nodes["resolver:api.default.default.dc1"]
        .resolver
        .as_ref()
        .unwrap()
        .failover
        .as_ref()
        .unwrap();
    assert_eq!(
        failover.targets,
        [structs::TargetId::new("", "api", "default", "dc2")],
        "dc1 is the primary itself"
    );
    // A redirect to another datacenter: the service there (its own resolvers are not read).
    let f = Fixture::default()
        .with(json!({"Kind": "service-resolver", "Name": "api", "Redirect": {"Service": "api2", "Datacenter": "dc3"}}));
    let chain = f.compile("api").unwrap();
    assert_eq!(chain.start_node, "resolver:api2.default.default.dc3");
    assert_eq!(
        chain.targets.keys().collect::<Vec<_>>(),
        [&structs::TargetId::new("", "api2", "default", "dc3")]
    );
}

#[test]
fn routing_across_protocols_is_refused() {
    let f = Fixture::default().http("web").with(
        json!({"Kind": "service-splitter", "Name": "web", "Splits": [{"Weight": 50}, {"Weight": 50, "Service": "db"}]}),
    );
    assert_eq!(
        err(&f, "web"),
        "service-splitter \"web\": Splits[1].Service: service \"db\" has protocol tcp, but the chain of \"web\" has protocol http: a chain only joins services of one protocol"
    );
}

#[test]
fn validate_graph_checks_every_routed_service_and_l7_intentions() {
    // Fine as written...
    let f = Fixture::default()
        .http("web")
        .with(json!({"Kind": "service-router", "Name": "web", "Routes": [{"Match": {"HTTP": {"PathPrefix": "/x"}}}]}));
    f.validate("web").unwrap();
    // ...until web turns tcp: the router's chain breaks.
    let mut g = Fixture::default().with(json!({"Kind": "service-defaults", "Name": "web", "Protocol": "tcp"}));
    g.routers = f.routers.clone();
    assert!(
        g.validate("web")
            .unwrap_err()
            .to_string()
            .starts_with("service-router \"web\": Name:")
    );

    let l7 = json!({"Kind": "service-intentions", "Name": "db", "Sources": [
        {"Name": "web", "Action": "allow"},
        {"Name": "api", "Permissions": [{"Action": "deny", "HTTP": {"PathPrefix": "/admin"}}]}]});
    let f = Fixture::default().with(l7.clone());
    assert_eq!(
        f.validate("db").unwrap_err().to_string(),
        "service-intentions \"db\": Sources[1].Permissions: L7 permissions need service \"db\" to speak http, http2 or grpc, \
         but its protocol is tcp (set Protocol in its service-defaults)"
    );
    Fixture::default().http("db").with(l7).validate("db").unwrap();
}

#[test]
fn a_namespace_other_than_default_is_refused_where_it_is_named() {
    for (v, field) in [
        (
            json!({"Kind": "service-router", "Name": "web", "Routes": [{"Destination": {"Namespace": "team-a"}}]}),
            "Routes[0].Destination.Namespace",
        ),
        (
            json!({"Kind": "service-splitter", "Name": "web", "Splits": [{"Weight": 100, "Namespace": "team-a"}]}),
            "Splits[0].Namespace",
        ),
        (
            json!({"Kind": "service-resolver", "Name": "web", "Redirect": {"Service": "x", "Namespace": "team-a"}}),
            "Redirect.Namespace",
        ),
        (
            json!({"Kind": "service-resolver", "Name": "web", "Failover": {"*": {"Targets": [{"Service": "x", "Namespace": "b"}]}}}),
            "Failover[\"*\"].Targets[0].Namespace",
        ),
    ] {
        let e = structs::Validate::validate(&ConfigEntry::from_json(v).unwrap()).unwrap_err();
        assert_eq!(e.field, field);
    }
    structs::Validate::validate(
        &ConfigEntry::from_json(
            json!({"Kind": "service-splitter", "Name": "web", "Splits": [{"Weight": 100, "Namespace": "default"}]}),
        )
        .unwrap(),
    )
    .unwrap();
}

#[test]
fn an_upstream_overriding_to_tcp_skips_routers_and_splitters() {
    let f = Fixture::default()
        .http("web")
        .with(json!({"Kind": "service-router", "Name": "web", "Routes": [{"Match": {"HTTP": {"PathPrefix": "/x"}}}]}))
        .with(json!({"Kind": "service-splitter", "Name": "web", "Splits": [{"Weight": 100}]}));
    let chain = compile(
        &CompileRequest {
            service: "web",
            datacenter: "dc1",
            trust_domain: "td",
            override_protocol: Some(Protocol::Tcp),
            override_connect_timeout: None,
        },
        &f.entries(),
    )
    .unwrap();
    assert_eq!(chain.protocol, Protocol::Tcp);
    assert_eq!(chain.start_node, "resolver:web.default.default.dc1");
    assert_eq!(chain.nodes.len(), 1);
}

#[test]
fn redirects_and_failover_only_join_services_of_one_protocol() {
    let f = Fixture::default()
        .http("web")
        .with(json!({"Kind": "service-resolver", "Name": "web", "Redirect": {"Service": "db"}}));
    assert_eq!(
        err(&f, "web"),
        "service-resolver \"web\": Redirect.Service: service \"db\" has protocol tcp, but the chain of \"web\" has protocol http: a chain only joins services of one protocol"
    );
    let f = Fixture::default()
        .http("web")
        .with(json!({"Kind": "service-resolver", "Name": "web", "Failover": {"*": {"Service": "db"}}}));
    assert!(
        err(&f, "web")
            .starts_with("service-resolver \"web\": Failover[\"*\"].Service: service \"db\" has protocol tcp")
    );
}

#[test]
fn failover_targets_follow_their_redirects_and_datacenter_failover_keeps_the_subset() {
    let f = Fixture::default()
        .with(json!({"Kind": "service-resolver", "Name": "api", "DefaultSubset": "v1",
            "Subsets": {"v1": {"Filter": "Service.Meta.version == v1"}, "v2": {"Filter": "Service.Meta.version == v2"}},
            "Failover": {"v1": {"Service": "api-old"}, "v2": {"Datacenters": ["dc1"]}}}))
        .with(json!({"Kind": "service-resolver", "Name": "api-old", "Redirect": {"Service": "api-dr"}}));
    let chain = f.compile("api").unwrap();
    let r = chain.nodes["resolver:v1.api.default.default.dc1"]
        .resolver
        .as_ref()
        .unwrap();
    assert_eq!(
        r.failover.as_ref().unwrap().targets,
        [structs::TargetId::new("", "api-dr", "default", "dc1")]
    );
    // v2 fails over to "the same subset in dc1": itself, so no failover at all.
    let chain = Fixture::default()
        .with(json!({"Kind": "service-resolver", "Name": "api", "DefaultSubset": "v2",
            "Subsets": {"v2": {"Filter": "Service.Meta.version == v2"}},
            "Failover": {"v2": {"Datacenters": ["dc1"]}}}))
        .compile("api")
        .unwrap();
    assert!(
        chain.nodes[&chain.start_node]
            .resolver
            .as_ref()
            .unwrap()
            .failover
            .is_none()
    );
}

#[test]
fn a_subset_a_redirect_asks_for_is_reported_on_the_redirect() {
    let f = Fixture::default()
        .with(json!({"Kind": "service-resolver", "Name": "api", "Subsets": {"v1": {"Filter": "Service.Meta.v == 1"}}}))
        .with(json!({"Kind": "service-resolver", "Name": "old-api", "Redirect": {"Service": "api", "ServiceSubset": "v9"}}));
    assert_eq!(
        err(&f, "old-api"),
        "service-resolver \"old-api\": Redirect.ServiceSubset: service-resolver \"api\" defines no subset \"v9\""
    );
    // A chain redirected elsewhere is not the default chain.
    let f = Fixture::default().with(json!({"Kind": "service-resolver", "Name": "old", "Redirect": {"Service": "new"}}));
    assert!(!f.compile("old").unwrap().default);
}

#[test]
fn a_chain_already_broken_does_not_block_unrelated_writes() {
    // A splitter on a tcp service, written before the checks existed.
    let broken = Fixture::default()
        .with_unchecked(json!({"Kind": "service-splitter", "Name": "db", "Splits": [{"Weight": 100}]}));
    let mut after = Fixture::default().http("web");
    after.splitters = broken.splitters.clone();
    // An unrelated write is fine...
    validate_change(&broken.entries(), &after.entries(), "dc1", "web").unwrap();
    // ...a write that breaks another chain is not...
    let mut worse = Fixture::default()
        .http("web")
        .with(json!({"Kind": "service-router", "Name": "web", "Routes": [{"Match": {"HTTP": {"PathPrefix": "/x"}}}]}));
    worse.splitters = broken.splitters.clone();
    let mut tcp_web = Fixture::default().with(json!({"Kind": "service-defaults", "Name": "web", "Protocol": "tcp"}));
    tcp_web.splitters = broken.splitters.clone();
    tcp_web.routers = worse.routers.clone();
    let e = validate_change(&worse.entries(), &tcp_web.entries(), "dc1", "web").unwrap_err();
    assert_eq!((e.name.as_str(), e.field.as_str()), ("web", "Name"));
    // ...and the fix of the broken one is accepted.
    let mut fixed = Fixture::default().http("db");
    fixed.splitters = broken.splitters.clone();
    validate_change(&broken.entries(), &fixed.entries(), "dc1", "db").unwrap();
}

#[test]
fn each_entry_check_names_its_field() {
    let router =
        |m: serde_json::Value| json!({"Kind": "service-router", "Name": "web", "Routes": [{"Match": {"HTTP": m}}]});
    let l7 = |p: serde_json::Value| json!({"Kind": "service-intentions", "Name": "web", "Sources": [{"Name": "api", "Permissions": [{"Action": "deny", "HTTP": p}]}]});
    for (v, field) in [
        (
            router(json!({"Header": [{"Name": "x", "Exact": "a", "Prefix": "b"}]})),
            "Routes[0].Match.HTTP.Header[0]",
        ),
        (
            router(json!({"Header": [{"Name": "x", "Regex": "("}]})),
            "Routes[0].Match.HTTP.Header[0].Regex",
        ),
        (
            router(json!({"Header": [{"Exact": "a"}]})),
            "Routes[0].Match.HTTP.Header[0].Name",
        ),
        (router(json!({"Methods": ["get"]})), "Routes[0].Match.HTTP.Methods[0]"),
        (router(json!({"PathRegex": "[a-"})), "Routes[0].Match.HTTP.PathRegex"),
        (
            router(json!({"QueryParam": [{"Name": "q"}]})),
            "Routes[0].Match.HTTP.QueryParam[0]",
        ),
        (
            l7(json!({"Methods": ["delete"]})),
            "Sources[0].Permissions[0].HTTP.Methods[0]",
        ),
        (
            l7(json!({"Header": [{"Name": "x", "Present": true, "Suffix": "s"}]})),
            "Sources[0].Permissions[0].HTTP.Header[0]",
        ),
        (
            l7(json!({"PathRegex": "(a"})),
            "Sources[0].Permissions[0].HTTP.PathRegex",
        ),
        (
            json!({"Kind": "service-router", "Name": "web", "Routes": [{"Destination": {"RetryOn": ["sometimes"]}}]}),
            "Routes[0].Destination.RetryOn[0]",
        ),
        (
            json!({"Kind": "service-resolver", "Name": "web", "LoadBalancer": {"Policy": "fastest"}}),
            "LoadBalancer.Policy",
        ),
        (
            json!({"Kind": "service-resolver", "Name": "web", "Subsets": {"v1": {"Filter": "Service.Meta.version = v1"}}}),
            "Subsets[\"v1\"].Filter",
        ),
    ] {
        let e = structs::Validate::validate(&ConfigEntry::from_json(v.clone()).unwrap()).unwrap_err();
        assert_eq!(e.field, field, "{v}");
    }
}
