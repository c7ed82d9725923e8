//! `/v1/status/*`, the agent endpoints a server answers (self and metrics), and the agents'
//! liveness heartbeat (`PUT /v1/internal/node/heartbeat`, body `{"Node", "Address"}`).

use crate::authz::Authz;
use crate::query::{self, Params};
use crate::{Api, ApiError};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// The leading server's address; with several servers over etcd, the one holding the
/// leadership lease ("" while none does, as Consul answers without a leader).
pub(crate) async fn leader(State(api): State<Api>, RawQuery(q): RawQuery) -> Response {
    let params = Params::parse(q.as_deref());
    let leader = match api.store.cluster() {
        Some(cluster) => cluster.status().leader.map(|l| l.address).unwrap_or_default(),
        None => api.config.server_addr.clone(),
    };
    query::json(&leader, None, params.pretty())
}

/// Every server's address: this one alone, or every server registered in etcd.
pub(crate) async fn peers(State(api): State<Api>, RawQuery(q): RawQuery) -> Response {
    let params = Params::parse(q.as_deref());
    let peers: Vec<String> = match api.store.cluster() {
        Some(cluster) => cluster.status().servers.into_iter().map(|s| s.address).collect(),
        None => vec![api.config.server_addr.clone()],
    };
    query::json(&peers, None, params.pretty())
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
        "Member": {"Name": c.node_name, "Addr": addr, "Port": port.parse::<u16>().unwrap_or(8300), "Tags": {"role": "consul", "dc": api.store.datacenter()}, "Status": 1},
        "Meta": {},
        "Stats": {},
    });
    Ok(query::json(&body, None, params.pretty()))
}

pub(crate) async fn metrics(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let node = &api.config.node_name;
    authz.need(|a| a.agent_read(node), "agent:read", node)?;
    let params = Params::parse(q.as_deref());
    let state = api.store.read();
    let index = state.index.0;
    let nodes = state.nodes().count();
    let service_instances = state.all_services().count();
    let checks = state.all_checks().count();
    let publisher_topics = api.store.subscribed_topics();
    match params.get("format") {
        Some("prometheus") => {
            let g = &api.catalog_gauges;
            g.index.set(index);
            g.nodes.set(gauge_value(nodes));
            g.service_instances.set(gauge_value(service_instances));
            g.checks.set(gauge_value(checks));
            g.publisher_topics.set(gauge_value(publisher_topics));
            let (leading, servers) = match api.store.cluster() {
                Some(c) => (*c.leading().borrow(), c.status().servers.len()),
                None => (true, 1),
            };
            g.leader.set(i64::from(leading));
            g.servers.set(gauge_value(servers));
            g.etcd_reloads.set(api.store.etcd_reloads());
            let mut out = String::new();
            encode_registries(&mut out, &api.registry, api.config.extra_metrics.as_deref())
                .map_err(|_| ApiError::Internal("encoding the metrics failed".into()))?;
            let mut resp = (StatusCode::OK, out).into_response();
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                // prometheus-client writes OpenMetrics text (counter families named without
                // `_total`, a closing `# EOF`): the type says so, so scrapers parse it as such.
                HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
            );
            Ok(resp)
        }
        None | Some("") => {
            let gauges = [
                ("meshd_catalog_index", index as f64),
                ("meshd_catalog_nodes", nodes as f64),
                ("meshd_catalog_service_instances", service_instances as f64),
                ("meshd_catalog_checks", checks as f64),
                ("meshd_publisher_topics", publisher_topics as f64),
            ];
            let gauges: Vec<_> = gauges
                .iter()
                .map(|(name, value)| json!({"Name": name, "Value": value, "Labels": {}}))
                .collect();
            let body =
                json!({"Timestamp": humantime_now(), "Gauges": gauges, "Points": [], "Counters": [], "Samples": []});
            Ok(query::json(&body, None, params.pretty()))
        }
        Some(other) => Err(ApiError::BadRequest(format!(
            "format: {other:?} is not supported: use prometheus"
        ))),
    }
}

/// A count as a gauge's value (counts beyond i64 cannot happen; they would saturate).
fn gauge_value(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// One OpenMetrics exposition of several registries: one `# EOF`, at the very end.
fn encode_registries(
    out: &mut String,
    own: &prometheus_client::registry::Registry,
    extra: Option<&prometheus_client::registry::Registry>,
) -> std::fmt::Result {
    use prometheus_client::encoding::text::{encode_eof, encode_registry};
    encode_registry(out, own)?;
    if let Some(extra) = extra {
        encode_registry(out, extra)?;
    }
    encode_eof(out)
}

fn humantime_now() -> String {
    structs::Timestamp(std::time::SystemTime::now()).to_string()
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
