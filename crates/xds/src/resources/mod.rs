//! Envoy resources built from a proxycfg snapshot: clusters, endpoints, listeners and route
//! configurations for a connect-proxy (sidecar).
//!
//! Layout (names follow Consul's so tools and habits carry over):
//! - `local_app`: static cluster to the local application.
//! - one EDS cluster per discovery-chain target, named by the target's SNI
//!   (`<service>.default.<dc>.internal.<trust-domain>`), with upstream mTLS: our leaf, the CA
//!   bundle, SNI, and a SAN match on the target service's SPIFFE id.
//! - `public_listener:<addr>:<port>`: inbound mTLS requiring a client certificate, intentions
//!   enforced by RBAC, then `local_app` (tcp_proxy, or HTTP connection manager for L7
//!   protocols).
//! - `<upstream>:<bind addr>:<bind port>`: one outbound listener per upstream (tcp_proxy, or
//!   HTTP connection manager with RDS for L7 protocols).
//! - route configurations named after the upstream for L7 upstreams.

mod clusters;
mod listeners;
mod rbac;
mod tls;

use envoy_types::pb::google::protobuf::Any;
use proxycfg::ConfigSnapshot;
use std::collections::BTreeMap;

/// Type URL of clusters.
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Type URL of endpoints.
pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// Type URL of listeners.
pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
/// Type URL of route configurations.
pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";

/// The resource types in make-before-break order.
pub const TYPES: [&str; 4] = [CLUSTER, ENDPOINT, LISTENER, ROUTE];

/// Every resource of one snapshot, by type URL then name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resources {
    /// type URL → (name → resource).
    pub by_type: BTreeMap<&'static str, BTreeMap<String, Any>>,
}

impl Resources {
    fn insert(&mut self, type_url: &'static str, name: String, resource: Any) {
        self.by_type.entry(type_url).or_default().insert(name, resource);
    }

    /// The resources of one type.
    pub fn of(&self, type_url: &str) -> Option<&BTreeMap<String, Any>> {
        self.by_type.get(type_url)
    }
}

/// Why a snapshot could not be turned into resources.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The snapshot is missing something a valid snapshot has.
    #[error("snapshot incomplete: {0}")]
    Incomplete(&'static str),
    /// The proxy's configuration cannot be expressed.
    #[error("{0}")]
    Invalid(String),
}

/// Builds every resource for a snapshot.
pub fn build(snapshot: &ConfigSnapshot) -> Result<Resources, BuildError> {
    let mut out = Resources::default();
    clusters::build(snapshot, &mut out)?;
    listeners::build(snapshot, &mut out)?;
    Ok(out)
}

/// The protocol of a listener or upstream: `tcp`, `http`, `http2` or `grpc`.
pub(crate) fn is_http(protocol: &str) -> bool {
    matches!(protocol, "http" | "http2" | "grpc")
}

#[cfg(test)]
mod tests;
