//! The KV store's HTTP API (`/v1/kv/:key`), with Consul's parameters and answers: a key's
//! entry, a prefix's entries (`?recurse`) or keys (`?keys`, `?separator=`), the raw value
//! (`?raw`); writes with flags and check-and-set; deletes of a key or a prefix. Blocking
//! queries wait on the key, or on the prefix (see `catalog::State::kv_prefix_index`); only a
//! write under the prefix wakes a listing's wait.

use crate::api::Api;
use crate::authz::{Authz, mark_filtered};
use crate::error::ApiError;
use crate::query::{self, Params};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use catalog::{IndexKey, Op};
use std::sync::Arc;
use structs::kv::KvError;
use structs::{Index, KvEntry};

/// `GET /v1/kv/` (the root: only with `?recurse` or `?keys`).
pub(crate) async fn get_root(state: State<Api>, authz: Authz, q: RawQuery) -> Result<Response, ApiError> {
    get(state, authz, Path(String::new()), q).await
}

/// `DELETE /v1/kv/` (only with `?recurse`: everything).
pub(crate) async fn delete_root(state: State<Api>, authz: Authz, q: RawQuery) -> Result<Response, ApiError> {
    delete(state, authz, Path(String::new()), q).await
}

/// `GET /v1/kv/:key`.
pub(crate) async fn get(
    State(api): State<Api>,
    authz: Authz,
    Path(key): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    if params.has("keys") {
        return list_keys(&api, &authz, &key, &params).await;
    }
    if params.has("recurse") {
        return list_entries(&api, &authz, &key, &params).await;
    }
    if key.is_empty() {
        return Err(KvError::MissingKey.into());
    }
    authz.need(|a| a.key_read(&key), "key:read", &key)?;
    let index_key = IndexKey::KvKey(key.clone());
    let state = api.read(&params, &index_key).await?;
    let Some(entry) = state.kv_get(&key) else {
        return Ok(not_found(state.index_of(&index_key)));
    };
    if params.has("raw") {
        return Ok(raw(&entry));
    }
    Ok(query::json(&[&*entry], Some(entry.modify_index), params.pretty()))
}

/// `?recurse`: every entry under the prefix the token may read; none is a 404.
async fn list_entries(api: &Api, authz: &Authz, prefix: &str, params: &Params) -> Result<Response, ApiError> {
    listing(api, authz, prefix, params, |state, a| {
        let mut filtered = false;
        let entries: Vec<&KvEntry> = state
            .kv_range(prefix)
            .filter(|e| {
                let readable = a.key_read(&e.key);
                filtered |= !readable;
                readable
            })
            .map(|e| &**e)
            .collect();
        let body = if entries.is_empty() {
            Bytes::new()
        } else {
            query::encode(&entries, params.pretty())?
        };
        Ok((body, filtered))
    })
    .await
}

/// `?keys` (and `?separator=`): the keys under the prefix the token may read, rolled up at
/// the separator; none is a 404, except at the root (an empty list), as Consul.
async fn list_keys(api: &Api, authz: &Authz, prefix: &str, params: &Params) -> Result<Response, ApiError> {
    // Consul reads both spellings (the first was a typo it kept).
    let separator = params
        .get("separator")
        .or_else(|| params.get("seperator"))
        .unwrap_or_default();
    listing(api, authz, prefix, params, |state, a| {
        let mut filtered = false;
        let readable = state.kv_range(prefix).map(|e| e.key.as_str()).filter(|k| {
            let readable = a.key_read(k);
            filtered |= !readable;
            readable
        });
        let keys = structs::kv::list_keys(prefix, separator, readable);
        let body = if keys.is_empty() && !prefix.is_empty() {
            Bytes::new()
        } else {
            query::encode(&keys, params.pretty())?
        };
        Ok((body, filtered))
    })
    .await
}

/// A listing of `prefix`, blocking as asked; its body (empty: a 404) is encoded once per
/// index of the prefix and shared by every request with the same parameters and token, as
/// 10,000 watchers of one prefix all want the same answer.
async fn listing(
    api: &Api,
    authz: &Authz,
    prefix: &str,
    params: &Params,
    encode: impl FnOnce(&catalog::State, &acl::Authorizer) -> Result<(Bytes, bool), ApiError>,
) -> Result<Response, ApiError> {
    let a = authz.get()?;
    let cache_key = api.answer_key(&format!("/v1/kv/{prefix}"), params, authz)?;
    let state = read_prefix(api, params, prefix).await?;
    let index = state.kv_prefix_index(prefix);
    let (body, filtered) = api.responses.get_or_encode(cache_key, index, || encode(&state, a))?;
    if body.is_empty() {
        return Ok(mark_filtered(not_found(index), filtered));
    }
    Ok(mark_filtered(query::json_bytes(body, Some(index)), filtered))
}

/// The state for a listing of `prefix`: with `?index=`, once the prefix's index passed it.
/// Only a write under the prefix wakes the wait (see `catalog::IndexKey::KvPrefix`).
async fn read_prefix(api: &Api, params: &Params, prefix: &str) -> Result<Arc<catalog::State>, ApiError> {
    api.read(params, &IndexKey::KvPrefix(prefix.to_owned())).await
}

/// `PUT /v1/kv/:key` with the value as the body: `true`, or `false` when a check-and-set
/// did not match.
pub(crate) async fn put(
    State(api): State<Api>,
    authz: Authz,
    Path(key): Path<String>,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    if key.is_empty() {
        return Err(KvError::MissingKey.into());
    }
    conflicting(&params, &["cas", "acquire", "release"])?;
    if body.len() > structs::kv::MAX_VALUE {
        return Err(KvError::TooLarge.into());
    }
    authz.need(|a| a.key_write(&key), "key:write", &key)?;
    let flags = params.u64("flags")?.unwrap_or(0);
    let entry = || {
        Box::new(KvEntry {
            key: key.clone(),
            value: body.to_vec(),
            flags,
            ..KvEntry::default()
        })
    };
    let op = if let Some(session) = params.get("acquire") {
        Op::KvLock {
            entry: entry(),
            session: session.to_owned(),
            now_ms: catalog::session_reaper::now_ms(),
        }
    } else if let Some(session) = params.get("release") {
        Op::KvUnlock {
            entry: entry(),
            session: session.to_owned(),
        }
    } else {
        Op::KvSet {
            key: key.clone(),
            value: body.to_vec(),
            flags,
            cas: params.u64("cas")?.map(Index),
        }
    };
    let outcome = api.store.write(op).await?;
    Ok(query::json(&outcome.applied, None, params.pretty()))
}

/// `DELETE /v1/kv/:key` (`?cas=`: `false` when it did not match) or `?recurse` (every key
/// under the prefix; the token needs `key:write` on all of them). `true` otherwise.
pub(crate) async fn delete(
    State(api): State<Api>,
    authz: Authz,
    Path(key): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    conflicting(&params, &["recurse", "cas"])?;
    let op = if params.has("recurse") {
        authz.need(|a| a.key_write_prefix(&key), "key:write", &key)?;
        Op::KvDeleteTree { prefix: key }
    } else {
        if key.is_empty() {
            return Err(KvError::MissingKey.into());
        }
        authz.need(|a| a.key_write(&key), "key:write", &key)?;
        Op::KvDelete {
            key,
            cas: params.u64("cas")?.map(Index),
        }
    };
    let outcome = api.store.write(op).await?;
    Ok(query::json(&outcome.applied, None, params.pretty()))
}

/// Refuses a request that combines parameters that do not compose, as Consul (naming the
/// parameters, not echoing the query: it may carry a token).
fn conflicting(params: &Params, flags: &[&str]) -> Result<(), ApiError> {
    let given: Vec<&str> = flags.iter().copied().filter(|f| params.has(f)).collect();
    if given.len() > 1 {
        return Err(ApiError::BadRequest(format!(
            "Conflicting flags: {} (use one of {})",
            given.join(", "),
            flags.join(", ")
        )));
    }
    Ok(())
}

/// A 404 with no body and the index to block on, as Consul answers a missing key.
fn not_found(index: Index) -> Response {
    let mut resp = StatusCode::NOT_FOUND.into_response();
    query::add_consul_headers(resp.headers_mut(), Some(index));
    resp
}

/// `?raw`: the value alone. Text is labelled as text, anything else as bytes, and browsers
/// are told not to guess (a value is whatever a writer put there).
fn raw(entry: &KvEntry) -> Response {
    let content_type = if std::str::from_utf8(&entry.value).is_ok() {
        "text/plain; charset=utf-8"
    } else {
        "application/octet-stream"
    };
    let mut resp = (StatusCode::OK, entry.value.clone()).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    query::add_consul_headers(h, Some(entry.modify_index));
    resp
}
