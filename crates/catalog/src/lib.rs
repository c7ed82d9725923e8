//! meshd's server state: the catalog of nodes, services and checks, config entries
//! (intentions among them) and the built-in CA, behind one monotonically increasing index.
//!
//! - [`Store`] is the only way in: writes are [`Op`]s, made durable in batches before they
//!   are visible; reads take the current immutable [`State`].
//! - Blocking queries wait on an [`IndexKey`] passing an index ([`Store::wait`]).
//! - The event publisher streams a [`Topic`]'s value, snapshot first ([`Store::subscribe`]).
//!
//! The store knows nothing about xDS. See `docs/catalog.md` for the design and its
//! durability guarantees.

pub mod acl;
mod acl_ops;
mod api_gateways;
pub mod audit;
mod auth_method_ops;
pub mod backend;
pub mod ca;
pub mod ca_pruning;
pub mod cluster;
mod current;
mod embedded;
mod error;
pub mod federation;
mod gateways;
mod jwt_refs;
mod keys;
mod kv_ops;
pub mod liveness;
mod op;
mod ops;
mod peering_ops;
mod plan;
pub mod publisher;
mod replication_ops;
mod session_ops;
pub mod session_reaper;
pub mod snapshot;
mod state;
mod storage;
mod store;
mod token_resolver;
mod txn_ops;
mod views;
pub mod virtual_ips;
mod wal;

pub use auth_method_ops::{AUTH_METHOD_TYPES, BIND_TYPES};
pub use error::{StorageFailure, StoreError, WriteError};
pub use gateways::listener_accepts;
pub use keys::{IndexKey, Topic};
pub use ops::Op;
pub use peering_ops::PeeringOp;
pub use publisher::{Event, Payload, Subscription, SubscriptionError};
pub use state::{Change, State};
pub use storage::WriteOutcome;
pub use store::{Store, StoreConfig};
pub use token_resolver::StoreTokens;
