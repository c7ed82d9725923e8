//! meshd's proxy config engine.
//!
//! A [`Manager`] keeps one State per registered proxy. A State is a task that starts the
//! watches its proxy's kind needs (through [`DataSources`], whose implementations live
//! elsewhere: agent cache, server catalog, or the in-memory fakes of `fake`), folds each [`UpdateEvent`] into the
//! proxy's [`ConfigSnapshot`], and publishes an immutable, shared snapshot, at most once per
//! short coalescing window. Consumers such as the xDS server [`Manager::watch`] a proxy and always
//! get the newest snapshot.
//!
//! See `docs/proxycfg.md` for the state machine, watch ids, chained watches and sharing.

mod correlation;
pub mod data_sources;
pub mod fake;
pub mod forward;
pub mod handler;
mod manager;
mod metrics;
mod rate_limit;
mod registration;
mod serve;
pub mod snapshot;
mod state;
mod watches;

pub use correlation::CorrelationId;
pub use data_sources::{
    DataSource, DataSourceError, DataSources, EventSender, Subscription, UpdateEvent, UpdatePayload, WatchFuture,
    WatchRequest,
};
pub use manager::{DEFAULT_COALESCE, Manager, ManagerConfig, ProxyStatus, RegisterError, WatchEvent, Watcher};
pub use metrics::{Metrics, MetricsSnapshot};
pub use rate_limit::RateLimit;
pub use registration::{ProxyRegistration, ProxySource, Registered};
pub use serve::{ConfigSource, ProxyRequest, SnapshotSource, SourceError, SourceLease};
pub use snapshot::{
    API_GATEWAY_ROUTE_KINDS, ApiGatewaySnapshot, ConfigSnapshot, ConnectProxySnapshot, DestinationUpstream,
    IngressGatewaySnapshot, KindSnapshot, LinkedServiceSnapshot, MeshGatewaySnapshot, ProxyId, TargetEndpoints,
    TerminatingGatewaySnapshot, UpstreamSnapshot,
};
pub use watches::Watches;
