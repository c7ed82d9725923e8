//! Cluster peering: the services peers export here (an upstream with `DestinationPeer`,
//! with the peer's trust bundle), and the trust bundles of the peers a service is exported
//! to (whose callers its sidecars accept). A value equal to the last one sent is not sent
//! again.

#[cfg(feature = "server")]
pub use on_server::{ServerPeerTrustBundles, ServerPeeredUpstream, ServerPeeringServers};

#[cfg(feature = "server")]
mod on_server {
    use crate::derive::{Derive, watched_source};
    use crate::server_mode::{Catalog, TopicInput};
    use catalog::{Payload, Topic};
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::{PeerTrustBundlesRequest, PeeredUpstreamRequest, PeeringServersRequest};
    use proxycfg::forward::Updates;
    use std::sync::Arc;
    use structs::peering::{PeerTrustBundle, PeeredUpstream, PeeringServers};

    /// A service a peer exports here, as the catalog holds it (server mode).
    pub struct ServerPeeredUpstream(pub(crate) Arc<Catalog>);

    impl ServerPeeredUpstream {
        fn updates(
            &self,
            req: PeeredUpstreamRequest,
        ) -> Result<impl Updates<Arc<PeeredUpstream>> + use<>, DataSourceError> {
            let input = TopicInput::new(
                &self.0.store,
                Topic::PeeredService(req.peer, req.service),
                |p| match p {
                    Payload::PeeredService(v) => Some(Arc::clone(v)),
                    _ => None,
                },
            );
            Ok(Derive::distinct(input, Ok))
        }
    }

    watched_source!(ServerPeeredUpstream, PeeredUpstreamRequest, |s, req| s.updates(req));

    /// The trust bundles of the peers a service is exported to (server mode).
    pub struct ServerPeerTrustBundles(pub(crate) Arc<Catalog>);

    impl ServerPeerTrustBundles {
        fn updates(
            &self,
            req: PeerTrustBundlesRequest,
        ) -> Result<impl Updates<Arc<Vec<PeerTrustBundle>>> + use<>, DataSourceError> {
            let input = TopicInput::new(&self.0.store, Topic::PeerTrustBundles(req.service), |p| match p {
                Payload::PeerTrustBundles(v) => Some(Arc::clone(v)),
                _ => None,
            });
            Ok(Derive::distinct(input, Ok))
        }
    }

    watched_source!(ServerPeerTrustBundles, PeerTrustBundlesRequest, |s, req| s.updates(req));

    /// Where the peering calls go (server mode).
    pub struct ServerPeeringServers(pub(crate) Arc<Catalog>);

    impl ServerPeeringServers {
        fn updates(
            &self,
            _req: PeeringServersRequest,
        ) -> Result<impl Updates<Arc<PeeringServers>> + use<>, DataSourceError> {
            let input = TopicInput::new(&self.0.store, Topic::PeeringServers, |p| match p {
                Payload::PeeringServers(v) => Some(Arc::clone(v)),
                _ => None,
            });
            Ok(Derive::distinct(input, Ok))
        }
    }

    watched_source!(ServerPeeringServers, PeeringServersRequest, |s, req| s.updates(req));
}

#[cfg(feature = "cache")]
pub use on_cache::{CachePeerTrustBundles, CachePeeredUpstream, CachePeeringServers};

#[cfg(feature = "cache")]
mod on_cache {
    use crate::cache_mode::{AgentCache, CacheInput};
    use crate::derive::{Derive, watched_source};
    use agent_cache::types::{PeerTrustBundlesKey, PeeredUpstreamKey, PeeringServersKey};
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::{PeerTrustBundlesRequest, PeeredUpstreamRequest, PeeringServersRequest};
    use proxycfg::forward::Updates;
    use std::sync::Arc;
    use structs::peering::{PeerTrustBundle, PeeredUpstream, PeeringServers};

    /// A service a peer exports here, from the servers through the agent cache (agent
    /// mode).
    pub struct CachePeeredUpstream(pub(crate) Arc<AgentCache>);

    impl CachePeeredUpstream {
        fn updates(
            &self,
            req: PeeredUpstreamRequest,
        ) -> Result<impl Updates<Arc<PeeredUpstream>> + use<>, DataSourceError> {
            let key = PeeredUpstreamKey {
                peer: req.peer,
                service: req.service,
            };
            Ok(Derive::distinct(
                CacheInput::new(self.0.caches.peered_upstream.watch(&key)),
                Ok,
            ))
        }
    }

    watched_source!(CachePeeredUpstream, PeeredUpstreamRequest, |s, req| s.updates(req));

    /// The trust bundles of the peers a service is exported to, from the servers through
    /// the agent cache (agent mode).
    pub struct CachePeerTrustBundles(pub(crate) Arc<AgentCache>);

    impl CachePeerTrustBundles {
        fn updates(
            &self,
            req: PeerTrustBundlesRequest,
        ) -> Result<impl Updates<Arc<Vec<PeerTrustBundle>>> + use<>, DataSourceError> {
            let key = PeerTrustBundlesKey { service: req.service };
            Ok(Derive::distinct(
                CacheInput::new(self.0.caches.peer_trust_bundles.watch(&key)),
                Ok,
            ))
        }
    }

    watched_source!(CachePeerTrustBundles, PeerTrustBundlesRequest, |s, req| s.updates(req));

    /// Where the peering calls go, from the servers through the agent cache (agent mode).
    pub struct CachePeeringServers(pub(crate) Arc<AgentCache>);

    impl CachePeeringServers {
        fn updates(
            &self,
            _req: PeeringServersRequest,
        ) -> Result<impl Updates<Arc<PeeringServers>> + use<>, DataSourceError> {
            Ok(Derive::distinct(
                CacheInput::new(self.0.caches.peering_servers.watch(&PeeringServersKey)),
                Ok,
            ))
        }
    }

    watched_source!(CachePeeringServers, PeeringServersRequest, |s, req| s.updates(req));
}
