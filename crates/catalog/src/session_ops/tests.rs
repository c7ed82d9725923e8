use super::*;
use crate::kv_ops;
use structs::session::CreateRequest;
use structs::{HealthCheck, Index, Node};

fn apply(state: &mut State, plan: &Plan) {
    let index = state.index.next();
    state.apply(index, &plan.changes);
}

fn put_check(state: &mut State, status: HealthStatus) {
    let plan = Plan::write(vec![Change::PutCheck(HealthCheck {
        node: "n1".into(),
        check_id: "serfHealth".into(),
        status,
        ..HealthCheck::default()
    })]);
    apply(state, &plan);
}

/// A state with node n1 and its passing liveness check.
fn with_node() -> State {
    let mut s = State::default();
    let plan = Plan::write(vec![Change::PutNode(Node {
        node: "n1".into(),
        ..Node::default()
    })]);
    apply(&mut s, &plan);
    put_check(&mut s, HealthStatus::Passing);
    s
}

fn session(id: &str, json: &str) -> Session {
    let req: CreateRequest = structs::json::from_slice(json.as_bytes()).unwrap();
    req.into_session(id.into(), "n1", 1_000).unwrap()
}

fn entry(key: &str, value: &str) -> KvEntry {
    KvEntry {
        key: key.into(),
        value: value.as_bytes().to_vec(),
        ..KvEntry::default()
    }
}

#[test]
fn creating_needs_the_node_and_healthy_checks() {
    let mut s = State::default();
    let e = plan_create(&s, &session("a", "{}")).unwrap_err();
    assert!(e.to_string().contains("Missing node registration"), "{e}");
    s = with_node();
    let e = plan_create(&s, &session("a", r#"{"Checks": ["nope"]}"#)).unwrap_err();
    assert!(e.to_string().contains("Missing check 'nope' registration"), "{e}");
    put_check(&mut s, HealthStatus::Critical);
    let e = plan_create(&s, &session("a", "{}")).unwrap_err();
    assert!(e.to_string().contains("critical"), "{e}");
    // No checks at all: fine even with the node critical.
    let p = plan_create(&s, &session("a", r#"{"Checks": []}"#)).unwrap();
    apply(&mut s, &p);
    assert_eq!(s.session("a").unwrap().create_index, s.index);
}

#[test]
fn locks_are_exclusive_counted_and_released_with_a_delay() {
    let mut s = with_node();
    for id in ["a", "b"] {
        let p = plan_create(&s, &session(id, r#"{"LockDelay": "5s"}"#)).unwrap();
        apply(&mut s, &p);
    }
    let p = plan_lock(&s, entry("lead", "a"), "a", 1_000).unwrap();
    assert!(p.applied);
    apply(&mut s, &p);
    assert_eq!(s.kv_get("lead").unwrap().lock_index, 1);
    assert!(
        !plan_lock(&s, entry("lead", "b"), "b", 1_000).unwrap().applied,
        "b took a's lock"
    );
    // The holder writing again keeps its lock index.
    let p = plan_lock(&s, entry("lead", "a2"), "a", 1_000).unwrap();
    apply(&mut s, &p);
    assert_eq!(s.kv_get("lead").unwrap().lock_index, 1);
    // Only the holder can release.
    assert!(!plan_unlock(&s, entry("lead", "x"), "b").applied);
    let p = plan_unlock(&s, entry("lead", "free"), "a");
    apply(&mut s, &p);
    let e = s.kv_get("lead").unwrap();
    assert_eq!(
        (e.session.as_str(), e.lock_index, e.value.as_slice()),
        ("", 1, &b"free"[..])
    );
    let p = plan_lock(&s, entry("lead", "b"), "b", 2_000).unwrap();
    apply(&mut s, &p);
    assert_eq!(s.kv_get("lead").unwrap().lock_index, 2);
    // b ends: the lock goes, and nobody may take it for the lock delay.
    let p = plan_destroy(&s, "b", 3_000);
    apply(&mut s, &p);
    assert!(s.session("b").is_none());
    assert_eq!(s.kv_get("lead").unwrap().session, "");
    assert!(!plan_lock(&s, entry("lead", "a"), "a", 7_999).unwrap().applied);
    assert!(plan_lock(&s, entry("lead", "a"), "a", 8_000).unwrap().applied);
    // An unknown session is refused by name.
    let e = plan_lock(&s, entry("lead", "x"), "ghost", 9_000).unwrap_err();
    assert!(e.to_string().contains("invalid session \"ghost\""), "{e}");
    // Lock delays that are over are dropped by the leader's sweep.
    let p = plan_invalidate(&s, 9_000);
    apply(&mut s, &p);
    assert_eq!(s.lock_delays().count(), 0);
    // A check-and-set still works on a locked key, and keeps its lock.
    let p = plan_lock(&s, entry("lead", "a"), "a", 9_000).unwrap();
    apply(&mut s, &p);
    let modify = s.kv_get("lead").unwrap().modify_index;
    let p = kv_ops::plan_set(&s, "lead", b"v", 0, Some(modify)).unwrap();
    apply(&mut s, &p);
    assert_eq!(s.kv_get("lead").unwrap().session, "a");
    assert!(s.index > Index(1));
}

#[test]
fn ttl_expiry_and_a_critical_check_end_sessions_with_their_behavior() {
    let mut s = with_node();
    let p = plan_create(
        &s,
        &session("ttl", r#"{"TTL": "10s", "Behavior": "delete", "Checks": []}"#),
    )
    .unwrap();
    apply(&mut s, &p);
    let p = plan_create(&s, &session("bound", "{}")).unwrap();
    apply(&mut s, &p);
    for (key, id) in [("k/ttl", "ttl"), ("k/bound", "bound")] {
        let p = plan_lock(&s, entry(key, "v"), id, 1_000).unwrap();
        apply(&mut s, &p);
    }
    // Renewed at 1 s with a 10 s TTL: due at 21 s.
    assert!(plan_invalidate(&s, 20_999).changes.is_empty());
    let p = plan_renew(&s, "ttl", 15_000).unwrap();
    apply(&mut s, &p);
    assert!(plan_invalidate(&s, 34_999).changes.is_empty());
    let p = plan_invalidate(&s, 35_000);
    apply(&mut s, &p);
    assert!(s.session("ttl").is_none());
    assert!(s.kv_get("k/ttl").is_none(), "behavior delete removes the key");
    // The node's liveness turns critical: its sessions end, keys released.
    put_check(&mut s, HealthStatus::Critical);
    let p = plan_invalidate(&s, 36_000);
    apply(&mut s, &p);
    assert!(s.session("bound").is_none());
    assert_eq!(s.kv_get("k/bound").unwrap().session, "");
    assert!(
        plan_renew(&s, "bound", 37_000)
            .unwrap_err()
            .to_string()
            .contains("not found")
    );
}

#[test]
fn many_sessions_ending_at_once_take_several_bounded_writes() {
    let mut s = with_node();
    for i in 0..150 {
        let p = plan_create(&s, &session(&format!("s{i:03}"), "{}")).unwrap();
        apply(&mut s, &p);
    }
    put_check(&mut s, HealthStatus::Critical);
    let mut writes = 0;
    loop {
        let p = plan_invalidate(&s, 2_000);
        if p.changes.is_empty() {
            break;
        }
        assert!(
            p.changes.len() <= super::INVALIDATE_CHANGES_PER_WRITE,
            "{}",
            p.changes.len()
        );
        apply(&mut s, &p);
        writes += 1;
    }
    assert_eq!(writes, 2);
    assert_eq!(s.sessions().count(), 0);
}

#[test]
fn a_query_bound_to_a_session_goes_with_it() {
    let mut s = with_node();
    let p = plan_create(&s, &session("owner", r#"{"Checks": []}"#)).unwrap();
    apply(&mut s, &p);
    let query = structs::query::PreparedQuery {
        id: "q1".into(),
        session: "owner".into(),
        service: structs::query::ServiceQuery {
            service: "web".into(),
            ..Default::default()
        },
        ..Default::default()
    };
    let p = crate::ops::plan(
        &crate::op::Op::QuerySet {
            query: Box::new(query),
            create: true,
        },
        &s,
        "dc1",
        std::time::SystemTime::now(),
    )
    .unwrap();
    apply(&mut s, &p);
    assert!(s.query("q1").is_some());
    let p = plan_destroy(&s, "owner", 5_000);
    apply(&mut s, &p);
    assert!(s.query("q1").is_none());
}
