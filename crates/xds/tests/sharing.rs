//! Encode once: proxies watching the same endpoints share one encoded load assignment.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use proxycfg::{ConfigSnapshot, KindSnapshot};
use std::sync::Arc;
use structs::CheckServiceNode;
use xds::resources::{ENDPOINT, SharedEncodings};
use xds::versioned::VersionedResources;

fn with_endpoints(mut snap: ConfigSnapshot, nodes: &Arc<Vec<CheckServiceNode>>) -> ConfigSnapshot {
    let KindSnapshot::ConnectProxy(cp) = &mut snap.kind;
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
