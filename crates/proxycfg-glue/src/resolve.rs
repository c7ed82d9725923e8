//! Central config resolution, as the server computes it for proxies: proxy-defaults and
//! service-defaults merged into a service's resolved config, and the default discovery chain
//! of an upstream.

use serde_json::Value;
use std::sync::Arc;
use structs::config_entry::{ProxyDefaults, ServiceDefaults, ServiceResolver};
use structs::discovery_chain::DEFAULT_CONNECT_TIMEOUT_MS;
use structs::{
    CompiledDiscoveryChain, ConfigEntry, MeshGatewayMode, ProxyMode, ResolvedServiceConfig, ResolvedUpstreamConfig,
    UpstreamId,
};

/// The proxy-defaults entry inside a payload, if any.
pub(crate) fn proxy_defaults(entry: Option<&Arc<ConfigEntry>>) -> Option<&ProxyDefaults> {
    match entry.map(|e| &**e) {
        Some(ConfigEntry::ProxyDefaults(p)) => Some(p),
        _ => None,
    }
}

/// The service-defaults entry for `name` among `entries`.
pub(crate) fn service_defaults<'a>(entries: &'a [Arc<ConfigEntry>], name: &str) -> Option<&'a ServiceDefaults> {
    entries.iter().find_map(|e| match &**e {
        ConfigEntry::ServiceDefaults(d) if d.name == name => Some(d),
        _ => None,
    })
}

/// A service's protocol: its service-defaults, else proxy-defaults' `Config.protocol`, else tcp.
pub(crate) fn protocol_of(name: &str, proxy: Option<&ProxyDefaults>, services: &[Arc<ConfigEntry>]) -> String {
    if let Some(d) = service_defaults(services, name)
        && !d.protocol.is_empty()
    {
        return d.protocol.clone();
    }
    proxy
        .and_then(|p| p.config.get("protocol"))
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
        .unwrap_or("tcp")
        .to_owned()
}

/// Merges proxy-defaults and service-defaults for `name` and resolves each upstream's
/// protocol and connect timeout (service-defaults' `UpstreamConfig` defaults, then overrides).
pub(crate) fn resolved_config(
    name: &str,
    upstreams: &[UpstreamId],
    proxy: Option<&ProxyDefaults>,
    services: &[Arc<ConfigEntry>],
) -> ResolvedServiceConfig {
    let own = service_defaults(services, name);
    let mut out = ResolvedServiceConfig::default();
    if let Some(p) = proxy {
        out.proxy_config = p.config.clone();
        out.mode = p.mode;
        out.mesh_gateway = p.mesh_gateway.clone();
        out.expose = p.expose.clone();
        out.transparent_proxy = p.transparent_proxy.clone();
    }
    if let Some(d) = own {
        if !d.protocol.is_empty() {
            out.proxy_config
                .insert("protocol".into(), Value::String(d.protocol.clone()));
        }
        if d.mode != ProxyMode::Default {
            out.mode = d.mode;
        }
        if d.mesh_gateway.mode != MeshGatewayMode::Default {
            out.mesh_gateway = d.mesh_gateway.clone();
        }
        if d.expose != Default::default() {
            out.expose = d.expose.clone();
        }
        if d.transparent_proxy != Default::default() {
            out.transparent_proxy = d.transparent_proxy.clone();
        }
    }
    for up in upstreams {
        let mut config = serde_json::Map::new();
        config.insert("protocol".into(), Value::String(protocol_of(&up.name, proxy, services)));
        let upstream_config = own.and_then(|d| d.upstream_config.as_ref());
        let layers = upstream_config.into_iter().flat_map(|u| {
            u.defaults
                .iter()
                .chain(u.overrides.iter().filter(|o| o.name == up.name))
        });
        for layer in layers {
            if !layer.protocol.is_empty() {
                config.insert("protocol".into(), Value::String(layer.protocol.clone()));
            }
            if layer.connect_timeout_ms != 0 {
                config.insert("connect_timeout_ms".into(), Value::from(layer.connect_timeout_ms));
            }
        }
        out.upstream_configs.push(ResolvedUpstreamConfig {
            upstream: up.name.clone(),
            config,
        });
    }
    out
}

/// The chain of a service whose routing no router, splitter or resolver shapes beyond a
/// connect timeout: one resolver node, one target.
pub(crate) fn default_chain(
    name: &str,
    datacenter: &str,
    trust_domain: &str,
    protocol: &str,
    connect_timeout_ms: u32,
    resolver: Option<&ServiceResolver>,
) -> CompiledDiscoveryChain {
    let mut chain = CompiledDiscoveryChain::default_for(name, datacenter, trust_domain, protocol);
    let timeout = if connect_timeout_ms != 0 {
        connect_timeout_ms
    } else {
        resolver
            .map(|r| r.connect_timeout.0.as_millis())
            .filter(|ms| *ms > 0)
            .and_then(|ms| u32::try_from(ms).ok())
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT_MS)
    };
    for target in chain.targets.values_mut() {
        target.connect_timeout_ms = timeout;
    }
    for node in chain.nodes.values_mut() {
        if let structs::discovery_chain::ChainNode::Resolver { connect_timeout_ms, .. } = node {
            *connect_timeout_ms = timeout;
        }
    }
    chain
}

/// Why a resolver cannot be compiled yet (subsets, redirects and failover are not).
pub(crate) fn unsupported_resolver(resolver: &ServiceResolver) -> Option<&'static str> {
    if !resolver.subsets.is_empty() || !resolver.default_subset.is_empty() {
        Some("service-resolver subsets")
    } else if resolver.redirect.is_some() {
        Some("service-resolver redirects")
    } else if !resolver.failover.is_empty() {
        Some("service-resolver failover")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use structs::config_entry::{UpstreamConfig, UpstreamConfigs};

    fn entry(e: ConfigEntry) -> Arc<ConfigEntry> {
        Arc::new(e)
    }

    #[test]
    fn service_defaults_override_proxy_defaults_and_upstreams_resolve() {
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
                structs::Upstream {
                    destination_name: (*n).into(),
                    ..Default::default()
                }
                .id()
            })
            .collect();
        let r = resolved_config("web", &ups, Some(&proxy), &services);
        assert_eq!(r.protocol(), "grpc");
        assert_eq!(r.proxy_config["envoy_stats_flush"], "5s");
        let cfg = |name: &str| {
            r.upstream_configs
                .iter()
                .find(|u| u.upstream == name)
                .unwrap()
                .config
                .clone()
        };
        assert_eq!(cfg("api")["protocol"], "http2");
        assert_eq!(cfg("api")["connect_timeout_ms"], 250);
        assert_eq!(cfg("db")["protocol"], "tcp", "override wins");
        assert_eq!(cfg("cache")["protocol"], "http", "falls back to proxy-defaults");
        assert_eq!(protocol_of("other", None, &[]), "tcp");
    }

    #[test]
    fn default_chain_takes_the_resolver_timeout_unless_overridden() {
        let resolver = ServiceResolver {
            name: "api".into(),
            connect_timeout: structs::GoDuration(std::time::Duration::from_millis(1500)),
            ..Default::default()
        };
        let chain = default_chain("api", "dc1", "td.consul", "http", 0, Some(&resolver));
        assert_eq!(chain.targets.values().next().unwrap().connect_timeout_ms, 1500);
        assert_eq!(chain.protocol, "http");
        let chain = default_chain("api", "dc1", "td.consul", "tcp", 300, Some(&resolver));
        assert_eq!(chain.targets.values().next().unwrap().connect_timeout_ms, 300);
        assert_eq!(
            chain.targets.values().next().unwrap().sni,
            "api.default.dc1.internal.td.consul"
        );
    }
}
