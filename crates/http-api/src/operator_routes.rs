//! Operator views (`/v1/operator/*`) and network coordinates (`/v1/coordinate/*`) in
//! Consul's shapes. meshd has no Raft of its own: over etcd the servers are those
//! registered in etcd under live leases (etcd keeps the data and its quorum); alone, the
//! one server. It has no gossip either, so no network coordinates: the coordinate reads
//! answer empty, and an update is refused rather than dropped.

use crate::api::Api;
use crate::authz::Authz;
use crate::error::ApiError;
use crate::query::{self, Params};
use axum::extract::{RawQuery, State};
use axum::response::Response;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use structs::ServiceKind;

/// The query of an operator view, once the token is found to hold `operator:read`.
fn operator_read(api: &Api, authz: &Authz, q: Option<&str>) -> Result<Params, ApiError> {
    let params = Params::parse(q);
    query::check_common(&params, api.store.datacenter())?;
    authz.need(|a| a.operator_read(), "operator:read", "")?;
    Ok(params)
}

/// Every server: (name, address, whether it leads).
fn servers(api: &Api) -> Vec<(String, String, bool)> {
    match api.store.cluster() {
        Some(cluster) => {
            let status = cluster.status();
            let leader = status.leader.map(|l| l.name);
            status
                .servers
                .into_iter()
                .map(|s| {
                    let leads = leader.as_deref() == Some(s.name.as_str());
                    (s.name, s.address, leads)
                })
                .collect()
        }
        None => vec![(api.config.node_name.clone(), api.config.server_addr.clone(), true)],
    }
}

/// `GET /v1/operator/raft/configuration` (`operator:read`): the servers, in Raft's shape.
pub(crate) async fn raft_configuration(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = operator_read(&api, &authz, q.as_deref())?;
    let index = api.store.read().index;
    let servers: Vec<Value> = servers(&api)
        .into_iter()
        .map(|(name, address, leader)| {
            json!({"ID": name, "Node": name, "Address": address, "Leader": leader, "Voter": true,
                   "ProtocolVersion": "3", "LastIndex": index})
        })
        .collect();
    Ok(query::json(
        &json!({"Servers": servers, "Index": index}),
        Some(index),
        params.pretty(),
    ))
}

/// `GET /v1/operator/autopilot/health` (`operator:read`): every registered server is alive
/// (its etcd lease holds); any one of them can serve, so the cluster tolerates the loss of
/// all others (etcd's own quorum is etcd's to report).
pub(crate) async fn autopilot_health(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = operator_read(&api, &authz, q.as_deref())?;
    let index = api.store.read().index;
    let servers = servers(&api);
    let tolerance = servers.len().saturating_sub(1);
    let servers: Vec<Value> = servers
        .into_iter()
        .map(|(name, address, leader)| {
            json!({"ID": name, "Name": name, "Address": address, "SerfStatus": "alive",
                   "Version": env!("CARGO_PKG_VERSION"), "Leader": leader, "LastContact": "0s",
                   "LastTerm": 0, "LastIndex": index, "Healthy": true, "Voter": true})
        })
        .collect();
    let body = json!({"Healthy": true, "FailureTolerance": tolerance, "Servers": servers});
    Ok(query::json(&body, None, params.pretty()))
}

/// `GET /v1/operator/autopilot/state` (`operator:read`): Consul's autopilot state from the
/// same facts as the health view: every registered server is alive (its etcd lease holds)
/// and a voter, one of them leads. There is no Raft log here, so `LastTerm` is 0 and
/// `LastIndex` the catalog's index.
pub(crate) async fn autopilot_state(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = operator_read(&api, &authz, q.as_deref())?;
    let index = api.store.read().index;
    let servers = servers(&api);
    let tolerance = servers.len().saturating_sub(1);
    let leader = servers.iter().find(|s| s.2).map(|s| s.0.clone()).unwrap_or_default();
    let voters: Vec<&str> = servers.iter().map(|s| s.0.as_str()).collect();
    let by_id: serde_json::Map<String, Value> = servers
        .iter()
        .map(|(name, address, leads)| {
            let state = json!({"ID": name, "Name": name, "Address": address, "NodeStatus": "alive",
                               "Version": env!("CARGO_PKG_VERSION"), "LastContact": "0s", "LastTerm": 0,
                               "LastIndex": index, "Healthy": true, "StableSince": "0001-01-01T00:00:00Z",
                               "ReadReplica": false, "Status": if *leads { "leader" } else { "voter" },
                               "Meta": {}, "NodeType": "voter"});
            (name.clone(), state)
        })
        .collect();
    let body = json!({"Healthy": true, "FailureTolerance": tolerance, "OptimisticFailureTolerance": tolerance,
                      "Servers": by_id, "Leader": leader, "Voters": voters, "RedundancyZones": {},
                      "ReadReplicas": null, "Upgrade": null});
    Ok(query::json(&body, None, params.pretty()))
}

/// `GET /v1/operator/autopilot/configuration` (`operator:read`): Consul's defaults, which
/// is what applies: meshd has no Raft peers for autopilot to manage (a server that stops
/// leaves the list when its etcd lease expires; etcd manages its own members).
pub(crate) async fn autopilot_configuration(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = operator_read(&api, &authz, q.as_deref())?;
    let body = json!({"CleanupDeadServers": true, "LastContactThreshold": "200ms", "MaxTrailingLogs": 250,
                      "MinQuorum": 0, "ServerStabilizationTime": "10s", "RedundancyZoneTag": "",
                      "DisableUpgradeMigration": false, "UpgradeVersionTag": "",
                      "CreateIndex": 0, "ModifyIndex": 0});
    Ok(query::json(&body, None, params.pretty()))
}

/// `PUT /v1/operator/autopilot/configuration`: refused, saying why, rather than stored and
/// ignored.
pub(crate) async fn set_autopilot_configuration() -> ApiError {
    ApiError::BadRequest(
        "autopilot settings do not apply: meshd has no Raft peers to manage (servers leave when their etcd lease expires; etcd manages its own members)"
            .into(),
    )
}

/// `GET /v1/operator/usage` (`operator:read`): counts of services, instances and nodes.
pub(crate) async fn usage(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = operator_read(&api, &authz, q.as_deref())?;
    let state = api.store.read();
    let (mut names, mut instances, mut billable) = (BTreeSet::new(), 0u64, 0u64);
    let mut connect: BTreeMap<&str, u64> = [
        "api-gateway",
        "connect-native",
        "connect-proxy",
        "ingress-gateway",
        "mesh-gateway",
        "terminating-gateway",
    ]
    .into_iter()
    .map(|k| (k, 0))
    .collect();
    let mut nodes = 0u64;
    for node in state.nodes() {
        nodes += 1;
        for svc in state.node_services(&node.node) {
            names.insert(svc.service.clone());
            instances += 1;
            let kind = match svc.kind {
                ServiceKind::Typical if svc.connect.native => Some("connect-native"),
                ServiceKind::Typical => None,
                ServiceKind::ConnectProxy => Some("connect-proxy"),
                ServiceKind::MeshGateway => Some("mesh-gateway"),
                ServiceKind::TerminatingGateway => Some("terminating-gateway"),
                ServiceKind::IngressGateway => Some("ingress-gateway"),
                ServiceKind::ApiGateway => Some("api-gateway"),
            };
            if let Some(kind) = kind {
                *connect.entry(kind).or_default() += 1;
            }
            // The servers' own `consul` service is not billable, as in Consul.
            if matches!(svc.kind, ServiceKind::Typical) && svc.service != "consul" {
                billable += 1;
            }
        }
    }
    let dc = api.store.datacenter().to_owned();
    let body = json!({
        "Usage": {dc: {"Services": names.len(), "ServiceInstances": instances,
                        "ConnectServiceInstances": connect, "BillableServiceInstances": billable,
                        "Nodes": nodes}},
        "Index": state.index,
    });
    Ok(query::json(&body, Some(state.index), params.pretty()))
}

/// `GET /v1/coordinate/datacenters`: this datacenter, with no server coordinates.
pub(crate) async fn coordinate_datacenters(
    State(api): State<Api>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    query::check_common(&params, api.store.datacenter())?;
    let body = json!([{"Datacenter": api.store.datacenter(), "AreaID": "WAN", "Coordinates": []}]);
    Ok(query::json(&body, None, params.pretty()))
}

/// `GET /v1/coordinate/nodes`: no node has coordinates.
pub(crate) async fn coordinate_nodes(State(api): State<Api>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    query::check_common(&params, api.store.datacenter())?;
    let index = api.store.read().index;
    Ok(query::json(&json!([]), Some(index), params.pretty()))
}

/// `PUT /v1/coordinate/update`: refused, naming why (a coordinate meshd would not keep).
pub(crate) async fn coordinate_update() -> ApiError {
    ApiError::BadRequest(
        "network coordinates are not kept: meshd has no gossip layer to measure them, so /v1/coordinate reads answer empty"
            .into(),
    )
}

/// `/v1/operator/keyring` (any method): refused, saying why: keyring operations manage
/// gossip encryption keys, and meshd has no gossip pool (its servers and agents talk over
/// HTTP and gRPC, with TLS).
pub(crate) async fn keyring() -> ApiError {
    ApiError::BadRequest(
        "keyring operations do not apply: meshd has no gossip pool, so there are no gossip encryption keys (use TLS, docs/tls.md)"
            .into(),
    )
}
