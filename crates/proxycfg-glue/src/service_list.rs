//! Every service name of the datacenter: a watch each, as read.

#[cfg(feature = "server")]
pub use on_server::ServerServiceList;

#[cfg(feature = "server")]
mod on_server {
    use crate::derive::{Derive, watched_source};
    use crate::mode::Mode;
    use crate::server_mode::{Catalog, TopicInput};
    use catalog::{Payload, Topic};
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::{ServiceListRequest, ServiceNames};
    use proxycfg::forward::Updates;
    use std::sync::Arc;

    /// Service names, from the catalog (server mode).
    pub struct ServerServiceList(pub(crate) Arc<Catalog>);

    impl ServerServiceList {
        fn updates(&self, req: &ServiceListRequest) -> Result<impl Updates<ServiceNames> + use<>, DataSourceError> {
            self.0.check_dc(&req.datacenter)?;
            let topic = if req.typical_only {
                Topic::TypicalServices
            } else {
                Topic::ServiceList
            };
            let input = TopicInput::new(&self.0.store, topic, |p| match p {
                Payload::ServiceList(names) => Some(Arc::clone(names)),
                _ => None,
            });
            Ok(Derive::every(input, |names| Ok(ServiceNames(names))))
        }
    }

    watched_source!(ServerServiceList, ServiceListRequest, |s, req| s.updates(&req));
}

#[cfg(feature = "cache")]
pub use on_cache::CacheServiceList;

#[cfg(feature = "cache")]
mod on_cache {
    use crate::cache_mode::{AgentCache, CacheInput};
    use crate::derive::{Derive, watched_source};
    use crate::mode::Mode;
    use agent_cache::types::ServicesKey;
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::{ServiceListRequest, ServiceNames};
    use proxycfg::forward::Updates;
    use std::sync::Arc;

    /// Service names, from the agent cache (agent mode).
    pub struct CacheServiceList(pub(crate) Arc<AgentCache>);

    impl CacheServiceList {
        fn updates(&self, req: &ServiceListRequest) -> Result<impl Updates<ServiceNames> + use<>, DataSourceError> {
            self.0.check_dc(&req.datacenter)?;
            let key = ServicesKey {
                typical_only: req.typical_only,
            };
            let input = CacheInput::new(self.0.caches.services.watch(&key));
            Ok(Derive::every(input, |names| Ok(ServiceNames(names))))
        }
    }

    watched_source!(CacheServiceList, ServiceListRequest, |s, req| s.updates(&req));
}
