//! What clients read back from the catalog: the flat service-instance shape of
//! `/v1/catalog/service/:name` and `/v1/catalog/connect/:name`, for meshd's own clients (the
//! `connect` command, the agent). The server writes the same keys.

use crate::ServiceKind;
use serde::Deserialize;

/// One service instance with its node, as the catalog lists it (the fields a client needs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct CatalogService {
    /// The node the instance is registered on.
    #[serde(rename = "Node")]
    pub node: String,
    /// The node's address.
    #[serde(rename = "Address")]
    pub address: String,
    /// What the instance is.
    #[serde(rename = "ServiceKind")]
    pub service_kind: ServiceKind,
    /// The instance id.
    #[serde(rename = "ServiceID")]
    pub service_id: String,
    /// The service name.
    #[serde(rename = "ServiceName")]
    pub service_name: String,
    /// The instance's port.
    #[serde(rename = "ServicePort")]
    pub service_port: u16,
    /// The instance's Connect settings (`Native` for a proxyless client).
    #[serde(rename = "ServiceConnect")]
    pub service_connect: crate::agent::ServiceConnect,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_catalog_shape_and_ignores_the_rest() {
        let body = br#"[{"Node":"n1","Address":"10.0.0.1","ServiceKind":"connect-proxy",
            "ServiceID":"web-sidecar-proxy","ServiceName":"web-sidecar-proxy","ServicePort":21000,
            "ServiceMeta":{"k":"v"},"ServiceProxy":{"DestinationServiceName":"web"}}]"#;
        let got: Vec<CatalogService> = crate::json::from_slice(body).unwrap_or_default();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].service_kind, ServiceKind::ConnectProxy);
        assert_eq!(got[0].service_id, "web-sidecar-proxy");
        assert_eq!(got[0].service_port, 21000);
    }
}
