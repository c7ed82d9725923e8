//! Resolving a token: the [`Token`] newtype (defined in `structs`, re-exported here), what a
//! resolved token is ([`Resolved`]), why one could not be ([`ResolveError`]), and the
//! [`TokenResolver`] every mode implements (the server over its catalog, the agent through
//! its servers), so the xDS stream authorizer, the CSDS guard and the HTTP views are written
//! once over it.

use crate::Authorizer;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

pub use structs::Token;

/// A resolved token: who (its accessor; empty with ACLs off or for a token local to an
/// agent) and what it may do.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The token's accessor id (the anonymous token's when none was given).
    pub accessor: Arc<str>,
    /// Its permissions.
    pub authz: Arc<Authorizer>,
    /// When it stops working.
    pub expires: Option<SystemTime>,
}

impl Resolved {
    /// Consul's refusal unless `allowed`: `Permission denied: token with AccessorID '...'
    /// lacks permission '<permission>' on "<target>"`.
    pub fn need(&self, allowed: bool, permission: &str, target: &str) -> Result<(), String> {
        if allowed {
            Ok(())
        } else {
            Err(crate::denied(&self.accessor, permission, target))
        }
    }
}

/// Why a token could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// No such token (or it expired): Consul's "ACL not found", a 403.
    #[error("ACL not found")]
    NotFound,
    /// The token could not be looked up now (no server answered, and it is not cached): a
    /// 503, the request may be retried.
    #[error("cannot resolve the token: {0}")]
    Unavailable(String),
}

/// A boxed future, `Send`, as trait objects return them.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Resolves a request's token to what it may do. One implementation per mode: the server's
/// reads its catalog, the agent's asks its servers (and caches).
pub trait TokenResolver: Send + Sync + 'static {
    /// Whether ACLs are enforced (off: every token, and none, may do everything).
    fn enabled(&self) -> bool;

    /// What `token` may do; none is the anonymous token (on an agent: its default token).
    fn resolve(&self, token: Option<&Token>) -> BoxFuture<'_, Result<Resolved, ResolveError>>;

    /// Completes once the ACL state changed (a token, policy or role was written): what was
    /// resolved before may be wrong now. Never completes when nothing can change any more.
    fn changed(&self) -> BoxFuture<'static, ()>;
}
