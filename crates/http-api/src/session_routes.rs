//! Sessions (`/v1/session/*`), with Consul's answers: create, destroy, renew, info, the
//! sessions of a node, and all of them. Reads are filtered by `session:read` on each
//! session's node; writes need `session:write` on it.

use crate::api::Api;
use crate::authz::{Authz, mark_filtered};
use crate::error::ApiError;
use crate::query::{self, Params};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use catalog::session_reaper::now_ms;
use catalog::{IndexKey, Op};
use serde_json::{Value, json};
use structs::session::{CreateRequest, Session};

/// `PUT /v1/session/create`: `{"ID": ...}`. An empty body asks for every default.
pub(crate) async fn create(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    let request: CreateRequest = if body.iter().all(u8::is_ascii_whitespace) {
        CreateRequest::default()
    } else {
        query::decode(&body, "a session")?
    };
    let id = crate::acl_routes::new_id()?;
    let session = request
        .into_session(id.clone(), &api.config.node_name, now_ms())
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    authz.need(|a| a.session_write(&session.node), "session:write", &session.node)?;
    api.store.write(Op::SessionCreate(Box::new(session))).await?;
    Ok(query::json(&json!({ "ID": id }), None, params.pretty()))
}

/// `PUT /v1/session/destroy/:id`: `true` (also for a session already gone).
pub(crate) async fn destroy(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    // An unknown token is refused even when there is nothing left to destroy.
    authz.get()?;
    if let Some(session) = api.store.read().session(&id) {
        authz.need(|a| a.session_write(&session.node), "session:write", &session.node)?;
    }
    api.store.write(Op::SessionDestroy { id, now_ms: now_ms() }).await?;
    Ok(query::json(&true, None, params.pretty()))
}

/// `PUT /v1/session/renew/:id`: the renewed session in a list; a 404 for an unknown one.
pub(crate) async fn renew(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    authz.get()?;
    let Some(session) = api.store.read().session(&id) else {
        return Err(ApiError::NotFound(format!("Session id '{id}' not found")));
    };
    authz.need(|a| a.session_write(&session.node), "session:write", &session.node)?;
    api.store
        .write(Op::SessionRenew {
            id: id.clone(),
            now_ms: now_ms(),
        })
        .await?;
    let renewed: Vec<Value> = api.store.read().session(&id).iter().map(|s| s.to_api()).collect();
    Ok(query::json(&renewed, None, params.pretty()))
}

/// `GET /v1/session/info/:id`: the session in a list, or an empty list.
pub(crate) async fn info(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    listing(&api, &authz, q, |s| s.id == id).await
}

/// `GET /v1/session/node/:node`: the node's sessions.
pub(crate) async fn node(
    State(api): State<Api>,
    authz: Authz,
    Path(node): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    listing(&api, &authz, q, |s| s.node == node).await
}

/// `GET /v1/session/list`: every session.
pub(crate) async fn list(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    listing(&api, &authz, q, |_| true).await
}

/// The sessions `pick` selects and the token may read, blocking on the sessions' index.
async fn listing(
    api: &Api,
    authz: &Authz,
    q: Option<String>,
    pick: impl Fn(&Session) -> bool,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let a = authz.get()?;
    let state = api.read(&params, &IndexKey::Sessions).await?;
    let mut filtered = false;
    let sessions: Vec<Value> = state
        .sessions()
        .filter(|s| pick(s))
        .filter(|s| {
            let readable = a.session_read(&s.node);
            filtered |= !readable;
            readable
        })
        .map(|s| s.to_api())
        .collect();
    let index = state.index_of(&IndexKey::Sessions);
    Ok(mark_filtered(
        query::json(&sessions, Some(index), params.pretty()),
        filtered,
    ))
}
