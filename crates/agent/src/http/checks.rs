//! The agent's check endpoints (listing, registration, removal, TTL reports) and the local
//! health of its service instances (`/v1/agent/health/service/...`).

use super::answer::{HttpError, agent_service, decode, filter, filtered, json_response, need, ok_empty, resolve, text};
use crate::acl::Resolved;
use crate::local::{LocalCheck, LocalService};
use crate::runtime::Agent;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use http_kit::Params;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use structs::HealthStatus;
use structs::agent::CheckType;

/// A check as the agent shows it. Its HTTP headers' values (credentials, often) are
/// `<hidden>` unless `who` may write the check's service (the node, for a node check): the
/// values are kept only in the check's definition, never in what is synced to the catalog.
fn agent_check(agent: &Agent, who: &Resolved, c: &LocalCheck) -> Value {
    let reveal = if c.check.service_id.is_empty() {
        who.authz.node_write(&agent.config().node)
    } else {
        who.authz.service_write(&c.check.service_name)
    };
    let mut v = match (&c.definition, reveal) {
        (Some(d), true) if !d.header.is_empty() => {
            let mut check = c.check.clone();
            check.definition.header.clone_from(&d.header);
            serde_json::to_value(&check)
        }
        _ => serde_json::to_value(&c.check),
    }
    .unwrap_or(Value::Null);
    // Consul's agent shows a local check's raft indexes as 0.
    if let Value::Object(m) = &mut v {
        m.insert("CreateIndex".into(), Value::from(0));
        m.insert("ModifyIndex".into(), Value::from(0));
    }
    v
}

pub(super) async fn checks(State(agent): State<Agent>, q: Params, headers: HeaderMap) -> Result<Response, HttpError> {
    let expr = filter::<structs::HealthCheck>(&q)?;
    let (_, who) = resolve(&agent, &headers, &q).await?;
    let all = agent.state().checks();
    let all: Vec<_> = all.iter().filter(|(_, c)| expr.matches(&c.check)).collect();
    let total = all.len();
    let node = &agent.config().node;
    let out: BTreeMap<String, Value> = all
        .into_iter()
        .filter(|(_, c)| {
            if c.check.service_id.is_empty() {
                who.authz.node_read(node)
            } else {
                who.authz.service_read(&c.check.service_name)
            }
        })
        .map(|(id, c)| (id.clone(), agent_check(&agent, &who, c)))
        .collect();
    let dropped = out.len() != total;
    Ok(filtered(json_response(StatusCode::OK, &out), dropped))
}

pub(super) async fn register_check(
    State(agent): State<Agent>,
    q: Params,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, HttpError> {
    let def: CheckType = decode(&body, "a check definition")?;
    let (_, who) = resolve(&agent, &headers, &q).await?;
    agent.register_check_as(def, &who).await?;
    Ok(ok_empty())
}

pub(super) async fn deregister_check(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    q: Params,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let (_, who) = resolve(&agent, &headers, &q).await?;
    agent.deregister_check_as(&id, &who).await?;
    Ok(ok_empty())
}

/// `PUT /v1/agent/check/pass|warn|fail/:id`.
async fn ttl_route(
    agent: Agent,
    id: String,
    q: Params,
    headers: HeaderMap,
    status: HealthStatus,
) -> Result<Response, HttpError> {
    let (_, who) = resolve(&agent, &headers, &q).await?;
    let note = q.get("note").unwrap_or_default().to_owned();
    agent.ttl_update_as(&id, status, note, &who)?;
    Ok(ok_empty())
}

pub(super) async fn pass(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    q: Params,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    ttl_route(agent, id, q, headers, HealthStatus::Passing).await
}

pub(super) async fn warn(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    q: Params,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    ttl_route(agent, id, q, headers, HealthStatus::Warning).await
}

pub(super) async fn fail(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    q: Params,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    ttl_route(agent, id, q, headers, HealthStatus::Critical).await
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct CheckUpdate {
    #[serde(rename = "Status")]
    status: String,
    #[serde(rename = "Output")]
    output: String,
}

pub(super) async fn update(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    q: Params,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, HttpError> {
    let u: CheckUpdate = decode(&body, "a check update")?;
    let (_, who) = resolve(&agent, &headers, &q).await?;
    let status = match u.status.as_str() {
        "passing" => HealthStatus::Passing,
        "warning" => HealthStatus::Warning,
        "critical" => HealthStatus::Critical,
        other => {
            return Err(HttpError(
                StatusCode::BAD_REQUEST,
                format!("Status: {other:?} is not passing, warning or critical"),
            ));
        }
    };
    agent.ttl_update_as(&id, status, u.output, &who)?;
    Ok(ok_empty())
}

fn health_status_code(status: HealthStatus) -> StatusCode {
    match status {
        HealthStatus::Passing => StatusCode::OK,
        HealthStatus::Warning => StatusCode::TOO_MANY_REQUESTS,
        HealthStatus::Critical | HealthStatus::Maintenance => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// One instance's local health: the worst of its own checks and the node's checks.
fn instance_health(agent: &Agent, who: &Resolved, s: &LocalService) -> (HealthStatus, Value) {
    let checks: Vec<LocalCheck> = agent
        .state()
        .checks()
        .into_values()
        .filter(|c| c.check.service_id == s.service.id || c.check.service_id.is_empty())
        .collect();
    let worst = checks
        .iter()
        .map(|c| c.check.status)
        .max()
        .unwrap_or(HealthStatus::Passing);
    let worst = if checks.iter().any(|c| {
        let id = &c.check.check_id;
        id.starts_with(crate::runtime::MAINTENANCE_PREFIX) || id == crate::runtime::NODE_MAINTENANCE
    }) {
        HealthStatus::Maintenance
    } else {
        worst
    };
    let body = json!({
        "AggregatedStatus": worst,
        "Service": agent_service(agent, s),
        "Checks": checks.iter().map(|c| agent_check(agent, who, c)).collect::<Vec<_>>(),
    });
    (worst, body)
}

pub(super) async fn health_by_id(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    q: Params,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let (_, who) = resolve(&agent, &headers, &q).await?;
    let Some(s) = agent.state().service(&id) else {
        return Ok(text(StatusCode::NOT_FOUND, format!("ServiceId {id} not found\n")));
    };
    let name = &s.service.service;
    need(&who, who.authz.service_read(name), "service:read", name)?;
    Ok(health_of(&agent, &who, &s, &q))
}

fn health_of(agent: &Agent, who: &Resolved, s: &LocalService, q: &Params) -> Response {
    let (status, body) = instance_health(agent, who, s);
    if q.get("format").is_some_and(|f| f == "text") {
        return text(health_status_code(status), status.as_str().to_owned());
    }
    json_response(health_status_code(status), &body)
}

pub(super) async fn health_by_name(
    State(agent): State<Agent>,
    Path(name): Path<String>,
    q: Params,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let (_, who) = resolve(&agent, &headers, &q).await?;
    need(&who, who.authz.service_read(&name), "service:read", &name)?;
    Ok(health_by_name_answer(&agent, &who, &name, &q))
}

fn health_by_name_answer(agent: &Agent, who: &Resolved, name: &str, q: &Params) -> Response {
    let instances: Vec<(HealthStatus, Value)> = agent
        .state()
        .services()
        .values()
        .filter(|s| s.service.service == name)
        .map(|s| instance_health(agent, who, s))
        .collect();
    if instances.is_empty() {
        return text(StatusCode::NOT_FOUND, format!("ServiceName {name} Not Found\n"));
    }
    let worst = instances.iter().map(|(s, _)| *s).max().unwrap_or(HealthStatus::Passing);
    if q.get("format").is_some_and(|f| f == "text") {
        return text(health_status_code(worst), worst.as_str().to_owned());
    }
    let bodies: Vec<Value> = instances.into_iter().map(|(_, b)| b).collect();
    json_response(health_status_code(worst), &bodies)
}
