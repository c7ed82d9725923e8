//! `/v1/health/*`.

use crate::authz::{Authz, mark_filtered, retain};
use crate::query::{self, Params, ServiceFilters, service_key};
use crate::{Api, ApiError};
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use catalog::IndexKey;
use std::borrow::Cow;
use structs::{CheckServiceNode, HealthCheck, HealthStatus};

async fn service_health(
    api: Api,
    authz: Authz,
    name: String,
    q: Option<String>,
    connect: bool,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let filters = ServiceFilters::parse(&params)?;
    let expr = query::filter::<CheckServiceNode>(&params)?;
    let passing = params.bool("passing")?;
    let path = format!("/v1/health/{}/{name}", if connect { "connect" } else { "service" });
    // `?peer=`: the service as a peer exports it here.
    let peer = params.get("peer").filter(|p| !p.is_empty()).map(str::to_owned);
    if peer.is_some() && connect {
        return Err(ApiError::BadRequest(
            "peer: imported services have no connect instances here; ask /v1/health/service/:name?peer=".into(),
        ));
    }
    let key = match &peer {
        Some(peer) => catalog::IndexKey::PeerService(peer.clone(), name.clone()),
        None => service_key(&name, connect),
    };
    api.shared_answer(&path, &params, key, &authz, |state, a| {
        let rows = match &peer {
            Some(peer) => state.imported_health(peer, &name),
            None => state.health(&name, connect),
        };
        let mut result: Vec<CheckServiceNode> = rows
            .into_iter()
            .filter(|csn| filters.admits(&csn.service.tags, &csn.node.meta))
            .filter(|csn| !passing || csn.checks.iter().all(|c| c.status == HealthStatus::Passing))
            .filter(|csn| expr.matches(csn))
            .collect();
        let filtered = retain(&mut result, |csn| {
            a.service_read(&csn.service.service) && a.node_read(&csn.node.node)
        });
        for csn in &mut result {
            for c in &mut csn.checks {
                if let Cow::Owned(hidden) = shown(a, c) {
                    *c = hidden;
                }
            }
        }
        Ok((query::encode(&result, params.pretty())?, filtered))
    })
    .await
}

pub(crate) async fn service(
    State(api): State<Api>,
    authz: Authz,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    service_health(api, authz, name, q, false).await
}

pub(crate) async fn connect(
    State(api): State<Api>,
    authz: Authz,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    service_health(api, authz, name, q, true).await
}

pub(crate) async fn checks(
    State(api): State<Api>,
    authz: Authz,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let expr = query::filter::<HealthCheck>(&params)?;
    let a = authz.get()?;
    let key = IndexKey::Service(name.clone());
    let state = api.read(&params, &key).await?;
    let mut checks = state.service_checks(&name);
    checks.retain(|c| expr.matches(c));
    let filtered = retain(&mut checks, |c| readable(a, c));
    let checks: Vec<Cow<'_, HealthCheck>> = checks.iter().map(|c| shown(a, c)).collect();
    Ok(mark_filtered(
        query::json(&checks, Some(state.index_of(&key)), params.pretty()),
        filtered,
    ))
}

/// A check as a token sees it: the values of its HTTP headers (credentials, often) are
/// `<hidden>` unless the token may write the check's service (its node, for a node check).
fn shown<'a>(a: &acl::Authorizer, c: &'a HealthCheck) -> Cow<'a, HealthCheck> {
    let writable = if c.service_id.is_empty() {
        a.node_write(&c.node)
    } else {
        a.service_write(&c.service_name)
    };
    if c.definition.header.is_empty() || writable {
        return Cow::Borrowed(c);
    }
    let mut hidden = c.clone();
    for values in hidden.definition.header.values_mut() {
        for v in values.iter_mut() {
            structs::acl::HIDDEN_SECRET.clone_into(v);
        }
    }
    Cow::Owned(hidden)
}

/// A check is readable with `node:read` on its node, and `service:read` on its service if it
/// has one.
fn readable(a: &acl::Authorizer, c: &HealthCheck) -> bool {
    a.node_read(&c.node) && (c.service_id.is_empty() || a.service_read(&c.service_name))
}

pub(crate) async fn state(
    State(api): State<Api>,
    authz: Authz,
    Path(wanted): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let filter: Option<HealthStatus> = match wanted.as_str() {
        "any" => None,
        other => Some(other.parse().map_err(|_| {
            ApiError::BadRequest(format!(
                "state: unknown check state {other:?}: expected any, passing, warning, critical or maintenance"
            ))
        })?),
    };
    let expr = query::filter::<HealthCheck>(&params)?;
    let a = authz.get()?;
    let key = IndexKey::Checks;
    let state = api.read(&params, &key).await?;
    let mut checks: Vec<&HealthCheck> = state
        .all_checks()
        .map(|c| &**c)
        .filter(|c| filter.is_none_or(|s| c.status == s))
        .filter(|c| expr.matches(c))
        .collect();
    let filtered = retain(&mut checks, |c| readable(a, c));
    let checks: Vec<Cow<'_, HealthCheck>> = checks.into_iter().map(|c| shown(a, c)).collect();
    Ok(mark_filtered(
        query::json(&checks, Some(state.index_of(&key)), params.pretty()),
        filtered,
    ))
}

pub(crate) async fn node(
    State(api): State<Api>,
    authz: Authz,
    Path(node): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let expr = query::filter::<HealthCheck>(&params)?;
    let a = authz.get()?;
    let key = IndexKey::Node(node.clone());
    let state = api.read(&params, &key).await?;
    let mut checks: Vec<HealthCheck> = state
        .node_checks(&node)
        .iter()
        .filter(|c| expr.matches(c))
        .map(|c| (**c).clone())
        .collect();
    let filtered = retain(&mut checks, |c| readable(a, c));
    let checks: Vec<Cow<'_, HealthCheck>> = checks.iter().map(|c| shown(a, c)).collect();
    Ok(mark_filtered(
        query::json(&checks, Some(state.index_of(&key)), params.pretty()),
        filtered,
    ))
}
