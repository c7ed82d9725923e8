//! Envoy bootstrap: who the proxy is, where its admin listens, and how it reaches the xDS
//! server (delta ADS over HTTP/2 to the `local_agent` cluster, the token as gRPC metadata,
//! over TLS verified with a given CA when asked).

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
    /// xDS over TLS (`None`: plaintext).
    pub xds_tls: Option<XdsTls>,
}

/// How Envoy verifies the xDS server over TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsTls {
    /// The CA certificates (PEM) Envoy trusts, inlined in the bootstrap: nothing to find on
    /// disk at a restart.
    pub ca_pem: String,
    /// The name the server's certificate must carry: a DNS name (also sent as SNI) or an IP
    /// address.
    pub server_name: String,
}

/// The xDS cluster's TLS: the CA, the server's name checked against its certificate's SANs,
/// ALPN `h2` (gRPC).
fn tls_socket(tls: &XdsTls) -> Value {
    let is_ip = tls.server_name.parse::<std::net::IpAddr>().is_ok();
    let san_type = if is_ip { "IP_ADDRESS" } else { "DNS" };
    let mut context = json!({
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "common_tls_context": {
            "alpn_protocols": ["h2"],
            "validation_context": {
                "trusted_ca": {"inline_string": tls.ca_pem},
                "match_typed_subject_alt_names": [{"san_type": san_type, "matcher": {"exact": tls.server_name}}]
            }
        }
    });
    // SNI carries host names only (RFC 6066).
    if !is_ip {
        context["sni"] = Value::String(tls.server_name.clone());
    }
    json!({"name": "envoy.transport_sockets.tls", "typed_config": context})
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
    let mut xds_cluster = json!({
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
    });
    if let Some(tls) = &cfg.xds_tls {
        xds_cluster["transport_socket"] = tls_socket(tls);
    }
    json!({
        "node": {"id": cfg.proxy_id, "cluster": cfg.cluster, "metadata": metadata},
        "admin": {"address": socket(cfg.admin_bind)},
        "static_resources": {
            "clusters": [xds_cluster]
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
