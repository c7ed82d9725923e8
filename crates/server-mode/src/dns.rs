//! The DNS interface's catalog on a server: its store, as the anonymous token may read it.

use catalog::Store;
use dns::{LookupError, Wanted};
use node::authz::Tokens;
use std::sync::Arc;
use structs::{CheckServiceNode, Node};

/// Lookups in the store, filtered by the anonymous token's ACLs.
pub(crate) struct StoreDns {
    store: Store,
    tokens: Tokens,
}

impl StoreDns {
    pub(crate) fn new(store: Store, tokens: Tokens) -> Self {
        StoreDns { store, tokens }
    }

    /// What the anonymous token may read; none when ACLs are off.
    async fn authz(&self) -> Result<Option<Arc<acl::Authorizer>>, LookupError> {
        if !self.tokens.enabled() {
            return Ok(None);
        }
        let resolved = self
            .tokens
            .resolve(None)
            .await
            .map_err(|e| LookupError(e.to_string()))?;
        Ok(Some(resolved.authz))
    }

    async fn readable(&self, mut nodes: Vec<CheckServiceNode>) -> Result<Vec<CheckServiceNode>, LookupError> {
        if let Some(a) = self.authz().await? {
            nodes.retain(|n| a.service_read(&n.service.service) && a.node_read(&n.node.node));
        }
        Ok(nodes)
    }
}

#[async_trait::async_trait]
impl dns::Catalog for StoreDns {
    async fn service_nodes(&self, service: &str, wanted: Wanted) -> Result<Vec<CheckServiceNode>, LookupError> {
        let nodes = {
            let state = self.store.read();
            match wanted {
                Wanted::Service => state.health(service, false),
                Wanted::Connect => state.health(service, true),
                Wanted::Ingress => state.ingress_health(service),
            }
        };
        self.readable(nodes).await
    }

    async fn node(&self, name: &str) -> Result<Option<Node>, LookupError> {
        let node = self.store.read().node(name).map(|n| (*n).clone());
        match (node, self.authz().await?) {
            (Some(n), Some(a)) if !a.node_read(&n.node) => Ok(None),
            (node, _) => Ok(node),
        }
    }

    async fn prepared_query(&self, name: &str) -> Result<Option<Vec<CheckServiceNode>>, LookupError> {
        let nodes = {
            let state = self.store.read();
            let Some(query) = state.resolve_query(name) else {
                return Ok(None);
            };
            state.query_nodes(&query, false)
        };
        self.readable(nodes).await.map(Some)
    }
}
