//! Following the catalog in etcd: every key read at one revision (at start, and again when
//! the watch's next revision was compacted away), then one watch that applies every
//! revision in order to the current state.
//!
//! While the restore marker is present (a snapshot restore writes the catalog in many
//! transactions, see `restore.rs`), revisions are applied to a state of their own that
//! readers do not see; when the marker goes, that state replaces the current one at once,
//! as a reset. Readers therefore see the catalog before the restore or after it, never
//! half of it.

use crate::config::EtcdConfig;
use crate::layout;
use crate::outage::{Outage, etcd_err, sleep_or_stop};
use catalog::StoreError;
use catalog::backend::Current;
use catalog::{Change, State};
use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use structs::Index;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// What a revision did to the restore marker.
#[derive(Debug, Default, PartialEq)]
enum Marker {
    #[default]
    Untouched,
    /// Put: a restore starts (or another takes over).
    Put(String),
    /// Deleted: the restore finished.
    Deleted,
}

/// The catalog watch, and how far it has applied.
pub(crate) struct Applier {
    client: Client,
    config: EtcdConfig,
    /// The revision the current state reflects.
    applied: watch::Sender<Index>,
    /// Full reloads after a compaction.
    reloads: AtomicU64,
    /// While a restore is under way: what its marker says, and the state its revisions
    /// build (not yet current).
    pending: parking_lot::Mutex<Option<Pending>>,
}

/// A restore being applied out of readers' sight.
struct Pending {
    marker: String,
    state: State,
}

/// Reads every catalog key: the state at the read's revision, and the restore marker's
/// value if a restore is under way (or was interrupted).
pub(crate) async fn load(client: &Client, config: &EtcdConfig) -> Result<(State, Option<String>), StoreError> {
    let prefix = config.catalog_prefix();
    let mut kv = client.kv_client();
    let resp = tokio::time::timeout(
        config.request_timeout,
        kv.get(prefix.clone(), Some(GetOptions::new().with_prefix())),
    )
    .await
    .map_err(|_| StoreError::EtcdTimeout {
        what: "reading the catalog from etcd".into(),
        after: config.request_timeout,
    })?
    .map_err(etcd_err("reading the catalog from etcd"))?;
    let revision = resp.header().map_or(0, |h| h.revision());
    let mut kvs = Vec::with_capacity(resp.kvs().len());
    let mut marker = None;
    for kv in resp.kvs() {
        let Some(key) = kv.key().strip_prefix(prefix.as_bytes()) else {
            continue;
        };
        if key == layout::RESTORE.as_bytes() {
            marker = Some(String::from_utf8_lossy(kv.value()).into_owned());
            continue;
        }
        let Ok(key) = std::str::from_utf8(key) else {
            error!(key = ?String::from_utf8_lossy(kv.key()), "skipping an etcd key that is not UTF-8");
            continue;
        };
        // A key meshd cannot read is reported and skipped, not fatal: the rest of the
        // catalog is still served.
        if let Err(e) = layout::decode(key, Some(kv.value())) {
            error!(error = %e, "skipping an etcd key meshd cannot read");
            continue;
        }
        kvs.push(layout::Kv {
            key,
            value: kv.value(),
            create: Index(kv.create_revision() as u64),
            modify: Index(kv.mod_revision() as u64),
        });
    }
    let state = layout::load(kvs, Index(revision as u64)).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Ok((state, marker))
}

impl Applier {
    /// Follows the catalog from `loaded`, read at its index; `marker` is the restore
    /// marker found then (an interrupted restore: writes stay refused until one finishes).
    pub(crate) fn new(client: Client, config: EtcdConfig, loaded: &State, marker: Option<String>) -> Self {
        let pending = marker.map(|marker| {
            error!(%marker, "a snapshot restore was interrupted: the catalog may hold part of it, and writes are refused until a restore is run again and finishes");
            Pending {
                marker,
                state: loaded.clone(),
            }
        });
        Self {
            client,
            config,
            applied: watch::Sender::new(loaded.index),
            reloads: AtomicU64::new(0),
            pending: parking_lot::Mutex::new(pending),
        }
    }

    /// What the restore marker says while a restore is under way.
    pub(crate) fn restoring(&self) -> Option<String> {
        self.pending.lock().as_ref().map(|p| p.marker.clone())
    }

    /// Full reloads so far.
    pub(crate) fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// Waits until the current state reflects `revision`; false after `timeout`.
    pub(crate) async fn caught_up(&self, revision: Index, timeout: Duration) -> bool {
        let mut rx = self.applied.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|applied| *applied >= revision))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Applies every catalog revision to `current` in order, from the revision after the
    /// applied one, and reloads everything when that revision has been compacted; until
    /// `stop`.
    pub(crate) async fn run(self: Arc<Self>, current: Arc<Current>, stop: CancellationToken) {
        let prefix = self.config.catalog_prefix();
        let mut watch_client = self.client.watch_client();
        let mut delay = Duration::from_millis(100);
        let mut outage = Outage::default();
        const WHAT: &str = "the etcd watch on the catalog failed, retrying";
        loop {
            let from = self.applied.borrow().0 as i64 + 1;
            let options = WatchOptions::new().with_prefix().with_start_revision(from);
            let started = tokio::select! {
                () = stop.cancelled() => return,
                r = watch_client.watch(prefix.clone(), Some(options)) => r,
            };
            let mut stream = match started {
                Ok(s) => s,
                Err(e) => {
                    outage.failed(WHAT, &e);
                    if sleep_or_stop(&stop, delay).await {
                        return;
                    }
                    delay = (delay * 2).min(Duration::from_secs(2));
                    continue;
                }
            };
            loop {
                let message = tokio::select! {
                    () = stop.cancelled() => return,
                    m = stream.message() => m,
                };
                match message {
                    Ok(Some(resp)) if resp.compact_revision() > 0 => {
                        warn!(
                            compacted_to = resp.compact_revision(),
                            wanted = from,
                            "etcd compacted revisions this server has not applied: reloading the catalog"
                        );
                        match load(&self.client, &self.config).await {
                            Ok((state, marker)) => self.reset(&current, state, marker),
                            Err(e) => warn!(error = %e, "cannot reload the catalog from etcd; retrying"),
                        }
                        break;
                    }
                    Ok(Some(resp)) if resp.canceled() => {
                        outage.failed(WHAT, &format!("etcd ended the watch: {}", resp.cancel_reason()));
                        break;
                    }
                    Ok(Some(resp)) => {
                        delay = Duration::from_millis(100);
                        outage.worked(WHAT);
                        self.apply_events(&current, &prefix, resp.events());
                    }
                    Ok(None) => {
                        outage.failed(WHAT, &"the watch stream closed");
                        break;
                    }
                    Err(e) => {
                        outage.failed(WHAT, &e);
                        break;
                    }
                }
            }
            if sleep_or_stop(&stop, delay).await {
                return;
            }
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }

    /// Applies a watch response's events, one state per revision (a transaction's events
    /// share one revision).
    fn apply_events(&self, current: &Current, prefix: &str, events: &[etcd_client::Event]) {
        let mut revision = None;
        let mut changes: Vec<Change> = Vec::new();
        let mut marker = Marker::Untouched;
        for event in events {
            let Some(kv) = event.kv() else { continue };
            let rev = Index(kv.mod_revision() as u64);
            if revision.is_some_and(|r| r != rev) {
                let at = revision.take().unwrap_or(rev);
                self.apply_revision(current, at, std::mem::take(&mut changes), std::mem::take(&mut marker));
            }
            revision = Some(rev);
            let Some(key) = kv
                .key()
                .strip_prefix(prefix.as_bytes())
                .and_then(|k| std::str::from_utf8(k).ok())
            else {
                continue;
            };
            let value = match event.event_type() {
                EventType::Put => Some(kv.value()),
                EventType::Delete => None,
            };
            if key == layout::RESTORE {
                marker = match value {
                    Some(v) => Marker::Put(String::from_utf8_lossy(v).into_owned()),
                    None => Marker::Deleted,
                };
                continue;
            }
            match layout::decode(key, value) {
                Ok(Some(change)) => changes.push(change),
                Ok(None) => {}
                Err(e) => error!(error = %e, "skipping an etcd change meshd cannot read"),
            }
        }
        if let Some(rev) = revision {
            self.apply_revision(current, rev, changes, marker);
        }
    }

    fn apply_revision(&self, current: &Current, revision: Index, changes: Vec<Change>, marker: Marker) {
        let state = current.read();
        if revision <= state.index {
            return;
        }
        let mut pending = self.pending.lock();
        if let Marker::Put(value) = &marker {
            match pending.as_mut() {
                // Another restore took over an unfinished one: its writes build on the same.
                Some(p) => p.marker.clone_from(value),
                None => {
                    info!(marker = %value, "a snapshot restore started: its writes are applied out of sight until it finishes");
                    *pending = Some(Pending {
                        marker: value.clone(),
                        state: (*state).clone(),
                    });
                }
            }
        }
        if let Some(p) = pending.as_mut() {
            if revision > p.state.index {
                p.state.apply(revision, &changes);
            }
            if marker == Marker::Deleted {
                let restored = pending.take().map(|p| p.state);
                drop(pending);
                if let Some(restored) = restored {
                    current.reset(Arc::new(restored));
                    info!(index = %revision, "a snapshot restore finished: the restored catalog is current, subscribers reset");
                }
            }
            self.applied.send_replace(revision);
            return;
        }
        drop(pending);
        if !changes.is_empty() {
            let mut next = (*state).clone();
            let bumped: HashSet<_> = next.apply(revision, &changes).into_iter().collect();
            current.replace(Arc::new(next), &bumped);
        }
        self.applied.send_replace(revision);
    }

    /// Replaces the state with a full reload and wakes everyone who watches anything; with
    /// the restore `marker` present, the reload is what the restore has written so far, and
    /// stays out of sight.
    fn reset(&self, current: &Current, state: State, marker: Option<String>) {
        if let Some(marker) = marker {
            let index = state.index;
            *self.pending.lock() = Some(Pending { marker, state });
            self.reloads.fetch_add(1, Ordering::Relaxed);
            self.applied.send_replace(index);
            return;
        }
        *self.pending.lock() = None;
        let applied = current.read().index;
        if state.index < applied {
            // Never serve an index lower than one already served.
            warn!(reloaded = %state.index, current = %applied, "ignoring a reload older than the applied state");
            return;
        }
        let index = state.index;
        // Counted before anyone is woken, so that whoever the reset wakes sees it counted.
        self.reloads.fetch_add(1, Ordering::Relaxed);
        current.reset(Arc::new(state));
        self.applied.send_replace(index);
        info!(%index, "catalog reloaded from etcd; subscribers reset");
    }
}
