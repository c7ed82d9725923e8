//! The keys of a proxy's `Config` (its own over `proxy-defaults`') that shape Envoy's
//! bootstrap, Consul's names: stats sinks and tags, the Prometheus listener, tracing, and
//! extra static clusters and listeners. They are checked when a registration or
//! `proxy-defaults` is written (a 400 naming `Config.<key>`) and read by `meshd connect envoy`
//! when it writes the bootstrap. The JSON escape hatches are Envoy's own JSON, which Envoy
//! judges when it loads the bootstrap; here each must be JSON objects of the expected shape.
//!
//! Keys Consul knows that meshd does not honour yet are refused when written, so none is
//! silently ignored ([`UNSUPPORTED_PROXY_KEYS`]).

use crate::validate::{Problem, ValidationError};
use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;

/// A proxy's `Config` (the same map as `protocol::OpaqueConfig`).
type OpaqueConfig = serde_json::Map<String, Value>;

/// Consul proxy `Config` keys meshd refuses for now, with what to use meanwhile.
pub const UNSUPPORTED_PROXY_KEYS: &[&str] = &[
    "envoy_stats_bind_addr",
    "envoy_telemetry_collector_bind_socket_dir",
    "envoy_hcp_metrics_bind_socket_dir",
];

/// Every `envoy_*` key of a proxy's `Config` meshd acts on; any other `envoy_*` key (Consul's
/// namespace) is refused when written, since it would be ignored.
pub const HONOURED_ENVOY_KEYS: &[&str] = &[
    "envoy_dns_discovery_type",
    "envoy_statsd_url",
    "envoy_dogstatsd_url",
    "envoy_prometheus_bind_addr",
    "envoy_stats_tags",
    "envoy_stats_flush_interval",
    "envoy_stats_config_json",
    "envoy_stats_sinks_json",
    "envoy_tracing_json",
    "envoy_extra_static_clusters_json",
    "envoy_extra_static_listeners_json",
    "envoy_public_listener_json",
    "envoy_local_cluster_json",
    "envoy_listener_tracing_json",
];

/// The escape hatches of a proxy's `Config` that the xDS server honours, with the Envoy type
/// each holds: the public listener, the local application's cluster, the tracing of every
/// HTTP connection manager.
pub const PROXY_ESCAPE_HATCHES: &[(&str, &str)] = &[
    ("envoy_public_listener_json", envoy_json::LISTENER),
    ("envoy_local_cluster_json", envoy_json::CLUSTER),
    ("envoy_listener_tracing_json", envoy_json::HCM_TRACING),
];

/// The escape hatch of an upstream's `Config`: its listener.
pub const UPSTREAM_LISTENER_KEY: &str = "envoy_listener_json";

/// The escape hatch of an upstream's `Config`: its cluster (for an upstream whose discovery
/// chain is the default one, as Consul).
pub const UPSTREAM_CLUSTER_KEY: &str = "envoy_cluster_json";

/// Checks escape hatch `key` of `config` (a string of Envoy JSON) as Envoy type `ty`,
/// naming `Config.<key>`.
pub fn check_escape_hatch(config: &OpaqueConfig, key: &str, ty: &str) -> Result<(), ValidationError> {
    match config.get(key) {
        None => Ok(()),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(()),
        Some(Value::String(s)) => {
            envoy_json::decode(ty, s).map_err(|e| invalid(key, e.to_string()))?;
            if key == "envoy_public_listener_json" {
                let chains = serde_json::from_str::<Value>(s).ok().and_then(|v| {
                    let v = v.get("filter_chains").or_else(|| v.get("filterChains"))?;
                    v.as_array().map(Vec::len)
                });
                if chains.unwrap_or(0) == 0 {
                    return Err(invalid(
                        key,
                        "has no filter_chains: the mesh's TLS and intentions are put on each, so at least one is needed",
                    ));
                }
            }
            Ok(())
        }
        Some(v) => Err(invalid(key, format!("{v} is not a string of JSON"))),
    }
}

/// Where a statsd or DogStatsD sink sends: UDP, or (DogStatsD) a Unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkAddr {
    /// `udp://host:port` (an IP address).
    Udp(SocketAddr),
    /// `unix:///path`.
    Unix(String),
}

/// The bootstrap keys of a proxy's `Config`, decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BootstrapOptions {
    /// `envoy_statsd_url`.
    pub statsd: Option<SinkAddr>,
    /// `envoy_dogstatsd_url`.
    pub dogstatsd: Option<SinkAddr>,
    /// `envoy_prometheus_bind_addr`: a listener serving `/metrics` in Prometheus' format.
    pub prometheus_bind: Option<SocketAddr>,
    /// `envoy_stats_tags`: `name=value` tags on every stat.
    pub stats_tags: Vec<(String, String)>,
    /// `envoy_stats_flush_interval`.
    pub stats_flush_interval: Option<Duration>,
    /// `envoy_stats_config_json`: replaces the whole `stats_config` (tags included).
    pub stats_config: Option<Value>,
    /// `envoy_stats_sinks_json`: more stats sinks.
    pub stats_sinks: Vec<Value>,
    /// `envoy_tracing_json`: the bootstrap's `tracing`.
    pub tracing: Option<Value>,
    /// `envoy_extra_static_clusters_json`.
    pub extra_clusters: Vec<Value>,
    /// `envoy_extra_static_listeners_json`.
    pub extra_listeners: Vec<Value>,
}

fn invalid(key: &str, why: impl Into<String>) -> ValidationError {
    ValidationError::new(format!("Config.{key}"), Problem::Invalid(why.into()))
}

/// Where `$NAME` values come from: the environment of `connect envoy`, or (`None`, where
/// a `Config` is written) nowhere: they are taken on trust.
type Env<'a> = Option<&'a dyn Fn(&str) -> Option<String>>;

/// A string value, or `$NAME` replaced by what `env` gives for it (Consul lets the statsd
/// URLs name an environment variable of `connect envoy`).
fn string(config: &OpaqueConfig, key: &str, env: Env<'_>) -> Result<Option<String>, ValidationError> {
    match config.get(key) {
        None => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => match (s.strip_prefix('$'), env) {
            (Some(_), None) => Ok(None),
            (Some(var), Some(env)) => env(var)
                .map(Some)
                .ok_or_else(|| invalid(key, format!("names the environment variable {var}, which is not set"))),
            (None, _) => Ok(Some(s.clone())),
        },
        Some(v) => Err(invalid(key, format!("{v} is not a string"))),
    }
}

/// The sink at `url`. Messages show `shown`, the value as written in the `Config` (a `$NAME`
/// stays a name: the variable's value, perhaps a secret, is never echoed into an error).
fn sink(key: &str, url: &str, shown: &str, unix_ok: bool) -> Result<SinkAddr, ValidationError> {
    if let Some(addr) = url.strip_prefix("udp://") {
        return addr
            .parse()
            .map(SinkAddr::Udp)
            .map_err(|_| invalid(key, format!("{shown:?}: expected udp://<IP address>:<port>")));
    }
    if unix_ok && let Some(path) = url.strip_prefix("unix://") {
        if path.starts_with('/') {
            return Ok(SinkAddr::Unix(path.to_owned()));
        }
        return Err(invalid(key, format!("{shown:?}: expected unix:///<absolute path>")));
    }
    let forms = if unix_ok { "udp:// or unix://" } else { "udp://" };
    Err(invalid(key, format!("{shown:?}: the URL must be {forms}")))
}

/// A plain string value (no `$NAME`: Consul resolves environment variables in the statsd
/// URLs only).
fn plain(config: &OpaqueConfig, key: &str) -> Result<Option<String>, ValidationError> {
    match config.get(key) {
        None => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(invalid(key, format!("{v} is not a string"))),
    }
}

/// JSON objects given as a string: one object, several separated by commas (Consul's form),
/// or an array. Each must be an object; `required` names a string field each must have.
fn objects(key: &str, text: &str, required: Option<&str>, ty: &str) -> Result<Vec<Value>, ValidationError> {
    let trimmed = text.trim();
    let wrapped = if trimmed.starts_with('[') {
        trimmed.to_owned()
    } else {
        format!("[{trimmed}]")
    };
    let mut list: Vec<Value> =
        serde_json::from_str(&wrapped).map_err(|e| invalid(key, format!("is not JSON objects: {e}")))?;
    for (i, v) in list.iter_mut().enumerate() {
        envoy_json::decode(ty, &v.to_string()).map_err(|e| invalid(key, format!("item {i} {e}")))?;
        // The bootstrap takes the object itself, without the type URL an `Any` would carry.
        if let Some(obj) = v.as_object_mut() {
            obj.remove("@type");
        }
        let Some(obj) = v.as_object() else {
            return Err(invalid(key, format!("item {i} is not a JSON object")));
        };
        if let Some(field) = required
            && obj.get(field).is_none_or(|n| n.as_str().is_none_or(str::is_empty))
        {
            return Err(invalid(key, format!("item {i} has no {field:?}")));
        }
    }
    Ok(list)
}

fn one_object(config: &OpaqueConfig, key: &str, ty: &str) -> Result<Option<Value>, ValidationError> {
    let Some(text) = plain(config, key)? else {
        return Ok(None);
    };
    let v: Value = serde_json::from_str(&text).map_err(|e| invalid(key, format!("is not JSON: {e}")))?;
    if !v.is_object() {
        return Err(invalid(key, "must be one JSON object"));
    }
    envoy_json::decode(ty, &text).map_err(|e| invalid(key, e.to_string()))?;
    Ok(Some(v))
}

fn many(config: &OpaqueConfig, key: &str, required: Option<&str>, ty: &str) -> Result<Vec<Value>, ValidationError> {
    match plain(config, key)? {
        None => Ok(Vec::new()),
        Some(text) => objects(key, &text, required, ty),
    }
}

impl BootstrapOptions {
    /// Decodes the bootstrap keys of `config` (a proxy's own keys merged over
    /// `proxy-defaults`'), `$NAME` values taken from `env`.
    pub fn parse(config: &OpaqueConfig, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, ValidationError> {
        Self::decode(config, Some(env))
    }

    fn decode(config: &OpaqueConfig, env: Env<'_>) -> Result<Self, ValidationError> {
        let mut out = Self::default();
        let shown = |key: &str| config.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
        if let Some(url) = string(config, "envoy_statsd_url", env)? {
            out.statsd = Some(sink("envoy_statsd_url", &url, &shown("envoy_statsd_url"), false)?);
        }
        if let Some(url) = string(config, "envoy_dogstatsd_url", env)? {
            out.dogstatsd = Some(sink("envoy_dogstatsd_url", &url, &shown("envoy_dogstatsd_url"), true)?);
        }
        if let Some(addr) = plain(config, "envoy_prometheus_bind_addr")? {
            out.prometheus_bind = Some(addr.parse().map_err(|_| {
                invalid(
                    "envoy_prometheus_bind_addr",
                    format!("{addr:?} is not <IP address>:<port>"),
                )
            })?);
        }
        out.stats_tags = tags(config)?;
        if let Some(text) = plain(config, "envoy_stats_flush_interval")? {
            let d = crate::duration::GoDuration::parse(&text)
                .map_err(|e| invalid("envoy_stats_flush_interval", e.to_string()))?
                .0;
            if d.is_zero() {
                return Err(invalid("envoy_stats_flush_interval", "must be above zero"));
            }
            out.stats_flush_interval = Some(d);
        }
        out.stats_config = one_object(config, "envoy_stats_config_json", "envoy.config.metrics.v3.StatsConfig")?;
        out.stats_sinks = many(
            config,
            "envoy_stats_sinks_json",
            Some("name"),
            "envoy.config.metrics.v3.StatsSink",
        )?;
        out.tracing = one_object(config, "envoy_tracing_json", "envoy.config.trace.v3.Tracing")?;
        out.extra_clusters = many(
            config,
            "envoy_extra_static_clusters_json",
            Some("name"),
            envoy_json::CLUSTER,
        )?;
        out.extra_listeners = many(
            config,
            "envoy_extra_static_listeners_json",
            Some("name"),
            envoy_json::LISTENER,
        )?;
        Ok(out)
    }

    /// Checks the bootstrap keys of a `Config` where it is written: their shapes, keys
    /// meshd does not honour yet refused. `$NAME` values are taken on trust here (they are
    /// resolved where `connect envoy` runs).
    pub fn check(config: &OpaqueConfig) -> Result<(), ValidationError> {
        for key in UNSUPPORTED_PROXY_KEYS.iter().chain(&["bind_port"]) {
            if config.contains_key(*key) {
                return Err(unsupported(key));
            }
        }
        if let Some(key) = config
            .keys()
            .find(|k| k.to_ascii_lowercase().starts_with("envoy_") && !HONOURED_ENVOY_KEYS.contains(&k.as_str()))
        {
            return Err(invalid(
                key,
                format!(
                    "is not a key meshd knows (it would be ignored, so it is refused); the envoy_ keys it honours: {}",
                    HONOURED_ENVOY_KEYS.join(", ")
                ),
            ));
        }
        for (key, ty) in PROXY_ESCAPE_HATCHES {
            check_escape_hatch(config, key, ty)?;
        }
        Self::decode(config, None).map(drop)
    }
}

/// The 400 for a key Consul knows and meshd does not honour yet.
pub fn unsupported(key: &str) -> ValidationError {
    invalid(
        key,
        "is not supported by meshd yet (it would be ignored, so it is refused); remove it",
    )
}

/// `envoy_stats_tags`: a list of `name=value` strings, or one string of them separated by
/// commas.
fn tags(config: &OpaqueConfig) -> Result<Vec<(String, String)>, ValidationError> {
    const KEY: &str = "envoy_stats_tags";
    let items: Vec<String> = match config.get(KEY) {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => s
            .split(',')
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
            .collect(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| invalid(KEY, format!("{v} is not a string")))
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(invalid(KEY, format!("{v} is not a list of name=value strings"))),
    };
    items
        .into_iter()
        .map(|t| match t.split_once('=') {
            Some((name, value)) if !name.trim().is_empty() => Ok((name.trim().to_owned(), value.trim().to_owned())),
            _ => Err(invalid(KEY, format!("{t:?} is not name=value"))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(v: Value) -> OpaqueConfig {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn bootstrap_keys_decode() {
        let c = config(json!({
            "envoy_statsd_url": "$STATSD",
            "envoy_dogstatsd_url": "unix:///var/run/dogstatsd.sock",
            "envoy_prometheus_bind_addr": "0.0.0.0:9102",
            "envoy_stats_tags": ["team=a", "env = prod"],
            "envoy_stats_flush_interval": "5s",
            "envoy_tracing_json": r#"{"http": {"name": "envoy.tracers.zipkin"}}"#,
            "envoy_extra_static_clusters_json": r#"{"name": "a"}, {"name": "b"}"#,
            "envoy_extra_static_listeners_json": r#"[{"name": "l"}]"#,
            "envoy_stats_sinks_json": r#"{"name": "envoy.stat_sinks.metrics_service"}"#,
        }));
        let env = |v: &str| (v == "STATSD").then(|| "udp://10.0.0.1:8125".to_owned());
        let o = BootstrapOptions::parse(&c, &env).unwrap();
        assert_eq!(o.statsd, Some(SinkAddr::Udp("10.0.0.1:8125".parse().unwrap())));
        assert_eq!(o.dogstatsd, Some(SinkAddr::Unix("/var/run/dogstatsd.sock".into())));
        assert_eq!(o.prometheus_bind, Some("0.0.0.0:9102".parse().unwrap()));
        assert_eq!(
            o.stats_tags,
            [("team".into(), "a".into()), ("env".into(), "prod".into())]
        );
        assert_eq!(o.stats_flush_interval, Some(Duration::from_secs(5)));
        assert_eq!(o.extra_clusters.len(), 2);
        assert_eq!(o.extra_listeners.len(), 1);
        assert_eq!(o.stats_sinks.len(), 1);
        assert!(o.tracing.is_some());
        assert!(
            BootstrapOptions::check(&c).is_ok(),
            "$NAME is resolved where Envoy runs"
        );
        let e = BootstrapOptions::parse(&c, &|_| None).unwrap_err().to_string();
        assert!(e.contains("Config.envoy_statsd_url") && e.contains("STATSD"), "{e}");
        // A variable whose value is not a URL (a secret, say) is named, never shown.
        let secret = |_: &str| Some("s3cr3t-token".to_owned());
        let e = BootstrapOptions::parse(&c, &secret).unwrap_err().to_string();
        assert!(e.contains("$STATSD") && !e.contains("s3cr3t"), "{e}");
    }

    #[test]
    fn bad_bootstrap_keys_name_the_field() {
        for (key, bad) in [
            ("envoy_statsd_url", json!("tcp://1.2.3.4:1")),
            ("envoy_statsd_url", json!("unix:///x")),
            ("envoy_statsd_url", json!(8125)),
            ("envoy_dogstatsd_url", json!("udp://host:1")),
            ("envoy_prometheus_bind_addr", json!("localhost:9102")),
            ("envoy_stats_tags", json!(["novalue"])),
            ("envoy_stats_flush_interval", json!("soon")),
            ("envoy_tracing_json", json!("{not json")),
            ("envoy_tracing_json", json!("[1]")),
            ("envoy_extra_static_clusters_json", json!(r#"{"type": "STATIC"}"#)),
            ("envoy_extra_static_listeners_json", json!("[1]")),
            ("envoy_public_listener_json", json!(r#"{"nmae": "x"}"#)),
            ("envoy_public_listener_json", json!(r#"{"name": "x"}"#)),
            ("envoy_listener_tracing_json", json!(r#"{"random_sampling": "all"}"#)),
            (
                "envoy_local_cluster_json",
                json!(r#"{"@type": "type.googleapis.com/envoy.api.v2.Cluster"}"#),
            ),
            ("envoy_tracing_json", json!(r#"{"http": {"nam": "zipkin"}}"#)),
            (
                "envoy_extra_static_clusters_json",
                json!(r#"{"name": "a", "type": "STATICK"}"#),
            ),
            ("envoy_stats_bind_addr", json!("0.0.0.0:9000")),
            ("envoy_gateway_bind_addresses", json!({})),
            ("envoy_statsd_urll", json!("udp://127.0.0.1:8125")),
            ("Envoy_Statsd_Url", json!("udp://127.0.0.1:8125")),
            ("bind_port", json!(21000)),
        ] {
            let e = BootstrapOptions::check(&config(json!({key: bad})))
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("Config.{key}")), "{key} {bad}: {e}");
        }
    }

    #[test]
    fn upstream_escape_hatches_are_decoded_when_written() {
        let ok = config(json!({
            "envoy_cluster_json": r#"{"connect_timeout": "3s", "type": "EDS"}"#,
            "envoy_listener_json": r#"{"name": "up"}"#,
        }));
        crate::protocol::ProxyOptions::check_upstream(&ok).unwrap();
        for (key, bad) in [
            ("envoy_cluster_json", r#"{"connect_timeot": "3s"}"#),
            ("envoy_cluster_json", r#"{"type": "STATICK"}"#),
            ("envoy_listener_json", r#"{"nmae": "x"}"#),
        ] {
            let e = crate::protocol::ProxyOptions::check_upstream(&config(json!({key: bad})))
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("Config.{key}")), "{key} {bad}: {e}");
        }
    }
}
