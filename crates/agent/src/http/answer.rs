//! What the agent's handlers share: the error answer, plain and JSON answers, the body
//! decoder, the caller's token and its permissions, and a local service's view.

use crate::local::LocalService;
use crate::runtime::{Agent, AgentError};
use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_kit::Params;
use serde::Serialize;
use serde_json::{Value, json};

/// Largest accepted request body, bytes.
pub(crate) const MAX_BODY: usize = 512 * 1024;

/// A 413's body: it names the limit.
pub(crate) fn too_large() -> String {
    http_kit::too_large(MAX_BODY)
}

/// An error answer: plain text with Consul's status codes.
#[derive(Debug)]
pub struct HttpError(pub(crate) StatusCode, pub(crate) String);

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        text(self.0, format!("{}\n", self.1))
    }
}

impl From<http_kit::BadParam> for HttpError {
    fn from(e: http_kit::BadParam) -> Self {
        HttpError(StatusCode::BAD_REQUEST, e.0)
    }
}

impl From<AgentError> for HttpError {
    fn from(e: AgentError) -> Self {
        let status = match &e {
            AgentError::Invalid(_) => StatusCode::BAD_REQUEST,
            AgentError::NotFound(_) => StatusCode::NOT_FOUND,
            AgentError::Denied(_) => StatusCode::FORBIDDEN,
            AgentError::Persist(_) | AgentError::DataDir { .. } | AgentError::ServersCa(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        HttpError(status, e.to_string())
    }
}

pub(crate) fn text(status: StatusCode, body: String) -> Response {
    let mut resp = (status, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

pub(crate) fn json_response<T: Serialize>(status: StatusCode, value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => {
            let mut resp = (status, body).into_response();
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            resp
        }
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode the answer: {e}\n"),
        ),
    }
}

pub(crate) fn ok_empty() -> Response {
    StatusCode::OK.into_response()
}

pub(crate) fn decode<T: serde::de::DeserializeOwned>(body: &Bytes, what: &str) -> Result<T, HttpError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(HttpError(
            StatusCode::BAD_REQUEST,
            format!("request body is empty: expected {what}"),
        ));
    }
    structs::json::from_slice(body)
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("request decode failed: {e}")))
}

/// The request's token, if it names one (see [`http_kit::token`]).
pub fn request_token(headers: &HeaderMap, q: &Params) -> Option<::acl::Token> {
    http_kit::token(headers, q)
}

/// The token a request runs with (its own, else the default token) and what it may do.
pub(crate) async fn resolve(
    agent: &Agent,
    headers: &HeaderMap,
    q: &Params,
) -> Result<(Option<::acl::Token>, crate::acl::Resolved), HttpError> {
    let token = request_token(headers, q).or_else(|| agent.acl().default_token());
    match agent.acl().resolve(token.as_ref()).await {
        Ok(r) => Ok((token, r)),
        Err(crate::acl::AclError::NotFound) => Err(HttpError(StatusCode::FORBIDDEN, ::acl::ACL_NOT_FOUND.into())),
        Err(e @ crate::acl::AclError::Unavailable(_)) => Err(HttpError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())),
    }
}

/// Refuses with Consul's `Permission denied` unless `allowed`.
pub(crate) fn need(who: &crate::acl::Resolved, allowed: bool, permission: &str, target: &str) -> Result<(), HttpError> {
    if allowed {
        return Ok(());
    }
    Err(HttpError(
        StatusCode::FORBIDDEN,
        ::acl::denied(&who.accessor, permission, target),
    ))
}

/// Marks a listing ACLs filtered.
pub(crate) fn filtered(mut resp: Response, filtered: bool) -> Response {
    if filtered {
        resp.headers_mut()
            .insert(structs::wire::FILTERED_HEADER, HeaderValue::from_static("true"));
    }
    resp
}

/// Checks `service:read` on local service `id`'s name; an unknown id passes (the handler
/// answers its 404). Writes are checked by the agent itself, under its registration lock.
pub(crate) async fn need_service_read(
    agent: &Agent,
    headers: &HeaderMap,
    q: &Params,
    id: &str,
) -> Result<crate::acl::Resolved, HttpError> {
    let (_, who) = resolve(agent, headers, q).await?;
    if let Some(s) = agent.state().service(id) {
        let name = &s.service.service;
        need(&who, who.authz.service_read(name), "service:read", name)?;
    }
    Ok(who)
}

/// A service as `/v1/agent/services` shows it (Consul's `AgentService`).
pub(crate) fn agent_service(agent: &Agent, s: &LocalService) -> Value {
    let mut v = serde_json::to_value(&s.service).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.remove("CreateIndex");
        m.remove("ModifyIndex");
        // Consul's `AgentService`: the port always, no peer, the proxy of proxies and
        // gateways only, `Connect` only for a native service.
        m.entry("Port").or_insert(Value::from(0));
        m.remove("PeerName");
        if s.service.kind == structs::ServiceKind::Typical {
            m.remove("Proxy");
        } else if let Some(Value::Object(proxy)) = m.get_mut("Proxy") {
            agent_proxy_view(proxy);
        }
        m.remove("Connect");
        if s.service.connect.native {
            m.insert("Connect".into(), serde_json::json!({"Native": true}));
        }
        m.insert("Datacenter".into(), Value::String(agent.config().datacenter.clone()));
        if let Some(managed) = &s.managed {
            m.insert("ManagedProxy".into(), managed_view(agent, &s.service.id, managed));
        }
    }
    v
}

/// The agent API's proxy block (Consul's `AgentServiceConnectProxyConfig`): its `Mode` and
/// its upstreams' `DestinationType` and `Datacenter` are omitted when empty, where the
/// catalog's shows them.
fn agent_proxy_view(proxy: &mut serde_json::Map<String, Value>) {
    let empty = |v: Option<&Value>| v.is_some_and(|v| v.as_str() == Some(""));
    if empty(proxy.get("Mode")) {
        proxy.remove("Mode");
    }
    if let Some(Value::Array(upstreams)) = proxy.get_mut("Upstreams") {
        for u in upstreams.iter_mut().filter_map(Value::as_object_mut) {
            for key in ["DestinationType", "Datacenter"] {
                if empty(u.get(key)) {
                    u.remove(key);
                }
            }
        }
    }
}

/// `?filter=`, parsed for the records an endpoint lists; a bad expression is a 400 naming
/// its position. Absent, it matches everything.
pub(crate) fn filter<T: structs::filter::Record>(q: &Params) -> Result<structs::Filter<T>, HttpError> {
    structs::Filter::parse(q.get("filter").unwrap_or_default())
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("filter: {e}")))
}

/// A managed proxy: how it runs and its status (pid, state, restarts, last exit).
pub(crate) fn managed_view(agent: &Agent, id: &str, managed: &crate::local::Managed) -> Value {
    let status = agent.managed().map_or_else(
        || json!({"State": "not started", "Error": "this agent does not run managed proxies"}),
        |m| {
            m.status(id).map_or_else(
                || json!({"State": "starting"}),
                |st| serde_json::to_value(st).unwrap_or(Value::Null),
            )
        },
    );
    json!({
        "ExecMode": "daemon",
        "Command": if managed.command.is_empty() { json!("meshd connect envoy (default)") } else { json!(managed.command) },
        "Status": status,
    })
}
