//! Lookups of the proxy on the HTTP API at `-http-addr`, with the proxy's token.

use crate::cli::EnvoyArgs;
use anyhow::{Context, Result};
use api_client::{ApiError, Servers};

/// An answer of the HTTP API to a lookup of the proxy.
pub(super) struct Answer {
    /// The decoded body; `None` when the path does not exist there (404, 405).
    pub(super) body: Option<serde_json::Value>,
    /// ACLs left out what the token may not read (`X-Consul-Results-Filtered-By-ACLs`).
    pub(super) filtered: bool,
}

/// The HTTP API refused the token (403), with what it said (`Permission denied`, or `ACL not
/// found` for a token it does not know).
#[derive(Debug, thiserror::Error)]
#[error("GET {path} answered 403: {message}")]
pub(super) struct Forbidden {
    pub(super) path: String,
    pub(super) message: String,
}

/// `GET path` on `-http-addr` (`api`) with the token. A 403 is a [`Forbidden`] error; a route
/// that is not there (404, 405: `-http-addr` is a server, not an agent) is no answer.
pub(super) async fn lookup(api: &Servers, args: &EnvoyArgs, path: &str) -> Result<Answer> {
    match api.get_as(args.token.as_ref(), path).await {
        Ok(answer) => {
            let body = serde_json::from_slice(&answer.body).with_context(|| format!("decoding GET {path}"))?;
            Ok(Answer {
                body: Some(body),
                filtered: answer.filtered,
            })
        }
        Err(e) if matches!(e.status(), Some(404 | 405)) => Ok(Answer {
            body: None,
            filtered: false,
        }),
        Err(ApiError::PermissionDenied(message)) => Err(Forbidden {
            path: path.to_owned(),
            message,
        }
        .into()),
        Err(e) if e.status().is_none() && e.is_unreachable() => Err(anyhow::anyhow!(
            "cannot reach the meshd HTTP API at {}: {e}",
            args.http_addr
        )),
        Err(e) => Err(anyhow::anyhow!("GET {path}: {e}")),
    }
}
