use super::*;
use crate::ca::{CaConfig, ROOT_PRUNE_MARGIN};
use crate::{IndexKey, StoreConfig};
use parking_lot::Mutex;
use std::sync::Arc;

async fn rotated() -> Store {
    let store = Store::open(StoreConfig::default()).await.unwrap();
    store
        .write(Op::CaConfigure(CaConfig {
            private_key_bits: 384,
            ..CaConfig::default()
        }))
        .await
        .unwrap();
    assert_eq!(
        store.read().ca().unwrap().roots.len(),
        2,
        "the old root stays after a rotation"
    );
    store
}

fn due(store: &Store) -> SystemTime {
    store.read().ca().unwrap().next_prune_at().unwrap()
}

#[tokio::test]
async fn a_rotated_out_root_is_removed_once_its_last_leaf_expired_and_not_before() {
    let store = rotated().await;
    let ca = store.read().ca().unwrap();
    let old = ca.roots.iter().find(|r| !r.root.active).unwrap();
    let keep_until = old.keep_until.unwrap().0;
    assert_eq!(due(&store), keep_until + ROOT_PRUNE_MARGIN);
    let now = Arc::new(Mutex::new(keep_until + ROOT_PRUNE_MARGIN - Duration::from_secs(1)));
    let pruner = {
        let now = Arc::clone(&now);
        RootPruner::with_clock(store.clone(), CHECK_EVERY, move || *now.lock())
    };
    assert!(!pruner.prune_once().await, "a leaf it signed may still be valid");
    assert_eq!(store.read().ca().unwrap().roots.len(), 2);

    // Someone follows the roots with a blocking query: the removal wakes them.
    let index = store.read().index_of(&IndexKey::Ca);
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move { store.wait(&IndexKey::Ca, index, Duration::from_secs(30)).await })
    };
    *now.lock() = keep_until + ROOT_PRUNE_MARGIN;
    assert!(pruner.prune_once().await);
    let seen = waiter.await.unwrap();
    assert!(seen.index_of(&IndexKey::Ca) > index);
    let ca = seen.ca().unwrap();
    assert_eq!(ca.roots.len(), 1);
    assert!(ca.roots[0].root.active, "the active root is never removed");
    assert_eq!(seen.ca_roots().roots.len(), 1);
    assert!(!pruner.prune_once().await, "nothing left to remove");
    assert_eq!(store.read().index_of(&IndexKey::Ca), seen.index_of(&IndexKey::Ca));
    store.close().await;
}

/// The loop wakes when the root is due (72 h, the default leaf TTL, after the rotation) on a
/// clock that follows tokio's paused time.
#[tokio::test(start_paused = true)]
async fn the_pruner_removes_the_root_when_due_on_its_own() {
    let store = rotated().await;
    let (base, started) = (SystemTime::now(), tokio::time::Instant::now());
    let pruner = RootPruner::with_clock(store.clone(), CHECK_EVERY, move || base + started.elapsed());
    let stop = tokio_util::sync::CancellationToken::new();
    let task = {
        let stop = stop.clone();
        tokio::spawn(async move { pruner.run(stop.cancelled()).await })
    };
    let due = due(&store);
    let before = due.duration_since(base).unwrap() - Duration::from_secs(120);
    tokio::time::sleep(before).await;
    assert_eq!(store.read().ca().unwrap().roots.len(), 2, "not before it is due");
    while store.read().ca().unwrap().roots.len() == 2 {
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    assert!(base + started.elapsed() >= due);
    stop.cancel();
    task.await.unwrap();
    store.close().await;
}
