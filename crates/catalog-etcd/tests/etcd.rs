//! The etcd backend against a real etcd: several stores (as several servers would hold) on
//! one cluster.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use catalog::{IndexKey, Op, Store, StoreConfig, Topic, WriteError};
use catalog_etcd::EtcdConfig;
use std::time::Duration;
use structs::config_entry::ServiceDefaults;
use structs::{ConfigEntry, Index, NodeService, RegisterRequest};
use test_support::etcd::{CuttableLink, EtcdCluster};

async fn cluster(members: usize) -> EtcdCluster {
    tokio::task::spawn_blocking(move || EtcdCluster::start(members))
        .await
        .unwrap()
}

fn etcd_config(endpoints: Vec<String>, prefix: &str, name: &str) -> EtcdConfig {
    let mut etcd = EtcdConfig::new(endpoints);
    etcd.prefix = prefix.to_owned();
    etcd.server_name = name.to_owned();
    etcd.advertise = format!("{name}:8500");
    etcd.lease_ttl = Duration::from_secs(2);
    etcd.request_timeout = Duration::from_secs(4);
    etcd
}

fn store_config(etcd: EtcdConfig) -> StoreConfig {
    StoreConfig {
        backend: Some(std::sync::Arc::new(etcd)),
        ..StoreConfig::default()
    }
}

fn config(endpoints: Vec<String>, prefix: &str, name: &str) -> StoreConfig {
    store_config(etcd_config(endpoints, prefix, name))
}

async fn open(endpoints: Vec<String>, prefix: &str, name: &str) -> Store {
    Store::open(config(endpoints, prefix, name)).await.unwrap()
}

fn register(node: &str, service: &str) -> Op {
    Op::Register(Box::new(RegisterRequest {
        node: node.into(),
        address: "10.0.0.1".into(),
        service: Some(NodeService {
            service: service.into(),
            id: format!("{service}-{node}"),
            port: 8080,
            ..NodeService::default()
        }),
        ..RegisterRequest::default()
    }))
}

fn defaults(name: &str, protocol: &str, cas: Option<Index>) -> Op {
    Op::ConfigSet {
        entry: Box::new(ConfigEntry::ServiceDefaults(ServiceDefaults {
            name: name.into(),
            protocol: protocol.into(),
            ..ServiceDefaults::default()
        })),
        cas,
    }
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not within 10 s: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_on_one_etcd_share_writes_indexes_and_wake_each_others_waiters() {
    let etcd = cluster(1).await;
    let a = open(etcd.endpoints(), "/t1/", "a").await;
    let b = open(etcd.endpoints(), "/t1/", "b").await;
    assert_eq!(
        a.read().ca().unwrap().cluster_id,
        b.read().ca().unwrap().cluster_id,
        "one CA, created by whichever store started first"
    );
    let key = IndexKey::Service("web".into());
    let before = b.read().index_of(&key);
    let waiter = {
        let b = b.clone();
        let key = key.clone();
        tokio::spawn(async move { b.wait(&key, before, Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let written = a.write(register("n1", "web")).await.unwrap();
    assert!(written.applied);
    assert_eq!(
        a.read().index_of(&key),
        written.index,
        "the writer reads its own write at once"
    );
    let seen = waiter.await.unwrap();
    assert_eq!(
        seen.index_of(&key),
        written.index,
        "b's waiter woke with the same index"
    );
    assert_eq!(seen.service_instances("web").len(), 1);
    let svc = &b.read().service_instances("web")[0];
    assert_eq!(
        (svc.1.create_index, svc.1.modify_index),
        (written.index, written.index),
        "rows carry the revision of their write"
    );
    // Every store's subscriptions follow the other's writes too.
    let mut sub = b.subscribe(Topic::ServiceHealth("web".into()));
    let first = sub.next().await.unwrap();
    a.write(register("n2", "web")).await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .unwrap()
        .unwrap();
    assert!(next.index > first.index);
    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_and_set_raced_from_two_stores_applies_exactly_once() {
    let etcd = cluster(1).await;
    let a = open(etcd.endpoints(), "/t2/", "a").await;
    let b = open(etcd.endpoints(), "/t2/", "b").await;
    for round in 0..10 {
        let set = a.write(defaults("web", "http", None)).await.unwrap();
        let cas = Some(set.index);
        let (ra, rb) = tokio::join!(
            a.write(defaults("web", "grpc", cas)),
            b.write(defaults("web", "http2", cas))
        );
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        assert!(
            ra.applied ^ rb.applied,
            "round {round}: exactly one check-and-set applies ({ra:?}, {rb:?})"
        );
        let winner = if ra.applied { "grpc" } else { "http2" };
        for store in [&a, &b] {
            eventually("both stores agree on the winner", || {
                store
                    .read()
                    .config_entry(structs::ConfigEntryKind::ServiceDefaults, "web")
                    .is_some_and(|e| matches!(&*e, ConfigEntry::ServiceDefaults(d) if d.protocol == winner))
            })
            .await;
        }
    }
    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_and_indexes_never_go_back() {
    let etcd = cluster(1).await;
    let a = open(etcd.endpoints(), "/t3/", "a").await;
    let mut last = Index(0);
    for i in 0..50 {
        last = a.write(register(&format!("n{i}"), "api")).await.unwrap().index;
    }
    let served = a.read().index_of(&IndexKey::Service("api".into()));
    a.close().await;
    let again = open(etcd.endpoints(), "/t3/", "a2").await;
    assert_eq!(again.read().service_instances("api").len(), 50);
    assert!(again.read().index >= last);
    assert!(again.read().index_of(&IndexKey::Service("api".into())) >= served);
    again.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_watch_was_compacted_reloads_and_resets_its_subscribers() {
    let etcd = cluster(1).await;
    let link = CuttableLink::to(&etcd.endpoints()[0]).await;
    let a = open(vec![link.url()], "/t4/", "a").await;
    let b = open(etcd.endpoints(), "/t4/", "b").await;
    b.write(register("n0", "web")).await.unwrap();
    eventually("a sees the first write", || {
        a.read().service_instances("web").len() == 1
    })
    .await;
    let mut sub = a.subscribe(Topic::ServiceHealth("web".into()));
    let first = sub.next().await.unwrap();
    let served = a.read().index;
    // What a serves, sampled throughout the cut, the compaction and the reload: a reload
    // that replaced the state with an older one, or a reset through an empty state, shows
    // up here as a step down.
    let sampling = tokio::sync::watch::Sender::new(true);
    let sampler = {
        let (a, mut on) = (a.clone(), sampling.subscribe());
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while *on.borrow_and_update() {
                let s = a.read();
                seen.push((s.index, s.service_instances("web").len()));
                tokio::select! {
                    _ = on.changed() => {}
                    () = tokio::time::sleep(Duration::from_millis(2)) => {}
                }
            }
            seen
        })
    };

    // a loses etcd; meanwhile b writes, and etcd compacts every revision a has not seen.
    link.cut().await;
    let mut last = Index(0);
    for i in 1..20 {
        last = b.write(register(&format!("n{i}"), "web")).await.unwrap().index;
    }
    b.write(Op::Deregister(structs::DeregisterRequest {
        node: "n0".into(),
        ..Default::default()
    }))
    .await
    .unwrap();
    let mut client = etcd_client::Client::connect(etcd.endpoints(), None).await.unwrap();
    let now = client.get("/t4/", None).await.unwrap().header().unwrap().revision();
    client
        .compact(now, Some(etcd_client::CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    assert_eq!(a.read().index, served, "a is cut off");
    link.restore();

    let event = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match sub.next().await {
                Ok(e) if e.index >= last => return e,
                Ok(_) => {}
                Err(_) => sub = a.subscribe(Topic::ServiceHealth("web".into())),
            }
        }
    })
    .await
    .expect("the subscriber got the reloaded value");
    assert!(event.index > first.index);
    assert_eq!(a.etcd_reloads(), 1, "the compacted watch made a full reload");
    assert_eq!(b.etcd_reloads(), 0);
    sampling.send_replace(false);
    let seen = sampler.await.unwrap();
    assert!(seen.len() > 10, "sampled throughout: {} samples", seen.len());
    assert_eq!(seen[0].0, served);
    assert!(
        seen.windows(2)
            .all(|w| w[0].0 <= w[1].0 && (w[0].0 < w[1].0 || w[0].1 == w[1].1)),
        "the index a serves never went down, and the state never changed without it going up"
    );
    assert!(seen.iter().all(|(_, n)| *n >= 1), "never an empty catalog in between");
    let state = a.read();
    assert_eq!(
        state.service_instances("web").len(),
        19,
        "19 registered, n0 removed: nothing lost"
    );
    assert!(state.node("n0").is_none());
    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quorum_writes_fail_naming_etcd_reads_go_on_and_writes_resume_after() {
    let mut etcd = cluster(3).await;
    // A request timeout far longer than the failure takes: the write must not just time out.
    let mut e = etcd_config(etcd.endpoints(), "/t5/", "a");
    e.request_timeout = Duration::from_secs(10);
    let a = Store::open(store_config(e)).await.unwrap();
    a.write(register("n1", "web")).await.unwrap();
    tokio::task::block_in_place(|| etcd.kill(2));
    a.write(register("n2", "web"))
        .await
        .expect("one member down of three: writes go on");
    tokio::task::block_in_place(|| etcd.kill(1));
    let started = std::time::Instant::now();
    let err = a.write(register("n3", "web")).await.unwrap_err();
    assert!(matches!(err, WriteError::Storage(_)), "{err:?}");
    let cause = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    println!("without quorum, after {:?}: {cause}", started.elapsed());
    assert!(cause.contains("etcd"), "the error names etcd: {cause}");
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "fails soon after etcd has no leader (which etcd notices 1-2.5 s after the kill, later \
         on a loaded machine), not at the request timeout (10 s): {:?}",
        started.elapsed()
    );
    assert_eq!(
        a.read().service_instances("web").len(),
        2,
        "reads serve the last applied state"
    );

    tokio::task::block_in_place(|| {
        etcd.restart(1);
        etcd.restart(2);
    });
    let mut resumed = false;
    for _ in 0..100 {
        if a.write(register("n3", "web")).await.is_ok() {
            resumed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(resumed, "writes resume once quorum is back");
    eventually("the watch resumed too", || a.read().service_instances("web").len() == 3).await;
    a.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_store_leads_and_another_takes_over_when_it_leaves() {
    let etcd = cluster(1).await;
    let a = open(etcd.endpoints(), "/t6/", "a").await;
    let b = open(etcd.endpoints(), "/t6/", "b").await;
    let (ca, cb) = (a.cluster().unwrap().clone(), b.cluster().unwrap().clone());
    eventually("exactly one leads", || *ca.leading().borrow() ^ *cb.leading().borrow()).await;
    eventually("both see both servers and the leader", || {
        let (sa, sb) = (ca.status(), cb.status());
        sa.servers.len() == 2 && sa == sb && sa.leader.is_some()
    })
    .await;
    let (leader, other, other_cluster) = if *ca.leading().borrow() { (a, b, cb) } else { (b, a, ca) };
    leader.close().await;
    eventually("the other takes over", || *other_cluster.leading().borrow()).await;
    eventually("the one left is the only server", || {
        let s = other_cluster.status();
        s.servers.len() == 1 && s.leader.as_ref().is_some_and(|l| l.name == s.servers[0].name)
    })
    .await;
    other.close().await;
}

/// Removing rotated-out CA roots is leader work: a follower's pruner leaves them, the
/// leader's removes them, and every store follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_removes_rotated_out_ca_roots() {
    use catalog::ca_pruning::{CHECK_EVERY, RootPruner};
    let etcd = cluster(1).await;
    let a = open(etcd.endpoints(), "/t8/", "a").await;
    let b = open(etcd.endpoints(), "/t8/", "b").await;
    let (ca, cb) = (a.cluster().unwrap().clone(), b.cluster().unwrap().clone());
    eventually("exactly one leads", || *ca.leading().borrow() ^ *cb.leading().borrow()).await;
    let (leader, follower) = if *ca.leading().borrow() { (&a, &b) } else { (&b, &a) };
    // The rotation goes through the follower; both see the two roots.
    follower
        .write(Op::CaConfigure(catalog::ca::CaConfig {
            private_key_bits: 384,
            ..catalog::ca::CaConfig::default()
        }))
        .await
        .unwrap();
    for s in [&a, &b] {
        eventually("both roots everywhere", || s.read().ca().unwrap().roots.len() == 2).await;
    }
    let due = leader.read().ca().unwrap().next_prune_at().unwrap();
    let by_follower = RootPruner::with_clock(follower.clone(), CHECK_EVERY, move || due);
    assert!(!by_follower.prune_once().await, "a follower does not do leader work");
    assert_eq!(follower.read().ca().unwrap().roots.len(), 2);
    let by_leader = RootPruner::with_clock(leader.clone(), CHECK_EVERY, move || due);
    assert!(by_leader.prune_once().await);
    for s in [&a, &b] {
        eventually("the old root gone everywhere", || {
            s.read().ca().unwrap().roots.len() == 1
        })
        .await;
    }
    a.close().await;
    b.close().await;
}

/// The TTL etcd reports left on `lease` (whole seconds, rounded down).
async fn lease_left(client: &mut etcd_client::Client, lease: i64) -> i64 {
    client.lease_time_to_live(lease, None).await.unwrap().ttl()
}

/// A leader cut off from etcd for long enough to step down (over two thirds of its lease
/// TTL), but not long enough for its lease to expire, finds the leader key still on its
/// lease when it is back: it must lead again (before the fix nobody could lead until the
/// lease expired, which, renewed again, it never did).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_stepped_down_with_its_lease_alive_leads_again() {
    const TTL: Duration = Duration::from_secs(6);
    let etcd = cluster(1).await;
    let link = CuttableLink::to(&etcd.endpoints()[0]).await;
    let mut e = etcd_config(vec![link.url()], "/t7/", "a");
    e.lease_ttl = TTL;
    let a = Store::open(store_config(e)).await.unwrap();
    let ca = a.cluster().unwrap().clone();
    eventually("a leads", || *ca.leading().borrow()).await;
    let b = open(etcd.endpoints(), "/t7/", "b").await;
    let cb = b.cluster().unwrap().clone();
    eventually("b sees a lead", || cb.status().leader.is_some_and(|l| l.name == "a")).await;
    let mut client = etcd_client::Client::connect(etcd.endpoints(), None).await.unwrap();
    let resp = client.get("/t7/cluster/leader", None).await.unwrap();
    let lease = resp.kvs()[0].lease();

    // Cut right after a renewal (etcd's count of the lease's TTL goes up), so that a steps
    // down (at two thirds of the TTL) well before the lease could expire.
    let mut last = lease_left(&mut client, lease).await;
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = lease_left(&mut client, lease).await;
        if now > last {
            break;
        }
        last = now;
    }
    link.cut().await;
    let cut_at = std::time::Instant::now();
    tokio::time::timeout(TTL * 2, ca.leading().wait_for(|l| !*l))
        .await
        .expect("a cut-off leader steps down")
        .unwrap();
    let stepped_down = cut_at.elapsed();
    link.restore();
    assert!(
        stepped_down < TTL * 4 / 5,
        "a stepped down {stepped_down:?} after the cut, not before 0.8 of its TTL"
    );
    assert!(
        lease_left(&mut client, lease).await > 0,
        "a's lease is still alive (the scenario: stepped down, lease kept)"
    );
    eventually("a leads again on the lease it kept", || *ca.leading().borrow()).await;
    eventually("both name a as the leader", || {
        [ca.status(), cb.status()]
            .iter()
            .all(|s| s.leader.as_ref().is_some_and(|l| l.name == "a"))
    })
    .await;
    assert!(!*cb.leading().borrow(), "one leader only");
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn an_unreachable_etcd_is_a_one_line_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut e = etcd_config(vec![format!("http://127.0.0.1:{port}")], "/x/", "a");
    e.request_timeout = Duration::from_millis(500);
    let err = Store::open(store_config(e)).await.unwrap_err().to_string();
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(!err.contains('\n'), "{err}");
}

fn kv_set(key: &str, value: &str, cas: Option<Index>) -> Op {
    Op::KvSet {
        key: key.into(),
        value: value.as_bytes().to_vec(),
        flags: 0,
        cas,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kv_check_and_set_raced_from_two_stores_applies_exactly_once() {
    let etcd = cluster(1).await;
    let a = open(etcd.endpoints(), "/t9/", "a").await;
    let b = open(etcd.endpoints(), "/t9/", "b").await;
    for round in 0..10 {
        let set = a.write(kv_set("config/leader", "none", None)).await.unwrap();
        let cas = Some(set.index);
        let (ra, rb) = tokio::join!(
            a.write(kv_set("config/leader", "a", cas)),
            b.write(kv_set("config/leader", "b", cas))
        );
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        assert!(
            ra.applied ^ rb.applied,
            "round {round}: one CAS applies ({ra:?}, {rb:?})"
        );
        let winner: &[u8] = if ra.applied { b"a" } else { b"b" };
        for store in [&a, &b] {
            eventually("both stores hold the winner's value", || {
                store.read().kv_get("config/leader").is_some_and(|e| e.value == winner)
            })
            .await;
        }
    }
    a.close().await;
    b.close().await;
}

/// A snapshot of an embedded-store server restored into an etcd-backed pair (the migration
/// path): many transactions (a small `--max-txn-ops` here), yet the other server sees the
/// catalog before or after, never between; indexes move forward; rows the snapshot lacks go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_snapshot_restores_into_etcd_all_at_once_for_every_server() {
    use catalog::snapshot::Snapshot;
    use std::sync::Arc;
    const KEYS: usize = 600;
    let embedded = Store::open(StoreConfig::default()).await.unwrap();
    embedded.write(register("n1", "web")).await.unwrap();
    for i in 0..KEYS {
        embedded
            .write(kv_set(&format!("app/{i:04}"), "restored", None))
            .await
            .unwrap();
    }
    let (_, archive) = embedded.save_snapshot().await.unwrap();
    embedded.close().await;

    let etcd = cluster(1).await;
    let mut small = etcd_config(etcd.endpoints(), "/t10/", "a");
    small.max_txn_ops = 64;
    let a = Store::open(store_config(small)).await.unwrap();
    let b = open(etcd.endpoints(), "/t10/", "b").await;
    a.write(register("old", "legacy")).await.unwrap();
    let before = a.write(kv_set("old/key", "x", None)).await.unwrap().index;
    eventually("b has a's writes", || b.read().index >= before).await;

    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.wait(&IndexKey::Kvs, before, Duration::from_secs(30)).await })
    };
    // b's readers never see part of the restore.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let observer = {
        let (b, done) = (b.clone(), Arc::clone(&done));
        tokio::spawn(async move {
            let mut seen = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let s = b.read();
                let restored = s.kv_range("app/").count();
                let old = s.kv_get("old/key").is_some();
                assert!(
                    (restored == 0 && old) || (restored == KEYS && !old),
                    "b saw half a restore: {restored} restored keys, old key present: {old}"
                );
                seen += 1;
                tokio::task::yield_now().await;
            }
            seen
        })
    };
    let snapshot = Arc::new(Snapshot::decode(&archive).unwrap());
    let restored = a.restore(snapshot).await.unwrap().index;
    assert!(restored > before);
    eventually("b has the restore", || b.read().index >= restored).await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(observer.await.unwrap() > 0);
    let woke = waiter.await.unwrap();
    assert!(woke.index_of(&IndexKey::Kvs) > before);
    for store in [&a, &b] {
        let s = store.read();
        assert_eq!(s.kv_range("app/").count(), KEYS);
        assert!(s.kv_get("old/key").is_none());
        assert!(s.node("old").is_none());
        assert_eq!(s.service_instances("web").len(), 1);
        assert!(s.kv_get("app/0000").unwrap().modify_index > before);
    }
    // Writes go on after the restore, and a new server reads the restored catalog.
    b.write(kv_set("after", "1", None)).await.unwrap();
    let c = open(etcd.endpoints(), "/t10/", "c").await;
    assert_eq!(c.read().kv_range("app/").count(), KEYS);
    for s in [a, b, c] {
        s.close().await;
    }
}

/// A restore cut off midway (its marker left in etcd) refuses writes everywhere, naming
/// the restore, until a restore is run again and finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_restore_refuses_writes_until_a_restore_finishes() {
    use catalog::snapshot::Snapshot;
    use std::sync::Arc;
    let embedded = Store::open(StoreConfig::default()).await.unwrap();
    embedded.write(kv_set("k", "restored", None)).await.unwrap();
    let (_, archive) = embedded.save_snapshot().await.unwrap();
    embedded.close().await;
    let etcd = cluster(1).await;
    let a = open(etcd.endpoints(), "/t11/", "a").await;
    a.write(kv_set("k", "before", None)).await.unwrap();
    // What a restore that died after its first transactions leaves behind.
    let mut client = etcd_client::Client::connect(etcd.endpoints(), None).await.unwrap();
    client
        .put("/t11/catalog/_restore", "by dead at then, id 1, snapshot x", None)
        .await
        .unwrap();
    client
        .put("/t11/catalog/kv/half", r#"{"Key":"half","Value":"eA=="}"#, None)
        .await
        .unwrap();
    let mut refused = None;
    for _ in 0..200 {
        match a.write(kv_set("probe", "1", None)).await {
            Err(e) => {
                refused = Some(e);
                break;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let e = refused.expect("writes are refused once the marker is seen");
    assert!(matches!(e, WriteError::Storage(_)), "{e}");
    assert_eq!(
        a.read().kv_get("k").unwrap().value,
        b"before",
        "the half-written restore stays out of sight"
    );
    assert!(a.read().kv_get("half").is_none());
    let why = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default();
    assert!(why.contains("a snapshot restore is in progress (by dead"), "{why}");
    // A server starting now refuses writes too (it reads whatever etcd holds: the catalog
    // before the restore is gone from etcd by then).
    let b = open(etcd.endpoints(), "/t11/", "b").await;
    assert!(b.write(kv_set("probe", "1", None)).await.is_err());
    a.restore(Arc::new(Snapshot::decode(&archive).unwrap())).await.unwrap();
    for s in [&a, &b] {
        eventually("the restore is current", || {
            s.read().kv_get("k").is_some_and(|e| e.value == b"restored") && s.read().kv_get("half").is_none()
        })
        .await;
    }
    b.write(kv_set("probe", "1", None)).await.unwrap();
    a.close().await;
    b.close().await;
}

/// A write's audit record is committed with it over etcd: another store reads it at the
/// write's index, a restarted store loads it, and the retention holds across stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_records_ride_their_writes_and_every_store_reads_them() {
    use catalog::audit::{AuditOutcome, AuditScope};
    let etcd = cluster(1).await;
    let mut small = config(etcd.endpoints(), "/audit/", "a");
    small.audit_retention = 3;
    let a = Store::open(small).await.unwrap();
    let b = open(etcd.endpoints(), "/audit/", "b").await;
    let mut written = Vec::new();
    for i in 0..4 {
        let scope = AuditScope::new(structs::audit::AuditRecord {
            path: format!("/v1/config/{i}"),
            accepted: true,
            ..Default::default()
        });
        let outcome = scope
            .run(a.write(defaults(&format!("s{i}"), "http", None)))
            .await
            .unwrap();
        let AuditOutcome::Recorded { seq, index } = scope.outcome() else {
            panic!("{:?}", scope.outcome());
        };
        assert_eq!(index, outcome.index);
        written.push((seq, index));
    }
    // A refused write carries nothing; its record is a write of its own.
    let scope = AuditScope::new(structs::audit::AuditRecord::default());
    assert!(
        scope
            .run(a.write(defaults("s9", "carrier-pigeon", None)))
            .await
            .is_err()
    );
    assert_eq!(scope.outcome(), AuditOutcome::Refused);
    let last = a.read().index;
    eventually("b applies a's writes", || b.read().index >= last).await;
    let kept: Vec<(u64, Index)> = b.read().audit_records().map(|r| (r.seq, r.index)).collect();
    assert_eq!(
        kept,
        written[1..].to_vec(),
        "the newest three, at their writes' indexes"
    );
    a.close().await;
    b.close().await;
    let c = open(etcd.endpoints(), "/audit/", "c").await;
    let loaded: Vec<(u64, Index)> = c.read().audit_records().map(|r| (r.seq, r.index)).collect();
    assert_eq!(loaded, kept, "loaded from etcd as written");
    c.close().await;
}
