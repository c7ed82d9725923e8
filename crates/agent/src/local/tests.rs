use super::*;

fn svc(id: &str) -> LocalService {
    LocalService::new(
        NodeService {
            id: id.into(),
            service: "web".into(),
            port: 80,
            ..NodeService::default()
        },
        None,
        Source::Api,
    )
}

fn check(id: &str, service: &str, status: HealthStatus) -> LocalCheck {
    LocalCheck::new(
        HealthCheck {
            check_id: id.into(),
            name: id.into(),
            status,
            service_id: service.into(),
            ..HealthCheck::default()
        },
        None,
        None,
        Source::Api,
    )
}

#[test]
fn a_change_made_during_a_push_is_pushed_again() {
    let s = LocalState::new("n1");
    s.apply(vec![svc("a")], vec![check("c", "a", HealthStatus::Critical)], &[]);
    let p = s.pending();
    assert_eq!(p.services.len(), 1);
    assert_eq!(p.services[0].2.len(), 1, "the service carries its checks");
    assert!(p.checks.is_empty());
    // The check flips while the push is in flight.
    assert!(s.update_check("c", HealthStatus::Passing, "ok".into()));
    let (svc_pushed, generation, checks) = &p.services[0];
    s.mark_service_synced(&svc_pushed.id, *generation);
    for (c, g) in checks {
        s.mark_check_synced(&c.check_id, *g);
    }
    let p = s.pending();
    assert!(p.services.is_empty());
    assert_eq!(p.checks.len(), 1);
    assert_eq!(p.checks[0].0.status, HealthStatus::Passing);
    s.mark_check_synced("c", p.checks[0].1);
    assert!(s.pending().is_empty());
}

#[test]
fn removals_are_queued_and_a_service_takes_its_checks() {
    let s = LocalState::new("n1");
    s.apply(
        vec![svc("a")],
        vec![
            check("c", "a", HealthStatus::Passing),
            check("node", "", HealthStatus::Passing),
        ],
        &[],
    );
    assert_eq!(s.remove_service("a"), Some(vec!["c".to_owned()]));
    assert!(s.remove_service("a").is_none());
    let p = s.pending();
    assert_eq!(p.deleted_services, vec!["a"]);
    assert!(
        p.deleted_checks.is_empty(),
        "the catalog drops a service's checks with it"
    );
    assert!(s.remove_check("node"));
    assert_eq!(s.pending().deleted_checks, vec!["node"]);
    // Registering again cancels the pending removal.
    s.apply(vec![svc("a")], vec![], &[]);
    assert!(s.pending().deleted_services.is_empty());
}

#[test]
fn reconcile_marks_differences_and_queues_foreign_entries() {
    let s = LocalState::new("n1");
    s.apply(
        vec![svc("a"), svc("b")],
        vec![check("ca", "a", HealthStatus::Passing)],
        &[],
    );
    let mut remote_a = s.service("a").unwrap().service;
    remote_a.modify_index = structs::Index(9);
    let mut remote_b = s.service("b").unwrap().service;
    remote_b.port = 81;
    let stray = NodeService {
        id: "stray".into(),
        service: "x".into(),
        ..NodeService::default()
    };
    let mut remote_ca = s.check("ca").unwrap().check;
    remote_ca.service_name = "web".into();
    let liveness = HealthCheck {
        check_id: "serfHealth".into(),
        ..HealthCheck::default()
    };
    let stray_check = HealthCheck {
        check_id: "stray-check".into(),
        service_id: "stray".into(),
        ..HealthCheck::default()
    };
    let foreign_node_check = HealthCheck {
        check_id: "other".into(),
        ..HealthCheck::default()
    };
    s.reconcile(
        &[remote_a, remote_b, stray],
        &[remote_ca, liveness, stray_check, foreign_node_check],
        &["serfHealth"],
    );
    let p = s.pending();
    let ids: Vec<&str> = p.services.iter().map(|(s, ..)| s.id.as_str()).collect();
    assert_eq!(ids, ["b"], "a is equal apart from indexes, b differs");
    assert!(p.checks.is_empty());
    assert_eq!(p.deleted_services, ["stray"]);
    assert_eq!(
        p.deleted_checks,
        ["other"],
        "the liveness check and the stray service's checks stay"
    );
}

#[test]
fn output_is_capped_and_unchanged_updates_are_no_ops() {
    let s = LocalState::new("n1");
    s.apply(vec![], vec![check("c", "", HealthStatus::Critical)], &[]);
    let mut rx = s.subscribe();
    rx.borrow_and_update();
    let long = "é".repeat(MAX_OUTPUT);
    assert!(s.update_check("c", HealthStatus::Passing, long));
    assert!(s.check("c").unwrap().check.output.len() <= MAX_OUTPUT);
    assert!(rx.has_changed().unwrap());
    rx.borrow_and_update();
    let out = s.check("c").unwrap().check.output;
    assert!(s.update_check("c", HealthStatus::Passing, out));
    assert!(!rx.has_changed().unwrap());
    // New output under the same status is kept, but waits for the next full sync.
    let before = s.pending();
    assert!(s.update_check("c", HealthStatus::Passing, "new output".into()));
    assert_eq!(s.check("c").unwrap().check.output, "new output");
    assert!(!rx.has_changed().unwrap());
    assert_eq!(s.pending().checks.len(), before.checks.len());
    assert!(!s.update_check("missing", HealthStatus::Passing, String::new()));
    assert!(s.check("c").unwrap().critical_since.is_none());
    // A check's own OutputMaxSize, when smaller, is its limit.
    let def: CheckType = structs::json::from_value(serde_json::json!({"TTL": "1s", "OutputMaxSize": 10})).unwrap();
    s.apply(
        vec![],
        vec![LocalCheck::new(
            HealthCheck {
                check_id: "small".into(),
                output: "0123456789abcdef".into(),
                ..HealthCheck::default()
            },
            Some(def),
            None,
            Source::Api,
        )],
        &[],
    );
    assert_eq!(s.check("small").unwrap().check.output, "0123456789");
    s.update_check("small", HealthStatus::Passing, "abcdefghijklmnop".into());
    assert_eq!(s.check("small").unwrap().check.output, "abcdefghij");
}

#[test]
fn followers_of_the_services_are_woken_by_service_changes_only() {
    let s = LocalState::new("n1");
    let (mut all, mut services) = (s.subscribe(), s.subscribe_services());
    s.apply(vec![svc("a")], vec![check("c", "a", HealthStatus::Critical)], &[]);
    assert!(all.has_changed().unwrap() && services.has_changed().unwrap());
    all.borrow_and_update();
    services.borrow_and_update();
    // A check's report, a check added alone, a check removed: not the services.
    assert!(s.update_check("c", HealthStatus::Passing, "ok".into()));
    s.apply(Vec::new(), vec![check("d", "a", HealthStatus::Passing)], &[]);
    assert!(s.remove_check("d"));
    assert!(all.has_changed().unwrap());
    assert!(!services.has_changed().unwrap());
    all.borrow_and_update();
    // Tags the catalog holds for an EnableTagOverride service are adopted: a service change.
    let mut tagged = svc("t");
    tagged.service.enable_tag_override = true;
    s.apply(vec![tagged], Vec::new(), &[]);
    services.borrow_and_update();
    let remote = NodeService {
        tags: vec!["from-the-catalog".into()],
        ..s.service("t").unwrap().service
    };
    s.reconcile(&[remote], &[], &[]);
    assert!(services.has_changed().unwrap());
    assert_eq!(s.service("t").unwrap().service.tags, ["from-the-catalog"]);
    services.borrow_and_update();
    assert!(s.remove_service("a").is_some());
    assert!(services.has_changed().unwrap());
    let proxies = s.services_where(|l| l.service.id == "t");
    assert_eq!(proxies.len(), 1);
}

#[test]
fn sidecars_are_found_by_their_parent_through_replacements_and_removals() {
    let s = LocalState::new("n1");
    let sidecar = |id: &str, parent: &str| {
        let mut l = svc(id);
        l.sidecar_of = Some(parent.into());
        l
    };
    s.apply(
        vec![
            svc("web"),
            svc("api"),
            sidecar("web-proxy", "web"),
            sidecar("web-extra", "web"),
        ],
        Vec::new(),
        &[],
    );
    assert_eq!(s.sidecars_of("web"), ["web-extra", "web-proxy"]);
    assert!(s.sidecars_of("api").is_empty());
    // Registered again for the same parent, then moved to another.
    s.apply(vec![sidecar("web-proxy", "web")], Vec::new(), &[]);
    assert_eq!(s.sidecars_of("web"), ["web-extra", "web-proxy"]);
    s.apply(vec![sidecar("web-proxy", "api")], Vec::new(), &[]);
    assert_eq!(s.sidecars_of("web"), ["web-extra"]);
    assert_eq!(s.sidecars_of("api"), ["web-proxy"]);
    // Replaced by a service that is no sidecar, then removed.
    s.apply(vec![svc("web-extra")], Vec::new(), &[]);
    assert!(s.sidecars_of("web").is_empty());
    assert!(s.remove_service("web-proxy").is_some());
    assert!(s.sidecars_of("api").is_empty());
}

#[test]
fn a_services_checks_are_found_through_moves_and_removals() {
    let s = LocalState::new("n1");
    s.apply(
        vec![svc("a"), svc("b")],
        vec![
            check("a1", "a", HealthStatus::Passing),
            check("a2", "a", HealthStatus::Critical),
            check("n1", "", HealthStatus::Passing),
        ],
        &[],
    );
    let ids = |checks: Vec<HealthCheck>| checks.into_iter().map(|c| c.check_id).collect::<Vec<_>>();
    assert_eq!(ids(s.service_checks("a")), ["a1", "a2"]);
    assert_eq!(ids(s.service_checks("")), ["n1"]);
    // The same check id registered again for another service moves with it.
    s.apply(Vec::new(), vec![check("a2", "b", HealthStatus::Passing)], &[]);
    assert_eq!(ids(s.service_checks("a")), ["a1"]);
    assert_eq!(
        s.checks_of(&["a".into(), "b".into()]).into_keys().collect::<Vec<_>>(),
        ["a1", "a2"]
    );
    assert_eq!(s.remove_service("b").unwrap(), ["a2"]);
    assert!(s.service_checks("b").is_empty());
    assert!(s.remove_check("a1"));
    assert!(s.service_checks("a").is_empty());
    assert_eq!(s.counts(), (1, 1));
}

#[test]
fn selections_copy_only_what_they_select() {
    let s = LocalState::new("n1");
    let mut from_config = svc("b");
    from_config.source = Source::Config;
    s.apply(
        vec![svc("a"), from_config],
        vec![
            check("a1", "a", HealthStatus::Passing),
            check("gone1", "gone", HealthStatus::Passing),
            check("n1", "", HealthStatus::Passing),
        ],
        &[],
    );
    assert_eq!(s.service_ids_where(|l| l.source == Source::Config), ["b"]);
    let node_checks = s.checks_where(|c| c.check.service_id.is_empty());
    assert_eq!(node_checks.len(), 1);
    assert_eq!(node_checks[0].check.check_id, "n1");
    let orphans = s.orphan_checks();
    assert_eq!(orphans.len(), 1);
    assert_eq!(orphans[0].check.check_id, "gone1");
}
