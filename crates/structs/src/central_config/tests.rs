use super::*;
use crate::config_entry::UpstreamConfigs;
use crate::{ConnectProxyConfig, ServiceKind, Upstream};

fn entry(e: ConfigEntry) -> Arc<ConfigEntry> {
    Arc::new(e)
}

#[test]
fn resolve_layers_service_defaults_over_proxy_defaults_and_upstreams() {
    let mut proxy = ProxyDefaults::default();
    proxy.config.insert("protocol".into(), Value::from("http"));
    proxy
        .config
        .insert("envoy_stats_flush_interval".into(), Value::from("5s"));
    let services = vec![
        entry(ConfigEntry::ServiceDefaults(ServiceDefaults {
            name: "web".into(),
            protocol: "grpc".into(),
            upstream_config: Some(UpstreamConfigs {
                defaults: Some(UpstreamConfig {
                    connect_timeout_ms: 250,
                    ..Default::default()
                }),
                overrides: vec![UpstreamConfig {
                    name: "db".into(),
                    protocol: "tcp".into(),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        })),
        entry(ConfigEntry::ServiceDefaults(ServiceDefaults {
            name: "api".into(),
            protocol: "http2".into(),
            ..Default::default()
        })),
    ];
    let ups: Vec<UpstreamId> = ["api", "db", "cache"]
        .iter()
        .map(|n| {
            Upstream {
                destination_name: (*n).into(),
                ..Default::default()
            }
            .id()
        })
        .collect();
    let central = CentralConfig::new(Some(&proxy), &services);
    let r = central.resolve("web", &ups);
    assert_eq!(r.protocol(), Protocol::Grpc);
    assert_eq!(r.proxy_config["envoy_stats_flush_interval"], "5s");
    let cfg = |name: &str| {
        r.upstream_configs
            .iter()
            .find(|u| u.upstream == name)
            .map(|u| u.config.clone())
            .unwrap_or_default()
    };
    assert_eq!(cfg("api")["protocol"], "http2");
    assert_eq!(cfg("api")["connect_timeout_ms"], 250);
    assert_eq!(cfg("db")["protocol"], "tcp", "override wins");
    assert_eq!(cfg("cache")["protocol"], "http", "falls back to proxy-defaults");
    assert_eq!(CentralConfig::new(None, &[]).protocol_of("other"), Protocol::Tcp);
}

#[test]
fn merge_fills_what_the_registration_leaves_unset() {
    let mut reg = NodeService {
        kind: ServiceKind::ConnectProxy,
        service: "web-sidecar-proxy".into(),
        proxy: ConnectProxyConfig {
            destination_service_name: "web".into(),
            upstreams: vec![
                Upstream {
                    destination_name: "api".into(),
                    local_bind_port: 1,
                    ..Default::default()
                },
                Upstream {
                    destination_name: "db".into(),
                    local_bind_port: 2,
                    ..Default::default()
                },
            ],
            ..Default::default()
        },
        ..Default::default()
    };
    reg.proxy
        .config
        .insert("envoy_stats_flush_interval".into(), Value::from("1s"));
    let mut pd = ProxyDefaults {
        mode: ProxyMode::Direct,
        ..Default::default()
    };
    pd.config.insert("envoy_stats_flush_interval".into(), Value::from("9s"));
    pd.config.insert("local_request_timeout_ms".into(), Value::from(100));
    let sd = vec![entry(ConfigEntry::ServiceDefaults(ServiceDefaults {
        name: "web".into(),
        protocol: "http".into(),
        upstream_config: Some(UpstreamConfigs {
            defaults: Some(UpstreamConfig {
                connect_timeout_ms: 700,
                ..Default::default()
            }),
            overrides: vec![UpstreamConfig {
                name: "db".into(),
                protocol: "tcp".into(),
                connect_timeout_ms: 300,
                ..Default::default()
            }],
        }),
        ..Default::default()
    }))];
    let merged = CentralConfig::new(Some(&pd), &sd).merge_into(&reg);
    let c = &merged.proxy.config;
    assert_eq!(c["envoy_stats_flush_interval"], "1s", "the registration wins");
    assert_eq!(c["local_request_timeout_ms"], 100);
    assert_eq!(c["protocol"], "http");
    assert_eq!(merged.proxy.mode, ProxyMode::Direct);
    assert_eq!(merged.proxy.upstreams[0].config["connect_timeout_ms"], 700);
    assert!(!merged.proxy.upstreams[0].config.contains_key("protocol"));
    assert_eq!(merged.proxy.upstreams[1].config["protocol"], "tcp");
    assert_eq!(
        merged.proxy.upstreams[1].config["connect_timeout_ms"], 300,
        "the override naming the upstream wins over the defaults"
    );
    assert_eq!(
        CentralConfig::new(None, &[]).merge_into(&reg),
        reg,
        "nothing to merge, nothing changes"
    );
}

#[test]
fn service_defaults_inbound_settings_and_rate_limits_reach_the_proxy() {
    let mut proxy = ProxyDefaults::default();
    proxy
        .config
        .insert("local_request_timeout_ms".into(), Value::from(1000));
    proxy.config.insert("local_connect_timeout_ms".into(), Value::from(100));
    let limits: crate::RateLimits = serde_json::from_str(r#"{"InstanceLevel": {"RequestsPerSecond": 10}}"#).unwrap();
    let services = vec![entry(ConfigEntry::ServiceDefaults(ServiceDefaults {
        name: "web".into(),
        local_request_timeout_ms: 9000,
        max_inbound_connections: 64,
        balance_inbound_connections: "exact_balance".into(),
        rate_limits: Some(limits.clone()),
        ..Default::default()
    }))];
    let central = CentralConfig::new(Some(&proxy), &services);
    let r = central.resolve("web", &[]);
    let o = crate::InboundOptions::parse(&Default::default(), &r.proxy_config);
    assert_eq!(
        o.local_request_timeout_ms,
        Some(9000),
        "service-defaults over proxy-defaults"
    );
    assert_eq!(o.local_connect_timeout_ms, Some(100), "proxy-defaults where unset");
    assert_eq!(o.max_inbound_connections, Some(64));
    assert!(o.exact_balance);
    assert_eq!(r.rate_limits, Some(limits));

    let mut reg = NodeService {
        kind: ServiceKind::ConnectProxy,
        ..Default::default()
    };
    reg.proxy.destination_service_name = "web".into();
    reg.proxy
        .config
        .insert("local_request_timeout_ms".into(), Value::from(5));
    let merged = central.merge_into(&reg);
    assert_eq!(
        merged.proxy.config["local_request_timeout_ms"], 5,
        "the registration wins"
    );
    assert_eq!(merged.proxy.config["max_inbound_connections"], 64);
}
