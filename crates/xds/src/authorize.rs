//! Who may receive a proxy's configuration: the stream's token must hold `service:write` on
//! the service the proxy represents (its destination, for a sidecar), as Consul asks.
//!
//! The check runs on every snapshot before anything of it is sent, and again whenever the
//! authorizer says an answer may have changed (a token or policy was written) or the token
//! expires. A refusal ends the stream with `PERMISSION_DENIED`: no listener, cluster or SDS
//! secret is ever sent to a token that may not have it.

use std::future::Future;
use std::pin::Pin;
use std::time::SystemTime;

/// The token may serve the proxy until `expires` (none: until the ACLs change).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Authorization {
    /// When the token stops working.
    pub expires: Option<SystemTime>,
}

/// Decides whether a stream's token may receive a proxy's configuration.
pub trait StreamAuthorizer: Send + Sync + 'static {
    /// Whether `token` may receive the configuration of a proxy for `service`; the error is
    /// the refusal to send the proxy. (Asynchronous: an agent asks its servers on a miss.)
    fn authorize(
        &self,
        token: &str,
        service: &str,
    ) -> Pin<Box<dyn Future<Output = Result<Authorization, String>> + Send>>;

    /// Completes once an answer of [`StreamAuthorizer::authorize`] may have changed since it
    /// was called (tokens, policies or roles were written).
    fn changed(&self) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// The service a proxy's token must write: a sidecar's destination, else its own name.
pub(crate) fn service_of(snap: &proxycfg::ConfigSnapshot) -> &str {
    let svc = &snap.service;
    if svc.kind == structs::ServiceKind::ConnectProxy && !svc.proxy.destination_service_name.is_empty() {
        &svc.proxy.destination_service_name
    } else {
        &svc.service
    }
}
