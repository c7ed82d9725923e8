//! The default discovery chain of an upstream, as the server compiles it (central config
//! itself is merged in `structs::central_config`).

use structs::CompiledDiscoveryChain;
use structs::config_entry::ServiceResolver;
use structs::discovery_chain::DEFAULT_CONNECT_TIMEOUT_MS;

/// The chain of a service whose routing no router, splitter or resolver shapes beyond a
/// connect timeout: one resolver node, one target.
pub(crate) fn default_chain(
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
