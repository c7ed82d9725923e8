//! Data-source implementations for proxycfg, one per resource per mode.
//!
//! - [`server_data_sources`]: `Server*` sources for servers (agentless proxies), answered
//!   from the catalog's event publisher; derived values are shared between proxies.
//!
//! No snapshot logic lives here: a source only turns catalog data into watch results.
//!
//! The catalog-backed `Server*` family is behind the `server` feature (on by default); the
//! sharing mechanisms (fanout followers, views) serve every family.

#[cfg_attr(not(feature = "server"), allow(dead_code))]
mod fanout;
#[cfg(feature = "server")]
mod follow;
#[cfg(feature = "server")]
mod resolve;
#[cfg(feature = "server")]
mod server;
#[cfg_attr(not(feature = "server"), allow(dead_code))]
mod views;

#[cfg(feature = "server")]
pub use server::{
    ServerCaRoots, ServerConfigEntry, ServerConfigEntryList, ServerDatacenters, ServerDiscoveryChain,
    ServerGatewayServices, ServerHealth, ServerHttpChecks, ServerIntentions, ServerLeaf, ServerPreparedQuery,
    ServerResolvedServiceConfig, ServerServiceList, server_data_sources, server_data_sources_tracked,
};
