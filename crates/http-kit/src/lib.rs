//! Consul's HTTP conventions, written once and used by every meshd HTTP API (the server's,
//! the agent's, the status views both serve), so the same request means the same thing on
//! each:
//!
//! - [`Params`]: the query string, repeated keys kept in order;
//! - booleans: absent is false, present without a value is true, a value is read as Go's
//!   `strconv.ParseBool` reads it (`1`, `t`, `T`, `TRUE`, `true`, `True` and their false
//!   twins) and anything else is refused ([`Params::bool`]);
//! - blocking queries: `?index=` (empty: none) and `?wait=` (a Go duration, default 5 min,
//!   at most 10), with jitter ([`Blocking`]);
//! - the request's token: `X-Consul-Token`, else `Authorization: Bearer`, else `?token=`
//!   ([`token`]);
//! - relaying a request to another node and its answer back ([`relay`]): a follower's write
//!   to its leader, an agent's request to a server.
//!
//! A parameter that cannot be read is a [`BadParam`]: each API turns it into its 400.

use axum::http::{HeaderMap, header};

pub mod relay;
use std::time::Duration;
use structs::{GoDuration, Index};

/// Default blocking wait, as Consul's.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(300);
/// Longest blocking wait honoured, as Consul's.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// The body of a 404 for a path no route serves: Go's `404 page not found`, which clients
/// match, then the path (percent-encoded as requested, so the line stays plain ASCII).
pub fn unknown_path(path: &str) -> String {
    format!("404 page not found: no endpoint at {path}\n")
}

/// The body of a 413: it names the limit (Consul's APIs and meshd's answer with the same
/// words).
pub fn too_large(limit: usize) -> String {
    format!("request body larger than this API's limit of {limit} bytes\n")
}

/// A query parameter that cannot be read: the text names it and says why (a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadParam(pub String);

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

    /// Whether `key` is present at all (Consul's presence-only switches: `?pretty`,
    /// `?stale`, `?cached`).
    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Every value of `key`.
    pub fn all(&self, key: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// A boolean flag (see the module docs): `?passing`, `?passing=True`, `?passing=0`.
    pub fn bool(&self, key: &str) -> Result<bool, BadParam> {
        match self.get(key) {
            None => Ok(false),
            Some("") => Ok(true),
            Some(v) => parse_bool(v).ok_or_else(|| {
                BadParam(format!(
                    "invalid value for ?{key}: {v:?} is not a boolean (use true or false)"
                ))
            }),
        }
    }

    /// A boolean that must be given (`?enable=` of maintenance).
    pub fn required_bool(&self, key: &str) -> Result<bool, BadParam> {
        match self.get(key) {
            None | Some("") => Err(BadParam(format!("{key}: required (true or false)"))),
            Some(_) => self.bool(key),
        }
    }

    /// A required parameter.
    pub fn required(&self, key: &str) -> Result<&str, BadParam> {
        match self.get(key) {
            Some(v) if !v.is_empty() => Ok(v),
            _ => Err(BadParam(format!("required query parameter '{key}' not set"))),
        }
    }

    /// An unsigned integer parameter.
    pub fn u64(&self, key: &str) -> Result<Option<u64>, BadParam> {
        self.get(key)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| BadParam(format!("invalid {key} parameter {v:?}: expected an unsigned integer")))
            })
            .transpose()
    }

    /// `?node-meta=key:value` pairs (all must match).
    pub fn node_meta(&self) -> Result<Vec<(String, String)>, BadParam> {
        self.all("node-meta")
            .into_iter()
            .map(|kv| match kv.split_once(':') {
                Some((k, v)) => Ok((k.to_owned(), v.to_owned())),
                None => Err(BadParam(format!("node-meta: {kv:?} is not of the form key:value"))),
            })
            .collect()
    }

    /// Blocking-query options: `?index=` and `?wait=` (default 5 min, at most 10 min).
    pub fn blocking(&self) -> Result<Blocking, BadParam> {
        // An empty `?index=` is no index (as Consul reads it), not a bad number.
        let index = match self.get("index") {
            Some("") => None,
            _ => self.u64("index")?,
        };
        let index = index.filter(|i| *i > 0).map(Index);
        let wait = match self.get("wait") {
            None | Some("") => DEFAULT_WAIT,
            Some(w) => GoDuration::parse(w).map_err(|e| BadParam(format!("wait: {e}")))?.0,
        };
        Ok(Blocking {
            index,
            wait: wait.min(MAX_WAIT),
        })
    }

    /// `?pretty`: present, whatever its value (as Consul reads it).
    pub fn pretty(&self) -> bool {
        self.has("pretty")
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Params {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Params::parse(parts.uri.query()))
    }
}

/// A boolean in the spellings Go's `strconv.ParseBool` accepts.
pub fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
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

/// The request's ACL token, from `X-Consul-Token`, `Authorization: Bearer` or `?token=`
/// (none when absent or empty).
pub fn token(headers: &HeaderMap, params: &Params) -> Option<acl::Token> {
    if let Some(t) = headers.get(structs::wire::TOKEN_HEADER).and_then(|v| v.to_str().ok()) {
        return acl::Token::new(t);
    }
    if let Some(t) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        return acl::Token::new(t.trim());
    }
    params.get("token").and_then(acl::Token::new)
}

#[cfg(test)]
mod tests;

/// The ports a node listens on, `-1` where it does not (Consul's convention).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    /// The plain HTTP API.
    pub http: i32,
    /// The HTTPS API.
    pub https: i32,
    /// Plain xDS (gRPC).
    pub grpc: i32,
    /// xDS over TLS.
    pub grpc_tls: i32,
    /// DNS.
    pub dns: i32,
}

impl Default for Ports {
    fn default() -> Self {
        Ports {
            http: -1,
            https: -1,
            grpc: -1,
            grpc_tls: -1,
            dns: -1,
        }
    }
}

/// One row of `/v1/agent/members` (and `Member` of `/v1/agent/self`) in Consul's shape: the
/// fields its clients read. meshd has no gossip, so `Status` is what the node's liveness
/// says (1 alive, 4 failed), not a gossip member state.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Member {
    /// The node's name.
    pub name: String,
    /// Its address (host).
    pub addr: String,
    /// Its port (0 when the address names none).
    pub port: u16,
    /// `role` (`consul` for a server, `node` for an agent) and `dc`.
    pub tags: std::collections::BTreeMap<String, String>,
    /// 1 alive, 4 failed.
    pub status: u8,
}

impl Member {
    /// A member at `addr` (`host[:port]`).
    pub fn new(name: &str, addr: &str, role: &str, dc: &str, alive: bool) -> Self {
        let (host, port) = match addr.rsplit_once(':') {
            Some((h, p)) if p.parse::<u16>().is_ok() => (h, p.parse::<u16>().unwrap_or(0)),
            _ => (addr, 0),
        };
        Self {
            name: name.to_owned(),
            addr: host.to_owned(),
            port,
            tags: [("role", role), ("dc", dc)]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            status: if alive { 1 } else { 4 },
        }
    }
}

/// `DebugConfig` of `/v1/agent/self`, for either mode: the keys of Consul's that its clients
/// read (the datacenters, the node, whether it is a server, ACLs, and the ports, `-1` for
/// what does not listen; meshd has no DNS interface yet, so `DNSPort` is `-1`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct DebugConfig {
    /// Datacenter.
    #[serde(rename = "Datacenter")]
    pub datacenter: String,
    /// The primary datacenter: this one (meshd runs one datacenter).
    #[serde(rename = "PrimaryDatacenter")]
    pub primary_datacenter: String,
    /// Node name.
    #[serde(rename = "NodeName")]
    pub node_name: String,
    /// Node id.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// A server (else an agent).
    #[serde(rename = "ServerMode")]
    pub server_mode: bool,
    /// ACLs enforced.
    #[serde(rename = "ACLsEnabled")]
    pub acls_enabled: bool,
    /// The service mesh is on (always, in meshd).
    #[serde(rename = "ConnectEnabled")]
    pub connect_enabled: bool,
    /// The HTTP API's port.
    #[serde(rename = "HTTPPort")]
    pub http_port: i32,
    /// The HTTPS API's port.
    #[serde(rename = "HTTPSPort")]
    pub https_port: i32,
    /// The plain xDS port.
    #[serde(rename = "GRPCPort")]
    pub grpc_port: i32,
    /// The xDS-over-TLS port.
    #[serde(rename = "GRPCTLSPort")]
    pub grpc_tls_port: i32,
    /// The DNS port.
    #[serde(rename = "DNSPort")]
    pub dns_port: i32,
    /// meshd's version.
    #[serde(rename = "Version")]
    pub version: String,
}

impl DebugConfig {
    /// The view of a node `node_name` (`node_id`) of datacenter `datacenter` on `ports`.
    pub fn new(
        datacenter: &str,
        node_name: &str,
        node_id: &str,
        server_mode: bool,
        acls_enabled: bool,
        ports: Ports,
    ) -> Self {
        DebugConfig {
            datacenter: datacenter.to_owned(),
            primary_datacenter: datacenter.to_owned(),
            node_name: node_name.to_owned(),
            node_id: node_id.to_owned(),
            server_mode,
            acls_enabled,
            connect_enabled: true,
            http_port: ports.http,
            https_port: ports.https,
            grpc_port: ports.grpc,
            grpc_tls_port: ports.grpc_tls,
            dns_port: ports.dns,
            version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }
}

/// The list endpoints that take `?filter=`, by path prefix (Consul's): the server's catalog
/// and health lists and an agent's services and checks.
const FILTERABLE: &[&str] = &[
    "/v1/catalog/nodes",
    "/v1/catalog/services",
    "/v1/catalog/service/",
    "/v1/catalog/connect/",
    "/v1/catalog/node/",
    "/v1/catalog/node-services/",
    "/v1/health/node/",
    "/v1/health/checks/",
    "/v1/health/service/",
    "/v1/health/connect/",
    "/v1/health/ingress/",
    "/v1/health/state/",
    "/v1/agent/services",
    "/v1/agent/checks",
];

/// Middleware: `?filter=` given to a path that does not filter is a 400 naming the path,
/// rather than an unfiltered answer, and `?dry-run` given to a write that has none is a 400
/// ([`dry_run_refusal`]). Servers, agents and the node's own routes all use it.
pub async fn refuse_filter(req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    match filter_refusal(req.uri()).or_else(|| dry_run_refusal(req.method(), req.uri())) {
        Some(refused) => refused,
        None => next.run(req).await,
    }
}

/// The writes that take `?dry-run` (method, path; a path ending in `/` is a prefix): config
/// entries, intentions and catalog registrations (`docs/dry-run.md`).
const DRY_RUNNABLE: &[(&str, &str)] = &[
    ("PUT", "/v1/config"),
    ("DELETE", "/v1/config/"),
    ("PUT", "/v1/connect/intentions/exact"),
    ("DELETE", "/v1/connect/intentions/exact"),
    ("POST", "/v1/connect/intentions"),
    ("PUT", "/v1/connect/intentions/"),
    ("DELETE", "/v1/connect/intentions/"),
    ("PUT", "/v1/catalog/register"),
    ("PUT", "/v1/catalog/deregister"),
];

/// Paths a node answers for itself, whatever it is: its agent's local services and checks,
/// node maintenance, its tokens, its config reload. A server never forwards them (to the
/// leader, to another datacenter): they are about the node that was asked.
pub fn node_local(path: &str) -> bool {
    const PREFIXES: [&str; 7] = [
        "/v1/agent/service/",
        "/v1/agent/services",
        "/v1/agent/check/",
        "/v1/agent/checks",
        "/v1/agent/health/service/",
        "/v1/agent/token/",
        "/v1/agent/maintenance",
    ];
    path == "/v1/agent/reload" || PREFIXES.iter().any(|p| path.starts_with(p))
}

/// What [`refuse_filter`] also answers: `?dry-run` on a write that has no dry run is a 400
/// saying that nothing was written, rather than the write done for real (an unknown
/// parameter is otherwise ignored, as Consul does). Reads ignore it.
pub fn dry_run_refusal(method: &axum::http::Method, uri: &axum::http::Uri) -> Option<axum::response::Response> {
    use axum::response::IntoResponse as _;
    if matches!(*method, axum::http::Method::GET | axum::http::Method::HEAD)
        || !uri.query().is_some_and(|q| q.contains("dry-run") || q.contains('%'))
        || !Params::parse(uri.query()).has("dry-run")
    {
        return None;
    }
    let path = uri.path();
    let takes = DRY_RUNNABLE.iter().any(|(m, p)| {
        method.as_str() == *m
            && if p.ends_with('/') {
                path.starts_with(p)
            } else {
                path == *p
            }
    });
    if takes {
        return None;
    }
    let text = format!(
        "dry-run: {method} {path} has no dry run, and nothing was written: dry runs cover config entries (/v1/config), intentions and catalog registrations (/v1/catalog/register, /v1/catalog/deregister)\n"
    );
    Some((axum::http::StatusCode::BAD_REQUEST, text).into_response())
}

/// What [`refuse_filter`] answers a request for `uri`: a 400 when it has a `?filter=` its
/// path does not take, else `None` (serve it). For a router that checks it in a middleware
/// of its own.
pub fn filter_refusal(uri: &axum::http::Uri) -> Option<axum::response::Response> {
    use axum::response::IntoResponse as _;
    // Most requests have no filter: no parsing then (a percent-encoded name is parsed).
    if !uri.query().is_some_and(|q| q.contains("filter") || q.contains('%')) {
        return None;
    }
    let given = Params::parse(uri.query())
        .get("filter")
        .is_some_and(|f| !f.trim().is_empty());
    let path = uri.path();
    let takes = FILTERABLE.iter().any(|p| {
        if p.ends_with('/') {
            path.starts_with(p)
        } else {
            path == *p
        }
    });
    if given && !takes {
        let text = format!("filter: {path} does not take a filter expression\n");
        return Some((axum::http::StatusCode::BAD_REQUEST, text).into_response());
    }
    None
}
