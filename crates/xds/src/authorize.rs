//! Who may receive a proxy's configuration: the stream's token must hold `service:write` on
//! the service the proxy represents (its destination, for a sidecar), as Consul asks.
//!
//! The check runs on every snapshot before anything of it is sent, and again whenever the
//! authorizer says an answer may have changed (a token or policy was written) or the token
//! expires. A refusal ends the stream with `PERMISSION_DENIED`: no listener, cluster or SDS
//! secret is ever sent to a token that may not have it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;
use structs::Token;

/// The token may serve the proxy until `expires` (none: until the ACLs change).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Authorization {
    /// When the token stops working.
    pub expires: Option<SystemTime>,
}

/// Decides whether a stream's token may receive a proxy's configuration.
pub trait StreamAuthorizer: Send + Sync + 'static {
    /// Whether `token` (none: the stream named none) may receive the configuration of a proxy
    /// for `service`; the error is the refusal to send the proxy. (Asynchronous: an agent
    /// asks its servers on a miss.)
    fn authorize(
        &self,
        token: Option<&Token>,
        service: &str,
    ) -> Pin<Box<dyn Future<Output = Result<Authorization, String>> + Send>>;

    /// Completes once an answer of [`StreamAuthorizer::authorize`] may have changed since it
    /// was called (tokens, policies or roles were written).
    fn changed(&self) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// Says whether a CSDS request's token (none: the request named none) may read every
/// proxy's status; the error is the refusal.
pub type CsdsAuthorizer =
    Arc<dyn Fn(Option<Token>) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// The services a proxy's token must write: a sidecar's destination, else its own name;
/// and for a terminating gateway every service it represents too (it is issued their
/// certificates and acts as them), as Consul requires.
pub(crate) fn services_of(snap: &proxycfg::ConfigSnapshot) -> Vec<String> {
    let svc = &snap.service;
    let own = if svc.kind == structs::ServiceKind::ConnectProxy && !svc.proxy.destination_service_name.is_empty() {
        &svc.proxy.destination_service_name
    } else {
        &svc.service
    };
    let mut services = vec![own.clone()];
    if let Some(g) = snap.terminating_gateway() {
        services.extend(g.linked.keys().cloned());
    }
    services
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxycfg::{ConfigSnapshot, KindSnapshot, LinkedServiceSnapshot, ProxyId, TerminatingGatewaySnapshot};
    use std::sync::Arc;
    use structs::{GatewayService, NodeService, ServiceKind};

    #[test]
    fn a_terminating_gateway_token_must_write_every_service_it_represents() {
        let linked = ["billing", "ext"]
            .into_iter()
            .map(|s| {
                let link = GatewayService {
                    service: s.into(),
                    ..Default::default()
                };
                (s.to_owned(), Arc::new(LinkedServiceSnapshot::new(link)))
            })
            .collect();
        let snap = ConfigSnapshot {
            proxy_id: Arc::new(ProxyId::new("n1", "egress")),
            service: Arc::new(NodeService {
                kind: ServiceKind::TerminatingGateway,
                id: "egress".into(),
                service: "egress".into(),
                ..Default::default()
            }),
            datacenter: Arc::from("dc1"),
            version: 1,
            roots: None,
            proxy_defaults: None,
            intention_default_allow: true,
            kind: KindSnapshot::TerminatingGateway(TerminatingGatewaySnapshot {
                linked: Arc::new(linked),
                ..Default::default()
            }),
        };
        assert_eq!(services_of(&snap), ["egress", "billing", "ext"]);
    }
}
