//! `/v1/config`: config entries.

use crate::query::{self, Params};
use crate::{Api, ApiError};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use catalog::{IndexKey, Op};
use structs::{ConfigEntry, ConfigEntryKind, Index};

fn kind(text: &str) -> Result<ConfigEntryKind, ApiError> {
    text.parse()
        .map_err(|e: structs::config_entry::UnknownConfigEntryKind| ApiError::BadRequest(format!("kind: {e}")))
}

fn cas(params: &Params) -> Result<Option<Index>, ApiError> {
    Ok(params.u64("cas")?.map(Index))
}

pub(crate) async fn set(
    State(api): State<Api>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref(), &headers)?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest(
            "request body is empty: expected a config entry".into(),
        ));
    }
    let value: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::BadRequest(format!("request decode failed: invalid JSON: {e}")))?;
    let entry =
        ConfigEntry::from_json(value).map_err(|e| ApiError::BadRequest(format!("request decode failed: {e}")))?;
    let outcome = api
        .store
        .write(Op::ConfigSet {
            entry: Box::new(entry),
            cas: cas(&params)?,
        })
        .await?;
    Ok(query::json(&outcome.applied, None, params.pretty()))
}

pub(crate) async fn get(
    State(api): State<Api>,
    Path((kind_text, name)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let kind = kind(&kind_text)?;
    let key = IndexKey::ConfigEntry(kind, name.clone());
    let state = api.read(&params, &key).await?;
    match state.config_entry(kind, &name) {
        Some(entry) => Ok(query::json(&*entry, Some(state.index_of(&key)), params.pretty())),
        // With the index, so a blocking query can wait for the entry to appear.
        None => {
            let mut resp = ApiError::NotFound(format!("Config entry not found for {:?} / {name:?}", kind.as_str()))
                .into_response();
            query::add_consul_headers(resp.headers_mut(), Some(state.index_of(&key)));
            Ok(resp)
        }
    }
}

pub(crate) async fn list(
    State(api): State<Api>,
    Path(kind_text): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let kind = kind(&kind_text)?;
    let key = IndexKey::ConfigKind(kind);
    let state = api.read(&params, &key).await?;
    let entries: Vec<ConfigEntry> = state.config_entries(kind).iter().map(|e| (**e).clone()).collect();
    Ok(query::json(&entries, Some(state.index_of(&key)), params.pretty()))
}

pub(crate) async fn delete(
    State(api): State<Api>,
    Path((kind_text, name)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref(), &headers)?;
    let kind = kind(&kind_text)?;
    let outcome = api
        .store
        .write(Op::ConfigDelete {
            kind,
            name,
            cas: cas(&params)?,
        })
        .await?;
    Ok(query::json(&outcome.applied, None, params.pretty()))
}
