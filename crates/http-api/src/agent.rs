//! `/v1/status/*`, the agent endpoints a server answers (self and metrics), and the agents'
//! liveness heartbeat (`PUT /v1/internal/node/heartbeat`, body `{"Node", "Address"}`).

use crate::query::{self, Params};
use crate::{Api, ApiError};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

pub(crate) async fn leader(State(api): State<Api>, RawQuery(q): RawQuery) -> Response {
    let params = Params::parse(q.as_deref());
    query::json(&api.config.server_addr, None, params.pretty())
}

pub(crate) async fn peers(State(api): State<Api>, RawQuery(q): RawQuery) -> Response {
    let params = Params::parse(q.as_deref());
    query::json(&[&api.config.server_addr], None, params.pretty())
}

pub(crate) async fn agent_self(State(api): State<Api>, RawQuery(q): RawQuery) -> Response {
    let params = Params::parse(q.as_deref());
    let c = &api.config;
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
    query::json(&body, None, params.pretty())
}

pub(crate) async fn metrics(State(api): State<Api>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(q.as_deref());
    let state = api.store.read();
    let gauges = [
        (
            "meshd_catalog_index",
            "Index of the last committed catalog write.",
            state.index.0 as f64,
        ),
        ("meshd_catalog_nodes", "Registered nodes.", state.nodes().count() as f64),
        (
            "meshd_catalog_service_instances",
            "Registered service instances.",
            state.all_services().count() as f64,
        ),
        (
            "meshd_catalog_checks",
            "Registered health checks.",
            state.all_checks().count() as f64,
        ),
        (
            "meshd_publisher_topics",
            "Event publisher topics with subscribers.",
            api.store.subscribed_topics() as f64,
        ),
    ];
    match params.get("format") {
        Some("prometheus") => {
            let mut out = String::new();
            for (name, help, value) in gauges {
                out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n"));
            }
            api.metrics.render(&mut out);
            if let Some(extra) = &api.config.extra_metrics {
                extra(&mut out);
            }
            let mut resp = (StatusCode::OK, out).into_response();
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            Ok(resp)
        }
        None | Some("") => {
            let gauges: Vec<_> = gauges
                .iter()
                .map(|(name, _, value)| json!({"Name": name, "Value": value, "Labels": {}}))
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
    RawQuery(q): RawQuery,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let params = api.write_params(q.as_deref(), &headers)?;
    let Some(liveness) = &api.config.liveness else {
        return Err(ApiError::NotFound("node liveness is not tracked by this server".into()));
    };
    let hb: Heartbeat = query::decode(&body, "a heartbeat")?;
    if hb.node.is_empty() {
        return Err(ApiError::BadRequest("Node: required".into()));
    }
    if hb.address.is_empty() {
        return Err(ApiError::BadRequest("Address: required".into()));
    }
    liveness.heartbeat(&hb.node, &hb.address).await?;
    Ok(query::json(&true, None, params.pretty()))
}
