//! Intentions that apply to a destination, in evaluation order (the catalog and the servers'
//! `/v1/connect/intentions/match` sort them): a watch each, as read.

#[cfg(feature = "server")]
pub use on_server::ServerIntentions;

#[cfg(feature = "server")]
mod on_server {
    use crate::derive::{Derive, watched_source};
    use crate::mode::Mode;
    use crate::server_mode::{Catalog, TopicInput};
    use catalog::{Payload, Topic};
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::IntentionsRequest;
    use proxycfg::forward::Updates;
    use std::sync::Arc;
    use structs::Intention;

    /// Intentions by destination, from the catalog (server mode).
    pub struct ServerIntentions(pub(crate) Arc<Catalog>);

    impl ServerIntentions {
        fn updates(
            &self,
            req: IntentionsRequest,
        ) -> Result<impl Updates<Arc<Vec<Intention>>> + use<>, DataSourceError> {
            self.0.check_dc(&req.datacenter)?;
            let input = TopicInput::new(&self.0.store, Topic::Intentions(req.destination), |p| match p {
                Payload::Intentions(ixns) => Some(Arc::clone(ixns)),
                _ => None,
            });
            // Every intention write reaches every destination's topic: a list that did not
            // change is not sent, so the proxies of other services build nothing.
            Ok(Derive::distinct(input, Ok))
        }
    }

    watched_source!(ServerIntentions, IntentionsRequest, |s, req| s.updates(req));
}

#[cfg(feature = "cache")]
pub use on_cache::CacheIntentions;

#[cfg(feature = "cache")]
mod on_cache {
    use crate::cache_mode::{AgentCache, CacheInput};
    use crate::derive::{Derive, watched_source};
    use crate::mode::Mode;
    use agent_cache::types::IntentionsKey;
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::IntentionsRequest;
    use proxycfg::forward::Updates;
    use std::sync::Arc;
    use structs::Intention;

    /// Intentions by destination, from the agent cache (agent mode).
    pub struct CacheIntentions(pub(crate) Arc<AgentCache>);

    impl CacheIntentions {
        fn updates(
            &self,
            req: IntentionsRequest,
        ) -> Result<impl Updates<Arc<Vec<Intention>>> + use<>, DataSourceError> {
            self.0.check_dc(&req.datacenter)?;
            let key = IntentionsKey {
                destination: req.destination,
            };
            Ok(Derive::distinct(
                CacheInput::new(self.0.caches.intentions.watch(&key)),
                Ok,
            ))
        }
    }

    watched_source!(CacheIntentions, IntentionsRequest, |s, req| s.updates(req));
}
