//! Discovery chains, compiled from the routing entries by the `discovery-chain` compiler the
//! same way in either mode. A chain reads every resolver, router and splitter (it may lead
//! through other services' entries; in agent mode the three kinds are three cache entries
//! for all chains, rather than three blocking queries per upstream), so a change to any of
//! them recompiles it; an unchanged chain is not sent again. One shared follower per request.

use crate::config_entries::defaults;
use crate::derive::Derive;
use crate::fanout::{Fanout, Subscriber, followed_source};
use crate::mode::Mode;
use proxycfg::DataSourceError;
use proxycfg::data_sources::DiscoveryChainRequest;
use proxycfg::forward::Updates;
use std::sync::Arc;
use std::time::Duration;
use structs::central_config::proxy_defaults;
use structs::{CompiledDiscoveryChain, ConfigEntry, ConfigEntryKind};
use tokio_util::task::TaskTracker;

/// The config entries a chain is compiled from.
pub(crate) struct ChainInputs<'a> {
    /// The global proxy-defaults entry.
    pub(crate) proxy_defaults: Option<&'a Arc<ConfigEntry>>,
    /// Every service-defaults entry.
    pub(crate) service_defaults: &'a [Arc<ConfigEntry>],
    /// The CA's trust domain.
    pub(crate) trust_domain: &'a str,
    /// Every service-resolver, service-router and service-splitter entry.
    pub(crate) resolvers: &'a [Arc<ConfigEntry>],
    pub(crate) routers: &'a [Arc<ConfigEntry>],
    pub(crate) splitters: &'a [Arc<ConfigEntry>],
}

impl ChainInputs<'_> {
    /// The compiled chain, or why it cannot be compiled (entries are checked at write time,
    /// so this is rare: an upstream's own protocol override, for one). The proxy shows the
    /// error and keeps its last good chain for the upstream.
    pub(crate) fn compile(&self, req: &DiscoveryChainRequest) -> Result<CompiledDiscoveryChain, DataSourceError> {
        let entries = discovery_chain::Entries {
            proxy_defaults: proxy_defaults(self.proxy_defaults),
            service_defaults: self.service_defaults,
            resolvers: self.resolvers,
            routers: self.routers,
            splitters: self.splitters,
            intentions: &[],
        };
        let compile = discovery_chain::CompileRequest {
            service: &req.name,
            datacenter: &req.datacenter,
            trust_domain: self.trust_domain,
            override_protocol: req.override_protocol,
            override_connect_timeout: (req.override_connect_timeout_ms != 0)
                .then(|| Duration::from_millis(u64::from(req.override_connect_timeout_ms))),
        };
        discovery_chain::compile(&compile, &entries)
            .map_err(|e| DataSourceError::InvalidRequest(format!("discovery chain for {:?}: {e}", req.name)))
    }
}

/// Chains in either mode: one shared follower per request.
pub(crate) struct Chains<M> {
    mode: Arc<M>,
    followers: Fanout<DiscoveryChainRequest, Arc<CompiledDiscoveryChain>>,
}

impl<M: Mode> Chains<M> {
    /// Chains compiled from what `mode` reads, their followers tracked by `tasks`.
    pub(crate) fn new(mode: Arc<M>, tasks: &TaskTracker) -> Self {
        Self {
            mode,
            followers: Fanout::new("discovery_chain", tasks.clone()),
        }
    }

    /// A watch of the shared follower compiling the chain `req` asks for. A chain for
    /// another datacenter (an upstream's `Datacenter`) is compiled here, from this
    /// datacenter's entries, as Consul's is: its targets are in that datacenter.
    fn watch(&self, req: &DiscoveryChainRequest) -> Result<Subscriber<Arc<CompiledDiscoveryChain>>, DataSourceError> {
        Ok(Subscriber::new(self.followers.follow_updates(req, || self.derive(req))))
    }

    /// The chain `req` asks for, compiled on every change of its inputs.
    fn derive(&self, req: &DiscoveryChainRequest) -> impl Updates<Arc<CompiledDiscoveryChain>> + use<M> {
        let mode = &*self.mode;
        let routing = (
            mode.config_entries(ConfigEntryKind::ServiceResolver),
            mode.config_entries(ConfigEntryKind::ServiceRouter),
            mode.config_entries(ConfigEntryKind::ServiceSplitter),
        );
        let req = req.clone();
        Derive::distinct(
            (defaults(mode), mode.roots(), routing),
            move |((proxy, services), roots, (resolvers, routers, splitters))| {
                let inputs = ChainInputs {
                    proxy_defaults: proxy.as_ref(),
                    service_defaults: &services,
                    trust_domain: &roots.trust_domain,
                    resolvers: &resolvers,
                    routers: &routers,
                    splitters: &splitters,
                };
                inputs.compile(&req).map(Arc::new)
            },
        )
    }
}

/// Discovery chains compiled from the catalog's entries (server mode).
#[cfg(feature = "server")]
pub struct ServerDiscoveryChain(pub(crate) Chains<crate::server_mode::Catalog>);

#[cfg(feature = "server")]
followed_source!(ServerDiscoveryChain, DiscoveryChainRequest, |s, req| s.0.watch(req));

/// Discovery chains compiled from the entries in the agent cache (agent mode).
#[cfg(feature = "cache")]
pub struct CacheDiscoveryChain(pub(crate) Chains<crate::cache_mode::AgentCache>);

#[cfg(feature = "cache")]
followed_source!(CacheDiscoveryChain, DiscoveryChainRequest, |s, req| s.0.watch(req));
