//! Merging central config into a proxy registration, as the catalog source does before
//! handing it to the Manager: proxy-defaults and the destination's service-defaults fill
//! what the registration leaves unset; what the registration sets always wins.

use serde_json::Value;
use std::sync::Arc;
use structs::config_entry::{ProxyDefaults, ServiceDefaults};
use structs::{ConfigEntry, MeshGatewayMode, NodeService, ProxyMode};

fn service_defaults<'a>(entries: &'a [Arc<ConfigEntry>], name: &str) -> Option<&'a ServiceDefaults> {
    entries.iter().find_map(|e| match &**e {
        ConfigEntry::ServiceDefaults(d) if d.name == name => Some(d),
        _ => None,
    })
}

/// The registration with proxy-defaults and service-defaults merged in.
pub fn merge_central_config(
    registration: &NodeService,
    proxy_defaults: Option<&ProxyDefaults>,
    service_defaults_entries: &[Arc<ConfigEntry>],
) -> NodeService {
    let mut svc = registration.clone();
    let proxy = &mut svc.proxy;
    let own = service_defaults(service_defaults_entries, &proxy.destination_service_name);

    if let Some(pd) = proxy_defaults {
        for (k, v) in &pd.config {
            proxy.config.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    if let Some(d) = own
        && !d.protocol.is_empty()
        && !registration.proxy.config.contains_key("protocol")
    {
        proxy
            .config
            .insert("protocol".into(), Value::String(d.protocol.clone()));
    }
    if proxy.mode == ProxyMode::Default {
        proxy.mode = own
            .map(|d| d.mode)
            .filter(|m| *m != ProxyMode::Default)
            .or(proxy_defaults.map(|p| p.mode))
            .unwrap_or_default();
    }
    if proxy.mesh_gateway.mode == MeshGatewayMode::Default {
        let from_service = own
            .map(|d| d.mesh_gateway.clone())
            .filter(|m| m.mode != MeshGatewayMode::Default);
        if let Some(mg) = from_service.or(proxy_defaults.map(|p| p.mesh_gateway.clone())) {
            proxy.mesh_gateway = mg;
        }
    }
    if proxy.expose == Default::default()
        && let Some(expose) = own
            .map(|d| d.expose.clone())
            .filter(|e| *e != Default::default())
            .or(proxy_defaults.map(|p| p.expose.clone()))
    {
        proxy.expose = expose;
    }
    if proxy.transparent_proxy == Default::default()
        && let Some(tp) = own
            .map(|d| d.transparent_proxy.clone())
            .filter(|t| *t != Default::default())
            .or(proxy_defaults.map(|p| p.transparent_proxy.clone()))
    {
        proxy.transparent_proxy = tp;
    }

    let upstream_config = own.and_then(|d| d.upstream_config.as_ref());
    for up in &mut proxy.upstreams {
        let set_by_registration = up.config.contains_key("protocol");
        let layers = upstream_config.into_iter().flat_map(|u| {
            u.defaults
                .iter()
                .chain(u.overrides.iter().filter(|o| o.name == up.destination_name))
        });
        for layer in layers {
            if !layer.protocol.is_empty() && !set_by_registration {
                up.config
                    .insert("protocol".into(), Value::String(layer.protocol.clone()));
            }
            if layer.connect_timeout_ms != 0 && !up.config.contains_key("connect_timeout_ms") {
                up.config
                    .insert("connect_timeout_ms".into(), Value::from(layer.connect_timeout_ms));
            }
            if layer.mesh_gateway.mode != MeshGatewayMode::Default && up.mesh_gateway.mode == MeshGatewayMode::Default {
                up.mesh_gateway = layer.mesh_gateway.clone();
            }
        }
    }
    svc
}

#[cfg(test)]
mod tests {
    use super::*;
    use structs::config_entry::{UpstreamConfig, UpstreamConfigs};
    use structs::{ConnectProxyConfig, ServiceKind, Upstream};

    #[test]
    fn registration_wins_and_defaults_fill_the_rest() {
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
        let sd = vec![Arc::new(ConfigEntry::ServiceDefaults(ServiceDefaults {
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
                    ..Default::default()
                }],
            }),
            ..Default::default()
        }))];
        let merged = merge_central_config(&reg, Some(&pd), &sd);
        let c = &merged.proxy.config;
        assert_eq!(c["envoy_stats_flush"], "1s", "the registration wins");
        assert_eq!(c["local_request_timeout_ms"], 100);
        assert_eq!(c["protocol"], "http");
        assert_eq!(merged.proxy.mode, ProxyMode::Direct);
        assert_eq!(merged.proxy.upstreams[0].config["connect_timeout_ms"], 700);
        assert!(!merged.proxy.upstreams[0].config.contains_key("protocol"));
        assert_eq!(merged.proxy.upstreams[1].config["protocol"], "tcp");
        assert_eq!(
            merge_central_config(&reg, None, &[]),
            reg,
            "nothing to merge, nothing changes"
        );
    }
}
