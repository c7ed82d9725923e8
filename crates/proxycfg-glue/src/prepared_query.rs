//! Prepared queries as upstreams (`DestinationType: prepared_query`): the connect-capable
//! instances a query selects, by id, name or template, followed as the query and its
//! service's instances change. A query that does not exist is an error the proxy shows (in
//! its status and metrics) until it is created, not a watch that silently never answers.
//! Instances come in a stable order (node, then id): the servers shuffle an execute's answer,
//! which must not churn a proxy's endpoints.

#[cfg(feature = "server")]
pub use on_server::ServerPreparedQuery;

#[cfg(feature = "server")]
mod on_server {
    use crate::derive::watched_source;
    use crate::mode::Mode;
    use crate::server_mode::Catalog;
    use catalog::{IndexKey, Store};
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::{PreparedQueryRequest, PreparedQueryResult};
    use proxycfg::forward::{Step, Updates};
    use std::sync::Arc;
    use structs::{CheckServiceNode, Index};

    /// A prepared query's instances from the catalog (server mode).
    pub struct ServerPreparedQuery(pub(crate) Arc<Catalog>);

    impl ServerPreparedQuery {
        fn updates(&self, req: PreparedQueryRequest) -> Result<Follower, DataSourceError> {
            self.0.check_dc(&req.datacenter)?;
            Ok(Follower {
                store: self.0.store.clone(),
                asked: req.query,
                last: None,
            })
        }
    }

    /// Follows one query: runs it on the current state, and again whenever the queries or
    /// the instances of the service it names move past what it read.
    pub(super) struct Follower {
        store: Store,
        asked: String,
        /// What was last sent.
        last: Option<Result<Arc<Vec<CheckServiceNode>>, String>>,
    }

    impl Follower {
        /// The query's result now, the key of its instances, and the index it was read at.
        fn run(&self) -> (Result<Arc<Vec<CheckServiceNode>>, String>, IndexKey, Index) {
            let state = self.store.read();
            let (query, key, index) = state.query_watch(&self.asked, true);
            let result = match query {
                Some(query) => Ok(Arc::new(state.query_nodes(&query, true))),
                None => Err(format!("prepared query {:?} does not exist", self.asked)),
            };
            (result, key, index)
        }
    }

    impl Updates<PreparedQueryResult> for Follower {
        async fn next(&mut self) -> Step<PreparedQueryResult> {
            loop {
                let (result, key, index) = self.run();
                if self.last.as_ref() != Some(&result) {
                    self.last = Some(result.clone());
                    return Some(Some(
                        result.map(PreparedQueryResult).map_err(DataSourceError::InvalidRequest),
                    ));
                }
                // Nothing new for this proxy: wait until either input moves on. `None`: the
                // store is closing, and the watch ends with it.
                let receivers = (
                    self.store.index_receiver(&IndexKey::Queries),
                    self.store.index_receiver(&key),
                );
                let (Some(mut queries), Some(mut instances)) = receivers else {
                    return None;
                };
                let moved = tokio::select! {
                    r = queries.wait_for(|i| *i > index) => r.is_ok(),
                    r = instances.wait_for(|i| *i > index) => r.is_ok(),
                };
                if !moved {
                    return None;
                }
            }
        }
    }

    watched_source!(ServerPreparedQuery, PreparedQueryRequest, |s, req| s.updates(req));
}

#[cfg(feature = "cache")]
pub use on_cache::CachePreparedQuery;

#[cfg(feature = "cache")]
mod on_cache {
    use crate::cache_mode::{AgentCache, CacheInput};
    use crate::derive::{Derive, watched_source};
    use crate::mode::Mode;
    use agent_cache::types::PreparedQueryKey;
    use proxycfg::DataSourceError;
    use proxycfg::data_sources::{PreparedQueryRequest, PreparedQueryResult};
    use proxycfg::forward::Updates;
    use std::sync::Arc;

    /// A prepared query's instances from the servers (`/v1/query/:query/execute?connect=true`
    /// through the agent cache; agent mode).
    pub struct CachePreparedQuery(pub(crate) Arc<AgentCache>);

    impl CachePreparedQuery {
        fn updates(
            &self,
            req: PreparedQueryRequest,
        ) -> Result<impl Updates<PreparedQueryResult> + use<>, DataSourceError> {
            self.0.check_dc(&req.datacenter)?;
            let key = PreparedQueryKey { query: req.query };
            Ok(Derive::distinct(
                CacheInput::new(self.0.caches.prepared_query.watch(&key)),
                |nodes| Ok(PreparedQueryResult(nodes)),
            ))
        }
    }

    watched_source!(CachePreparedQuery, PreparedQueryRequest, |s, req| s.updates(req));
}
