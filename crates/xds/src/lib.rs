//! meshd's xDS server: state-of-the-world and delta ADS over tonic, serving resources built
//! from proxycfg snapshots to Envoy and proxyless gRPC clients.
//!
//! - [`resources`]: snapshot → clusters, endpoints, listeners, routes.
//! - [`delta`] and [`sotw`]: the per-stream protocol state machines (pure, tested alone).
//! - [`XdsServer`] and its gRPC [`AdsService`]: one driver per stream, polled by the transport.
//!
//! The server never reads the catalog: it gets snapshots from a [`SnapshotSource`].

mod authorize;
mod content;
pub mod csds;
pub mod delta;
mod framing;
mod grpc;
mod metrics;
pub mod resources;
mod server;
pub mod sotw;
pub mod status;
pub mod versioned;

pub use authorize::{Authorization, StreamAuthorizer};
pub use framing::BUFFER_BYTES;
pub use grpc::AdsService;
pub use metrics::XdsMetrics;
pub use proxycfg::SnapshotSource;
pub use server::{Admission, XdsServer};

/// Envoy's node, as streams identify themselves.
pub use envoy_types::pb::envoy::config::core::v3::Node;
/// The kinds of a node-metadata value.
pub use envoy_types::pb::google::protobuf::value::Kind as ValueKind;
