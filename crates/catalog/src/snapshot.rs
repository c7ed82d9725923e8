//! Snapshots of the whole catalog (`GET`/`PUT /v1/snapshot`): taking one from a state, and
//! reading one back, verified, for a restore. The archive itself (a gzipped tar with sums)
//! is the `snapshot-archive` crate's; what it holds is the state's rows as the data dir's
//! snapshots hold them ([`PersistedState`]).
//!
//! A restore is one write ([`crate::Op::Restore`]): on the embedded store, one log record
//! that deletes every row the snapshot lacks and puts every row it has, stamped with the
//! restore's index, so that no client ever sees an index go backwards; over etcd, see
//! `etcd/restore.rs`.

use crate::state::{PersistedState, State};
use snapshot_archive::{ArchiveError, Meta};
use std::collections::{BTreeMap, HashSet};
use std::time::SystemTime;

pub use snapshot_archive::{MAX_ARCHIVE, MAX_INFLATED};

/// Why a snapshot cannot be taken or restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The archive is damaged, incomplete, or of another format.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// The archive is whole but its state cannot be read (a field is named).
    #[error("the snapshot's state.json cannot be read: {0}")]
    State(String),
    /// The state contradicts itself (a service on a node it does not hold...).
    #[error("the snapshot's state is inconsistent: {0}")]
    Inconsistent(String),
}

/// A verified snapshot, ready to restore.
pub struct Snapshot {
    meta: Meta,
    pub(crate) state: PersistedState,
}

/// The metadata only: the rows hold the CA's private keys and every ACL secret, and a write
/// (`Op::Restore`) may be logged.
impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("meta", &self.meta)
            .finish_non_exhaustive()
    }
}

impl Snapshot {
    /// Reads and verifies an archive: its sums, its format, and that its rows hang together.
    pub fn decode(archive: &[u8]) -> Result<Self, SnapshotError> {
        let unpacked = snapshot_archive::unpack(archive, MAX_INFLATED)?;
        let mut de = serde_json::Deserializer::from_slice(&unpacked.state);
        let state: PersistedState =
            serde_path_to_error::deserialize(&mut de).map_err(|e| SnapshotError::State(e.to_string()))?;
        check(&state)?;
        Ok(Self {
            meta: unpacked.meta,
            state,
        })
    }

    /// What the archive says about itself.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// Its rows (secrets among them: the CA's keys, ACL tokens).
    pub fn rows(&self) -> &PersistedState {
        &self.state
    }
}

/// Rows that refer to others the snapshot must hold them.
fn check(state: &PersistedState) -> Result<(), SnapshotError> {
    let nodes: HashSet<&str> = state.nodes.iter().map(|n| n.node.as_str()).collect();
    if let Some((node, svc)) = state.services.iter().find(|(n, _)| !nodes.contains(n.as_str())) {
        return Err(SnapshotError::Inconsistent(format!(
            "service {:?} is on node {node:?}, which the snapshot does not hold",
            svc.id
        )));
    }
    if let Some(c) = state.checks.iter().find(|c| !nodes.contains(c.node.as_str())) {
        return Err(SnapshotError::Inconsistent(format!(
            "check {:?} is on node {:?}, which the snapshot does not hold",
            c.check_id, c.node
        )));
    }
    let sessions: HashSet<&str> = state.sessions.iter().map(|s| s.id.as_str()).collect();
    if let Some(e) = state
        .kv
        .iter()
        .find(|e| !e.session.is_empty() && !sessions.contains(e.session.as_str()))
    {
        return Err(SnapshotError::Inconsistent(format!(
            "key {:?} is locked by session {:?}, which the snapshot does not hold",
            e.key, e.session
        )));
    }
    Ok(())
}

/// Rows per table, for the archive's metadata (and `meshd snapshot inspect`).
fn counts(p: &PersistedState) -> BTreeMap<String, u64> {
    [
        ("nodes", p.nodes.len()),
        ("services", p.services.len()),
        ("checks", p.checks.len()),
        ("config_entries", p.config.len()),
        ("ca_roots", p.ca.as_ref().map_or(0, |ca| ca.roots.len())),
        ("acl_tokens", p.acl_tokens.len()),
        ("acl_policies", p.acl_policies.len()),
        ("acl_roles", p.acl_roles.len()),
        ("acl_auth_methods", p.acl_auth_methods.len()),
        ("acl_binding_rules", p.acl_binding_rules.len()),
        ("kv", p.kv.len()),
        ("sessions", p.sessions.len()),
        ("events", p.events.len()),
        ("prepared_queries", p.queries.len()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v as u64))
    .collect()
}

/// An archive of `state`, taken in `datacenter` (CPU work: call it off the async workers).
pub fn save(state: &State, datacenter: &str) -> Result<Vec<u8>, SnapshotError> {
    let persisted = state.to_persisted();
    let json = serde_json::to_vec(&persisted).map_err(|e| SnapshotError::State(e.to_string()))?;
    let now = SystemTime::now();
    let ms = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let meta = Meta::new(
        state.index.0,
        datacenter,
        ms,
        structs::Timestamp(now).to_string(),
        counts(&persisted),
    );
    Ok(snapshot_archive::pack(meta, &json)?)
}
