//! `EnvoyExtensions` (proxy-defaults' then service-defaults'), applied to a sidecar's
//! resources once everything else is built, as Consul does:
//!
//! - `builtin/lua`: Envoy's Lua filter, before the router of every HTTP connection manager
//!   of the inbound (public) or the outbound (upstream) listeners;
//! - `builtin/ext-authz`: Envoy's external authorization (the HTTP filter, or for TCP the
//!   network filter, gRPC only) right after the intentions' RBAC on the public listener,
//!   asking the service at `Target.URI` through a cluster of its own;
//! - `builtin/otel-access-logging`: an OpenTelemetry access log (to a collector over gRPC)
//!   on every HTTP connection manager and TCP proxy of the listeners of a direction;
//! - `builtin/wasm`: a proxy-wasm filter from a file on the proxy's host, before the router
//!   (HTTP) or the TCP proxy (TCP) of the listeners of a direction;
//! - `builtin/property-override`: each patch sets or clears a field, by path, of the
//!   listeners, clusters, routes or endpoints of a direction (outbound: of the upstreams it
//!   names, or all).
//!
//! An extension that cannot apply (listeners of its direction there but none of the kind it
//! goes on, such as Lua on a TCP service; a patch that fails) is a build problem in the
//! proxy's status; a `Required` one holds the proxy's configuration back (its last good
//! resources stay, none if it never had any), as Consul. With nothing of its direction (an
//! outbound extension on a proxy without upstreams, a patch selecting none of this proxy's
//! resources) there is nothing to do.

use super::{CLUSTER, ENDPOINT, LISTENER, ROUTE, Resources};
use envoy_types::pb::envoy::config::core::v3::{DataSource, TrafficDirection, data_source};
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
use envoy_types::pb::envoy::extensions::filters::http::lua::v3::Lua;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::util::pack_any;
use prost::{Message, Name};
use proxycfg::ConfigSnapshot;
use structs::config_entry::EnvoyExtension;
use structs::config_entry::extensions::{
    EXT_AUTHZ, ExtAuthzArguments, ExtAuthzTarget, LUA, LuaArguments, OTEL_ACCESS_LOGGING, OtelArguments,
    PROPERTY_OVERRIDE, PropertyOverrideArguments, PropertyPatch, WASM, WasmArguments,
};

/// Applies the sidecar's extensions to `out`.
pub(crate) fn apply(snap: &ConfigSnapshot, out: &mut Resources) {
    if snap.service.connect.native {
        return;
    }
    let Some(resolved) = snap.connect_proxy().and_then(|cp| cp.resolved_config.as_deref()) else {
        return;
    };
    for (i, ext) in resolved.envoy_extensions.iter().enumerate() {
        let result = match ext.name.as_str() {
            LUA => args::<LuaArguments>(ext).and_then(|a| lua(&a, out)),
            PROPERTY_OVERRIDE => args::<PropertyOverrideArguments>(ext).and_then(|a| property_override(&a, out)),
            EXT_AUTHZ => args::<ExtAuthzArguments>(ext).and_then(|a| ext_authz(&a, out)),
            OTEL_ACCESS_LOGGING => args::<OtelArguments>(ext).and_then(|a| otel_access_logging(&a, out)),
            WASM => args::<WasmArguments>(ext).and_then(|a| wasm(&a, out)),
            other => Err(format!("{other} is not an extension meshd runs")),
        };
        if let Err(why) = result {
            let part = format!("extension:{i}:{}", ext.name);
            let problem = format!("Envoy extension {} cannot apply: {why}", ext.name);
            if ext.required {
                hold_back(
                    out,
                    part,
                    format!("{problem} (Required: the proxy's configuration is held back)"),
                );
            } else {
                out.problems
                    .insert(part, format!("{problem} (not Required: the proxy goes on without it)"));
            }
        }
    }
}

fn args<T: serde::de::DeserializeOwned>(ext: &EnvoyExtension) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::Object(ext.arguments.clone())).map_err(|e| format!("arguments: {e}"))
}

/// Holds back every resource of the build: the proxy keeps its last good ones.
fn hold_back(out: &mut Resources, part: String, problem: String) {
    let mut names = Vec::new();
    for (t, map) in std::mem::take(&mut out.by_type) {
        names.extend(map.into_keys().map(|n| (t, n)));
    }
    for (t, map) in std::mem::take(&mut out.shared) {
        names.extend(map.into_keys().map(|n| (t, n)));
    }
    out.fail(part, problem, names);
}

fn is_inbound(name: &str, listener: &Listener) -> bool {
    listener.traffic_direction == TrafficDirection::Inbound as i32 && !name.starts_with("exposed_path_")
}

/// The Lua filter on every HTTP connection manager of the listeners of its direction.
fn lua(a: &LuaArguments, out: &mut Resources) -> Result<(), String> {
    let inbound = a.listener == "inbound";
    let filter = super::listeners::http_filter(
        "envoy.filters.http.lua",
        pack_any(Lua {
            default_source_code: Some(DataSource {
                specifier: Some(data_source::Specifier::InlineString(a.script.clone())),
                ..Default::default()
            }),
            ..Default::default()
        }),
    );
    let (mut seen, mut applied) = (0, 0);
    for (name, any) in out.by_type.get_mut(LISTENER).into_iter().flatten() {
        let mut listener = Listener::decode(any.value.as_slice()).map_err(|e| format!("{name}: {e}"))?;
        if is_inbound(name, &listener) != inbound {
            continue;
        }
        seen += 1;
        let mut changed = false;
        for chain in &mut listener.filter_chains {
            for f in &mut chain.filters {
                if let Some(filter::ConfigType::TypedConfig(typed)) = &mut f.config_type
                    && typed.type_url == HttpConnectionManager::type_url()
                {
                    let mut hcm =
                        HttpConnectionManager::decode(typed.value.as_slice()).map_err(|e| format!("{name}: {e}"))?;
                    let router = hcm.http_filters.len().saturating_sub(1);
                    hcm.http_filters.insert(router, filter.clone());
                    *typed = pack_any(hcm);
                    changed = true;
                }
            }
        }
        if changed {
            *any = pack_any(listener);
            applied += 1;
        }
    }
    if seen > 0 && applied == 0 {
        return Err(format!(
            "no {} HTTP listener to put the Lua filter on (Lua runs on HTTP protocols only)",
            a.listener
        ));
    }
    Ok(())
}

/// Whether resource `name` of an outbound type belongs to upstream service `service`.
fn of_service(name: &str, service: &str) -> bool {
    name == service
        || name.starts_with(&format!("{service}."))
        || name.starts_with(&format!("{service}:"))
        || name.starts_with(&format!("default/{service}:"))
}

/// Each patch on the resources its filter selects.
fn property_override(a: &PropertyOverrideArguments, out: &mut Resources) -> Result<(), String> {
    for (i, p) in a.patches.iter().enumerate() {
        // A patch matching none of this proxy's resources is for other proxies.
        patch(p, out).map_err(|e| format!("Patches[{i}]: {e}"))?;
    }
    Ok(())
}

fn patch(p: &PropertyPatch, out: &mut Resources) -> Result<usize, String> {
    let f = &p.resource_filter;
    let type_url = match f.resource_type.as_str() {
        "listener" => LISTENER,
        "cluster" => CLUSTER,
        "route" => ROUTE,
        _ => ENDPOINT,
    };
    let inbound = f.traffic_direction == "inbound";
    let change = envoy_json::Patch {
        path: &p.path,
        value: if p.op == "add" { p.value.as_ref() } else { None },
    };
    // Endpoints shared with other proxies are copied into this build to be patched.
    if let Some(shared) = out.shared.get_mut(type_url) {
        let names: Vec<String> = shared.keys().cloned().collect();
        for name in names {
            let selected = f.services.is_empty() || f.services.iter().any(|s| of_service(&name, &s.name));
            if selected && let Some(v) = shared.remove(&name) {
                out.by_type
                    .entry(type_url)
                    .or_default()
                    .insert(name, v.resource.clone());
            }
        }
    }
    let mut matched = 0;
    for (name, any) in out.by_type.get_mut(type_url).into_iter().flatten() {
        let direction_inbound = match type_url {
            LISTENER => is_inbound(
                name,
                &Listener::decode(any.value.as_slice()).map_err(|e| e.to_string())?,
            ),
            CLUSTER => name == super::clusters::LOCAL_APP,
            _ => false,
        };
        if direction_inbound != inbound {
            continue;
        }
        if !f.services.is_empty() && !f.services.iter().any(|s| of_service(name, &s.name)) {
            continue;
        }
        let encoded = envoy_json::Encoded {
            type_url: any.type_url.clone(),
            value: any.value.clone(),
        };
        let patched = envoy_json::apply_patch(&encoded, &change).map_err(|e| format!("{name}: {e}"))?;
        *any = Any {
            type_url: patched.type_url,
            value: patched.value,
        };
        matched += 1;
    }
    Ok(matched)
}

/// Envoy JSON decoded as Envoy type `ty` (the extension's own output: an error is a bug).
fn envoy(ty: &str, json: &serde_json::Value) -> Result<Any, String> {
    envoy_json::decode_cached(ty, &json.to_string())
        .map(|e| Any {
            type_url: e.type_url,
            value: e.value,
        })
        .map_err(|e| e.to_string())
}

/// The external authorization service's cluster and the filters asking it, right after the
/// intentions on every inbound filter chain.
fn ext_authz(a: &ExtAuthzArguments, out: &mut Resources) -> Result<(), String> {
    use serde_json::json;
    let (grpc, service) = a.service().ok_or("set exactly one of GrpcService and HttpService")?;
    let (host, port) = service.target.host_port().ok_or("Target.URI is not host:port")?;
    let (cluster, c) = target_cluster("ext_authz", &service.target, grpc)?;
    let timeout = duration(
        service
            .target
            .timeout
            .map_or(std::time::Duration::from_secs(1), |d| d.0),
    );
    let grpc_service = json!({"envoy_grpc": {"cluster_name": cluster}, "timeout": timeout});
    let stat_prefix = if a.config.stat_prefix.is_empty() {
        "ext_authz"
    } else {
        &a.config.stat_prefix
    };
    let mut http = json!({"transport_api_version": "V3", "stat_prefix": stat_prefix,
        "include_peer_certificate": a.config.include_peer_certificate,
        "clear_route_cache": a.config.clear_route_cache});
    if grpc {
        http["grpc_service"] = grpc_service.clone();
    } else {
        http["http_service"] = json!({"server_uri": {"uri": format!("http://{host}:{port}"), "cluster": cluster,
            "timeout": timeout}, "path_prefix": service.path_prefix});
    }
    if a.config.status_on_error != 0 {
        http["status_on_error"] = json!({"code": a.config.status_on_error});
    }
    if let Some(b) = &a.config.with_request_body {
        http["with_request_body"] = json!({"max_request_bytes": b.max_request_bytes,
            "allow_partial_message": b.allow_partial_message, "pack_as_bytes": b.pack_as_bytes});
    }
    let http_filter = super::listeners::http_filter(
        "envoy.filters.http.ext_authz",
        envoy("envoy.extensions.filters.http.ext_authz.v3.ExtAuthz", &http)?,
    );
    let network_filter = grpc
        .then(|| {
            let net = json!({"stat_prefix": stat_prefix, "grpc_service": grpc_service, "transport_api_version": "V3",
                "include_peer_certificate": a.config.include_peer_certificate});
            envoy("envoy.extensions.filters.network.ext_authz.v3.ExtAuthz", &net)
                .map(|cfg| super::listeners::network_filter("envoy.filters.network.ext_authz", cfg))
        })
        .transpose()?;
    let (mut seen, mut applied) = (0, 0);
    for (name, any) in out.by_type.get_mut(LISTENER).into_iter().flatten() {
        let mut listener = Listener::decode(any.value.as_slice()).map_err(|e| format!("{name}: {e}"))?;
        if !is_inbound(name, &listener) {
            continue;
        }
        seen += 1;
        for chain in &mut listener.filter_chains {
            let hcm_at = chain.filters.iter().position(|f| {
                matches!(&f.config_type, Some(filter::ConfigType::TypedConfig(t)) if t.type_url == HttpConnectionManager::type_url())
            });
            if let Some(i) = hcm_at {
                let Some(filter::ConfigType::TypedConfig(typed)) = &mut chain.filters[i].config_type else {
                    continue;
                };
                let mut hcm =
                    HttpConnectionManager::decode(typed.value.as_slice()).map_err(|e| format!("{name}: {e}"))?;
                let after_rbac = hcm
                    .http_filters
                    .iter()
                    .take_while(|f| f.name == "envoy.filters.http.rbac")
                    .count();
                hcm.http_filters.insert(after_rbac, http_filter.clone());
                *typed = pack_any(hcm);
            } else if let Some(f) = &network_filter {
                let after_rbac = chain
                    .filters
                    .iter()
                    .take_while(|f| f.name == "envoy.filters.network.rbac")
                    .count();
                chain.filters.insert(after_rbac, f.clone());
            } else {
                return Err(format!(
                    "{name} is TCP: an HTTP authorization service cannot check its connections (use GrpcService)"
                ));
            }
            applied += 1;
        }
        *any = pack_any(listener);
    }
    if seen > 0 && applied == 0 {
        return Err("no inbound listener to check requests on".into());
    }
    out.insert(CLUSTER, cluster, c);
    Ok(())
}

/// Envoy JSON's duration.
fn duration(d: std::time::Duration) -> String {
    format!("{}.{:09}s", d.as_secs(), d.subsec_nanos())
}

/// The cluster `<prefix>_<host>_<port>` of a target's URI (HTTP/2 for gRPC): its name and
/// the resource.
fn target_cluster(prefix: &str, target: &ExtAuthzTarget, grpc: bool) -> Result<(String, Any), String> {
    use serde_json::json;
    let (host, port) = target.host_port().ok_or("Target.URI is not host:port")?;
    let cluster = format!("{prefix}_{host}_{port}");
    let ip = host.parse::<std::net::IpAddr>().is_ok();
    let mut c = json!({"name": cluster, "type": if ip { "STATIC" } else { "LOGICAL_DNS" }, "connect_timeout": "5s",
        "load_assignment": {"cluster_name": cluster, "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": host, "port_value": port}}}}]}]}});
    if grpc {
        c["typed_extension_protocol_options"] = json!({"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}});
    }
    Ok((cluster.clone(), envoy(envoy_json::CLUSTER, &c)?))
}

/// An OpenTelemetry access log on every HTTP connection manager and TCP proxy of the
/// listeners of its direction, and the collector's cluster.
fn otel_access_logging(a: &OtelArguments, out: &mut Resources) -> Result<(), String> {
    use envoy_types::pb::envoy::config::accesslog::v3::{AccessLog, access_log};
    use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
    use serde_json::json;
    let c = &a.config;
    let (cluster, resource) = target_cluster("otel", &c.grpc_service.target, true)?;
    let timeout = duration(
        c.grpc_service
            .target
            .timeout
            .map_or(std::time::Duration::from_secs(1), |d| d.0),
    );
    let key_values = |m: &std::collections::BTreeMap<String, String>| {
        let values: Vec<serde_json::Value> = m
            .iter()
            .map(|(k, v)| json!({"key": k, "value": {"string_value": v}}))
            .collect();
        json!({"values": values})
    };
    let mut common = json!({"log_name": if c.log_name.is_empty() { "meshd-otel" } else { &c.log_name },
        "grpc_service": {"envoy_grpc": {"cluster_name": cluster}, "timeout": timeout},
        "transport_api_version": "V3", "filter_state_objects_to_log": c.filter_state_objects_to_log});
    if let Some(d) = c.buffer_flush_interval {
        common["buffer_flush_interval"] = json!(duration(d.0));
    }
    if c.buffer_size_bytes > 0 {
        common["buffer_size_bytes"] = json!(c.buffer_size_bytes);
    }
    let mut cfg = json!({"common_config": common, "attributes": key_values(&c.attributes),
        "resource_attributes": key_values(&c.resource_attributes)});
    if !c.body.is_empty() {
        cfg["body"] = json!({"string_value": c.body});
    }
    let log = AccessLog {
        name: "envoy.access_loggers.open_telemetry".into(),
        config_type: Some(access_log::ConfigType::TypedConfig(envoy(
            "envoy.extensions.access_loggers.open_telemetry.v3.OpenTelemetryAccessLogConfig",
            &cfg,
        )?)),
        ..Default::default()
    };
    let inbound = a.inbound();
    let (mut seen, mut applied) = (0, 0);
    for (name, any) in out.by_type.get_mut(LISTENER).into_iter().flatten() {
        let mut listener = Listener::decode(any.value.as_slice()).map_err(|e| format!("{name}: {e}"))?;
        if is_inbound(name, &listener) != inbound {
            continue;
        }
        seen += 1;
        for chain in &mut listener.filter_chains {
            for f in &mut chain.filters {
                let Some(filter::ConfigType::TypedConfig(typed)) = &mut f.config_type else {
                    continue;
                };
                if typed.type_url == HttpConnectionManager::type_url() {
                    let mut hcm =
                        HttpConnectionManager::decode(typed.value.as_slice()).map_err(|e| format!("{name}: {e}"))?;
                    hcm.access_log.push(log.clone());
                    *typed = pack_any(hcm);
                    applied += 1;
                } else if typed.type_url == TcpProxy::type_url() {
                    let mut tcp = TcpProxy::decode(typed.value.as_slice()).map_err(|e| format!("{name}: {e}"))?;
                    tcp.access_log.push(log.clone());
                    *typed = pack_any(tcp);
                    applied += 1;
                }
            }
        }
        *any = pack_any(listener);
    }
    if seen > 0 && applied == 0 {
        return Err(format!(
            "no {} listener to log",
            if inbound { "inbound" } else { "outbound" }
        ));
    }
    out.insert(CLUSTER, cluster, resource);
    Ok(())
}

/// The Wasm filter on the listeners of its direction: before the router of each HTTP
/// connection manager (`Protocol: http`) or before the TCP proxy (`tcp`).
fn wasm(a: &WasmArguments, out: &mut Resources) -> Result<(), String> {
    use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
    use serde_json::json;
    let p = &a.plugin_config;
    let string = |s: &str| json!({"@type": "type.googleapis.com/google.protobuf.StringValue", "value": s});
    let mut vm = json!({"vm_id": p.vm_config.vm_id, "runtime": a.runtime(),
        "code": {"local": {"filename": p.vm_config.code.local.filename}}});
    if !p.vm_config.configuration.is_empty() {
        vm["configuration"] = string(&p.vm_config.configuration);
    }
    let mut plugin = json!({"name": p.name, "root_id": p.root_id, "vm_config": vm});
    if !p.configuration.is_empty() {
        plugin["configuration"] = string(&p.configuration);
    }
    let tcp = a.protocol == "tcp";
    let (ty, name) = if tcp {
        (
            "envoy.extensions.filters.network.wasm.v3.Wasm",
            "envoy.filters.network.wasm",
        )
    } else {
        ("envoy.extensions.filters.http.wasm.v3.Wasm", "envoy.filters.http.wasm")
    };
    let config = envoy(ty, &json!({"config": plugin}))?;
    let inbound = a.inbound();
    let (mut seen, mut applied) = (0, 0);
    for (lname, any) in out.by_type.get_mut(LISTENER).into_iter().flatten() {
        let mut listener = Listener::decode(any.value.as_slice()).map_err(|e| format!("{lname}: {e}"))?;
        if is_inbound(lname, &listener) != inbound {
            continue;
        }
        seen += 1;
        for chain in &mut listener.filter_chains {
            if tcp {
                let at = chain.filters.iter().position(|f| {
                    matches!(&f.config_type, Some(filter::ConfigType::TypedConfig(t)) if t.type_url == TcpProxy::type_url())
                });
                if let Some(i) = at {
                    chain
                        .filters
                        .insert(i, super::listeners::network_filter(name, config.clone()));
                    applied += 1;
                }
                continue;
            }
            for f in &mut chain.filters {
                if let Some(filter::ConfigType::TypedConfig(typed)) = &mut f.config_type
                    && typed.type_url == HttpConnectionManager::type_url()
                {
                    let mut hcm =
                        HttpConnectionManager::decode(typed.value.as_slice()).map_err(|e| format!("{lname}: {e}"))?;
                    let router = hcm.http_filters.len().saturating_sub(1);
                    hcm.http_filters
                        .insert(router, super::listeners::http_filter(name, config.clone()));
                    *typed = pack_any(hcm);
                    applied += 1;
                }
            }
        }
        *any = pack_any(listener);
    }
    if seen > 0 && applied == 0 {
        return Err(format!(
            "no {} {} listener to put the Wasm filter on",
            if inbound { "inbound" } else { "outbound" },
            if tcp { "TCP" } else { "HTTP" }
        ));
    }
    Ok(())
}
