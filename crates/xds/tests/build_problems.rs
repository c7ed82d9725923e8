//! No silent drops: an upstream whose resources cannot be built keeps its last good listener
//! and route, and the build says why.
#![allow(clippy::unwrap_used)]

use crate::common::*;
use proxycfg::{ConfigSnapshot, KindSnapshot};
use std::sync::Arc;
use xds::resources::{LISTENER, ROUTE};
use xds::versioned::VersionedResources;

/// `snap` with the chain of upstream `api` made inconsistent (its start node missing).
fn broken(mut snap: ConfigSnapshot) -> ConfigSnapshot {
    let KindSnapshot::ConnectProxy(cp) = &mut snap.kind else {
        unreachable!("a sidecar snapshot")
    };
    for (id, up) in Arc::make_mut(&mut cp.upstreams).iter_mut() {
        if id.name == "api" {
            let up = Arc::make_mut(up);
            let mut chain = (**up.chain.as_ref().unwrap()).clone();
            chain.start_node = "router:missing".into();
            // Its targets change too: the new chain names other clusters.
            for t in chain.targets.values_mut() {
                t.sni = format!("v9.{}", t.sni);
            }
            up.chain = Some(Arc::new(chain));
        }
    }
    snap
}

#[test]
fn an_upstream_that_cannot_be_built_keeps_its_last_good_resources_and_says_why() {
    let ca = Ca::new();
    let scenario = Scenario {
        protocol: "http",
        upstreams: vec![("api", 9191, "http"), ("db", 9192, "tcp")],
        intentions: vec![],
        instances: vec![instance("api", "10.0.0.1", 21000)],
    };
    let good = Arc::new(snapshot(&ca, &scenario));
    let first = VersionedResources::build_after(&good, None, None).unwrap();
    assert!(first.problems.is_empty());
    let listener = "api:127.0.0.1:9191";
    assert!(first.get(LISTENER, listener).is_some());
    assert!(first.get(ROUTE, "api").is_some());

    let bad = Arc::new(broken(snapshot(&ca, &scenario)));
    let second = VersionedResources::build_after(&bad, None, Some(&first)).unwrap();
    let problem = second.problems.get("api").expect("the failure is reported");
    assert!(problem.contains("router:missing"), "{problem}");
    // The last good listener and route stay, byte for byte; the other upstream is unaffected.
    assert_eq!(
        second.get(LISTENER, listener).unwrap().version,
        first.get(LISTENER, listener).unwrap().version
    );
    assert_eq!(
        second.get(ROUTE, "api").unwrap().version,
        first.get(ROUTE, "api").unwrap().version
    );
    assert!(second.get(LISTENER, "db:127.0.0.1:9192").is_some());
    // The clusters the kept route sends to stay as well.
    let api_cluster = first
        .of(xds::resources::CLUSTER)
        .map(|(n, _)| n)
        .find(|n| n.starts_with("api."))
        .unwrap();
    assert!(
        second.get(xds::resources::CLUSTER, api_cluster).is_some(),
        "{api_cluster} kept"
    );

    // Without a last good build there is nothing to keep: the listener is absent, and said so.
    let alone = VersionedResources::build_after(&bad, None, None).unwrap();
    assert!(alone.get(LISTENER, listener).is_none());
    assert!(alone.problems.contains_key("api"));

    // Fixed again: built afresh, no problem left.
    let third = VersionedResources::build_after(&good, None, Some(&second)).unwrap();
    assert!(third.problems.is_empty());
    assert!(third.get(LISTENER, listener).is_some());
}

/// `snap` with upstream `name`'s chain replaced by an equal-content copy with another
/// connect timeout (a new `Arc`: the chain changed).
fn with_new_chain(mut snap: ConfigSnapshot, name: &str, timeout_ms: u32) -> ConfigSnapshot {
    let KindSnapshot::ConnectProxy(cp) = &mut snap.kind else {
        unreachable!("a sidecar snapshot")
    };
    for (id, up) in Arc::make_mut(&mut cp.upstreams).iter_mut() {
        if id.name == name {
            let up = Arc::make_mut(up);
            let mut chain = (**up.chain.as_ref().unwrap()).clone();
            for t in chain.targets.values_mut() {
                t.connect_timeout_ms = timeout_ms;
            }
            up.chain = Some(Arc::new(chain));
        }
    }
    snap
}

#[test]
fn a_changed_chain_rebuilds_its_upstream_only_and_equals_a_full_build() {
    let ca = Ca::new();
    let scenario = Scenario {
        protocol: "http",
        upstreams: vec![("api", 9191, "http"), ("db", 9192, "tcp"), ("cache", 9193, "http")],
        intentions: vec![],
        instances: vec![instance("api", "10.0.0.1", 21000)],
    };
    let first = Arc::new(snapshot(&ca, &scenario));
    let before = VersionedResources::build_after(&first, None, None).unwrap();
    let second = Arc::new(with_new_chain((*first).clone(), "db", 1234));
    let incremental = VersionedResources::build_after(&second, None, Some(&before)).unwrap();
    let full = VersionedResources::build(&second, None).unwrap();
    for type_url in xds::resources::TYPES {
        let a: Vec<(&str, &String)> = incremental.of(type_url).map(|(n, v)| (n, &v.version)).collect();
        let b: Vec<(&str, &String)> = full.of(type_url).map(|(n, v)| (n, &v.version)).collect();
        assert_eq!(a, b, "{type_url}");
    }
    // Only db's cluster changed; the others are the previous build's very resources.
    let cluster = xds::resources::CLUSTER;
    let changed: Vec<&str> = incremental
        .of(cluster)
        .filter(|(n, v)| !Arc::ptr_eq(v, before.get(cluster, n).unwrap()))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert!(changed[0].starts_with("db."), "{changed:?}");
    // So are the other upstreams' load assignments: taken, not built again.
    let endpoint = xds::resources::ENDPOINT;
    let built: Vec<&str> = incremental
        .of(endpoint)
        .filter(|(n, v)| before.get(endpoint, n).is_none_or(|b| !Arc::ptr_eq(v, b)))
        .map(|(n, _)| n)
        .collect();
    assert!(built.iter().all(|n| n.starts_with("db.")), "{built:?}");
    assert!(incremental.of(endpoint).count() > built.len());
    // Secrets were not touched: the very same map.
    assert!(Arc::ptr_eq(
        incremental.map(xds::resources::SECRET).unwrap(),
        before.map(xds::resources::SECRET).unwrap()
    ));
    // An upstream removed takes its resources with it.
    let mut third = (*second).clone();
    let KindSnapshot::ConnectProxy(cp) = &mut third.kind else {
        unreachable!("a sidecar snapshot")
    };
    Arc::make_mut(&mut cp.upstreams).retain(|id, _| id.name != "cache");
    let third = Arc::new(third);
    let after_removal = VersionedResources::build_after(&third, None, Some(&incremental)).unwrap();
    assert!(after_removal.get(LISTENER, "cache:127.0.0.1:9193").is_none());
    assert!(after_removal.get(ROUTE, "cache").is_none());
    let full = VersionedResources::build(&third, None).unwrap();
    for type_url in xds::resources::TYPES {
        assert_eq!(
            after_removal.of(type_url).map(|(n, _)| n).collect::<Vec<_>>(),
            full.of(type_url).map(|(n, _)| n).collect::<Vec<_>>(),
            "{type_url}"
        );
    }
}

#[test]
fn incremental_builds_keep_routes_and_aggregate_clusters_of_unchanged_l7_upstreams() {
    let ca = Ca::new();
    let scenario = Scenario {
        protocol: "http",
        upstreams: vec![("api", 9191, "http"), ("db", 9192, "tcp")],
        intentions: vec![],
        instances: vec![instance("api", "10.0.0.1", 21000)],
    };
    let mut snap = snapshot(&ca, &scenario);
    let trust_domain = snap.roots.as_ref().unwrap().trust_domain.clone();
    let entries: Vec<Arc<structs::ConfigEntry>> = [
        serde_json::json!({"Kind": "service-resolver", "Name": "api", "DefaultSubset": "v1",
            "Subsets": {"v1": {"Filter": "Service.Meta.version == v1"}, "v2": {"Filter": "Service.Meta.version == v2"}},
            "Failover": {"v1": {"ServiceSubset": "v2"}}}),
    ]
    .into_iter()
    .map(|v| Arc::new(structs::ConfigEntry::from_json(v).unwrap()))
    .collect();
    let chain = discovery_chain::compile(
        &discovery_chain::CompileRequest {
            service: "api",
            datacenter: "dc1",
            trust_domain: &trust_domain,
            override_protocol: Some(structs::Protocol::Http),
            override_connect_timeout: None,
        },
        &discovery_chain::Entries {
            resolvers: &entries,
            ..Default::default()
        },
    )
    .unwrap();
    let KindSnapshot::ConnectProxy(cp) = &mut snap.kind else {
        unreachable!("a sidecar snapshot")
    };
    for (id, up) in Arc::make_mut(&mut cp.upstreams).iter_mut() {
        if id.name == "api" {
            let up = Arc::make_mut(up);
            for t in chain.targets.keys() {
                up.endpoints
                    .insert(t.clone(), Arc::new(vec![instance("api", "10.0.0.1", 21000)]));
            }
            up.chain = Some(Arc::new(chain.clone()));
        }
    }
    let first = Arc::new(snap);
    let before = VersionedResources::build_after(&first, None, None).unwrap();
    assert!(
        before
            .of(xds::resources::CLUSTER)
            .any(|(n, _)| n.starts_with("failover~v1.api."))
    );
    let second = Arc::new(with_new_chain((*first).clone(), "db", 777));
    let incremental = VersionedResources::build_after(&second, None, Some(&before)).unwrap();
    let full = VersionedResources::build(&second, None).unwrap();
    for type_url in xds::resources::TYPES {
        let a: Vec<(&str, &String)> = incremental.of(type_url).map(|(n, v)| (n, &v.version)).collect();
        let b: Vec<(&str, &String)> = full.of(type_url).map(|(n, v)| (n, &v.version)).collect();
        assert_eq!(a, b, "{type_url}");
    }
}

/// The proxy-wide resources an incremental build takes from the last one include every one
/// a full build makes: exposed paths' listeners and clusters, JWKS clusters.
#[test]
fn incremental_builds_keep_every_proxy_wide_resource() {
    let ca = Ca::new();
    let scenario = Scenario {
        protocol: "http",
        upstreams: vec![("api", 9191, "http"), ("db", 9192, "tcp")],
        intentions: vec![],
        instances: vec![instance("api", "10.0.0.1", 21000)],
    };
    let mut first = snapshot(&ca, &scenario);
    let mut service = (*first.service).clone();
    service.proxy.expose.paths = vec![structs::ExposePath {
        path: "/healthz".into(),
        local_path_port: 8080,
        listener_port: 21500,
        protocol: "http".into(),
        ..Default::default()
    }];
    first.service = Arc::new(service);
    let KindSnapshot::ConnectProxy(cp) = &mut first.kind else {
        unreachable!("a sidecar snapshot")
    };
    let mut web = structs::Intention {
        source_ns: "default".into(),
        source_name: "web".into(),
        destination_ns: "default".into(),
        destination_name: "web".into(),
        action: Some(structs::config_entry::IntentionAction::Allow),
        ..Default::default()
    };
    web.jwt = Some(structs::config_entry::IntentionJwtRequirement {
        providers: vec![structs::config_entry::IntentionJwtProvider {
            name: "keys".into(),
            verify_claims: vec![],
        }],
    });
    cp.intentions = Some(Arc::new(vec![web]));
    cp.jwt_providers = Some(Arc::new(vec![Arc::new(
        structs::ConfigEntry::from_json(serde_json::json!({"Kind": "jwt-provider", "Name": "keys",
            "JSONWebKeySet": {"Remote": {"URI": "http://10.0.0.7:8080/jwks"}}}))
        .unwrap(),
    )]));
    let first = Arc::new(first);
    let before = VersionedResources::build_after(&first, None, None).unwrap();
    assert!(before.get(xds::resources::CLUSTER, "jwks_cluster_keys").is_some());
    assert!(before.get(LISTENER, "exposed_path_healthz").is_some());
    let second = Arc::new(with_new_chain((*first).clone(), "db", 1234));
    let incremental = VersionedResources::build_after(&second, None, Some(&before)).unwrap();
    let full = VersionedResources::build(&second, None).unwrap();
    for type_url in xds::resources::TYPES {
        let a: Vec<(&str, &String)> = incremental.of(type_url).map(|(n, v)| (n, &v.version)).collect();
        let b: Vec<(&str, &String)> = full.of(type_url).map(|(n, v)| (n, &v.version)).collect();
        assert_eq!(a, b, "{type_url}");
    }
}

/// `snap` with `upstream`'s endpoints replaced by `nodes` (on every target).
fn with_endpoints(mut snap: ConfigSnapshot, upstream: &str, nodes: Vec<structs::CheckServiceNode>) -> ConfigSnapshot {
    let KindSnapshot::ConnectProxy(cp) = &mut snap.kind else {
        unreachable!("a sidecar snapshot")
    };
    for (id, up) in Arc::make_mut(&mut cp.upstreams).iter_mut() {
        if id.name == upstream {
            let up = Arc::make_mut(up);
            let targets: Vec<_> = up.endpoints.keys().cloned().collect();
            for t in targets {
                up.endpoints.insert(t, Arc::new(nodes.clone()));
            }
        }
    }
    snap
}

/// A transparent proxy's builds after a change equal full builds: an endpoint change that
/// keeps the addresses the outbound listener matches builds only load assignments (the
/// listener kept); one that brings a new address (an instance dialed directly) rebuilds the
/// outbound listener; a new implicit upstream adds its chain to it.
#[test]
fn transparent_incremental_builds_equal_full_builds() {
    use crate::validate::{transparent_snapshot, with_vip};
    let ca = Ca::new();
    let first = Arc::new(transparent_snapshot(&ca, false));
    let before = VersionedResources::build_after(&first, None, None).unwrap();
    let outbound = "outbound_listener:127.0.0.1:15001";
    let same_vip = Arc::new(with_endpoints(
        (*first).clone(),
        "api",
        vec![with_vip("api", "10.0.0.9", "240.0.0.1", false)],
    ));
    let direct = Arc::new(with_endpoints(
        (*first).clone(),
        "api",
        vec![with_vip("api", "10.0.0.9", "240.0.0.1", true)],
    ));
    let mut added = (*first).clone();
    let KindSnapshot::ConnectProxy(cp) = &mut added.kind else {
        unreachable!("a sidecar snapshot")
    };
    let chain = Arc::new(structs::CompiledDiscoveryChain::default_for(
        "search",
        "dc1",
        &first.roots.as_ref().unwrap().trust_domain,
        structs::Protocol::Tcp,
    ));
    let mut up = proxycfg::UpstreamSnapshot::new(proxycfg::UpstreamSnapshot::IMPLICIT);
    for t in chain.targets.keys() {
        up.endpoints.insert(
            t.clone(),
            Arc::new(vec![with_vip("search", "10.0.0.8", "240.0.0.4", false)]),
        );
    }
    up.chain = Some(chain);
    Arc::make_mut(&mut cp.upstreams).insert(Arc::new(proxycfg::handler::implicit_id("search")), Arc::new(up));
    let added = Arc::new(added);
    // The same upstream known by its chain only (no endpoints yet): it selects nothing.
    let mut chain_only = (*added).clone();
    let KindSnapshot::ConnectProxy(cp) = &mut chain_only.kind else {
        unreachable!("a sidecar snapshot")
    };
    for (id, up) in Arc::make_mut(&mut cp.upstreams).iter_mut() {
        if id.name == "search" {
            Arc::make_mut(up).endpoints = Default::default();
        }
    }
    let chain_only = Arc::new(chain_only);
    for (next, listener_kept) in [
        (&same_vip, true),
        (&direct, false),
        (&added, false),
        (&chain_only, true),
    ] {
        let incremental = VersionedResources::build_after(next, None, Some(&before)).unwrap();
        let full = VersionedResources::build(next, None).unwrap();
        for type_url in xds::resources::TYPES {
            let a: Vec<(&str, &String)> = incremental.of(type_url).map(|(n, v)| (n, &v.version)).collect();
            let b: Vec<(&str, &String)> = full.of(type_url).map(|(n, v)| (n, &v.version)).collect();
            assert_eq!(a, b, "{type_url}");
        }
        assert_eq!(
            Arc::ptr_eq(
                incremental.get(LISTENER, outbound).unwrap(),
                before.get(LISTENER, outbound).unwrap()
            ),
            listener_kept
        );
    }
}
