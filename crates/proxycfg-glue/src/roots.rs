//! CA roots (the trust bundle): one shared follower per request, whatever the mode (every
//! proxy watches the roots, and server-mode leaves follow them too).

use crate::derive::Derive;
use crate::fanout::{Entry, Fanout, Subscriber, followed_source};
use crate::mode::Mode;
use proxycfg::DataSourceError;
use proxycfg::data_sources::CaRootsRequest;
use std::sync::Arc;
use structs::IndexedCaRoots;
use tokio_util::task::TaskTracker;

/// The roots in either mode: one follower per request, shared by its watches.
pub(crate) struct Roots<M> {
    mode: Arc<M>,
    followers: Fanout<CaRootsRequest, Arc<IndexedCaRoots>>,
}

impl<M: Mode> Roots<M> {
    /// Roots read through `mode`, their followers tracked by `tasks`.
    pub(crate) fn new(mode: Arc<M>, tasks: &TaskTracker) -> Self {
        Self {
            mode,
            followers: Fanout::new("ca_roots", tasks.clone()),
        }
    }

    /// The shared follower answering `req`.
    pub(crate) fn follow(&self, req: &CaRootsRequest) -> Result<Arc<Entry<Arc<IndexedCaRoots>>>, DataSourceError> {
        self.mode.check_dc(&req.datacenter)?;
        Ok(self
            .followers
            .follow_updates(req, || Derive::every(self.mode.roots(), Ok)))
    }

    /// A watch of the shared follower answering `req`.
    fn watch(&self, req: &CaRootsRequest) -> Result<Subscriber<Arc<IndexedCaRoots>>, DataSourceError> {
        self.follow(req).map(Subscriber::new)
    }
}

/// CA roots, from the catalog's CA (server mode).
#[cfg(feature = "server")]
pub struct ServerCaRoots(pub(crate) Arc<Roots<crate::server_mode::Catalog>>);

#[cfg(feature = "server")]
followed_source!(ServerCaRoots, CaRootsRequest, |s, req| s.0.watch(req));

/// CA roots, from the agent cache (agent mode).
#[cfg(feature = "cache")]
pub struct CacheCaRoots(pub(crate) Roots<crate::cache_mode::AgentCache>);

#[cfg(feature = "cache")]
followed_source!(CacheCaRoots, CaRootsRequest, |s, req| s.0.watch(req));
