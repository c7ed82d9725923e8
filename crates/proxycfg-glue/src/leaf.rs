//! Leaf certificates: the one resource whose modes differ in kind, not only in where they
//! read. A server signs with the CA it holds; an agent generates its own key and has a server
//! sign it (through the agent cache, which also renews it).

#[cfg(feature = "server")]
pub use on_server::ServerLeaf;

#[cfg(feature = "server")]
mod on_server {
    use crate::fanout::{Follow, Subscriber, followed_source};
    use crate::roots::Roots;
    use crate::server_mode::Catalog;
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::{CaRootsRequest, LeafRequest};
    use std::sync::Arc;
    use std::task::{Context, Poll};
    use std::time::{Duration, SystemTime};
    use structs::{IndexedCaRoots, IssuedCert};

    /// Leaf certificates from the catalog's CA (server mode): reissued when the CA roots
    /// change and refreshed before they expire.
    pub struct ServerLeaf {
        catalog: Arc<Catalog>,
        /// The shared roots followers (the CA roots data source's).
        roots: Arc<Roots<Catalog>>,
    }

    impl ServerLeaf {
        pub(crate) fn new(catalog: Arc<Catalog>, roots: Arc<Roots<Catalog>>) -> Self {
            Self { catalog, roots }
        }

        fn watch(&self, req: &LeafRequest) -> Result<LeafWatch, DataSourceError> {
            let roots = self.roots.follow(&CaRootsRequest {
                datacenter: req.datacenter.clone(),
            })?;
            Ok(LeafWatch {
                roots: Subscriber::new(roots),
                renew: None,
                catalog: Arc::clone(&self.catalog),
                req: req.clone(),
            })
        }
    }

    followed_source!(ServerLeaf, LeafRequest, |s, req| s.watch(req));

    /// One leaf watch: the certificate again whenever the CA roots change (a subscriber of
    /// the shared roots follower), and when it is due for renewal (the store reissues it
    /// then), on a timer of its own.
    struct LeafWatch {
        roots: Subscriber<Arc<IndexedCaRoots>>,
        /// When to ask again, once a certificate was had.
        renew: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
        catalog: Arc<Catalog>,
        req: LeafRequest,
    }

    impl Follow for LeafWatch {
        type Item = Arc<IssuedCert>;

        fn poll_follow(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Self::Item, DataSourceError>>> {
            let mut due = match self.roots.poll_value(cx) {
                // The store closed: the watch ends.
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(_)) => true,
                Poll::Pending => false,
            };
            if let Some(renew) = &mut self.renew {
                due |= renew.as_mut().poll(cx).is_ready();
            }
            if !due {
                return Poll::Pending;
            }
            let result = self
                .catalog
                .store
                .leaf_with_sans(&self.req.service, &self.req.dns_sans)
                .map_err(|e| DataSourceError::Unavailable(e.to_string()));
            if let Ok(cert) = &result {
                let due = cert.renew_at() + Duration::from_secs(1);
                let wait = due.duration_since(SystemTime::now()).unwrap_or(Duration::from_secs(1));
                let at = tokio::time::Instant::now() + wait;
                match &mut self.renew {
                    Some(renew) => renew.as_mut().reset(at),
                    None => self.renew = Some(Box::pin(tokio::time::sleep_until(at))),
                }
            }
            Poll::Ready(Some(result))
        }
    }
}

#[cfg(feature = "cache")]
pub use on_cache::CacheLeaf;

#[cfg(feature = "cache")]
mod on_cache {
    use crate::cache_mode::{AgentCache, CacheInput};
    use crate::derive::{Derive, watched_source};
    use crate::mode::Mode;
    use agent_cache::leaf::LeafKey;
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::LeafRequest;
    use proxycfg::forward::Updates;
    use std::sync::Arc;
    use structs::IssuedCert;

    /// Leaf certificates signed from keys this agent generated (agent mode), renewed before
    /// expiry and when the active root changes (the leaf cache does both).
    pub struct CacheLeaf(pub(crate) Arc<AgentCache>);

    impl CacheLeaf {
        fn updates(&self, req: LeafRequest) -> Result<impl Updates<Arc<IssuedCert>> + use<>, DataSourceError> {
            self.0.check_dc(&req.datacenter)?;
            // One cache entry (one key) however the names are listed.
            let mut dns_sans = req.dns_sans;
            dns_sans.sort();
            dns_sans.dedup();
            let key = LeafKey {
                service: req.service,
                dns_sans,
                token: req.token,
            };
            Ok(Derive::every(CacheInput::new(self.0.caches.leaf.watch(&key)), Ok))
        }
    }

    watched_source!(CacheLeaf, LeafRequest, |s, req| s.updates(req));
}
