//! Data-source implementations for proxycfg, one per resource per mode.
//!
//! - [`server_data_sources`]: `Server*` sources for servers (agentless proxies), answered
//!   from the catalog's event publisher; derived values are shared between proxies.
//!
//! No snapshot logic lives here: a source only turns catalog data into watch results.

mod fanout;
mod follow;
mod resolve;
mod server;
mod views;

pub use server::{
    ServerCaRoots, ServerConfigEntry, ServerConfigEntryList, ServerDatacenters, ServerDiscoveryChain,
    ServerGatewayServices, ServerHealth, ServerHttpChecks, ServerIntentions, ServerLeaf, ServerPreparedQuery,
    ServerResolvedServiceConfig, ServerServiceList, server_data_sources,
};
