//! The agent's Connect endpoints: the CA's roots and leaf certificates from the agent cache,
//! and the proxies the agent runs (Consul 1.4's managed-proxy endpoint).

use super::answer::{HttpError, json_response, managed_view, need, resolve};
use crate::runtime::Agent;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use http_kit::Params;
use serde::Serialize;
use serde_json::Value;

/// Answers from one agent-cache entry, with Consul's index blocking: `?index=N` waits (up to
/// `?wait`) until the entry's index passes `N`. The answer carries `X-Consul-Index`.
async fn from_cache<T>(
    agent: &Agent,
    cache: &agent_cache::cache::Cache<T>,
    key: &T::Request,
    q: &Params,
) -> Result<Response, HttpError>
where
    T: agent_cache::cache::CacheType,
    T::Value: Serialize,
{
    // Consul's blocking rules, as the servers read them (jitter included).
    let blocking = q.blocking()?;
    let wait = blocking.wait_with_jitter();
    let min_index = blocking.index.map_or(0, |i| i.0);
    let mut watch = cache.watch(key);
    let deadline = tokio::time::Instant::now() + wait;
    let mut latest = None;
    loop {
        let next = tokio::select! {
            next = watch.next() => next,
            () = tokio::time::sleep_until(deadline), if latest.is_some() => break,
            () = agent.stopping() => None,
        };
        match next {
            Some(Ok(fetched)) => {
                let done = fetched.index > min_index;
                latest = Some(fetched);
                if done {
                    break;
                }
            }
            Some(Err(e @ agent_cache::cache::FetchError::PermissionDenied(_))) => {
                return Err(HttpError(StatusCode::FORBIDDEN, e.to_string()));
            }
            Some(Err(e)) => return Err(HttpError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
            None => {
                return Err(HttpError(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the agent is shutting down".into(),
                ));
            }
        }
    }
    let Some(fetched) = latest else {
        return Err(HttpError(
            StatusCode::SERVICE_UNAVAILABLE,
            "the agent is shutting down".into(),
        ));
    };
    let mut resp = json_response(StatusCode::OK, &fetched.value);
    if let Ok(v) = HeaderValue::from_str(&fetched.index.to_string()) {
        resp.headers_mut().insert(structs::wire::INDEX_HEADER, v);
    }
    Ok(resp)
}

/// `GET /v1/agent/connect/ca/roots`: the trust bundle, from the agent cache.
pub(super) async fn ca_roots(State(agent): State<Agent>, q: Params) -> Result<Response, HttpError> {
    from_cache(&agent, &agent.caches().roots, &agent_cache::types::RootsKey, &q).await
}

/// `GET /v1/agent/connect/ca/leaf/:service`: the service's leaf from the agent cache — its
/// key generated on this agent, the certificate signed by a server from a CSR (the private
/// key never travels to or from a server).
pub(super) async fn ca_leaf(
    State(agent): State<Agent>,
    Path(service): Path<String>,
    q: Params,
    headers: axum::http::HeaderMap,
) -> Result<Response, HttpError> {
    structs::validate::Validate::validate(&structs::NodeService {
        service: service.clone(),
        ..Default::default()
    })
    .map_err(|e| HttpError(StatusCode::BAD_REQUEST, e.to_string().replacen("Service", "service", 1)))?;
    let (token, who) = resolve(&agent, &headers, &q).await?;
    need(&who, who.authz.service_write(&service), "service:write", &service)?;
    // Signed with the caller's token: the servers check it again.
    let key = agent_cache::leaf::LeafKey {
        service,
        dns_sans: Vec::new(),
        token,
    };
    from_cache(&agent, &agent.caches().leaf, &key, &q).await
}

/// `GET /v1/agent/connect/proxy/:id` (Consul 1.4's managed-proxy endpoint): the proxy's
/// registration as the agent runs it, and its status.
pub(super) async fn managed_proxy(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    q: Params,
    headers: axum::http::HeaderMap,
) -> Result<Response, HttpError> {
    let (_, who) = resolve(&agent, &headers, &q).await?;
    let Some(s) = agent.state().service(&id) else {
        return Err(HttpError(
            StatusCode::NOT_FOUND,
            format!("unknown proxy service ID: {id}"),
        ));
    };
    need(
        &who,
        who.authz.service_write(&s.service.service),
        "service:write",
        &s.service.service,
    )?;
    let Some(managed) = &s.managed else {
        return Err(HttpError(
            StatusCode::NOT_FOUND,
            format!("service {id} is not a proxy this agent runs"),
        ));
    };
    let mut view = managed_view(&agent, &id, managed);
    if let Value::Object(m) = &mut view {
        m.insert("ProxyServiceID".into(), Value::String(id.clone()));
        m.insert(
            "TargetServiceID".into(),
            Value::String(s.service.proxy.destination_service_id.clone()),
        );
        m.insert(
            "TargetServiceName".into(),
            Value::String(s.service.proxy.destination_service_name.clone()),
        );
        m.insert("Config".into(), Value::Object(s.service.proxy.config.clone()));
    }
    Ok(json_response(StatusCode::OK, &view))
}
