//! Service health: a service's instances (or its connect-capable ones) with their checks,
//! filtered the same way in either mode to healthy or passing instances, one kind, and a
//! subset's filter. A filtered result equal to the last one sent is not sent again.

use crate::derive::{Derive, Input};
use proxycfg::DataSourceError;
use proxycfg::data_sources::HealthRequest;
use proxycfg::forward::Updates;
use std::sync::Arc;
use structs::filter::Filter;
use structs::{CheckServiceNode, HealthStatus};

/// A health result.
type Nodes = Arc<Vec<CheckServiceNode>>;

/// What a watch of `req` sends: `input`'s instances, filtered as `req` asks with `filter`
/// (its subset filter, parsed by [`subset_filter`]).
fn filtered<I: Input<Value = Nodes>>(req: &HealthRequest, filter: Filter, input: I) -> impl Updates<Nodes> + use<I> {
    let is_filtered = req.passing_only || req.healthy_only || req.kind.is_some() || !req.filter.is_empty();
    let req = req.clone();
    let derive = move |all: Nodes| {
        if is_filtered {
            Ok(Arc::new(filter_health(&all, &req, &filter)))
        } else {
            Ok(all)
        }
    };
    // Unfiltered, the input changed and so did the result: not worth comparing.
    Derive::distinct_if(input, derive, is_filtered)
}

/// The subset filter of `req`, parsed (filters are checked when the resolver is written, so
/// an error here means a value that bypassed the API).
fn subset_filter(req: &HealthRequest) -> Result<Filter, DataSourceError> {
    req.filter.parse::<Filter>().map_err(|e| {
        DataSourceError::InvalidRequest(format!("subset filter {:?} of {:?}: {e}", req.filter, req.service))
    })
}

/// The instances of `all` that `req` asks for.
pub(crate) fn filter_health(all: &[CheckServiceNode], req: &HealthRequest, filter: &Filter) -> Vec<CheckServiceNode> {
    all.iter()
        .filter(|n| !req.passing_only || n.checks.iter().all(|c| c.status == HealthStatus::Passing))
        .filter(|n| !req.healthy_only || n.checks.iter().all(|c| c.status.admits(false)))
        .filter(|n| req.kind.is_none_or(|k| n.service.kind == k))
        // A terminating gateway standing for the service applies the subset's filter itself
        // (it serves each subset under its own SNI): its instance is kept.
        .filter(|n| (req.connect && n.service.kind == structs::ServiceKind::TerminatingGateway) || filter.matches(n))
        .cloned()
        .collect()
}

#[cfg(feature = "server")]
pub use on_server::ServerHealth;

#[cfg(feature = "server")]
mod on_server {
    use super::{Nodes, filtered, subset_filter};
    use crate::fanout::{Fanout, Subscriber, followed_source};
    use crate::mode::Mode;
    use crate::server_mode::{Catalog, TopicInput};
    use catalog::{Payload, Topic};
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::HealthRequest;
    use std::sync::Arc;
    use tokio_util::task::TaskTracker;

    /// Service health from the catalog (server mode): one shared follower per request.
    pub struct ServerHealth {
        catalog: Arc<Catalog>,
        followers: Fanout<HealthRequest, Nodes>,
    }

    impl ServerHealth {
        pub(crate) fn new(catalog: Arc<Catalog>, tasks: &TaskTracker) -> Self {
            Self {
                catalog,
                followers: Fanout::new("health", tasks.clone()),
            }
        }

        /// A watch of the shared follower answering `req`.
        fn watch(&self, req: &HealthRequest) -> Result<Subscriber<Nodes>, DataSourceError> {
            if !req.datacenter.is_empty() && req.datacenter != self.catalog.datacenter() {
                return self.watch_elsewhere(req);
            }
            // A server reads its own state: the answer does not depend on the proxy's token
            // (its stream is authorized apart), so proxies with different tokens share one
            // follower.
            let mut req = req.clone();
            req.token = None;
            let topic = if req.connect {
                Topic::ServiceHealthConnect(req.service.clone())
            } else {
                Topic::ServiceHealth(req.service.clone())
            };
            let filter = subset_filter(&req)?;
            // One follower per distinct request: its filtered result is computed once per
            // change and shared by every watch asking the same.
            let entry = self.followers.follow_updates(&req, || {
                let input = TopicInput::new(&self.catalog.store, topic, |p| match p {
                    Payload::Health(all) => Some(Arc::clone(all)),
                    _ => None,
                });
                filtered(&req, filter, input)
            });
            Ok(Subscriber::new(entry))
        }
    }

    impl ServerHealth {
        /// Another datacenter's instances, asked of its servers with the proxy's token (one
        /// follower per request, token included: the other datacenter filters by it).
        fn watch_elsewhere(&self, req: &HealthRequest) -> Result<Subscriber<Nodes>, DataSourceError> {
            let filter = subset_filter(req)?;
            let entry = self.followers.follow_updates(req, || {
                let path = api_client::paths::health_service(&req.service, req.connect, req.passing_only);
                let input = super::remote::RemoteHealth::new(
                    Arc::clone(self.catalog.store.federation()),
                    req.datacenter.clone(),
                    path,
                    req.token.clone(),
                );
                filtered(req, filter, input)
            });
            Ok(Subscriber::new(entry))
        }
    }

    followed_source!(ServerHealth, HealthRequest, |s, req| s.watch(req));
}

#[cfg(feature = "cache")]
pub use on_cache::CacheHealth;

#[cfg(feature = "cache")]
mod on_cache {
    use super::{Nodes, filtered, subset_filter};
    use crate::cache_mode::{AgentCache, CacheInput};
    use crate::fanout::{Fanout, Subscriber, followed_source};
    use crate::mode::Mode;
    use agent_cache::types::HealthKey;
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::HealthRequest;
    use std::sync::Arc;
    use tokio_util::task::TaskTracker;

    /// Service health from the agent cache (agent mode): one cache entry per (service,
    /// connect, passing, token), passing-only asked of the servers; the rest is filtered here
    /// by one shared follower per request.
    pub struct CacheHealth {
        agent: Arc<AgentCache>,
        followers: Fanout<HealthRequest, Nodes>,
    }

    impl CacheHealth {
        pub(crate) fn new(agent: Arc<AgentCache>, tasks: &TaskTracker) -> Self {
            Self {
                agent,
                followers: Fanout::new("health", tasks.clone()),
            }
        }

        /// A watch of the shared follower answering `req`.
        fn watch(&self, req: &HealthRequest) -> Result<Subscriber<Nodes>, DataSourceError> {
            // Another datacenter's instances are asked of the servers, which relay (`?dc=`).
            let elsewhere = (!req.datacenter.is_empty() && req.datacenter != self.agent.datacenter())
                .then(|| req.datacenter.clone());
            let filter = subset_filter(req)?;
            // The token stays in the key: the servers answer what it may read.
            let entry = self.followers.follow_updates(req, || {
                let key = HealthKey {
                    service: req.service.clone(),
                    connect: req.connect,
                    passing: req.passing_only,
                    token: req.token.clone(),
                    datacenter: elsewhere.clone(),
                };
                filtered(req, filter, CacheInput::new(self.agent.caches.health.watch(&key)))
            });
            Ok(Subscriber::new(entry))
        }
    }

    followed_source!(CacheHealth, HealthRequest, |s, req| s.watch(req));
}

#[cfg(feature = "server")]
mod remote;

#[cfg(test)]
mod tests;
