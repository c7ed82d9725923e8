//! `GET /v1/agent/metrics`: the node's metrics (the engine's and the mode's collectors, one
//! registry), for either mode. It needs `agent:read` on the node, as Consul's.
//!
//! `?format=prometheus` answers the OpenMetrics text prometheus-client writes. Without a
//! format it answers Consul's JSON shape (`Timestamp`, `Gauges`, `Points`, `Counters`,
//! `Samples`), built from that same text: a gauge is `{Name, Value, Labels}`; a counter is
//! `{Name, Count, Sum, Labels}` with its value since start in both (Consul's in-memory sink
//! reports an interval's aggregates; a scrape-based counter has only its total); a
//! histogram is a sample `{Name, Count, Sum, Mean, Labels}`.

use crate::authz::Caller;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::registry::Registry;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The content type of the OpenMetrics text (counter families named without `_total`, a
/// closing `# EOF`), so scrapers parse it as such.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The metrics route over `registry`, for node `node`.
pub fn router(registry: Registry, node: String) -> axum::Router {
    let registry = Arc::new(registry);
    axum::Router::new().route(
        "/v1/agent/metrics",
        axum::routing::get(move |caller: Caller, params: http_kit::Params| {
            let (registry, node) = (Arc::clone(&registry), node.clone());
            async move {
                if let Err(refused) = caller.need(caller.0.authz.agent_read(&node), "agent:read", &node) {
                    return refused.into_response();
                }
                answer(&registry, &params)
            }
        }),
    )
}

fn answer(registry: &Registry, params: &http_kit::Params) -> Response {
    let prometheus = match params.get("format") {
        Some("prometheus") => true,
        None | Some("") => false,
        Some(other) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("format: {other:?} is not supported: use prometheus, or no format for JSON\n"),
            )
                .into_response();
        }
    };
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, registry).is_err() {
        return (StatusCode::INTERNAL_SERVER_ERROR, "encoding the metrics failed\n").into_response();
    }
    if prometheus {
        return ([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response();
    }
    let body = consul_json(&text);
    let out = if params.pretty() {
        serde_json::to_string_pretty(&body)
    } else {
        serde_json::to_string(&body)
    };
    match out {
        Ok(out) => ([(header::CONTENT_TYPE, "application/json")], out).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "encoding the metrics failed\n").into_response(),
    }
}

/// One sample line of the exposition: its name, labels and value.
#[derive(Debug, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Consul's JSON shape of the OpenMetrics `text` (see the module docs).
fn consul_json(text: &str) -> Value {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let (mut gauges, mut counters) = (Vec::new(), Vec::new());
    // Histograms: (family, labels without `le`) -> (count, sum).
    let mut histograms: BTreeMap<(String, BTreeMap<String, String>), (f64, f64)> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some((family, kind)) = rest.split_once(' ') {
                types.insert(family.to_owned(), kind.to_owned());
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some(sample) = parse_sample(line) else {
            continue;
        };
        let (family, kind) = family_of(&sample.name, &types);
        let labels = labels_json(&sample.labels);
        match (kind, sample.name.strip_prefix(family).unwrap_or("")) {
            ("counter", "_total") => counters.push(json!({
                "Name": family,
                "Count": sample.value as u64,
                "Sum": sample.value,
                "Labels": labels,
            })),
            ("counter", _) => {} // `_created`
            ("histogram" | "summary", suffix @ ("_count" | "_sum")) => {
                let entry = histograms
                    .entry((family.to_owned(), sample.labels.clone()))
                    .or_insert((0.0, 0.0));
                if suffix == "_count" {
                    entry.0 = sample.value;
                } else {
                    entry.1 = sample.value;
                }
            }
            ("histogram" | "summary", _) => {} // buckets and quantiles
            _ => gauges.push(json!({"Name": sample.name, "Value": sample.value, "Labels": labels})),
        }
    }
    let samples: Vec<Value> = histograms
        .into_iter()
        .map(|((name, labels), (count, sum))| {
            let mean = if count > 0.0 { sum / count } else { 0.0 };
            json!({"Name": name, "Count": count as u64, "Sum": sum, "Mean": mean, "Labels": labels_json(&labels)})
        })
        .collect();
    json!({
        "Timestamp": structs::Timestamp(std::time::SystemTime::now()).to_string(),
        "Gauges": gauges,
        "Points": [],
        "Counters": counters,
        "Samples": samples,
    })
}

/// The family a sample belongs to and its type: the longest declared family its name starts
/// with (a counter `x` has samples `x_total`, a histogram `h` has `h_count`...).
fn family_of<'a>(name: &'a str, types: &'a BTreeMap<String, String>) -> (&'a str, &'a str) {
    if let Some(kind) = types.get(name) {
        return (name, kind);
    }
    for suffix in ["_total", "_created", "_count", "_sum", "_bucket", "_info"] {
        if let Some(family) = name.strip_suffix(suffix)
            && let Some((family, kind)) = types.get_key_value(family)
        {
            return (family, kind);
        }
    }
    (name, "unknown")
}

fn labels_json(labels: &BTreeMap<String, String>) -> Value {
    Value::Object(
        labels
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect::<Map<_, _>>(),
    )
}

/// `name{k="v",...} value [timestamp]`, or `name value`. Label values may hold `\"`, `\\`
/// and `\n` escapes.
fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_owned();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices();
        let mut key = String::new();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '}' => break i,
                ',' | ' ' => {}
                '=' => {
                    let (_, '"') = chars.next()? else { return None };
                    let mut value = String::new();
                    loop {
                        match chars.next()?.1 {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            other => value.push(other),
                        }
                    }
                    labels.insert(std::mem::take(&mut key), value);
                }
                other => key.push(other),
            }
        };
        rest = &inner[end + 1..];
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample { name, labels, value })
}

#[cfg(test)]
mod tests;
