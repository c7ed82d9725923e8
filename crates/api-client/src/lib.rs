//! A typed client of the HTTP API meshd servers and agents speak (Consul's):
//!
//! - [`Servers`]: one keep-alive client over a list of servers, with fail-over;
//! - [`paths`]: every path a meshd component calls, built from typed arguments (names are
//!   percent-encoded; no caller writes a `/v1/...` literal);
//! - [`ApiError`]: what went wrong, typed: a 403 is [`ApiError::PermissionDenied`] all the
//!   way to whoever shows it (a proxy's status, a command's one-line error), a 404
//!   [`ApiError::NotFound`], a 5xx or no answer is unavailable ([`ApiError::is_unreachable`]).
//!
//! Bodies are the `structs` types; headers are the `structs::wire` constants.

pub mod paths;
mod servers;

pub use servers::{Answer, Blocked, Servers, ServersCaError, base_url, chain};

/// Why a request to the servers failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// No server address is configured.
    #[error("no server configured: give -retry-join")]
    NoServers,
    /// No server could be reached; the last failure is kept.
    #[error("no server answered (tried {tried}): {last}")]
    Unreachable {
        /// How many servers were tried.
        tried: usize,
        /// The last failure.
        last: String,
    },
    /// The server refused the request's token (403): it lacks a permission, or the server
    /// does not know it. The body is the server's reason (it names the permission and the
    /// resource, in Consul's words: `Permission denied: ...` or `ACL not found`).
    #[error("{0}")]
    PermissionDenied(String),
    /// The server has no such thing (404).
    #[error("not found: {0}")]
    NotFound(String),
    /// The server refused the request as malformed (400).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// Any other error status (5xx among them: see [`ApiError::is_unreachable`]).
    #[error("server answered {status}: {body}")]
    Status {
        /// HTTP status.
        status: u16,
        /// Its (trimmed) body.
        body: String,
    },
    /// A server's answer could not be decoded, or a request body encoded.
    #[error("cannot decode the server's answer: {0}")]
    Decode(String),
}

impl ApiError {
    /// The error a non-success status and its (trimmed) body stand for.
    pub fn from_status(status: u16, body: String) -> Self {
        match status {
            400 => Self::BadRequest(body),
            403 => Self::PermissionDenied(body),
            404 => Self::NotFound(body),
            _ => Self::Status { status, body },
        }
    }

    /// The HTTP status the server answered, if it answered one.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::BadRequest(_) => Some(400),
            Self::PermissionDenied(_) => Some(403),
            Self::NotFound(_) => Some(404),
            Self::Status { status, .. } => Some(*status),
            Self::NoServers | Self::Unreachable { .. } | Self::Decode(_) => None,
        }
    }

    /// True when the servers are away or failing (as opposed to refusing one request).
    pub fn is_unreachable(&self) -> bool {
        match self {
            Self::Unreachable { .. } | Self::NoServers => true,
            Self::Status { status, .. } => *status >= 500,
            Self::PermissionDenied(_) | Self::NotFound(_) | Self::BadRequest(_) | Self::Decode(_) => false,
        }
    }

    /// True for a 403.
    pub fn is_permission_denied(&self) -> bool {
        matches!(self, Self::PermissionDenied(_))
    }
}
