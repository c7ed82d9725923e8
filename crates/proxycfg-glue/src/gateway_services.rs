//! The services a gateway fronts (its config entry, `*` expanded over the registered
//! services): a watch each; a value equal to the last one sent (a service write that did not
//! change what `*` means) is not sent again, in either mode.

#[cfg(feature = "server")]
pub use on_server::ServerGatewayServices;

#[cfg(feature = "server")]
mod on_server {
    use crate::derive::{Derive, watched_source};
    use crate::mode::Mode;
    use crate::server_mode::{Catalog, TopicInput};
    use catalog::{Payload, Topic};
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::GatewayServicesRequest;
    use proxycfg::forward::Updates;
    use std::sync::Arc;
    use structs::GatewayService;

    /// A gateway's services as the catalog derives them (server mode).
    pub struct ServerGatewayServices(pub(crate) Arc<Catalog>);

    impl ServerGatewayServices {
        fn updates(
            &self,
            req: GatewayServicesRequest,
        ) -> Result<impl Updates<Arc<Vec<GatewayService>>> + use<>, DataSourceError> {
            self.0.check_dc(&req.datacenter)?;
            let input = TopicInput::new(&self.0.store, Topic::GatewayServices(req.gateway), |p| match p {
                Payload::GatewayServices(list) => Some(Arc::clone(list)),
                _ => None,
            });
            Ok(Derive::distinct(input, Ok))
        }
    }

    watched_source!(ServerGatewayServices, GatewayServicesRequest, |s, req| s.updates(req));
}

#[cfg(feature = "cache")]
pub use on_cache::CacheGatewayServices;

#[cfg(feature = "cache")]
mod on_cache {
    use crate::cache_mode::{AgentCache, CacheInput};
    use crate::derive::{Derive, watched_source};
    use crate::mode::Mode;
    use agent_cache::types::GatewayServicesKey;
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::GatewayServicesRequest;
    use proxycfg::forward::Updates;
    use std::sync::Arc;
    use structs::GatewayService;

    /// A gateway's services from the servers (`/v1/catalog/gateway-services/:gateway`,
    /// through the agent cache; agent mode).
    pub struct CacheGatewayServices(pub(crate) Arc<AgentCache>);

    impl CacheGatewayServices {
        fn updates(
            &self,
            req: GatewayServicesRequest,
        ) -> Result<impl Updates<Arc<Vec<GatewayService>>> + use<>, DataSourceError> {
            self.0.check_dc(&req.datacenter)?;
            let key = GatewayServicesKey { gateway: req.gateway };
            Ok(Derive::distinct(
                CacheInput::new(self.0.caches.gateway_services.watch(&key)),
                Ok,
            ))
        }
    }

    watched_source!(CacheGatewayServices, GatewayServicesRequest, |s, req| s.updates(req));
}
