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

mod chains;
mod common;

use common::*;
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
    for c in &mut ctx.tls_certificate_sds_secret_configs {
        c.sds_config = None;
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
    for any in r.of(CLUSTER).unwrap().values() {
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
    for chain in &l.filter_chains {
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
                format!("{:#?}", unpack::<HttpConnectionManager>(cfg))
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
    let KindSnapshot::ConnectProxy(cp) = &mut snap.kind;
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
