//! API errors: plain-text bodies with the status Consul uses.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use catalog::WriteError;

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// Bad input; the message names the field and the problem.
    #[error("{0}")]
    BadRequest(String),
    /// Nothing there.
    #[error("{0}")]
    NotFound(String),
    /// The request's content is over a limit; names it (a 413).
    #[error("{0}")]
    TooLarge(String),
    /// It exists already (a create of something that exists); names it.
    #[error("{0}")]
    Conflict(String),
    /// The token may not do this (`Permission denied: ...`), or is unknown (`ACL not found`).
    #[error("{0}")]
    Forbidden(String),
    /// ACLs are off: the ACL endpoints are not available.
    #[error("ACL support disabled")]
    AclDisabled,
    /// `?dc=` names another datacenter.
    #[error("No path to datacenter {0:?}")]
    UnknownDatacenter(String),
    /// The server failed.
    #[error("{0}")]
    Internal(String),
    /// The server is shutting down.
    #[error("server is shutting down")]
    Unavailable,
}

impl From<http_kit::BadParam> for ApiError {
    fn from(e: http_kit::BadParam) -> Self {
        ApiError::BadRequest(e.0)
    }
}

impl From<WriteError> for ApiError {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Invalid(_) | WriteError::Ca(_) => ApiError::BadRequest(chain(&e)),
            WriteError::Txn(_) => ApiError::Conflict(e.to_string()),
            WriteError::Kv(e @ structs::kv::KvError::TooLarge) => ApiError::TooLarge(e.to_string()),
            WriteError::Kv(e) => ApiError::BadRequest(e.to_string()),
            WriteError::NotFound(m) => ApiError::NotFound(m),
            WriteError::Forbidden(m) => ApiError::Forbidden(m),
            WriteError::UnknownDatacenter(dc) => ApiError::UnknownDatacenter(dc),
            WriteError::Storage(_) => ApiError::Internal(chain(&e)),
            WriteError::Closed => ApiError::Unavailable,
        }
    }
}

impl From<structs::kv::KvError> for ApiError {
    fn from(e: structs::kv::KvError) -> Self {
        WriteError::Kv(e).into()
    }
}

/// Marks a 413 whose text already names its limit (the API's own, not the body
/// extractor's), so the front layer leaves it as it is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LimitNamed;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::AclDisabled => StatusCode::UNAUTHORIZED,
            ApiError::UnknownDatacenter(_) | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        };
        let mut resp = (status, format!("{self}\n")).into_response();
        if let ApiError::TooLarge(_) = self {
            resp.extensions_mut().insert(LimitNamed);
        }
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        resp
    }
}

/// An error and its causes on one line (`storage failure: writing ...: No space left`), for
/// the plain-text body of a 500: the client learns the cause, not just that it failed.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        // Some errors print their cause in their own message already.
        let text = c.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use catalog::{StorageFailure, StoreError};
    use std::sync::Arc;

    #[test]
    fn a_storage_failure_answers_500_naming_its_cause_once() {
        let failure = StoreError::Io {
            what: "appending to the log".into(),
            error: std::io::Error::other("No space left on device"),
        };
        let e = ApiError::from(WriteError::Storage(StorageFailure(Arc::new(failure))));
        assert_eq!(
            e,
            ApiError::Internal("storage failure: appending to the log: No space left on device".into())
        );
    }
}
