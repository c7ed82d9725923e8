//! No silent drops: an upstream whose resources cannot be built keeps its last good listener
//! and route, and the build says why.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use proxycfg::{ConfigSnapshot, KindSnapshot};
use std::sync::Arc;
use xds::resources::{LISTENER, ROUTE};
use xds::versioned::VersionedResources;

/// `snap` with the chain of upstream `api` made inconsistent (its start node missing).
fn broken(mut snap: ConfigSnapshot) -> ConfigSnapshot {
    let KindSnapshot::ConnectProxy(cp) = &mut snap.kind;
    for (id, up) in Arc::make_mut(&mut cp.upstreams).iter_mut() {
        if id.name == "api" {
            let up = Arc::make_mut(up);
            let mut chain = (**up.chain.as_ref().unwrap()).clone();
            chain.start_node = "router:missing".into();
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

    // Without a last good build there is nothing to keep: the listener is absent, and said so.
    let alone = VersionedResources::build_after(&bad, None, None).unwrap();
    assert!(alone.get(LISTENER, listener).is_none());
    assert!(alone.problems.contains_key("api"));

    // Fixed again: built afresh, no problem left.
    let third = VersionedResources::build_after(&good, None, Some(&second)).unwrap();
    assert!(third.problems.is_empty());
    assert!(third.get(LISTENER, listener).is_some());
}
