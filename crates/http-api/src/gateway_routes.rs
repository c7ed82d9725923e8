//! Gateway routes: `/v1/catalog/gateway-services/:gateway` (the services a gateway fronts)
//! and `/v1/health/ingress/:service` (the ingress gateways that expose a service).

use crate::authz::{Authz, retain};
use crate::query::{self, Params, ServiceFilters};
use crate::{Api, ApiError};
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use catalog::IndexKey;
use structs::{CheckServiceNode, GatewayService, HealthStatus};

/// The services `gateway` fronts, in Consul's `GatewayService` shape. Needs `service:read` on
/// the gateway; services the token may not read are left out (and the answer says so).
pub(crate) async fn gateway_services(
    State(api): State<Api>,
    authz: Authz,
    Path(gateway): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    authz.need(|a| a.service_read(&gateway), "service:read", &gateway)?;
    let path = format!("/v1/catalog/gateway-services/{gateway}");
    let key = IndexKey::GatewayServices(gateway.clone());
    api.shared_answer(&path, &params, key, &authz, |state, a| {
        let mut services: Vec<GatewayService> = state.gateway_services(&gateway);
        let filtered = retain(&mut services, |s| a.service_read(&s.service));
        Ok((query::encode(&services, params.pretty())?, filtered))
    })
    .await
}

/// The instances of the ingress gateways exposing `service`, as CheckServiceNodes
/// (`?passing`: only those whose checks all pass; `?tag`, `?node-meta`, `?filter` as for health service). Needs `service:read` on the service;
/// gateway instances the token may not read (service or node) are left out.
pub(crate) async fn ingress_health(
    State(api): State<Api>,
    authz: Authz,
    Path(service): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    authz.need(|a| a.service_read(&service), "service:read", &service)?;
    let filters = ServiceFilters::parse(&params)?;
    let expr = query::filter::<CheckServiceNode>(&params)?;
    let passing = params.bool("passing")?;
    let path = format!("/v1/health/ingress/{service}");
    api.shared_answer(&path, &params, IndexKey::IngressGateways, &authz, |state, a| {
        let mut result: Vec<CheckServiceNode> = state
            .ingress_health(&service)
            .into_iter()
            .filter(|csn| filters.admits(&csn.service.tags, &csn.node.meta))
            .filter(|csn| !passing || csn.checks.iter().all(|c| c.status == HealthStatus::Passing))
            .filter(|csn| expr.matches(csn))
            .collect();
        let filtered = retain(&mut result, |csn| {
            a.service_read(&csn.service.service) && a.node_read(&csn.node.node)
        });
        Ok((query::encode(&result, params.pretty())?, filtered))
    })
    .await
}
