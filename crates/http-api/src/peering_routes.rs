//! `/v1/peering`: Consul's cluster peering lifecycle (token, establish, read, list,
//! delete), over the server's [`peering::Peerings`].

use crate::authz::Authz;
use crate::query::{self, Params};
use crate::{Api, ApiError};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use catalog::IndexKey;
use peering::PeeringError;
use structs::peering::{EstablishRequest, GenerateTokenRequest, GenerateTokenResponse, Peering};

fn peerings(api: &Api) -> Result<&std::sync::Arc<peering::Peerings>, ApiError> {
    api.config
        .peering
        .as_ref()
        .ok_or_else(|| ApiError::BadRequest("peering is not available on this server".into()))
}

impl From<PeeringError> for ApiError {
    fn from(e: PeeringError) -> Self {
        match e {
            PeeringError::Write(e) => e.into(),
            PeeringError::Invalid(m) => ApiError::BadRequest(m),
            e @ PeeringError::Refused(_) => ApiError::BadRequest(format!("PeeringToken: {e}")),
            e @ PeeringError::Unreachable(_) => ApiError::Internal(e.to_string()),
        }
    }
}

fn need_write(authz: &Authz) -> Result<(), ApiError> {
    authz.need(|a| a.peering_write(), "peering:write", "")
}

fn need_read(authz: &Authz) -> Result<(), ApiError> {
    authz.need(|a| a.peering_read(), "peering:read", "")
}

/// `POST /v1/peering/token`.
pub(crate) async fn token(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    need_write(&authz)?;
    let req: GenerateTokenRequest = query::decode(&body, "the peering arguments")?;
    let peering_token = peerings(&api)?.generate_token(&req).await?;
    Ok(query::json(
        &GenerateTokenResponse { peering_token },
        None,
        params.pretty(),
    ))
}

/// `POST /v1/peering/establish`.
pub(crate) async fn establish(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref())?;
    need_write(&authz)?;
    let req: EstablishRequest = query::decode(&body, "the peering arguments")?;
    peerings(&api)?.establish(&req).await?;
    Ok(query::json(&serde_json::json!({}), None, params.pretty()))
}

fn shown(api: &Api, state: &catalog::State, peering: &Peering) -> Result<Peering, ApiError> {
    Ok(peerings(api)?.shown(state, peering.clone()))
}

/// `GET /v1/peering/:name`.
pub(crate) async fn get(
    State(api): State<Api>,
    authz: Authz,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    need_read(&authz)?;
    let key = IndexKey::Peerings;
    let state = api.read(&params, &key).await?;
    let stored = state
        .peering(&name)
        .ok_or_else(|| ApiError::NotFound(format!("Peering not found for {name:?}")))?;
    let peering = shown(&api, &state, &stored.peering)?;
    Ok(query::json(&peering, Some(state.index_of(&key)), params.pretty()))
}

/// `GET /v1/peerings`.
pub(crate) async fn list(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    need_read(&authz)?;
    let key = IndexKey::Peerings;
    let state = api.read(&params, &key).await?;
    let list = state
        .peerings()
        .map(|p| shown(&api, &state, &p.peering))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(query::json(&list, Some(state.index_of(&key)), params.pretty()))
}

/// `DELETE /v1/peering/:name`: 200 whether or not it exists, as Consul's.
pub(crate) async fn delete(
    State(api): State<Api>,
    authz: Authz,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    api.write_params(q.as_deref())?;
    need_write(&authz)?;
    peerings(&api)?.delete(&name).await?;
    Ok(axum::http::StatusCode::OK.into_response())
}

/// `GET /v1/internal/peering/upstream/:peer/:service` (meshd's own): what an agent's
/// sidecar needs for an upstream a peer exports (the service and the peer's trust bundle);
/// `service:read` on the service; blocks on the import.
pub(crate) async fn upstream(
    State(api): State<Api>,
    authz: Authz,
    Path((peer, service)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    authz.need(|a| a.service_read(&service), "service:read", &service)?;
    let key = IndexKey::PeerService(peer.clone(), service.clone());
    let state = api.read(&params, &key).await?;
    let answer = state.peered_upstream(&peer, &service);
    Ok(query::json(&answer, Some(state.index_of(&key)), params.pretty()))
}

/// `GET /v1/internal/peering/trust-bundles/:service` (meshd's own): the trust bundles of the
/// peers `service` is exported to, whose callers its sidecars accept; `service:read` on the
/// service; blocks on the peerings.
pub(crate) async fn trust_bundles(
    State(api): State<Api>,
    authz: Authz,
    Path(service): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    authz.need(|a| a.service_read(&service), "service:read", &service)?;
    let key = IndexKey::Peerings;
    let state = api.read(&params, &key).await?;
    let answer = state.peer_trust_bundles_for(&service);
    Ok(query::json(&answer, Some(state.index_of(&key)), params.pretty()))
}

/// `GET /v1/internal/peering/servers` (meshd's own): where the peering calls go — this
/// cluster's servers' peering addresses and, per peer this cluster dials, its server name
/// and addresses — for mesh gateways carrying them (`Peering.PeerThroughMeshGateways`).
/// `service:read` on `consul` (the servers, as Consul names them); blocks on the peerings.
pub(crate) async fn servers(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    authz.need(|a| a.service_read("consul"), "service:read", "consul")?;
    let key = IndexKey::PeeringRoutes;
    let state = api.read(&params, &key).await?;
    let answer = state.peering_servers_view();
    Ok(query::json(&answer, Some(state.index_of(&key)), params.pretty()))
}
