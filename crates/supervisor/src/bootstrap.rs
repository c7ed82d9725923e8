//! Envoy bootstrap: who the proxy is, where its admin listens, and how it reaches the xDS
//! servers (delta ADS over HTTP/2 to the `local_agent` cluster, one endpoint per server so the
//! stream moves to another when one fails, the token as gRPC metadata, over TLS verified with
//! a given CA when asked).

use crate::envoy::AdminAddr;
use serde_json::{Value, json};
use std::net::SocketAddr;
use structs::Token;
use structs::bootstrap::{BootstrapOptions, SinkAddr};
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
    /// Envoy's admin interface: a Unix socket (made mode 0600) or a TCP address.
    pub admin: AdminAddr,
    /// The xDS servers, at least one, in the order given: each is an endpoint of the
    /// `local_agent` cluster, so a stream whose server dies reconnects to another.
    pub xds_servers: Vec<XdsServer>,
    /// ACL token sent as `x-consul-token`, if any.
    pub token: Option<Token>,
    /// xDS over TLS (`None`: plaintext).
    pub xds_tls: Option<XdsTls>,
    /// Where Envoy serves its metrics in Prometheus' format at `/metrics` (Consul's
    /// `envoy_prometheus_bind_addr`): a listener that forwards to the admin interface's
    /// `/stats/prometheus`, so the admin interface itself need not be exposed.
    pub prometheus_bind: Option<SocketAddr>,
    /// The bootstrap keys of the proxy's `Config` (stats sinks and tags, tracing, extra
    /// static clusters and listeners). Its `prometheus_bind` is used when the field above is
    /// unset.
    pub options: BootstrapOptions,
}

/// One xDS server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsServer {
    /// Its address (a host name is resolved before: the cluster is static).
    pub addr: SocketAddr,
    /// The host as given, a DNS name or an IP address: over TLS, the name its certificate
    /// must carry (a DNS name is also sent as SNI).
    pub host: String,
}

/// How Envoy verifies the xDS servers over TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsTls {
    /// The CA certificates (PEM) Envoy trusts, inlined in the bootstrap: nothing to find on
    /// disk at a restart.
    pub ca_pem: String,
}

/// The metadata key that ties an xDS endpoint to the TLS context checking its name, when the
/// servers are known by several names.
const SERVER_NAME_MATCH: &str = "server_name";

/// The TLS toward a server known as `server_name`: the CA, the name checked against its
/// certificate's SANs, ALPN `h2` (gRPC).
fn tls_socket(tls: &XdsTls, server_name: &str) -> Value {
    let is_ip = server_name.parse::<std::net::IpAddr>().is_ok();
    let san_type = if is_ip { "IP_ADDRESS" } else { "DNS" };
    let mut context = json!({
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "common_tls_context": {
            "alpn_protocols": ["h2"],
            "validation_context": {
                "trusted_ca": {"inline_string": tls.ca_pem},
                "match_typed_subject_alt_names": [{"san_type": san_type, "matcher": {"exact": server_name}}]
            }
        }
    });
    // SNI carries host names only (RFC 6066).
    if !is_ip {
        context["sni"] = Value::String(server_name.to_owned());
    }
    json!({"name": "envoy.transport_sockets.tls", "typed_config": context})
}

/// The servers' distinct host names, in the order first given.
fn distinct_hosts(servers: &[XdsServer]) -> Vec<&str> {
    let mut hosts: Vec<&str> = Vec::new();
    for s in servers {
        if !hosts.contains(&s.host.as_str()) {
            hosts.push(&s.host);
        }
    }
    hosts
}

/// Sets the xDS cluster's TLS. Servers known by one name share one context (what a single
/// server gets); servers known by several get a context per name, picked per endpoint through
/// `transport_socket_matches`, and the first name's context as the cluster's default, so no
/// endpoint is ever reached in plaintext.
fn set_tls(cluster: &mut Value, tls: &XdsTls, servers: &[XdsServer]) {
    let hosts = distinct_hosts(servers);
    let Some(first) = hosts.first() else {
        return;
    };
    cluster["transport_socket"] = tls_socket(tls, first);
    if hosts.len() > 1 {
        cluster["transport_socket_matches"] = hosts
            .iter()
            .map(|host| {
                json!({
                    "name": host,
                    "match": {SERVER_NAME_MATCH: host},
                    "transport_socket": tls_socket(tls, host)
                })
            })
            .collect();
    }
}

/// The `local_agent` endpoints: one per server, each tagged with its name when the servers'
/// TLS contexts are picked per endpoint.
fn endpoints(cfg: &BootstrapConfig) -> Value {
    let tagged = cfg.xds_tls.is_some() && distinct_hosts(&cfg.xds_servers).len() > 1;
    cfg.xds_servers
        .iter()
        .map(|s| {
            let mut endpoint = json!({"endpoint": {"address": socket(s.addr)}});
            if tagged {
                endpoint["metadata"] =
                    json!({"filter_metadata": {"envoy.transport_socket_match": {SERVER_NAME_MATCH: s.host}}});
            }
            endpoint
        })
        .collect()
}

fn socket(addr: SocketAddr) -> Value {
    json!({"socket_address": {"address": addr.ip().to_string(), "port_value": addr.port()}})
}

/// The admin interface's address: a Unix socket only its owner may connect to (the
/// directory it is in should be private too: the mode is set after Envoy binds it).
fn admin_address(admin: &AdminAddr) -> Value {
    match admin {
        AdminAddr::Tcp(addr) => socket(*addr),
        AdminAddr::Unix(path) => json!({"pipe": {"path": path.to_string_lossy(), "mode": 0o600}}),
    }
}

/// The listener serving `/metrics` on `bind` from the admin interface's
/// `/stats/prometheus`, and the cluster of the admin interface it forwards to.
fn prometheus(bind: SocketAddr, admin: &AdminAddr) -> (Value, Value) {
    let listener = json!({
        "name": "envoy_prometheus_metrics_listener",
        "address": socket(bind),
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "envoy_prometheus_metrics",
                "codec_type": "HTTP1",
                "route_config": {
                    "name": "self_admin_route",
                    "virtual_hosts": [{
                        "name": "self_admin",
                        "domains": ["*"],
                        "routes": [
                            {"match": {"path": "/metrics"}, "route": {"cluster": "self_admin", "prefix_rewrite": "/stats/prometheus"}},
                            {"match": {"prefix": "/"}, "direct_response": {"status": 404}}
                        ]
                    }]
                },
                "http_filters": [{
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
                }]
            }
        }]}]
    });
    let cluster = json!({
        "name": "self_admin",
        "type": "STATIC",
        "connect_timeout": "5s",
        "load_assignment": {
            "cluster_name": "self_admin",
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": admin_address(admin)}}]}]
        }
    });
    (listener, cluster)
}

/// The bootstrap as JSON (valid YAML too: Envoy takes it with `-c file` or `--config-yaml`).
pub fn bootstrap_json(cfg: &BootstrapConfig) -> Value {
    let mut metadata = json!({"namespace": "default", "partition": "default"});
    if !cfg.node_name.is_empty() {
        metadata[NODE_NAME_METADATA] = Value::String(cfg.node_name.clone());
    }
    let mut grpc_service = json!({"envoy_grpc": {"cluster_name": "local_agent"}});
    if let Some(token) = &cfg.token {
        grpc_service["initial_metadata"] = json!([{"key": TOKEN_HEADER, "value": token.secret()}]);
    }
    let mut xds_cluster = json!({
        "name": "local_agent",
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": "local_agent",
            "endpoints": [{"lb_endpoints": endpoints(cfg)}]
        },
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}
            }
        }
    });
    if let Some(tls) = &cfg.xds_tls {
        set_tls(&mut xds_cluster, tls, &cfg.xds_servers);
    }
    let mut clusters = vec![xds_cluster];
    let mut listeners = Vec::new();
    if let Some(bind) = cfg.prometheus_bind.or(cfg.options.prometheus_bind) {
        let (listener, cluster) = prometheus(bind, &cfg.admin);
        listeners.push(listener);
        clusters.push(cluster);
    }
    clusters.extend(cfg.options.extra_clusters.iter().cloned());
    listeners.extend(cfg.options.extra_listeners.iter().cloned());
    let mut out = json!({
        "node": {"id": cfg.proxy_id, "cluster": cfg.cluster, "metadata": metadata},
        "admin": {"address": admin_address(&cfg.admin)},
        "static_resources": {
            "clusters": clusters,
            "listeners": listeners
        },
        "dynamic_resources": {
            "lds_config": {"ads": {}, "resource_api_version": "V3"},
            "cds_config": {"ads": {}, "resource_api_version": "V3"},
            "ads_config": {
                "api_type": "DELTA_GRPC",
                "transport_api_version": "V3",
                // Envoy's node (about 60 KB with its list of extensions) goes on a stream's
                // first request only; the server remembers it for the stream.
                "set_node_on_first_message_only": true,
                "grpc_services": [grpc_service]
            }
        }
    });
    observability(&mut out, &cfg.options);
    out
}

/// Stats sinks, tags, flush interval and tracing from the proxy's `Config`.
fn observability(out: &mut Value, o: &BootstrapOptions) {
    let mut sinks = Vec::new();
    if let Some(SinkAddr::Udp(addr)) = &o.statsd {
        sinks.push(json!({"name": "envoy.stat_sinks.statsd", "typed_config": {
            "@type": "type.googleapis.com/envoy.config.metrics.v3.StatsdSink", "address": socket(*addr)}}));
    }
    if let Some(addr) = &o.dogstatsd {
        let address = match addr {
            SinkAddr::Udp(a) => socket(*a),
            SinkAddr::Unix(path) => json!({"pipe": {"path": path}}),
        };
        sinks.push(json!({"name": "envoy.stat_sinks.dog_statsd", "typed_config": {
            "@type": "type.googleapis.com/envoy.config.metrics.v3.DogStatsdSink", "address": address}}));
    }
    sinks.extend(o.stats_sinks.iter().cloned());
    if !sinks.is_empty() {
        out["stats_sinks"] = Value::Array(sinks);
    }
    if let Some(stats_config) = &o.stats_config {
        out["stats_config"] = stats_config.clone();
    } else if !o.stats_tags.is_empty() {
        let tags: Vec<Value> = o
            .stats_tags
            .iter()
            .map(|(name, value)| json!({"tag_name": name, "fixed_value": value}))
            .collect();
        out["stats_config"] = json!({"stats_tags": tags});
    }
    if let Some(d) = o.stats_flush_interval {
        out["stats_flush_interval"] = Value::String(format!("{}.{:09}s", d.as_secs(), d.subsec_nanos()));
    }
    if let Some(tracing) = &o.tracing {
        out["tracing"] = tracing.clone();
    }
}
