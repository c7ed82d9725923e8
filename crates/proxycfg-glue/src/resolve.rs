//! What both data-source families derive the same way from the same inputs: the discovery
//! chain of an upstream, filtered health, and the checks of a request either family refuses.
//! `Server*` reads the inputs from the catalog's event publisher, `Cache*` from the agent
//! cache; the derivation lives here once (central config itself is merged in
//! `structs::central_config`).

use proxycfg::DataSourceError;
use proxycfg::data_sources::{DiscoveryChainRequest, HealthRequest, ResolvedServiceConfigRequest};
use std::sync::Arc;
use std::time::Duration;
use structs::central_config::{CentralConfig, proxy_defaults};
use structs::filter::Filter;
use structs::{CheckServiceNode, CompiledDiscoveryChain, ConfigEntry, HealthStatus, ResolvedServiceConfig};

/// The config entries a chain is compiled from.
pub(crate) struct ChainInputs<'a> {
    /// The global proxy-defaults entry.
    pub(crate) proxy_defaults: Option<&'a Arc<ConfigEntry>>,
    /// Every service-defaults entry.
    pub(crate) service_defaults: &'a [Arc<ConfigEntry>],
    /// The CA's trust domain.
    pub(crate) trust_domain: &'a str,
    /// Every service-resolver, service-router and service-splitter entry (a chain may lead
    /// through other services' entries).
    pub(crate) resolvers: &'a [Arc<ConfigEntry>],
    pub(crate) routers: &'a [Arc<ConfigEntry>],
    pub(crate) splitters: &'a [Arc<ConfigEntry>],
}

impl ChainInputs<'_> {
    /// The compiled chain, or why it cannot be compiled (entries are checked at write time,
    /// so this is rare: an upstream's own protocol override, for one). The proxy shows the
    /// error and keeps its last good chain for the upstream.
    pub(crate) fn compile(&self, req: &DiscoveryChainRequest) -> Result<CompiledDiscoveryChain, DataSourceError> {
        let entries = discovery_chain::Entries {
            proxy_defaults: proxy_defaults(self.proxy_defaults),
            service_defaults: self.service_defaults,
            resolvers: self.resolvers,
            routers: self.routers,
            splitters: self.splitters,
            intentions: &[],
        };
        let compile = discovery_chain::CompileRequest {
            service: &req.name,
            datacenter: &req.datacenter,
            trust_domain: self.trust_domain,
            override_protocol: req.override_protocol,
            override_connect_timeout: (req.override_connect_timeout_ms != 0)
                .then(|| Duration::from_millis(u64::from(req.override_connect_timeout_ms))),
        };
        discovery_chain::compile(&compile, &entries)
            .map_err(|e| DataSourceError::InvalidRequest(format!("discovery chain for {:?}: {e}", req.name)))
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

/// True when `req` needs its instances filtered (passing only, one kind, or a subset).
pub(crate) fn health_is_filtered(req: &HealthRequest) -> bool {
    req.passing_only || req.healthy_only || req.kind.is_some() || !req.filter.is_empty()
}

/// The subset filter of `req`, parsed (filters are checked when the resolver is written, so
/// an error here means a value that bypassed the API).
pub(crate) fn subset_filter(req: &HealthRequest) -> Result<Filter, DataSourceError> {
    req.filter.parse::<Filter>().map_err(|e| {
        DataSourceError::InvalidRequest(format!("subset filter {:?} of {:?}: {e}", req.filter, req.service))
    })
}

/// The instances of `all` that `req` asks for.
pub(crate) fn filter_health(all: &[CheckServiceNode], req: &HealthRequest, filter: &Filter) -> Vec<CheckServiceNode> {
    all.iter()
        .filter(|n| !req.passing_only || n.checks.iter().all(|c| c.status == HealthStatus::Passing))
        .filter(|n| !req.healthy_only || n.checks.iter().all(|c| c.status.admits(false)))
        .filter(|n| req.kind.is_none_or(|k| n.service.kind == k))
        .filter(|n| filter.matches(n))
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

#[cfg(test)]
mod tests {
    use super::*;
    use structs::{HealthCheck, NodeService};

    fn instance(id: &str, version: &str, status: HealthStatus) -> CheckServiceNode {
        CheckServiceNode {
            service: NodeService {
                id: id.into(),
                service: "api-sidecar-proxy".into(),
                meta: [("version".to_owned(), version.to_owned())].into_iter().collect(),
                ..Default::default()
            },
            checks: vec![HealthCheck {
                status,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn ids(nodes: &[CheckServiceNode]) -> Vec<&str> {
        nodes.iter().map(|n| n.service.id.as_str()).collect()
    }

    #[test]
    fn subsets_select_by_filter_and_only_passing_decides_about_warning() {
        let all = vec![
            instance("a", "v1", HealthStatus::Passing),
            instance("b", "v1", HealthStatus::Warning),
            instance("c", "v1", HealthStatus::Critical),
            instance("d", "v2", HealthStatus::Passing),
            instance("e", "v1", HealthStatus::Maintenance),
        ];
        let mut req = HealthRequest {
            datacenter: "dc1".into(),
            service: "api".into(),
            connect: true,
            passing_only: false,
            healthy_only: true,
            filter: "Service.Meta.version == v1".into(),
            kind: None,
            token: String::new(),
        };
        let filter = subset_filter(&req).unwrap();
        // Warning instances get traffic, critical and maintenance ones never (Consul's rule).
        assert_eq!(ids(&filter_health(&all, &req, &filter)), ["a", "b"]);
        // OnlyPassing: warning is out too.
        req.passing_only = true;
        assert_eq!(ids(&filter_health(&all, &req, &filter)), ["a"]);
        // A filter that does not parse is an error, not "everything".
        req.filter = "Service.Nope == 1".into();
        assert!(subset_filter(&req).is_err());
    }
}
