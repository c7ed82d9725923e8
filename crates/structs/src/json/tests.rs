use crate::json::{from_slice, from_value};
use crate::{ConnectProxyConfig, MeshGatewayConfig, MeshGatewayMode, NodeService, ServiceKind, Upstream};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

#[test]
fn mixed_casing_in_one_body() {
    let body = br#"{
        "kind": "connect-proxy",
        "ID": "web-sidecar-proxy",
        "service": "web-sidecar-proxy",
        "Port": 21000,
        "proxy": {
            "destination_service_name": "web",
            "destinationServiceID": "web",
            "localserviceport": 8080,
            "Config": {"protocol": "http", "Envoy_Extra": {"Keep_Me": 1}},
            "upstreams": [
                {"destinationName": "api", "local_bind_port": 9191,
                 "config": {"connect_timeout_ms": 500, "CamelKey": true},
                 "MESHGATEWAY": {"mode": "local"}}
            ]
        },
        "meta": {"Owner_Team": "payments", "lower": "x"}
    }"#;
    let svc: NodeService = from_slice(body).unwrap();
    assert_eq!(svc.kind, ServiceKind::ConnectProxy);
    assert_eq!(svc.id, "web-sidecar-proxy");
    assert_eq!(svc.port, 21000);
    assert_eq!(svc.proxy.destination_service_name, "web");
    assert_eq!(svc.proxy.destination_service_id, "web");
    assert_eq!(svc.proxy.local_service_port, 8080);
    // Opaque maps keep their keys exactly, at every depth.
    assert_eq!(
        Value::Object(svc.proxy.config.clone()),
        json!({"protocol": "http", "Envoy_Extra": {"Keep_Me": 1}})
    );
    let up = &svc.proxy.upstreams[0];
    assert_eq!(up.destination_name, "api");
    assert_eq!(up.local_bind_port, 9191);
    assert_eq!(
        Value::Object(up.config.clone()),
        json!({"connect_timeout_ms": 500, "CamelKey": true})
    );
    assert_eq!(
        up.mesh_gateway,
        MeshGatewayConfig {
            mode: MeshGatewayMode::Local
        }
    );
    assert_eq!(svc.meta.get("Owner_Team").map(String::as_str), Some("payments"));
    assert!(svc.meta.contains_key("lower"));
}

#[test]
fn null_lists_and_maps_read_as_empty_and_write_as_consul_does() {
    let svc: NodeService =
        from_value(json!({"Service": "db", "Tags": null, "Meta": null, "Proxy": {"Upstreams": null}})).unwrap();
    assert!(svc.tags.is_empty() && svc.meta.is_empty() && svc.proxy.upstreams.is_empty());
    let out = serde_json::to_value(&svc).unwrap();
    // Tags always a list; the proxy's empty blocks as Consul's `omitempty` leaves them.
    assert_eq!(out["Tags"], json!([]));
    assert_eq!(out["Proxy"], json!({"Mode": "", "MeshGateway": {}, "Expose": {}}));
    assert_eq!(out.get("TaggedAddresses"), None);
    assert_eq!(out["Connect"], json!({}));
    // A node's empty maps are `null`, as Consul's are, and read back as empty.
    let node = crate::Node {
        node: "n1".into(),
        ..crate::Node::default()
    };
    let out = serde_json::to_value(&node).unwrap();
    assert_eq!((&out["TaggedAddresses"], &out["Meta"]), (&Value::Null, &Value::Null));
    assert_eq!(serde_json::from_value::<crate::Node>(out).unwrap(), node);
}

#[test]
fn emits_consul_casing() {
    let svc = NodeService {
        kind: ServiceKind::ConnectProxy,
        service: "web-sidecar-proxy".into(),
        proxy: ConnectProxyConfig {
            destination_service_id: "web".into(),
            ..Default::default()
        },
        ..Default::default()
    };
    let out = serde_json::to_value(&svc).unwrap();
    assert_eq!(out["Kind"], "connect-proxy");
    assert_eq!(out["Proxy"]["DestinationServiceID"], "web");
    assert!(out.get("ID").is_some() && out.get("CreateIndex").is_some());
}

#[test]
fn decode_errors_name_the_field() {
    let err = from_value::<NodeService>(json!({"Service": "x", "Proxy": {"Upstreams": [{"LocalBindPort": 70000}]}}))
        .unwrap_err();
    assert_eq!(err.path, "Proxy.Upstreams[0].LocalBindPort");
    assert!(
        err.to_string().starts_with("Proxy.Upstreams[0].LocalBindPort: "),
        "{err}"
    );
    let err = from_value::<NodeService>(json!({"kind": "sidecar"})).unwrap_err();
    assert_eq!(err.path, "Kind");
    let err = from_slice::<NodeService>(b"{not json").unwrap_err();
    assert!(err.path.is_empty() && err.message.contains("invalid JSON"));
}

#[test]
fn a_struct_from_anything_but_an_object_expects_a_json_object() {
    for body in [
        json!([1, 2]),
        json!([]),
        json!("web"),
        json!(7),
        json!(true),
        Value::Null,
    ] {
        let err = from_value::<NodeService>(body.clone()).unwrap_err().to_string();
        assert!(err.contains("expected a JSON object"), "{body}: {err}");
    }
    // Nested too, with the field's path.
    let err = from_value::<NodeService>(json!({"Service": "x", "Proxy": [1]})).unwrap_err();
    assert_eq!(err.path, "Proxy");
    assert!(
        err.message.contains("invalid type: array, expected a JSON object"),
        "{err}"
    );
    // An optional struct may still be null.
    let def: crate::agent::ServiceDefinition = from_value(json!({"Name": "a", "Check": null})).unwrap();
    assert!(def.check.is_none());
}

#[test]
fn strict_decoding_names_unknown_keys_at_any_depth_but_not_in_user_maps() {
    use crate::json::from_value_strict;
    let ok = json!({"service": "db", "Meta": {"anything": "x"},
                    "Proxy": {"Config": {"free_key": 1}, "upstreams": [{"destination_name": "a", "local_bind_port": 1}]}});
    let strict: NodeService = from_value_strict(ok.clone()).unwrap();
    assert_eq!(strict, from_value::<NodeService>(ok).unwrap());
    let err = from_value_strict::<NodeService>(json!({"Service": "db", "Bogus": 1})).unwrap_err();
    assert_eq!(err.to_string(), "unknown key \"Bogus\"");
    let err =
        from_value_strict::<NodeService>(json!({"Service": "db", "Proxy": {"Upstreams": [{"Nope": 1}]}})).unwrap_err();
    assert_eq!(err.to_string(), "Proxy.Upstreams[0]: unknown key \"Nope\"");
    // The lenient decoder ignores them (Consul's API does).
    from_value::<NodeService>(json!({"Service": "db", "Bogus": 1})).unwrap();
}

#[test]
fn a_null_struct_field_is_absent_but_a_map_keeps_its_nulls() {
    use crate::json::from_value_strict;
    // What Consul's Go client sends for an ingress gateway's unset limits, say.
    let entry = crate::ConfigEntry::from_json(json!({"Kind": "ingress-gateway", "Name": "ig",
        "Defaults": {"MaxConnections": null, "MaxPendingRequests": 5},
        "Listeners": [{"Port": 80, "Protocol": null, "Services": [{"Name": "a", "Hosts": null}]}]}))
    .unwrap();
    let crate::ConfigEntry::IngressGateway(g) = entry else {
        panic!("not an ingress gateway")
    };
    assert_eq!(g.listeners[0].protocol(), "tcp");
    // Unknown keys given as null are absent too, even when decoding strictly.
    let svc: NodeService = from_value_strict(json!({"Service": "db", "Port": null, "Future": null})).unwrap();
    assert_eq!((svc.service.as_str(), svc.port), ("db", 0));
    // A user's map keeps what the user wrote.
    let svc: NodeService = from_value(json!({"Service": "db", "Proxy": {"Config": {"k": null}}})).unwrap();
    assert_eq!(svc.proxy.config.get("k"), Some(&serde_json::Value::Null));
}

// ---- property tests: any casing of any key outside opaque maps decodes to the same value ----

#[derive(Debug, Clone, Copy)]
enum Style {
    Pascal,
    Camel,
    Snake,
    Lower,
}

fn snake(key: &str) -> String {
    let chars: Vec<char> = key.chars().collect();
    let mut out = String::new();
    for (i, c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            let prev_lower = chars[i - 1].is_ascii_lowercase() || chars[i - 1].is_ascii_digit();
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            if prev_lower || (chars[i - 1].is_ascii_uppercase() && next_lower) {
                out.push('_');
            }
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

fn restyle(key: &str, style: Style) -> String {
    match style {
        Style::Pascal => key.to_owned(),
        Style::Camel => {
            let s = snake(key);
            let mut out = String::new();
            let mut upper = false;
            for c in s.chars() {
                if c == '_' {
                    upper = true;
                } else if upper {
                    out.push(c.to_ascii_uppercase());
                    upper = false;
                } else {
                    out.push(c);
                }
            }
            out
        }
        Style::Snake => snake(key),
        Style::Lower => key.to_ascii_lowercase(),
    }
}

/// Keys whose values are user-owned maps: their keys must be left alone.
fn opaque(key: &str) -> Option<bool> {
    match key {
        "Meta" | "Config" => Some(true),  // nothing below is ours
        "TaggedAddresses" => Some(false), // keys are the user's, values are ours
        _ => None,
    }
}

fn recase(value: &Value, styles: &mut impl Iterator<Item = Style>) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                let style = styles.next().unwrap_or(Style::Pascal);
                let v = match opaque(k) {
                    Some(true) => v.clone(),
                    Some(false) => Value::Object(
                        v.as_object()
                            .map(|m| m.iter().map(|(ik, iv)| (ik.clone(), recase(iv, styles))).collect())
                            .unwrap_or_default(),
                    ),
                    None => recase(v, styles),
                };
                out.insert(restyle(k, style), v);
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| recase(v, styles)).collect()),
        other => other.clone(),
    }
}

fn user_key() -> impl Strategy<Value = String> {
    "[A-Za-z][A-Za-z0-9_-]{0,12}"
}

fn opaque_config() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map(
        user_key(),
        prop_oneof![
            any::<bool>().prop_map(Value::from),
            user_key().prop_map(Value::from),
            any::<i32>().prop_map(Value::from)
        ],
        0..4,
    )
    .prop_map(|m| m.into_iter().collect())
}

fn name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,10}"
}

fn upstream() -> impl Strategy<Value = Upstream> {
    (
        name(),
        "[a-z0-9]{0,4}",
        1u16..,
        opaque_config(),
        prop_oneof![Just(MeshGatewayMode::Default), Just(MeshGatewayMode::Local)],
    )
        .prop_map(|(n, dc, port, config, mode)| Upstream {
            destination_name: n,
            datacenter: dc,
            local_bind_port: port,
            config,
            mesh_gateway: MeshGatewayConfig { mode },
            ..Default::default()
        })
}

fn node_service() -> impl Strategy<Value = NodeService> {
    (
        name(),
        prop::collection::vec(name(), 0..3),
        prop::collection::btree_map(user_key(), user_key(), 0..3),
        any::<u16>(),
        name(),
        opaque_config(),
        prop::collection::vec(upstream(), 0..3),
        prop::collection::btree_map(user_key(), (name(), any::<u16>()), 0..2),
    )
        .prop_map(|(svc, tags, meta, port, dest, config, upstreams, tagged)| NodeService {
            kind: ServiceKind::ConnectProxy,
            id: format!("{svc}-1"),
            service: svc,
            tags,
            meta,
            port,
            tagged_addresses: tagged
                .into_iter()
                .map(|(k, (address, port))| (k, crate::service::ServiceAddress { address, port }))
                .collect(),
            proxy: ConnectProxyConfig {
                destination_service_name: dest,
                config,
                upstreams,
                ..Default::default()
            },
            ..Default::default()
        })
}

fn style() -> impl Strategy<Value = Style> {
    prop_oneof![
        Just(Style::Pascal),
        Just(Style::Camel),
        Just(Style::Snake),
        Just(Style::Lower)
    ]
}

proptest! {
    #[test]
    fn any_key_casing_decodes_the_same(svc in node_service(), styles in prop::collection::vec(style(), 64)) {
        let canonical = serde_json::to_value(&svc).unwrap();
        let recased = recase(&canonical, &mut styles.into_iter().cycle());
        let decoded: NodeService = from_value(recased).unwrap();
        prop_assert_eq!(decoded, svc);
    }

    #[test]
    fn json_round_trip(svc in node_service()) {
        let bytes = serde_json::to_vec(&svc).unwrap();
        let back: NodeService = from_slice(&bytes).unwrap();
        prop_assert_eq!(&back, &svc);
        // And the output is stable.
        prop_assert_eq!(serde_json::to_vec(&back).unwrap(), bytes);
    }
}

#[test]
fn restyle_examples() {
    assert_eq!(restyle("DestinationServiceID", Style::Snake), "destination_service_id");
    assert_eq!(restyle("DestinationServiceID", Style::Camel), "destinationServiceId");
    assert_eq!(restyle("ID", Style::Camel), "id");
    assert_eq!(restyle("TLSSkipVerify", Style::Snake), "tls_skip_verify");
}
