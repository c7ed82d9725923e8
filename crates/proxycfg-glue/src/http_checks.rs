//! The HTTP (and gRPC) checks of a service instance, which a proxy may expose: an agent runs
//! them and knows them first-hand; no agent runs an agentless proxy's, so a server has none.

#[cfg(feature = "server")]
pub use on_server::ServerHttpChecks;

#[cfg(feature = "server")]
mod on_server {
    use crate::derive::{Constant, Derive, watched_source};
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::HttpChecksRequest;
    use proxycfg::forward::Updates;
    use std::sync::Arc;
    use structs::HealthCheck;

    /// HTTP checks of an agentless proxy's service: none (as on Consul servers).
    pub struct ServerHttpChecks;

    fn none() -> Result<impl Updates<Arc<Vec<HealthCheck>>>, DataSourceError> {
        Ok(Derive::every(Constant::new(Arc::new(Vec::new())), Ok))
    }

    watched_source!(ServerHttpChecks, HttpChecksRequest, |_s, _req| none());
}

#[cfg(feature = "cache")]
pub use on_cache::{CacheHttpChecks, LocalChecks};

#[cfg(feature = "cache")]
mod on_cache {
    use crate::derive::{Changed, Derive, Input, watched_source};
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::HttpChecksRequest;
    use proxycfg::forward::Updates;
    use std::sync::Arc;
    use structs::HealthCheck;
    use tokio::sync::watch;

    /// The agent's own checks, for the HTTP-checks source (what the agent runs for a local
    /// service; the servers' copy may lag).
    pub trait LocalChecks: Send + Sync + 'static {
        /// The HTTP (and gRPC) checks of local service instance `service_id`.
        fn http_checks(&self, service_id: &str) -> Vec<HealthCheck>;
        /// Changes whenever the local checks may have changed.
        fn subscribe(&self) -> watch::Receiver<u64>;
    }

    /// HTTP checks of a local service instance, from the agent's own checks (agent mode);
    /// sent when they change.
    pub struct CacheHttpChecks(pub(crate) Arc<dyn LocalChecks>);

    impl CacheHttpChecks {
        fn updates(
            &self,
            req: HttpChecksRequest,
        ) -> Result<impl Updates<Arc<Vec<HealthCheck>>> + use<>, DataSourceError> {
            let mut changes = self.0.subscribe();
            // The current checks first.
            changes.mark_changed();
            let input = ChecksInput {
                local: Arc::clone(&self.0),
                changes,
                service_id: req.service_id,
                latest: None,
            };
            Ok(Derive::distinct(input, Ok))
        }
    }

    watched_source!(CacheHttpChecks, HttpChecksRequest, |s, req| s.updates(req));

    /// The agent's checks of one instance, read again whenever they may have changed.
    struct ChecksInput {
        local: Arc<dyn LocalChecks>,
        changes: watch::Receiver<u64>,
        service_id: String,
        latest: Option<Arc<Vec<HealthCheck>>>,
    }

    impl Input for ChecksInput {
        type Value = Arc<Vec<HealthCheck>>;

        async fn changed(&mut self) -> Changed {
            // The agent stopped: the watch ends.
            self.changes.changed().await.ok()?;
            self.latest = Some(Arc::new(self.local.http_checks(&self.service_id)));
            Some(Ok(()))
        }

        fn latest(&self) -> Option<Self::Value> {
            self.latest.clone()
        }

        fn versions(&self, into: &mut Vec<u64>) {
            into.push(*self.changes.borrow());
        }
    }
}
