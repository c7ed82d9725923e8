//! The generated bootstrap is accepted by the real Envoy, with one xDS server or several.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::process::Command;
use supervisor::bootstrap::{BootstrapConfig, XdsServer, XdsTls, bootstrap_json};
use supervisor::envoy::AdminAddr;
use test_support::envoy;

/// A CA certificate in PEM (Envoy parses `trusted_ca` when validating).
const CA_PEM: &str = include_str!("ca.pem");

fn server(addr: &str, host: &str) -> XdsServer {
    XdsServer {
        addr: addr.parse().unwrap(),
        host: host.into(),
    }
}

fn config(token: &str, xds_servers: Vec<XdsServer>, tls: bool) -> BootstrapConfig {
    BootstrapConfig {
        proxy_id: "web-sidecar-proxy".into(),
        node_name: "node-1".into(),
        cluster: "web".into(),
        admin: AdminAddr::Tcp("127.0.0.1:19000".parse().unwrap()),
        xds_servers,
        token: structs::Token::new(token),
        xds_tls: tls.then(|| XdsTls { ca_pem: CA_PEM.into() }),
        prometheus_bind: None,
        options: Default::default(),
    }
}

/// Runs `envoy --mode validate` on the bootstrap.
fn assert_envoy_accepts(json: &Value) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bootstrap.json");
    std::fs::write(&path, serde_json::to_vec_pretty(json).unwrap()).unwrap();
    let out = Command::new(envoy())
        .args(["--mode", "validate", "-l", "error", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}\n{json:#}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Checks a TLS transport socket: the CA, ALPN, the name checked, SNI for host names only.
fn assert_tls_for(socket: &Value, server_name: &str) {
    let context = &socket["typed_config"];
    assert_eq!(context["common_tls_context"]["alpn_protocols"][0], "h2");
    assert_eq!(
        context["common_tls_context"]["validation_context"]["trusted_ca"]["inline_string"],
        CA_PEM
    );
    let san = &context["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"][0];
    assert_eq!(san["matcher"]["exact"], server_name);
    let is_ip = server_name.parse::<std::net::IpAddr>().is_ok();
    assert_eq!(san["san_type"], if is_ip { "IP_ADDRESS" } else { "DNS" });
    assert_eq!(context["sni"].is_null(), is_ip);
}

fn endpoint_addresses(cluster: &Value) -> Vec<String> {
    let localities = cluster["load_assignment"]["endpoints"].as_array().unwrap();
    assert_eq!(localities.len(), 1, "one locality");
    localities[0]["lb_endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let a = &e["endpoint"]["address"]["socket_address"];
            format!("{}:{}", a["address"].as_str().unwrap(), a["port_value"])
        })
        .collect()
}

#[test]
fn bootstrap_with_one_xds_server_passes_envoy_validate() {
    let one = || vec![server("127.0.0.1:8502", "127.0.0.1")];
    let named = || vec![server("127.0.0.1:8502", "server.dc1.meshd")];
    for (token, servers, tls) in [
        ("", one(), false),
        ("secret-token", one(), false),
        ("", one(), true),
        ("secret-token", named(), true),
    ] {
        let host = servers[0].host.clone();
        let json = bootstrap_json(&config(token, servers, tls));
        assert_eq!(json["dynamic_resources"]["ads_config"]["api_type"], "DELTA_GRPC");
        assert_eq!(
            json["dynamic_resources"]["ads_config"]["set_node_on_first_message_only"],
            true
        );
        let cluster = &json["static_resources"]["clusters"][0];
        assert_eq!(cluster["type"], "STATIC");
        assert_eq!(endpoint_addresses(cluster), ["127.0.0.1:8502"]);
        assert!(cluster["transport_socket_matches"].is_null());
        let socket = &cluster["transport_socket"];
        if tls {
            assert_tls_for(socket, &host);
        } else {
            assert!(socket.is_null());
        }
        assert_envoy_accepts(&json);
    }
}

#[test]
fn bootstrap_with_three_xds_servers_lists_each_and_passes_envoy_validate() {
    let addrs = ["127.0.0.1:8502", "127.0.0.2:8502", "[::1]:8502"];

    // Plaintext: three endpoints in the order given, in one locality, no TLS.
    let plain: Vec<XdsServer> = addrs.iter().map(|a| server(a, "ignored")).collect();
    let json = bootstrap_json(&config("secret-token", plain, false));
    let cluster = &json["static_resources"]["clusters"][0];
    assert_eq!(cluster["type"], "STATIC");
    assert_eq!(
        endpoint_addresses(cluster),
        ["127.0.0.1:8502", "127.0.0.2:8502", "::1:8502"]
    );
    assert!(cluster["transport_socket"].is_null() && cluster["transport_socket_matches"].is_null());
    assert!(
        cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["metadata"].is_null(),
        "no per-endpoint TLS to pick"
    );
    assert_envoy_accepts(&json);

    // TLS, every server known by one name (one server certificate for all): one context, as
    // for a single server.
    let one_name: Vec<XdsServer> = addrs.iter().map(|a| server(a, "server.dc1.meshd")).collect();
    let json = bootstrap_json(&config("", one_name, true));
    let cluster = &json["static_resources"]["clusters"][0];
    assert_eq!(endpoint_addresses(cluster).len(), 3);
    assert_tls_for(&cluster["transport_socket"], "server.dc1.meshd");
    assert!(cluster["transport_socket_matches"].is_null());
    assert_envoy_accepts(&json);

    // TLS, each server known by its own name: each endpoint is checked against its own name.
    let hosts = ["127.0.0.1", "server-b.dc1.meshd", "::1"];
    let own_names: Vec<XdsServer> = addrs.iter().zip(hosts).map(|(a, h)| server(a, h)).collect();
    let json = bootstrap_json(&config("secret-token", own_names, true));
    let cluster = &json["static_resources"]["clusters"][0];
    let matches = cluster["transport_socket_matches"].as_array().unwrap();
    assert_eq!(matches.len(), 3);
    let endpoints = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
        .as_array()
        .unwrap();
    for (endpoint, host) in endpoints.iter().zip(hosts) {
        let tag = &endpoint["metadata"]["filter_metadata"]["envoy.transport_socket_match"];
        let chosen = matches.iter().find(|m| m["match"] == *tag).unwrap();
        assert_tls_for(&chosen["transport_socket"], host);
    }
    // An endpoint no match picks would still get TLS, never plaintext.
    assert_tls_for(&cluster["transport_socket"], hosts[0]);
    assert_envoy_accepts(&json);
}

#[test]
fn a_prometheus_bind_adds_a_metrics_listener_over_the_admin_interface_and_passes_envoy_validate() {
    let mut cfg = config("", vec![server("127.0.0.1:8502", "127.0.0.1")], false);
    cfg.prometheus_bind = Some("0.0.0.0:20200".parse().unwrap());
    let json = bootstrap_json(&cfg);
    let listener = &json["static_resources"]["listeners"][0];
    assert_eq!(listener["name"], "envoy_prometheus_metrics_listener");
    assert_eq!(listener["address"]["socket_address"]["port_value"], 20200);
    let admin = &json["static_resources"]["clusters"][1];
    assert_eq!(admin["name"], "self_admin");
    assert_eq!(
        admin["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["port_value"],
        19000
    );
    assert_envoy_accepts(&json);
}

#[test]
fn an_admin_on_a_unix_socket_is_mode_0600_serves_the_metrics_listener_and_passes_envoy_validate() {
    let mut cfg = config("", vec![server("127.0.0.1:8502", "127.0.0.1")], false);
    cfg.admin = AdminAddr::Unix("/run/meshd/web/admin.sock".into());
    cfg.prometheus_bind = Some("0.0.0.0:20200".parse().unwrap());
    let json = bootstrap_json(&cfg);
    let pipe = serde_json::json!({"pipe": {"path": "/run/meshd/web/admin.sock", "mode": 0o600}});
    assert_eq!(json["admin"]["address"], pipe, "no TCP admin");
    let admin = &json["static_resources"]["clusters"][1];
    assert_eq!(admin["name"], "self_admin");
    assert_eq!(
        admin["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"],
        pipe
    );
    assert_envoy_accepts(&json);
}

/// The proxy's `Config` bootstrap keys: statsd and DogStatsD sinks, a sink of the user's,
/// fixed tags, the flush interval, Zipkin tracing to an extra static cluster, an extra
/// listener, and `envoy_prometheus_bind_addr`. Envoy accepts the result.
#[test]
fn config_keys_add_stats_sinks_tags_tracing_and_static_resources_and_pass_envoy_validate() {
    let keys = serde_json::json!({
        "envoy_statsd_url": "udp://127.0.0.1:8125",
        "envoy_dogstatsd_url": "$DOGSTATSD",
        "envoy_stats_tags": "team=payments, env=prod",
        "envoy_stats_flush_interval": "2500ms",
        "envoy_prometheus_bind_addr": "127.0.0.1:20201",
        "envoy_stats_sinks_json": r#"{"name": "envoy.stat_sinks.hystrix", "typed_config": {
            "@type": "type.googleapis.com/envoy.config.metrics.v3.HystrixSink", "num_buckets": 10}}"#,
        "envoy_tracing_json": r#"{"http": {"name": "envoy.tracers.zipkin", "typed_config": {
            "@type": "type.googleapis.com/envoy.config.trace.v3.ZipkinConfig",
            "collector_cluster": "zipkin", "collector_endpoint": "/api/v2/spans",
            "collector_endpoint_version": "HTTP_JSON", "shared_span_context": false}}}"#,
        "envoy_extra_static_clusters_json": r#"{"name": "zipkin", "type": "STATIC", "connect_timeout": "1s",
            "load_assignment": {"cluster_name": "zipkin", "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 9411}}}}]}]}}"#,
        "envoy_extra_static_listeners_json": r#"{"name": "extra", "address": {"socket_address": {
            "address": "127.0.0.1", "port_value": 20202}}, "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": "extra", "cluster": "zipkin"}}]}]}"#,
    });
    let env = |var: &str| (var == "DOGSTATSD").then(|| "unix:///var/run/dsd.sock".to_owned());
    let mut cfg = config("", vec![server("127.0.0.1:8502", "127.0.0.1")], false);
    cfg.options = structs::bootstrap::BootstrapOptions::parse(keys.as_object().unwrap(), &env).unwrap();
    let json = bootstrap_json(&cfg);
    let sinks: Vec<&str> = json["stats_sinks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        sinks,
        [
            "envoy.stat_sinks.statsd",
            "envoy.stat_sinks.dog_statsd",
            "envoy.stat_sinks.hystrix"
        ]
    );
    assert_eq!(
        json["stats_sinks"][1]["typed_config"]["address"]["pipe"]["path"],
        "/var/run/dsd.sock"
    );
    assert_eq!(json["stats_config"]["stats_tags"][0]["tag_name"], "team");
    assert_eq!(json["stats_config"]["stats_tags"][1]["fixed_value"], "prod");
    assert_eq!(json["stats_flush_interval"], "2.500000000s");
    assert_eq!(json["tracing"]["http"]["name"], "envoy.tracers.zipkin");
    let names = |kind: &str| -> Vec<String> {
        json["static_resources"][kind]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names("clusters"), ["local_agent", "self_admin", "zipkin"]);
    assert_eq!(names("listeners"), ["envoy_prometheus_metrics_listener", "extra"]);
    assert_envoy_accepts(&json);
}
