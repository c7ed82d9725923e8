//! Every generated configuration is accepted by the real Envoy (`envoy --mode validate`).
//!
//! The dynamic parts are made static for validation: EDS clusters get their generated load
//! assignment inline, HTTP connection managers their generated route configuration (RDS
//! inlined, so Envoy also checks that every cluster a route names exists), and the generated
//! secrets become static secrets that the TLS contexts name (their SDS source removed), so
//! the very resources the server would send are what Envoy checks. Aggregate (failover)
//! clusters stay as generated; their members, which Envoy only looks up when routing, are
//! checked to be clusters of the same set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "validate/api_gateway.rs"]
mod api_gateway;
#[path = "chains/mod.rs"]
mod chains;
#[path = "validate/destinations.rs"]
mod destinations;

use crate::common::*;
use envoy_types::pb::envoy::config::bootstrap::v3::{Admin, Bootstrap, bootstrap};
use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig as AggregateClusterConfig;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, DownstreamTlsContext, Secret, UpstreamTlsContext, common_tls_context,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::util::pack_any;
use prost::{Message, Name};
use proxycfg::{ConfigSnapshot, KindSnapshot};
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use structs::Intention;
use structs::config_entry::{
    IntentionAction, IntentionHttpHeaderPermission, IntentionHttpPermission, IntentionPermission,
};
use test_support::envoy;
use xds::resources::{self, CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET};

fn unpack<T: Message + Name + Default>(any: &Any) -> T {
    assert_eq!(any.type_url, T::type_url());
    T::decode(any.value.as_slice()).unwrap()
}

/// Points a TLS context's SDS references at static secrets of the same names.
fn static_sds(ctx: &mut CommonTlsContext) {
    use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
    for c in &mut ctx.tls_certificate_sds_secret_configs {
        // Over ADS: made static. From an external SDS server (a gateway's certificate):
        // kept, with that server's cluster in the bootstrap.
        if matches!(
            c.sds_config.as_ref().and_then(|s| s.config_source_specifier.as_ref()),
            Some(ConfigSourceSpecifier::Ads(_))
        ) {
            c.sds_config = None;
        }
    }
    if let Some(common_tls_context::ValidationContextType::CombinedValidationContext(v)) =
        &mut ctx.validation_context_type
        && let Some(c) = &mut v.validation_context_sds_secret_config
    {
        c.sds_config = None;
    }
}

/// The same transport socket with its SDS references made static.
fn static_socket(ts: &mut TransportSocket) {
    let Some(transport_socket::ConfigType::TypedConfig(cfg)) = &ts.config_type else {
        return;
    };
    let repacked = if cfg.type_url == UpstreamTlsContext::type_url() {
        let mut ctx: UpstreamTlsContext = unpack(cfg);
        static_sds(ctx.common_tls_context.as_mut().unwrap());
        pack_any(ctx)
    } else {
        let mut ctx: DownstreamTlsContext = unpack(cfg);
        static_sds(ctx.common_tls_context.as_mut().unwrap());
        pack_any(ctx)
    };
    ts.config_type = Some(transport_socket::ConfigType::TypedConfig(repacked));
}

fn static_bootstrap(r: &resources::Resources) -> Bootstrap {
    let routes: Vec<RouteConfiguration> = r
        .of(ROUTE)
        .map(|m| m.values().map(unpack).collect())
        .unwrap_or_default();
    let mut clusters = Vec::new();
    for any in r.of(CLUSTER).into_iter().flat_map(|m| m.values()) {
        let mut c: Cluster = unpack(any);
        if let Some(ts) = &mut c.transport_socket {
            static_socket(ts);
        }
        if c.eds_cluster_config.is_some() {
            let cla: ClusterLoadAssignment = unpack(&r.of(ENDPOINT).unwrap()[&c.name]);
            c.eds_cluster_config = None;
            c.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::Type(
                cluster::DiscoveryType::Static as i32,
            ));
            c.load_assignment = Some(cla);
        }
        clusters.push(c);
    }
    // Envoy resolves an aggregate cluster's members only when it routes, so `--mode validate`
    // accepts members that do not exist: check them here.
    for c in &clusters {
        if let Some(cluster::ClusterDiscoveryType::ClusterType(t)) = &c.cluster_discovery_type
            && t.name == "envoy.clusters.aggregate"
        {
            let members: AggregateClusterConfig = unpack(t.typed_config.as_ref().expect("aggregate config"));
            assert!(
                !members.clusters.is_empty(),
                "aggregate cluster {} has no members",
                c.name
            );
            for m in &members.clusters {
                assert!(
                    clusters.iter().any(|o| o.name == *m
                        && !matches!(
                            o.cluster_discovery_type,
                            Some(cluster::ClusterDiscoveryType::ClusterType(_))
                        )),
                    "aggregate cluster {} names {m}, which is not a (non-aggregate) cluster",
                    c.name
                );
            }
        }
    }
    let mut listeners = Vec::new();
    for any in r.of(LISTENER).unwrap().values() {
        let mut l: Listener = unpack(any);
        for chain in &mut l.filter_chains {
            if let Some(ts) = &mut chain.transport_socket {
                static_socket(ts);
            }
            for f in &mut chain.filters {
                let Some(filter::ConfigType::TypedConfig(cfg)) = &f.config_type else {
                    continue;
                };
                if cfg.type_url != HttpConnectionManager::type_url() {
                    continue;
                }
                let mut hcm: HttpConnectionManager = unpack(cfg);
                if let Some(http_connection_manager::RouteSpecifier::Rds(rds)) = &hcm.route_specifier {
                    let route = routes
                        .iter()
                        .find(|r| r.name == rds.route_config_name)
                        .expect("RDS route generated")
                        .clone();
                    hcm.route_specifier = Some(http_connection_manager::RouteSpecifier::RouteConfig(route));
                }
                f.config_type = Some(filter::ConfigType::TypedConfig(pack_any(hcm)));
            }
        }
        listeners.push(l);
    }
    Bootstrap {
        node: Some(Node {
            id: "web-sidecar-proxy".into(),
            cluster: "web".into(),
            ..Default::default()
        }),
        static_resources: Some(bootstrap::StaticResources {
            listeners,
            clusters,
            secrets: r
                .of(SECRET)
                .map(|m| m.values().map(unpack::<Secret>).collect())
                .unwrap_or_default(),
        }),
        admin: Some(Admin::default()),
        ..Default::default()
    }
}

/// The resources as readable, stable text: every resource decoded, certificates and the
/// (random) trust domain replaced by placeholders.
fn golden_text(r: &resources::Resources, trust_domain: &str) -> String {
    let mut out = String::new();
    for (type_url, items) in &r.by_type {
        for (name, any) in items {
            let text = match *type_url {
                CLUSTER => decode_cluster(any),
                ENDPOINT => format!("{:#?}", unpack::<ClusterLoadAssignment>(any)),
                SECRET => format!("{:#?}", unpack::<Secret>(any)),
                LISTENER => decode_listener(any),
                _ => format!("{:#?}", unpack::<RouteConfiguration>(any)),
            };
            out.push_str(&format!("=== {type_url} {name}\n{text}\n"));
        }
    }
    redact_pem(&out.replace(trust_domain, "<trust-domain>"))
}

/// A cluster with its TLS context, protocol options and aggregate members decoded (they hold
/// certificates and names).
fn decode_cluster(any: &Any) -> String {
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
    let mut c: Cluster = unpack(any);
    let tls = c.transport_socket.take().and_then(|ts| match ts.config_type {
        Some(envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(cfg)) => {
            Some(unpack::<UpstreamTlsContext>(&cfg))
        }
        _ => None,
    });
    let options: Vec<(String, HttpProtocolOptions)> = c
        .typed_extension_protocol_options
        .drain()
        .map(|(k, v)| (k, unpack(&v)))
        .collect();
    // An aggregate cluster's members (named after the trust domain, so decoded to be redacted).
    let aggregate = match &mut c.cluster_discovery_type {
        Some(cluster::ClusterDiscoveryType::ClusterType(t)) => t
            .typed_config
            .take()
            .map(|cfg| format!("\naggregate of: {:#?}", unpack::<AggregateClusterConfig>(&cfg).clusters)),
        _ => None,
    };
    format!(
        "{c:#?}\nupstream tls: {tls:#?}\nprotocol options: {options:#?}{}",
        aggregate.unwrap_or_default()
    )
}

/// A listener with its filters' and transport socket's typed configs decoded, so the golden
/// shows what they say rather than bytes.
fn decode_listener(any: &Any) -> String {
    use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac;
    use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
    let l: Listener = unpack(any);
    let mut parts = vec![format!(
        "name: {}\naddress: {:?}\ndirection: {}",
        l.name, l.address, l.traffic_direction
    )];
    if let Some(balance) = &l.connection_balance_config {
        parts.push(format!("connection_balance: {balance:?}"));
    }
    for f in &l.listener_filters {
        parts.push(format!("listener_filter: {}", f.name));
        if let Some(disabled) = &f.filter_disabled {
            parts.push(format!("  disabled: {disabled:?}"));
        }
    }
    for chain in l.filter_chains.iter().chain(&l.default_filter_chain) {
        if let Some(m) = &chain.filter_chain_match {
            parts.push(format!("filter_chain_match: {m:?}"));
        }
        if Some(chain) == l.default_filter_chain.as_ref() {
            parts.push("default_filter_chain:".into());
        }
        if let Some(ts) = &chain.transport_socket
            && let Some(envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(cfg)) =
                &ts.config_type
        {
            parts.push(format!("transport_socket: {:#?}", unpack::<DownstreamTlsContext>(cfg)));
        }
        for f in &chain.filters {
            let Some(filter::ConfigType::TypedConfig(cfg)) = &f.config_type else {
                continue;
            };
            let text = if cfg.type_url == HttpConnectionManager::type_url() {
                let hcm = unpack::<HttpConnectionManager>(cfg);
                format!("{hcm:#?}{}", decode_rate_limits(&hcm))
            } else if cfg.type_url == TcpProxy::type_url() {
                format!("{:#?}", unpack::<TcpProxy>(cfg))
            } else if cfg.type_url == Rbac::type_url() {
                format!("{:#?}", unpack::<Rbac>(cfg))
            } else {
                cfg.type_url.clone()
            };
            parts.push(format!("filter {}: {text}", f.name));
        }
    }
    parts.join("\n")
}

/// The local rate limit configs of an HTTP connection manager (its filter's and each inline
/// route's), decoded.
fn decode_rate_limits(hcm: &HttpConnectionManager) -> String {
    use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::JwtAuthentication;
    use envoy_types::pb::envoy::extensions::filters::http::local_ratelimit::v3::LocalRateLimit;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        http_connection_manager::RouteSpecifier, http_filter,
    };
    let mut out = String::new();
    for f in &hcm.http_filters {
        if let Some(http_filter::ConfigType::TypedConfig(cfg)) = &f.config_type
            && cfg.type_url == LocalRateLimit::type_url()
        {
            out += &format!("\nhttp filter {}: {:#?}", f.name, unpack::<LocalRateLimit>(cfg));
        }
        if let Some(http_filter::ConfigType::TypedConfig(cfg)) = &f.config_type
            && cfg.type_url == JwtAuthentication::type_url()
        {
            let jwt = unpack::<JwtAuthentication>(cfg);
            // The providers map in name order (a HashMap prints in any order).
            let providers: BTreeMap<_, _> = jwt.providers.iter().collect();
            out += &format!(
                "\nhttp filter {}: providers {providers:#?}\nrules {:#?}",
                f.name, jwt.rules
            );
        }
    }
    if let Some(RouteSpecifier::RouteConfig(rc)) = &hcm.route_specifier {
        for r in rc.virtual_hosts.iter().flat_map(|v| &v.routes) {
            for (name, cfg) in &r.typed_per_filter_config {
                if cfg.type_url == LocalRateLimit::type_url() {
                    let m = r.r#match.as_ref().and_then(|m| m.path_specifier.as_ref());
                    out += &format!("\nroute {m:?} {name}: {:#?}", unpack::<LocalRateLimit>(cfg));
                }
            }
        }
    }
    out
}

fn redact_pem(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('"').map_or(rest.len(), |e| start + e);
        out.push_str("<pem>");
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

fn validate(name: &str, scenario: &Scenario) {
    let ca = Ca::new();
    validate_snapshot(name, &snapshot(&ca, scenario));
}

/// Checks the resources built from `snap` against the golden `name` and with Envoy, and
/// returns them.
fn validate_snapshot(name: &str, snap: &ConfigSnapshot) -> resources::Resources {
    let r = resources::build(snap).unwrap();
    insta::assert_snapshot!(name, golden_text(&r, &snap.roots.as_ref().unwrap().trust_domain));
    if let Err(e) = envoy_validate(name, &static_bootstrap(&r)) {
        panic!("{name}: envoy rejected the configuration:\n{e}");
    }
    r
}

/// Runs `envoy --mode validate` on `bootstrap`: its output when Envoy refuses it.
fn envoy_validate(name: &str, bootstrap: &Bootstrap) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{name}.pb"));
    std::fs::write(&path, bootstrap.encode_to_vec()).unwrap();
    let out = Command::new(envoy())
        .args(["--mode", "validate", "-l", "error", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

#[test]
fn no_upstreams() {
    validate(
        "no-upstreams",
        &Scenario {
            protocol: "tcp",
            upstreams: vec![],
            intentions: vec![],
            instances: vec![],
        },
    );
}

#[test]
fn tcp_upstreams_with_instances() {
    validate(
        "tcp",
        &Scenario {
            protocol: "tcp",
            upstreams: vec![("api", 9191, "tcp"), ("db", 9192, "tcp")],
            intentions: vec![],
            instances: vec![instance("api", "10.0.0.1", 21000), instance("api", "10.0.0.2", 21000)],
        },
    );
}

#[test]
fn http_upstreams_and_http_public_listener() {
    validate(
        "http",
        &Scenario {
            protocol: "http",
            upstreams: vec![("api", 9191, "http"), ("grpc-svc", 9192, "grpc")],
            intentions: vec![("billing", IntentionAction::Deny)],
            instances: vec![instance("api", "10.0.0.1", 21000)],
        },
    );
}

#[test]
fn several_instances() {
    validate(
        "several-instances",
        &Scenario {
            protocol: "tcp",
            upstreams: vec![("api", 9191, "tcp")],
            intentions: vec![],
            instances: vec![
                instance("api", "10.0.0.1", 21000),
                instance("api", "10.0.0.2", 21000),
                instance("api", "10.0.0.3", 21001),
            ],
        },
    );
}

/// The instance at 10.0.0.3 turned critical: the data source passes on only passing ones.
#[test]
fn an_instance_turned_critical() {
    validate(
        "instance-critical",
        &Scenario {
            protocol: "tcp",
            upstreams: vec![("api", 9191, "tcp")],
            intentions: vec![],
            instances: vec![instance("api", "10.0.0.1", 21000), instance("api", "10.0.0.2", 21000)],
        },
    );
}

#[test]
fn default_deny_with_an_allow_intention() {
    validate(
        "deny-allow",
        &Scenario {
            protocol: "tcp",
            upstreams: vec![("api", 9191, "tcp")],
            intentions: vec![("*", IntentionAction::Deny), ("web", IntentionAction::Allow)],
            instances: vec![],
        },
    );
}

/// `snap` with `intentions` (to `web`) in place of the scenario's.
fn with_intentions(mut snap: ConfigSnapshot, intentions: Vec<Intention>) -> ConfigSnapshot {
    let KindSnapshot::ConnectProxy(cp) = &mut snap.kind else {
        unreachable!("a sidecar snapshot")
    };
    cp.intentions = Some(Arc::new(intentions));
    snap
}

fn intention(source: &str, action: Option<IntentionAction>, permissions: Vec<IntentionPermission>) -> Intention {
    let mut i = Intention {
        source_ns: "default".into(),
        source_name: source.into(),
        destination_ns: "default".into(),
        destination_name: "web".into(),
        action,
        permissions,
        ..Default::default()
    };
    i.update_precedence();
    i
}

fn permission(action: IntentionAction, http: IntentionHttpPermission) -> IntentionPermission {
    IntentionPermission {
        action,
        http: Some(http),
        jwt: None,
    }
}

/// L7 intentions using every kind of condition: paths (exact, prefix, regex), headers
/// (present, exact, prefix, suffix, regex, inverted) and methods, with a precise L4 deny and
/// a wildcard with permissions.
fn l7_intentions() -> Vec<Intention> {
    use IntentionAction::{Allow, Deny};
    let header = |name: &str| IntentionHttpHeaderPermission {
        name: name.into(),
        ..Default::default()
    };
    vec![
        intention(
            "api",
            None,
            vec![
                permission(
                    Deny,
                    IntentionHttpPermission {
                        path_prefix: "/admin".into(),
                        ..Default::default()
                    },
                ),
                permission(
                    Allow,
                    IntentionHttpPermission {
                        path_regex: "/api/v[0-9]+/.*".into(),
                        header: vec![
                            IntentionHttpHeaderPermission {
                                prefix: "al".into(),
                                ..header("x-user")
                            },
                            IntentionHttpHeaderPermission {
                                suffix: ".internal".into(),
                                invert: true,
                                ..header("x-origin")
                            },
                        ],
                        methods: vec!["GET".into(), "POST".into()],
                        ..Default::default()
                    },
                ),
                permission(
                    Deny,
                    IntentionHttpPermission {
                        header: vec![IntentionHttpHeaderPermission {
                            present: true,
                            ..header("x-debug")
                        }],
                        ..Default::default()
                    },
                ),
                permission(
                    Deny,
                    IntentionHttpPermission {
                        header: vec![
                            IntentionHttpHeaderPermission {
                                regex: "^t-[0-9]+$".into(),
                                invert: true,
                                ..header("x-tenant")
                            },
                            IntentionHttpHeaderPermission {
                                exact: "yes".into(),
                                ..header("x-beta")
                            },
                        ],
                        ..Default::default()
                    },
                ),
            ],
        ),
        intention("billing", Some(Deny), vec![]),
        intention(
            "*",
            None,
            vec![
                permission(
                    Deny,
                    IntentionHttpPermission {
                        methods: vec!["DELETE".into()],
                        ..Default::default()
                    },
                ),
                permission(
                    Deny,
                    IntentionHttpPermission {
                        path_exact: "/internal".into(),
                        ..Default::default()
                    },
                ),
                permission(
                    Allow,
                    IntentionHttpPermission {
                        path_prefix: "/".into(),
                        ..Default::default()
                    },
                ),
            ],
        ),
    ]
}

/// The RBAC of the public listener's filters, readable (policies in name order).
fn public_rbac_text(r: &resources::Resources) -> String {
    use envoy_types::pb::envoy::config::rbac::v3::Rbac;
    use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter;
    use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
    let text = |name: &str, rules: Option<Rbac>| {
        let rules = rules.unwrap();
        let policies: BTreeMap<_, _> = rules.policies.into_iter().collect();
        format!("{name}: action {}\npolicies: {policies:#?}\n", rules.action)
    };
    let mut out = String::new();
    for (name, any) in r.of(LISTENER).unwrap() {
        if !name.starts_with("public_listener:") {
            continue;
        }
        let l: Listener = unpack(any);
        for f in l.filter_chains.iter().flat_map(|c| &c.filters) {
            let Some(filter::ConfigType::TypedConfig(cfg)) = &f.config_type else {
                continue;
            };
            if cfg.type_url == NetworkRbac::type_url() {
                out.push_str(&text(&f.name, unpack::<NetworkRbac>(cfg).rules));
            } else if cfg.type_url == HttpConnectionManager::type_url() {
                for hf in unpack::<HttpConnectionManager>(cfg).http_filters {
                    if let Some(http_filter::ConfigType::TypedConfig(cfg)) = &hf.config_type
                        && cfg.type_url == HttpRbac::type_url()
                    {
                        out.push_str(&text(&hf.name, unpack::<HttpRbac>(cfg).rules));
                    }
                }
            }
        }
    }
    out
}

/// Intentions with permissions on an HTTP service: the HTTP RBAC filter evaluates them per
/// request, and Envoy accepts every kind of matcher they compile to.
#[test]
fn l7_intentions_on_an_http_service() {
    let ca = Ca::new();
    let scenario = Scenario {
        protocol: "http",
        upstreams: vec![],
        intentions: vec![],
        instances: vec![],
    };
    let snap = with_intentions(snapshot(&ca, &scenario), l7_intentions());
    let r = validate_snapshot("l7-intentions-http", &snap);
    let rbac = public_rbac_text(&r);
    assert!(rbac.starts_with("envoy.filters.http.rbac: "), "{rbac}");
    insta::assert_snapshot!("l7-intentions-http-rbac", rbac);
}

/// The same intentions on a TCP service: the network RBAC filter cannot evaluate
/// permissions, so it denies their sources (fail closed).
#[test]
fn l7_intentions_on_a_tcp_service_fail_closed() {
    let ca = Ca::new();
    let scenario = Scenario {
        protocol: "tcp",
        upstreams: vec![],
        intentions: vec![],
        instances: vec![],
    };
    let snap = with_intentions(snapshot(&ca, &scenario), l7_intentions());
    let r = validate_snapshot("l7-intentions-tcp", &snap);
    let rbac = public_rbac_text(&r);
    assert!(rbac.starts_with("envoy.filters.network.rbac: "), "{rbac}");
    insta::assert_snapshot!("l7-intentions-tcp-rbac", rbac);
}

/// The check itself must be able to fail: a configuration Envoy cannot accept is refused.
#[test]
fn envoy_validation_rejects_a_broken_configuration() {
    let broken = Bootstrap {
        node: Some(Node {
            id: "x".into(),
            cluster: "x".into(),
            ..Default::default()
        }),
        static_resources: Some(bootstrap::StaticResources {
            clusters: vec![Cluster {
                name: String::new(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.pb");
    std::fs::write(&path, broken.encode_to_vec()).unwrap();
    let out = Command::new(envoy())
        .args(["--mode", "validate", "-l", "error", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success(), "envoy accepted a cluster without a name");
}

/// A gateway registration named `name` of `kind` on port 8443.
fn gateway_service(kind: structs::ServiceKind, name: &str) -> Arc<structs::NodeService> {
    Arc::new(structs::NodeService {
        kind,
        id: name.into(),
        service: name.into(),
        address: "127.0.0.1".into(),
        port: 8443,
        ..Default::default()
    })
}

fn gateway_snapshot(ca: &Ca, kind: structs::ServiceKind, name: &str, part: KindSnapshot) -> ConfigSnapshot {
    ConfigSnapshot {
        proxy_id: Arc::new(proxycfg::ProxyId::new("node-1", name)),
        service: gateway_service(kind, name),
        datacenter: Arc::from("dc1"),
        version: 1,
        roots: Some(ca.roots()),
        proxy_defaults: Some(None),
        intention_default_allow: true,
        kind: part,
    }
}

fn link(
    gateway: &str,
    kind: structs::ServiceKind,
    service: &str,
    port: u16,
    protocol: &str,
) -> structs::GatewayService {
    structs::GatewayService {
        gateway: gateway.into(),
        service: service.into(),
        gateway_kind: kind,
        port,
        protocol: protocol.into(),
        ..Default::default()
    }
}

/// A static cluster for an external SDS server a configuration names.
fn sds_server_cluster(name: &str) -> Cluster {
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::{HttpProtocolOptions, http_protocol_options};
    let h2 = HttpProtocolOptions {
        upstream_protocol_options: Some(http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
            http_protocol_options::ExplicitHttpConfig {
                protocol_config: Some(
                    http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                        Default::default(),
                    ),
                ),
            },
        )),
        ..Default::default()
    };
    Cluster {
        name: name.into(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Static as i32,
        )),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: name.into(),
            ..Default::default()
        }),
        typed_extension_protocol_options: [(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".to_owned(),
            pack_any(h2),
        )]
        .into_iter()
        .collect(),
        ..Default::default()
    }
}

#[test]
fn ingress_gateway_listeners_hosts_tls_and_limits() {
    use structs::ServiceKind::IngressGateway as Kind;
    let ca = Ca::new();
    let roots = ca.roots();
    let entry: structs::ConfigEntry = serde_json::from_value(serde_json::json!({
        "Kind": "ingress-gateway",
        "Name": "ingress",
        "Defaults": {"MaxConnections": 100},
        "Listeners": [
            {"Port": 8080, "Protocol": "http", "Services": [
                {"Name": "api", "Hosts": ["api.ingress", "api.example.com"],
                 "RequestHeaders": {"Add": {"x-from": "ingress"}, "Remove": ["x-debug"]},
                 "ResponseHeaders": {"Set": {"x-served-by": "meshd"}},
                 "MaxPendingRequests": 10},
                {"Name": "web"},
            ]},
            {"Port": 9090, "Protocol": "tcp", "Services": [{"Name": "db"}]},
            {"Port": 8443, "Protocol": "http", "TLS": {"Enabled": true, "TLSMinVersion": "TLSv1_2"},
             "Services": [{"Name": "api", "Hosts": ["secure.example.com"]},
                          {"Name": "web", "Hosts": ["own.example.com"],
                           "TLS": {"SDS": {"ClusterName": "sds-server", "CertResource": "web-cert"}}}]},
        ],
    }))
    .unwrap();
    let mut services = vec![
        link("ingress", Kind, "api", 8080, "http"),
        link("ingress", Kind, "web", 8080, "http"),
        link("ingress", Kind, "db", 9090, "tcp"),
        link("ingress", Kind, "api", 8443, "http"),
        link("ingress", Kind, "web", 8443, "http"),
    ];
    services[0].hosts = vec!["api.ingress".into(), "api.example.com".into()];
    services[3].hosts = vec!["secure.example.com".into()];
    services[4].hosts = vec!["own.example.com".into()];
    let mut upstreams = BTreeMap::new();
    for (name, protocol) in [("api", "http"), ("web", "http"), ("db", "tcp")] {
        let chain = Arc::new(structs::CompiledDiscoveryChain::default_for(
            name,
            "dc1",
            &roots.trust_domain,
            protocol.parse().unwrap(),
        ));
        let mut up = proxycfg::UpstreamSnapshot::new(usize::MAX);
        for target in chain.targets.keys() {
            up.endpoints.insert(
                target.clone(),
                Arc::new(vec![instance(&format!("{name}-sidecar-proxy"), "10.0.0.1", 21000)]),
            );
        }
        up.chain = Some(chain);
        upstreams.insert(Arc::new(proxycfg::handler::ingress_upstream_id(name)), Arc::new(up));
    }
    let part = KindSnapshot::IngressGateway(proxycfg::IngressGatewaySnapshot {
        leaf: Some(ca.leaf("ingress")),
        entry: Some(Some(Arc::new(entry))),
        mesh_config: Some(None),
        services: Some(Arc::new(services)),
        upstreams: Arc::new(upstreams),
    });
    let snap = gateway_snapshot(&ca, Kind, "ingress", part);
    let r = resources::build(&snap).unwrap();
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    let listeners: Vec<&String> = r.of(LISTENER).unwrap().keys().collect();
    assert_eq!(
        listeners,
        ["http:127.0.0.1:8080", "http:127.0.0.1:8443", "tcp:127.0.0.1:9090"]
    );
    let routes: Vec<&String> = r.of(ROUTE).unwrap().keys().collect();
    assert_eq!(routes, ["8080", "8443", "8443_web"]);
    let route: RouteConfiguration = unpack(&r.of(ROUTE).unwrap()["8080"]);
    let domains: Vec<(&str, Vec<&str>)> = route
        .virtual_hosts
        .iter()
        .map(|v| (v.name.as_str(), v.domains.iter().map(String::as_str).collect()))
        .collect();
    assert_eq!(
        domains,
        [
            (
                "api:8080",
                vec![
                    "api.ingress:8080",
                    "api.ingress",
                    "api.example.com:8080",
                    "api.example.com"
                ]
            ),
            ("web:8080", vec!["web.ingress.*:8080", "web.ingress.*"]),
        ]
    );
    insta::assert_snapshot!("gateway-ingress", golden_text(&r, &roots.trust_domain));
    let mut bootstrap = static_bootstrap(&r);
    bootstrap
        .static_resources
        .as_mut()
        .unwrap()
        .clusters
        .push(sds_server_cluster("sds-server"));
    if let Err(e) = envoy_validate("gateway-ingress", &bootstrap) {
        panic!("envoy rejected the ingress gateway:\n{e}");
    }
    // With access logs on, every gateway listener logs too, and Envoy takes it.
    let mut logged = snap.clone();
    logged.proxy_defaults = Some(Some(access_logs_entry(r#"{"Enabled": true, "Type": "stderr"}"#)));
    let with_logs = resources::build(&logged).unwrap();
    for (name, any) in with_logs.of(LISTENER).unwrap() {
        let listener: Listener = unpack(any);
        assert_eq!(listener.access_log.len(), 1, "{name}: the listener-level log");
        assert!(
            format!("{listener:?}").contains("envoy.access_loggers.stderr"),
            "{name}"
        );
        assert!(filter_logs(&listener) >= 1, "{name}: its filters log");
    }
    let mut bootstrap = static_bootstrap(&with_logs);
    bootstrap
        .static_resources
        .as_mut()
        .unwrap()
        .clusters
        .push(sds_server_cluster("sds-server"));
    if let Err(e) = envoy_validate("gateway-ingress-access-logs", &bootstrap) {
        panic!("envoy rejected the ingress gateway's access logs:\n{e}");
    }

    // An endpoints-only change rebuilds just the load assignment, and equals a full build.
    let first = Arc::new(snap);
    let previous = xds::versioned::VersionedResources::build_after(&first, None, None).unwrap();
    let mut next = (*first).clone();
    if let KindSnapshot::IngressGateway(g) = &mut next.kind {
        let up = Arc::make_mut(
            Arc::make_mut(&mut g.upstreams)
                .get_mut(&proxycfg::handler::ingress_upstream_id("db"))
                .unwrap(),
        );
        let target = up.endpoints.keys().next().unwrap().clone();
        up.endpoints
            .insert(target, Arc::new(vec![instance("db-sidecar-proxy", "10.0.0.9", 21000)]));
    }
    let next = Arc::new(next);
    assert!(resources::same_except_endpoints(&first, &next));
    let incremental = xds::versioned::VersionedResources::build_after(&next, None, Some(&previous)).unwrap();
    let full = xds::versioned::VersionedResources::build(&next, None).unwrap();
    for t in resources::TYPES {
        let a: Vec<(&str, &str)> = incremental.of(t).map(|(n, v)| (n, v.version.as_str())).collect();
        let b: Vec<(&str, &str)> = full.of(t).map(|(n, v)| (n, v.version.as_str())).collect();
        assert_eq!(a, b, "{t}");
    }
}

#[test]
fn terminating_gateway_per_service_chains_tls_origination_and_intentions() {
    use structs::ServiceKind::TerminatingGateway as Kind;
    let ca = Ca::new();
    let roots = ca.roots();
    let dir = tempfile::tempdir().unwrap();
    // Any PEM bundle: Envoy loads the files a context names when it validates.
    let ca_file = dir.path().join("ext-ca.pem");
    std::fs::write(&ca_file, &roots.roots[0].root_cert).unwrap();
    let leaf = ca.leaf("client");
    let cert_file = dir.path().join("client.pem");
    let key_file = dir.path().join("client-key.pem");
    std::fs::write(&cert_file, &leaf.cert_pem).unwrap();
    std::fs::write(&key_file, &leaf.private_key_pem).unwrap();

    let mut ext = link("terminating", Kind, "ext", 0, "");
    ext.ca_file = ca_file.display().to_string();
    ext.sni = "ext.example.com".into();
    let mut mtls = link("terminating", Kind, "billing", 0, "");
    mtls.ca_file = ca_file.display().to_string();
    mtls.cert_file = cert_file.display().to_string();
    mtls.key_file = key_file.display().to_string();
    let plain = link("terminating", Kind, "legacy", 0, "");
    let waiting = link("terminating", Kind, "pending", 0, "");
    let mut linked = BTreeMap::new();
    for (l, protocol, address) in [
        (&ext, "http", "127.0.0.1"),
        (&mtls, "tcp", "10.0.0.7"),
        (&plain, "tcp", "legacy.example.com"),
    ] {
        let mut resolved = structs::ResolvedServiceConfig::default();
        resolved
            .proxy_config
            .insert("protocol".into(), serde_json::Value::String(protocol.into()));
        let mut node = instance(&l.service, address, 443);
        node.service.kind = structs::ServiceKind::Typical;
        node.service.service = l.service.clone();
        node.service.port = 443;
        let mut s = proxycfg::LinkedServiceSnapshot::new(l.clone());
        s.leaf = Some(ca.leaf(&l.service));
        s.intentions = Some(Arc::new(
            vec![intention("web", Some(IntentionAction::Deny), vec![])]
                .into_iter()
                .map(|mut i| {
                    i.destination_name = l.service.clone();
                    i
                })
                .collect(),
        ));
        s.config = Some(Arc::new(resolved));
        s.endpoints = Some(Arc::new(vec![node]));
        s.resolver = Some(None);
        linked.insert(l.service.clone(), Arc::new(s));
    }
    linked.insert(
        "pending".into(),
        Arc::new(proxycfg::LinkedServiceSnapshot::new(waiting.clone())),
    );
    let part = KindSnapshot::TerminatingGateway(proxycfg::TerminatingGatewaySnapshot {
        mesh_config: Some(None),
        services: Some(Arc::new(vec![ext, mtls, plain, waiting])),
        linked: Arc::new(linked),
    });
    let snap = gateway_snapshot(&ca, Kind, "terminating", part);
    let r = resources::build(&snap).unwrap();
    // A linked service still missing parts is named, never silently absent.
    assert!(r.problems["linked-services"].contains("pending"), "{:?}", r.problems);
    // Intentions requiring JWTs: a gateway does not check tokens, and says so.
    let mut with_jwt = snap.clone();
    if let KindSnapshot::TerminatingGateway(t) = &mut with_jwt.kind {
        let billing = Arc::make_mut(Arc::make_mut(&mut t.linked).get_mut("billing").unwrap());
        let mut ixns = (**billing.intentions.as_ref().unwrap()).clone();
        ixns[0].jwt = Some(structs::config_entry::IntentionJwtRequirement {
            providers: vec![structs::config_entry::IntentionJwtProvider {
                name: "okta".into(),
                verify_claims: vec![],
            }],
        });
        billing.intentions = Some(Arc::new(ixns));
    }
    let jwt_problems = resources::build(&with_jwt).unwrap().problems;
    assert!(
        jwt_problems["linked-service:billing:jwt"].contains("refused"),
        "{jwt_problems:?}"
    );
    let secrets: Vec<&String> = r.of(SECRET).unwrap().keys().collect();
    assert_eq!(secrets, ["ROOTCA", "billing", "ext", "legacy"]);
    let listener: Listener = unpack(&r.of(LISTENER).unwrap()["default:127.0.0.1:8443"]);
    let names: Vec<Vec<String>> = listener
        .filter_chains
        .iter()
        .map(|c| c.filter_chain_match.clone().unwrap_or_default().server_names)
        .collect();
    let sni = |s: &str| format!("{s}.default.dc1.internal.{}", roots.trust_domain);
    // Last, the chain for connections no service matched (closed: it names no cluster).
    assert_eq!(
        names,
        [vec![sni("billing")], vec![sni("ext")], vec![sni("legacy")], vec![]]
    );
    // A service registered by host name: one address, resolved over IPv4, as Consul's.
    let legacy: Cluster = unpack(&r.of(CLUSTER).unwrap()[&sni("legacy")]);
    assert_eq!(
        legacy.cluster_discovery_type,
        Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::LogicalDns as i32
        ))
    );
    assert_eq!(legacy.dns_lookup_family, cluster::DnsLookupFamily::V4Only as i32);
    let text = golden_text(&r, &roots.trust_domain).replace(&dir.path().display().to_string(), "<dir>");
    insta::assert_snapshot!("gateway-terminating", text);
    if let Err(e) = envoy_validate("gateway-terminating", &static_bootstrap(&r)) {
        panic!("envoy rejected the terminating gateway:\n{e}");
    }
    // The HTTP chain (ext's) normalizes requests before its intentions: Consul's defaults,
    // then what the mesh entry says.
    use envoy_types::pb::envoy::config::core::v3::http_protocol_options::HeadersWithUnderscoresAction;
    let ext_hcm = |r: &resources::Resources| -> HttpConnectionManager {
        let listener: Listener = unpack(&r.of(LISTENER).unwrap()["default:127.0.0.1:8443"]);
        let chain = &listener.filter_chains[1];
        assert_eq!(chain.filter_chain_match.as_ref().unwrap().server_names, [sni("ext")]);
        let Some(filter::ConfigType::TypedConfig(cfg)) = &chain.filters[0].config_type else {
            panic!("no typed filter")
        };
        unpack(cfg)
    };
    let hcm = ext_hcm(&r);
    assert_eq!(
        (hcm.normalize_path.map(|b| b.value), hcm.merge_slashes),
        (Some(true), false)
    );
    // Consul's default: the caller's certificate details go to the service.
    assert_eq!(
        hcm.forward_client_cert_details,
        http_connection_manager::ForwardClientCertDetails::AppendForward as i32
    );
    assert!(hcm.set_current_client_cert_details.is_some_and(|d| d.uri && d.cert));
    let mesh = structs::ConfigEntry::from_json(serde_json::json!({"Kind": "mesh", "HTTP": {
        "SanitizeXForwardedClientCert": true, "Incoming": {
        "RequestNormalization": {"MergeSlashes": true, "PathWithEscapedSlashesAction": "REJECT_REQUEST",
            "HeadersWithUnderscoresAction": "REJECT_REQUEST"}}}}))
    .unwrap();
    let mut snap = snap;
    if let KindSnapshot::TerminatingGateway(g) = &mut snap.kind {
        g.mesh_config = Some(Some(Arc::new(mesh)));
    }
    let r = resources::build(&snap).unwrap();
    let hcm = ext_hcm(&r);
    assert_eq!(
        (
            hcm.normalize_path.map(|b| b.value),
            hcm.merge_slashes,
            hcm.path_with_escaped_slashes_action,
            hcm.common_http_protocol_options
                .map(|o| o.headers_with_underscores_action),
        ),
        (
            Some(true),
            true,
            http_connection_manager::PathWithEscapedSlashesAction::RejectRequest as i32,
            Some(HeadersWithUnderscoresAction::RejectRequest as i32),
        )
    );
    assert_eq!(
        hcm.forward_client_cert_details,
        http_connection_manager::ForwardClientCertDetails::Sanitize as i32
    );
    if let Err(e) = envoy_validate("gateway-terminating-normalization", &static_bootstrap(&r)) {
        panic!("envoy rejected the terminating gateway with request normalization:\n{e}");
    }
}

/// A terminating gateway no entry links a service to: its listener exists, matching nothing
/// (so Envoy is ready and the port answers health checks), and its status says why.
#[test]
fn terminating_gateway_with_nothing_linked_serves_a_listener_matching_nothing() {
    use structs::ServiceKind::TerminatingGateway as Kind;
    let ca = Ca::new();
    let part = KindSnapshot::TerminatingGateway(proxycfg::TerminatingGatewaySnapshot {
        mesh_config: Some(None),
        services: Some(Arc::new(vec![])),
        linked: Arc::new(BTreeMap::new()),
    });
    let snap = gateway_snapshot(&ca, Kind, "terminating", part);
    let r = resources::build(&snap).unwrap();
    assert!(
        r.problems["linked-services"].starts_with("no services linked"),
        "{:?}",
        r.problems
    );
    let listener: Listener = unpack(&r.of(LISTENER).unwrap()["default:127.0.0.1:8443"]);
    assert_eq!(listener.filter_chains.len(), 1);
    assert!(listener.filter_chains[0].filter_chain_match.is_none());
    if let Err(e) = envoy_validate("gateway-terminating-empty", &static_bootstrap(&r)) {
        panic!("envoy rejected the empty terminating gateway:\n{e}");
    }
}

/// Instances registered by host name: `LOGICAL_DNS` (the default) takes one and says so;
/// `envoy_dns_discovery_type = STRICT_DNS` takes them all. IPv4 answers only, either way.
#[test]
fn host_name_instances_follow_the_dns_discovery_type() {
    use structs::ServiceKind::TerminatingGateway as Kind;
    let ca = Ca::new();
    let ext = link("terminating", Kind, "ext", 0, "");
    let mut s = proxycfg::LinkedServiceSnapshot::new(ext.clone());
    s.leaf = Some(ca.leaf("ext"));
    s.intentions = Some(Arc::new(vec![]));
    s.config = Some(Arc::new(structs::ResolvedServiceConfig::default()));
    let nodes = ["a.example.com", "b.example.com"]
        .into_iter()
        .map(|host| {
            let mut node = instance("ext", host, 80);
            node.service.kind = structs::ServiceKind::Typical;
            node.service.service = "ext".into();
            node
        })
        .collect();
    s.endpoints = Some(Arc::new(nodes));
    s.resolver = Some(None);
    let linked = Arc::new(BTreeMap::from([("ext".to_owned(), Arc::new(s))]));
    let sni = format!("ext.default.dc1.internal.{}", ca.roots().trust_domain);
    for (setting, kind, hosts) in [
        (None, cluster::DiscoveryType::LogicalDns, 1),
        (Some("strict_dns"), cluster::DiscoveryType::StrictDns, 2),
    ] {
        let part = KindSnapshot::TerminatingGateway(proxycfg::TerminatingGatewaySnapshot {
            mesh_config: Some(None),
            services: Some(Arc::new(vec![ext.clone()])),
            linked: Arc::clone(&linked),
        });
        let mut snap = gateway_snapshot(&ca, Kind, "terminating", part);
        if let Some(setting) = setting {
            let mut service = (*snap.service).clone();
            service.proxy.config.insert(
                "envoy_dns_discovery_type".into(),
                serde_json::Value::String(setting.into()),
            );
            snap.service = Arc::new(service);
        }
        let r = resources::build(&snap).unwrap();
        let c: Cluster = unpack(&r.of(CLUSTER).unwrap()[&sni]);
        assert_eq!(
            c.cluster_discovery_type,
            Some(cluster::ClusterDiscoveryType::Type(kind as i32))
        );
        assert_eq!(c.dns_lookup_family, cluster::DnsLookupFamily::V4Only as i32);
        let endpoints = &c.load_assignment.as_ref().unwrap().endpoints[0].lb_endpoints;
        assert_eq!(endpoints.len(), hosts, "{setting:?}");
        let said = r.problems.get("linked-service:ext:dns");
        assert_eq!(said.is_some(), hosts == 1, "{:?}", r.problems);
        if let Err(e) = envoy_validate(&format!("gateway-dns-{hosts}"), &static_bootstrap(&r)) {
            panic!("envoy rejected the {setting:?} cluster:\n{e}");
        }
    }
}

/// A linked service with a resolver: a cluster and a filter chain per subset (its SNI as
/// callers' sidecars send it), the default subset's instances behind the service's own name.
#[test]
fn terminating_gateway_serves_each_resolver_subset() {
    use structs::ServiceKind::TerminatingGateway as Kind;
    let ca = Ca::new();
    let ext = link("terminating", Kind, "ext", 0, "");
    let mut s = proxycfg::LinkedServiceSnapshot::new(ext.clone());
    s.leaf = Some(ca.leaf("ext"));
    s.intentions = Some(Arc::new(vec![]));
    s.config = Some(Arc::new(structs::ResolvedServiceConfig::default()));
    let nodes = [("10.0.0.1", "v1"), ("10.0.0.2", "v2"), ("10.0.0.3", "v2")]
        .into_iter()
        .map(|(ip, version)| {
            let mut node = instance("ext", ip, 80);
            node.service.kind = structs::ServiceKind::Typical;
            node.service.service = "ext".into();
            node.service.meta.insert("version".into(), version.into());
            node
        })
        .collect();
    s.endpoints = Some(Arc::new(nodes));
    let resolver = structs::ConfigEntry::from_json(serde_json::json!({
        "Kind": "service-resolver", "Name": "ext", "DefaultSubset": "v1",
        "Subsets": {"v1": {"Filter": "Service.Meta.version == v1"}, "v2": {"Filter": "Service.Meta.version == v2"}}
    }))
    .unwrap();
    s.resolver = Some(Some(Arc::new(resolver)));
    let part = KindSnapshot::TerminatingGateway(proxycfg::TerminatingGatewaySnapshot {
        mesh_config: Some(None),
        services: Some(Arc::new(vec![ext])),
        linked: Arc::new(BTreeMap::from([("ext".to_owned(), Arc::new(s))])),
    });
    let snap = gateway_snapshot(&ca, Kind, "terminating", part);
    let r = resources::build(&snap).unwrap();
    let td = ca.roots().trust_domain.clone();
    let sni = |subset: &str| structs::discovery_chain::target_sni(subset, "ext", "default", "dc1", &td);
    let addresses = |name: &str| -> Vec<String> {
        let cla: ClusterLoadAssignment = unpack(&r.of(ENDPOINT).unwrap()[name]);
        cla.endpoints[0]
            .lb_endpoints
            .iter()
            .map(|e| {
                format!("{e:?}")
                    .split("address: \"")
                    .nth(1)
                    .unwrap_or("")
                    .split('"')
                    .next()
                    .unwrap_or("")
                    .to_owned()
            })
            .collect()
    };
    assert_eq!(addresses(&sni("")), ["10.0.0.1"], "the default subset");
    assert_eq!(addresses(&sni("v1")), ["10.0.0.1"]);
    assert_eq!(addresses(&sni("v2")), ["10.0.0.2", "10.0.0.3"]);
    let listener: Listener = unpack(&r.of(LISTENER).unwrap()["default:127.0.0.1:8443"]);
    let names: Vec<Vec<String>> = listener
        .filter_chains
        .iter()
        .map(|c| c.filter_chain_match.clone().unwrap_or_default().server_names)
        .collect();
    assert_eq!(names, [vec![sni("")], vec![sni("v1")], vec![sni("v2")], vec![]]);
    if let Err(e) = envoy_validate("gateway-terminating-subsets", &static_bootstrap(&r)) {
        panic!("envoy rejected the subsets:\n{e}");
    }
}

/// A sidecar's inbound settings (`Config` keys, the proxy's own over proxy-defaults'): the
/// local app's connect timeout and connection limit, the request and idle timeouts of the
/// route or TCP proxy to it, exact connection balancing on the public listener.
#[test]
fn inbound_settings_shape_the_public_listener_and_the_local_app() {
    for (name, protocol) in [("inbound-settings-http", "http"), ("inbound-settings-tcp", "tcp")] {
        let ca = Ca::new();
        let mut snap = snapshot(
            &ca,
            &Scenario {
                protocol,
                upstreams: vec![],
                intentions: vec![],
                instances: vec![],
            },
        );
        let service = Arc::make_mut(&mut snap.service);
        let own = serde_json::json!({"local_request_timeout_ms": 1500, "local_idle_timeout_ms": 30000,
                                     "balance_inbound_connections": "exact_balance"});
        service.proxy.config = own.as_object().unwrap().clone();
        if let KindSnapshot::ConnectProxy(cp) = &mut snap.kind {
            let resolved = Arc::make_mut(cp.resolved_config.as_mut().unwrap());
            let defaults = serde_json::json!({"protocol": protocol, "local_connect_timeout_ms": 250,
                                              "max_inbound_connections": 64, "local_request_timeout_ms": 9});
            resolved.proxy_config = defaults.as_object().unwrap().clone();
        }
        let r = validate_snapshot(name, &snap);
        let text = golden_text(&r, &snap.roots.as_ref().unwrap().trust_domain);
        assert!(
            text.contains("exact_balance") || text.contains("ExactBalance"),
            "{name}: {text}"
        );
    }
}

/// A `proxy-defaults` entry with `AccessLogs` as given.
fn access_logs_entry(access_logs: &str) -> Arc<structs::ConfigEntry> {
    let json = format!(r#"{{"Kind": "proxy-defaults", "Name": "global", "AccessLogs": {access_logs}}}"#);
    Arc::new(serde_json::from_str(&json).unwrap())
}

/// `proxy-defaults`' access logs on a sidecar: a JSON format of the user's on the HTTP
/// connection manager, Envoy's default-like JSON on the TCP proxy, a file or stdout, and the
/// listener-level log of connections no filter chain accepted unless disabled.
#[test]
fn access_logs_on_every_listener_of_a_sidecar() {
    let cases = [
        (
            "access-logs-http",
            "http",
            r#"{"Enabled": true, "Type": "file", "Path": "/tmp/meshd-access.log",
                "JSONFormat": "{\"path\": \"%REQ(:PATH)%\", \"code\": \"%RESPONSE_CODE%\"}"}"#,
        ),
        (
            "access-logs-tcp",
            "tcp",
            r#"{"Enabled": true, "DisableListenerLogs": true, "TextFormat": "%START_TIME% %UPSTREAM_HOST%"}"#,
        ),
    ];
    for (name, protocol, logs) in cases {
        let ca = Ca::new();
        let mut snap = snapshot(
            &ca,
            &Scenario {
                protocol,
                upstreams: vec![("api", 9191, protocol)],
                intentions: vec![],
                instances: vec![instance("api", "10.0.0.1", 21000)],
            },
        );
        snap.proxy_defaults = Some(Some(access_logs_entry(logs)));
        let r = validate_snapshot(name, &snap);
        // The same snapshot encodes the same (no version churn from the format's map).
        for _ in 0..3 {
            assert_eq!(resources::build(&snap).unwrap().of(LISTENER), r.of(LISTENER), "{name}");
        }
        let listeners = r.of(LISTENER).unwrap();
        assert_eq!(listeners.len(), 2, "{name}: public and upstream listeners");
        for (lname, any) in listeners {
            let listener: Listener = unpack(any);
            assert_eq!(
                listener.access_log.len(),
                usize::from(protocol == "http"),
                "{name} {lname}"
            );
            assert_eq!(filter_logs(&listener), 1, "{name} {lname}: its filter logs");
        }
    }
    // Turned off (the default), nothing logs.
    let ca = Ca::new();
    let mut snap = snapshot(
        &ca,
        &Scenario {
            protocol: "http",
            upstreams: vec![],
            intentions: vec![],
            instances: vec![],
        },
    );
    snap.proxy_defaults = Some(Some(access_logs_entry(r#"{"Enabled": false, "Type": "stderr"}"#)));
    let r = resources::build(&snap).unwrap();
    for any in r.of(LISTENER).unwrap().values() {
        let listener: Listener = unpack(any);
        assert!(listener.access_log.is_empty() && filter_logs(&listener) == 0);
    }
}

/// The access logs of a listener's HTTP connection managers and TCP proxies.
fn filter_logs(listener: &Listener) -> usize {
    use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
    let mut n = 0;
    for chain in &listener.filter_chains {
        for f in &chain.filters {
            let Some(filter::ConfigType::TypedConfig(cfg)) = &f.config_type else {
                continue;
            };
            if cfg.type_url == HttpConnectionManager::type_url() {
                n += unpack::<HttpConnectionManager>(cfg).access_log.len();
            } else if cfg.type_url == TcpProxy::type_url() {
                n += unpack::<TcpProxy>(cfg).access_log.len();
            }
        }
    }
    n
}

/// Service-defaults' `RateLimits` on an HTTP sidecar: Envoy's local rate limit filter after
/// the intentions' RBAC with the instance's bucket, and a route per limited path, in order,
/// with its own bucket. On a TCP service they are not enforceable: the proxy's build problems
/// say so.
#[test]
fn rate_limits_on_the_public_listener() {
    let limits: structs::RateLimits = serde_json::from_str(
        r#"{"InstanceLevel": {"RequestsPerSecond": 10, "RequestsMaxBurst": 20, "Routes": [
             {"PathExact": "/exact", "RequestsPerSecond": 1},
             {"PathPrefix": "/api", "RequestsPerSecond": 5, "RequestsMaxBurst": 8},
             {"PathRegex": "/v[0-9]+/.*", "RequestsPerSecond": 3}]}}"#,
    )
    .unwrap();
    for protocol in ["http", "tcp"] {
        let ca = Ca::new();
        let mut snap = snapshot(
            &ca,
            &Scenario {
                protocol,
                upstreams: vec![],
                intentions: vec![("web", IntentionAction::Deny)],
                instances: vec![],
            },
        );
        if let KindSnapshot::ConnectProxy(cp) = &mut snap.kind {
            Arc::make_mut(cp.resolved_config.as_mut().unwrap()).rate_limits = Some(limits.clone());
        }
        if protocol == "tcp" {
            let r = resources::build(&snap).unwrap();
            let problem = &r.problems["rate-limits"];
            assert!(problem.contains("HTTP protocols only"), "{problem}");
            continue;
        }
        let r = validate_snapshot("rate-limits-http", &snap);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        let text = golden_text(&r, &snap.roots.as_ref().unwrap().trust_domain);
        let rbac = text.find("envoy.filters.http.rbac").expect("rbac filter");
        let limit = text
            .find("envoy.filters.http.local_ratelimit")
            .expect("rate limit filter");
        assert!(rbac < limit, "the intentions judge first:\n{text}");
        let (exact, prefix, regex) = (
            text.find("\"/exact\"").expect("exact route"),
            text.find("\"/api\"").expect("prefix route"),
            text.find("/v[0-9]+/.*").expect("regex route"),
        );
        assert!(exact < prefix && prefix < regex, "routes in the entry's order:\n{text}");
    }
}

/// `Expose.Paths`: a plain-HTTP listener per path routing it exactly to a cluster of the
/// application's port (HTTP/2 when asked), a path from a check reachable from loopback and
/// the node's address only; Envoy accepts them.
#[test]
fn exposed_paths_get_plain_http_listeners() {
    let ca = Ca::new();
    let mut snap = snapshot(
        &ca,
        &Scenario {
            protocol: "http",
            upstreams: vec![],
            intentions: vec![],
            instances: vec![],
        },
    );
    let service = Arc::make_mut(&mut snap.service);
    service.address = "10.1.2.3".into();
    service.proxy.expose = serde_json::from_value(serde_json::json!({"Paths": [
        {"Path": "/metrics", "ListenerPort": 21500, "LocalPathPort": 9102},
        {"Path": "/grpc.health.v1.Health/Check", "ListenerPort": 21501, "LocalPathPort": 9090, "Protocol": "http2",
         "ParsedFromCheck": true}]}))
    .unwrap();
    let r = validate_snapshot("expose-paths", &snap);
    let listeners = r.of(LISTENER).unwrap();
    let exposed: Listener = unpack(&listeners["exposed_path_metrics"]);
    assert!(exposed.filter_chains[0].transport_socket.is_none(), "no mTLS");
    assert!(
        exposed.filter_chains[0].filter_chain_match.is_none(),
        "anyone may reach it"
    );
    let check: Listener = unpack(&listeners["exposed_path_grpchealthv1HealthCheck"]);
    let sources: Vec<&str> = check.filter_chains[0]
        .filter_chain_match
        .as_ref()
        .unwrap()
        .source_prefix_ranges
        .iter()
        .map(|c| c.address_prefix.as_str())
        .collect();
    assert_eq!(sources, ["127.0.0.1", "::1", "10.1.2.3"]);
    let clusters = r.of(CLUSTER).unwrap();
    assert!(clusters.contains_key("exposed_cluster_9102") && clusters.contains_key("exposed_cluster_9090"));
}

/// Escape hatches: the user's public listener (with the mesh's mTLS and the intentions' RBAC
/// put in front), local_app cluster, an upstream's listener, and the tracing of every HTTP
/// connection manager; Envoy accepts the result.
#[test]
fn escape_hatches_replace_what_meshd_builds_keeping_mtls_and_intentions() {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    let ca = Ca::new();
    let mut snap = snapshot(
        &ca,
        &Scenario {
            protocol: "http",
            upstreams: vec![("api", 9191, "http")],
            intentions: vec![("db", IntentionAction::Deny)],
            instances: vec![instance("api", "10.0.0.1", 21000)],
        },
    );
    let public = serde_json::json!({
        "@type": "type.googleapis.com/envoy.config.listener.v3.Listener",
        "name": "custom_public",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 21000}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": "custom_public", "cluster": "local_app"}}]}]});
    let local = serde_json::json!({"name": "local_app", "type": "STATIC", "connect_timeout": "0.25s",
        "load_assignment": {"cluster_name": "local_app", "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 8080}}}}]}]}});
    let tracing = serde_json::json!({"random_sampling": {"value": 25}});
    let upstream = serde_json::json!({"name": "custom_upstream",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 9191}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "custom_upstream", "rds": {"route_config_name": "api", "config_source": {"ads": {}, "resource_api_version": "V3"}},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]});
    let service = Arc::make_mut(&mut snap.service);
    for (k, v) in [
        ("envoy_public_listener_json", &public),
        ("envoy_local_cluster_json", &local),
        ("envoy_listener_tracing_json", &tracing),
    ] {
        service
            .proxy
            .config
            .insert(k.into(), serde_json::Value::String(v.to_string()));
    }
    service.proxy.upstreams[0].config.insert(
        "envoy_listener_json".into(),
        serde_json::Value::String(upstream.to_string()),
    );
    // The upstream's cluster (its chain is the default one): EDS over ADS as meshd's, with
    // the user's timeout and circuit breakers, named after the target by meshd.
    let cluster = serde_json::json!({"type": "EDS", "eds_cluster_config": {"eds_config": {"ads": {}, "resource_api_version": "V3"}},
        "connect_timeout": "3.5s", "circuit_breakers": {"thresholds": [{"max_connections": 7}]}});
    service.proxy.upstreams[0].config.insert(
        "envoy_cluster_json".into(),
        serde_json::Value::String(cluster.to_string()),
    );
    let r = validate_snapshot("escape-hatches", &snap);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    let listeners = r.of(LISTENER).unwrap();
    let names: Vec<&String> = listeners.keys().collect();
    assert_eq!(names, ["custom_public", "custom_upstream"]);
    let public: Listener = unpack(&listeners["custom_public"]);
    let chain = &public.filter_chains[0];
    assert!(chain.transport_socket.is_some(), "the mesh's mTLS is put in");
    let filters: Vec<&str> = chain.filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        filters,
        ["envoy.filters.network.rbac", "envoy.filters.network.tcp_proxy"]
    );
    let local: Cluster = unpack(&r.of(CLUSTER).unwrap()["local_app"]);
    assert_eq!(local.connect_timeout.unwrap().nanos, 250_000_000);
    let (name, api) = r
        .of(CLUSTER)
        .unwrap()
        .iter()
        .find(|(n, _)| n.starts_with("api."))
        .expect("api's cluster");
    let api: Cluster = unpack(api);
    assert_eq!(&api.name, name);
    assert_eq!(api.connect_timeout.unwrap().seconds, 3, "envoy_cluster_json");
    assert!(api.transport_socket.is_none(), "the user's cluster as written");
    // An upstream with a routed chain has no single cluster to replace: said so, meshd's
    // clusters stay.
    let mut routed = snap.clone();
    if let KindSnapshot::ConnectProxy(cp) = &mut routed.kind {
        for up in Arc::make_mut(&mut cp.upstreams).values_mut() {
            let up = Arc::make_mut(up);
            let mut chain = (**up.chain.as_ref().unwrap()).clone();
            chain.default = false;
            up.chain = Some(Arc::new(chain));
        }
    }
    let r2 = resources::build(&routed).unwrap();
    let problem = r2
        .problems
        .values()
        .find(|p| p.contains("envoy_cluster_json"))
        .expect("a problem");
    assert!(problem.contains("default one"), "{problem}");
    let api2: Cluster = unpack(
        r2.of(CLUSTER)
            .unwrap()
            .iter()
            .find(|(n, _)| n.starts_with("api."))
            .unwrap()
            .1,
    );
    assert!(api2.transport_socket.is_some(), "meshd's cluster, with the mesh's mTLS");
    let upstream: Listener = unpack(&listeners["custom_upstream"]);
    let Some(filter::ConfigType::TypedConfig(cfg)) = &upstream.filter_chains[0].filters[0].config_type else {
        panic!("{upstream:?}")
    };
    let hcm: HttpConnectionManager = unpack(cfg);
    assert_eq!(
        hcm.tracing.unwrap().random_sampling.unwrap().value,
        25.0,
        "envoy_listener_tracing_json"
    );
    // The same snapshot encodes the same.
    assert_eq!(resources::build(&snap).unwrap().of(LISTENER), r.of(LISTENER));
}

/// `EnvoyExtensions`: Lua before the router of the public listener, a property override on
/// the upstream's cluster; Envoy accepts them. On a TCP service the Lua filter cannot apply:
/// optional, the proxy's build problems say so; required, the whole build is held back.
#[test]
fn envoy_extensions_lua_and_property_override() {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    let extensions = |required: bool| -> Vec<structs::config_entry::EnvoyExtension> {
        serde_json::from_value(serde_json::json!([
            {"Name": "builtin/lua", "Required": required, "Arguments": {"Listener": "inbound",
             "Script": "function envoy_on_response(h) h:headers():add('x-lua', 'yes') end"}},
            {"Name": "builtin/property-override", "Arguments": {"Patches": [{
                "ResourceFilter": {"ResourceType": "cluster", "TrafficDirection": "outbound", "Services": [{"Name": "api"}]},
                "Op": "add", "Path": "/outlier_detection/consecutive_5xx", "Value": 7}]}},
            {"Name": "builtin/ext-authz", "Arguments": {"Config": {
                "GrpcService": {"Target": {"URI": "127.0.0.1:9191", "Timeout": "2s"}}, "StatusOnError": 503}}},
            {"Name": "builtin/otel-access-logging", "Arguments": {"ListenerType": "outbound", "Config": {
                "GrpcService": {"Target": {"URI": "127.0.0.1:4317"}}, "Body": "%REQ(:PATH)%",
                "Attributes": {"code": "%RESPONSE_CODE%"}, "BufferFlushInterval": "1s"}}}
        ]))
        .unwrap()
    };
    let snap_for = |protocol: &'static str, required: bool| {
        let ca = Ca::new();
        let mut snap = snapshot(
            &ca,
            &Scenario {
                protocol,
                upstreams: vec![("api", 9191, protocol)],
                intentions: vec![],
                instances: vec![instance("api", "10.0.0.1", 21000)],
            },
        );
        if let KindSnapshot::ConnectProxy(cp) = &mut snap.kind {
            Arc::make_mut(cp.resolved_config.as_mut().unwrap()).envoy_extensions = extensions(required);
        }
        snap
    };
    let snap = snap_for("http", false);
    let r = validate_snapshot("envoy-extensions", &snap);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    let public: Listener = unpack(&r.of(LISTENER).unwrap()["public_listener:0.0.0.0:21000"]);
    let Some(filter::ConfigType::TypedConfig(cfg)) = &public.filter_chains[0].filters[0].config_type else {
        panic!("{public:?}")
    };
    let hcm: HttpConnectionManager = unpack(cfg);
    let names: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "envoy.filters.http.ext_authz",
            "envoy.filters.http.lua",
            "envoy.filters.http.router"
        ]
    );
    assert!(r.of(CLUSTER).unwrap().contains_key("ext_authz_127.0.0.1_9191"));
    assert!(r.of(CLUSTER).unwrap().contains_key("otel_127.0.0.1_4317"));
    let upstream: Listener = unpack(
        r.of(LISTENER)
            .unwrap()
            .values()
            .find(|l| {
                let l: Listener = unpack(l);
                l.name.starts_with("api:")
            })
            .unwrap(),
    );
    let Some(filter::ConfigType::TypedConfig(cfg)) = &upstream.filter_chains[0].filters[0].config_type else {
        panic!("{upstream:?}")
    };
    let hcm: HttpConnectionManager = unpack(cfg);
    let logs: Vec<&str> = hcm.access_log.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(logs, ["envoy.access_loggers.open_telemetry"], "outbound only");
    let clusters = r.of(CLUSTER).unwrap();
    let (name, api) = clusters.iter().find(|(n, _)| n.starts_with("api.")).unwrap();
    let api: Cluster = unpack(api);
    assert_eq!(
        api.outlier_detection.unwrap().consecutive_5xx.unwrap().value,
        7,
        "{name}"
    );
    let local: Cluster = unpack(&clusters["local_app"]);
    assert!(local.outlier_detection.is_none(), "outbound only");

    let r = resources::build(&snap_for("tcp", false)).unwrap();
    assert!(r.problems.keys().any(|k| k.contains("builtin/lua")), "{:?}", r.problems);
    assert!(
        r.of(LISTENER).is_some_and(|l| !l.is_empty()),
        "optional: the proxy goes on"
    );
    let tcp_public: Listener = unpack(&r.of(LISTENER).unwrap()["public_listener:0.0.0.0:21000"]);
    let filters: Vec<&str> = tcp_public.filter_chains[0]
        .filters
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(
        filters,
        ["envoy.filters.network.ext_authz", "envoy.filters.network.tcp_proxy"],
        "gRPC authorization of TCP connections"
    );
    // Nothing of its direction (no upstreams): nothing to do, even when required.
    let ca = Ca::new();
    let mut lone = snapshot(
        &ca,
        &Scenario {
            protocol: "http",
            upstreams: vec![],
            intentions: vec![],
            instances: vec![],
        },
    );
    if let KindSnapshot::ConnectProxy(cp) = &mut lone.kind {
        Arc::make_mut(cp.resolved_config.as_mut().unwrap()).envoy_extensions =
            serde_json::from_value(serde_json::json!([
            {"Name": "builtin/lua", "Required": true, "Arguments": {"Listener": "outbound", "Script": "x = 1"}}]))
            .unwrap();
    }
    let r = resources::build(&lone).unwrap();
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    let r = resources::build(&snap_for("tcp", true)).unwrap();
    let problem = r.problems.values().next().unwrap();
    assert!(problem.contains("held back"), "{problem}");
    assert!(
        r.of(LISTENER).is_none_or(|l| l.is_empty()),
        "required: nothing new is served"
    );
}

/// `builtin/wasm` (a hand-assembled proxy-wasm module, loaded by Envoy's V8 when validating)
/// and `builtin/ext-authz` with an HTTP authorization service: Envoy accepts both.
#[test]
fn envoy_extensions_wasm_and_http_authorization() {
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    // memory, and proxy-wasm ABI 0.2.1 entry points that accept everything.
    const NOOP_WASM: &[u8] = &[
        0, 97, 115, 109, 1, 0, 0, 0, 1, 27, 5, 96, 0, 0, 96, 1, 127, 1, 127, 96, 2, 127, 127, 0, 96, 2, 127, 127, 1,
        127, 96, 3, 127, 127, 127, 1, 127, 3, 7, 6, 0, 1, 2, 3, 3, 4, 5, 3, 1, 0, 1, 7, 157, 1, 7, 6, 109, 101, 109,
        111, 114, 121, 2, 0, 23, 112, 114, 111, 120, 121, 95, 97, 98, 105, 95, 118, 101, 114, 115, 105, 111, 110, 95,
        48, 95, 50, 95, 49, 0, 0, 24, 112, 114, 111, 120, 121, 95, 111, 110, 95, 109, 101, 109, 111, 114, 121, 95, 97,
        108, 108, 111, 99, 97, 116, 101, 0, 1, 23, 112, 114, 111, 120, 121, 95, 111, 110, 95, 99, 111, 110, 116, 101,
        120, 116, 95, 99, 114, 101, 97, 116, 101, 0, 2, 17, 112, 114, 111, 120, 121, 95, 111, 110, 95, 118, 109, 95,
        115, 116, 97, 114, 116, 0, 3, 18, 112, 114, 111, 120, 121, 95, 111, 110, 95, 99, 111, 110, 102, 105, 103, 117,
        114, 101, 0, 4, 24, 112, 114, 111, 120, 121, 95, 111, 110, 95, 114, 101, 113, 117, 101, 115, 116, 95, 104, 101,
        97, 100, 101, 114, 115, 0, 5, 10, 28, 6, 2, 0, 11, 5, 0, 65, 128, 8, 11, 2, 0, 11, 4, 0, 65, 1, 11, 4, 0, 65,
        1, 11, 4, 0, 65, 0, 11,
    ];
    // A fixed path: the golden holds it.
    let module = std::path::Path::new("/tmp/meshd-validate-noop.wasm");
    atomic_write(module, NOOP_WASM);
    let ca = Ca::new();
    let mut snap = snapshot(
        &ca,
        &Scenario {
            protocol: "http",
            upstreams: vec![],
            intentions: vec![],
            instances: vec![],
        },
    );
    if let KindSnapshot::ConnectProxy(cp) = &mut snap.kind {
        Arc::make_mut(cp.resolved_config.as_mut().unwrap()).envoy_extensions =
            serde_json::from_value(serde_json::json!([
                {"Name": "builtin/wasm", "Required": true, "Arguments": {"PluginConfig": {"Name": "noop",
                 "Configuration": "{}", "VmConfig": {"Code": {"Local": {"Filename": module}}}}}},
                {"Name": "builtin/ext-authz", "Required": true, "Arguments": {"Config": {
                 "HttpService": {"Target": {"URI": "http://127.0.0.1:9292"}, "PathPrefix": "/check"}}}}
            ]))
            .unwrap();
    }
    let r = validate_snapshot("envoy-extensions-wasm-http-authz", &snap);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    let public: Listener = unpack(&r.of(LISTENER).unwrap()["public_listener:0.0.0.0:21000"]);
    let Some(filter::ConfigType::TypedConfig(cfg)) = &public.filter_chains[0].filters[0].config_type else {
        panic!("{public:?}")
    };
    let hcm: HttpConnectionManager = unpack(cfg);
    let names: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "envoy.filters.http.ext_authz",
            "envoy.filters.http.wasm",
            "envoy.filters.http.router"
        ]
    );
}

/// Writes `bytes` at `path` whole (a temporary file renamed into place), so concurrent runs
/// never read half a file.
fn atomic_write(path: &std::path::Path, bytes: &[u8]) {
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn jwt_provider(v: serde_json::Value) -> Arc<structs::ConfigEntry> {
    Arc::new(structs::ConfigEntry::from_json(v).unwrap())
}

/// Intentions' JWT requirements: the JWT filter before the RBAC with the providers they
/// name (inline keys, remote keys through a TLS cluster of their own), the RBAC matching
/// its metadata; a missing provider is a problem in the status; Envoy accepts it all.
#[test]
fn jwt_requirements_on_the_public_listener() {
    use structs::config_entry::{IntentionJwtClaimVerification, IntentionJwtProvider, IntentionJwtRequirement};
    let ca = Ca::new();
    let mut snap = snapshot(
        &ca,
        &Scenario {
            protocol: "http",
            upstreams: vec![],
            intentions: vec![],
            instances: vec![],
        },
    );
    let root_pem = snap.roots.as_ref().unwrap().roots[0].root_cert.clone();
    let require = |names: &[&str]| IntentionJwtRequirement {
        providers: names
            .iter()
            .map(|n| IntentionJwtProvider {
                name: (*n).into(),
                verify_claims: vec![IntentionJwtClaimVerification {
                    path: vec!["perms".into(), "role".into()],
                    value: "admin".into(),
                }],
            })
            .collect(),
    };
    let mut admin = permission(
        IntentionAction::Allow,
        IntentionHttpPermission {
            path_prefix: "/admin".into(),
            ..Default::default()
        },
    );
    admin.jwt = Some(require(&["keys"]));
    let mut api = intention("api", None, vec![admin]);
    api.jwt = Some(require(&["okta", "gone"]));
    let mut web = intention("web", Some(IntentionAction::Allow), vec![]);
    web.jwt = Some(require(&["okta"]));
    let keys = r#"{"keys":[{"kty":"oct","alg":"HS256","kid":"k1","k":"c2VjcmV0LWtleS1mb3ItdGVzdHM"}]}"#;
    use base64::Engine;
    let providers = vec![
        jwt_provider(
            serde_json::json!({"Kind": "jwt-provider", "Name": "okta", "Issuer": "https://okta.example",
            "Audiences": ["web"], "JSONWebKeySet": {"Local": {"JWKS": base64::engine::general_purpose::STANDARD.encode(keys)}},
            "Locations": [{"Header": {"Name": "x-token", "Forward": true}}, {"QueryParam": {"Name": "token"}},
                {"Cookie": {"Name": "session"}}],
            "Forwarding": {"HeaderName": "x-jwt-payload", "PadForwardPayloadHeader": true},
            "ClockSkewSeconds": 10, "CacheConfig": {"Size": 50}}),
        ),
        jwt_provider(
            serde_json::json!({"Kind": "jwt-provider", "Name": "keys", "JSONWebKeySet": {"Remote": {
            "URI": "https://keys.example:8443/jwks.json", "RequestTimeoutMs": 1500, "CacheDuration": "10m",
            "FetchAsynchronously": true, "UseSNI": true,
            "JWKSCluster": {"DiscoveryType": "LOGICAL_DNS", "ConnectTimeout": "2s",
                "TLSCertificates": {"TrustedCA": {"InlineString": root_pem}}},
            "RetryPolicy": {"NumRetries": 3, "RetryPolicyBackOff": {"BaseInterval": "1s", "MaxInterval": "5s"}}}}}),
        ),
        // Not required by any intention: not configured.
        jwt_provider(serde_json::json!({"Kind": "jwt-provider", "Name": "unused",
            "JSONWebKeySet": {"Remote": {"URI": "http://10.0.0.9/keys"}}})),
    ];
    snap = with_intentions(snap, vec![api, web]);
    if let KindSnapshot::ConnectProxy(cp) = &mut snap.kind {
        cp.jwt_providers = Some(Arc::new(providers));
    }
    let r = validate_snapshot("jwt-http", &snap);
    insta::assert_snapshot!("jwt-http-rbac", public_rbac_text(&r));
    let problem = &r.problems["jwt"];
    assert!(problem.contains("\"gone\"") && !problem.contains("okta"), "{problem}");
    assert!(r.of(CLUSTER).unwrap().contains_key("jwks_cluster_keys"));
    assert!(!r.of(CLUSTER).unwrap().contains_key("jwks_cluster_unused"));
    let text = golden_text(&r, &snap.roots.as_ref().unwrap().trust_domain);
    let jwt = text.find("name: \"envoy.filters.http.jwt_authn\"").expect("jwt filter");
    let rbac = text.find("name: \"envoy.filters.http.rbac\"").expect("rbac filter");
    assert!(jwt < rbac, "tokens are verified before the intentions judge:\n{text}");
    // A TCP service cannot check tokens: refused, and said so.
    let mut tcp = snap.clone();
    tcp.service = Arc::new({
        let mut s = (*tcp.service).clone();
        s.proxy.config.insert("protocol".into(), serde_json::json!("tcp"));
        s
    });
    let r = resources::build(&tcp).unwrap();
    assert!(r.problems["jwt"].contains("its protocol is tcp"), "{:?}", r.problems);
    assert!(!r.of(CLUSTER).unwrap().contains_key("jwks_cluster_keys"));
    // No provider exists: no JWT filter (nothing to verify), every requirement refused, and
    // said so.
    let mut none = snap.clone();
    if let KindSnapshot::ConnectProxy(cp) = &mut none.kind {
        cp.jwt_providers = Some(Arc::new(Vec::new()));
    }
    let r = resources::build(&none).unwrap();
    assert!(r.problems["jwt"].contains("\"okta\""), "{:?}", r.problems);
    let text = golden_text(&r, &none.roots.as_ref().unwrap().trust_domain);
    assert!(!text.contains("envoy.filters.http.jwt_authn"), "{text}");
    let rbac = public_rbac_text(&r);
    assert!(
        rbac.contains("jwt_payload_okta"),
        "the RBAC still requires the token:\n{rbac}"
    );
}

/// A connect instance of `service` carrying the service's virtual IP, as the catalog reads
/// it out; `direct` sets its proxy's `TransparentProxy.DialedDirectly`.
pub(crate) fn with_vip(service: &str, addr: &str, vip: &str, direct: bool) -> structs::CheckServiceNode {
    let mut n = instance(service, addr, 21000);
    n.service.proxy.destination_service_name = service.into();
    n.service.proxy.transparent_proxy.dialed_directly = direct;
    n.service.tagged_addresses.insert(
        structs::service::TAGGED_ADDRESS_VIRTUAL_IP.into(),
        structs::service::ServiceAddress {
            address: vip.into(),
            port: 21000,
        },
    );
    n
}

/// A transparent sidecar for `web`: `db` declared (with a bind port), `api` (HTTP) and
/// `cache` implicit (reached by intentions); `cache`'s instance may be dialed directly.
pub(crate) fn transparent_snapshot(ca: &Ca, mesh_destinations_only: bool) -> ConfigSnapshot {
    let mut snap = snapshot(
        ca,
        &Scenario {
            protocol: "tcp",
            upstreams: vec![("db", 9192, "tcp")],
            intentions: vec![],
            instances: vec![with_vip("db", "10.0.0.5", "240.0.0.3", false)],
        },
    );
    let mut service = (*snap.service).clone();
    service.proxy.mode = structs::ProxyMode::Transparent;
    snap.service = Arc::new(service);
    let trust_domain = snap.roots.as_ref().unwrap().trust_domain.clone();
    let KindSnapshot::ConnectProxy(cp) = &mut snap.kind else {
        unreachable!()
    };
    cp.transparent = true;
    cp.intention_upstreams = Some(Arc::new(vec!["api".into(), "cache".into(), "db".into()]));
    if mesh_destinations_only {
        cp.mesh_config = Some(Some(Arc::new(
            serde_json::from_value(serde_json::json!({
                "Kind": "mesh",
                "TransparentProxy": {"MeshDestinationsOnly": true},
            }))
            .unwrap(),
        )));
    }
    let upstreams = Arc::make_mut(&mut cp.upstreams);
    for (name, protocol, nodes) in [
        (
            "api",
            "http",
            vec![
                with_vip("api", "10.0.0.1", "240.0.0.1", false),
                with_vip("api", "10.0.0.2", "240.0.0.1", false),
            ],
        ),
        ("cache", "tcp", vec![with_vip("cache", "10.0.0.7", "240.0.0.2", true)]),
    ] {
        let chain = Arc::new(structs::CompiledDiscoveryChain::default_for(
            name,
            "dc1",
            &trust_domain,
            protocol.parse().unwrap(),
        ));
        let mut up = proxycfg::UpstreamSnapshot::new(proxycfg::UpstreamSnapshot::IMPLICIT);
        for target in chain.targets.keys() {
            up.endpoints.insert(target.clone(), Arc::new(nodes.clone()));
        }
        up.chain = Some(chain);
        upstreams.insert(Arc::new(proxycfg::handler::implicit_id(name)), Arc::new(up));
    }
    snap
}

/// The outbound listener of a transparent proxy: `original_dst`, one chain per virtual IP
/// (the declared upstream's too), the directly dialed instance to its passthrough cluster,
/// and everything else to the original destination. Implicit upstreams get no listener of
/// their own.
#[test]
fn transparent_outbound_listener() {
    let ca = Ca::new();
    let r = validate_snapshot("transparent", &transparent_snapshot(&ca, false));
    let listeners = r.of(LISTENER).unwrap();
    let names: Vec<&String> = listeners.keys().collect();
    assert!(
        names.iter().all(|n| !n.starts_with("api") && !n.starts_with("cache")),
        "{names:?}"
    );
    let outbound: Listener = unpack(&listeners["outbound_listener:127.0.0.1:15001"]);
    assert_eq!(outbound.listener_filters[0].name, "envoy.filters.listener.original_dst");
    let matched: Vec<String> = outbound
        .filter_chains
        .iter()
        .flat_map(|c| c.filter_chain_match.as_ref().unwrap().prefix_ranges.iter())
        .map(|p| p.address_prefix.clone())
        .collect();
    assert_eq!(matched, ["240.0.0.1", "240.0.0.2", "10.0.0.7", "240.0.0.3"]);
    assert!(outbound.default_filter_chain.is_some());
    let clusters = r.of(CLUSTER).unwrap();
    assert!(clusters.contains_key("original-destination"));
    assert!(
        clusters
            .keys()
            .any(|c| c.starts_with("passthrough~cache.default.dc1.internal."))
    );
    assert!(r.of(ROUTE).unwrap().contains_key("api"));
    assert!(r.problems.is_empty(), "{:?}", r.problems);
}

/// `MeshDestinationsOnly`: no default chain, no passthrough cluster; an address in the
/// mesh still selects its upstream.
#[test]
fn transparent_mesh_destinations_only() {
    let ca = Ca::new();
    let r = validate_snapshot("transparent-mesh-only", &transparent_snapshot(&ca, true));
    let outbound: Listener = unpack(&r.of(LISTENER).unwrap()["outbound_listener:127.0.0.1:15001"]);
    assert!(outbound.default_filter_chain.is_none());
    assert_eq!(outbound.filter_chains.len(), 4);
    assert!(!r.of(CLUSTER).unwrap().contains_key("original-destination"));
}

/// A mesh gateway: a cluster per service with connect instances and per subset of its
/// resolver, each named by its SNI in the mesh, with no TLS of its own (the connection
/// passes through); one listener reading the SNI and proxying to the cluster of that name.
/// It holds no certificate.
#[test]
fn mesh_gateway_routes_by_sni_to_each_service_and_subset() {
    use structs::ServiceKind::MeshGateway as Kind;
    let ca = Ca::new();
    let sidecars = |service: &str, at: &[(&str, &str)]| {
        let nodes = at
            .iter()
            .map(|(ip, version)| {
                let mut node = instance(service, ip, 21000);
                node.service.meta.insert("version".into(), (*version).into());
                node
            })
            .collect();
        Arc::new(nodes)
    };
    let resolver = structs::ConfigEntry::from_json(serde_json::json!({
        "Kind": "service-resolver", "Name": "api", "DefaultSubset": "v1", "ConnectTimeout": "2s",
        "Subsets": {"v1": {"Filter": "Service.Meta.version == v1"}, "v2": {"Filter": "Service.Meta.version == v2"}}
    }))
    .unwrap();
    let part = KindSnapshot::MeshGateway(proxycfg::MeshGatewaySnapshot {
        mesh_config: Some(None),
        services: Some(Arc::new(vec!["api".into(), "db".into(), "web".into()])),
        resolvers: Some(Arc::new(vec![Arc::new(resolver)])),
        groups: Arc::new(BTreeMap::from([
            (
                "api".to_owned(),
                sidecars("api", &[("10.0.0.1", "v1"), ("10.0.0.2", "v2"), ("10.0.0.3", "v2")]),
            ),
            ("web".to_owned(), sidecars("web", &[("10.0.1.1", "")])),
        ])),
        // api is exported to the peer cluster-b: its peered SNI goes to its instances too.
        exports: Arc::new(vec![Arc::new(
            structs::ConfigEntry::from_json(serde_json::json!({"Kind": "exported-services", "Name": "default",
                "Services": [{"Name": "api", "Consumers": [{"Peer": "cluster-b"}]}]}))
            .unwrap(),
        )]),
        peering_servers: None,
        remote: Some(Arc::new(BTreeMap::from([("dc2".to_owned(), {
            let mut gw = instance("mesh-gateway", "10.2.0.1", 8443);
            gw.service.kind = Kind;
            let wan = structs::service::ServiceAddress {
                address: "198.51.100.2".into(),
                port: 443,
            };
            gw.service.tagged_addresses.insert("wan".into(), wan);
            Arc::new(vec![gw])
        })]))),
    });
    let snap = gateway_snapshot(&ca, Kind, "mesh-gateway", part);
    let r = validate_snapshot("gateway-mesh", &snap);
    let td = &ca.roots().trust_domain;
    let names = |t: &str| {
        r.of(t)
            .map(|m| m.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let mut expected: Vec<String> = ["api", "v1.api", "v2.api", "web"]
        .iter()
        .map(|n| format!("{n}.default.dc1.internal.{td}"))
        .collect();
    let dc2 = format!("dc2.internal.{td}");
    expected.push(dc2.clone());
    // api is exported to cluster-b: its peered name too, to every instance.
    let peered = format!("api.default.default.cluster-b.external.{td}");
    expected.push(peered.clone());
    expected.sort();
    assert_eq!(names(CLUSTER), expected, "db has no connect instance: no cluster");
    assert_eq!(names(ENDPOINT), expected);
    let cla: ClusterLoadAssignment = unpack(&r.of(ENDPOINT).unwrap()[&peered]);
    assert_eq!(cla.endpoints.iter().map(|e| e.lb_endpoints.len()).sum::<usize>(), 3);
    expected.retain(|n| *n != dc2 && *n != peered);
    // dc2's names go to its gateway, at the address it gives for other datacenters.
    let cla: ClusterLoadAssignment = unpack(&r.of(ENDPOINT).unwrap()[&dc2]);
    let at = format!("{:?}", cla.endpoints[0].lb_endpoints[0]);
    assert!(at.contains("198.51.100.2") && at.contains("443"), "{at}");
    assert!(names(SECRET).is_empty(), "a mesh gateway terminates nothing");
    let hosts = |name: &str| {
        let cla: ClusterLoadAssignment = unpack(&r.of(ENDPOINT).unwrap()[&format!("{name}.default.dc1.internal.{td}")]);
        cla.endpoints.iter().map(|e| e.lb_endpoints.len()).sum::<usize>()
    };
    assert_eq!(
        (hosts("api"), hosts("v1.api"), hosts("v2.api"), hosts("web")),
        (1, 1, 2, 1),
        "the service's own name is its default subset's"
    );
    let api: Cluster = unpack(&r.of(CLUSTER).unwrap()[&expected[0]]);
    assert!(api.transport_socket.is_none(), "the connection's TLS passes through");
    assert_eq!(
        api.connect_timeout.map(|d| d.seconds),
        Some(2),
        "the resolver's timeout"
    );
    let listener: Listener = unpack(&r.of(LISTENER).unwrap()["default:127.0.0.1:8443"]);
    let names_of = |chain: &envoy_types::pb::envoy::config::listener::v3::FilterChain| {
        chain.filters.iter().map(|f| f.name.clone()).collect::<Vec<_>>()
    };
    let remote = &listener.filter_chains[0];
    assert_eq!(
        remote.filter_chain_match.as_ref().unwrap().server_names,
        [format!("*.{dc2}")]
    );
    assert_eq!(names_of(remote), ["envoy.filters.network.tcp_proxy"]);
    assert_eq!(
        names_of(&listener.filter_chains[1]),
        ["envoy.filters.network.sni_cluster", "envoy.filters.network.tcp_proxy"]
    );
    assert_eq!(
        listener.listener_filters[0].name,
        "envoy.filters.listener.tls_inspector"
    );
}

/// `Peering.PeerThroughMeshGateways`: the gateway routes this cluster's servers' peering
/// name to its servers and each dialed peer's server name to the addresses the peer gave
/// (passing the TLS through, as for services); an address it cannot route is in its
/// status. Without the setting, neither name is routed. A service a peer exports here is
/// routed to the peer's gateways either way.
#[test]
fn mesh_gateway_routes_the_peering_calls_when_they_cross_it() {
    use structs::ServiceKind::MeshGateway as Kind;
    let ca = Ca::new();
    let td = ca.roots().trust_domain.clone();
    let servers = structs::peering::PeeringServers {
        local: vec!["10.0.0.9:8503".into(), "10.0.0.10:8503".into()],
        dialed: vec![structs::peering::DialedServers {
            peer: "cluster-a".into(),
            // dc2: its name sorts after this cluster's own whatever the random trust domain.
            server_name: "server.dc2.peering.aaaa.consul".into(),
            addresses: vec!["198.51.100.7:443".into(), "gw.example:443".into()],
        }],
        imported: vec![structs::peering::ImportedRoute {
            peer: "cluster-a".into(),
            sni: "api.default.default.cluster-b.external.aaaa.consul".into(),
            gateways: vec!["198.51.100.8:443".into()],
        }],
    };
    let part = |through: bool| {
        let mesh = structs::ConfigEntry::from_json(serde_json::json!({
            "Kind": "mesh", "Peering": {"PeerThroughMeshGateways": through}}))
        .unwrap();
        KindSnapshot::MeshGateway(proxycfg::MeshGatewaySnapshot {
            mesh_config: Some(Some(Arc::new(mesh))),
            services: Some(Arc::new(Vec::new())),
            resolvers: Some(Arc::new(Vec::new())),
            peering_servers: Some(Arc::new(servers.clone())),
            ..Default::default()
        })
    };
    let r = validate_snapshot(
        "gateway-mesh-peering",
        &gateway_snapshot(&ca, Kind, "mesh-gateway", part(true)),
    );
    let local = format!("server.dc1.peering.{td}");
    let hosts = |name: &str| {
        let cla: ClusterLoadAssignment = unpack(&r.of(ENDPOINT).unwrap()[name]);
        cla.endpoints
            .iter()
            .flat_map(|e| &e.lb_endpoints)
            .map(|e| format!("{e:?}"))
            .collect::<Vec<_>>()
    };
    let at_local = hosts(&local);
    assert_eq!(at_local.len(), 2, "{at_local:?}");
    assert!(
        at_local[0].contains("10.0.0.9") && at_local[0].contains("8503"),
        "{at_local:?}"
    );
    let at_peer = hosts("server.dc2.peering.aaaa.consul");
    assert_eq!(at_peer.len(), 1, "the hostname is not routed: {at_peer:?}");
    assert!(at_peer[0].contains("198.51.100.7"), "{at_peer:?}");
    let peer_cluster: Cluster = unpack(&r.of(CLUSTER).unwrap()["server.dc2.peering.aaaa.consul"]);
    assert!(
        peer_cluster.transport_socket.is_none(),
        "the servers' TLS passes through"
    );
    assert!(
        r.problems
            .values()
            .any(|p| p.contains("\"gw.example:443\"") && p.contains("not IP:port")),
        "{:?}",
        r.problems
    );
    let off = validate_snapshot(
        "gateway-mesh-no-peering",
        &gateway_snapshot(&ca, Kind, "mesh-gateway", part(false)),
    );
    assert!(!off.of(CLUSTER).is_some_and(|c| c.contains_key(&local)));
    assert!(off.problems.is_empty(), "{:?}", off.problems);
    // Either way, a service a peer exports here goes (by its SNI) to the peer's gateways:
    // where this cluster's sidecars in mesh gateway mode local send it.
    let imported = "api.default.default.cluster-b.external.aaaa.consul";
    for r in [&r, &off] {
        let cla: ClusterLoadAssignment = unpack(&r.of(ENDPOINT).unwrap()[imported]);
        assert!(format!("{cla:?}").contains("198.51.100.8"), "{cla:?}");
    }
}

/// While a P-384 root is in the bundle, every mesh TLS context offers P-384 besides Envoy's
/// default curves: in TLS 1.2 a peer's P-384 certificate is refused unless the other side
/// offers that curve (found by two sidecars failing every handshake after a rotation to 384
/// bits). With P-256 roots only, Envoy's defaults stay.
#[test]
fn a_p384_root_makes_every_mesh_context_offer_p384() {
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
    let ca = Ca::new();
    let scenario = Scenario {
        protocol: "tcp",
        upstreams: vec![("api", 9191, "tcp")],
        intentions: vec![],
        instances: vec![instance("api", "10.0.0.1", 21000)],
    };
    let curves = |snap: &ConfigSnapshot| {
        let r = resources::build(snap).unwrap();
        let cluster: Cluster =
            unpack(&r.of(CLUSTER).unwrap()[&format!("api.default.dc1.internal.{}", ca.roots().trust_domain)]);
        let Some(transport_socket::ConfigType::TypedConfig(cfg)) = cluster.transport_socket.unwrap().config_type else {
            panic!("no TLS");
        };
        let tls: UpstreamTlsContext = unpack(&cfg);
        (tls.common_tls_context.unwrap().tls_params.map(|p| p.ecdh_curves), r)
    };
    let plain = snapshot(&ca, &scenario);
    assert_eq!(curves(&plain).0, None, "Envoy's defaults");
    let mut p384 = plain.clone();
    let mut roots = (**p384.roots.as_ref().unwrap()).clone();
    roots.roots[0].private_key_bits = 384;
    p384.roots = Some(Arc::new(roots));
    let (offered, r) = curves(&p384);
    assert_eq!(offered.unwrap(), ["X25519", "P-256", "P-384"]);
    let public: Listener = unpack(
        r.of(LISTENER)
            .unwrap()
            .iter()
            .find(|(n, _)| n.starts_with("public_listener"))
            .unwrap()
            .1,
    );
    let Some(transport_socket::ConfigType::TypedConfig(cfg)) =
        public.filter_chains[0].transport_socket.clone().unwrap().config_type
    else {
        panic!("no TLS on the public listener");
    };
    let downstream: DownstreamTlsContext = unpack(&cfg);
    let offered = downstream.common_tls_context.unwrap().tls_params.unwrap().ecdh_curves;
    assert!(
        offered.iter().any(|c| c == "P-384"),
        "the public listener offers it too"
    );
    if let Err(e) = envoy_validate("p384-curves", &static_bootstrap(&r)) {
        panic!("envoy rejected the P-384 curves:\n{e}");
    }
}
