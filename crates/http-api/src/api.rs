//! What every handler gets ([`Api`]: the store, the settings, the encoded-response cache)
//! and the reads and writes they share, the API's settings ([`ApiConfig`]), and the router
//! being built ([`Routes`]).

use crate::query::{self, Params};
use crate::{ApiError, HttpMetrics, authz, response_cache};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use catalog::{IndexKey, Store};
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
    /// The API's request counters, which the router updates and its owner registers
    /// ([`HttpMetrics::register`]).
    pub metrics: Arc<HttpMetrics>,
    /// Node liveness tracking behind `PUT /v1/internal/node/heartbeat` (none: 404).
    pub liveness: Option<Arc<catalog::liveness::Liveness>>,
    /// Resolves tokens; with ACLs off every request may do everything.
    pub acl: Arc<catalog::acl::Resolver>,
    /// The ports this server listens on (`/v1/agent/self`'s `DebugConfig`).
    pub ports: http_kit::Ports,
    /// Whether write requests are audited (`docs/audit.md`): off when the store keeps no
    /// audit record (`-audit-retention 0`).
    pub audit: bool,
    /// The audit file every audited request is appended to, if any.
    pub audit_file: Option<crate::audit::AuditFile>,
    /// What a dry run asks beyond the catalog: the proxies a change would reach (none: a
    /// dry run only validates).
    pub dry_run: Option<Arc<dyn crate::dry_run::DryRun>>,
    /// Cluster peering (none: `/v1/peering` answers that it is not available).
    pub peering: Option<Arc<peering::Peerings>>,
    /// Routes the server answers for its own node (its agent's: see
    /// [`http_kit::node_local`]), served behind the API's front (token resolution, audit,
    /// metrics, refusals) like the rest.
    pub local: Option<axum::Router>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            node_name: "meshd-server".into(),
            node_id: String::new(),
            server_addr: "127.0.0.1:8300".into(),
            max_body: 512 * 1024,
            metrics: Arc::default(),
            liveness: None,
            acl: Arc::new(catalog::acl::Resolver::new(catalog::acl::AclSettings::disabled())),
            ports: http_kit::Ports::default(),
            audit: true,
            audit_file: None,
            dry_run: None,
            peering: None,
            local: None,
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

/// What every handler gets: the store, the settings, and the encoded-response cache. One
/// `Arc`, so that the clones every request makes (each middleware and the handler take
/// one) touch one shared counter, not one per part.
#[derive(Clone)]
pub(crate) struct Api(Arc<ApiParts>);

/// The parts of an [`Api`].
pub(crate) struct ApiParts {
    pub(crate) store: Store,
    pub(crate) config: ApiConfig,
    pub(crate) metrics: Arc<HttpMetrics>,
    pub(crate) responses: response_cache::ResponseCache,
    pub(crate) auditor: crate::audit::Auditor,
    /// Verifies logins' bearer tokens (keeps the key sets it fetched).
    pub(crate) verifier: auth_method::Verifier,
}

/// The auditor of an API serving `store` with `config`.
pub(crate) fn auditor(store: &Store, config: &ApiConfig) -> crate::audit::Auditor {
    crate::audit::Auditor {
        store: store.clone(),
        enabled: config.audit,
        server: config.node_name.clone(),
        max_body: config.max_body,
        file: config.audit_file.clone(),
        metrics: Arc::clone(&config.metrics),
    }
}

impl Api {
    pub(crate) fn new(parts: ApiParts) -> Self {
        Self(Arc::new(parts))
    }
}

impl std::ops::Deref for Api {
    type Target = ApiParts;
    fn deref(&self) -> &ApiParts {
        &self.0
    }
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
        // `?consistent`: nothing committed before the request may be missing from the
        // answer, another server's writes included (over etcd).
        if params.has("consistent") && !self.store.catch_up(CONSISTENT_CATCH_UP).await {
            return Err(ApiError::Internal(format!(
                "?consistent: could not catch up with the catalog's other servers within {}s",
                CONSISTENT_CATCH_UP.as_secs()
            )));
        }
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

    /// The key a shared answer is kept under: the path, the parameters but the blocking
    /// ones, and with ACLs the token and the ACL state its rights were resolved in (not the
    /// state after the wait: a request resolved before a policy change must not share its
    /// answer with one resolved after it).
    pub(crate) fn answer_key(&self, path: &str, params: &Params, authz: &authz::Authz) -> Result<String, ApiError> {
        let mut cache_key = response_cache::ResponseCache::key(path, params);
        if self.config.acl.enabled() {
            use std::fmt::Write as _;
            let _ = write!(cache_key, "\u{1e}{}\u{1e}{}", authz.accessor()?, authz.acl_index().0);
        }
        Ok(cache_key)
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
        // The key is made before blocking: a woken query does as little as it can.
        let cache_key = self.answer_key(path, params, authz)?;
        let state = self.read(params, &key).await?;
        let index = state.index_of(&key);
        let (bytes, filtered) = self
            .responses
            .get_or_encode(cache_key, index, || body(&state, authorizer))?;
        Ok(authz::mark_filtered(query::json_bytes(bytes, Some(index)), filtered))
    }
}

/// The router being built, and the paths registered so far.
#[derive(Default)]
pub(crate) struct Routes {
    pub(crate) router: axum::Router<Api>,
    pub(crate) paths: Vec<&'static str>,
}

impl Routes {
    pub(crate) fn add(&mut self, path: &'static str, methods: axum::routing::MethodRouter<Api>) {
        self.router = std::mem::take(&mut self.router).route(path, methods);
        self.paths.push(path);
    }
}

/// How long a `?consistent` read may wait for this server to catch up with etcd.
const CONSISTENT_CATCH_UP: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a server over etcd may wait to catch up before it calls a token unknown.
const CATCH_UP_FOR_UNKNOWN_TOKEN: std::time::Duration = std::time::Duration::from_secs(2);

/// Every request's way in, as one layer (each layer costs every request, and a parked
/// blocking query pays for its layers again when it wakes): a `?filter=` on a path that
/// takes none is refused, the token resolved, a write audited, a 413 made to name the
/// limit, and the answer counted.
pub(crate) async fn front(State(api): State<Api>, req: Request, next: Next) -> Response {
    let refused = http_kit::filter_refusal(req.uri()).or_else(|| http_kit::dry_run_refusal(req.method(), req.uri()));
    let resp = match refused {
        Some(refused) => refused,
        None => {
            let req = resolve(&api, req).await;
            crate::audit::audited(&api.auditor, req, |req| async {
                // The body limit here too, not as a layer of its own on every route.
                let limited = tower::Layer::layer(&axum::extract::DefaultBodyLimit::max(api.config.max_body), next);
                let Ok(resp) = tower::ServiceExt::oneshot(limited, req).await;
                name_body_limit(resp, api.config.max_body)
            })
            .await
        }
    };
    api.metrics.record(resp.status().as_u16());
    resp
}

/// Resolves the request's token (header, bearer or `?token=`) for the handler.
async fn resolve(api: &Api, mut req: Request) -> Request {
    let params = Params::parse(req.uri().query());
    let secret = query::token(req.headers(), &params);
    let state = api.store.read();
    let mut resolved = api.config.acl.resolve(&state, secret.as_ref());
    let mut acl_index = state.index_of(&IndexKey::Acl);
    drop(state);
    // A token unknown here may have been written through another server whose write this
    // one has not applied yet: catch up with etcd before refusing it (the embedded store
    // has nothing to catch up with).
    if resolved.is_err()
        && secret.is_some()
        && api.store.cluster().is_some()
        && api.store.catch_up(CATCH_UP_FOR_UNKNOWN_TOKEN).await
    {
        let state = api.store.read();
        resolved = api.config.acl.resolve(&state, secret.as_ref());
        acl_index = state.index_of(&IndexKey::Acl);
    }
    req.extensions_mut().insert(authz::Authz::new(resolved, acl_index));
    req
}

/// A 413 names the limit (the extractor's own rejection says only "length limit exceeded").
fn name_body_limit(resp: Response, limit: usize) -> Response {
    if resp.status() != axum::http::StatusCode::PAYLOAD_TOO_LARGE
        || resp.extensions().get::<crate::error::LimitNamed>().is_some()
    {
        return resp;
    }
    axum::response::IntoResponse::into_response((axum::http::StatusCode::PAYLOAD_TOO_LARGE, http_kit::too_large(limit)))
}
