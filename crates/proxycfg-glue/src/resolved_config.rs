//! Central config resolved for a service and its upstreams: proxy-defaults merged with the
//! service's defaults (`structs::central_config`, which also merges them into registrations).
//! One shared follower reads the defaults; each watch resolves its own request from them,
//! and proxies asking the same share the resolved value (`views`).

use crate::config_entries::defaults;
use crate::derive::{Derive, Versioned};
use crate::fanout::{Fanout, Follow, Mapped, followed_source};
use crate::mode::Mode;
use crate::views::Views;
use proxycfg::DataSourceError;
use proxycfg::data_sources::ResolvedServiceConfigRequest;
use std::sync::Arc;
use structs::central_config::{CentralConfig, proxy_defaults};
use structs::{ConfigEntry, ResolvedServiceConfig};
use tokio_util::task::TaskTracker;

/// The global proxy defaults and every service's defaults, with the versions they were read
/// at.
struct Defaults {
    proxy: Option<Arc<ConfigEntry>>,
    services: Arc<Vec<Arc<ConfigEntry>>>,
    versions: Vec<u64>,
}

/// Central config resolved for `req` from the defaults.
fn resolve(
    req: &ResolvedServiceConfigRequest,
    proxy: Option<&Arc<ConfigEntry>>,
    services: &[Arc<ConfigEntry>],
) -> ResolvedServiceConfig {
    CentralConfig::new(proxy_defaults(proxy), services).resolve(&req.name, &req.upstreams)
}

/// Central config resolved for a service with no upstreams (a sidecar's own, as its
/// handler asks for it).
#[cfg(feature = "server")]
pub(crate) fn resolve_for(
    service: &str,
    proxy: Option<&Arc<ConfigEntry>>,
    services: &[Arc<ConfigEntry>],
) -> ResolvedServiceConfig {
    CentralConfig::new(proxy_defaults(proxy), services).resolve(service, &[])
}

/// Resolved configs in either mode.
pub(crate) struct ResolvedConfigs<M> {
    mode: Arc<M>,
    /// Resolved values by request and defaults versions, shared by the watches asking the same.
    resolved: Arc<Views<ResolvedServiceConfigRequest, ResolvedServiceConfig>>,
    /// The one follower of the defaults.
    defaults: Fanout<(), Arc<Defaults>>,
}

impl<M: Mode> ResolvedConfigs<M> {
    /// Configs resolved from what `mode` reads, the defaults follower tracked by `tasks`.
    pub(crate) fn new(mode: Arc<M>, tasks: &TaskTracker) -> Self {
        Self {
            mode,
            resolved: Arc::default(),
            defaults: Fanout::new("defaults", tasks.clone()),
        }
    }

    /// The watch of `req`: the shared defaults, resolved for it.
    fn watch(
        &self,
        req: &ResolvedServiceConfigRequest,
    ) -> Result<impl Follow<Item = Arc<ResolvedServiceConfig>> + use<M>, DataSourceError> {
        self.mode.check_dc(&req.datacenter)?;
        let defaults = self.defaults.follow_updates(&(), || {
            Derive::every(Versioned(defaults(&*self.mode)), |((proxy, services), versions)| {
                Ok(Arc::new(Defaults {
                    proxy,
                    services,
                    versions,
                }))
            })
        });
        let (resolved, req) = (Arc::clone(&self.resolved), req.clone());
        let derive = move |d: Arc<Defaults>| {
            Some(Ok(resolved.get_or_make(&req, &d.versions, || {
                resolve(&req, d.proxy.as_ref(), &d.services)
            })))
        };
        Ok(Mapped::new(defaults, derive))
    }
}

/// Central config resolved from the catalog's defaults (server mode).
#[cfg(feature = "server")]
pub struct ServerResolvedServiceConfig(pub(crate) ResolvedConfigs<crate::server_mode::Catalog>);

#[cfg(feature = "server")]
followed_source!(ServerResolvedServiceConfig, ResolvedServiceConfigRequest, |s, req| {
    s.0.watch(req)
});

/// Central config resolved from the defaults in the agent cache (agent mode).
#[cfg(feature = "cache")]
pub struct CacheResolvedServiceConfig(pub(crate) ResolvedConfigs<crate::cache_mode::AgentCache>);

#[cfg(feature = "cache")]
followed_source!(CacheResolvedServiceConfig, ResolvedServiceConfigRequest, |s, req| {
    s.0.watch(req)
});
