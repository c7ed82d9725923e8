//! Data-source implementations for proxycfg, one file per resource, each holding both modes:
//!
//! - `Server*` (feature `server`, [`server_data_sources`]): for servers and their agentless
//!   proxies, answered from the catalog's event publisher.
//! - `Cache*` (feature `cache`, [`cache_data_sources`]): for agents and the proxies on their
//!   host, answered from the agent cache's blocking queries against the servers.
//!
//! No snapshot logic lives here: a source only turns data into watch results. Both modes run
//! on one framework: a mode supplies inputs (`mode`: catalog topics in `server_mode`, cache
//! entries in `cache_mode`), one helper waits for every input, derives and drops a repeat
//! (`derive`), and values many proxies watch are derived once by a shared follower per
//! request (`fanout`). An agent-only build (`cache` without `server`) does not compile the
//! catalog crate.

#[cfg(feature = "cache")]
mod cache_mode;
mod derive;
mod fanout;
mod mode;
#[cfg(feature = "server")]
mod server_mode;
mod views;
#[cfg(feature = "server")]
pub mod what_if;

// One module per resource, each with its `Server*` and `Cache*` variant.
mod chain;
mod config_entries;
mod datacenters;
mod gateway_services;
mod health;
mod http_checks;
mod intentions;
mod leaf;
mod peering;
mod prepared_query;
mod resolved_config;
mod roots;
mod service_list;

#[cfg(feature = "cache")]
pub use cache_sources::{cache_data_sources, cache_data_sources_tracked};
#[cfg(feature = "server")]
pub use server_sources::{server_data_sources, server_data_sources_tracked};

#[cfg(feature = "cache")]
pub use {
    chain::CacheDiscoveryChain,
    config_entries::{CacheConfigEntry, CacheConfigEntryList},
    datacenters::{CacheDatacenters, CacheMeshGateways},
    gateway_services::CacheGatewayServices,
    health::CacheHealth,
    http_checks::{CacheHttpChecks, LocalChecks},
    intentions::CacheIntentions,
    leaf::CacheLeaf,
    peering::{CachePeerTrustBundles, CachePeeredUpstream, CachePeeringServers},
    prepared_query::CachePreparedQuery,
    resolved_config::CacheResolvedServiceConfig,
    roots::CacheCaRoots,
    service_list::CacheServiceList,
};
#[cfg(feature = "server")]
pub use {
    chain::ServerDiscoveryChain,
    config_entries::{ServerConfigEntry, ServerConfigEntryList},
    datacenters::{ServerDatacenters, ServerMeshGateways},
    gateway_services::ServerGatewayServices,
    health::ServerHealth,
    http_checks::ServerHttpChecks,
    intentions::ServerIntentions,
    leaf::ServerLeaf,
    peering::{ServerPeerTrustBundles, ServerPeeredUpstream, ServerPeeringServers},
    prepared_query::ServerPreparedQuery,
    resolved_config::ServerResolvedServiceConfig,
    roots::ServerCaRoots,
    service_list::ServerServiceList,
};

/// The server-mode sources, assembled.
#[cfg(feature = "server")]
mod server_sources {
    use super::*;
    use crate::server_mode::Catalog;
    use catalog::Store;
    use proxycfg::DataSources;
    use std::sync::Arc;
    use tokio_util::task::TaskTracker;

    /// Builds the server-mode [`DataSources`] over a catalog store (shared followers
    /// untracked: each ends with its last watch or when the store closes).
    pub fn server_data_sources(store: Store) -> DataSources {
        server_data_sources_tracked(store, &TaskTracker::new())
    }

    /// Builds the server-mode [`DataSources`]; every shared follower task they start is
    /// tracked by `tasks`, so the owner can wait for them after its proxies stopped.
    pub fn server_data_sources_tracked(store: Store, tasks: &TaskTracker) -> DataSources {
        let mode = Arc::new(Catalog { store });
        let roots = Arc::new(roots::Roots::new(Arc::clone(&mode), tasks));
        DataSources {
            ca_roots: Arc::new(ServerCaRoots(Arc::clone(&roots))),
            leaf: Arc::new(ServerLeaf::new(Arc::clone(&mode), roots)),
            intentions: Arc::new(ServerIntentions(Arc::clone(&mode))),
            health: Arc::new(ServerHealth::new(Arc::clone(&mode), tasks)),
            discovery_chain: Arc::new(ServerDiscoveryChain(chain::Chains::new(Arc::clone(&mode), tasks))),
            config_entry: Arc::new(ServerConfigEntry(config_entries::Entries::new(
                Arc::clone(&mode),
                tasks,
            ))),
            config_entry_list: Arc::new(ServerConfigEntryList(Arc::clone(&mode))),
            resolved_service_config: Arc::new(ServerResolvedServiceConfig(resolved_config::ResolvedConfigs::new(
                Arc::clone(&mode),
                tasks,
            ))),
            service_list: Arc::new(ServerServiceList(Arc::clone(&mode))),
            datacenters: Arc::new(ServerDatacenters(Arc::clone(&mode))),
            mesh_gateways: Arc::new(ServerMeshGateways::new(Arc::clone(&mode))),
            gateway_services: Arc::new(ServerGatewayServices(Arc::clone(&mode))),
            http_checks: Arc::new(ServerHttpChecks),
            prepared_query: Arc::new(ServerPreparedQuery(Arc::clone(&mode))),
            peered_upstream: Arc::new(ServerPeeredUpstream(Arc::clone(&mode))),
            peer_trust_bundles: Arc::new(ServerPeerTrustBundles(Arc::clone(&mode))),
            peering_servers: Arc::new(ServerPeeringServers(Arc::clone(&mode))),
        }
    }
}

/// The agent-mode sources, assembled.
#[cfg(feature = "cache")]
mod cache_sources {
    use super::*;
    use crate::cache_mode::AgentCache;
    use agent_cache::AgentCaches;
    use proxycfg::DataSources;
    use std::sync::Arc;
    use tokio_util::task::TaskTracker;

    /// Builds the agent-mode [`DataSources`] over the agent's caches and its local checks
    /// (shared followers untracked: each ends with its last watch or when the caches shut
    /// down).
    pub fn cache_data_sources(caches: AgentCaches, local: Arc<dyn LocalChecks>) -> DataSources {
        cache_data_sources_tracked(caches, local, &TaskTracker::new())
    }

    /// Builds the agent-mode [`DataSources`]; every shared follower task they start is
    /// tracked by `tasks`, so the owner can wait for them after its proxies stopped.
    pub fn cache_data_sources_tracked(
        caches: AgentCaches,
        local: Arc<dyn LocalChecks>,
        tasks: &TaskTracker,
    ) -> DataSources {
        let mode = Arc::new(AgentCache { caches });
        DataSources {
            ca_roots: Arc::new(CacheCaRoots(roots::Roots::new(Arc::clone(&mode), tasks))),
            leaf: Arc::new(CacheLeaf(Arc::clone(&mode))),
            intentions: Arc::new(CacheIntentions(Arc::clone(&mode))),
            health: Arc::new(CacheHealth::new(Arc::clone(&mode), tasks)),
            discovery_chain: Arc::new(CacheDiscoveryChain(chain::Chains::new(Arc::clone(&mode), tasks))),
            config_entry: Arc::new(CacheConfigEntry(config_entries::Entries::new(Arc::clone(&mode), tasks))),
            config_entry_list: Arc::new(CacheConfigEntryList(Arc::clone(&mode))),
            resolved_service_config: Arc::new(CacheResolvedServiceConfig(resolved_config::ResolvedConfigs::new(
                Arc::clone(&mode),
                tasks,
            ))),
            service_list: Arc::new(CacheServiceList(Arc::clone(&mode))),
            datacenters: Arc::new(CacheDatacenters(Arc::clone(&mode))),
            mesh_gateways: Arc::new(CacheMeshGateways(Arc::clone(&mode))),
            gateway_services: Arc::new(CacheGatewayServices(Arc::clone(&mode))),
            http_checks: Arc::new(CacheHttpChecks(local)),
            prepared_query: Arc::new(CachePreparedQuery(Arc::clone(&mode))),
            peered_upstream: Arc::new(CachePeeredUpstream(Arc::clone(&mode))),
            peer_trust_bundles: Arc::new(CachePeerTrustBundles(Arc::clone(&mode))),
            peering_servers: Arc::new(CachePeeringServers(Arc::clone(&mode))),
        }
    }
}
