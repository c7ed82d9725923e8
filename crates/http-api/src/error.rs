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

impl From<WriteError> for ApiError {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Invalid(_) | WriteError::Ca(_) => ApiError::BadRequest(e.to_string()),
            WriteError::NotFound(m) => ApiError::NotFound(m),
            WriteError::UnknownDatacenter(dc) => ApiError::UnknownDatacenter(dc),
            WriteError::Storage(_) => ApiError::Internal(e.to_string()),
            WriteError::Closed => ApiError::Unavailable,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::UnknownDatacenter(_) | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        };
        let mut resp = (status, format!("{self}\n")).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        resp
    }
}
