//! User events (`/v1/event/*`): fire one (`PUT /v1/event/fire/:name`, the body as its
//! payload, `?node=`, `?service=`, `?tag=` as its filters) and list the kept ones
//! (`GET /v1/event/list`, `?name=`, blocking on the events' index). `event:write` on the
//! name to fire; the list is filtered by `event:read`.

use crate::api::Api;
use crate::authz::{Authz, mark_filtered};
use crate::error::ApiError;
use crate::query::{self, Params};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use catalog::{IndexKey, Op};
use structs::event::{MAX_PAYLOAD, UserEvent};

pub(crate) async fn fire(
    State(api): State<Api>,
    authz: Authz,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    if body.len() > MAX_PAYLOAD {
        return Err(ApiError::TooLarge(format!(
            "event payload of {} bytes is over the {MAX_PAYLOAD} byte limit",
            body.len()
        )));
    }
    authz.need(|a| a.event_write(&name), "event:write", &name)?;
    let event = UserEvent {
        id: crate::acl_routes::new_id()?,
        name,
        payload: body.to_vec(),
        node_filter: params.get("node").unwrap_or_default().to_owned(),
        service_filter: params.get("service").unwrap_or_default().to_owned(),
        tag_filter: params.get("tag").unwrap_or_default().to_owned(),
        version: 1,
        ltime: 0,
    };
    let id = event.id.clone();
    api.store.write(Op::EventFire(Box::new(event))).await?;
    let fired = api.store.read().events().find(|e| e.id == id).map(|e| (**e).clone());
    let fired = fired.ok_or_else(|| ApiError::Internal("the fired event is already gone".into()))?;
    Ok(query::json(&fired, None, params.pretty()))
}

pub(crate) async fn list(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    for unsupported in ["node", "service", "tag"] {
        if params.has(unsupported) {
            return Err(ApiError::BadRequest(format!(
                "?{unsupported}: not supported: a server lists every event it keeps; an agent's /v1/event/list lists only the events for its node and services"
            )));
        }
    }
    let a = authz.get()?;
    let name = params.get("name").unwrap_or_default().to_owned();
    let state = api.read(&params, &IndexKey::Events).await?;
    let mut filtered = false;
    let events: Vec<&UserEvent> = state
        .events()
        .filter(|e| name.is_empty() || e.name == name)
        .filter(|e| {
            let readable = a.event_read(&e.name);
            filtered |= !readable;
            readable
        })
        .map(|e| &**e)
        .collect();
    Ok(mark_filtered(
        query::json(&events, Some(state.index_of(&IndexKey::Events)), params.pretty()),
        filtered,
    ))
}
