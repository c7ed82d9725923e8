//! Request conventions: query parameters, blocking-query options and tokens (Consul's, from
//! the shared `http-kit`), JSON bodies, and Consul's response headers.

use crate::error::ApiError;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use structs::Index;

pub use http_kit::{BadParam, Blocking, DEFAULT_WAIT, MAX_WAIT, Params, token};

/// Checks `?dc=` against this server's datacenter and refuses parameters we cannot honour.
pub fn check_common(params: &Params, datacenter: &str) -> Result<(), ApiError> {
    if let Some(dc) = params.get("dc")
        && !dc.is_empty()
        && dc != datacenter
    {
        return Err(ApiError::UnknownDatacenter(dc.to_owned()));
    }
    Ok(())
}

/// `?filter=`, parsed for the records an endpoint lists (see `structs::filter::records`); a
/// bad expression is a 400 naming its position. Absent, it matches everything.
pub fn filter<T: structs::filter::Record>(params: &Params) -> Result<structs::Filter<T>, ApiError> {
    structs::Filter::parse(params.get("filter").unwrap_or_default())
        .map_err(|e| ApiError::BadRequest(format!("filter: {e}")))
}

/// Decodes a JSON body in any key casing; an empty body is an error naming what was expected.
pub fn decode<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest(format!("request body is empty: expected {what}")));
    }
    structs::json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("request decode failed: {e}")))
}

/// Encodes a value as JSON (pretty on request).
pub fn encode<T: Serialize>(value: &T, pretty: bool) -> Result<axum::body::Bytes, ApiError> {
    let body = if pretty {
        serde_json::to_vec_pretty(value)
    } else {
        serde_json::to_vec(value)
    };
    body.map(Into::into)
        .map_err(|e| ApiError::Internal(format!("encoding the response: {e}")))
}

/// A JSON response with Consul's headers; `index` adds `X-Consul-Index`.
pub fn json<T: Serialize>(value: &T, index: Option<Index>, pretty: bool) -> Response {
    match encode(value, pretty) {
        Ok(body) => json_bytes(body, index),
        Err(e) => e.into_response(),
    }
}

/// A response with an already encoded JSON body and Consul's headers.
pub fn json_bytes(body: axum::body::Bytes, index: Option<Index>) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    add_consul_headers(h, index);
    resp
}

/// `X-Consul-Index` (when given), `X-Consul-KnownLeader`, `X-Consul-LastContact`.
pub fn add_consul_headers(h: &mut HeaderMap, index: Option<Index>) {
    if let Some(index) = index
        && let Ok(v) = HeaderValue::from_str(&index.max(Index(1)).to_string())
    {
        h.insert(structs::wire::INDEX_HEADER, v);
    }
    h.insert(structs::wire::KNOWN_LEADER_HEADER, HeaderValue::from_static("true"));
    h.insert(structs::wire::LAST_CONTACT_HEADER, HeaderValue::from_static("0"));
}

/// The filters every service query takes: `?tag=` (all must match) and `?node-meta=`.
#[derive(Debug, Clone)]
pub struct ServiceFilters {
    /// Tags every instance must carry.
    pub tags: Vec<String>,
    /// `key:value` pairs the node's metadata must hold.
    pub node_meta: Vec<(String, String)>,
}

impl ServiceFilters {
    /// Reads the filters from a query.
    pub fn parse(params: &Params) -> Result<Self, ApiError> {
        Ok(Self {
            tags: params.all("tag").into_iter().map(str::to_owned).collect(),
            node_meta: params.node_meta()?,
        })
    }

    /// True when an instance with `tags` on a node with `meta` passes.
    pub fn admits(&self, tags: &[String], meta: &std::collections::BTreeMap<String, String>) -> bool {
        self.tags.iter().all(|t| tags.contains(t)) && meta_matches(meta, &self.node_meta)
    }
}

/// True when `meta` holds every `key:value` asked for (`?node-meta=`).
pub fn meta_matches(meta: &std::collections::BTreeMap<String, String>, wanted: &[(String, String)]) -> bool {
    wanted.iter().all(|(k, v)| meta.get(k) == Some(v))
}

/// The index key of a service query: the instances, or (`connect`) the connect-capable ones.
pub fn service_key(name: &str, connect: bool) -> catalog::IndexKey {
    if connect {
        catalog::IndexKey::ServiceConnect(name.to_owned())
    } else {
        catalog::IndexKey::Service(name.to_owned())
    }
}
