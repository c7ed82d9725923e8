//! Envoy bootstrap: who the proxy is, where its admin listens, and how it reaches the xDS
//! server (delta ADS over HTTP/2 to the `local_agent` cluster, the token as gRPC metadata).

use serde_json::{Value, json};
use std::net::SocketAddr;
use structs::wire::{NODE_NAME_METADATA, TOKEN_HEADER};

/// What a bootstrap needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapConfig {
    /// The proxy's service instance id: Envoy's node id.
    pub proxy_id: String,
    /// The catalog node the proxy is registered on (empty: the server resolves it by id).
    pub node_name: String,
    /// Envoy's node cluster: the proxy's service name (the service it fronts for a sidecar).
    pub cluster: String,
    /// Address of Envoy's admin interface.
    pub admin_bind: SocketAddr,
    /// Address of the xDS server.
    pub xds_addr: SocketAddr,
    /// ACL token sent as `x-consul-token` (empty: none).
    pub token: String,
}

fn socket(addr: SocketAddr) -> Value {
    json!({"socket_address": {"address": addr.ip().to_string(), "port_value": addr.port()}})
}

/// The bootstrap as JSON (valid YAML too: Envoy takes it with `-c file` or `--config-yaml`).
pub fn bootstrap_json(cfg: &BootstrapConfig) -> Value {
    let mut metadata = json!({"namespace": "default", "partition": "default"});
    if !cfg.node_name.is_empty() {
        metadata[NODE_NAME_METADATA] = Value::String(cfg.node_name.clone());
    }
    let mut grpc_service = json!({"envoy_grpc": {"cluster_name": "local_agent"}});
    if !cfg.token.is_empty() {
        grpc_service["initial_metadata"] = json!([{"key": TOKEN_HEADER, "value": cfg.token}]);
    }
    json!({
        "node": {"id": cfg.proxy_id, "cluster": cfg.cluster, "metadata": metadata},
        "admin": {"address": socket(cfg.admin_bind)},
        "static_resources": {
            "clusters": [{
                "name": "local_agent",
                "type": "STATIC",
                "connect_timeout": "1s",
                "load_assignment": {
                    "cluster_name": "local_agent",
                    "endpoints": [{"lb_endpoints": [{"endpoint": {"address": socket(cfg.xds_addr)}}]}]
                },
                "typed_extension_protocol_options": {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": {"http2_protocol_options": {}}
                    }
                }
            }]
        },
        "dynamic_resources": {
            "lds_config": {"ads": {}, "resource_api_version": "V3"},
            "cds_config": {"ads": {}, "resource_api_version": "V3"},
            "ads_config": {
                "api_type": "DELTA_GRPC",
                "transport_api_version": "V3",
                "grpc_services": [grpc_service]
            }
        }
    })
}
