//! The agent's HTTP API: Consul's local `/v1/agent/...` endpoints answered from the local
//! state, and every other `/v1/...` request forwarded to a server unchanged (method, path,
//! query, headers, body), blocking queries included, so applications only ever talk to their
//! local agent. Bad input is a 400 naming the field; a forwarded request no server answers is
//! a 500 with one line saying why.

use crate::runtime::Agent;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::{get, put};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use structs::agent::ServiceDefinition;

pub(crate) mod answer;
mod checks;
mod connect;
mod forward;
pub mod tokens;

pub use answer::{HttpError, request_token};
use answer::{
    MAX_BODY, agent_service, decode, filter, filtered, json_response, need, need_service_read, ok_empty, resolve, text,
    too_large,
};
use http_kit::Params;

/// The agent's routes.
pub fn router(agent: Agent) -> Router {
    let routes = local_routes()
        .route("/v1/agent/self", get(agent_self))
        .route("/v1/session/create", put(forward::session_create))
        .route("/v1/snapshot", put(forward::snapshot_restore))
        .route("/v1/event/list", get(forward::event_list))
        .route("/v1/agent/members", get(members))
        .route("/v1/agent/token/{kind}", put(tokens::set_token))
        .route("/v1/agent/connect/ca/roots", get(connect::ca_roots))
        .route("/v1/agent/connect/proxy/{id}", get(connect::managed_proxy))
        .route("/v1/agent/connect/ca/leaf/{service}", get(connect::ca_leaf))
        // The dashboard: its catalog pages read through the forwarding below, its proxies
        // page this agent's own streams.
        .merge(dashboard::routes())
        .fallback(forward::forward);
    with_limits(routes, agent)
}

/// The routes a server's agent serves beside the server's API (a Consul server is an agent
/// too): the node's local services and checks. The server answers the rest itself
/// (`/v1/agent/self`, members, the CA, tokens).
pub fn server_local_router(agent: Agent) -> Router {
    with_limits(local_routes(), agent)
}

/// The node's local services and checks, and maintenance.
fn local_routes() -> Router<Agent> {
    Router::new()
        .route("/v1/agent/service/register", put(register_service))
        .route("/v1/agent/service/deregister/{id}", put(deregister_service))
        .route("/v1/agent/service/maintenance/{id}", put(maintenance))
        .route("/v1/agent/maintenance", put(node_maintenance))
        .route("/v1/agent/services", get(services))
        .route("/v1/agent/service/{id}", get(service))
        .route("/v1/agent/checks", get(checks::checks))
        .route("/v1/agent/check/register", put(checks::register_check))
        .route("/v1/agent/check/deregister/{id}", put(checks::deregister_check))
        .route("/v1/agent/check/pass/{id}", put(checks::pass))
        .route("/v1/agent/check/warn/{id}", put(checks::warn))
        .route("/v1/agent/check/fail/{id}", put(checks::fail))
        .route("/v1/agent/check/update/{id}", put(checks::update))
        .route("/v1/agent/health/service/name/{name}", get(checks::health_by_name))
        .route("/v1/agent/health/service/id/{id}", get(checks::health_by_id))
}

/// `?filter=` refused where a route does not filter, the body limit (a 413 with a plain
/// reason), and the agent as the routes' state.
fn with_limits(routes: Router<Agent>, agent: Agent) -> Router {
    routes
        .layer(axum::middleware::from_fn(http_kit::refuse_filter))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::map_response(|resp: Response| async move {
            if resp.status() != StatusCode::PAYLOAD_TOO_LARGE {
                return resp;
            }
            text(StatusCode::PAYLOAD_TOO_LARGE, too_large())
        }))
        .with_state(agent)
}

/// How long a registration's answer waits for the servers to have it (Consul's agents sync
/// before answering too); past it the answer goes and the change syncs after.
const SYNC_BEFORE_ANSWER: std::time::Duration = std::time::Duration::from_secs(5);

async fn register_service(
    State(agent): State<Agent>,
    q: Params,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, HttpError> {
    let mut def: ServiceDefinition = decode(&body, "a service definition")?;
    let (token, who) = resolve(&agent, &headers, &q).await?;
    // The registration's token syncs the service and serves its proxy.
    if def.token.is_none() {
        def.token = token;
    }
    // What the caller may write (the new names and everything replaced) is checked by the
    // agent under its registration lock.
    agent
        .register_service_as(def, q.bool("replace-existing-checks")?, &who)
        .await?;
    agent.sync_changes(SYNC_BEFORE_ANSWER).await;
    Ok(ok_empty())
}

async fn deregister_service(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    q: Params,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let (_, who) = resolve(&agent, &headers, &q).await?;
    agent.deregister_service_as(&id, &who).await?;
    agent.sync_changes(SYNC_BEFORE_ANSWER).await;
    Ok(ok_empty())
}

async fn maintenance(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    q: Params,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let (_, who) = resolve(&agent, &headers, &q).await?;
    let enable = enable_param(&q)?;
    let reason = q.get("reason").unwrap_or_default();
    agent.set_maintenance_as(&id, enable, reason, &who).await?;
    Ok(ok_empty())
}

/// `PUT /v1/agent/maintenance?enable=&reason=`: the whole node (`node:write`).
async fn node_maintenance(State(agent): State<Agent>, q: Params, headers: HeaderMap) -> Result<Response, HttpError> {
    let (_, who) = resolve(&agent, &headers, &q).await?;
    let enable = enable_param(&q)?;
    let reason = q.get("reason").unwrap_or_default();
    agent.set_node_maintenance(enable, reason, Some(&who)).await?;
    Ok(ok_empty())
}

/// Maintenance's required `?enable=` (any of Go's boolean spellings).
fn enable_param(q: &Params) -> Result<bool, HttpError> {
    Ok(q.required_bool("enable")?)
}

async fn services(State(agent): State<Agent>, q: Params, headers: HeaderMap) -> Result<Response, HttpError> {
    let expr = filter::<structs::NodeService>(&q)?;
    let (_, who) = resolve(&agent, &headers, &q).await?;
    let all = agent.state().services();
    let mut all: Vec<_> = all.iter().filter(|(_, s)| expr.matches(&s.service)).collect();
    let total = all.len();
    all.retain(|(_, s)| who.authz.service_read(&s.service.service));
    let out: BTreeMap<String, Value> = all
        .into_iter()
        .map(|(id, s)| (id.clone(), agent_service(&agent, s)))
        .collect();
    let dropped = out.len() != total;
    Ok(filtered(json_response(StatusCode::OK, &out), dropped))
}

/// A blocking query's `?wait` (default 5 min, at most 10; Consul's rules, from the kit).
fn wait_param(q: &Params) -> Result<std::time::Duration, HttpError> {
    Ok(q.blocking()?.wait)
}

/// A service's view with its content hash (hex of a stable hash of the JSON).
fn service_view(agent: &Agent, id: &str) -> Option<(Value, String)> {
    use std::hash::{Hash, Hasher};
    let mut view = agent_service(agent, &agent.state().service(id)?);
    let mut h = std::hash::DefaultHasher::new();
    view.to_string().hash(&mut h);
    let hash = format!("{:016x}", h.finish());
    if let Value::Object(m) = &mut view {
        m.insert("ContentHash".into(), Value::String(hash.clone()));
    }
    Some((view, hash))
}

/// `GET /v1/agent/service/:id`, with Consul's hash-based blocking: `?hash=H` waits (up to
/// `?wait`, default 5 min, at most 10) until the service's content hash differs from `H`.
async fn service(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    q: Params,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let wait = wait_param(&q)?;
    // A managed proxy reads its own registration (for its bootstrap) with its local token,
    // which this agent alone knows and which grants nothing else.
    let own_local_token = answer::request_token(&headers, &q).is_some_and(|t| {
        agent
            .state()
            .service(&id)
            .and_then(|s| s.managed)
            .and_then(|m| m.local_token)
            .is_some_and(|local| local == t)
    });
    if !own_local_token {
        need_service_read(&agent, &headers, &q, &id).await?;
    }
    let deadline = tokio::time::Instant::now() + wait;
    let mut changes = agent.state().subscribe();
    loop {
        changes.borrow_and_update();
        let Some((view, hash)) = service_view(&agent, &id) else {
            return Err(HttpError(StatusCode::NOT_FOUND, format!("unknown service ID: {id}")));
        };
        let unchanged = q.get("hash").is_some_and(|h| *h == hash);
        if unchanged {
            let woke = tokio::select! {
                r = changes.changed() => r.is_ok(),
                () = tokio::time::sleep_until(deadline) => false,
                () = agent.stopping() => false,
            };
            if woke {
                continue;
            }
        }
        let mut resp = json_response(StatusCode::OK, &view);
        if let Ok(v) = HeaderValue::from_str(&hash) {
            resp.headers_mut().insert("X-Consul-ContentHash", v);
        }
        return Ok(resp);
    }
}

fn member(name: &str, addr: &str, role: &str, dc: &str, alive: bool) -> http_kit::Member {
    http_kit::Member::new(name, addr, role, dc, alive)
}

async fn agent_self(State(agent): State<Agent>, q: Params, headers: HeaderMap) -> Result<Response, HttpError> {
    let (_, who) = resolve(&agent, &headers, &q).await?;
    let c = agent.config();
    need(&who, who.authz.agent_read(&c.node), "agent:read", &c.node)?;
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "Config": {
                "Datacenter": c.datacenter,
                "NodeName": c.node,
                "NodeID": c.node_id.clone().unwrap_or_default(),
                "Server": false,
                "Version": env!("CARGO_PKG_VERSION"),
                "Revision": "",
            },
            "DebugConfig": http_kit::DebugConfig::new(
                &c.datacenter,
                &c.node,
                c.node_id.as_deref().unwrap_or_default(),
                false,
                agent.acl().enabled(),
                c.ports,
            ),
            "Member": member(&c.node, &c.advertise, "node", &c.datacenter, true),
            "Meta": {},
            "Stats": {"agent": {"services": agent.state().counts().0.to_string(), "checks": agent.state().counts().1.to_string()}},
        }),
    ))
}

/// `GET /v1/agent/members`: what a Consul client's LAN pool holds, without gossip: this
/// node, the servers it joined (by address, alive while they answer it), then every other
/// node the servers keep alive (their member list, asked with the caller's token). With no
/// server answering, this node and the servers, marked failed.
async fn members(State(agent): State<Agent>, q: Params, headers: HeaderMap) -> Result<Response, HttpError> {
    let (token, who) = resolve(&agent, &headers, &q).await?;
    let c = agent.config();
    // Asked first: the servers' reachability below is then this very attempt's.
    let mut dropped = false;
    let others: Vec<Value> = match agent.servers().get_as(token.as_ref(), "/v1/agent/members").await {
        Ok(answer) => {
            dropped |= answer.filtered;
            serde_json::from_slice::<Vec<Value>>(&answer.body)
                .unwrap_or_default()
                .into_iter()
                .filter(|m| m["Tags"]["role"] == "node" && m["Name"] != c.node.as_str())
                .collect()
        }
        Err(_) => Vec::new(),
    };
    let mut out = Vec::new();
    if who.authz.node_read(&c.node) {
        out.push(member(&c.node, &c.advertise, "node", &c.datacenter, true));
    } else {
        dropped = true;
    }
    for (i, base) in agent.servers().addresses().iter().enumerate() {
        let addr = base.trim_start_matches("http://").trim_start_matches("https://");
        if who.authz.node_read(addr) {
            out.push(member(addr, addr, "consul", &c.datacenter, agent.servers().answered(i)));
        } else {
            dropped = true;
        }
    }
    let mut out: Vec<Value> = out
        .iter()
        .map(|m| serde_json::to_value(m).unwrap_or(Value::Null))
        .collect();
    out.extend(others);
    Ok(filtered(json_response(StatusCode::OK, &out), dropped))
}
