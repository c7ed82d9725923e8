//! What a service is, as Consul spells it.

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use std::{fmt, str::FromStr};

/// What a service is: an application, or one of the mesh's proxies and gateways.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServiceKind {
    /// An ordinary application service (Consul writes it as `""`).
    #[default]
    Typical,
    /// A sidecar proxy for one service instance.
    ConnectProxy,
    /// A gateway between datacenters or partitions.
    MeshGateway,
    /// A gateway from the mesh to services outside it.
    TerminatingGateway,
    /// A gateway from outside into the mesh.
    IngressGateway,
    /// An API gateway (Consul's `api-gateway`).
    ApiGateway,
}

impl ServiceKind {
    /// Consul's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceKind::Typical => "",
            ServiceKind::ConnectProxy => "connect-proxy",
            ServiceKind::MeshGateway => "mesh-gateway",
            ServiceKind::TerminatingGateway => "terminating-gateway",
            ServiceKind::IngressGateway => "ingress-gateway",
            ServiceKind::ApiGateway => "api-gateway",
        }
    }

    /// True for every kind that runs a proxy configured by meshd.
    pub fn is_proxy(self) -> bool {
        !matches!(self, ServiceKind::Typical)
    }
}

/// An unknown service kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown service kind {0:?}: expected \"\", connect-proxy, mesh-gateway, terminating-gateway, ingress-gateway or api-gateway"
)]
pub struct UnknownKind(pub String);

impl FromStr for ServiceKind {
    type Err = UnknownKind;
    fn from_str(s: &str) -> Result<Self, UnknownKind> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "" | "typical" => ServiceKind::Typical,
            "connect-proxy" => ServiceKind::ConnectProxy,
            "mesh-gateway" => ServiceKind::MeshGateway,
            "terminating-gateway" => ServiceKind::TerminatingGateway,
            "ingress-gateway" => ServiceKind::IngressGateway,
            "api-gateway" => ServiceKind::ApiGateway,
            _ => return Err(UnknownKind(s.to_owned())),
        })
    }
}

impl fmt::Display for ServiceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ServiceKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ServiceKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = Option::<String>::deserialize(d)?.unwrap_or_default();
        s.parse().map_err(de::Error::custom)
    }
}
