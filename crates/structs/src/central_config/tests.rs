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
    proxy.config.insert("envoy_stats_flush".into(), Value::from("5s"));
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
    assert_eq!(r.proxy_config["envoy_stats_flush"], "5s");
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
    reg.proxy.config.insert("envoy_stats_flush".into(), Value::from("1s"));
    let mut pd = ProxyDefaults {
        mode: ProxyMode::Direct,
        ..Default::default()
    };
    pd.config.insert("envoy_stats_flush".into(), Value::from("9s"));
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
    assert_eq!(c["envoy_stats_flush"], "1s", "the registration wins");
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
