//! Forwarding: every `/v1/...` request the agent does not answer itself goes to a server as
//! `http_kit::relay` relays one (method, path, query, end-to-end headers, body), and the
//! answer comes back the same way; a request naming no token carries the agent's default
//! token.

use super::answer::{MAX_BODY, request_token, text};
use crate::runtime::Agent;
use crate::servers::ApiError;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use http_kit::relay::{self, Outgoing};

pub(super) async fn forward(State(agent): State<Agent>, req: Request) -> Response {
    if !req.uri().path().starts_with("/v1/") {
        return text(StatusCode::NOT_FOUND, http_kit::unknown_path(req.uri().path()));
    }
    let out = match Outgoing::read(req, MAX_BODY).await {
        Ok(out) => out,
        Err(too_large) => return too_large,
    };
    send(&agent, out).await
}

/// `PUT /v1/snapshot` through an agent: relayed as any request, but an archive may be far
/// larger than a write's body.
pub(super) async fn snapshot_restore(State(agent): State<Agent>, req: Request) -> Response {
    let out = match Outgoing::read(req, snapshot_archive::MAX_ARCHIVE).await {
        Ok(out) => out,
        Err(too_large) => return too_large,
    };
    send(&agent, out).await
}

/// `PUT /v1/session/create` through an agent: a session that names no node is this agent's
/// node's (as Consul's agents fill it in), then the request goes to a server.
pub(super) async fn session_create(State(agent): State<Agent>, req: Request) -> Response {
    let mut out = match Outgoing::read(req, MAX_BODY).await {
        Ok(out) => out,
        Err(too_large) => return too_large,
    };
    let mut body: serde_json::Map<String, serde_json::Value> = if out.body.iter().all(u8::is_ascii_whitespace) {
        serde_json::Map::new()
    } else {
        match serde_json::from_slice(&out.body) {
            Ok(body) => body,
            Err(e) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("request decode failed: expected a session object: {e}\n"),
                );
            }
        }
    };
    // Consul reads its JSON in any key casing.
    let named = body
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("node") && v.as_str().is_some_and(|n| !n.is_empty()));
    if !named {
        body.retain(|k, _| !k.eq_ignore_ascii_case("node"));
        body.insert("Node".into(), agent.config().node.clone().into());
        out.body = serde_json::to_vec(&body).unwrap_or_default().into();
        out.parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    }
    send(&agent, out).await
}

/// `GET /v1/event/list` through an agent: the events the servers keep that are for this
/// agent (its node, and its services and their tags, against each event's filters), as a
/// Consul agent lists the events gossip brought it.
pub(super) async fn event_list(State(agent): State<Agent>, req: Request) -> Response {
    let out = match Outgoing::read(req, MAX_BODY).await {
        Ok(out) => out,
        Err(too_large) => return too_large,
    };
    let resp = send(&agent, out).await;
    if resp.status() != StatusCode::OK {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
        return text(StatusCode::BAD_GATEWAY, "the server's event list was cut off\n".into());
    };
    let Ok(events) = serde_json::from_slice::<Vec<structs::event::UserEvent>>(&body) else {
        return text(
            StatusCode::BAD_GATEWAY,
            "the server's event list is not a list of events\n".into(),
        );
    };
    let services = agent.state().services();
    let local: Vec<(&str, &[String])> = services
        .values()
        .map(|s| (s.service.service.as_str(), s.service.tags.as_slice()))
        .collect();
    let node = &agent.config().node;
    let mine: Vec<&structs::event::UserEvent> = events
        .iter()
        .filter(|e| e.is_for(node, local.iter().copied()))
        .collect();
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    let body = serde_json::to_vec(&mine).unwrap_or_default();
    Response::from_parts(parts, axum::body::Body::from(body))
}

/// Whether `out` is a managed proxy's read of `proxy-defaults` (for its bootstrap) with the
/// local token this agent gave it: the servers do not know that token, so the agent reads
/// the entry for it (any token may read `proxy-defaults`, as in Consul).
fn proxy_defaults_for_managed_proxy(agent: &Agent, out: &Outgoing, token: Option<&::acl::Token>) -> bool {
    let Some(token) = token else { return false };
    out.parts.method == axum::http::Method::GET
        && out.parts.uri.path() == api_client::paths::config_entry("proxy-defaults", "global")
        && !agent
            .state()
            .services_where(|s| s.managed.as_ref().and_then(|m| m.local_token.as_ref()) == Some(token))
            .is_empty()
}

async fn send(agent: &Agent, mut out: Outgoing) -> Response {
    // A request naming no token runs with the agent's default token, as Consul's agents do;
    // one that names its own is forwarded with it, untouched.
    let query = http_kit::Params::parse(out.parts.uri.query());
    let named = request_token(&out.parts.headers, &query);
    let token = if named.is_none() {
        agent.acl().default_token()
    } else if proxy_defaults_for_managed_proxy(agent, &out, named.as_ref()) {
        for header in ["x-consul-token", "authorization"] {
            out.parts.headers.remove(header);
        }
        agent.acl().agent_token().or_else(|| agent.acl().default_token())
    } else {
        None
    };
    // A forwarded blocking query may wait minutes at the server: it ends when the agent stops.
    let send = agent
        .servers()
        .send_as(token.as_ref(), |client, base| out.to(client, base));
    let result = tokio::select! {
        r = send => r,
        () = agent.stopping() => return shutting_down(),
    };
    let resp = match result {
        Ok(r) => r,
        Err(e) => return forward_error(&e),
    };
    let answer = tokio::select! {
        a = relay::answer(resp) => a,
        () = agent.stopping() => return shutting_down(),
    };
    answer.unwrap_or_else(|e| {
        forward_error(&ApiError::Unreachable {
            tried: 1,
            last: crate::servers::chain(&e),
        })
    })
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
