//! The DNS interface's catalog on an agent: its servers, asked with the agent's default
//! token (as Consul's agents answer DNS), so names resolve only what that token may read.

use ::agent::Agent;
use ::agent::servers::{ApiError, paths};
use dns::{Instance, LookupError, Wanted};
use structs::{CheckServiceNode, Node};

/// Lookups on the agent's servers.
pub(crate) struct ServersDns(pub(crate) Agent);

impl ServersDns {
    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<Option<T>, LookupError> {
        let token = self.0.acl().default_token();
        match self.0.servers().get_json_as::<T>(token.as_ref(), path).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(lookup_error(&e)),
        }
    }
}

fn lookup_error(e: &ApiError) -> LookupError {
    LookupError(::agent::servers::chain(e))
}

/// `/v1/catalog/node/<node>`: the node (null when there is none).
#[derive(serde::Deserialize)]
struct CatalogNode {
    #[serde(rename = "Node")]
    node: Node,
}

/// `/v1/query/<name>/execute`.
#[derive(serde::Deserialize)]
struct Executed {
    #[serde(rename = "Nodes", default)]
    nodes: Vec<CheckServiceNode>,
}

#[async_trait::async_trait]
impl dns::Catalog for ServersDns {
    async fn service_nodes(&self, service: &str, wanted: Wanted) -> Result<Vec<Instance>, LookupError> {
        let path = match wanted {
            Wanted::Service => paths::health_service(service, false, false),
            Wanted::Connect => paths::health_service(service, true, false),
            Wanted::Ingress => format!("/v1/health/ingress/{}", paths::segment(service)),
        };
        let nodes = self.get::<Vec<CheckServiceNode>>(&path).await?.unwrap_or_default();
        Ok(nodes.iter().map(Instance::from).collect())
    }

    async fn node(&self, name: &str) -> Result<Option<Node>, LookupError> {
        let found = self.get::<Option<CatalogNode>>(&paths::catalog_node(name)).await?;
        Ok(found.flatten().map(|n| n.node))
    }

    async fn prepared_query(&self, name: &str) -> Result<Option<Vec<Instance>>, LookupError> {
        let path = format!("/v1/query/{}/execute", paths::segment(name));
        Ok(self
            .get::<Executed>(&path)
            .await?
            .map(|e| e.nodes.iter().map(Instance::from).collect()))
    }
}
