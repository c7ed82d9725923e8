//! The node's own operator routes, for either mode:
//!
//! - `GET /v1/agent/host` (`operator:read`, as Consul's): the host the node runs on, in the
//!   shape Consul's answers (`Memory`, `CPU`, `Host`, `Disk`, `CollectionTime`, `Errors`),
//!   read from `/proc` and the root file system. What cannot be read is named in `Errors`
//!   and its part left out, rather than the whole answer failing.
//! - `PUT /v1/agent/leave` (`agent:write` on the node, as Consul's): a graceful leave, the
//!   same shutdown as a first SIGTERM (an agent deregisters its node; a server closes its
//!   store). The answer is sent before the listeners close.

use crate::authz::Caller;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// The routes, for node `node`; `leave` is cancelled by a leave request.
pub fn router(node: String, leave: CancellationToken) -> axum::Router {
    let host_node = node.clone();
    axum::Router::new()
        .route(
            "/v1/agent/host",
            axum::routing::get(move |caller: Caller, params: http_kit::Params| {
                let node = host_node.clone();
                async move {
                    if let Err(refused) = caller.need(caller.0.authz.operator_read(), "operator:read", &node) {
                        return refused.into_response();
                    }
                    json_answer(&host_info(), params.pretty())
                }
            }),
        )
        .route(
            "/v1/agent/leave",
            axum::routing::put(move |caller: Caller| {
                let (node, leave) = (node.clone(), leave.clone());
                async move {
                    if let Err(refused) = caller.need(caller.0.authz.agent_write(&node), "agent:write", &node) {
                        return refused.into_response();
                    }
                    tracing::info!(node = %node, "leave requested over the HTTP API: shutting down");
                    leave.cancel();
                    ().into_response()
                }
            }),
        )
}

fn json_answer(body: &Value, pretty: bool) -> Response {
    let text = if pretty {
        serde_json::to_string_pretty(body)
    } else {
        serde_json::to_string(body)
    }
    .unwrap_or_default();
    ([(header::CONTENT_TYPE, "application/json")], text).into_response()
}

/// What the host says of itself; each part that cannot be read is an entry of `Errors`.
pub fn host_info() -> Value {
    let mut errors: Vec<String> = Vec::new();
    let mut out = Map::new();
    let mut part = |name: &str, read: Result<Value, String>| match read {
        Ok(v) => {
            out.insert(name.to_owned(), v);
        }
        Err(e) => errors.push(format!("{name}: {e}")),
    };
    part("Memory", memory());
    part("CPU", cpus());
    part("Host", host());
    part("Disk", disk("/"));
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    out.insert("CollectionTime".into(), json!(now.as_nanos() as u64));
    out.insert("Errors".into(), json!(errors));
    Value::Object(out)
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))
}

/// `/proc/meminfo` values (kB) by key.
fn meminfo_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse::<u64>().ok().map(|kb| kb * 1024)
    })
}

fn memory() -> Result<Value, String> {
    let text = read("/proc/meminfo")?;
    let total = meminfo_value(&text, "MemTotal").ok_or("no MemTotal in /proc/meminfo")?;
    let available = meminfo_value(&text, "MemAvailable").unwrap_or(0);
    let free = meminfo_value(&text, "MemFree").unwrap_or(0);
    let used = total.saturating_sub(available);
    Ok(json!({
        "total": total,
        "available": available,
        "free": free,
        "used": used,
        "usedPercent": percent(used, total),
    }))
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

fn cpus() -> Result<Value, String> {
    let text = read("/proc/cpuinfo")?;
    let mut cpus = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let field = |key: &str| {
            block.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == key).then(|| v.trim().to_owned())
            })
        };
        let Some(cpu) = field("processor").and_then(|p| p.parse::<u64>().ok()) else {
            continue;
        };
        cpus.push(json!({
            "cpu": cpu,
            "vendorId": field("vendor_id").unwrap_or_default(),
            "modelName": field("model name").unwrap_or_default(),
            "cores": field("cpu cores").and_then(|c| c.parse::<u64>().ok()).unwrap_or(1),
            "mhz": field("cpu MHz").and_then(|m| m.parse::<f64>().ok()).unwrap_or(0.0),
        }));
    }
    if cpus.is_empty() {
        return Err("no processor in /proc/cpuinfo".into());
    }
    Ok(Value::Array(cpus))
}

fn host() -> Result<Value, String> {
    let trimmed = |path: &str| read(path).map(|s| s.trim().to_owned());
    let uptime = trimmed("/proc/uptime")?
        .split_whitespace()
        .next()
        .and_then(|s| s.parse::<f64>().ok())
        .ok_or("/proc/uptime does not start with a number")? as u64;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    Ok(json!({
        "hostname": trimmed("/proc/sys/kernel/hostname")?,
        "uptime": uptime,
        "bootTime": now.saturating_sub(uptime),
        "os": trimmed("/proc/sys/kernel/ostype")?.to_ascii_lowercase(),
        "kernelVersion": trimmed("/proc/sys/kernel/osrelease")?,
        "kernelArch": std::env::consts::ARCH,
    }))
}

fn disk(path: &str) -> Result<Value, String> {
    let st = rustix::fs::statvfs(path).map_err(|e| format!("statvfs {path}: {e}"))?;
    let total = st.f_blocks * st.f_frsize;
    let free = st.f_bavail * st.f_frsize;
    let used = total.saturating_sub(st.f_bfree * st.f_frsize);
    Ok(json!({
        "path": path,
        "total": total,
        "free": free,
        "used": used,
        "usedPercent": percent(used, used + free),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_answer_has_each_part_or_says_why_not() {
        let v = host_info();
        let errors = v["Errors"].as_array().unwrap_or_else(|| panic!("{v}"));
        assert!(errors.is_empty(), "{errors:?}");
        assert!(v["Memory"]["total"].as_u64().is_some_and(|t| t > 0), "{v}");
        assert!(v["CPU"].as_array().is_some_and(|c| !c.is_empty()), "{v}");
        assert!(v["Host"]["hostname"].as_str().is_some_and(|h| !h.is_empty()), "{v}");
        assert_eq!(v["Host"]["os"], "linux");
        assert!(v["Disk"]["total"].as_u64().is_some_and(|t| t > 0), "{v}");
    }

    #[test]
    fn meminfo_values_are_bytes() {
        let text = "MemTotal:       24731924 kB\nMemFree:         9101188 kB\nMemAvailable:   24146952 kB\n";
        assert_eq!(meminfo_value(text, "MemTotal"), Some(24731924 * 1024));
        assert_eq!(meminfo_value(text, "MemAvailable"), Some(24146952 * 1024));
        assert_eq!(meminfo_value(text, "Mem"), None);
    }
}
