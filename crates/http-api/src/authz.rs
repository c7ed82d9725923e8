//! ACL enforcement: every request's token is resolved once, by a middleware, and handlers
//! check the permission Consul checks with [`Authz`].
//!
//! A refusal is a 403 saying `Permission denied` and naming the permission; an unknown (or
//! expired) token is a 403 `ACL not found` as soon as a handler asks anything of it. Routes
//! that need no permission (status, CA roots) never ask, so they answer any token.
//! Listings filter out what the token may not read and say so with
//! `X-Consul-Results-Filtered-By-ACLs: true`.

use crate::ApiError;
use acl::Authorizer;
use axum::extract::FromRequestParts;
use axum::http::HeaderValue;
use axum::http::request::Parts;
use axum::response::Response;
use catalog::acl::{ResolveError, Resolved};

/// The header that says a listing was filtered by ACLs.
pub use structs::wire::FILTERED_HEADER;

/// The request's resolved token, and the ACL index of the state it was resolved in.
#[derive(Clone, Debug)]
pub(crate) struct Authz(Result<Resolved, ResolveError>, structs::Index);

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
    /// A request's token as resolved in a state whose ACL index was `acl_index`.
    pub(crate) fn new(resolved: Result<Resolved, ResolveError>, acl_index: structs::Index) -> Self {
        Self(resolved, acl_index)
    }

    /// The ACL index of the state the token was resolved in: what the rights [`Authz::get`]
    /// gives were as of (an answer shared between requests is keyed by it).
    pub(crate) fn acl_index(&self) -> structs::Index {
        self.1
    }

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
