//! For a storage kept outside this crate (catalog-etcd: the catalog in etcd, shared by
//! several servers): what a [`Store`](crate::Store) opened with a [`Backend`] hands it, and
//! what its writer works with. The embedded log (a data dir, or memory only) is the storage
//! of a store opened without one.
//!
//! A backend opens its storage and reads the state it holds ([`Backend::open`]), then makes
//! every state current through [`Current`] (readers, blocking queries and subscribers follow
//! it) and answers each queued write ([`Writes`], [`Job`]) once it is durable, planning each
//! with [`Planned::of`] as the embedded log's writer does.

pub use crate::current::Current;
pub use crate::state::PersistedState;
pub use crate::storage::{Job, Planned, Storage, Writes};

use crate::error::StoreError;
use std::sync::Arc;

/// Where a store keeps its catalog when it is not the embedded log: set as
/// [`StoreConfig::backend`](crate::StoreConfig::backend).
#[async_trait::async_trait]
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Opens the storage and reads the catalog it holds (a one-line error when it cannot),
    /// makes that state current (`publish_buffer` events buffered per topic) and starts the
    /// writer on `writes`.
    async fn open(&self, publish_buffer: usize, writes: Writes)
    -> Result<(Arc<dyn Storage>, Arc<Current>), StoreError>;
}
