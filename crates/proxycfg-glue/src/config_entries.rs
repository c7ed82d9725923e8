//! Config entries: one entry (one shared follower per kind and name, whatever the mode: every
//! sidecar watches the `mesh` entry), every entry of a kind (a watch each), and the defaults
//! central config is resolved from.

use crate::derive::{Derive, watched_source};
use crate::fanout::{Fanout, Subscriber, followed_source};
use crate::mode::Mode;
use proxycfg::DataSourceError;
use proxycfg::data_sources::{ConfigEntryListRequest, ConfigEntryRequest};
use proxycfg::forward::Updates;
use std::sync::Arc;
use structs::{ConfigEntry, ConfigEntryKind};
use tokio_util::task::TaskTracker;

/// The global proxy-defaults entry and every service-defaults entry: what central config is
/// resolved from (and what a chain starts from).
pub(crate) fn defaults<M: Mode>(mode: &M) -> (M::Entry, M::Entries) {
    (
        mode.config_entry(ConfigEntryKind::ProxyDefaults, "global"),
        mode.config_entries(ConfigEntryKind::ServiceDefaults),
    )
}

/// One config entry in either mode.
pub(crate) struct Entries<M> {
    mode: Arc<M>,
    followers: Fanout<(ConfigEntryKind, String), Option<Arc<ConfigEntry>>>,
}

impl<M: Mode> Entries<M> {
    /// Entries read through `mode`, their followers tracked by `tasks`.
    pub(crate) fn new(mode: Arc<M>, tasks: &TaskTracker) -> Self {
        Self {
            mode,
            followers: Fanout::new("config_entry", tasks.clone()),
        }
    }

    /// A watch of the shared follower of the entry `req` names.
    fn watch(&self, req: &ConfigEntryRequest) -> Result<Subscriber<Option<Arc<ConfigEntry>>>, DataSourceError> {
        let entry = self.followers.follow_updates(&(req.kind, req.name.clone()), || {
            Derive::every(self.mode.config_entry(req.kind, &req.name), Ok)
        });
        Ok(Subscriber::new(entry))
    }
}

/// Every entry of a kind, read through `mode`: a watch each.
fn list<M: Mode>(
    mode: &M,
    req: &ConfigEntryListRequest,
) -> Result<impl Updates<Arc<Vec<Arc<ConfigEntry>>>> + use<M>, DataSourceError> {
    Ok(Derive::every(mode.config_entries_as(req.kind, req.token.as_ref()), Ok))
}

/// One config entry, from the catalog (server mode).
#[cfg(feature = "server")]
pub struct ServerConfigEntry(pub(crate) Entries<crate::server_mode::Catalog>);

#[cfg(feature = "server")]
followed_source!(ServerConfigEntry, ConfigEntryRequest, |s, req| s.0.watch(req));

/// Config entries of a kind, from the catalog (server mode).
#[cfg(feature = "server")]
pub struct ServerConfigEntryList(pub(crate) Arc<crate::server_mode::Catalog>);

#[cfg(feature = "server")]
watched_source!(ServerConfigEntryList, ConfigEntryListRequest, |s, req| list(
    &*s.0, &req
));

/// One config entry, from the agent cache (agent mode).
#[cfg(feature = "cache")]
pub struct CacheConfigEntry(pub(crate) Entries<crate::cache_mode::AgentCache>);

#[cfg(feature = "cache")]
followed_source!(CacheConfigEntry, ConfigEntryRequest, |s, req| s.0.watch(req));

/// Config entries of a kind, from the agent cache (agent mode).
#[cfg(feature = "cache")]
pub struct CacheConfigEntryList(pub(crate) Arc<crate::cache_mode::AgentCache>);

#[cfg(feature = "cache")]
watched_source!(CacheConfigEntryList, ConfigEntryListRequest, |s, req| list(&*s.0, &req));
