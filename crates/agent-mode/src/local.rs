//! The agent's local state as the node reads it: its proxies and their HTTP checks (for the
//! local source and the `Cache*` data sources), its managed proxies' local tokens (for the
//! xDS stream authorizer).

use ::agent::Agent;
use proxycfg_glue::LocalChecks;
use proxycfg_sources::{LocalProxy, LocalServices};
use tokio::sync::watch;

/// The agent's local state as the proxy config engine reads it.
pub(crate) struct AgentLocal(pub(crate) Agent);

impl LocalServices for AgentLocal {
    fn node(&self) -> String {
        self.0.config().node.clone()
    }

    fn proxies(&self) -> Vec<LocalProxy> {
        self.0
            .state()
            .services_where(|s| s.service.kind.is_proxy())
            .into_iter()
            .map(|s| LocalProxy {
                service: s.service,
                token: s.token,
            })
            .collect()
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        // Proxies are services: a check's report does not change them.
        self.0.state().subscribe_services()
    }
}

impl LocalChecks for AgentLocal {
    fn http_checks(&self, service_id: &str) -> Vec<structs::HealthCheck> {
        self.0
            .state()
            .service_checks(service_id)
            .into_iter()
            .filter(|c| c.check_type == "http")
            .collect()
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.state().subscribe()
    }
}

/// A managed proxy's local token: accepted by this agent's xDS only, and only for the
/// service its proxy serves.
pub(crate) struct ManagedTokens(pub(crate) Agent);

impl node::authz::LocalTokens for ManagedTokens {
    fn check(&self, token: &structs::Token, service: &str) -> Option<Result<xds::Authorization, String>> {
        let proxy = self
            .0
            .state()
            .services_where(|s| {
                s.managed
                    .as_ref()
                    .is_some_and(|m| m.local_token.as_ref() == Some(token))
            })
            .pop()?;
        let serves = &proxy.service.proxy.destination_service_name;
        Some(if serves == service {
            Ok(xds::Authorization { expires: None })
        } else {
            Err(format!(
                "{}: the local token of proxy {:?} is for {serves:?}, not {service:?}",
                ::acl::PERMISSION_DENIED,
                proxy.service.id
            ))
        })
    }
}
