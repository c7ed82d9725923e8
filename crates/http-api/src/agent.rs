//! `/v1/status/*`, the agent endpoint a server answers (self; the node serves metrics), and the agents'
//! liveness heartbeat (`PUT /v1/internal/node/heartbeat`, body `{"Node", "Address"}`).

use crate::authz::Authz;
use crate::query::{self, Params};
use crate::{Api, ApiError};
use axum::extract::{RawQuery, State};
use axum::response::Response;
use serde_json::json;

/// The leading server's address; with several servers over etcd, the one holding the
/// leadership lease ("" while none does, as Consul answers without a leader).
pub(crate) async fn leader(State(api): State<Api>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    // `?dc=` naming another datacenter is Consul's error, not this one's answer.
    query::check_common(&params, api.store.datacenter())?;
    let leader = match api.store.cluster() {
        Some(cluster) => cluster.status().leader.map(|l| l.address).unwrap_or_default(),
        None => api.config.server_addr.clone(),
    };
    Ok(query::json(&leader, None, params.pretty()))
}

/// Every server's address: this one alone, or every server registered in etcd.
pub(crate) async fn peers(State(api): State<Api>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    query::check_common(&params, api.store.datacenter())?;
    let peers: Vec<String> = match api.store.cluster() {
        Some(cluster) => cluster.status().servers.into_iter().map(|s| s.address).collect(),
        None => vec![api.config.server_addr.clone()],
    };
    Ok(query::json(&peers, None, params.pretty()))
}

pub(crate) async fn agent_self(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let c = &api.config;
    authz.need(|a| a.agent_read(&c.node_name), "agent:read", &c.node_name)?;
    let (addr, port) = c
        .server_addr
        .rsplit_once(':')
        .unwrap_or((c.server_addr.as_str(), "8300"));
    let body = json!({
        "Config": {
            "Datacenter": api.store.datacenter(),
            "NodeName": c.node_name,
            "NodeID": c.node_id,
            "Server": true,
            "Version": env!("CARGO_PKG_VERSION"),
            "Revision": "",
        },
        "DebugConfig": http_kit::DebugConfig::new(
            api.store.datacenter(),
            &c.node_name,
            &c.node_id,
            true,
            c.acl.enabled(),
            c.ports,
        ),
        "Member": {"Name": c.node_name, "Addr": addr, "Port": port.parse::<u16>().unwrap_or(8300), "Tags": {"role": "consul", "dc": api.store.datacenter()}, "Status": 1},
        "Meta": {},
        "Stats": {},
    });
    Ok(query::json(&body, None, params.pretty()))
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
pub(crate) struct Heartbeat {
    #[serde(rename = "Node")]
    node: String,
    #[serde(rename = "Address")]
    address: String,
}

pub(crate) async fn heartbeat(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    let hb: Heartbeat = query::decode(&body, "a heartbeat")?;
    if hb.node.is_empty() {
        return Err(ApiError::BadRequest("Node: required".into()));
    }
    if hb.address.is_empty() {
        return Err(ApiError::BadRequest("Address: required".into()));
    }
    authz.need(|a| a.node_write(&hb.node), "node:write", &hb.node)?;
    let Some(liveness) = &api.config.liveness else {
        return Err(ApiError::NotFound("node liveness is not tracked by this server".into()));
    };
    liveness.heartbeat(&hb.node, &hb.address).await?;
    Ok(query::json(&true, None, params.pretty()))
}

/// `PUT /v1/agent/force-leave/:node` (`operator:write`, as Consul's): the node leaves the
/// catalog now, with its services and checks. meshd has no gossip member list, so `?prune`
/// (accepted) changes nothing more; an agent still running on the node registers it again at
/// its next sync, as a Consul agent rejoins. An unknown node is a 404 naming it.
pub(crate) async fn force_leave(
    State(api): State<Api>,
    authz: Authz,
    axum::extract::Path(node): axum::extract::Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    params.bool("prune")?;
    authz.need(|a| a.operator_write(), "operator:write", "")?;
    if api.store.read().node(&node).is_none() {
        return Err(ApiError::NotFound(format!("No node found with name {node:?}")));
    }
    let req = structs::DeregisterRequest {
        node,
        ..Default::default()
    };
    api.store.write(catalog::Op::Deregister(req)).await?;
    Ok(axum::response::IntoResponse::into_response(axum::http::StatusCode::OK))
}
