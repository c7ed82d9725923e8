//! ACL enforcement: every request's token is resolved once, by a middleware, and handlers
//! check the permission Consul checks with [`Authz`].
//!
//! A refusal is a 403 saying `Permission denied` and naming the permission; an unknown (or
//! expired) token is a 403 `ACL not found` as soon as a handler asks anything of it. Routes
//! that need no permission (status, CA roots) never ask, so they answer any token.
//! Listings filter out what the token may not read and say so with
//! `X-Consul-Results-Filtered-By-ACLs: true`.

use crate::query::{self, Params};
use crate::{Api, ApiError};
use acl::Authorizer;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::HeaderValue;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::Response;
use catalog::acl::{ResolveError, Resolved};

/// The header that says a listing was filtered by ACLs.
pub const FILTERED_HEADER: &str = "x-consul-results-filtered-by-acls";

/// The request's resolved token.
#[derive(Clone, Debug)]
pub(crate) struct Authz(Result<Resolved, ResolveError>);

/// How long a server over etcd may wait to catch up before it calls a token unknown.
const CATCH_UP_FOR_UNKNOWN_TOKEN: std::time::Duration = std::time::Duration::from_secs(2);

/// Resolves the request's token (header, bearer or `?token=`) and hands it to the handler.
pub(crate) async fn resolve(State(api): State<Api>, mut req: Request, next: Next) -> Response {
    let params = Params::parse(req.uri().query());
    let secret = query::token(req.headers(), &params);
    let state = api.store.read();
    let mut resolved = api.config.acl.resolve(&state, secret.as_ref().map(acl::Token::secret));
    drop(state);
    // A token unknown here may have been written through another server whose write this
    // one has not applied yet: catch up with etcd before refusing it (the embedded store
    // has nothing to catch up with).
    if resolved.is_err()
        && secret.is_some()
        && api.store.cluster().is_some()
        && api.store.catch_up(CATCH_UP_FOR_UNKNOWN_TOKEN).await
    {
        resolved = api
            .config
            .acl
            .resolve(&api.store.read(), secret.as_ref().map(acl::Token::secret));
    }
    req.extensions_mut().insert(Authz(resolved));
    next.run(req).await
}

impl<S: Send + Sync> FromRequestParts<S> for Authz {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Authz>()
            .cloned()
            .ok_or_else(|| ApiError::Internal("the request's token was not resolved".into()))
    }
}

impl Authz {
    /// What the token may do; an unknown token is refused.
    pub(crate) fn get(&self) -> Result<&Authorizer, ApiError> {
        match &self.0 {
            Ok(r) => Ok(&r.authz),
            Err(e) => Err(refused(e)),
        }
    }

    /// The token's accessor id (empty with ACLs off).
    pub(crate) fn accessor(&self) -> Result<&str, ApiError> {
        match &self.0 {
            Ok(r) => Ok(&r.accessor),
            Err(e) => Err(refused(e)),
        }
    }

    /// Refuses unless `allowed` says the token holds `permission` (`service:write`) on
    /// `target` (empty for cluster-wide permissions).
    pub(crate) fn need(
        &self,
        allowed: impl FnOnce(&Authorizer) -> bool,
        permission: &str,
        target: &str,
    ) -> Result<(), ApiError> {
        let authz = self.get()?;
        if allowed(authz) {
            return Ok(());
        }
        let who = self.accessor().unwrap_or_default();
        Err(ApiError::Forbidden(acl::denied(who, permission, target)))
    }
}

/// The answer to a token that did not resolve.
fn refused(e: &ResolveError) -> ApiError {
    match e {
        ResolveError::NotFound => ApiError::Forbidden(acl::ACL_NOT_FOUND.into()),
        ResolveError::Unavailable(m) => ApiError::Internal(m.clone()),
    }
}

/// Marks a listing as filtered when something was left out.
pub(crate) fn mark_filtered(mut resp: Response, filtered: bool) -> Response {
    if filtered {
        resp.headers_mut()
            .insert(FILTERED_HEADER, HeaderValue::from_static("true"));
    }
    resp
}

/// Keeps what `keep` admits; says whether anything went.
pub(crate) fn retain<T>(items: &mut Vec<T>, keep: impl Fn(&T) -> bool) -> bool {
    let before = items.len();
    items.retain(keep);
    items.len() != before
}
