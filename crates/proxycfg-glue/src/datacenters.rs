//! The datacenters: their names, and their mesh gateways (where a mesh gateway sends other
//! datacenters' SNIs, and a sidecar its connections to them). A server follows what it
//! knows of the federation (`catalog::federation`); an agent asks its servers for both
//! (through its cache).

#[cfg(feature = "server")]
pub use on_server::{ServerDatacenters, ServerMeshGateways};

#[cfg(feature = "server")]
mod on_server {
    use crate::derive::{Changed, Derive, Input, watched_source};
    use crate::mode::Mode;
    use crate::server_mode::Catalog;
    use catalog::federation::FederationStates;
    use parking_lot::Mutex;
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::{DatacenterNames, DatacentersRequest, MeshGatewaysByDc, MeshGatewaysRequest};
    use proxycfg::forward::Updates;
    use std::sync::Arc;
    use tokio::sync::watch;

    /// The server's federation states as an input: every change of what it knows of the
    /// other datacenters.
    struct FederationInput {
        rx: watch::Receiver<Arc<FederationStates>>,
        /// The first value was given.
        given: bool,
    }

    impl FederationInput {
        fn new(catalog: &Catalog) -> Self {
            Self {
                rx: catalog.store.federation().subscribe(),
                given: false,
            }
        }
    }

    impl Input for FederationInput {
        type Value = Arc<FederationStates>;

        async fn changed(&mut self) -> Changed {
            if !std::mem::replace(&mut self.given, true) {
                self.rx.mark_unchanged();
                return Some(Ok(()));
            }
            // The sender lives as long as the store: an error is the store gone.
            self.rx.changed().await.ok().map(Ok)
        }

        fn latest(&self) -> Option<Self::Value> {
            Some(Arc::clone(&self.rx.borrow()))
        }

        fn versions(&self, into: &mut Vec<u64>) {
            into.push(self.rx.borrow().index);
        }
    }

    /// Datacenters: this server's, then every other it knows (server mode).
    pub struct ServerDatacenters(pub(crate) Arc<Catalog>);

    impl ServerDatacenters {
        fn updates(&self) -> Result<impl Updates<DatacenterNames> + use<>, DataSourceError> {
            let fed = Arc::clone(self.0.store.federation());
            Ok(Derive::distinct(FederationInput::new(&self.0), move |_| {
                Ok(DatacenterNames(Arc::new(fed.datacenters())))
            }))
        }
    }

    watched_source!(ServerDatacenters, DatacentersRequest, |s, _req| s.updates());

    /// Every datacenter's mesh gateways, from the federation states (server mode). The map
    /// is made once per change of the states and shared by every proxy following it (a
    /// change reaches every sidecar with an upstream elsewhere: thousands of copies
    /// otherwise).
    pub struct ServerMeshGateways {
        catalog: Arc<Catalog>,
        /// The map for the states' index it was made at.
        made: Arc<Mutex<Option<(u64, MeshGatewaysByDc)>>>,
    }

    impl ServerMeshGateways {
        pub(crate) fn new(catalog: Arc<Catalog>) -> Self {
            Self {
                catalog,
                made: Arc::default(),
            }
        }

        fn updates(
            &self,
            req: &MeshGatewaysRequest,
        ) -> Result<impl Updates<MeshGatewaysByDc> + use<>, DataSourceError> {
            self.catalog.check_dc(&req.datacenter)?;
            let made = Arc::clone(&self.made);
            Ok(Derive::distinct(FederationInput::new(&self.catalog), move |states| {
                let mut made = made.lock();
                if let Some((index, map)) = &*made
                    && *index == states.index
                {
                    return Ok(map.clone());
                }
                // A datacenter whose state did not move keeps its list (the same `Arc`: the
                // proxies' comparison with what they had is a pointer comparison for it).
                let before = made.as_ref().map(|(_, m)| Arc::clone(&m.0));
                let all = states
                    .by_dc
                    .iter()
                    .map(|(dc, s)| {
                        let kept = before
                            .as_ref()
                            .and_then(|b| b.get(dc))
                            .filter(|g| ***g == s.mesh_gateways)
                            .cloned();
                        (dc.clone(), kept.unwrap_or_else(|| Arc::new(s.mesh_gateways.clone())))
                    })
                    .collect();
                let map = MeshGatewaysByDc(Arc::new(all));
                *made = Some((states.index, map.clone()));
                Ok(map)
            }))
        }
    }

    watched_source!(ServerMeshGateways, MeshGatewaysRequest, |s, req| s.updates(&req));
}

#[cfg(feature = "cache")]
pub use on_cache::{CacheDatacenters, CacheMeshGateways};

#[cfg(feature = "cache")]
mod on_cache {
    use crate::cache_mode::{AgentCache, CacheInput};
    use crate::derive::{Derive, watched_source};
    use agent_cache::types::{DatacentersKey, MeshGatewaysKey};
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::{DatacenterNames, DatacentersRequest, MeshGatewaysByDc, MeshGatewaysRequest};
    use proxycfg::forward::Updates;
    use std::sync::Arc;

    /// Datacenter names, from the servers through the agent cache (agent mode).
    pub struct CacheDatacenters(pub(crate) Arc<AgentCache>);

    impl CacheDatacenters {
        fn updates(&self) -> Result<impl Updates<DatacenterNames> + use<>, DataSourceError> {
            let input = CacheInput::new(self.0.caches.datacenters.watch(&DatacentersKey));
            Ok(Derive::every(input, |names| Ok(DatacenterNames(names))))
        }
    }

    watched_source!(CacheDatacenters, DatacentersRequest, |s, _req| s.updates());

    /// Every datacenter's mesh gateways, from the servers through the agent cache (agent
    /// mode).
    pub struct CacheMeshGateways(pub(crate) Arc<AgentCache>);

    impl CacheMeshGateways {
        fn updates(&self) -> Result<impl Updates<MeshGatewaysByDc> + use<>, DataSourceError> {
            let input = CacheInput::new(self.0.caches.mesh_gateways.watch(&MeshGatewaysKey));
            Ok(Derive::every(input, |by_dc| Ok(MeshGatewaysByDc(by_dc))))
        }
    }

    watched_source!(CacheMeshGateways, MeshGatewaysRequest, |s, _req| s.updates());
}
