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
mod authz;
mod catalog_routes;
mod config_routes;
mod connect;
mod discovery_chain;
mod error;
mod gateway_routes;
mod health;
mod metrics;
pub mod query;
mod response_cache;
mod ui;

pub use authz::FILTERED_HEADER;
pub use error::ApiError;
pub use metrics::HttpMetrics;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use catalog::{IndexKey, Store};
use query::Params;
use std::sync::Arc;

/// Settings of the API.
#[derive(Clone)]
pub struct ApiConfig {
    /// This server's node name (`/v1/agent/self`).
    pub node_name: String,
    /// This server's node id.
    pub node_id: String,
    /// Address reported as the leader (`/v1/status/leader`).
    pub server_addr: String,
    /// Largest accepted request body, bytes (larger: 413).
    pub max_body: usize,
    /// Metrics kept outside the API (xDS, proxycfg), encoded after the API's own by
    /// `/v1/agent/metrics?format=prometheus`.
    pub extra_metrics: Option<Arc<prometheus_client::registry::Registry>>,
    /// Node liveness tracking behind `PUT /v1/internal/node/heartbeat` (none: 404).
    pub liveness: Option<Arc<catalog::liveness::Liveness>>,
    /// Resolves tokens; with ACLs off every request may do everything.
    pub acl: Arc<catalog::acl::Resolver>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            node_name: "meshd-server".into(),
            node_id: String::new(),
            server_addr: "127.0.0.1:8300".into(),
            max_body: 512 * 1024,
            extra_metrics: None,
            liveness: None,
            acl: Arc::new(catalog::acl::Resolver::new(catalog::acl::AclSettings::disabled())),
        }
    }
}

impl std::fmt::Debug for ApiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiConfig")
            .field("node_name", &self.node_name)
            .field("max_body", &self.max_body)
            .finish()
    }
}

/// What every handler gets: the store, the settings, and the encoded-response cache.
#[derive(Clone)]
pub(crate) struct Api {
    pub(crate) store: Store,
    pub(crate) config: Arc<ApiConfig>,
    pub(crate) metrics: Arc<HttpMetrics>,
    /// The catalog gauges, set from the state when metrics are scraped.
    pub(crate) catalog_gauges: Arc<metrics::CatalogGauges>,
    /// The API's own metrics (catalog gauges, then HTTP).
    pub(crate) registry: Arc<prometheus_client::registry::Registry>,
    pub(crate) responses: Arc<response_cache::ResponseCache>,
}

impl Api {
    /// Reads the state for a blocking-capable GET: at once without `?index`, else once the
    /// key's index passes it (or the wait ends).
    ///
    /// An index ahead of this server's state means one of two things. With the embedded
    /// store it is from before a reset (a `-dev` server restarted): it answers at once, so
    /// the client resyncs. Over etcd, every server's index is the same etcd revision, so the
    /// index came from a server whose watch is further along: this one waits (within the
    /// same wait) until its watch has applied it, then blocks as usual, and never answers
    /// a lower index than the client already saw while it catches up.
    pub(crate) async fn read(&self, params: &Params, key: &IndexKey) -> Result<Arc<catalog::State>, ApiError> {
        query::check_common(params, self.store.datacenter())?;
        let blocking = params.blocking()?;
        let mut state = self.store.read();
        let Some(after) = blocking.index else {
            return Ok(state);
        };
        let wait = blocking.wait_with_jitter();
        let started = tokio::time::Instant::now();
        if after > state.index {
            if self.store.cluster().is_none() {
                return Ok(state);
            }
            let _waiting = self.metrics.waiting();
            if !self.store.wait_applied(after, wait).await {
                return Ok(self.store.read());
            }
            state = self.store.read();
        }
        if after < state.index_of(key) {
            return Ok(state);
        }
        let _waiting = self.metrics.waiting();
        let left = wait.saturating_sub(started.elapsed());
        Ok(self.store.wait(key, after, left).await)
    }
}

impl Api {
    /// The query of a write: parsed and checked for `?dc=` and unsupported parameters (the
    /// token is resolved by the ACL middleware).
    pub(crate) fn write_params(&self, q: Option<&str>) -> Result<Params, ApiError> {
        let params = Params::parse(q);
        query::check_common(&params, self.store.datacenter())?;
        Ok(params)
    }

    /// Answers a blocking-capable query whose body depends only on `key`'s data and on what
    /// the token may read: blocks as asked, then encodes the body (and whether ACLs filtered
    /// it) once per index of the key and shares it with every request for the same path,
    /// parameters and token.
    pub(crate) async fn shared_answer(
        &self,
        path: &str,
        params: &Params,
        key: IndexKey,
        authz: &authz::Authz,
        body: impl FnOnce(&catalog::State, &acl::Authorizer) -> Result<(axum::body::Bytes, bool), ApiError>,
    ) -> Result<Response, ApiError> {
        let authorizer = authz.get()?;
        let state = self.read(params, &key).await?;
        let index = state.index_of(&key);
        let mut cache_key = response_cache::ResponseCache::key(path, params);
        if self.config.acl.enabled() {
            cache_key.push('\u{1e}');
            cache_key.push_str(authz.accessor()?);
            cache_key.push_str(&state.index_of(&IndexKey::Acl).to_string());
        }
        let (bytes, filtered) = self
            .responses
            .get_or_encode(cache_key, index, || body(&state, authorizer))?;
        Ok(authz::mark_filtered(query::json_bytes(bytes, Some(index)), filtered))
    }
}

/// The API's routes over `store`.
pub fn router(store: Store, config: ApiConfig) -> Router {
    router_and_paths(store, config).0
}

/// The routes, and every path registered (a test checks each has its ACL row).
pub fn router_and_paths(store: Store, config: ApiConfig) -> (Router, Vec<&'static str>) {
    let metrics = Arc::new(HttpMetrics::default());
    let catalog_gauges = Arc::new(metrics::CatalogGauges::default());
    let mut registry = prometheus_client::registry::Registry::default();
    catalog_gauges.register(&mut registry);
    metrics.register(&mut registry);
    let max_body = config.max_body;
    let api = Api {
        store,
        config: Arc::new(config),
        metrics: Arc::clone(&metrics),
        catalog_gauges,
        registry: Arc::new(registry),
        responses: Arc::new(response_cache::ResponseCache::default()),
    };
    let mut r = Routes::default();
    r.add("/v1/catalog/register", put(catalog_routes::register));
    r.add("/v1/catalog/deregister", put(catalog_routes::deregister));
    r.add("/v1/catalog/datacenters", get(catalog_routes::datacenters));
    r.add("/v1/catalog/nodes", get(catalog_routes::nodes));
    r.add("/v1/catalog/node/{node}", get(catalog_routes::node));
    r.add("/v1/catalog/services", get(catalog_routes::services));
    r.add("/v1/catalog/service/{name}", get(catalog_routes::service));
    r.add("/v1/catalog/connect/{name}", get(catalog_routes::connect));
    r.add(
        "/v1/catalog/gateway-services/{gateway}",
        get(gateway_routes::gateway_services),
    );
    r.add("/v1/health/service/{name}", get(health::service));
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
    r.add("/v1/connect/ca/roots", get(connect::roots));
    r.add("/v1/agent/connect/ca/roots", get(connect::roots));
    r.add(
        "/v1/connect/ca/configuration",
        get(connect::ca_configuration).put(connect::set_ca_configuration),
    );
    r.add("/v1/agent/connect/ca/leaf/{service}", get(connect::leaf));
    r.add("/v1/internal/connect/ca/sign", put(connect::sign));
    r.add("/v1/connect/intentions", get(connect::list_intentions));
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
    r.add("/v1/agent/metrics", get(agent::metrics));
    r.add("/v1/internal/node/heartbeat", put(agent::heartbeat));
    r.add("/v1/internal/ui/services", get(ui::services));
    acl_routes::add(&mut r);
    let Routes { router, paths } = r;
    let router = router
        .merge(dashboard::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::map_response(move |resp: Response| async move {
            name_body_limit(resp, max_body)
        }))
        .layer(middleware::from_fn_with_state(api.clone(), authz::resolve))
        .layer(middleware::from_fn_with_state(metrics, count))
        .with_state(api);
    (router, paths)
}

/// A 413 names the limit (the extractor's own rejection says only "length limit exceeded").
fn name_body_limit(resp: Response, limit: usize) -> Response {
    if resp.status() != StatusCode::PAYLOAD_TOO_LARGE {
        return resp;
    }
    let text = format!("request body larger than this API's limit of {limit} bytes\n");
    (StatusCode::PAYLOAD_TOO_LARGE, text).into_response()
}

/// The router being built, and the paths registered so far.
#[derive(Default)]
pub(crate) struct Routes {
    router: Router<Api>,
    paths: Vec<&'static str>,
}

impl Routes {
    pub(crate) fn add(&mut self, path: &'static str, methods: axum::routing::MethodRouter<Api>) {
        self.router = std::mem::take(&mut self.router).route(path, methods);
        self.paths.push(path);
    }
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

async fn not_found() -> Response {
    ApiError::NotFound("404 page not found".into()).into_response()
}

async fn count(State(metrics): State<Arc<HttpMetrics>>, req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    metrics.record(resp.status().as_u16());
    resp
}
