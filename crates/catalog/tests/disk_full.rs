//! The disk fills up under the write-ahead log: a real size-limited tmpfs as the data dir.
//! Needs root (to mount it), as the end-to-end tests run here; it fails loudly otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ::catalog::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use structs::config_entry::ServiceDefaults;
use structs::{ConfigEntry, ConfigEntryKind};

/// A tmpfs of `size` mounted on a fresh directory; unmounted when dropped.
struct Tmpfs {
    dir: PathBuf,
    _parent: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("data");
        std::fs::create_dir(&dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .output()
            .expect("running mount");
        assert!(
            out.status.success(),
            "this test mounts a small tmpfs and needs the privilege to: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir, _parent: parent }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

async fn open(dir: &Path) -> Store {
    Store::open(StoreConfig {
        data_dir: Some(dir.to_owned()),
        // No snapshot while the test fills the disk: the log is what is under test.
        snapshot_every: 1_000_000,
        ..StoreConfig::default()
    })
    .await
    .unwrap()
}

/// A service-defaults entry of about 2 KiB.
fn entry(i: usize) -> Op {
    Op::ConfigSet {
        entry: Box::new(ConfigEntry::ServiceDefaults(ServiceDefaults {
            name: format!("svc-{i}"),
            protocol: "http".into(),
            meta: [("pad".to_owned(), "x".repeat(2048))].into_iter().collect(),
            ..Default::default()
        })),
        cas: None,
    }
}

#[tokio::test]
async fn a_full_disk_fails_writes_whole_keeps_reads_and_recovers_when_space_returns() {
    let fs = Tmpfs::mount("256k");
    // Room the test gives back later.
    let ballast = fs.dir.join("ballast");
    std::fs::write(&ballast, vec![0u8; 96 * 1024]).unwrap();
    let store = open(&fs.dir).await;

    let mut acknowledged = Vec::new();
    let failure = loop {
        let i = acknowledged.len();
        assert!(i < 1000, "the disk never filled up");
        match store.write(entry(i)).await {
            Ok(outcome) => {
                assert!(outcome.applied);
                acknowledged.push(i);
            }
            Err(e) => break e,
        }
    };
    // The write fails naming the cause, and nothing of it is applied.
    let WriteError::Storage(cause) = &failure else {
        panic!("expected a storage failure, got {failure:?}");
    };
    let text = cause.to_string();
    assert!(text.contains("No space left on device"), "{text}");
    let failed = acknowledged.len();
    let state = store.read();
    assert!(
        state
            .config_entry(ConfigEntryKind::ServiceDefaults, &format!("svc-{failed}"))
            .is_none()
    );
    // Reads keep working, with every acknowledged write.
    assert_eq!(state.config_entries(ConfigEntryKind::ServiceDefaults).len(), failed);
    // Still full: the next write fails the same way, and is not applied either.
    assert!(matches!(store.write(entry(failed)).await, Err(WriteError::Storage(_))));

    // Space returns: writes work again.
    std::fs::remove_file(&ballast).unwrap();
    let outcome = store.write(entry(failed)).await.unwrap();
    assert!(outcome.applied);
    acknowledged.push(failed);
    store.close().await;

    // Every acknowledged write survives a restart, and the log is clean after the failures.
    let reopened = open(&fs.dir).await;
    let state = reopened.read();
    let names: Vec<String> = state
        .config_entries(ConfigEntryKind::ServiceDefaults)
        .iter()
        .map(|e| e.name().to_owned())
        .collect();
    assert_eq!(names.len(), acknowledged.len(), "{names:?}");
    for i in &acknowledged {
        assert!(names.contains(&format!("svc-{i}")), "svc-{i} lost");
    }
    reopened.close().await;
}
