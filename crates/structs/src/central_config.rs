//! Central config, merged in one place: proxy-defaults and service-defaults layered into
//! what a service's proxies use. Both families call this: the server answers
//! `ResolvedServiceConfig` watches with [`CentralConfig::resolve`], and config sources merge
//! a proxy registration with [`CentralConfig::merge_into`] (the registration always wins).
//!
//! The layering, after Consul's: proxy-defaults first, then the service's own
//! service-defaults where it sets a value; for each upstream, the service's
//! `UpstreamConfig.Defaults` and then the override naming that upstream.

use crate::config_entry::{ProxyDefaults, ServiceDefaults, UpstreamConfig};
use crate::protocol::{CONNECT_TIMEOUT_MS_KEY, LIMITS_KEY, PASSIVE_HEALTH_CHECK_KEY, PROTOCOL_KEY};
use crate::{
    ConfigEntry, MeshGatewayMode, NodeService, ProxyMode, ResolvedServiceConfig, ResolvedUpstreamConfig, UpstreamId,
};
use crate::{Protocol, ProxyOptions};
use serde_json::Value;
use std::sync::Arc;

/// The central config entries that apply to a service.
#[derive(Debug, Clone, Copy)]
pub struct CentralConfig<'a> {
    /// The global proxy-defaults entry, if any.
    pub proxy_defaults: Option<&'a ProxyDefaults>,
    /// Service-defaults entries (any names; the right ones are picked by name).
    pub service_defaults: &'a [Arc<ConfigEntry>],
}

/// The proxy-defaults entry inside `entry`, if it is one.
pub fn proxy_defaults(entry: Option<&Arc<ConfigEntry>>) -> Option<&ProxyDefaults> {
    match entry.map(|e| &**e) {
        Some(ConfigEntry::ProxyDefaults(p)) => Some(p),
        _ => None,
    }
}

impl<'a> CentralConfig<'a> {
    /// Central config from proxy-defaults and a list of service-defaults entries.
    pub fn new(proxy_defaults: Option<&'a ProxyDefaults>, service_defaults: &'a [Arc<ConfigEntry>]) -> Self {
        Self {
            proxy_defaults,
            service_defaults,
        }
    }

    /// The service-defaults entry of `name`.
    pub fn service_defaults(&self, name: &str) -> Option<&'a ServiceDefaults> {
        self.service_defaults.iter().find_map(|e| match &**e {
            ConfigEntry::ServiceDefaults(d) if d.name == name => Some(d),
            _ => None,
        })
    }

    /// A service's protocol: its service-defaults, else proxy-defaults' `Config.protocol`,
    /// else tcp.
    pub fn protocol_of(&self, name: &str) -> Protocol {
        if let Some(p) = self
            .service_defaults(name)
            .and_then(|d| d.protocol.parse::<Protocol>().ok())
        {
            return p;
        }
        self.proxy_defaults
            .and_then(|p| ProxyOptions::parse(&p.config).protocol)
            .unwrap_or_default()
    }

    /// The `UpstreamConfig` layers `service` sets for its upstream `upstream`, in the order
    /// they apply: its defaults, then the override that names the upstream.
    fn upstream_layers<'s>(&self, service: &str, upstream: &'s str) -> impl Iterator<Item = &'a UpstreamConfig> + 's
    where
        'a: 's,
    {
        let configs = self.service_defaults(service).and_then(|d| d.upstream_config.as_ref());
        configs.into_iter().flat_map(move |u| {
            u.defaults
                .iter()
                .chain(u.overrides.iter().filter(move |o| o.name == upstream))
        })
    }

    /// The service-level settings of `name`: proxy-defaults with service-defaults on top.
    fn service_level(&self, name: &str) -> ResolvedServiceConfig {
        let mut out = ResolvedServiceConfig::default();
        if let Some(p) = self.proxy_defaults {
            out.proxy_config = p.config.clone();
            out.mode = p.mode;
            out.mesh_gateway = p.mesh_gateway.clone();
            out.expose = p.expose.clone();
            out.transparent_proxy = p.transparent_proxy.clone();
            out.envoy_extensions.clone_from(&p.envoy_extensions);
        }
        if let Some(d) = self.service_defaults(name) {
            if !d.protocol.is_empty() {
                out.proxy_config
                    .insert(PROTOCOL_KEY.into(), Value::String(d.protocol.clone()));
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
            for (key, value) in d.inbound_settings() {
                out.proxy_config.insert(key.into(), value);
            }
            out.rate_limits = d.rate_limits.clone();
            out.destination = d.destination.clone();
            out.envoy_extensions.extend(d.envoy_extensions.iter().cloned());
        }
        out
    }

    /// The resolved config of `name` (Consul's `ServiceConfigResponse`): the service-level
    /// settings, and per upstream its protocol (the upstream's own, then `service`'s layers)
    /// and connect timeout.
    pub fn resolve(&self, name: &str, upstreams: &[UpstreamId]) -> ResolvedServiceConfig {
        let mut out = self.service_level(name);
        for up in upstreams {
            let mut config = serde_json::Map::new();
            config.insert(PROTOCOL_KEY.into(), Value::from(self.protocol_of(&up.name).as_str()));
            for layer in self.upstream_layers(name, &up.name) {
                if !layer.protocol.is_empty() {
                    config.insert(PROTOCOL_KEY.into(), Value::String(layer.protocol.clone()));
                }
                if layer.connect_timeout_ms != 0 {
                    config.insert(CONNECT_TIMEOUT_MS_KEY.into(), Value::from(layer.connect_timeout_ms));
                }
                for (key, value) in layer_extras(layer) {
                    config.insert(key.into(), value);
                }
            }
            out.upstream_configs.push(ResolvedUpstreamConfig {
                upstream: up.name.clone(),
                config,
            });
        }
        out
    }

    /// `registration` with central config filled in wherever it leaves a value unset: the
    /// service-level settings of its destination service, and each upstream's layers.
    pub fn merge_into(&self, registration: &NodeService) -> NodeService {
        let mut svc = registration.clone();
        let proxy = &mut svc.proxy;
        let central = self.service_level(&proxy.destination_service_name);
        for (k, v) in central.proxy_config {
            proxy.config.entry(k).or_insert(v);
        }
        if proxy.mode == ProxyMode::Default {
            proxy.mode = central.mode;
        }
        if proxy.mesh_gateway.mode == MeshGatewayMode::Default && central.mesh_gateway.mode != MeshGatewayMode::Default
        {
            proxy.mesh_gateway = central.mesh_gateway;
        }
        if proxy.expose == Default::default() {
            proxy.expose = central.expose;
        }
        if proxy.transparent_proxy == Default::default() {
            proxy.transparent_proxy = central.transparent_proxy;
        }
        let service = proxy.destination_service_name.clone();
        for up in &mut proxy.upstreams {
            let protocol_set = up.config.contains_key(PROTOCOL_KEY);
            let timeout_set = up.config.contains_key(CONNECT_TIMEOUT_MS_KEY);
            let registered: Vec<&str> = [LIMITS_KEY, PASSIVE_HEALTH_CHECK_KEY]
                .into_iter()
                .filter(|k| up.config.contains_key(*k))
                .collect();
            for layer in self.upstream_layers(&service, &up.destination_name) {
                if !layer.protocol.is_empty() && !protocol_set {
                    up.config
                        .insert(PROTOCOL_KEY.into(), Value::String(layer.protocol.clone()));
                }
                if layer.connect_timeout_ms != 0 && !timeout_set {
                    up.config
                        .insert(CONNECT_TIMEOUT_MS_KEY.into(), Value::from(layer.connect_timeout_ms));
                }
                if layer.mesh_gateway.mode != MeshGatewayMode::Default
                    && up.mesh_gateway.mode == MeshGatewayMode::Default
                {
                    up.mesh_gateway = layer.mesh_gateway.clone();
                }
                for (key, value) in layer_extras(layer) {
                    if !registered.contains(&key) {
                        up.config.insert(key.into(), value);
                    }
                }
            }
        }
        svc
    }
}

/// The circuit breakers and outlier detection a layer sets, as opaque-config values.
fn layer_extras(layer: &UpstreamConfig) -> Vec<(&'static str, Value)> {
    let mut out = Vec::new();
    if let Some(l) = &layer.limits
        && let Ok(v) = serde_json::to_value(l)
    {
        out.push((LIMITS_KEY, v));
    }
    if let Some(p) = &layer.passive_health_check
        && let Ok(v) = serde_json::to_value(p)
    {
        out.push((PASSIVE_HEALTH_CHECK_KEY, v));
    }
    out
}

#[cfg(test)]
mod tests;
