//! Snapshots: taken under writes, restored as one write that moves every index forward,
//! durable across a reopen, and refused whole when the archive is damaged.
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use ::catalog::snapshot::{Snapshot, SnapshotError};
use ::catalog::*;
use std::sync::Arc;
use std::time::Duration;
use structs::{Index, KvEntry, RegisterRequest};

async fn disk_store(dir: &std::path::Path) -> Store {
    Store::open(StoreConfig {
        data_dir: Some(dir.to_owned()),
        ..StoreConfig::default()
    })
    .await
    .unwrap()
}

fn kv_set(key: &str, value: &str) -> Op {
    Op::KvSet {
        key: key.into(),
        value: value.as_bytes().to_vec(),
        flags: 0,
        cas: None,
    }
}

fn register(node: &str, service: Option<&str>) -> Op {
    Op::Register(Box::new(RegisterRequest {
        node: node.into(),
        address: "10.0.0.1".into(),
        service: service.map(|s| structs::NodeService {
            service: s.into(),
            port: 80,
            ..Default::default()
        }),
        ..Default::default()
    }))
}

fn value(state: &State, key: &str) -> Option<String> {
    state.kv_get(key).map(|e| String::from_utf8(e.value.clone()).unwrap())
}

#[tokio::test]
async fn a_restore_brings_back_the_saved_rows_moves_indexes_forward_and_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = disk_store(dir.path()).await;
    store.write(register("n1", Some("web"))).await.unwrap();
    let session = structs::session::Session {
        id: "s1".into(),
        node: "n1".into(),
        ttl: "30s".into(),
        renewed_at_ms: 1_000,
        ..Default::default()
    };
    store.write(Op::SessionCreate(Box::new(session))).await.unwrap();
    store.write(kv_set("app/a", "saved")).await.unwrap();
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
    let (saved_at, archive) = store.save_snapshot().await.unwrap();
    let ca_before = store.read().ca().unwrap().active().unwrap().root.id.clone();

    // After the save: a change, a new key, a new node and a delete.
    store.write(kv_set("app/a", "later")).await.unwrap();
    store.write(kv_set("app/new", "x")).await.unwrap();
    store.write(register("n2", Some("api"))).await.unwrap();
    let before = store
        .write(Op::KvDelete {
            key: "app/lock".into(),
            cas: None,
        })
        .await
        .unwrap()
        .index;
    assert!(before > saved_at);

    // A client blocked on a key the restore changes wakes, at a higher index.
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .wait(&IndexKey::KvKey("app/a".into()), before, Duration::from_secs(30))
                .await
        })
    };
    tokio::task::yield_now().await;
    let snapshot = Arc::new(Snapshot::decode(&archive).unwrap());
    assert!(
        !format!("{snapshot:?}").contains("PRIVATE KEY"),
        "a snapshot's Debug shows no key"
    );
    assert_eq!(snapshot.meta().index, saved_at.0);
    assert_eq!(snapshot.meta().counts["kv"], 2);
    let restored = store.restore(snapshot).await.unwrap().index;
    assert!(restored > before, "{restored} > {before}");
    let woke = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(woke.index_of(&IndexKey::KvKey("app/a".into())) > before);

    let check = |state: &State| {
        assert_eq!(value(state, "app/a").as_deref(), Some("saved"));
        assert_eq!(value(state, "app/new"), None);
        let lock = state.kv_get("app/lock").unwrap();
        assert_eq!(lock.session, "s1");
        assert_eq!(state.kv_held_by("s1").count(), 1);
        assert!(state.node("n2").is_none(), "a node registered after the save is gone");
        assert!(state.node("n1").is_some());
        // The session's TTL counts again from the restore, not from the save.
        assert!(state.session("s1").unwrap().renewed_at_ms > 1_000);
        assert_eq!(state.ca().unwrap().active().unwrap().root.id, ca_before);
        // Every index a client could have seen moved on, none went back.
        for key in [IndexKey::Kvs, IndexKey::Nodes, IndexKey::KvKey("app/new".into())] {
            assert!(state.index_of(&key) >= restored, "{key:?}");
        }
        assert!(state.kv_prefix_index("app/") >= restored);
    };
    check(&store.read());
    store.close().await;
    let store = disk_store(dir.path()).await;
    check(&store.read());
    assert_eq!(store.read().index, restored);
    store.close().await;
}

#[tokio::test]
async fn a_snapshot_taken_under_writes_holds_every_write_acknowledged_before_it() {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..400 {
                let index = store.write(kv_set(&format!("load/{i:04}"), "v")).await.unwrap().index;
                acked.push((i, index));
            }
            acked
        })
    };
    // Save once a hundred writes are in: the writer is still going.
    store.wait(&IndexKey::Kvs, Index(100), Duration::from_secs(30)).await;
    let (at, archive) = store.save_snapshot().await.unwrap();
    let acked = writer.await.unwrap();
    let snapshot = Snapshot::decode(&archive).unwrap();
    let fresh = Store::open(StoreConfig::default()).await.unwrap();
    fresh.restore(Arc::new(snapshot)).await.unwrap();
    let state = fresh.read();
    for (i, index) in acked {
        let present = state.kv_get(&format!("load/{i:04}")).is_some();
        if index <= at {
            assert!(
                present,
                "load/{i:04}, acknowledged at {index} before the save at {at}, is missing"
            );
        } else {
            assert!(!present, "load/{i:04} was written at {index}, after the save at {at}");
        }
    }
    store.close().await;
    fresh.close().await;
}

#[tokio::test]
async fn a_damaged_or_inconsistent_archive_is_refused_and_changes_nothing() {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    store.write(kv_set("k", "v")).await.unwrap();
    let (_, archive) = store.save_snapshot().await.unwrap();
    let index = store.read().index;
    let mut flipped = archive.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x40;
    for bad in [&flipped[..], &archive[..archive.len() - 10], b"junk"] {
        let e = Snapshot::decode(bad).unwrap_err();
        assert!(matches!(e, SnapshotError::Archive(_)), "{e}");
    }
    // A whole archive whose state names a node it lacks.
    let state = br#"{"index":5,"nodes":[],"services":[["ghost",{"ID":"web","Service":"web"}]],"checks":[],"config":[],"ca":null,"indexes":[]}"#;
    let meta = snapshot_archive::Meta::new(5, "dc1", 0, "1970-01-01T00:00:00Z".into(), Default::default());
    let e = Snapshot::decode(&snapshot_archive::pack(meta, state).unwrap()).unwrap_err();
    assert!(e.to_string().contains("node \"ghost\""), "{e}");
    assert_eq!(store.read().index, index);
    assert_eq!(value(&store.read(), "k").as_deref(), Some("v"));
    store.close().await;
}

#[tokio::test]
async fn restoring_into_an_older_server_keeps_indexes_above_what_it_served() {
    // A snapshot from a young server (low indexes) into one that has served high ones.
    let young = Store::open(StoreConfig::default()).await.unwrap();
    young.write(kv_set("k", "young")).await.unwrap();
    let (young_at, archive) = young.save_snapshot().await.unwrap();
    let old = Store::open(StoreConfig::default()).await.unwrap();
    for i in 0..50 {
        old.write(kv_set("k", &i.to_string())).await.unwrap();
    }
    let served = old.read().index_of(&IndexKey::KvKey("k".into()));
    assert!(served > young_at);
    old.restore(Arc::new(Snapshot::decode(&archive).unwrap()))
        .await
        .unwrap();
    let state = old.read();
    assert_eq!(value(&state, "k").as_deref(), Some("young"));
    assert!(state.index_of(&IndexKey::KvKey("k".into())) > served);
    assert!(state.kv_get("k").unwrap().modify_index > served);
    assert!(state.index > Index(served.0));
    young.close().await;
    old.close().await;
}
