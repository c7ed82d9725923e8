//! Every field of `proxy-defaults` and `service-defaults` meshd parses (and every key of a
//! proxy's `Config` in Consul's `envoy_` namespace) is either honoured or refused when
//! written: none is read and silently ignored. The fields are listed from the types
//! themselves (serde's own list of the fields it accepts), so a field added to a type without
//! being classified here fails this test; each refused one is written and must be a 400
//! naming it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use structs::Validate;
use structs::config_entry::{ProxyDefaults, ServiceDefaults};

/// The fields a type that denies unknown fields accepts, from serde's error for one it does
/// not know.
fn fields_of<T: DeserializeOwned>() -> Vec<String> {
    let err = serde_json::from_value::<T>(json!({"\u{1}walk": 0}))
        .err()
        .expect("unknown field refused");
    let text = err.to_string();
    let list = text.split("expected one of ").nth(1).expect("serde lists the fields");
    list.split(", ")
        .map(|f| f.trim_matches(|c: char| c == '`' || c.is_whitespace()).to_owned())
        .filter(|f| !f.is_empty())
        .map(|f| f.split('`').next().unwrap().to_owned())
        .collect()
}

/// The fields of a type serialized whole (those with no `skip_serializing_if`).
fn serialized_fields<T: serde::Serialize>(value: T) -> Vec<String> {
    serde_json::to_value(value)
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

/// How meshd treats a field.
enum Use {
    /// Acted on: what does it, and the test that shows it.
    Honoured(&'static str),
    /// Bookkeeping of the entry itself.
    Entry,
    /// Refused when set: a value that must be a 400 naming the field.
    Refused(Value),
}

fn check<T: DeserializeOwned + Validate>(kind: &str, fields: &[String], table: &[(&str, Use)]) {
    let known: Vec<&str> = table.iter().map(|(f, _)| *f).collect();
    for f in fields {
        assert!(
            known.contains(&f.as_str()),
            "{kind}: field {f} is neither honoured nor refused: classify it in field_walk.rs (and honour or refuse it)"
        );
    }
    for (field, how) in table {
        assert!(
            fields.iter().any(|f| f == field),
            "{kind}: {field} is no field of the type any more"
        );
        match how {
            Use::Honoured(why) => assert!(!why.is_empty()),
            Use::Entry => {}
            Use::Refused(value) => {
                let mut entry = json!({"Name": "global"});
                // Dotted: a nested field.
                let mut at = &mut entry;
                let parts: Vec<&str> = field.split('.').collect();
                for p in &parts[..parts.len() - 1] {
                    at = at.as_object_mut().unwrap().entry(*p).or_insert(json!({}));
                }
                at[parts[parts.len() - 1]] = value.clone();
                let e = match serde_json::from_value::<T>(entry.clone()) {
                    Err(e) => e.to_string(),
                    Ok(parsed) => parsed
                        .validate()
                        .expect_err(&format!("{kind} {entry} is refused"))
                        .to_string(),
                };
                assert!(e.contains(parts[0]), "{kind} {field}: {e}");
            }
        }
    }
}

#[test]
fn every_proxy_defaults_field_is_honoured_or_refused() {
    use Use::*;
    let table = [
        ("Name", Entry),
        ("Meta", Entry),
        ("CreateIndex", Entry),
        ("ModifyIndex", Entry),
        (
            "Config",
            Honoured("the keys below; xds and connect envoy (every_proxy_config_key...)"),
        ),
        (
            "Mode",
            Honoured("transparent: proxycfg implicit upstreams, xds outbound listener (transparent.rs)"),
        ),
        (
            "TransparentProxy",
            Honoured("OutboundListenerPort: xds outbound listener; DialedDirectly: filter chains on instance IPs"),
        ),
        (
            "MeshGateway",
            Honoured(
                "Mode local/remote: proxycfg connect_proxy gateway_endpoints (federation e2e); none: refused in the status across datacenters",
            ),
        ),
        (
            "Expose",
            Honoured("Paths: xds resources/expose.rs (validate.rs exposed_paths_*); Checks refused (below)"),
        ),
        (
            "AccessLogs",
            Honoured("xds resources/access_logs.rs (validate.rs access_logs_*, envoy_e2e)"),
        ),
        (
            "EnvoyExtensions",
            Honoured("builtin/lua and builtin/property-override: xds resources/extensions.rs; others refused"),
        ),
        // Consul's, kept and accepted at meshd's behaviour (strict mTLS, no locality order,
        // each resolver's failover); any other value refused.
        ("MutualTLSMode", Refused(json!("permissive"))),
        ("FailoverPolicy", Refused(json!({"Mode": "order-by-locality"}))),
        ("PrioritizeByLocality", Refused(json!({"Mode": "failover"}))),
    ];
    check::<ProxyDefaults>("proxy-defaults", &fields_of::<ProxyDefaults>(), &table);
}

#[test]
fn every_service_defaults_field_is_honoured_or_refused() {
    use Use::*;
    let table = [
        ("Name", Entry),
        ("Meta", Entry),
        ("CreateIndex", Entry),
        ("ModifyIndex", Entry),
        // Consul's, kept and accepted at "strict" (meshd's sidecars always require mTLS).
        ("MutualTLSMode", Refused(json!("permissive"))),
        ("Protocol", Honoured("central config: the service's protocol")),
        (
            "Mode",
            Honoured("transparent: proxycfg implicit upstreams, xds outbound listener (transparent.rs)"),
        ),
        (
            "TransparentProxy",
            Honoured("OutboundListenerPort: xds outbound listener; DialedDirectly: filter chains on instance IPs"),
        ),
        (
            "MeshGateway",
            Honoured(
                "Mode local/remote: proxycfg connect_proxy gateway_endpoints (federation e2e); none: refused in the status across datacenters",
            ),
        ),
        (
            "Expose",
            Honoured("Paths: central config's Expose, xds resources/expose.rs; Checks refused (below)"),
        ),
        ("ExternalSNI", Refused(json!("db.example.com"))),
        (
            "Destination",
            Honoured(
                "transparent sidecars' destination chains and terminating gateways' destination clusters (validate.rs destination goldens, test_transparent.py)",
            ),
        ),
        (
            "UpstreamConfig",
            Honoured("central config per upstream (protocol, timeouts, limits, outlier detection)"),
        ),
        (
            "MaxInboundConnections",
            Honoured("local_app circuit breaker (inbound settings)"),
        ),
        ("LocalConnectTimeoutMs", Honoured("local_app connect timeout")),
        ("LocalRequestTimeoutMs", Honoured("route timeout to local_app")),
        (
            "BalanceInboundConnections",
            Honoured("exact balance on the public listener"),
        ),
        (
            "RateLimits",
            Honoured("local rate limit (validate.rs rate_limits_*, l7_e2e)"),
        ),
        (
            "EnvoyExtensions",
            Honoured("builtin/lua and builtin/property-override: xds resources/extensions.rs; others refused"),
        ),
    ];
    check::<ServiceDefaults>("service-defaults", &fields_of::<ServiceDefaults>(), &table);
}

#[test]
fn nested_fields_are_honoured_or_refused() {
    // Upstream settings deny unknown fields and are honoured, each of them.
    let upstream = fields_of::<structs::config_entry::UpstreamConfig>();
    for f in [
        "Name",
        "Protocol",
        "ConnectTimeoutMs",
        "MeshGateway",
        "Limits",
        "PassiveHealthCheck",
    ] {
        assert!(upstream.iter().any(|u| u == f), "UpstreamConfig.{f}: {upstream:?}");
    }
    assert_eq!(
        upstream.len(),
        6,
        "a new UpstreamConfig field: honour or refuse it: {upstream:?}"
    );
    let logs = fields_of::<structs::config_entry::AccessLogsConfig>();
    assert_eq!(logs.len(), 6, "a new AccessLogs field: honour or refuse it: {logs:?}");
    // Every field set, so that none is left out as empty.
    let full = structs::ExposeConfig {
        checks: true,
        paths: vec![structs::proxy::ExposePath::default()],
    };
    let expose: Vec<String> = serialized_fields(full);
    assert_eq!(expose, ["Checks", "Paths"]);
    // Central config's Expose.Checks: the agent reads the sidecar's own only, so refused.
    for kind in ["proxy-defaults", "service-defaults"] {
        let name = if kind == "proxy-defaults" { "global" } else { "web" };
        let entry =
            structs::ConfigEntry::from_json(json!({"Kind": kind, "Name": name, "Expose": {"Checks": true}})).unwrap();
        let e = entry.validate().unwrap_err().to_string();
        assert!(e.contains("Expose.Checks"), "{kind}: {e}");
    }
    let path: Vec<String> = serialized_fields(structs::proxy::ExposePath {
        listener_port: 1,
        path: "/p".into(),
        local_path_port: 2,
        protocol: "http".into(),
        parsed_from_check: true,
    });
    assert_eq!(
        path,
        ["ListenerPort", "Path", "LocalPathPort", "Protocol", "ParsedFromCheck"]
    );
}

/// Consul's `envoy_` keys of a proxy's `Config`: meshd honours a list of them and refuses
/// every other (misspellings included) when the config is written.
#[test]
fn every_proxy_config_envoy_key_is_honoured_or_refused() {
    let config = |key: &str, v: Value| {
        let mut c = serde_json::Map::new();
        c.insert(key.into(), v);
        c
    };
    for key in [
        "envoy_stats_bind_addr",
        "envoy_gateway_bind_addresses",
        "envoy_mesh_gateway_no_default_bind",
        "envoy_telemetry_collector_bind_socket_dir",
        "envoy_anything_else",
    ] {
        let e = structs::ProxyOptions::check_proxy(&config(key, json!("x")))
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("Config.{key}")), "{key}: {e}");
    }
    for key in structs::bootstrap::HONOURED_ENVOY_KEYS {
        let value = if *key == "envoy_dns_discovery_type" {
            "STRICT_DNS"
        } else {
            ""
        };
        let e = structs::ProxyOptions::check_proxy(&config(key, json!(value)));
        assert!(e.is_ok(), "{key} is accepted: {e:?}");
    }
}
