//! Data-source implementations for proxycfg, one per resource per mode.
//!
//! - [`server_data_sources`] (feature `server`): `Server*` sources for servers (agentless
//!   proxies), answered from the catalog's event publisher; derived values are shared between
//!   proxies.
//! - [`cache_data_sources`] (feature `cache`): `Cache*` sources for agents (the proxies on
//!   their host), answered from the agent cache's blocking queries against the servers.
//!
//! No snapshot logic lives here: a source only turns data into watch results. What both
//! families derive (discovery chains, resolved central config, filtered health) is derived
//! once, in `resolve`; an agent-only build (`cache` without `server`) does not compile the
//! catalog crate.

#[cfg(feature = "cache")]
mod cache;
mod common;
#[cfg_attr(not(feature = "server"), allow(dead_code))]
mod fanout;
#[cfg(feature = "server")]
mod follow;
#[cfg_attr(not(any(feature = "server", feature = "cache")), allow(dead_code))]
mod resolve;
#[cfg(feature = "server")]
mod server;
#[cfg_attr(not(feature = "server"), allow(dead_code))]
mod views;

#[cfg(feature = "cache")]
pub use cache::{
    CacheCaRoots, CacheConfigEntry, CacheConfigEntryList, CacheDatacenters, CacheDiscoveryChain, CacheGatewayServices,
    CacheHealth, CacheHttpChecks, CacheIntentions, CacheLeaf, CacheResolvedServiceConfig, CacheServiceList,
    LocalChecks, cache_data_sources,
};
pub use common::PreparedQueriesUnsupported;
#[cfg(feature = "server")]
pub use server::{
    ServerCaRoots, ServerConfigEntry, ServerConfigEntryList, ServerDatacenters, ServerDiscoveryChain,
    ServerGatewayServices, ServerHealth, ServerHttpChecks, ServerIntentions, ServerLeaf, ServerResolvedServiceConfig,
    ServerServiceList, server_data_sources, server_data_sources_tracked,
};
