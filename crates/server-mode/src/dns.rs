//! The DNS interface's catalog on a server: its store, as the anonymous token may read it.

use catalog::{State, Store};
use dns::{Instance, LookupError, Wanted};
use node::authz::Tokens;
use std::sync::Arc;
use structs::{CheckServiceNode, HealthStatus, Node};

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

    /// The instances `authz` may read (their service and their node).
    fn readable(authz: Option<&acl::Authorizer>, nodes: &[CheckServiceNode]) -> Vec<Instance> {
        nodes
            .iter()
            .filter(|n| authz.is_none_or(|a| a.service_read(&n.service.service) && a.node_read(&n.node.node)))
            .map(Instance::from)
            .collect()
    }
}

/// A service's own instances as answers need them, read without copying the instances,
/// their nodes and their checks (the hot path of `<svc>.service` queries).
fn instances(state: &State, service: &str, authz: Option<&acl::Authorizer>) -> Vec<Instance> {
    if authz.is_some_and(|a| !a.service_read(service)) {
        return Vec::new();
    }
    state
        .service_instances(service)
        .into_iter()
        .filter(|(node, _)| authz.is_none_or(|a| a.node_read(node)))
        .filter_map(|(node_name, svc)| {
            let node = state.node(&node_name)?;
            let status = state
                .node_checks(&node_name)
                .iter()
                .filter(|c| c.service_id.is_empty() || c.service_id == svc.id)
                .map(|c| c.status)
                .max()
                .unwrap_or(HealthStatus::Passing);
            Some(Instance {
                node: node_name,
                node_address: node.address.clone(),
                address: svc.address.clone(),
                port: svc.port,
                tags: svc.tags.clone(),
                status,
                weights: svc.weights.clone(),
                virtual_ip: None,
            })
        })
        .collect()
}

#[async_trait::async_trait]
impl dns::Catalog for StoreDns {
    async fn service_nodes(&self, service: &str, wanted: Wanted) -> Result<Vec<Instance>, LookupError> {
        let authz = self.authz().await?;
        let state = self.store.read();
        Ok(match wanted {
            Wanted::Service => instances(&state, service, authz.as_deref()),
            Wanted::Connect => Self::readable(authz.as_deref(), &state.health(service, true)),
            Wanted::Ingress => Self::readable(authz.as_deref(), &state.ingress_health(service)),
        })
    }

    async fn node(&self, name: &str) -> Result<Option<Node>, LookupError> {
        let node = self.store.read().node(name).map(|n| (*n).clone());
        match (node, self.authz().await?) {
            (Some(n), Some(a)) if !a.node_read(&n.node) => Ok(None),
            (node, _) => Ok(node),
        }
    }

    async fn prepared_query(&self, name: &str) -> Result<Option<Vec<Instance>>, LookupError> {
        let authz = self.authz().await?;
        let state = self.store.read();
        let Some(query) = state.resolve_query(name) else {
            return Ok(None);
        };
        Ok(Some(Self::readable(
            authz.as_deref(),
            &state.query_nodes(&query, false),
        )))
    }
}
