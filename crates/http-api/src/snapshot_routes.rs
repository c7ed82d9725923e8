//! `GET /v1/snapshot` (save) and `PUT /v1/snapshot` (restore): the whole catalog as one
//! archive (see `catalog::snapshot`). An archive holds the CA's private keys and every ACL
//! secret, so both need `acl:write`, the right that could mint a token for anything anyway
//! (Consul asks for a management token).
//!
//! A save reflects every write committed before it on any server (over etcd this server
//! catches up first, unless `?stale`). A restore is verified whole (sums, format, rows
//! that refer to others) before anything is written, then applied as one write.

use crate::api::Api;
use crate::authz::Authz;
use crate::error::ApiError;
use crate::query::{self, Params};
use axum::extract::{RawQuery, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use catalog::snapshot::{MAX_ARCHIVE, Snapshot};
use std::sync::Arc;
use std::time::Duration;
use tracing::info;

/// How long a save may wait for this server to catch up with the others.
const CATCH_UP: Duration = Duration::from_secs(5);

fn authorize(api: &Api, authz: &Authz, q: Option<&str>) -> Result<Params, ApiError> {
    let params = Params::parse(q);
    query::check_common(&params, api.store.datacenter())?;
    authz.need(|a| a.acl_write(), "acl:write", "")?;
    Ok(params)
}

/// `GET /v1/snapshot`: the archive, with the index it was taken at.
pub(crate) async fn save(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = authorize(&api, &authz, q.as_deref())?;
    if !params.has("stale") && !api.store.catch_up(CATCH_UP).await {
        return Err(ApiError::Internal(format!(
            "could not catch up with the catalog's other servers within {}s to take a consistent snapshot (?stale takes this server's)",
            CATCH_UP.as_secs()
        )));
    }
    let (index, archive) = api
        .store
        .save_snapshot()
        .await
        .map_err(|e| ApiError::Internal(format!("taking the snapshot: {e}")))?;
    info!(%index, bytes = archive.len(), "snapshot saved");
    let mut resp = (StatusCode::OK, archive).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-gzip"));
    h.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment; filename=\"meshd.snapshot\""),
    );
    query::add_consul_headers(h, Some(index));
    Ok(resp)
}

/// `PUT /v1/snapshot`: restores the archive in the body (at most [`MAX_ARCHIVE`] bytes).
pub(crate) async fn restore(State(api): State<Api>, authz: Authz, req: Request) -> Result<Response, ApiError> {
    authorize(&api, &authz, req.uri().query())?;
    let body = axum::body::to_bytes(req.into_body(), MAX_ARCHIVE)
        .await
        .map_err(|_| ApiError::TooLarge(format!("a snapshot archive is limited to {MAX_ARCHIVE} bytes")))?;
    if body.is_empty() {
        return Err(ApiError::BadRequest(
            "the request body must be a snapshot archive (it is empty)".into(),
        ));
    }
    let snapshot = tokio::task::spawn_blocking(move || Snapshot::decode(&body))
        .await
        .map_err(|e| ApiError::Internal(format!("reading the snapshot: {e}")))?
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let (id, taken_at) = (snapshot.meta().id.clone(), snapshot.meta().index);
    let outcome = api.store.restore(Arc::new(snapshot)).await?;
    info!(snapshot = %id, %taken_at, index = %outcome.index, "snapshot restored");
    let mut resp = StatusCode::OK.into_response();
    query::add_consul_headers(resp.headers_mut(), Some(outcome.index));
    Ok(resp)
}
