//! Prepared queries (`/v1/query`): create, list, read, update, delete, execute and explain,
//! in Consul's shapes. Managing a query needs `query:write` on its name (`query:read` to
//! read it); executing one answers the instances the caller may read (`service:read`,
//! `node:read`), or the query's stored token may, when it has one. A stored token is shown
//! only to ACL managers (`acl:write`), as Consul. No federation yet, so no failover to other datacenters (refused on write).

use crate::api::Api;
use crate::authz::{Authz, mark_filtered};
use crate::error::ApiError;
use crate::query::{self, Params};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use catalog::{IndexKey, Op};
use serde_json::json;
use structs::Index;
use structs::query::PreparedQuery;

/// What Consul shows in place of a stored token.
const HIDDEN: &str = "<hidden>";

/// A query as `a` may see it: its stored token is a secret, shown only to ACL managers.
fn shown(prepared: &PreparedQuery, a: &acl::Authorizer) -> PreparedQuery {
    let mut shown = prepared.clone();
    if !shown.token.is_empty() && !a.acl_write() {
        shown.token = HIDDEN.to_owned();
    }
    shown
}

fn body_query(body: &[u8]) -> Result<PreparedQuery, ApiError> {
    query::decode(body, "a prepared query")
}

/// `POST /v1/query`: `{"ID": ...}`.
pub(crate) async fn create(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    let mut prepared = body_query(&body)?;
    authz.need(|a| a.query_write(&prepared.name), "query:write", &prepared.name)?;
    prepared.id = crate::acl_routes::new_id()?;
    let id = prepared.id.clone();
    api.store
        .write(Op::QuerySet {
            query: Box::new(prepared),
            create: true,
        })
        .await?;
    Ok(query::json(&json!({ "ID": id }), None, params.pretty()))
}

/// `GET /v1/query`: the queries the token may read.
pub(crate) async fn list(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let a = authz.get()?;
    let state = api.read(&params, &IndexKey::Queries).await?;
    let mut filtered = false;
    let queries: Vec<PreparedQuery> = state
        .queries()
        .filter(|pq| {
            let readable = a.query_read(&pq.name);
            filtered |= !readable;
            readable
        })
        .map(|pq| shown(pq, a))
        .collect();
    let index = state.index_of(&IndexKey::Queries);
    Ok(mark_filtered(
        query::json(&queries, Some(index), params.pretty()),
        filtered,
    ))
}

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("Query not found: {id:?}"))
}

/// `GET /v1/query/:id`: the query in a list.
pub(crate) async fn get(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let state = api.read(&params, &IndexKey::Queries).await?;
    let found = state.query(&id).ok_or_else(|| not_found(&id))?;
    authz.need(|a| a.query_read(&found.name), "query:read", &found.name)?;
    let index = state.index_of(&IndexKey::Queries);
    Ok(query::json(
        &[shown(&found, authz.get()?)],
        Some(index),
        params.pretty(),
    ))
}

/// `PUT /v1/query/:id`: replaces the query (`query:write` on its old and new names).
pub(crate) async fn update(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    let mut prepared = body_query(&body)?;
    let old = api.store.read().query(&id).ok_or_else(|| not_found(&id))?;
    authz.need(|a| a.query_write(&old.name), "query:write", &old.name)?;
    authz.need(|a| a.query_write(&prepared.name), "query:write", &prepared.name)?;
    prepared.id = id;
    api.store
        .write(Op::QuerySet {
            query: Box::new(prepared),
            create: false,
        })
        .await?;
    Ok(query::json(&json!(null), None, params.pretty()))
}

/// `DELETE /v1/query/:id`.
pub(crate) async fn delete(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    authz.get()?;
    if let Some(old) = api.store.read().query(&id) {
        authz.need(|a| a.query_write(&old.name), "query:write", &old.name)?;
    }
    api.store.write(Op::QueryDelete { id }).await?;
    Ok(query::json(&json!(null), None, params.pretty()))
}

/// `GET /v1/query/:id_or_name/execute` (`?limit=`, `?connect=true`: the connect-capable
/// instances, as Consul's): the healthy instances the query selects and the caller may
/// read, in a new order each time (no coordinates to sort by distance). `X-Consul-Index` is
/// that of the queries and of the service's instances; with `?index=` it blocks until either
/// passes it (Consul answers at once; an agent's cache follows a query's results this way).
pub(crate) async fn execute(
    State(api): State<Api>,
    authz: Authz,
    Path(asked): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    query::check_common(&params, api.store.datacenter())?;
    let limit = params.u64("limit")?;
    let connect = params.bool("connect")?;
    let blocking = params.blocking()?;
    let caller = authz.get()?;
    let deadline = tokio::time::Instant::now() + blocking.wait_with_jitter();
    let (state, prepared, index) = loop {
        let state = api.store.read();
        // A missing query blocks on the queries alone (it may be created).
        let (prepared, key, index) = state.query_watch(&asked, connect);
        let index = index.max(Index(1));
        // Channels only for a wait (`None` too once waiters are released: answer now).
        let wait = blocking
            .index
            .filter(|after| *after >= index && tokio::time::Instant::now() < deadline)
            .and_then(|after| {
                let queries = api.store.index_receiver(&IndexKey::Queries)?;
                Some((after, queries, api.store.index_receiver(&key)?))
            });
        let Some((after, mut queries, mut instances)) = wait else {
            match prepared {
                Some(prepared) => break (state, prepared, index),
                // With its index, so that a blocking client can wait for it.
                None => {
                    let mut resp = axum::response::IntoResponse::into_response(not_found(&asked));
                    query::add_consul_headers(resp.headers_mut(), Some(index));
                    return Ok(resp);
                }
            }
        };
        drop(state);
        let _waiting = api.metrics.waiting();
        tokio::select! {
            _ = queries.wait_for(|i| *i > after) => {}
            _ = instances.wait_for(|i| *i > after) => {}
            () = tokio::time::sleep_until(deadline) => {}
        }
    };
    // A query with a stored token runs with that token's rights, as Consul's do.
    let stored = match structs::Token::new(&prepared.token) {
        Some(token) => Some(
            api.config
                .acl
                .resolve(&state, Some(&token))
                .map_err(|e| ApiError::Forbidden(format!("the query's stored token: {e}")))?,
        ),
        None => None,
    };
    let a = stored.as_ref().map_or(caller, |r| &*r.authz);
    let service = prepared.service.service.clone();
    let mut nodes = state.query_nodes(&prepared, connect);
    let before = nodes.len();
    nodes.retain(|csn| a.service_read(&csn.service.service) && a.node_read(&csn.node.node));
    let filtered = nodes.len() != before;
    // A new order each time spreads clients over the instances, as Consul's shuffle does.
    if !nodes.is_empty() {
        let turn = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as usize);
        let len = nodes.len();
        nodes.rotate_left(turn % len);
    }
    if let Some(limit) = limit.and_then(|l| usize::try_from(l).ok()).filter(|l| *l > 0) {
        nodes.truncate(limit);
    }
    let body = json!({
        "Service": service,
        "Nodes": nodes,
        "DNS": prepared.dns,
        "Datacenter": api.store.datacenter(),
        "Failovers": 0,
    });
    Ok(mark_filtered(
        query::json(&body, Some(index), params.pretty()),
        filtered,
    ))
}

/// `GET /v1/query/:id_or_name/explain` (`query:read`): the query as it would run.
pub(crate) async fn explain(
    State(api): State<Api>,
    authz: Authz,
    Path(asked): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    query::check_common(&params, api.store.datacenter())?;
    let state = api.store.read();
    let prepared = state.resolve_query(&asked).ok_or_else(|| not_found(&asked))?;
    authz.need(|a| a.query_read(&prepared.name), "query:read", &prepared.name)?;
    let prepared = shown(&prepared, authz.get()?);
    Ok(query::json(
        &json!({ "Query": prepared }),
        Some(state.index),
        params.pretty(),
    ))
}
