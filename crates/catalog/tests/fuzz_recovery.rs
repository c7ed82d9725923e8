//! Property tests of recovery from damaged files (issue 18's fuzzing, structured): a real
//! data dir (log segments and a snapshot) with one file truncated, overwritten in places,
//! extended or replaced by arbitrary bytes. Opening it either fails with an error or gives a
//! store that works (reads, a write, a reopen that keeps it) — never a panic — and that lost
//! no acknowledged write, except where the damage looks exactly like a crash mid-write (the
//! newest log segment cut short or replaced, or damaged with nothing intact after it: the
//! writes here are batches of one record).
//!
//! `cargo xtask fuzz` runs many more cases (`PROPTEST_CASES`).
#![allow(clippy::unwrap_used)]

use catalog::{Op, Store, StoreConfig};
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// How one file is damaged.
#[derive(Debug, Clone)]
enum Damage {
    Truncate(usize),
    Overwrite { at: usize, bytes: Vec<u8> },
    Append(Vec<u8>),
    Replace(Vec<u8>),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        any::<usize>().prop_map(Damage::Truncate),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Damage::Overwrite { at, bytes }),
        prop::collection::vec(any::<u8>(), 1..64).prop_map(Damage::Append),
        prop::collection::vec(any::<u8>(), 0..128).prop_map(Damage::Replace),
    ]
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    })
}

fn config(dir: &Path) -> StoreConfig {
    StoreConfig {
        data_dir: Some(dir.to_owned()),
        snapshot_every: 8,
        ..StoreConfig::default()
    }
}

fn register(node: &str) -> Op {
    Op::Register(Box::new(structs::RegisterRequest {
        node: node.into(),
        address: "10.0.0.1".into(),
        ..Default::default()
    }))
}

/// The files of a data dir after 20 writes (a snapshot and log segments), by name.
fn pristine() -> &'static Vec<(String, Vec<u8>)> {
    static FILES: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    FILES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        runtime().block_on(async {
            let store = Store::open(config(dir.path())).await.unwrap();
            for i in 0..20 {
                store.write(register(&format!("n{i}"))).await.unwrap();
            }
            // Snapshots are written in the background, and a new log segment starts when one
            // begins: on a loaded machine the last one may begin after the last write,
            // leaving the newest segment empty. The damage cases need records in it: one
            // more write puts one there (a segment starts only 8 records after the last).
            if newest_segment_is_empty(dir.path()) {
                store.write(register("n20")).await.unwrap();
            }
            store.close().await;
        });
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n != "LOCK"))
            .map(|p| {
                (
                    p.file_name().unwrap().to_string_lossy().into_owned(),
                    std::fs::read(&p).unwrap(),
                )
            })
            .collect();
        files.sort();
        assert!(files.iter().any(|(n, _)| n.starts_with("snapshot-")), "{files:?}");
        files
    })
}

/// Whether the newest log segment of `dir` holds nothing yet.
fn newest_segment_is_empty(dir: &Path) -> bool {
    let newest = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("wal-")))
        .max()
        .unwrap();
    std::fs::metadata(newest).unwrap().len() == 0
}

/// The frames of a log segment: where each starts, and the record index it holds.
fn frames(bytes: &[u8]) -> Vec<(usize, u64)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        let record: serde_json::Value = serde_json::from_slice(&bytes[pos + 8..pos + 8 + len]).unwrap();
        out.push((pos, record["index"].as_u64().unwrap()));
        pos += 8 + len;
    }
    out
}

/// The index every recovered store must still reach after `how` was done to file `which`:
/// all of it (the last record of the newest segment), unless the damage is to the newest
/// segment and can be a crash mid-write. Overwritten bytes starting in record R's frame:
/// R may go (with what follows) only when nothing intact follows the damage; the store
/// refuses to open otherwise.
fn must_keep(which: usize, how: &Damage) -> u64 {
    let files = pristine();
    let (name, bytes) = &files[which % files.len()];
    let newest = files.iter().filter(|(n, _)| n.starts_with("wal-")).max().unwrap();
    let all = frames(&newest.1).last().unwrap().1;
    if name != &newest.0 {
        return all;
    }
    match how {
        Damage::Truncate(_) | Damage::Replace(_) => 0,
        Damage::Append(_) => all,
        Damage::Overwrite { at, bytes: new } => {
            let start = at % bytes.len();
            let changed = new
                .iter()
                .enumerate()
                .find(|&(k, b)| bytes.get(start + k).is_some_and(|old| old != b));
            let Some((k, _)) = changed else { return all };
            let last_changed = new
                .iter()
                .enumerate()
                .rfind(|&(k, b)| bytes.get(start + k).is_some_and(|old| old != b))
                .map_or(k, |(k, _)| k);
            let frames = frames(bytes);
            if frames.last().unwrap().0 > start + last_changed {
                // The last record follows the damage intact: it shows the damaged one was
                // acknowledged.
                return all;
            }
            let (_, record) = frames.into_iter().rfind(|(pos, _)| *pos <= start + k).unwrap();
            record - 1
        }
    }
}

fn lay_out(dir: &Path, which: usize, how: &Damage) -> PathBuf {
    let files = pristine();
    let target = which % files.len();
    for (i, (name, bytes)) in files.iter().enumerate() {
        let mut bytes = bytes.clone();
        if i == target {
            match how {
                Damage::Truncate(at) => bytes.truncate(at % (bytes.len() + 1)),
                Damage::Overwrite { at, bytes: new } => {
                    if !bytes.is_empty() {
                        let start = at % bytes.len();
                        for (k, b) in new.iter().enumerate() {
                            if let Some(slot) = bytes.get_mut(start + k) {
                                *slot = *b;
                            }
                        }
                    }
                }
                Damage::Append(more) => bytes.extend_from_slice(more),
                Damage::Replace(new) => bytes = new.clone(),
            }
        }
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    dir.join(&files[target].0)
}

proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(prop::test_runner::FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_damaged_file_is_refused_or_recovered_never_a_panic(which in any::<usize>(), how in damage()) {
        let dir = tempfile::tempdir().unwrap();
        let damaged = lay_out(dir.path(), which, &how);
        let outcome = runtime().block_on(async {
            match Store::open(config(dir.path())).await {
                Err(e) => Err(e.to_string()),
                Ok(store) => {
                    let before = store.read().index;
                    let written = store.write(register("after")).await.map(|o| o.index);
                    store.close().await;
                    Ok((before, written))
                }
            }
        });
        match outcome {
            Err(message) => prop_assert!(!message.is_empty()),
            Ok((before, written)) => {
                let keep = must_keep(which, &how);
                prop_assert!(before.0 >= keep, "recovered to {before} after {how:?} on {damaged:?}: acknowledged writes up to {keep} lost");
                let written = written.map_err(|e| TestCaseError::fail(format!("a write after recovery failed: {e} ({damaged:?})")))?;
                prop_assert!(written > before);
                // And the recovered dir opens again with that write in it.
                let again = runtime().block_on(async {
                    let store = Store::open(config(dir.path())).await.map_err(|e| e.to_string())?;
                    let index = store.read().index;
                    let node = store.read().node("after").is_some();
                    store.close().await;
                    Ok::<_, String>((index, node))
                });
                let (index, node) = again.map_err(|e| TestCaseError::fail(format!("reopen after recovery: {e}")))?;
                prop_assert_eq!(index, written);
                prop_assert!(node);
            }
        }
    }
}
