//! `/v1/status/*`, the agent endpoint a server answers (self; the node serves metrics), and the agents'
//! liveness heartbeat (`PUT /v1/internal/node/heartbeat`, body `{"Node", "Address"}`).

use crate::authz::Authz;
use crate::query::{self, Params};
use crate::{Api, ApiError};
use axum::extract::{Path, RawQuery, State};
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

/// `GET /v1/agent/members` on a server (`?wan`: the servers alone, as Consul's WAN pool):
/// the servers (each alive: it holds its etcd lease, or it is this one), then every node an
/// agent keeps alive (it carries the liveness check), alive while that check passes. meshd
/// has no gossip: this is the catalog's view of the same members. Each needs `node:read`;
/// the others are left out and the answer marked filtered.
pub(crate) async fn members(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    query::check_common(&params, api.store.datacenter())?;
    let a = authz.get()?;
    let dc = api.store.datacenter();
    let servers: Vec<(String, String)> = match api.store.cluster() {
        Some(cluster) => cluster
            .status()
            .servers
            .into_iter()
            .map(|s| (s.name, s.address))
            .collect(),
        None => vec![(api.config.node_name.clone(), api.config.server_addr.clone())],
    };
    let mut out: Vec<http_kit::Member> = servers
        .iter()
        .map(|(name, addr)| http_kit::Member::new(name, addr, "consul", dc, true))
        .collect();
    if !params.has("wan") {
        let state = api.store.read();
        for node in state.nodes() {
            let liveness = state
                .node_checks(&node.node)
                .into_iter()
                .find(|c| c.check_id == catalog::liveness::CHECK_ID && c.service_id.is_empty());
            if let Some(check) = liveness {
                let alive = check.status == structs::HealthStatus::Passing;
                out.push(http_kit::Member::new(&node.node, &node.address, "node", dc, alive));
            }
        }
    }
    let before = out.len();
    out.retain(|m| a.node_read(&m.name));
    let filtered = out.len() != before;
    Ok(crate::authz::mark_filtered(
        query::json(&out, None, params.pretty()),
        filtered,
    ))
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

/// `PUT /v1/agent/join/:address`: refused with the reason. meshd has no gossip pool: agents
/// reach servers through `-retry-join` (their HTTP addresses), and servers share a catalog
/// over etcd or federate over WAN links (`-retry-join-wan`).
pub(crate) async fn join(Path(address): Path<String>) -> ApiError {
    ApiError::BadRequest(format!(
        "agent join {address:?}: meshd has no gossip pool to join; an agent finds servers with -retry-join (their HTTP addresses), servers share a catalog over etcd (-store etcd) or federate with -retry-join-wan"
    ))
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
