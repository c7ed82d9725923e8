//! Store behaviour: writes and indexes, blocking waits, the publisher, persistence.
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use ::catalog::*;
use std::{sync::Arc, time::Duration};
use structs::acl;
use structs::config_entry::{IntentionAction, ServiceDefaults};
use structs::*;

async fn mem_store() -> Store {
    Store::open(StoreConfig::default()).await.unwrap()
}

async fn disk_store(dir: &std::path::Path, snapshot_every: u64) -> Store {
    Store::open(StoreConfig {
        data_dir: Some(dir.to_owned()),
        snapshot_every,
        ..StoreConfig::default()
    })
    .await
    .unwrap()
}

fn register(node: &str, addr: &str, svc: Option<NodeService>, checks: Vec<HealthCheck>) -> Op {
    Op::Register(Box::new(RegisterRequest {
        node: node.into(),
        address: addr.into(),
        service: svc,
        checks,
        ..Default::default()
    }))
}

fn service(name: &str, port: u16) -> NodeService {
    NodeService {
        service: name.into(),
        port,
        ..Default::default()
    }
}

fn sidecar(dest: &str, port: u16) -> NodeService {
    NodeService {
        kind: ServiceKind::ConnectProxy,
        id: format!("{dest}-sidecar-proxy"),
        service: format!("{dest}-sidecar-proxy"),
        port,
        proxy: ConnectProxyConfig {
            destination_service_name: dest.into(),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn check(id: &str, service_id: &str, status: HealthStatus) -> HealthCheck {
    HealthCheck {
        check_id: id.into(),
        service_id: service_id.into(),
        status,
        ..Default::default()
    }
}

#[tokio::test]
async fn writes_get_increasing_indexes_and_rows_remember_them() {
    let store = mem_store().await;
    let base = store.read().index;
    let a = store
        .write(register("n1", "10.0.0.1", Some(service("api", 8080)), vec![]))
        .await
        .unwrap();
    assert_eq!(
        a,
        WriteOutcome {
            index: base.next(),
            applied: true
        }
    );
    let b = store
        .write(register("n1", "10.0.0.1", Some(sidecar("api", 21000)), vec![]))
        .await
        .unwrap();
    assert_eq!(b.index, a.index.next());
    // Repeating a registration changes nothing and does not advance the index.
    let same = store
        .write(register("n1", "10.0.0.1", Some(sidecar("api", 21000)), vec![]))
        .await
        .unwrap();
    assert_eq!(same.index, b.index);

    let state = store.read();
    assert_eq!(state.index, b.index);
    let node = state.node("n1").unwrap();
    assert_eq!((node.create_index, node.modify_index), (a.index, a.index));
    let api = state.service("n1", "api").unwrap();
    assert_eq!(api.create_index, a.index);
    assert_eq!(state.index_of(&IndexKey::Service("api".into())), a.index);
    assert_eq!(state.index_of(&IndexKey::ServiceConnect("api".into())), b.index);
    assert_eq!(state.health("api", true)[0].service.id, "api-sidecar-proxy");
    assert!(state.index_of(&IndexKey::Service("nothing".into())) >= Index(1));
}

#[tokio::test]
async fn health_combines_node_and_service_checks_and_deregister_cascades() {
    let store = mem_store().await;
    store
        .write(register(
            "n1",
            "10.0.0.1",
            Some(service("api", 8080)),
            vec![
                check("serfHealth", "", HealthStatus::Passing),
                check("api-http", "api", HealthStatus::Critical),
            ],
        ))
        .await
        .unwrap();
    let health = store.read().health("api", false);
    assert_eq!(health.len(), 1);
    assert_eq!(health[0].checks.len(), 2);
    assert_eq!(health[0].aggregate_status(), HealthStatus::Critical);
    assert_eq!(store.read().service_checks("api")[0].service_name, "api");

    // A check for a service the node does not have is refused, and changes nothing.
    let before = store.read().index;
    let err = store
        .write(register(
            "n1",
            "10.0.0.1",
            None,
            vec![check("x", "nope", HealthStatus::Passing)],
        ))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Checks[0].ServiceID: no service \"nope\" on node \"n1\""
    );
    assert_eq!(store.read().index, before);

    store
        .write(Op::Deregister(DeregisterRequest {
            node: "n1".into(),
            service_id: "api".into(),
            ..Default::default()
        }))
        .await
        .unwrap();
    let state = store.read();
    assert!(state.service("n1", "api").is_none());
    assert!(
        state.check("n1", "api-http").is_none(),
        "the service's checks go with it"
    );
    assert!(state.check("n1", "serfHealth").is_some(), "node checks stay");
    store
        .write(Op::Deregister(DeregisterRequest {
            node: "n1".into(),
            ..Default::default()
        }))
        .await
        .unwrap();
    assert!(store.read().node("n1").is_none());
    assert_eq!(store.read().all_checks().count(), 0);
}

#[tokio::test]
async fn config_entries_with_cas() {
    let store = mem_store().await;
    let entry = |protocol: &str| {
        ConfigEntry::ServiceDefaults(ServiceDefaults {
            name: "api".into(),
            protocol: protocol.into(),
            ..Default::default()
        })
    };
    let set = |e, cas| Op::ConfigSet {
        entry: Box::new(e),
        cas,
    };
    assert!(store.write(set(entry("http"), Some(Index(0)))).await.unwrap().applied);
    assert!(
        !store.write(set(entry("grpc"), Some(Index(0)))).await.unwrap().applied,
        "cas 0 only creates"
    );
    let current = store
        .read()
        .config_entry(ConfigEntryKind::ServiceDefaults, "api")
        .unwrap();
    assert!(!store.write(set(entry("grpc"), Some(Index(1)))).await.unwrap().applied);
    assert!(
        store
            .write(set(entry("grpc"), Some(current.modify_index())))
            .await
            .unwrap()
            .applied
    );
    let err = store.write(set(entry("udp"), None)).await.unwrap_err();
    assert!(matches!(err, WriteError::Invalid(_)));
    let del = |cas| Op::ConfigDelete {
        kind: ConfigEntryKind::ServiceDefaults,
        name: "api".into(),
        cas,
    };
    assert!(!store.write(del(Some(Index(1)))).await.unwrap().applied);
    assert!(store.write(del(None)).await.unwrap().applied);
    assert!(
        store
            .read()
            .config_entry(ConfigEntryKind::ServiceDefaults, "api")
            .is_none()
    );
}

#[tokio::test]
async fn intentions_through_the_legacy_exact_api() {
    let store = mem_store().await;
    let upsert = |src: &str, action| Op::IntentionUpsert {
        source: src.into(),
        destination: "api".into(),
        action: Some(action),
        permissions: vec![],
        description: String::new(),
        meta: Default::default(),
        create: false,
    };
    store.write(upsert("web", IntentionAction::Allow)).await.unwrap();
    store.write(upsert("*", IntentionAction::Deny)).await.unwrap();
    let ixns = store.read().intentions_for_destination("api");
    assert_eq!(
        ixns.iter()
            .map(|i| (i.source_name.as_str(), i.precedence))
            .collect::<Vec<_>>(),
        vec![("web", 9), ("*", 8)]
    );
    assert!(intention::decide(&ixns, "web", "api", false).allowed);
    assert!(!intention::decide(&ixns, "db", "api", true).allowed);
    let err = store
        .write(Op::IntentionUpsert {
            source: "web".into(),
            destination: "api".into(),
            action: None,
            permissions: vec![],
            description: String::new(),
            meta: Default::default(),
            create: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "Action: required (or Permissions)");
    // A create of a pair that exists is refused with the write, and changes nothing.
    let create = Op::IntentionUpsert {
        source: "web".into(),
        destination: "api".into(),
        action: Some(IntentionAction::Deny),
        permissions: vec![],
        description: String::new(),
        meta: Default::default(),
        create: true,
    };
    let err = store.write(create).await.unwrap_err();
    assert!(
        err.to_string()
            .starts_with("SourceName: duplicate intention found: web => api"),
        "{err}"
    );
    let ixns = store.read().intentions_for_destination("api");
    assert!(intention::decide(&ixns, "web", "api", false).allowed, "unchanged");
    store
        .write(Op::IntentionDelete {
            source: "web".into(),
            destination: "api".into(),
        })
        .await
        .unwrap();
    store
        .write(Op::IntentionDelete {
            source: "*".into(),
            destination: "api".into(),
        })
        .await
        .unwrap();
    assert!(
        store
            .read()
            .config_entry(ConfigEntryKind::ServiceIntentions, "api")
            .is_none()
    );
}

#[tokio::test]
async fn blocking_wait_wakes_on_its_key_only() {
    let store = mem_store().await;
    store
        .write(register("n1", "10.0.0.1", Some(service("api", 8080)), vec![]))
        .await
        .unwrap();
    let key = IndexKey::Service("api".into());
    let after = store.read().index_of(&key);
    let waiter = {
        let store = store.clone();
        let key = key.clone();
        tokio::spawn(async move { store.wait(&key, after, Duration::from_secs(60)).await })
    };
    // A write to another service does not wake it.
    store
        .write(register("n2", "10.0.0.2", Some(service("db", 5432)), vec![]))
        .await
        .unwrap();
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    let w = store
        .write(register("n2", "10.0.0.2", Some(service("api", 8080)), vec![]))
        .await
        .unwrap();
    let state = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state.index_of(&key), w.index);
    assert_eq!(state.health("api", false).len(), 2);
}

#[tokio::test(start_paused = true)]
async fn blocking_wait_times_out_with_the_current_state() {
    let store = mem_store().await;
    let key = IndexKey::Service("api".into());
    let after = store.read().index_of(&key);
    let start = tokio::time::Instant::now();
    let state = store.wait(&key, after, Duration::from_secs(300)).await;
    assert_eq!(start.elapsed(), Duration::from_secs(300));
    assert_eq!(state.index_of(&key), after);
}

#[tokio::test(start_paused = true)]
async fn released_waiters_answer_at_once_and_later_waits_do_not_park() {
    let store = mem_store().await;
    let key = IndexKey::Service("api".into());
    let after = store.read().index_of(&key);
    let start = tokio::time::Instant::now();
    let parked: Vec<_> = (0..100)
        .map(|_| {
            let store = store.clone();
            let key = key.clone();
            tokio::spawn(async move { store.wait(&key, after, Duration::from_secs(600)).await })
        })
        .collect();
    tokio::task::yield_now().await;
    store.release_waiters();
    for p in parked {
        assert_eq!(p.await.unwrap().index_of(&key), after);
    }
    store.wait(&key, after, Duration::from_secs(600)).await;
    assert_eq!(start.elapsed(), Duration::ZERO, "no wait outlived the release");
}

#[tokio::test]
async fn publisher_sends_snapshot_then_changes_and_cuts_off_laggards() {
    let store = Store::open(StoreConfig {
        publish_buffer: 2,
        ..StoreConfig::default()
    })
    .await
    .unwrap();
    let mut sub = store.subscribe(Topic::ServiceHealth("api".into()));
    let Payload::Health(first) = sub.next().await.unwrap().payload else {
        panic!()
    };
    assert!(first.is_empty());
    let w = store
        .write(register("n1", "10.0.0.1", Some(service("api", 8080)), vec![]))
        .await
        .unwrap();
    let ev = sub.next().await.unwrap();
    assert_eq!(ev.index, w.index);
    let Payload::Health(now) = ev.payload else { panic!() };
    assert_eq!(now.len(), 1);
    // Writes elsewhere publish nothing on this topic.
    store
        .write(register("n9", "10.0.0.9", Some(service("db", 1)), vec![]))
        .await
        .unwrap();

    // Fall behind by more than the buffer: told to resubscribe, and a new subscription
    // starts from a fresh snapshot.
    for i in 0..5u16 {
        store
            .write(register("n1", "10.0.0.1", Some(service("api", 9000 + i)), vec![]))
            .await
            .unwrap();
    }
    assert!(matches!(sub.next().await, Err(SubscriptionError::Lagged(_))));
    let mut again = store.subscribe(Topic::ServiceHealth("api".into()));
    let Payload::Health(fresh) = again.next().await.unwrap().payload else {
        panic!()
    };
    assert_eq!(fresh[0].service.port, 9004);
    drop((sub, again));
    store
        .write(register("n1", "10.0.0.1", Some(service("api", 1)), vec![]))
        .await
        .unwrap();
    assert_eq!(store.subscribed_topics(), 0, "topics nobody listens to are dropped");
}

#[tokio::test]
async fn state_survives_reopen_and_the_index_keeps_increasing() {
    let dir = tempfile::tempdir().unwrap();
    let (trust_domain, last) = {
        let store = disk_store(dir.path(), 10_000).await;
        let mut last = Index(0);
        for i in 0..20u16 {
            last = store
                .write(register(
                    &format!("n{i}"),
                    "10.0.0.1",
                    Some(service("api", 8000 + i)),
                    vec![],
                ))
                .await
                .unwrap()
                .index;
        }
        store
            .write(Op::ConfigSet {
                entry: Box::new(ConfigEntry::ServiceDefaults(ServiceDefaults {
                    name: "api".into(),
                    protocol: "http".into(),
                    ..Default::default()
                })),
                cas: None,
            })
            .await
            .unwrap();
        let td = store.read().ca_roots().trust_domain;
        store.close().await;
        (td, last)
    };
    let store = disk_store(dir.path(), 10_000).await;
    let state = store.read();
    assert_eq!(state.health("api", false).len(), 20);
    assert_eq!(state.ca_roots().trust_domain, trust_domain, "the CA is not regenerated");
    assert!(state.config_entry(ConfigEntryKind::ServiceDefaults, "api").is_some());
    let next = store.write(register("late", "10.0.0.2", None, vec![])).await.unwrap();
    assert_eq!(next.index, state.index.next());
    assert!(next.index > last);
}

#[tokio::test]
async fn snapshots_compact_the_log() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = disk_store(dir.path(), 5).await;
        for i in 0..23u16 {
            store
                .write(register(
                    &format!("n{i}"),
                    "10.0.0.1",
                    Some(service("api", 8000 + i)),
                    vec![],
                ))
                .await
                .unwrap();
        }
        store.close().await;
    }
    // close() waited for the snapshot in progress.
    let names = || {
        let mut v: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    let files = names();
    assert!(files.iter().any(|n| n.starts_with("snapshot-")), "{files:?}");
    assert!(files.iter().filter(|n| n.starts_with("wal-")).count() <= 2, "{files:?}");
    let store = disk_store(dir.path(), 5).await;
    assert_eq!(store.read().health("api", false).len(), 23);
}

#[tokio::test]
async fn torn_tail_is_cut_and_damage_elsewhere_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = disk_store(dir.path(), 10_000).await;
        store
            .write(register("n1", "10.0.0.1", Some(service("api", 1)), vec![]))
            .await
            .unwrap();
        store.close().await;
    }
    let wal = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_str().unwrap().starts_with("wal-"))
        .unwrap();
    let good = std::fs::read(&wal).unwrap();
    // A crash mid-append leaves a partial frame: cut off, everything before it kept.
    let mut torn = good.clone();
    torn.extend_from_slice(&[200, 0, 0, 0, 1, 2, 3]);
    std::fs::write(&wal, &torn).unwrap();
    {
        let store = disk_store(dir.path(), 10_000).await;
        assert!(store.read().service("n1", "api").is_some());
        store.close().await;
    }
    assert_eq!(std::fs::read(&wal).unwrap(), good);
    // Damage inside a record is refused, not skipped.
    let mut bad = good.clone();
    bad[10] ^= 0xff;
    std::fs::write(&wal, &bad).unwrap();
    // (A later segment exists, so this one is not the newest: its tail is not a torn write.)
    std::fs::write(dir.path().join("wal-00000000000000000099.log"), b"").unwrap();
    let err = Store::open(StoreConfig {
        data_dir: Some(dir.path().to_owned()),
        ..StoreConfig::default()
    })
    .await
    .unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
}

#[tokio::test]
async fn a_data_dir_has_one_owner() {
    let dir = tempfile::tempdir().unwrap();
    let first = disk_store(dir.path(), 10_000).await;
    let err = Store::open(StoreConfig {
        data_dir: Some(dir.path().to_owned()),
        ..StoreConfig::default()
    })
    .await
    .unwrap_err();
    assert!(matches!(err, StoreError::Locked(_)), "{err}");
    first.close().await;
}

#[tokio::test]
async fn leaves_are_reused_until_the_ca_changes() {
    let store = mem_store().await;
    let a = store.leaf("web").unwrap();
    assert!(Arc::ptr_eq(&a, &store.leaf("web").unwrap()));
    assert_ne!(a.serial_number, store.leaf("api").unwrap().serial_number);
    store
        .write(Op::CaConfigure(ca::CaConfig {
            private_key_bits: 384,
            ..ca::CaConfig::default()
        }))
        .await
        .unwrap();
    let b = store.leaf("web").unwrap();
    assert_ne!(a.serial_number, b.serial_number);
    let roots = store.read().ca_roots();
    assert_eq!(roots.roots.len(), 2, "the old root stays trusted");
    assert!(b.cert_pem.contains("BEGIN CERTIFICATE"));
}

#[tokio::test]
async fn leaves_with_other_dns_sans_are_other_certificates() {
    let store = mem_store().await;
    let sans = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let plain = store.leaf("ing").unwrap();
    let a = store.leaf_with_sans("ing", &sans(&["a.example", "b.example"])).unwrap();
    assert_ne!(plain.serial_number, a.serial_number);
    // The same set in another order is the same certificate.
    let again = store.leaf_with_sans("ing", &sans(&["b.example", "a.example"])).unwrap();
    assert!(Arc::ptr_eq(&a, &again));
    let b = store.leaf_with_sans("ing", &sans(&["a.example"])).unwrap();
    assert_ne!(a.serial_number, b.serial_number);
    assert!(Arc::ptr_eq(&plain, &store.leaf("ing").unwrap()));
    let err = store.leaf_with_sans("ing", &sans(&["not a name"])).unwrap_err();
    assert!(matches!(err, WriteError::Ca(ca::CaError::InvalidDnsSan(_))), "{err}");
}

#[tokio::test]
async fn subscribers_of_one_topic_share_one_payload_until_it_changes() {
    let store = mem_store().await;
    store
        .write(register("n1", "10.0.0.1", Some(service("api", 8080)), vec![]))
        .await
        .unwrap();
    let health = |ev: Event| match ev.payload {
        Payload::Health(h) => h,
        other => panic!("{other:?}"),
    };
    let mut a = store.subscribe(Topic::ServiceHealth("api".into()));
    let mut b = store.subscribe(Topic::ServiceHealth("api".into()));
    let (ha, hb) = (health(a.next().await.unwrap()), health(b.next().await.unwrap()));
    assert!(Arc::ptr_eq(&ha, &hb), "one computed snapshot for both subscribers");
    // A change: the published value is what the next subscriber starts from.
    store
        .write(register("n2", "10.0.0.2", Some(service("api", 8080)), vec![]))
        .await
        .unwrap();
    let published = health(a.next().await.unwrap());
    assert_eq!(published.len(), 2);
    let mut c = store.subscribe(Topic::ServiceHealth("api".into()));
    assert!(Arc::ptr_eq(&published, &health(c.next().await.unwrap())));
    // A write elsewhere bumps nothing here: still the same value.
    store
        .write(register("n9", "10.0.0.9", Some(service("db", 1)), vec![]))
        .await
        .unwrap();
    let mut d = store.subscribe(Topic::ServiceHealth("api".into()));
    let hd = health(d.next().await.unwrap());
    assert!(Arc::ptr_eq(&published, &hd));
    drop(b);
}

#[tokio::test]
async fn an_unreadable_snapshot_is_refused_by_name_unless_the_log_covers_it() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = disk_store(dir.path(), 5).await;
        for i in 0..10u16 {
            store
                .write(register(
                    &format!("n{i}"),
                    "10.0.0.1",
                    Some(service("api", 8000 + i)),
                    vec![],
                ))
                .await
                .unwrap();
        }
        store.close().await;
    }
    let snapshots: Vec<std::path::PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with("snapshot-"))
        .collect();
    assert_eq!(snapshots.len(), 1, "{snapshots:?}");
    // Damage the only snapshot: the log no longer holds what it covered.
    std::fs::write(&snapshots[0], b"{ not a snapshot").unwrap();
    let err = Store::open(StoreConfig {
        data_dir: Some(dir.path().to_owned()),
        snapshot_every: 5,
        ..StoreConfig::default()
    })
    .await
    .expect_err("a damaged snapshot must not open as less");
    let text = err.to_string();
    assert!(
        text.contains(snapshots[0].file_name().unwrap().to_str().unwrap()),
        "names the file: {text}"
    );
    assert!(text.contains("lose acknowledged writes"), "{text}");
}

/// ACL tokens, policies, roles and the bootstrap survive a reopen, from the log and from a
/// snapshot, and the secret index is rebuilt.
#[tokio::test]
async fn acls_survive_reopen_from_the_log_and_from_a_snapshot() {
    for snapshot_every in [10_000, 2] {
        let dir = tempfile::tempdir().unwrap();
        let secret = "1f0e2d3c-4b5a-4968-8776-a5b4c3d2e1f0";
        {
            let store = disk_store(dir.path(), snapshot_every).await;
            store
                .write(Op::AclBootstrap {
                    accessor: "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d".into(),
                    secret: secret.into(),
                })
                .await
                .unwrap();
            store
                .write(Op::AclPolicySet {
                    policy: Box::new(acl::AclPolicy {
                        id: "p-1".into(),
                        name: "readers".into(),
                        rules: "service_prefix \"\" { policy = \"read\" }".into(),
                        ..Default::default()
                    }),
                    create: true,
                })
                .await
                .unwrap();
            store
                .write(Op::AclRoleSet {
                    role: Box::new(acl::AclRole {
                        id: "r-1".into(),
                        name: "ops".into(),
                        policies: vec![acl::Link {
                            id: String::new(),
                            name: "readers".into(),
                        }],
                        ..Default::default()
                    }),
                    create: true,
                })
                .await
                .unwrap();
            // Past the snapshot threshold: a write after the snapshot lands in the log.
            for i in 0..3u16 {
                store
                    .write(register(&format!("n{i}"), "10.0.0.1", None, vec![]))
                    .await
                    .unwrap();
            }
            store.close().await;
        }
        let store = disk_store(dir.path(), snapshot_every).await;
        let state = store.read();
        let token = state.acl_token_by_secret(secret).expect("the bootstrap token");
        assert_eq!(token.policies[0].name, acl::GLOBAL_MANAGEMENT_NAME);
        assert!(state.acl_policy_by_name("readers").is_some());
        assert_eq!(state.acl_role_by_name("ops").unwrap().policies[0].id, "p-1");
        assert!(state.acl_bootstrapped().is_some());
        let again = store
            .write(Op::AclBootstrap {
                accessor: "0b1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d".into(),
                secret: "2f0e2d3c-4b5a-4968-8776-a5b4c3d2e1f0".into(),
            })
            .await;
        assert!(matches!(again, Err(WriteError::Forbidden(_))), "{again:?}");
        let resolver = ::catalog::acl::Resolver::new(::catalog::acl::AclSettings {
            enabled: true,
            default_allow: false,
            datacenter: "dc1".into(),
        });
        assert!(
            resolver
                .resolve(&state, structs::Token::new(secret).as_ref())
                .unwrap()
                .authz
                .acl_write()
        );
    }
}

/// Auth methods and binding rules survive a reopen (log and snapshot); a rule needs its
/// method; deleting a method deletes its rules and its logins' tokens in the same write,
/// and leaves every other token.
#[tokio::test]
async fn auth_methods_and_rules_survive_reopen_and_a_method_delete_takes_its_logins() {
    let method = || acl::AclAuthMethod {
        name: "idp".into(),
        kind: "jwt".into(),
        ..Default::default()
    };
    let rule = |id: &str, method: &str| acl::AclBindingRule {
        id: id.into(),
        auth_method: method.into(),
        bind_type: "service".into(),
        bind_name: "web".into(),
        ..Default::default()
    };
    let token = |accessor: &str, method: &str| acl::AclToken {
        accessor_id: accessor.into(),
        secret_id: format!("{accessor}-secret"),
        service_identities: vec![acl::ServiceIdentity {
            service_name: "web".into(),
            datacenters: vec![],
        }],
        auth_method: method.into(),
        ..Default::default()
    };
    for snapshot_every in [10_000, 2] {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = disk_store(dir.path(), snapshot_every).await;
            let orphan = store
                .write(Op::AclBindingRuleSet {
                    rule: Box::new(rule("r-0", "idp")),
                    create: true,
                })
                .await;
            assert!(format!("{orphan:?}").contains("AuthMethod"), "{orphan:?}");
            store
                .write(Op::AclAuthMethodSet {
                    method: Box::new(method()),
                    create: true,
                })
                .await
                .unwrap();
            store
                .write(Op::AclBindingRuleSet {
                    rule: Box::new(rule("r-1", "idp")),
                    create: true,
                })
                .await
                .unwrap();
            for i in 0..3u16 {
                store
                    .write(register(&format!("n{i}"), "10.0.0.1", None, vec![]))
                    .await
                    .unwrap();
            }
            store.close().await;
        }
        let store = disk_store(dir.path(), snapshot_every).await;
        let state = store.read();
        assert_eq!(state.acl_auth_method("idp").unwrap().kind, "jwt");
        assert_eq!(state.acl_binding_rule("r-1").unwrap().auth_method, "idp");
        let changed = store
            .write(Op::AclAuthMethodSet {
                method: Box::new(acl::AclAuthMethod {
                    kind: "kubernetes".into(),
                    ..method()
                }),
                create: false,
            })
            .await;
        assert!(format!("{changed:?}").contains("Type"), "{changed:?}");
        for (accessor, by) in [
            ("11111111-1111-4111-8111-111111111111", "idp"),
            ("22222222-2222-4222-8222-222222222222", ""),
        ] {
            store
                .write(Op::AclTokenSet {
                    token: Box::new(token(accessor, by)),
                    create: true,
                    ttl: None,
                })
                .await
                .unwrap();
        }
        let before = store.read().index;
        store
            .write(Op::AclAuthMethodDelete { name: "idp".into() })
            .await
            .unwrap();
        let state = store.read();
        assert_eq!(state.index.0, before.0 + 1, "one write");
        assert!(state.acl_auth_method("idp").is_none());
        assert!(state.acl_binding_rule("r-1").is_none());
        assert!(state.acl_token("11111111-1111-4111-8111-111111111111").is_none());
        assert!(state.acl_token("22222222-2222-4222-8222-222222222222").is_some());
    }
}

/// Churn of names leaves no per-key index behind, and a gone object's key answers with its
/// table's index (never going backwards, so a blocking query on it sees the removal).
#[tokio::test]
async fn churned_names_leave_no_index_entries_behind() {
    let store = mem_store().await;
    store
        .write(register("keep", "10.0.0.1", Some(service("web", 80)), vec![]))
        .await
        .unwrap();
    let base = store.read().index_key_count();
    let mut removed_at = Index(0);
    for i in 0..200 {
        let node = format!("churn-{i}");
        store
            .write(register(
                &node,
                "10.0.0.2",
                Some(service(&format!("svc-{i}"), 80)),
                vec![],
            ))
            .await
            .unwrap();
        let during = store.read().index_of(&IndexKey::Node(node.clone()));
        removed_at = store
            .write(Op::Deregister(DeregisterRequest {
                node: node.clone(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .index;
        let state = store.read();
        let after = state.index_of(&IndexKey::Node(node));
        assert!(
            after >= removed_at && after > during,
            "the gone node's index moved forward"
        );
        assert!(state.index_of(&IndexKey::Service(format!("svc-{i}"))) >= removed_at);
    }
    assert_eq!(store.read().index_key_count(), base, "no entry per churned name");
    assert!(removed_at > Index(400));
}

#[tokio::test]
async fn kv_sessions_and_locks_survive_reopen_from_the_log_and_from_a_snapshot() {
    for snapshot_every in [10_000, 2] {
        let dir = tempfile::tempdir().unwrap();
        let (prefix_index, tombstoned) = {
            let store = disk_store(dir.path(), snapshot_every).await;
            store.write(register("n1", "10.0.0.1", None, vec![])).await.unwrap();
            let session = structs::session::Session {
                id: "s1".into(),
                node: "n1".into(),
                ttl: "30s".into(),
                renewed_at_ms: 1_000,
                ..Default::default()
            };
            store.write(Op::SessionCreate(Box::new(session))).await.unwrap();
            for key in ["app/a", "app/b"] {
                let set = Op::KvSet {
                    key: key.into(),
                    value: b"v".to_vec(),
                    flags: 9,
                    cas: None,
                };
                store.write(set).await.unwrap();
            }
            let lock = Op::KvLock {
                entry: Box::new(KvEntry {
                    key: "app/lock".into(),
                    value: b"held".to_vec(),
                    ..Default::default()
                }),
                session: "s1".into(),
                now_ms: 2_000,
            };
            assert!(store.write(lock).await.unwrap().applied);
            let delete = Op::KvDelete {
                key: "app/b".into(),
                cas: None,
            };
            let deleted = store.write(delete).await.unwrap().index;
            let state = store.read();
            let prefix_index = state.kv_prefix_index("app/");
            assert_eq!(prefix_index, deleted);
            store.close().await;
            (prefix_index, deleted)
        };
        let store = disk_store(dir.path(), snapshot_every).await;
        let state = store.read();
        assert_eq!(state.kv_get("app/a").unwrap().flags, 9);
        assert!(state.kv_get("app/b").is_none());
        let lock = state.kv_get("app/lock").unwrap();
        assert_eq!((lock.session.as_str(), lock.lock_index), ("s1", 1));
        let held: Vec<&str> = state.kv_held_by("s1").map(|e| e.key.as_str()).collect();
        assert_eq!(held, ["app/lock"], "the held-keys index is rebuilt on reopen");
        let session = state.session("s1").unwrap();
        assert_eq!((session.ttl.as_str(), session.renewed_at_ms), ("30s", 1_000));
        // The delete's tombstone came back too: the prefix's index did not go backwards.
        assert_eq!(state.kv_prefix_index("app/"), prefix_index);
        assert_eq!(prefix_index, tombstoned);
    }
}

#[tokio::test]
async fn a_kv_prefix_wait_wakes_only_for_writes_under_the_prefix() {
    let store = mem_store().await;
    let set = |key: &str| Op::KvSet {
        key: key.into(),
        value: b"v".to_vec(),
        flags: 0,
        cas: None,
    };
    store.write(set("app/a")).await.unwrap();
    let mut rx = store.index_receiver(&IndexKey::KvPrefix("app/".into())).unwrap();
    let mut root = store.index_receiver(&IndexKey::KvPrefix(String::new())).unwrap();
    rx.borrow_and_update();
    root.borrow_and_update();
    for elsewhere in ["other/x", "ap", "app"] {
        store.write(set(elsewhere)).await.unwrap();
        assert!(
            !rx.has_changed().unwrap(),
            "a write to {elsewhere:?} woke the app/ prefix"
        );
        assert!(root.has_changed().unwrap(), "every write is under the root");
        root.borrow_and_update();
    }
    let written = store.write(set("app/b/c")).await.unwrap().index;
    assert!(rx.has_changed().unwrap());
    assert_eq!(*rx.borrow_and_update(), written);
    let deleted = store
        .write(Op::KvDelete {
            key: "app/a".into(),
            cas: None,
        })
        .await
        .unwrap()
        .index;
    assert_eq!(
        *rx.borrow_and_update(),
        deleted,
        "a delete under the prefix wakes it too"
    );
    assert_eq!(store.read().index_of(&IndexKey::KvPrefix("app/".into())), deleted);
    // A blocked wait returns on the write under the prefix.
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .wait(&IndexKey::KvPrefix("app/".into()), deleted, Duration::from_secs(30))
                .await
                .index
        })
    };
    tokio::task::yield_now().await;
    store.write(set("zzz")).await.unwrap();
    let under = store.write(set("app/new")).await.unwrap().index;
    assert_eq!(waiter.await.unwrap(), under);
}

#[tokio::test]
async fn connect_services_get_stable_virtual_ips_shown_on_their_instances() {
    let dir = tempfile::tempdir().unwrap();
    let vip = |state: &State, svc: &str| state.virtual_ip(svc).map(|ip| ip.to_string());
    {
        // Snapshots every 3 writes: the addresses come back from a snapshot and the log.
        let store = disk_store(dir.path(), 3).await;
        store
            .write(register("n1", "10.0.0.1", Some(service("web", 80)), vec![]))
            .await
            .unwrap();
        assert_eq!(vip(&store.read(), "web"), None, "no connect instance yet");
        let before = store.read().index_of(&IndexKey::ServiceConnect("web".into()));
        store
            .write(register("n1", "10.0.0.1", Some(sidecar("web", 21000)), vec![]))
            .await
            .unwrap();
        store
            .write(register("n2", "10.0.0.2", Some(sidecar("api", 21000)), vec![]))
            .await
            .unwrap();
        // A second instance of web: the same address.
        let mut second = sidecar("web", 21001);
        second.id = "web-sidecar-proxy-2".into();
        store
            .write(register("n2", "10.0.0.2", Some(second), vec![]))
            .await
            .unwrap();
        let state = store.read();
        assert_eq!(vip(&state, "web").as_deref(), Some("240.0.0.1"));
        assert_eq!(vip(&state, "api").as_deref(), Some("240.0.0.2"));
        assert!(state.index_of(&IndexKey::ServiceConnect("web".into())) > before);
        let instances = state.health("web", true);
        assert_eq!(instances.len(), 2);
        for csn in &instances {
            let tagged = &csn.service.tagged_addresses[catalog::virtual_ips::TAGGED_ADDRESS];
            assert_eq!(tagged.address, "240.0.0.1");
            assert_eq!(tagged.port, csn.service.port);
        }
        // The plain instances of web do not carry it; its sidecars' own listing does.
        assert!(state.health("web", false)[0].service.tagged_addresses.is_empty());
        // A registration without the tagged address (an agent's anti-entropy) is no change.
        let index = state.index;
        let again = store
            .write(register("n1", "10.0.0.1", Some(sidecar("web", 21000)), vec![]))
            .await
            .unwrap();
        assert_eq!(again.index, index, "nothing written");
        // Gone and back: the same address.
        store
            .write(Op::Deregister(DeregisterRequest {
                node: "n1".into(),
                ..Default::default()
            }))
            .await
            .unwrap();
        store.close().await;
    }
    let store = disk_store(dir.path(), 3).await;
    let state = store.read();
    assert_eq!(
        vip(&state, "web").as_deref(),
        Some("240.0.0.1"),
        "kept across a restart"
    );
    assert_eq!(vip(&state, "api").as_deref(), Some("240.0.0.2"));
    store
        .write(register("n3", "10.0.0.3", Some(sidecar("db", 21000)), vec![]))
        .await
        .unwrap();
    assert_eq!(vip(&store.read(), "db").as_deref(), Some("240.0.0.3"));
}

/// Audit records: committed with their write in the log (or nothing, for a write that
/// changes nothing), only the first write of a scope carries one, a refused write's record
/// is a write of its own, and the log keeps them across a restart.
#[tokio::test]
async fn audit_records_are_committed_with_their_writes_and_kept_across_a_restart() {
    use catalog::audit::{AuditOutcome, AuditScope};
    let dir = tempfile::tempdir().unwrap();
    let config = || StoreConfig {
        data_dir: Some(dir.path().to_owned()),
        ..StoreConfig::default()
    };
    let store = Store::open(config()).await.unwrap();
    let register = |node: &str| {
        Op::Register(Box::new(RegisterRequest {
            node: node.into(),
            address: "10.0.0.1".into(),
            ..RegisterRequest::default()
        }))
    };
    let record = || structs::audit::AuditRecord {
        path: "/v1/catalog/register".into(),
        accepted: true,
        ..Default::default()
    };
    let scope = AuditScope::new(record());
    let (first, second) = scope
        .run(async { (store.write(register("n1")).await, store.write(register("n2")).await) })
        .await;
    assert_eq!(
        scope.outcome(),
        AuditOutcome::Recorded {
            seq: 1,
            index: first.unwrap().index
        }
    );
    let unchanged = AuditScope::new(record());
    unchanged.run(store.write(register("n1"))).await.unwrap();
    assert_eq!(unchanged.outcome(), AuditOutcome::Unchanged { applied: true });
    let refused = AuditScope::new(structs::audit::AuditRecord {
        accepted: false,
        error: "no".into(),
        ..record()
    });
    refused.run(store.write(Op::AuditOnly)).await.unwrap();
    let AuditOutcome::Recorded { seq: 2, index } = refused.outcome() else {
        panic!("{:?}", refused.outcome());
    };
    assert!(index > second.unwrap().index);
    // Outside any scope nothing is recorded.
    store.write(register("n3")).await.unwrap();
    let kept = |s: &Store| -> Vec<(u64, bool)> { s.read().audit_records().map(|r| (r.seq, r.accepted)).collect() };
    assert_eq!(kept(&store), vec![(1, true), (2, false)]);
    store.close().await;
    let store = Store::open(config()).await.unwrap();
    assert_eq!(kept(&store), vec![(1, true), (2, false)]);
    store.close().await;
}

/// A process's own token (a server's agent's) resolves to its rules alone, is known to this
/// resolver only, and a default token stands in for requests naming none.
#[tokio::test]
async fn internal_and_default_tokens_resolve_as_set() {
    let store = mem_store().await;
    let state = store.read();
    let resolver = ::catalog::acl::Resolver::new(::catalog::acl::AclSettings {
        enabled: true,
        default_allow: false,
        datacenter: "dc1".into(),
    });
    let own = structs::Token::new("5e1f0c2d-1111-4222-8333-944455556666").unwrap();
    resolver
        .add_internal(
            own.clone(),
            "server-agent",
            "node \"s1\" { policy = \"write\" }\nservice_prefix \"\" { policy = \"read\" }",
        )
        .unwrap();
    assert!(resolver.is_internal(&own));
    let who = resolver.resolve(&state, Some(&own)).unwrap();
    assert_eq!(&*who.accessor, "server-agent");
    assert!(who.authz.node_write("s1") && !who.authz.node_write("s2"));
    assert!(who.authz.service_read("web") && !who.authz.service_write("web"));
    assert!(!who.authz.acl_read(), "nothing beyond its rules");
    let other = ::catalog::acl::Resolver::new(resolver.settings().clone());
    assert!(!other.is_internal(&own) && other.resolve(&state, Some(&own)).is_err());
    // No default token: anonymous (default deny); with one, requests naming none hold it.
    assert!(!resolver.resolve(&state, None).unwrap().authz.node_write("s1"));
    resolver.set_default_token(Some(own.clone()));
    assert!(resolver.resolve(&state, None).unwrap().authz.node_write("s1"));
    resolver.set_default_token(None);
    assert!(!resolver.resolve(&state, None).unwrap().authz.node_write("s1"));
}
