//! Several datacenters: the endpoints over what this server knows of the others
//! (`catalog::federation`), and the primary's signing of secondary datacenters'
//! intermediates.
//!
//! The primary datacenter's servers hold every datacenter's state; each secondary's servers
//! send theirs to the primary (`PUT /v1/internal/federation-state`) and keep a copy of the
//! primary's list (a blocking `GET /v1/internal/federation-states`), so every server knows
//! every datacenter. The loop that sends and copies them is the server's (`server-mode`).

use crate::api::Api;
use crate::authz::Authz;
use crate::error::ApiError;
use crate::query::{self, Params};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use structs::federation::FederationState;

/// The routes of several datacenters: federation states, intermediates, replication.
pub(crate) fn add(r: &mut crate::api::Routes) {
    use crate::replication;
    use axum::routing::{get, put};
    r.add("/v1/internal/federation-states", get(list));
    r.add("/v1/internal/federation-states/mesh-gateways", get(mesh_gateways));
    r.add("/v1/internal/federation-state/{dc}", get(one));
    r.add("/v1/internal/federation-state", put(put_state));
    r.add("/v1/internal/ca/intermediate", put(sign_intermediate));
    r.add(
        "/v1/internal/replication/config-entries",
        get(replication::config_entries),
    );
    r.add("/v1/internal/replication/acl", get(replication::acl));
    r.add("/v1/operator/replication", get(replication::status));
}

/// `GET /v1/internal/federation-states`: every datacenter's state (`operator:read`),
/// blocking on their index.
pub(crate) async fn list(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    authz.need(|a| a.operator_read(), "operator:read", "")?;
    let fed = api.store.federation();
    let blocking = params.blocking()?;
    let states = match blocking.index {
        Some(after) => fed.wait(after.0, blocking.wait_with_jitter()).await,
        None => fed.states(),
    };
    let all: Vec<&FederationState> = states.by_dc.values().map(|s| &**s).collect();
    Ok(query::json(&all, Some(structs::Index(states.index)), params.pretty()))
}

/// `GET /v1/internal/federation-states/mesh-gateways`: every datacenter's mesh gateways by
/// datacenter (what an agent's proxies route other datacenters through), blocking on the
/// states' index; gateways whose service the token may not read are left out.
pub(crate) async fn mesh_gateways(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let a = authz.get()?;
    let fed = api.store.federation();
    let blocking = params.blocking()?;
    let states = match blocking.index {
        Some(after) => fed.wait(after.0, blocking.wait_with_jitter()).await,
        None => fed.states(),
    };
    let mut filtered = false;
    let by_dc: std::collections::BTreeMap<&str, Vec<&structs::CheckServiceNode>> = states
        .by_dc
        .iter()
        .map(|(dc, s)| {
            let readable: Vec<_> = s
                .mesh_gateways
                .iter()
                .filter(|g| a.service_read(&g.service.service))
                .collect();
            filtered |= readable.len() < s.mesh_gateways.len();
            (dc.as_str(), readable)
        })
        .collect();
    Ok(crate::authz::mark_filtered(
        query::json(&by_dc, Some(structs::Index(states.index)), params.pretty()),
        filtered,
    ))
}

/// `GET /v1/internal/federation-state/:dc`: one datacenter's state (`operator:read`).
pub(crate) async fn one(
    State(api): State<Api>,
    authz: Authz,
    Path(dc): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    authz.need(|a| a.operator_read(), "operator:read", "")?;
    let states = api.store.federation().states();
    let state = states
        .by_dc
        .get(&dc)
        .ok_or_else(|| ApiError::NotFound(format!("no federation state for datacenter {dc:?}")))?;
    Ok(query::json(
        &**state,
        Some(structs::Index(states.index)),
        params.pretty(),
    ))
}

/// `PUT /v1/internal/federation-state`: a secondary datacenter's state, sent by its servers
/// to the primary's (`operator:write`: a state says where requests for a datacenter go,
/// tokens with them). Only the primary takes them, and never for itself.
pub(crate) async fn put_state(State(api): State<Api>, authz: Authz, body: Bytes) -> Result<Response, ApiError> {
    authz.need(|a| a.operator_write(), "operator:write", "")?;
    let fed = api.store.federation();
    let state: FederationState = query::decode(&body, "a federation state")?;
    state.check().map_err(ApiError::BadRequest)?;
    if !fed.is_primary() {
        return Err(ApiError::BadRequest(format!(
            "this server is in datacenter {:?}: federation states are sent to the primary, {:?}",
            fed.local(),
            fed.primary()
        )));
    }
    if state.datacenter == fed.local() {
        return Err(ApiError::BadRequest(format!(
            "Datacenter: {:?} is the primary itself; its state is its own servers'",
            state.datacenter
        )));
    }
    fed.put(state);
    Ok(query::json(&true, None, false))
}

/// `PUT /v1/internal/ca/intermediate` body.
#[derive(serde::Deserialize)]
struct IntermediateRequest {
    #[serde(rename = "CSR", alias = "csr", default)]
    csr: String,
}

/// Its answer.
#[derive(serde::Serialize)]
struct IntermediateAnswer {
    #[serde(rename = "CertPEM")]
    cert_pem: String,
    #[serde(rename = "RootID")]
    root_id: String,
}

/// `PUT /v1/internal/ca/intermediate`: the primary signs a secondary datacenter's
/// intermediate for the key of its CSR (`operator:write`; see `catalog::ca`). A server of a
/// secondary datacenter refuses: its CA follows the primary's.
pub(crate) async fn sign_intermediate(State(api): State<Api>, authz: Authz, body: Bytes) -> Result<Response, ApiError> {
    authz.need(|a| a.operator_write(), "operator:write", "")?;
    let fed = api.store.federation();
    if !fed.is_primary() {
        return Err(ApiError::BadRequest(format!(
            "this server is in datacenter {:?}: intermediates are signed by the primary, {:?}",
            fed.local(),
            fed.primary()
        )));
    }
    let request: IntermediateRequest = query::decode(&body, "{\"CSR\": PEM}")?;
    if request.csr.trim().is_empty() {
        return Err(ApiError::BadRequest(
            "CSR: missing (expected a PEM certificate signing request)".into(),
        ));
    }
    let (cert_pem, root_id) = api
        .store
        .sign_intermediate(&request.csr)
        .map_err(crate::connect::csr_error)?;
    Ok(query::json(&IntermediateAnswer { cert_pem, root_id }, None, false))
}
