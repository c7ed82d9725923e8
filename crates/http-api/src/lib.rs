//! meshd's Consul-compatible HTTP API.
//!
//! Paths, JSON shapes and conventions follow Consul's `/v1` API so Consul's clients work
//! unchanged: any key casing on input, `[]` never `null`, `X-Consul-Index` (≥ 1) on every
//! blocking-capable GET with `?index=&wait=` blocking, tokens from `X-Consul-Token`,
//! `Authorization: Bearer` or `?token=`, `?pretty`, plain-text errors (400 naming the bad
//! field, 404, 405, 413 for oversized bodies). Handlers hold no state of their own: every
//! read and write goes to the [`catalog::Store`].

mod acl_routes;
mod agent;
mod api;
mod audit;
mod audit_routes;
mod auth_method_routes;
mod authorize;
mod authz;
mod catalog_routes;
mod config_routes;
mod connect;
mod discovery_chain;
pub mod dry_run;
mod error;
mod event_routes;
pub mod federation;
mod gateway_routes;
mod health;
mod intentions_by_id;
mod kv_routes;
mod metrics;
mod operator_routes;
mod peering_routes;
pub mod query;
mod query_routes;
pub mod replication;
mod response_cache;
mod session_routes;
mod snapshot_routes;
mod txn_routes;
mod ui;

pub use api::ApiConfig;
pub(crate) use api::{Api, Routes};
pub use audit::AuditFile;
pub use authz::FILTERED_HEADER;
pub use error::ApiError;
pub use metrics::{CatalogMetrics, HttpMetrics};

use axum::Router;
use axum::extract::Request;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use catalog::Store;
use std::sync::Arc;

/// Cluster peering: the lifecycle, and what agents' sidecars read of peers.
fn add_peering_routes(r: &mut Routes) {
    r.add("/v1/peering/token", post(peering_routes::token));
    r.add("/v1/peering/establish", post(peering_routes::establish));
    r.add(
        "/v1/peering/{name}",
        get(peering_routes::get).delete(peering_routes::delete),
    );
    r.add("/v1/peerings", get(peering_routes::list));
    r.add(
        "/v1/internal/peering/upstream/{peer}/{service}",
        get(peering_routes::upstream),
    );
    r.add(
        "/v1/internal/peering/trust-bundles/{service}",
        get(peering_routes::trust_bundles),
    );
    r.add("/v1/internal/peering/servers", get(peering_routes::servers));
}

/// The API's routes over `store`.
pub fn router(store: Store, config: ApiConfig) -> Router {
    router_and_paths(store, config).0
}

/// The routes, and every path registered (a test checks each has its ACL row).
pub fn router_and_paths(store: Store, config: ApiConfig) -> (Router, Vec<&'static str>) {
    let metrics = Arc::clone(&config.metrics);
    let local = config.local.clone();
    let auditor = api::auditor(&store, &config);
    let api = Api::new(api::ApiParts {
        store,
        config,
        metrics: Arc::clone(&metrics),
        responses: response_cache::ResponseCache::default(),
        auditor,
        verifier: auth_method::Verifier::new(),
    });
    let mut r = Routes::default();
    r.add("/v1/catalog/register", put(catalog_routes::register));
    r.add("/v1/catalog/deregister", put(catalog_routes::deregister));
    r.add("/v1/catalog/datacenters", get(catalog_routes::datacenters));
    r.add("/v1/catalog/nodes", get(catalog_routes::nodes));
    r.add("/v1/catalog/node/{node}", get(catalog_routes::node));
    r.add("/v1/catalog/node-services/{node}", get(catalog_routes::node_services));
    r.add("/v1/catalog/services", get(catalog_routes::services));
    r.add("/v1/catalog/service/{name}", get(catalog_routes::service));
    r.add("/v1/catalog/connect/{name}", get(catalog_routes::connect));
    r.add(
        "/v1/catalog/gateway-services/{gateway}",
        get(gateway_routes::gateway_services),
    );
    r.add("/v1/health/service/{name}", get(health::service));
    add_peering_routes(&mut r);
    r.add("/v1/health/connect/{name}", get(health::connect));
    r.add("/v1/health/ingress/{name}", get(gateway_routes::ingress_health));
    r.add("/v1/health/checks/{name}", get(health::checks));
    r.add("/v1/health/state/{state}", get(health::state));
    r.add("/v1/health/node/{node}", get(health::node));
    r.add("/v1/config", put(config_routes::set));
    r.add("/v1/config/{kind}", get(config_routes::list));
    r.add(
        "/v1/config/{kind}/{name}",
        get(config_routes::get).delete(config_routes::delete),
    );
    r.add(
        "/v1/discovery-chain/{service}",
        get(discovery_chain::get).post(discovery_chain::post),
    );
    add_store_routes(&mut r);
    r.add("/v1/connect/ca/roots", get(connect::roots));
    r.add("/v1/agent/connect/ca/roots", get(connect::roots));
    r.add(
        "/v1/connect/ca/configuration",
        get(connect::ca_configuration).put(connect::set_ca_configuration),
    );
    r.add("/v1/agent/connect/ca/leaf/{service}", get(connect::leaf));
    r.add("/v1/internal/connect/ca/sign", put(connect::sign));
    r.add(
        "/v1/connect/intentions",
        get(connect::list_intentions).post(intentions_by_id::create),
    );
    r.add(
        "/v1/connect/intentions/{id}",
        get(intentions_by_id::get)
            .put(intentions_by_id::update)
            .delete(intentions_by_id::delete),
    );
    r.add(
        "/v1/connect/intentions/exact",
        get(connect::get_intention)
            .put(connect::put_intention)
            .delete(connect::delete_intention),
    );
    r.add("/v1/connect/intentions/match", get(connect::match_intentions));
    r.add("/v1/connect/intentions/check", get(connect::check_intention));
    r.add("/v1/status/leader", get(agent::leader));
    r.add("/v1/status/peers", get(agent::peers));
    r.add("/v1/agent/self", get(agent::agent_self));
    r.add("/v1/agent/members", get(agent::members));
    r.add("/v1/agent/force-leave/{node}", put(agent::force_leave));
    r.add("/v1/agent/join/{address}", put(agent::join));
    r.add(
        "/v1/agent/connect/authorize",
        post(authorize::authorize).put(authorize::authorize),
    );
    r.add("/v1/internal/node/heartbeat", put(agent::heartbeat));
    r.add("/v1/internal/audit", get(audit_routes::list));
    r.add("/v1/internal/ui/services", get(ui::services));
    r.add("/v1/internal/service-virtual-ip", get(ui::virtual_ips));
    federation::add(&mut r);
    r.add("/v1/internal/service-virtual-ip/{service}", get(ui::virtual_ip));
    add_acl_routes(&mut r);
    let Routes { router, paths } = r;
    let router = match local {
        Some(local) => router.merge(local.with_state(())),
        None => router,
    };
    let router = router
        .merge(dashboard::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(api.clone(), api::front))
        .with_state(api);
    (router, paths)
}

/// ACLs: tokens, policies, roles; auth methods, binding rules, login.
fn add_acl_routes(r: &mut Routes) {
    acl_routes::add(r);
    auth_method_routes::add(r);
}

/// The KV store, sessions, transactions, events, operator views and coordinates.
fn add_store_routes(r: &mut Routes) {
    r.add("/v1/kv/", get(kv_routes::get_root).delete(kv_routes::delete_root));
    r.add(
        "/v1/kv/{*key}",
        get(kv_routes::get).put(kv_routes::put).delete(kv_routes::delete),
    );
    r.add("/v1/session/create", put(session_routes::create));
    r.add("/v1/session/destroy/{id}", put(session_routes::destroy));
    r.add("/v1/session/renew/{id}", put(session_routes::renew));
    r.add("/v1/session/info/{id}", get(session_routes::info));
    r.add("/v1/session/node/{node}", get(session_routes::node));
    r.add("/v1/session/list", get(session_routes::list));
    r.add("/v1/txn", put(txn_routes::txn));
    r.add("/v1/snapshot", get(snapshot_routes::save).put(snapshot_routes::restore));
    r.add("/v1/event/fire/{name}", put(event_routes::fire));
    r.add("/v1/event/list", get(event_routes::list));
    r.add(
        "/v1/operator/raft/configuration",
        get(operator_routes::raft_configuration),
    );
    r.add("/v1/operator/autopilot/health", get(operator_routes::autopilot_health));
    r.add("/v1/operator/autopilot/state", get(operator_routes::autopilot_state));
    r.add(
        "/v1/operator/autopilot/configuration",
        get(operator_routes::autopilot_configuration).put(operator_routes::set_autopilot_configuration),
    );
    r.add("/v1/operator/usage", get(operator_routes::usage));
    r.add(
        "/v1/coordinate/datacenters",
        get(operator_routes::coordinate_datacenters),
    );
    r.add("/v1/coordinate/nodes", get(operator_routes::coordinate_nodes));
    r.add("/v1/coordinate/update", put(operator_routes::coordinate_update));
    r.add(
        "/v1/operator/keyring",
        get(operator_routes::keyring)
            .post(operator_routes::keyring)
            .put(operator_routes::keyring)
            .delete(operator_routes::keyring),
    );
    r.add("/v1/query", get(query_routes::list).post(query_routes::create));
    r.add(
        "/v1/query/{id}",
        get(query_routes::get)
            .put(query_routes::update)
            .delete(query_routes::delete),
    );
    r.add("/v1/query/{id}/execute", get(query_routes::execute));
    r.add("/v1/query/{id}/explain", get(query_routes::explain));
}

async fn method_not_allowed(req: Request) -> Response {
    let mut resp = (
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        format!("method {} not allowed on {}\n", req.method(), req.uri().path()),
    )
        .into_response();
    resp.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

async fn not_found(uri: axum::http::Uri) -> Response {
    ApiError::NotFound(http_kit::unknown_path(uri.path()).trim_end().to_owned()).into_response()
}
