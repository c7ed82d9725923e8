//! Encode once: proxies watching the same endpoints share one encoded load assignment.
#![allow(clippy::unwrap_used)]

use crate::common::*;
use proxycfg::{ConfigSnapshot, KindSnapshot};
use std::sync::Arc;
use structs::CheckServiceNode;
use xds::resources::{ENDPOINT, SharedEncodings};
use xds::versioned::VersionedResources;

fn with_endpoints(mut snap: ConfigSnapshot, nodes: &Arc<Vec<CheckServiceNode>>) -> ConfigSnapshot {
    let KindSnapshot::ConnectProxy(cp) = &mut snap.kind else {
        unreachable!("a sidecar snapshot")
    };
    for up in Arc::make_mut(&mut cp.upstreams).values_mut() {
        let up = Arc::make_mut(up);
        let targets: Vec<_> = up.endpoints.keys().cloned().collect();
        for t in targets {
            up.endpoints.insert(t, Arc::clone(nodes));
        }
    }
    snap
}

#[test]
fn one_encoding_for_every_proxy_of_the_same_endpoints() {
    let ca = Ca::new();
    let scenario = Scenario {
        protocol: "tcp",
        upstreams: vec![("api", 9191, "tcp")],
        intentions: vec![],
        instances: vec![],
    };
    let nodes = Arc::new(vec![instance("api", "10.0.0.1", 21000)]);
    let a = with_endpoints(snapshot(&ca, &scenario), &nodes);
    let b = with_endpoints(snapshot(&ca, &scenario), &nodes);
    let shared = SharedEncodings::default();
    let ra = VersionedResources::build(&a, Some(&shared)).unwrap();
    let rb = VersionedResources::build(&b, Some(&shared)).unwrap();
    let (name, cla_a) = ra.of(ENDPOINT).next().unwrap();
    let cla_b = rb.get(ENDPOINT, name).unwrap();
    assert!(Arc::ptr_eq(cla_a, cla_b), "the same encoded load assignment");
    assert_eq!(shared.len(), 1);
    // New endpoints: a new encoding, same as building without the cache.
    let newer = Arc::new(vec![instance("api", "10.0.0.2", 21000)]);
    let c = with_endpoints(snapshot(&ca, &scenario), &newer);
    let rc = VersionedResources::build(&c, Some(&shared)).unwrap();
    let plain = VersionedResources::build(&c, None).unwrap();
    assert_ne!(rc.get(ENDPOINT, name).unwrap().version, cla_a.version);
    assert_eq!(
        rc.get(ENDPOINT, name).unwrap().version,
        plain.get(ENDPOINT, name).unwrap().version
    );
}

/// Changes one input of a snapshot's connect-proxy part.
fn changed(snap: &ConfigSnapshot, f: impl FnOnce(&mut proxycfg::ConnectProxySnapshot)) -> Arc<ConfigSnapshot> {
    let mut next = snap.clone();
    let KindSnapshot::ConnectProxy(cp) = &mut next.kind else {
        unreachable!("a sidecar snapshot")
    };
    f(cp);
    Arc::new(next)
}

#[test]
fn an_endpoints_only_change_reuses_the_other_resources_and_equals_a_full_build() {
    let ca = Ca::new();
    let scenario = Scenario {
        protocol: "http",
        upstreams: vec![("api", 9191, "http"), ("db", 9192, "tcp")],
        intentions: vec![],
        instances: vec![],
    };
    let shared = SharedEncodings::default();
    let first = Arc::new(with_endpoints(
        snapshot(&ca, &scenario),
        &Arc::new(vec![instance("api", "10.0.0.1", 1)]),
    ));
    let r1 = VersionedResources::build_after(&first, Some(&shared), None).unwrap();

    // Only endpoints change: every non-endpoint resource is the very same Arc.
    let second = Arc::new(with_endpoints(
        (*first).clone(),
        &Arc::new(vec![instance("api", "10.0.0.9", 1)]),
    ));
    let r2 = VersionedResources::build_after(&second, Some(&shared), Some(&r1)).unwrap();
    let full = VersionedResources::build(&second, Some(&shared)).unwrap();
    let versions = |r: &VersionedResources| -> Vec<(String, String, String)> {
        r.by_type
            .iter()
            .flat_map(|(t, m)| {
                m.iter()
                    .map(move |(n, v)| (t.to_string(), n.to_string(), v.version.clone()))
            })
            .collect()
    };
    assert_eq!(versions(&r2), versions(&full), "incremental equals full");
    for t in [xds::resources::CLUSTER, xds::resources::LISTENER, xds::resources::ROUTE] {
        assert!(Arc::ptr_eq(&r2.by_type[t], &r1.by_type[t]), "{t}: the same shared map");
    }
    for (t, m) in &r2.by_type {
        for (name, v) in m.iter() {
            let reused = Arc::ptr_eq(v, r1.get(t, name).unwrap());
            assert_eq!(reused, *t != ENDPOINT, "{t} {name}: reused={reused}");
        }
    }

    // Any other input changes: a full build (equal to building from scratch).
    let new_leaf = changed(&second, |cp| cp.leaf = Some(ca.leaf("web")));
    let r3 = VersionedResources::build_after(&new_leaf, Some(&shared), Some(&r2)).unwrap();
    assert_eq!(
        versions(&r3),
        versions(&VersionedResources::build(&new_leaf, Some(&shared)).unwrap())
    );
    assert_ne!(versions(&r3), versions(&r2), "the new leaf is in the leaf secret");
    let new_intentions = changed(&second, |cp| cp.intentions = Some(Arc::new(vec![])));
    let r4 = VersionedResources::build_after(&new_intentions, Some(&shared), Some(&r2)).unwrap();
    assert!(
        !Arc::ptr_eq(
            &r4.by_type[xds::resources::LISTENER],
            &r2.by_type[xds::resources::LISTENER]
        ),
        "rebuilt, not reused"
    );
    assert_eq!(
        versions(&r4),
        versions(&VersionedResources::build(&new_intentions, None).unwrap())
    );
}

#[test]
fn identical_resources_of_different_proxies_are_held_once() {
    let ca = Ca::new();
    let web = Scenario {
        protocol: "tcp",
        upstreams: vec![("api", 9191, "tcp"), ("db", 9192, "tcp")],
        intentions: vec![],
        instances: vec![],
    };
    // Another proxy with one upstream in common, on another local port.
    let other = Scenario {
        protocol: "tcp",
        upstreams: vec![("api", 9191, "tcp"), ("db", 9300, "tcp")],
        intentions: vec![],
        instances: vec![],
    };
    let shared = SharedEncodings::default();
    let a = VersionedResources::build(&snapshot(&ca, &web), Some(&shared)).unwrap();
    let mut b_snap = snapshot(&ca, &other);
    b_snap.proxy_id = Arc::new(proxycfg::ProxyId::new("other-node", "web-sidecar-proxy-2"));
    let b = VersionedResources::build(&b_snap, Some(&shared)).unwrap();
    let plain = VersionedResources::build(&b_snap, None).unwrap();
    for (t, m) in &b.by_type {
        for (name, v) in m.iter() {
            assert_eq!(
                v.version,
                plain.get(t, name).unwrap().version,
                "{t} {name}: same content"
            );
            let (Some(va), Some(pa)) = (a.get(t, name), plain.get(t, name)) else {
                continue;
            };
            let identical = va.version == pa.version;
            assert_eq!(
                Arc::ptr_eq(v, va),
                identical,
                "{t} {name}: shared exactly when identical"
            );
        }
    }
    let shared_clusters = b.by_type[xds::resources::CLUSTER]
        .iter()
        .filter(|(n, v)| a.get(xds::resources::CLUSTER, n).is_some_and(|x| Arc::ptr_eq(x, v)))
        .count();
    assert!(shared_clusters >= 2, "the upstream clusters are held once");
    let db_a = a.by_type[xds::resources::LISTENER]
        .keys()
        .find(|n| n.starts_with("db:"))
        .unwrap();
    assert!(
        b.get(xds::resources::LISTENER, db_a).is_none(),
        "db listens elsewhere for the other proxy"
    );
    let roots =
        |r: &VersionedResources| Arc::clone(r.get(xds::resources::SECRET, xds::resources::ROOTS_SECRET).unwrap());
    assert!(Arc::ptr_eq(&roots(&a), &roots(&b)), "one CA bundle secret");
    drop((a, b));
    assert!(
        shared.interned_len() > 0,
        "the upstreams' clusters, held by their shared parts"
    );
    // A part lives while some proxy holds its chain; then it goes at the next sweep.
    shared.sweep_unused_parts();
    assert!(shared.interned_len() > 0, "b's snapshot still holds its chains");
    drop((b_snap, plain));
    shared.sweep_unused_parts();
    assert_eq!(
        shared.interned_len(),
        0,
        "held weakly: gone with the proxies' resources and the parts of their chains"
    );
}

/// Every resource of a build by type and name, with its version.
fn versions(r: &VersionedResources) -> Vec<(&'static str, String, String)> {
    r.by_type
        .iter()
        .flat_map(|(t, m)| m.iter().map(|(n, v)| (*t, n.to_string(), v.version.clone())))
        .collect()
}

/// Transparent proxies whose outbound part reads the same inputs share one build of it; a
/// proxy whose inputs differ (another chain for an upstream, or the mesh entry's
/// `MeshDestinationsOnly`) gets its own, each the same as a build of its own snapshot alone.
#[test]
fn transparent_proxies_with_the_same_inputs_share_their_outbound_part() {
    use xds::resources::LISTENER;
    let ca = Ca::new();
    let shared = SharedEncodings::default();
    let a = crate::validate::transparent_snapshot(&ca, false);
    // Another instance of the same service: the very same chains and endpoints.
    let b = a.clone();
    let ra = VersionedResources::build(&a, Some(&shared)).unwrap();
    let rb = VersionedResources::build(&b, Some(&shared)).unwrap();
    let outbound = "outbound_listener:127.0.0.1:15001";
    assert!(Arc::ptr_eq(
        ra.get(LISTENER, outbound).unwrap(),
        rb.get(LISTENER, outbound).unwrap()
    ));
    assert_eq!(versions(&rb), versions(&VersionedResources::build(&b, None).unwrap()));

    // `api` now reaches a TCP chain (a new chain `Arc`): b's own listener, not a's.
    let mut c = b.clone();
    let KindSnapshot::ConnectProxy(cp) = &mut c.kind else {
        unreachable!("a sidecar snapshot")
    };
    let trust_domain = a.roots.as_ref().unwrap().trust_domain.clone();
    for (id, up) in Arc::make_mut(&mut cp.upstreams).iter_mut() {
        if id.name == "api" {
            let up = Arc::make_mut(up);
            up.chain = Some(Arc::new(structs::CompiledDiscoveryChain::default_for(
                "api",
                "dc1",
                &trust_domain,
                "tcp".parse().unwrap(),
            )));
        }
    }
    let rc = VersionedResources::build(&c, Some(&shared)).unwrap();
    assert_ne!(
        ra.get(LISTENER, outbound).unwrap().version,
        rc.get(LISTENER, outbound).unwrap().version
    );
    assert_eq!(versions(&rc), versions(&VersionedResources::build(&c, None).unwrap()));

    // The mesh entry keeps traffic in the mesh: no default chain, in this proxy's part only.
    let mut d = a.clone();
    let KindSnapshot::ConnectProxy(cp) = &mut d.kind else {
        unreachable!("a sidecar snapshot")
    };
    let mesh = crate::validate::transparent_snapshot(&ca, true);
    cp.mesh_config = mesh.connect_proxy().unwrap().mesh_config.clone();
    let rd = VersionedResources::build(&d, Some(&shared)).unwrap();
    assert_eq!(versions(&rd), versions(&VersionedResources::build(&d, None).unwrap()));
    assert_ne!(
        ra.get(LISTENER, outbound).unwrap().version,
        rd.get(LISTENER, outbound).unwrap().version
    );
    let again = VersionedResources::build(&a, Some(&shared)).unwrap();
    assert_eq!(versions(&again), versions(&ra));
}

/// Proxies reaching the same chain share its clusters only when what shapes them is the
/// same: an upstream with limits of its own gets clusters of its own, each equal to its
/// proxy's build alone.
#[test]
fn the_same_chain_with_other_limits_gets_clusters_of_its_own() {
    let ca = Ca::new();
    let scenario = Scenario {
        protocol: "tcp",
        upstreams: vec![("api", 9191, "tcp")],
        intentions: vec![],
        instances: vec![],
    };
    let plain_snap = snapshot(&ca, &scenario);
    // The same snapshot (the very same chain), the upstream given limits.
    let mut limited = plain_snap.clone();
    let service = Arc::make_mut(&mut limited.service);
    service.proxy.upstreams[0]
        .config
        .insert("limits".into(), serde_json::json!({"MaxConnections": 7}));
    let shared = SharedEncodings::default();
    let a = VersionedResources::build(&plain_snap, Some(&shared)).unwrap();
    let b = VersionedResources::build(&limited, Some(&shared)).unwrap();
    let a_again = VersionedResources::build(&plain_snap, Some(&shared)).unwrap();
    let cluster = xds::resources::CLUSTER;
    let name = a
        .of(cluster)
        .map(|(n, _)| n)
        .find(|n| n.starts_with("api."))
        .unwrap()
        .to_owned();
    assert_ne!(
        a.get(cluster, &name).unwrap().version,
        b.get(cluster, &name).unwrap().version
    );
    for (built, snap) in [(&a, &plain_snap), (&b, &limited)] {
        let alone = VersionedResources::build(snap, None).unwrap();
        assert_eq!(
            built.get(cluster, &name).unwrap().version,
            alone.get(cluster, &name).unwrap().version
        );
    }
    assert!(Arc::ptr_eq(
        a.get(cluster, &name).unwrap(),
        a_again.get(cluster, &name).unwrap()
    ));
}

/// One change of a transparent proxy's upstreams, as proxycfg makes them (a new `Arc` for
/// what changed, the others kept).
fn apply_change(snap: &ConfigSnapshot, step: u64, trust_domain: &str) -> Arc<ConfigSnapshot> {
    let names = ["api", "cache", "db", "search", "pay", "auth", "mail", "feed"];
    let name = names[(step / 7) as usize % names.len()];
    changed(snap, |cp| {
        let upstreams = Arc::make_mut(&mut cp.upstreams);
        let id = Arc::new(proxycfg::handler::implicit_id(name));
        let present = upstreams.get(&id).cloned();
        let vip = |n: u64| format!("240.0.{}.{}", step % 3, 1 + n % 200);
        let node = |n: u64| {
            crate::validate::with_vip(
                name,
                &format!("10.1.{}.{}", n % 5, 1 + step % 250),
                &vip(n),
                step.is_multiple_of(5),
            )
        };
        let chain_of = |protocol: &str, timeout: u32| {
            let mut chain =
                structs::CompiledDiscoveryChain::default_for(name, "dc1", trust_domain, protocol.parse().unwrap());
            for t in chain.targets.values_mut() {
                t.connect_timeout_ms = timeout;
            }
            Arc::new(chain)
        };
        let Some(up) = present else {
            // Added: known by its chain only, or with its endpoints at once.
            let chain = chain_of(if step.is_multiple_of(2) { "http" } else { "tcp" }, 5000);
            let mut up = proxycfg::UpstreamSnapshot::new(proxycfg::UpstreamSnapshot::IMPLICIT);
            if !step.is_multiple_of(3) {
                for t in chain.targets.keys() {
                    up.endpoints.insert(t.clone(), Arc::new(vec![node(step)]));
                }
            }
            up.chain = Some(chain);
            upstreams.insert(id, Arc::new(up));
            return;
        };
        let mut up = (*up).clone();
        let chain = Arc::clone(up.chain.as_ref().unwrap());
        match step % 6 {
            // Removed (intention deleted).
            0 => {
                upstreams.remove(&id);
                return;
            }
            // New endpoints, the same virtual IP.
            1 | 2 => {
                let same = up.endpoints.values().next().and_then(|n| n.first()).map(|n| {
                    n.service.tagged_addresses[structs::service::TAGGED_ADDRESS_VIRTUAL_IP]
                        .address
                        .clone()
                });
                for t in chain.targets.keys() {
                    let mut n = node(step);
                    if let Some(same) = &same {
                        n.service
                            .tagged_addresses
                            .get_mut(structs::service::TAGGED_ADDRESS_VIRTUAL_IP)
                            .unwrap()
                            .address = same.clone();
                    }
                    up.endpoints.insert(t.clone(), Arc::new(vec![n]));
                }
            }
            // Another virtual IP: the outbound listener changes.
            3 => {
                for t in chain.targets.keys() {
                    up.endpoints.insert(t.clone(), Arc::new(vec![node(step + 1)]));
                }
            }
            // A new chain with the same targets (another timeout, maybe another protocol).
            4 => {
                let protocol = if step.is_multiple_of(4) { "tcp" } else { "http" };
                up.chain = Some(chain_of(protocol, 1000 + step as u32));
            }
            // Its endpoints gone.
            _ => up.endpoints = Default::default(),
        }
        upstreams.insert(id, Arc::new(up));
    })
}

/// A transparent proxy's build after each of many changes (upstreams added and removed, new
/// chains, endpoints and virtual IPs) equals a full build, whichever way it was made; most
/// changes patch the previous build (only the changed parts built), and every way is taken.
/// So do the builds of a twin proxy going through the same changes (which takes the
/// outbound parts the first found) and of one taking another change from the same builds.
#[test]
fn builds_after_any_sequence_of_changes_equal_full_builds() {
    use xds::versioned::BuildPath;
    let ca = Ca::new();
    let shared = SharedEncodings::default();
    let first = Arc::new(crate::validate::transparent_snapshot(&ca, false));
    let trust_domain = first.roots.as_ref().unwrap().trust_domain.clone();
    let mut previous = VersionedResources::build_after(&first, Some(&shared), None).unwrap();
    // A twin proxy going through the same changes (it takes the parts the first one found),
    // and from each step a third one taking another change from the same builds.
    let mut twin = VersionedResources::build_after(&first, Some(&shared), None).unwrap();
    let mut snap = first;
    let mut paths = std::collections::BTreeMap::new();
    let listener = "outbound_listener:127.0.0.1:15001";
    // A fixed walk: every step a change of one upstream picked by a linear congruence.
    let mut x: u64 = 7;
    for _ in 0..400 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let step = x >> 33;
        let next = apply_change(&snap, step, &trust_domain);
        let aside = apply_change(&snap, step.wrapping_mul(31).wrapping_add(3), &trust_domain);
        let built = VersionedResources::build_after(&next, Some(&shared), Some(&previous)).unwrap();
        let twin_built = VersionedResources::build_after(&next, Some(&shared), Some(&twin)).unwrap();
        let other = VersionedResources::build_after(&aside, Some(&shared), Some(&previous)).unwrap();
        for (built, snap) in [(&built, &next), (&twin_built, &next), (&other, &aside)] {
            let full = VersionedResources::build(snap, None).unwrap();
            assert_eq!(versions(built), versions(&full), "step {step}: {:?}", built.path());
            assert_eq!(built.problems, full.problems, "step {step}");
        }
        assert!(
            Arc::ptr_eq(
                built.get(xds::resources::LISTENER, listener).unwrap(),
                twin_built.get(xds::resources::LISTENER, listener).unwrap()
            ),
            "step {step}: the twins share their outbound listener"
        );
        *paths.entry(format!("{:?}", built.path())).or_insert(0) += 1;
        previous = built;
        twin = twin_built;
        snap = next;
    }
    for path in [BuildPath::Endpoints, BuildPath::Parts, BuildPath::Patched] {
        assert!(
            paths.contains_key(&format!("{path:?}")),
            "{path:?} never taken: {paths:?}"
        );
    }
    assert!(
        paths["Patched"] > paths["Parts"],
        "most changes patch the previous build: {paths:?}"
    );
}
