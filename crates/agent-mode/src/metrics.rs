//! `GET /v1/agent/metrics?format=prometheus`: the cache's, the xDS server's and the
//! Manager's metrics. It needs `agent:read` on this agent's node, as Consul's.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use node::authz::Caller;
use prometheus_client::registry::Registry;
use std::sync::Arc;

/// The metrics route over `registry`, for node `node`.
pub(crate) fn router(registry: Registry, node: String) -> axum::Router {
    let registry = Arc::new(registry);
    axum::Router::new().route(
        "/v1/agent/metrics",
        axum::routing::get(move |caller: Caller, params: http_kit::Params| {
            let (registry, node) = (Arc::clone(&registry), node.clone());
            async move {
                if let Err(refused) = caller.need(caller.0.authz.agent_read(&node), "agent:read", &node) {
                    return refused.into_response();
                }
                encode(&registry, &params)
            }
        }),
    )
}

fn encode(registry: &Registry, params: &http_kit::Params) -> Response {
    if params.get("format") != Some("prometheus") {
        return (
            StatusCode::BAD_REQUEST,
            "format: this agent serves its metrics as Prometheus text: add ?format=prometheus\n",
        )
            .into_response();
    }
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        return (StatusCode::INTERNAL_SERVER_ERROR, "encoding the metrics failed\n").into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        out,
    )
        .into_response()
}
