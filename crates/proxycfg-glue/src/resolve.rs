//! What both data-source families derive the same way from the same inputs: the discovery
//! chain of an upstream, filtered health, and the checks of a request either family refuses.
//! `Server*` reads the inputs from the catalog's event publisher, `Cache*` from the agent
//! cache; the derivation lives here once (central config itself is merged in
//! `structs::central_config`).

use proxycfg::DataSourceError;
use proxycfg::data_sources::{DiscoveryChainRequest, HealthRequest, ResolvedServiceConfigRequest};
use std::sync::Arc;
use structs::central_config::{CentralConfig, proxy_defaults};
use structs::config_entry::ServiceResolver;
use structs::discovery_chain::DEFAULT_CONNECT_TIMEOUT_MS;
use structs::{CheckServiceNode, CompiledDiscoveryChain, ConfigEntry, HealthStatus, ResolvedServiceConfig};

/// The config entries a chain is compiled from.
pub(crate) struct ChainInputs<'a> {
    /// The global proxy-defaults entry.
    pub(crate) proxy_defaults: Option<&'a Arc<ConfigEntry>>,
    /// Every service-defaults entry.
    pub(crate) service_defaults: &'a [Arc<ConfigEntry>],
    /// The CA's trust domain.
    pub(crate) trust_domain: &'a str,
    /// The upstream's service-resolver, service-router and service-splitter entries.
    pub(crate) resolver: Option<&'a Arc<ConfigEntry>>,
    pub(crate) router: Option<&'a Arc<ConfigEntry>>,
    pub(crate) splitter: Option<&'a Arc<ConfigEntry>>,
}

impl ChainInputs<'_> {
    fn resolver(&self) -> Option<&ServiceResolver> {
        match self.resolver.map(|e| &**e) {
            Some(ConfigEntry::ServiceResolver(r)) => Some(r),
            _ => None,
        }
    }

    /// Why the chain cannot be compiled yet: routers, splitters, and resolver subsets,
    /// redirects and failover are not. The proxy shows this error rather than silently
    /// losing the upstream.
    pub(crate) fn unsupported(&self, req: &DiscoveryChainRequest) -> Option<DataSourceError> {
        let what = self
            .resolver()
            .and_then(unsupported_resolver)
            .or(self.router.map(|_| "service-router entries"))
            .or(self.splitter.map(|_| "service-splitter entries"))?;
        Some(DataSourceError::InvalidRequest(format!(
            "discovery chain for {:?}: {what} are not compiled yet",
            req.name
        )))
    }

    /// The compiled chain (call once [`Self::unsupported`] found nothing).
    pub(crate) fn compile(&self, req: &DiscoveryChainRequest) -> CompiledDiscoveryChain {
        let protocol = req.override_protocol.unwrap_or_else(|| {
            CentralConfig::new(proxy_defaults(self.proxy_defaults), self.service_defaults).protocol_of(&req.name)
        });
        default_chain(
            &req.name,
            &req.datacenter,
            self.trust_domain,
            protocol,
            req.override_connect_timeout_ms,
            self.resolver(),
        )
    }
}

/// Central config resolved for a service and its upstreams.
pub(crate) fn resolved_config(
    req: &ResolvedServiceConfigRequest,
    proxy: Option<&Arc<ConfigEntry>>,
    services: &[Arc<ConfigEntry>],
) -> ResolvedServiceConfig {
    CentralConfig::new(proxy_defaults(proxy), services).resolve(&req.name, &req.upstreams)
}

/// A health request neither family can answer (subset filters are not evaluated yet).
pub(crate) fn unsupported_health(req: &HealthRequest) -> Option<DataSourceError> {
    (!req.filter.is_empty()).then(|| {
        DataSourceError::InvalidRequest(format!(
            "subset filter {:?}: filter expressions are not supported yet",
            req.filter
        ))
    })
}

/// True when `req` needs its instances filtered (passing only, or one kind).
pub(crate) fn health_is_filtered(req: &HealthRequest) -> bool {
    req.passing_only || req.kind.is_some()
}

/// The instances of `all` that `req` asks for.
pub(crate) fn filter_health(all: &[CheckServiceNode], req: &HealthRequest) -> Vec<CheckServiceNode> {
    all.iter()
        .filter(|n| !req.passing_only || n.checks.iter().all(|c| c.status == HealthStatus::Passing))
        .filter(|n| req.kind.is_none_or(|k| n.service.kind == k))
        .cloned()
        .collect()
}

/// A datacenter request either family serves only for its own datacenter (`""`: its own).
pub(crate) fn check_dc(asked: &str, served: &str) -> Result<(), DataSourceError> {
    if asked.is_empty() || asked == served {
        Ok(())
    } else {
        Err(DataSourceError::InvalidRequest(format!(
            "datacenter {asked:?} is not served here (only {served:?})"
        )))
    }
}

/// The chain of a service whose routing no router, splitter or resolver shapes beyond a
/// connect timeout: one resolver node, one target.
fn default_chain(
    name: &str,
    datacenter: &str,
    trust_domain: &str,
    protocol: structs::Protocol,
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
fn unsupported_resolver(resolver: &ServiceResolver) -> Option<&'static str> {
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
    #[test]
    fn default_chain_takes_the_resolver_timeout_unless_overridden() {
        let resolver = ServiceResolver {
            name: "api".into(),
            connect_timeout: structs::GoDuration(std::time::Duration::from_millis(1500)),
            ..Default::default()
        };
        let chain = default_chain("api", "dc1", "td.consul", structs::Protocol::Http, 0, Some(&resolver));
        assert_eq!(chain.targets.values().next().unwrap().connect_timeout_ms, 1500);
        assert_eq!(chain.protocol, structs::Protocol::Http);
        let chain = default_chain("api", "dc1", "td.consul", structs::Protocol::Tcp, 300, Some(&resolver));
        assert_eq!(chain.targets.values().next().unwrap().connect_timeout_ms, 300);
        assert_eq!(
            chain.targets.values().next().unwrap().sni,
            "api.default.dc1.internal.td.consul"
        );
    }
}
