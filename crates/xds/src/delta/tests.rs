use super::*;
use crate::resources::{CLUSTER, ENDPOINT, LISTENER};
use envoy_types::pb::google::rpc::Status as RpcStatus;

fn res(items: &[(&'static str, &str, &[u8])]) -> VersionedResources {
    crate::versioned::test_resources(items)
}

fn subscribe(type_url: &str, names: &[&str]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: type_url.into(),
        resource_names_subscribe: names.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}

fn ack(resp: &DeltaDiscoveryResponse) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: resp.type_url.clone(),
        response_nonce: resp.nonce.clone(),
        ..Default::default()
    }
}

fn nack(resp: &DeltaDiscoveryResponse) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        error_detail: Some(RpcStatus {
            code: 3,
            message: "bad cluster".into(),
            details: vec![],
        }),
        ..ack(resp)
    }
}

fn names(resp: &DeltaDiscoveryResponse) -> Vec<&str> {
    resp.resources.iter().map(|r| r.name.as_str()).collect()
}

#[test]
fn wildcard_then_only_changes_after_ack() {
    let mut st = DeltaState::default();
    st.on_request(&subscribe(CLUSTER, &[]));
    let v1 = res(&[(CLUSTER, "a", b"1"), (CLUSTER, "b", b"1")]);
    let out = st.responses(&v1);
    assert_eq!(out.len(), 1);
    assert_eq!(names(&out[0]), vec!["a", "b"]);
    // One un-ACKed response per type: nothing more until the ACK.
    let v2 = res(&[(CLUSTER, "a", b"2"), (CLUSTER, "b", b"1")]);
    assert!(st.responses(&v2).is_empty());
    assert_eq!(
        st.on_request(&ack(&out[0])),
        Ack::Accepted {
            type_url: CLUSTER.into()
        }
    );
    let out = st.responses(&v2);
    assert_eq!(names(&out[0]), vec!["a"], "only what changed");
    st.on_request(&ack(&out[0]));
    assert!(st.responses(&v2).is_empty());
    assert!(st.quiet());
}

#[test]
fn a_wildcard_type_with_nothing_in_it_is_answered_once_empty() {
    let mut st = DeltaState::default();
    st.on_request(&subscribe(CLUSTER, &[]));
    st.on_request(&subscribe(LISTENER, &[]));
    st.on_request(&subscribe(ENDPOINT, &["c1"]));
    let none = res(&[]);
    let out = st.responses(&none);
    // Envoy completes its initialisation on these; a named subscription is not answered.
    let types: Vec<&str> = out.iter().map(|r| r.type_url.as_str()).collect();
    assert_eq!(types, [CLUSTER, LISTENER]);
    assert!(
        out.iter()
            .all(|r| r.resources.is_empty() && r.removed_resources.is_empty())
    );
    for r in &out {
        st.on_request(&ack(r));
    }
    assert!(st.responses(&none).is_empty(), "answered once");
    // What comes later is sent as usual.
    let later = res(&[(LISTENER, "l1", b"1")]);
    let out = st.responses(&later);
    assert_eq!(out.len(), 1);
    assert_eq!(names(&out[0]), ["l1"]);
}

#[test]
fn nack_keeps_last_good_and_never_resends_the_rejected_version() {
    let mut st = DeltaState::default();
    st.on_request(&subscribe(CLUSTER, &[]));
    let good = res(&[(CLUSTER, "a", b"good")]);
    let out = st.responses(&good);
    st.on_request(&ack(&out[0]));
    let bad = res(&[(CLUSTER, "a", b"bad")]);
    let out = st.responses(&bad);
    assert!(matches!(st.on_request(&nack(&out[0])), Ack::Rejected { message, .. } if message == "bad cluster"));
    // No resend loop: the same rejected version is not sent again, even on a new request.
    assert!(st.responses(&bad).is_empty());
    st.on_request(&subscribe(CLUSTER, &[]));
    assert!(st.responses(&bad).is_empty());
    // A new version is.
    let fixed = res(&[(CLUSTER, "a", b"fixed")]);
    assert_eq!(names(&st.responses(&fixed)[0]), vec!["a"]);
}

#[test]
fn stale_nonces_are_ignored() {
    let mut st = DeltaState::default();
    st.on_request(&subscribe(CLUSTER, &[]));
    let out = st.responses(&res(&[(CLUSTER, "a", b"1")]));
    let stale = DeltaDiscoveryRequest {
        type_url: CLUSTER.into(),
        response_nonce: "nope".into(),
        ..Default::default()
    };
    assert_eq!(st.on_request(&stale), Ack::Stale);
    assert!(!st.quiet(), "still waiting for the real ACK");
    st.on_request(&ack(&out[0]));
    assert!(st.quiet());
}

#[test]
fn named_subscriptions_and_unsubscribe() {
    let mut st = DeltaState::default();
    st.on_request(&subscribe(ENDPOINT, &["a"]));
    let r = res(&[(ENDPOINT, "a", b"1"), (ENDPOINT, "b", b"1")]);
    let out = st.responses(&r);
    assert_eq!(names(&out[0]), vec!["a"], "only what was asked for");
    let mut more = subscribe(ENDPOINT, &["b"]);
    more.response_nonce = out[0].nonce.clone();
    st.on_request(&more);
    assert_eq!(names(&st.responses(&r)[0]), vec!["b"]);
    let unsub = DeltaDiscoveryRequest {
        type_url: ENDPOINT.into(),
        resource_names_unsubscribe: vec!["a".into()],
        ..Default::default()
    };
    st.on_request(&unsub);
    // Nothing to remove: the proxy forgot it itself.
    let out = st.responses(&res(&[(ENDPOINT, "b", b"1")]));
    assert!(out.iter().all(|r| r.removed_resources.is_empty()));
}

#[test]
fn reconnect_with_initial_versions_sends_only_the_difference() {
    let current = res(&[(CLUSTER, "a", b"1"), (CLUSTER, "b", b"2")]);
    let a_version = current.get(CLUSTER, "a").unwrap().version.clone();
    let mut st = DeltaState::default();
    let mut req = subscribe(CLUSTER, &[]);
    req.initial_resource_versions.insert("a".into(), a_version);
    req.initial_resource_versions.insert("gone".into(), "old".into());
    st.on_request(&req);
    let out = st.responses(&current);
    assert_eq!(names(&out[0]), vec!["b"], "a is already there");
    st.on_request(&ack(&out[0]));
    let out = st.responses(&current);
    assert_eq!(
        out[0].removed_resources,
        vec!["gone"],
        "what no longer exists is removed"
    );
}

#[test]
fn make_before_break_order() {
    let mut st = DeltaState::default();
    st.on_request(&subscribe(LISTENER, &[]));
    st.on_request(&subscribe(ENDPOINT, &["c"]));
    st.on_request(&subscribe(CLUSTER, &[]));
    let v1 = res(&[
        (CLUSTER, "c", b"1"),
        (CLUSTER, "old", b"1"),
        (ENDPOINT, "c", b"1"),
        (LISTENER, "l", b"1"),
    ]);
    let out = st.responses(&v1);
    let order: Vec<&str> = out.iter().map(|r| r.type_url.as_str()).collect();
    assert_eq!(order, vec![CLUSTER, ENDPOINT, LISTENER]);
    for r in &out {
        st.on_request(&ack(r));
    }
    // Removing a cluster while a listener changes: the listener first, removal after its ACK.
    let v2 = res(&[(CLUSTER, "c", b"1"), (ENDPOINT, "c", b"1"), (LISTENER, "l", b"2")]);
    let out = st.responses(&v2);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].type_url, LISTENER);
    assert!(out[0].removed_resources.is_empty());
    st.on_request(&ack(&out[0]));
    let out = st.responses(&v2);
    assert_eq!(
        (out[0].type_url.as_str(), out[0].removed_resources.clone()),
        (CLUSTER, vec!["old".to_owned()])
    );
}

#[test]
fn a_type_in_sync_with_the_same_map_is_skipped_until_a_request_of_that_type() {
    let mut st = DeltaState::default();
    st.on_request(&subscribe(CLUSTER, &["a"]));
    st.on_request(&subscribe(ENDPOINT, &["a"]));
    let v1 = res(&[(CLUSTER, "a", b"1"), (CLUSTER, "b", b"1"), (ENDPOINT, "a", b"e1")]);
    for _ in 0..2 {
        for resp in st.responses(&v1) {
            st.on_request(&ack(&resp));
        }
    }
    assert!(st.responses(&v1).is_empty());
    // Endpoints change, clusters are the very same map: only endpoints are sent.
    let mut v2 = res(&[(ENDPOINT, "a", b"e2")]);
    v2.by_type.insert(CLUSTER, Arc::clone(&v1.by_type[CLUSTER]));
    let out = st.responses(&v2);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].type_url, ENDPOINT);
    st.on_request(&ack(&out[0]));
    assert!(st.responses(&v2).is_empty());
    // A new subscription to "b" (a request of the cluster type) makes the same map news.
    st.on_request(&subscribe(CLUSTER, &["b"]));
    let out = st.responses(&v2);
    assert_eq!(out.len(), 1);
    assert_eq!(names(&out[0]), vec!["b"]);
}

#[test]
fn the_ack_of_a_complete_response_puts_the_type_in_sync_and_nothing_less_does() {
    let mut st = DeltaState::default();
    st.on_request(&subscribe(CLUSTER, &[]));
    let v1 = res(&[(CLUSTER, "a", b"1"), (CLUSTER, "b", b"1")]);
    let out = st.responses(&v1);
    assert!(
        st.served[slot(CLUSTER).unwrap()].pending_complete.is_some(),
        "everything of v1 is in flight"
    );
    st.on_request(&ack(&out[0]));
    assert!(
        st.served[slot(CLUSTER).unwrap()].is_in_sync(v1.map(CLUSTER)),
        "in sync without another diff"
    );
    assert!(st.responses(&v1).is_empty());

    // "b" goes away while "a" changes: the upsert is not complete (a removal is due), so its
    // ACK does not mark the type in sync, and the removal follows.
    let v2 = res(&[(CLUSTER, "a", b"2")]);
    let out = st.responses(&v2);
    assert_eq!(names(&out[0]), vec!["a"]);
    assert!(st.served[slot(CLUSTER).unwrap()].pending_complete.is_none());
    st.on_request(&ack(&out[0]));
    assert!(!st.served[slot(CLUSTER).unwrap()].is_in_sync(v2.map(CLUSTER)));
    let out = st.responses(&v2);
    assert_eq!(out[0].removed_resources, vec!["b".to_owned()]);

    // An ACK that also changes the subscription does not mark the type in sync either.
    st.on_request(&ack(&out[0]));
    let v3 = res(&[(CLUSTER, "a", b"3")]);
    let out = st.responses(&v3);
    let mut ack_and_unsubscribe = ack(&out[0]);
    ack_and_unsubscribe.resource_names_unsubscribe = vec!["*".into()];
    st.on_request(&ack_and_unsubscribe);
    assert!(!st.served[slot(CLUSTER).unwrap()].is_in_sync(v3.map(CLUSTER)));
}

#[test]
fn diff_maps_finds_changed_added_and_gone_names_by_pointer_then_version() {
    use crate::versioned::{TypeResources, Versioned};
    use envoy_types::pb::google::protobuf::Any;
    let v = |body: &[u8]| {
        Arc::new(Versioned::new(Any {
            type_url: "t".into(),
            value: body.to_vec(),
        }))
    };
    let (a, b, c) = (v(b"a"), v(b"b"), v(b"c"));
    let old: TypeResources = [("a", Arc::clone(&a)), ("b", Arc::clone(&b)), ("c", c)]
        .into_iter()
        .map(|(n, v)| (Arc::from(n), v))
        .collect();
    // a: the same Arc; b: an equal encoding in another Arc (same version); c: gone;
    // b2: changed content under a new name; d: new.
    let new: TypeResources = [("a", a), ("b", v(b"b")), ("b2", v(b"x")), ("d", v(b"d"))]
        .into_iter()
        .map(|(n, v)| (Arc::from(n), v))
        .collect();
    let (changed, gone) = super::diff_maps(&old, &new);
    let changed: Vec<&str> = changed.iter().map(|(n, _)| *n).collect();
    assert_eq!(changed, ["b2", "d"]);
    assert_eq!(gone, ["c"]);
    let (changed, gone) = super::diff_maps(&new, &old);
    assert_eq!(changed.iter().map(|(n, _)| *n).collect::<Vec<_>>(), ["c"]);
    assert_eq!(gone, ["b2", "d"]);
}

#[test]
fn an_updated_cluster_gets_its_unchanged_load_assignment_again() {
    let mut st = DeltaState::default();
    st.on_request(&subscribe(CLUSTER, &[]));
    st.on_request(&subscribe(ENDPOINT, &["a", "b"]));
    let v1 = res(&[
        (CLUSTER, "a", b"1"),
        (CLUSTER, "b", b"1"),
        (ENDPOINT, "a", b"e"),
        (ENDPOINT, "b", b"e"),
    ]);
    for r in st.responses(&v1) {
        st.on_request(&ack(&r));
    }
    assert!(st.responses(&v1).is_empty());
    // Cluster a changes (its TLS, say), its endpoints do not: Envoy warms a new cluster that
    // needs them, so they follow it; b is untouched.
    let v2 = res(&[
        (CLUSTER, "a", b"2"),
        (CLUSTER, "b", b"1"),
        (ENDPOINT, "a", b"e"),
        (ENDPOINT, "b", b"e"),
    ]);
    let out = st.responses(&v2);
    let sent: Vec<(&str, Vec<&str>)> = out.iter().map(|r| (r.type_url.as_str(), names(r))).collect();
    assert_eq!(sent, [(CLUSTER, vec!["a"]), (ENDPOINT, vec!["a"])]);
    for r in &out {
        st.on_request(&ack(r));
    }
    assert!(st.responses(&v2).is_empty());
    // An assignment response in flight when a cluster changes does not cancel the resend.
    let v2b = res(&[
        (CLUSTER, "a", b"2"),
        (CLUSTER, "b", b"1"),
        (ENDPOINT, "a", b"e2"),
        (ENDPOINT, "b", b"e"),
    ]);
    let eds = st.responses(&v2b);
    assert_eq!(eds.len(), 1);
    assert_eq!(names(&eds[0]), vec!["a"]);
    let v2c = res(&[
        (CLUSTER, "a", b"3"),
        (CLUSTER, "b", b"1"),
        (ENDPOINT, "a", b"e2"),
        (ENDPOINT, "b", b"e"),
    ]);
    let cds = st.responses(&v2c);
    assert_eq!(names(&cds[0]), vec!["a"]);
    st.on_request(&ack(&eds[0]));
    st.on_request(&ack(&cds[0]));
    let again = st.responses(&v2c);
    let sent: Vec<(&str, Vec<&str>)> = again.iter().map(|r| (r.type_url.as_str(), names(r))).collect();
    assert_eq!(sent, [(ENDPOINT, vec!["a"])]);
    st.on_request(&ack(&again[0]));
    assert!(st.responses(&v2c).is_empty());
    // A new cluster gets nothing extra (Envoy subscribes to its endpoints itself).
    let v3 = res(&[
        (CLUSTER, "a", b"3"),
        (CLUSTER, "b", b"1"),
        (CLUSTER, "c", b"1"),
        (ENDPOINT, "a", b"e2"),
        (ENDPOINT, "b", b"e"),
    ]);
    let out = st.responses(&v3);
    let sent: Vec<(&str, Vec<&str>)> = out.iter().map(|r| (r.type_url.as_str(), names(r))).collect();
    assert_eq!(sent, [(CLUSTER, vec!["c"])]);
}

#[test]
fn a_held_version_is_ours_packed_only_when_it_is_exactly_our_form() {
    let ours = "0123456789abcdef0123456789abcdef";
    assert!(matches!(Held::of(ours), Held::Ours(_)));
    assert_eq!(Held::of(ours), Held::of(ours));
    // Another form of the same digits, or another length, is another version, kept as given.
    for other in [
        "0123456789ABCDEF0123456789ABCDEF",
        "0123456789abcdef",
        "",
        "old",
        "zz23456789abcdef0123456789abcdef",
    ] {
        assert_eq!(Held::of(other), Held::Other(other.into()), "{other:?}");
        assert_ne!(Held::of(other), Held::of(ours));
    }
    // A proxy reconnecting with a version of another form is sent the resource again.
    let current = res(&[(CLUSTER, "a", b"1")]);
    let version = current.get(CLUSTER, "a").unwrap().version.clone();
    let mut st = DeltaState::default();
    let mut req = subscribe(CLUSTER, &[]);
    req.initial_resource_versions.insert("a".into(), version.to_uppercase());
    st.on_request(&req);
    assert_eq!(names(&st.responses(&current)[0]), vec!["a"]);
}

/// In sync with a map, a type whose next map only drops names removes the wanted ones the
/// proxy holds (found by walking both maps), and nothing it never asked for.
#[test]
fn names_gone_from_an_in_sync_map_are_removed_if_wanted_and_held() {
    let mut st = DeltaState::default();
    st.on_request(&subscribe(ENDPOINT, &["a", "b"]));
    let v1 = res(&[(ENDPOINT, "a", b"1"), (ENDPOINT, "b", b"1"), (ENDPOINT, "c", b"1")]);
    let out = st.responses(&v1);
    assert_eq!(names(&out[0]), vec!["a", "b"]);
    st.on_request(&ack(&out[0]));
    assert!(st.served[slot(ENDPOINT).unwrap()].is_in_sync(v1.map(ENDPOINT)));
    // "b" (held) and "c" (never asked for) go; "a" stays the very same resource.
    let mut v2 = VersionedResources::default();
    let mut map = (*v1.by_type[ENDPOINT]).clone();
    map.remove("b");
    map.remove("c");
    v2.by_type.insert(ENDPOINT, Arc::new(map));
    let out = st.responses(&v2);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].removed_resources, vec!["b".to_owned()]);
    st.on_request(&ack(&out[0]));
    assert!(st.responses(&v2).is_empty());
    // Nothing gone: in sync with the new map at once.
    let mut v3 = VersionedResources::default();
    let mut map = (*v2.by_type[ENDPOINT]).clone();
    map.insert(Arc::from("d"), Arc::clone(&v1.by_type[ENDPOINT]["c"]));
    v3.by_type.insert(ENDPOINT, Arc::new(map));
    assert!(st.responses(&v3).is_empty());
    assert!(st.served[slot(ENDPOINT).unwrap()].is_in_sync(v3.map(ENDPOINT)));
}
