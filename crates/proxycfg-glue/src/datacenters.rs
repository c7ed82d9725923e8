//! Datacenter names: a server knows its own only; an agent asks the servers.

#[cfg(feature = "server")]
pub use on_server::ServerDatacenters;

#[cfg(feature = "server")]
mod on_server {
    use crate::derive::{Constant, Derive, watched_source};
    use crate::mode::Mode;
    use crate::server_mode::Catalog;
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::{DatacenterNames, DatacentersRequest};
    use proxycfg::forward::Updates;
    use std::sync::Arc;

    /// Datacenters: this server's (server mode).
    pub struct ServerDatacenters(pub(crate) Arc<Catalog>);

    impl ServerDatacenters {
        fn updates(&self) -> Result<impl Updates<DatacenterNames> + use<>, DataSourceError> {
            let names = Arc::new(vec![self.0.datacenter().to_owned()]);
            Ok(Derive::every(Constant::new(names), |names| Ok(DatacenterNames(names))))
        }
    }

    watched_source!(ServerDatacenters, DatacentersRequest, |s, _req| s.updates());
}

#[cfg(feature = "cache")]
pub use on_cache::CacheDatacenters;

#[cfg(feature = "cache")]
mod on_cache {
    use crate::cache_mode::{AgentCache, CacheInput};
    use crate::derive::{Derive, watched_source};
    use agent_cache::types::DatacentersKey;
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::{DatacenterNames, DatacentersRequest};
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
}
