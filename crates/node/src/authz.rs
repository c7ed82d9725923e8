//! Authorization written once over [`acl::TokenResolver`]: the HTTP extractor a handler
//! asks for the caller with ([`Caller`]), the guard on CSDS, and the xDS stream authorizer
//! ([`StreamTokens`]), for every mode.

use acl::{ResolveError, Resolved, Token, TokenResolver};
use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use xds::XdsServer;

/// A mode's token resolver, shared.
pub type Tokens = Arc<dyn TokenResolver>;

/// Makes `tokens` resolve the [`Caller`] of every request `router` serves: added around the
/// whole router, not to each of its routes (`Router::layer`), so a request pays for it once.
pub fn with_tokens(router: axum::Router, tokens: Tokens) -> impl crate::http_serve::App {
    tower::Layer::layer(&axum::Extension(tokens), router)
}

/// The request's token (`X-Consul-Token`, bearer or `?token=`), resolved. A token that does
/// not resolve is refused before the handler runs: 403 `ACL not found`, or 503 when it
/// cannot be looked up now.
#[derive(Debug, Clone)]
pub struct Caller(pub Resolved);

impl Caller {
    /// A 403 in Consul's words unless `allowed`.
    pub fn need(&self, allowed: bool, permission: &str, target: &str) -> Result<(), Denied> {
        self.0.need(allowed, permission, target).map_err(Denied)
    }
}

/// A refusal: a 403 with Consul's `Permission denied: ...` text.
#[derive(Debug, Clone)]
pub struct Denied(pub String);

impl IntoResponse for Denied {
    fn into_response(self) -> Response {
        (StatusCode::FORBIDDEN, format!("{}\n", self.0)).into_response()
    }
}

/// The answer to a token that did not resolve.
pub fn refusal(e: &ResolveError) -> Response {
    let status = match e {
        ResolveError::NotFound => StatusCode::FORBIDDEN,
        ResolveError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    (status, format!("{e}\n")).into_response()
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Response> {
        let Some(tokens) = parts.extensions.get::<Tokens>().cloned() else {
            return Err((StatusCode::INTERNAL_SERVER_ERROR, "this route has no token resolver\n").into_response());
        };
        let params = http_kit::Params::parse(parts.uri.query());
        let token = http_kit::token(&parts.headers, &params);
        tokens
            .resolve(token.as_ref())
            .await
            .map(Caller)
            .map_err(|e| refusal(&e))
    }
}

/// Makes CSDS on `xds` need `operator:read` of the request's token (as the HTTP status
/// views do): CSDS lists every proxy's configuration.
pub fn guard_csds(xds: &XdsServer, tokens: Tokens) {
    xds.set_csds_authorizer(Arc::new(move |token: Option<Token>| {
        let tokens = Arc::clone(&tokens);
        Box::pin(async move {
            let who = tokens.resolve(token.as_ref()).await.map_err(|e| e.to_string())?;
            if who.authz.operator_read() {
                Ok(())
            } else {
                Err(format!("{}: CSDS needs 'operator:read'", acl::PERMISSION_DENIED))
            }
        })
    }));
}

/// Tokens only this node issued and accepts for one proxy's streams (an agent's managed
/// proxies), checked before the resolver.
pub trait LocalTokens: Send + Sync + 'static {
    /// `None` when `token` is not a local token; else whether it may serve `service`.
    fn check(&self, token: &Token, service: &str) -> Option<Result<xds::Authorization, String>>;
}

/// Authorizes xDS streams: `service:write` on the proxy's service, re-checked on every ACL
/// change the resolver reports.
pub struct StreamTokens {
    tokens: Tokens,
    local: Option<Arc<dyn LocalTokens>>,
}

impl StreamTokens {
    /// An authorizer over `tokens`, with `local` tokens checked first.
    pub fn new(tokens: Tokens, local: Option<Arc<dyn LocalTokens>>) -> Self {
        Self { tokens, local }
    }
}

impl xds::StreamAuthorizer for StreamTokens {
    fn authorize(
        &self,
        token: Option<&Token>,
        service: &str,
    ) -> Pin<Box<dyn Future<Output = Result<xds::Authorization, String>> + Send>> {
        let local = self.local.as_ref().zip(token);
        if let Some(verdict) = local.and_then(|(l, token)| l.check(token, service)) {
            return Box::pin(std::future::ready(verdict));
        }
        let tokens = Arc::clone(&self.tokens);
        let (token, service) = (token.cloned(), service.to_owned());
        Box::pin(async move {
            let who = tokens.resolve(token.as_ref()).await.map_err(|e| e.to_string())?;
            who.need(who.authz.service_write(&service), "service:write", &service)?;
            Ok(xds::Authorization { expires: who.expires })
        })
    }

    fn changed(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        self.tokens.changed()
    }
}
