//! Why the store failed: [`StoreError`] (the data dir, or etcd, could not be used) and
//! [`WriteError`] (a write was refused). One module for both, as each can carry the other: a
//! write fails with the storage error behind it, and a first start fails with the write that
//! could not create the CA.

use crate::ca::CaError;
use std::{io, path::PathBuf};
use structs::ValidationError;

/// Why the store could not keep the catalog: its data dir, or etcd, failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An I/O error, with what was being done. The cause is part of the message, not a
    /// separate source, so that a report of the chain does not say it twice.
    #[error("{what}: {error}")]
    Io {
        /// What failed.
        what: String,
        /// The error.
        error: io::Error,
    },
    /// Another process has the data dir open.
    #[error("data dir {0} is in use by another meshd (its LOCK file is held)")]
    Locked(PathBuf),
    /// The data dir holds damaged data that cannot be skipped without losing writes.
    #[error("data dir is damaged: {0}")]
    Corrupt(String),
    /// A log record could not be decoded: the data dir is damaged.
    #[error("data dir is damaged: {}: undecodable record", path.display())]
    Undecodable {
        /// The log segment.
        path: PathBuf,
        /// The decoding error.
        source: serde_json::Error,
    },
    /// A record or snapshot could not be encoded.
    #[error("encoding {what}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// The encoding error.
        source: serde_json::Error,
    },
    /// etcd answered with an error.
    #[error("{what}: {source}")]
    Etcd {
        /// What was being done.
        what: String,
        /// etcd's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A snapshot restore over etcd is under way (or was interrupted): writes are refused
    /// until one finishes.
    #[error(
        "a snapshot restore is in progress ({0}): writes are refused until it finishes; if it was interrupted, run the restore again"
    )]
    RestoreInProgress(String),
    /// etcd did not answer in time (unreachable, or without quorum).
    #[error("{what}: no answer within {}", humantime::format_duration(*after))]
    EtcdTimeout {
        /// What was being done.
        what: String,
        /// How long it was given.
        after: std::time::Duration,
    },
    /// Another live server holds this server's name in etcd.
    #[error(
        "server name {name:?} is held by a live server at {address} (it registered in etcd and renews its lease): give this server its own -node"
    )]
    ServerNameTaken {
        /// The name.
        name: String,
        /// The address the other server reported.
        address: String,
    },
    /// Opening the data dir panicked.
    #[error("opening the data dir panicked")]
    Panicked(#[source] tokio::task::JoinError),
    /// The CA could not be created on first start.
    #[error("bootstrapping the CA")]
    CaBootstrap(#[source] Box<WriteError>),
    /// The CA exists with another cluster id than the one asked for.
    #[error(
        "the CA's cluster id is {existing} (trust domain {existing}.consul), not {wanted}: the id is set when the CA is first created and cannot change under the certificates it issued"
    )]
    ClusterIdMismatch {
        /// The id asked for.
        wanted: String,
        /// The CA's.
        existing: String,
    },
}

/// Why a write was refused. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// The request is invalid; the error names the field.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// A transaction was rolled back: which operation failed, and why.
    #[error("transaction rolled back: {}", .0.iter().map(|e| format!("operation {}: {}", e.op_index, e.what)).collect::<Vec<_>>().join("; "))]
    Txn(Vec<structs::txn::TxnError>),
    /// A KV write is invalid (no key, or a value too large).
    #[error(transparent)]
    Kv(#[from] structs::kv::KvError),
    /// The request names something that does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The CA refused.
    #[error(transparent)]
    Ca(#[from] CaError),
    /// The write is not allowed, whoever asks (a second ACL bootstrap).
    #[error("{0}")]
    Forbidden(String),
    /// The datacenter is not this one.
    #[error("unknown datacenter {0:?}")]
    UnknownDatacenter(String),
    /// The store could not make the write durable (the disk is full, an I/O error): nothing
    /// of it is applied. Later writes are tried again, unless the log could not be cut back
    /// to its last good record (then the store accepts no more writes).
    #[error("storage failure")]
    Storage(#[source] StorageFailure),
    /// The store has been closed.
    #[error("the store is closed")]
    Closed,
}

/// The storage error a write failed with (shared by every write of the batch, and by every
/// later write once the store stopped accepting them).
#[derive(Debug, Clone)]
pub struct StorageFailure(pub std::sync::Arc<StoreError>);

impl std::fmt::Display for StorageFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for StorageFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Two failures are the same failure (one shared error), not merely alike.
impl PartialEq for StorageFailure {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for StorageFailure {}
