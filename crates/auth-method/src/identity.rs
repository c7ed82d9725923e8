//! What a verification yields: who the token belongs to, or why it was refused.

use structs::filter::{JwtIdentity, ServiceAccountIdentity};

/// Who a verified bearer token belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A `jwt` method's mapped claims.
    Jwt(JwtIdentity),
    /// A `kubernetes` method's service account.
    ServiceAccount(ServiceAccountIdentity),
}

/// Why a login failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoginError {
    /// The bearer token is not valid for the method (or no binding rule applies to it).
    #[error("{0}")]
    Denied(String),
    /// The method could not check the token: a key set or the Kubernetes API could not be
    /// reached or answered nonsense.
    #[error("{0}")]
    Unavailable(String),
}
