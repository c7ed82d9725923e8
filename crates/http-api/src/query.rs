//! Request conventions: query parameters, blocking-query options, tokens, JSON bodies, and
//! Consul's response headers.

use crate::error::ApiError;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use std::time::Duration;
use structs::{GoDuration, Index};

/// Default blocking wait, as Consul's.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(300);
/// Longest blocking wait honoured, as Consul's.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// Parsed query string: repeated keys kept in order; a key without value counts as set.
#[derive(Debug, Clone, Default)]
pub struct Params(Vec<(String, String)>);

impl Params {
    /// Parses a raw query string.
    pub fn parse(raw: Option<&str>) -> Self {
        Params(
            raw.map(|q| {
                form_urlencoded::parse(q.as_bytes())
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect()
            })
            .unwrap_or_default(),
        )
    }

    /// Every (key, value) pair, in order.
    pub fn iter(&self) -> impl Iterator<Item = &(String, String)> {
        self.0.iter()
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Every value of `key`.
    pub fn all(&self, key: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// A flag: present (with no value, or any value but `false`/`0`).
    pub fn flag(&self, key: &str) -> bool {
        self.get(key).is_some_and(|v| !matches!(v, "false" | "0"))
    }

    /// A required parameter.
    pub fn required(&self, key: &str) -> Result<&str, ApiError> {
        match self.get(key) {
            Some(v) if !v.is_empty() => Ok(v),
            _ => Err(ApiError::BadRequest(format!(
                "required query parameter '{key}' not set"
            ))),
        }
    }

    /// An unsigned integer parameter.
    pub fn u64(&self, key: &str) -> Result<Option<u64>, ApiError> {
        self.get(key)
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    ApiError::BadRequest(format!("invalid {key} parameter {v:?}: expected an unsigned integer"))
                })
            })
            .transpose()
    }

    /// Checks `?dc=` against this server's datacenter and refuses parameters we cannot honour.
    pub fn check_common(&self, datacenter: &str) -> Result<(), ApiError> {
        if let Some(dc) = self.get("dc")
            && !dc.is_empty()
            && dc != datacenter
        {
            return Err(ApiError::UnknownDatacenter(dc.to_owned()));
        }
        if self.get("filter").is_some_and(|f| !f.is_empty()) {
            return Err(ApiError::BadRequest(
                "filter: filter expressions are not supported by this server".into(),
            ));
        }
        Ok(())
    }

    /// `?node-meta=key:value` pairs (all must match).
    pub fn node_meta(&self) -> Result<Vec<(String, String)>, ApiError> {
        self.all("node-meta")
            .into_iter()
            .map(|kv| match kv.split_once(':') {
                Some((k, v)) => Ok((k.to_owned(), v.to_owned())),
                None => Err(ApiError::BadRequest(format!(
                    "node-meta: {kv:?} is not of the form key:value"
                ))),
            })
            .collect()
    }

    /// Blocking-query options: `?index=` and `?wait=` (default 5 min, at most 10 min).
    pub fn blocking(&self) -> Result<Blocking, ApiError> {
        // An empty `?index=` is no index (as Consul reads it), not a bad number.
        let index = match self.get("index") {
            Some("") => None,
            _ => self.u64("index")?,
        };
        let index = index.filter(|i| *i > 0).map(Index);
        let wait = match self.get("wait") {
            None | Some("") => DEFAULT_WAIT,
            Some(w) => {
                GoDuration::parse(w)
                    .map_err(|e| ApiError::BadRequest(format!("wait: {e}")))?
                    .0
            }
        };
        Ok(Blocking {
            index,
            wait: wait.min(MAX_WAIT),
        })
    }

    /// `?pretty`.
    pub fn pretty(&self) -> bool {
        self.get("pretty").is_some()
    }
}

/// Blocking-query options.
#[derive(Debug, Clone, Copy)]
pub struct Blocking {
    /// Wait until the index passes this (absent: answer at once).
    pub index: Option<Index>,
    /// How long to wait at most, before jitter.
    pub wait: Duration,
}

impl Blocking {
    /// The wait with up to wait/16 of jitter added, so many clients do not return together.
    pub fn wait_with_jitter(&self) -> Duration {
        let spread = self.wait.as_nanos() / 16;
        if spread == 0 {
            return self.wait;
        }
        // A wait longer than u64 nanoseconds (584 years) gets at most that much jitter.
        let spread = u64::try_from(spread).unwrap_or(u64::MAX);
        self.wait + Duration::from_nanos(fastrand::u64(0..spread))
    }
}

/// The request's ACL token, from `X-Consul-Token`, `Authorization: Bearer` or `?token=`.
/// Read on every request; enforced once ACLs exist.
pub fn token(headers: &HeaderMap, params: &Params) -> Option<String> {
    if let Some(t) = headers.get(structs::wire::TOKEN_HEADER).and_then(|v| v.to_str().ok()) {
        return Some(t.to_owned());
    }
    if let Some(t) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        return Some(t.trim().to_owned());
    }
    params.get("token").map(str::to_owned)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_index_is_no_index_and_a_bad_one_says_why() {
        let b = Params::parse(Some("index=&wait=1s")).blocking().unwrap();
        assert!(b.index.is_none());
        assert_eq!(b.wait, Duration::from_secs(1));
        let e = Params::parse(Some("index=x")).blocking().unwrap_err().to_string();
        assert!(e.contains("invalid index parameter \"x\""), "{e}");
    }

    #[test]
    fn jitter_adds_less_than_a_sixteenth_of_the_wait() {
        let blocking = Blocking {
            index: None,
            wait: Duration::from_secs(600),
        };
        let jittered: Vec<Duration> = (0..64).map(|_| blocking.wait_with_jitter()).collect();
        for j in &jittered {
            assert!(*j >= blocking.wait && *j < blocking.wait + blocking.wait / 16, "{j:?}");
        }
        // The old clock-derived jitter was capped at u32 nanoseconds (~4.3s); the spread is
        // now the whole wait/16 (37.5s here), so 64 draws all under 4.3s means it regressed.
        assert!(jittered.iter().any(|j| *j > blocking.wait + Duration::from_secs(5)));
    }

    #[test]
    fn a_wait_too_short_to_spread_is_unchanged() {
        let blocking = Blocking {
            index: None,
            wait: Duration::from_nanos(15),
        };
        assert_eq!(blocking.wait_with_jitter(), blocking.wait);
    }
}
