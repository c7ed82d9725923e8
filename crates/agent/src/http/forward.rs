//! Forwarding: every `/v1/...` request the agent does not answer itself goes to a server
//! unchanged (method, path, query, headers but hop-by-hop ones, body), and the answer comes
//! back unchanged; a request naming no token carries the agent's default token.

use super::answer::{MAX_BODY, request_token, text};
use crate::runtime::Agent;
use crate::servers::ApiError;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::response::Response;

/// Headers that belong to one connection, never forwarded.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

pub(super) async fn forward(State(agent): State<Agent>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| parts.uri.path().to_owned());
    if !parts.uri.path().starts_with("/v1/") {
        return text(StatusCode::NOT_FOUND, "404 page not found\n".into());
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => return text(StatusCode::PAYLOAD_TOO_LARGE, super::answer::too_large()),
    };
    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    let method = parts.method.clone();
    // A request naming no token runs with the agent's default token, as Consul's agents do;
    // one that names its own is forwarded with it, untouched.
    let query = http_kit::Params::parse(parts.uri.query());
    let token = if request_token(&parts.headers, &query).is_none() {
        agent.acl().default_token().cloned()
    } else {
        None
    };
    // A forwarded blocking query may wait minutes at the server: it ends when the agent stops.
    let send = agent.servers().send_as(token.as_ref(), |client, base| {
        client
            .request(method.clone(), format!("{base}{path_and_query}"))
            .headers(headers.clone())
            .body(body.clone())
    });
    let result = tokio::select! {
        r = send => r,
        () = agent.stopping() => return shutting_down(),
    };
    let resp = match result {
        Ok(r) => r,
        Err(e) => return forward_error(&e),
    };
    let status = resp.status();
    let mut out_headers = HeaderMap::new();
    for (name, value) in resp.headers() {
        if !hop_by_hop(name) {
            out_headers.append(name.clone(), value.clone());
        }
    }
    let bytes = tokio::select! {
        b = resp.bytes() => b,
        () = agent.stopping() => return shutting_down(),
    };
    match bytes {
        Ok(bytes) => {
            let mut out = Response::new(Body::from(bytes));
            *out.status_mut() = status;
            *out.headers_mut() = out_headers;
            out
        }
        Err(e) => forward_error(&ApiError::Unreachable {
            tried: 1,
            last: crate::servers::chain(&e),
        }),
    }
}

fn shutting_down() -> Response {
    text(StatusCode::SERVICE_UNAVAILABLE, "the agent is shutting down\n".into())
}

fn forward_error(e: &ApiError) -> Response {
    text(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("cannot forward to a server: {e}\n")
            .replace('\n', " ")
            .trim_end()
            .to_owned()
            + "\n",
    )
}
