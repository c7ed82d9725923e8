//! The views of the proxy config engine both modes serve, `operator:read` each:
//! `GET /v1/internal/xds-status` (every stream's sync state) and
//! `GET /v1/internal/proxy-status/{proxy_id}` (what the engine holds for one proxy).

use crate::authz::{Caller, Denied};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use http_kit::Params;
use std::sync::Arc;
use xds::XdsServer;

/// Why a proxy is not registered yet, if its source knows.
pub type Waiting = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

#[derive(Clone)]
struct Views {
    manager: proxycfg::Manager,
    xds: XdsServer,
    waiting: Waiting,
}

/// The two views (see the module docs); their callers are resolved by [`crate::authz`].
pub fn router(manager: proxycfg::Manager, xds: XdsServer, waiting: Waiting) -> axum::Router {
    axum::Router::new()
        .route("/v1/internal/xds-status", axum::routing::get(xds_status))
        .route("/v1/internal/proxy-status/{proxy_id}", axum::routing::get(proxy_status))
        .route(
            "/v1/internal/troubleshoot/proxy/{proxy_id}",
            axum::routing::get(troubleshoot_proxy),
        )
        .route(
            "/v1/internal/troubleshoot/upstream/{proxy_id}",
            axum::routing::get(troubleshoot_upstream),
        )
        .with_state(Views { manager, xds, waiting })
}

impl Views {
    /// The registered proxies with instance id `proxy_id` (on the node `?node=` names, if it
    /// names one).
    async fn registered_as(&self, proxy_id: &str, params: &Params) -> Vec<proxycfg::ProxyId> {
        let node = params.get("node").filter(|n| !n.is_empty());
        self.manager
            .registered()
            .await
            .into_iter()
            .filter(|id| id.service_id == proxy_id && node.is_none_or(|n| id.node == n))
            .collect()
    }
}

/// Refuses (403) a caller without `operator:read`: these are debugging views of the engine.
fn operator_read(caller: &Caller) -> Result<(), Denied> {
    if caller.0.authz.operator_read() {
        Ok(())
    } else {
        Err(Denied(format!(
            "{}: this view needs 'operator:read'",
            acl::PERMISSION_DENIED
        )))
    }
}

/// Every stream's sync state, or (`?node=`) one node's.
async fn xds_status(State(views): State<Views>, caller: Caller, params: Params) -> Response {
    if let Err(refused) = operator_read(&caller) {
        return refused.into_response();
    }
    let node = params.get("node");
    let streams: Vec<_> = views
        .xds
        .sync_status()
        .into_iter()
        .filter(|s| node.is_none_or(|n| s.node == n))
        .collect();
    axum::Json(streams).into_response()
}

/// What the proxy config engine holds for a proxy — who registered it, the version of its
/// last snapshot (`null`: its data is still incomplete), the watches failing now with their
/// errors (`Errors`), and the parts of its configuration that cannot be built into Envoy
/// resources (`BuildErrors`, by upstream; those keep their last good resources), its mode
/// and its upstreams (`Implicit`: reached by intentions in transparent mode). `?node=`
/// picks one when several nodes register the same id.
async fn proxy_status(
    State(views): State<Views>,
    Path(proxy_id): Path<String>,
    caller: Caller,
    params: Params,
) -> Response {
    if let Err(refused) = operator_read(&caller) {
        return refused.into_response();
    }
    let matches = views.registered_as(&proxy_id, &params).await;
    let id = match matches.as_slice() {
        [one] => one.clone(),
        [] => return not_registered(&views, &proxy_id),
        more => {
            return (
                StatusCode::BAD_REQUEST,
                format!(
                    "proxy {proxy_id:?} is registered on {} nodes: add ?node=NODE\n",
                    more.len()
                ),
            )
                .into_response();
        }
    };
    let Some(status) = views.manager.status(&id).await else {
        return (
            StatusCode::NOT_FOUND,
            format!("proxy {proxy_id:?} was just deregistered\n"),
        )
            .into_response();
    };
    axum::Json(serde_json::json!({
        "Node": id.node,
        "ProxyID": id.service_id,
        "Source": status.source.to_string(),
        "SnapshotVersion": status.snapshot_version,
        "Errors": status.errors,
        "BuildErrors": views.xds.build_problems(&id),
        "Mode": if status.transparent { "transparent" } else { "direct" },
        "Upstreams": status.upstreams.iter().map(|(id, implicit)| serde_json::json!({
            "ID": id,
            "Implicit": implicit,
        })).collect::<Vec<_>>(),
    }))
    .into_response()
}

/// meshd's half of `meshd troubleshoot proxy` (`docs/troubleshoot.md`): what is wrong with
/// a proxy as the engine and the xDS server see it, first, then what is fine.
async fn troubleshoot_proxy(
    State(views): State<Views>,
    Path(proxy_id): Path<String>,
    caller: Caller,
    params: Params,
) -> Response {
    if let Err(refused) = operator_read(&caller) {
        return refused.into_response();
    }
    let ids = views.registered_as(&proxy_id, &params).await;
    let streams: Vec<_> = views
        .xds
        .sync_status()
        .into_iter()
        .filter(|s| s.node == proxy_id)
        .collect();
    let (errors, build, registered) = match ids.first() {
        Some(id) => (
            views.manager.status(id).await.map(|s| s.errors).unwrap_or_default(),
            views.xds.build_problems(id),
            true,
        ),
        None => Default::default(),
    };
    let mut findings = crate::troubleshoot::judge(&proxy_id, &errors, &build, &streams);
    if !registered {
        let why = (views.waiting)(&proxy_id).unwrap_or_else(|| {
            "meshd holds no configuration for it here (an agent holds its local proxies; a server the proxies with an open xDS stream)".into()
        });
        findings.problems.insert(
            0,
            crate::troubleshoot::Finding {
                kind: "not-registered",
                message: format!("{proxy_id} is not registered: {why}"),
            },
        );
    }
    axum::Json(serde_json::json!({
        "ProxyID": proxy_id,
        "Problems": findings.problems,
        "Fine": findings.fine,
        // What each of its streams here holds, resource by resource: what `meshd
        // troubleshoot proxy` compares with Envoy's config dump.
        "Streams": views.xds.resource_states(&proxy_id),
    }))
    .into_response()
}

/// `meshd troubleshoot upstream`'s walk (`docs/troubleshoot.md`): `?upstream=` (required),
/// `?path=` (default `/`), `?method=` (default `GET`), `?header=NAME:VALUE` (repeated).
async fn troubleshoot_upstream(
    State(views): State<Views>,
    Path(proxy_id): Path<String>,
    caller: Caller,
    params: Params,
) -> Response {
    if let Err(refused) = operator_read(&caller) {
        return refused.into_response();
    }
    let Some(upstream) = params.get("upstream").filter(|u| !u.is_empty()) else {
        return (StatusCode::BAD_REQUEST, "upstream: required (?upstream=NAME)\n").into_response();
    };
    let mut headers = Vec::new();
    for h in params.all("header") {
        let Some((k, v)) = h.split_once(':') else {
            return (StatusCode::BAD_REQUEST, format!("header: {h:?} is not NAME:VALUE\n")).into_response();
        };
        headers.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    let req = crate::troubleshoot_upstream::Request {
        upstream: upstream.to_owned(),
        path: params.get("path").unwrap_or("/").to_owned(),
        method: params.get("method").unwrap_or("GET").to_owned(),
        headers,
    };
    let Some(source) = views
        .registered_as(&proxy_id, &params)
        .await
        .iter()
        .find_map(|id| views.manager.current(id))
    else {
        return not_registered(&views, &proxy_id);
    };
    let ids = views.manager.registered().await;
    let others: Vec<_> = ids.iter().filter_map(|id| views.manager.current(id)).collect();
    let mut walk = crate::troubleshoot_upstream::walk(&source, &req, &others);
    handshakes(&source, &mut walk).await;
    intentions(&views, &source, &mut walk).await;
    let fails_at = walk.steps.iter().find(|s| !s.ok).map(|s| s.step.clone());
    let source_uri = source
        .connect_proxy()
        .and_then(|c| c.leaf.as_ref())
        .map(|l| l.service_uri.clone());
    axum::Json(serde_json::json!({
        "ProxyID": proxy_id,
        "Service": source.service.proxy.destination_service_name,
        "SourceURI": source_uri,
        "Upstream": upstream,
        "Steps": walk.steps,
        "Reaches": walk.reaches,
        "FailsAt": fails_at,
    }))
    .into_response()
}

/// Dials the instances the walk reaches (`crate::troubleshoot_handshake`), all at once, and
/// puts each target's `handshake` steps after its `instances` step.
async fn handshakes(source: &proxycfg::ConfigSnapshot, walk: &mut crate::troubleshoot_upstream::Walk) {
    let (Some(leaf), Some(roots)) = (
        source.connect_proxy().and_then(|c| c.leaf.as_ref()),
        source.roots.as_deref(),
    ) else {
        return;
    };
    let probes = std::mem::take(&mut walk.probes);
    let dialled = futures_util::future::join_all(
        probes
            .iter()
            .map(|p| crate::troubleshoot_handshake::handshake(leaf, roots, p)),
    )
    .await;
    // Last first: each insertion leaves the earlier indexes where they were.
    for (probe, steps) in probes.iter().zip(dialled).rev() {
        walk.steps.splice(probe.at..probe.at, steps);
    }
}

/// How long the intentions of one destination may take to come.
const INTENTIONS_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// One `intention` step per service the walk reaches: the intentions that decide there, as
/// the destination's proxy would watch them (the same data source), evaluated for the
/// source's service.
async fn intentions(views: &Views, source: &proxycfg::ConfigSnapshot, walk: &mut crate::troubleshoot_upstream::Walk) {
    let from = &source.service.proxy.destination_service_name;
    let asked = walk.reaches.iter().map(|to| {
        let req = proxycfg::data_sources::IntentionsRequest {
            datacenter: source.datacenter.to_string(),
            destination: to.clone(),
        };
        let intentions = Arc::clone(&views.manager.data_sources().intentions);
        proxycfg::data_sources::first_update(intentions, req, proxycfg::CorrelationId::Intentions, INTENTIONS_WITHIN)
    });
    let answers = futures_util::future::join_all(asked).await;
    for (to, answer) in walk.reaches.iter().zip(answers) {
        let step = match answer {
            Ok(proxycfg::data_sources::UpdatePayload::Intentions(list)) => {
                let decision = structs::intention::decide(&list, from, to, source.intention_default_allow);
                // L7 permissions decide per request: not a step the walk can fail.
                crate::troubleshoot_upstream::step(
                    "intention",
                    decision.allowed || decision.has_permissions,
                    format!("at {to}: {}", decision.reason(from, to)),
                )
            }
            other => crate::troubleshoot_upstream::step(
                "intention",
                false,
                format!(
                    "at {to}: meshd cannot get its intentions: {}",
                    other.err().unwrap_or_else(|| "an answer of another kind".into())
                ),
            ),
        };
        walk.steps.push(step);
    }
}

/// The answer for a proxy the engine does not hold: why, when its source knows.
fn not_registered(views: &Views, proxy_id: &str) -> Response {
    if let Some(reason) = (views.waiting)(proxy_id) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("proxy {proxy_id:?}: {reason}\n"),
        )
            .into_response();
    }
    (
        StatusCode::NOT_FOUND,
        format!(
            "proxy {proxy_id:?} is not registered here (an agent holds its local proxies; a server holds the proxies with an open xDS stream)\n"
        ),
    )
        .into_response()
}
