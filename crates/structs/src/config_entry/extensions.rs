//! `EnvoyExtensions` of `proxy-defaults` and `service-defaults`: Consul's extension names
//! and arguments. meshd runs `builtin/lua` and `builtin/property-override`; Consul's other
//! extensions are refused when written (they would be ignored). Arguments are checked when
//! written, naming the field; `property-override` paths are checked against Envoy's types.

use crate::validate::{Problem, ValidationError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One extension of the proxies of a service (or of every proxy).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvoyExtension {
    /// `builtin/lua` or `builtin/property-override`.
    #[serde(rename = "Name")]
    pub name: String,
    /// When it cannot apply to a proxy, that proxy's configuration is held back (its last good
    /// one stays, the reason in its status); else the proxy goes on without it, the reason
    /// in its status too.
    #[serde(rename = "Required")]
    pub required: bool,
    /// The extension's arguments.
    #[serde(rename = "Arguments")]
    pub arguments: serde_json::Map<String, Value>,
    /// Consul version constraint (refused: meshd is not Consul).
    #[serde(rename = "ConsulVersion", skip_serializing_if = "String::is_empty")]
    pub consul_version: String,
    /// Envoy version constraint (refused for now).
    #[serde(rename = "EnvoyVersion", skip_serializing_if = "String::is_empty")]
    pub envoy_version: String,
}

/// The Lua extension's name.
pub const LUA: &str = "builtin/lua";
/// The property-override extension's name.
pub const PROPERTY_OVERRIDE: &str = "builtin/property-override";
/// The external authorization extension's name.
pub const EXT_AUTHZ: &str = "builtin/ext-authz";
/// The OpenTelemetry access logging extension's name.
pub const OTEL_ACCESS_LOGGING: &str = "builtin/otel-access-logging";
/// The Wasm extension's name.
pub const WASM: &str = "builtin/wasm";
/// Consul's extensions meshd does not run (yet).
const NOT_SUPPORTED: [&str; 2] = ["builtin/aws/lambda", "builtin/http/localratelimit"];

/// `builtin/lua`'s arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LuaArguments {
    /// `connect-proxy` (the only kind it applies to here).
    #[serde(rename = "ProxyType")]
    pub proxy_type: String,
    /// `inbound` (the public listener) or `outbound` (the upstreams' listeners).
    #[serde(rename = "Listener")]
    pub listener: String,
    /// The Lua source (`envoy_on_request`, `envoy_on_response`).
    #[serde(rename = "Script")]
    pub script: String,
}

/// `builtin/ext-authz`'s arguments: an authorization service every inbound request (HTTP) or
/// connection (TCP, gRPC service only) is checked with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExtAuthzArguments {
    /// `connect-proxy`.
    #[serde(rename = "ProxyType")]
    pub proxy_type: String,
    /// `inbound` (the only one).
    #[serde(rename = "ListenerType")]
    pub listener_type: String,
    /// Where the filter goes (refused: it goes right after the intentions).
    #[serde(rename = "InsertOptions")]
    pub insert_options: Option<Value>,
    /// The service and how it is asked.
    #[serde(rename = "Config")]
    pub config: ExtAuthzConfig,
}

/// `builtin/ext-authz`'s `Config`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExtAuthzConfig {
    /// A gRPC authorization service (Envoy's `envoy.service.auth.v3.Authorization`).
    #[serde(rename = "GrpcService")]
    pub grpc_service: Option<ExtAuthzService>,
    /// An HTTP authorization service.
    #[serde(rename = "HttpService")]
    pub http_service: Option<ExtAuthzService>,
    /// Send the caller's certificate to the service.
    #[serde(rename = "IncludePeerCertificate")]
    pub include_peer_certificate: bool,
    /// The status when the service cannot be reached (Envoy's default 403).
    #[serde(rename = "StatusOnError")]
    pub status_on_error: u16,
    /// The filter's stat prefix.
    #[serde(rename = "StatPrefix")]
    pub stat_prefix: String,
    /// Send the request body (up to `MaxRequestBytes`).
    #[serde(rename = "WithRequestBody")]
    pub with_request_body: Option<WithRequestBody>,
    /// Recompute the route after the service changed headers.
    #[serde(rename = "ClearRouteCache")]
    pub clear_route_cache: bool,
}

/// An authorization service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExtAuthzService {
    /// Where it is.
    #[serde(rename = "Target")]
    pub target: ExtAuthzTarget,
    /// HTTP: the prefix put before the checked request's path.
    #[serde(rename = "PathPrefix")]
    pub path_prefix: String,
}

/// Where an authorization service is: `URI` (`host:port`, `http://host:port` for HTTP).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExtAuthzTarget {
    /// `host:port` (or `http://host:port`).
    #[serde(rename = "URI")]
    pub uri: String,
    /// How long a check may take (default 1s).
    #[serde(rename = "Timeout")]
    pub timeout: Option<crate::duration::GoDuration>,
    /// An upstream service as the target (refused for now: use `URI`).
    #[serde(rename = "Service")]
    pub service: Option<Value>,
}

/// `WithRequestBody`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WithRequestBody {
    /// Bytes of the body sent at most.
    #[serde(rename = "MaxRequestBytes")]
    pub max_request_bytes: u32,
    /// Send what fits when the body is larger (else 413).
    #[serde(rename = "AllowPartialMessage")]
    pub allow_partial_message: bool,
    /// Send the body as bytes rather than text.
    #[serde(rename = "PackAsBytes")]
    pub pack_as_bytes: bool,
}

impl ExtAuthzTarget {
    /// Host and port of the URI.
    pub fn host_port(&self) -> Option<(&str, u16)> {
        let rest = self.uri.strip_prefix("http://").unwrap_or(&self.uri);
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (host, port) = rest.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        (!host.is_empty()).then_some(())?;
        Some((host, port.parse().ok().filter(|p| *p != 0)?))
    }
}

impl ExtAuthzArguments {
    /// The service: gRPC (`true`) or HTTP, and its settings.
    pub fn service(&self) -> Option<(bool, &ExtAuthzService)> {
        match (&self.config.grpc_service, &self.config.http_service) {
            (Some(g), None) => Some((true, g)),
            (None, Some(h)) => Some((false, h)),
            _ => None,
        }
    }

    fn check(&self, at: &str) -> Result<(), ValidationError> {
        proxy_type(&self.proxy_type, at)?;
        if !matches!(self.listener_type.as_str(), "" | "inbound") {
            return Err(invalid(
                format!("{at}.Arguments.ListenerType"),
                format!("{:?}: meshd checks inbound traffic only", self.listener_type),
            ));
        }
        if self.insert_options.is_some() {
            return Err(invalid(
                format!("{at}.Arguments.InsertOptions"),
                "is not supported by meshd yet (the filter goes right after the intentions); remove it",
            ));
        }
        let Some((grpc, service)) = self.service() else {
            return Err(invalid(
                format!("{at}.Arguments.Config.GrpcService"),
                "set exactly one of GrpcService and HttpService",
            ));
        };
        let field = format!(
            "{at}.Arguments.Config.{}.Target",
            if grpc { "GrpcService" } else { "HttpService" }
        );
        if service.target.service.is_some() {
            return Err(invalid(
                format!("{field}.Service"),
                "an upstream service as the target is not supported by meshd yet; give URI",
            ));
        }
        if service.target.host_port().is_none() {
            return Err(invalid(
                format!("{field}.URI"),
                format!("{:?}: expected host:port", service.target.uri),
            ));
        }
        if grpc && !service.path_prefix.is_empty() {
            return Err(invalid(
                format!("{at}.Arguments.Config.GrpcService.PathPrefix"),
                "applies to HttpService only",
            ));
        }
        let code = self.config.status_on_error;
        if code != 0 && !(100..=599).contains(&code) {
            return Err(invalid(
                format!("{at}.Arguments.Config.StatusOnError"),
                format!("{code} is not an HTTP status"),
            ));
        }
        Ok(())
    }
}

/// `builtin/otel-access-logging`'s arguments: access logs of the listeners of a direction,
/// sent to an OpenTelemetry collector over gRPC.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OtelArguments {
    /// `connect-proxy`.
    #[serde(rename = "ProxyType")]
    pub proxy_type: String,
    /// `inbound` (default) or `outbound`.
    #[serde(rename = "ListenerType")]
    pub listener_type: String,
    /// The collector and what each record holds.
    #[serde(rename = "Config")]
    pub config: OtelConfig,
}

/// `builtin/otel-access-logging`'s `Config`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OtelConfig {
    /// The log's name (default: the extension's).
    #[serde(rename = "LogName")]
    pub log_name: String,
    /// The collector (gRPC, `Target.URI`).
    #[serde(rename = "GrpcService")]
    pub grpc_service: ExtAuthzService,
    /// How often buffered records are sent (Envoy's default 1 s).
    #[serde(rename = "BufferFlushInterval")]
    pub buffer_flush_interval: Option<crate::duration::GoDuration>,
    /// Bytes buffered before sending (Envoy's default 16 KiB).
    #[serde(rename = "BufferSizeBytes")]
    pub buffer_size_bytes: u32,
    /// Filter state objects added to each record.
    #[serde(rename = "FilterStateObjectsToLog")]
    pub filter_state_objects_to_log: Vec<String>,
    /// Retries (refused for now).
    #[serde(rename = "RetryPolicy")]
    pub retry_policy: Option<Value>,
    /// The record's body, a format string (Envoy command operators).
    #[serde(rename = "Body")]
    pub body: String,
    /// The record's attributes: name to format string.
    #[serde(rename = "Attributes")]
    pub attributes: std::collections::BTreeMap<String, String>,
    /// The resource's attributes: name to value.
    #[serde(rename = "ResourceAttributes")]
    pub resource_attributes: std::collections::BTreeMap<String, String>,
}

impl OtelArguments {
    /// Whether it logs the inbound listeners (else the outbound ones).
    pub fn inbound(&self) -> bool {
        self.listener_type != "outbound"
    }

    fn check(&self, at: &str) -> Result<(), ValidationError> {
        proxy_type(&self.proxy_type, at)?;
        if !matches!(self.listener_type.as_str(), "" | "inbound" | "outbound") {
            return Err(invalid(
                format!("{at}.Arguments.ListenerType"),
                format!("{:?}: expected inbound or outbound", self.listener_type),
            ));
        }
        let target = &self.config.grpc_service.target;
        let field = format!("{at}.Arguments.Config.GrpcService.Target");
        if target.service.is_some() {
            return Err(invalid(
                format!("{field}.Service"),
                "an upstream service as the target is not supported by meshd yet; give URI",
            ));
        }
        if target.host_port().is_none() {
            return Err(invalid(
                format!("{field}.URI"),
                format!("{:?}: expected host:port", target.uri),
            ));
        }
        if self.config.retry_policy.is_some() {
            return Err(invalid(
                format!("{at}.Arguments.Config.RetryPolicy"),
                "is not supported by meshd yet; remove it",
            ));
        }
        Ok(())
    }
}

/// `builtin/wasm`'s arguments: a Wasm filter (proxy-wasm) from a file on the proxy's host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WasmArguments {
    /// `connect-proxy`.
    #[serde(rename = "ProxyType")]
    pub proxy_type: String,
    /// `http` (an HTTP filter, default) or `tcp` (a network filter).
    #[serde(rename = "Protocol")]
    pub protocol: String,
    /// `inbound` (default) or `outbound`.
    #[serde(rename = "ListenerType")]
    pub listener_type: String,
    /// The plugin.
    #[serde(rename = "PluginConfig")]
    pub plugin_config: WasmPluginConfig,
}

/// `PluginConfig` of `builtin/wasm`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WasmPluginConfig {
    /// The plugin's name.
    #[serde(rename = "Name")]
    pub name: String,
    /// The root context's id in the module.
    #[serde(rename = "RootID")]
    pub root_id: String,
    /// The VM that runs it.
    #[serde(rename = "VmConfig")]
    pub vm_config: WasmVmConfig,
    /// The plugin's configuration, passed to it as a string.
    #[serde(rename = "Configuration")]
    pub configuration: String,
    /// Capability restrictions (refused for now).
    #[serde(rename = "CapabilityRestrictionConfiguration")]
    pub capability_restriction_configuration: Option<Value>,
}

/// `VmConfig` of `builtin/wasm`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WasmVmConfig {
    /// VMs with the same id and code are shared.
    #[serde(rename = "VmID")]
    pub vm_id: String,
    /// `v8` (default), `wamr` or `wasmtime`.
    #[serde(rename = "Runtime")]
    pub runtime: String,
    /// Where the module is.
    #[serde(rename = "Code")]
    pub code: WasmCode,
    /// The VM's configuration, passed as a string.
    #[serde(rename = "Configuration")]
    pub configuration: String,
    /// Environment of the VM (refused for now).
    #[serde(rename = "EnvironmentVariables")]
    pub environment_variables: Option<Value>,
}

/// `Code` of `builtin/wasm`: a local file (a remote one is refused for now).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WasmCode {
    /// `{"Filename": "/path/plugin.wasm"}` on the proxy's host.
    #[serde(rename = "Local")]
    pub local: WasmLocal,
    /// A module fetched over HTTP (refused for now).
    #[serde(rename = "Remote")]
    pub remote: Option<Value>,
}

/// A module file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WasmLocal {
    /// Absolute path on the proxy's host.
    #[serde(rename = "Filename")]
    pub filename: String,
}

impl WasmArguments {
    /// Whether it goes on the inbound listeners (else the outbound ones).
    pub fn inbound(&self) -> bool {
        self.listener_type != "outbound"
    }

    /// Envoy's name of the runtime.
    pub fn runtime(&self) -> String {
        let r = &self.plugin_config.vm_config.runtime;
        format!("envoy.wasm.runtime.{}", if r.is_empty() { "v8" } else { r })
    }

    fn check(&self, at: &str) -> Result<(), ValidationError> {
        proxy_type(&self.proxy_type, at)?;
        let args = format!("{at}.Arguments");
        for (field, value, allowed) in [
            ("Protocol", &self.protocol, &["", "http", "tcp"][..]),
            ("ListenerType", &self.listener_type, &["", "inbound", "outbound"][..]),
            (
                "PluginConfig.VmConfig.Runtime",
                &self.plugin_config.vm_config.runtime,
                &["", "v8", "wamr", "wasmtime"][..],
            ),
        ] {
            if !allowed.contains(&value.as_str()) {
                return Err(invalid(
                    format!("{args}.{field}"),
                    format!("{value:?}: expected one of {}", allowed[1..].join(", ")),
                ));
            }
        }
        let vm = &self.plugin_config.vm_config;
        for (field, set) in [
            ("PluginConfig.VmConfig.Code.Remote", vm.code.remote.is_some()),
            (
                "PluginConfig.VmConfig.EnvironmentVariables",
                vm.environment_variables.is_some(),
            ),
            (
                "PluginConfig.CapabilityRestrictionConfiguration",
                self.plugin_config.capability_restriction_configuration.is_some(),
            ),
        ] {
            if set {
                return Err(invalid(
                    format!("{args}.{field}"),
                    "is not supported by meshd yet; remove it",
                ));
            }
        }
        if !vm.code.local.filename.starts_with('/') {
            return Err(invalid(
                format!("{args}.PluginConfig.VmConfig.Code.Local.Filename"),
                format!(
                    "{:?}: an absolute path to the module on the proxy's host is required",
                    vm.code.local.filename
                ),
            ));
        }
        Ok(())
    }
}

/// `builtin/property-override`'s arguments.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PropertyOverrideArguments {
    /// `connect-proxy`.
    #[serde(rename = "ProxyType")]
    pub proxy_type: String,
    /// Log each patch applied (accepted; the result shows in Envoy's config dump).
    #[serde(rename = "Debug")]
    pub debug: bool,
    /// The changes, in order.
    #[serde(rename = "Patches")]
    pub patches: Vec<PropertyPatch>,
}

/// One change of `builtin/property-override`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PropertyPatch {
    /// Which resources.
    #[serde(rename = "ResourceFilter")]
    pub resource_filter: ResourceFilter,
    /// `add` (set) or `remove`.
    #[serde(rename = "Op")]
    pub op: String,
    /// The field's path from the resource, `/` separated, proto field names.
    #[serde(rename = "Path")]
    pub path: String,
    /// The value to set (Envoy JSON for the field).
    #[serde(rename = "Value")]
    pub value: Option<Value>,
}

/// The resources a patch applies to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResourceFilter {
    /// `listener`, `cluster`, `route` or `cluster-load-assignment`.
    #[serde(rename = "ResourceType")]
    pub resource_type: String,
    /// `inbound` or `outbound`.
    #[serde(rename = "TrafficDirection")]
    pub traffic_direction: String,
    /// Outbound only: the upstream services whose resources are patched (none: all).
    #[serde(rename = "Services")]
    pub services: Vec<ServiceName>,
}

/// A service named by a filter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceName {
    /// Its name.
    #[serde(rename = "Name")]
    pub name: String,
    /// Its namespace (`default` only).
    #[serde(rename = "Namespace")]
    pub namespace: String,
    /// Its partition (`default` only).
    #[serde(rename = "Partition")]
    pub partition: String,
}

impl ResourceFilter {
    /// The Envoy type of the resources it selects.
    pub fn envoy_type(&self) -> Option<&'static str> {
        Some(match self.resource_type.as_str() {
            "listener" => "envoy.config.listener.v3.Listener",
            "cluster" => "envoy.config.cluster.v3.Cluster",
            "route" => "envoy.config.route.v3.RouteConfiguration",
            "cluster-load-assignment" => "envoy.config.endpoint.v3.ClusterLoadAssignment",
            _ => return None,
        })
    }
}

fn invalid(at: String, why: impl Into<String>) -> ValidationError {
    ValidationError::new(at, Problem::Invalid(why.into()))
}

fn arguments<T: serde::de::DeserializeOwned>(e: &EnvoyExtension, at: &str) -> Result<T, ValidationError> {
    serde_path_to_error::deserialize(Value::Object(e.arguments.clone()))
        .map_err(|err| invalid(format!("{at}.Arguments.{}", err.path()), err.inner().to_string()))
}

fn proxy_type(value: &str, at: &str) -> Result<(), ValidationError> {
    if matches!(value, "" | "connect-proxy") {
        return Ok(());
    }
    Err(invalid(
        format!("{at}.Arguments.ProxyType"),
        format!("{value:?}: meshd applies extensions to connect-proxy only"),
    ))
}

impl EnvoyExtension {
    /// Checks the extension at `at` (`EnvoyExtensions[0]`).
    pub fn check(&self, at: &str) -> Result<(), ValidationError> {
        for (field, v) in [
            ("ConsulVersion", &self.consul_version),
            ("EnvoyVersion", &self.envoy_version),
        ] {
            if !v.is_empty() {
                return Err(invalid(
                    format!("{at}.{field}"),
                    "version constraints are not supported by meshd (the extension would always apply); remove it",
                ));
            }
        }
        match self.name.as_str() {
            LUA => {
                let a: LuaArguments = arguments(self, at)?;
                proxy_type(&a.proxy_type, at)?;
                if !matches!(a.listener.as_str(), "inbound" | "outbound") {
                    return Err(invalid(
                        format!("{at}.Arguments.Listener"),
                        format!("{:?}: expected inbound or outbound", a.listener),
                    ));
                }
                if a.script.trim().is_empty() {
                    return Err(invalid(format!("{at}.Arguments.Script"), "is required"));
                }
                Ok(())
            }
            PROPERTY_OVERRIDE => self.check_property_override(at),
            EXT_AUTHZ => arguments::<ExtAuthzArguments>(self, at)?.check(at),
            OTEL_ACCESS_LOGGING => arguments::<OtelArguments>(self, at)?.check(at),
            WASM => arguments::<WasmArguments>(self, at)?.check(at),
            n if NOT_SUPPORTED.contains(&n) => Err(invalid(
                format!("{at}.Name"),
                format!("{n} is not supported by meshd yet (it would be ignored); remove it"),
            )),
            n => Err(invalid(
                format!("{at}.Name"),
                format!(
                    "{n:?} is not an extension meshd knows ({LUA}, {PROPERTY_OVERRIDE}, {EXT_AUTHZ}, {OTEL_ACCESS_LOGGING}, {WASM})"
                ),
            )),
        }
    }

    fn check_property_override(&self, at: &str) -> Result<(), ValidationError> {
        let a: PropertyOverrideArguments = arguments(self, at)?;
        proxy_type(&a.proxy_type, at)?;
        if a.patches.is_empty() {
            return Err(invalid(
                format!("{at}.Arguments.Patches"),
                "at least one patch is required",
            ));
        }
        for (i, p) in a.patches.iter().enumerate() {
            let at = format!("{at}.Arguments.Patches[{i}]");
            let f = &p.resource_filter;
            let ty = f.envoy_type().ok_or_else(|| {
                invalid(
                    format!("{at}.ResourceFilter.ResourceType"),
                    format!(
                        "{:?}: expected listener, cluster, route or cluster-load-assignment",
                        f.resource_type
                    ),
                )
            })?;
            if !matches!(f.traffic_direction.as_str(), "inbound" | "outbound") {
                return Err(invalid(
                    format!("{at}.ResourceFilter.TrafficDirection"),
                    format!("{:?}: expected inbound or outbound", f.traffic_direction),
                ));
            }
            if f.traffic_direction == "inbound" && !f.services.is_empty() {
                return Err(invalid(
                    format!("{at}.ResourceFilter.Services"),
                    "applies to outbound resources only",
                ));
            }
            let value = match (p.op.as_str(), &p.value) {
                ("add", Some(v)) => Some(v),
                ("add", None) => return Err(invalid(format!("{at}.Value"), "is required with Op add")),
                ("remove", None) => None,
                ("remove", Some(_)) => return Err(invalid(format!("{at}.Value"), "is not allowed with Op remove")),
                (op, _) => return Err(invalid(format!("{at}.Op"), format!("{op:?}: expected add or remove"))),
            };
            envoy_json::check_patch(ty, &envoy_json::Patch { path: &p.path, value })
                .map_err(|e| invalid(format!("{at}.Path"), e.to_string()))?;
        }
        Ok(())
    }
}

/// Checks a list of extensions (`EnvoyExtensions`).
pub fn check_all(list: &[EnvoyExtension]) -> Result<(), ValidationError> {
    for (i, e) in list.iter().enumerate() {
        e.check(&format!("EnvoyExtensions[{i}]"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(json: Value) -> Result<(), String> {
        let e: EnvoyExtension = serde_json::from_value(json).map_err(|e| e.to_string())?;
        e.check("EnvoyExtensions[0]").map_err(|e| e.to_string())
    }

    #[test]
    fn extensions_are_checked_naming_the_field() {
        let lua = serde_json::json!({"Name": "builtin/lua", "Arguments": {"ProxyType": "connect-proxy",
            "Listener": "inbound", "Script": "function envoy_on_response(h) end"}});
        check(lua).unwrap();
        let po = serde_json::json!({"Name": "builtin/property-override", "Arguments": {"Patches": [{
            "ResourceFilter": {"ResourceType": "cluster", "TrafficDirection": "outbound", "Services": [{"Name": "api"}]},
            "Op": "add", "Path": "/outlier_detection/consecutive_5xx", "Value": 7}]}});
        check(po).unwrap();
        let authz = serde_json::json!({"Name": "builtin/ext-authz", "Arguments": {"Config": {
            "GrpcService": {"Target": {"URI": "127.0.0.1:9191", "Timeout": "2s"}}}}});
        check(authz).unwrap();
        let otel = serde_json::json!({"Name": "builtin/otel-access-logging", "Arguments": {"ListenerType": "outbound",
            "Config": {"GrpcService": {"Target": {"URI": "127.0.0.1:4317"}}, "Body": "%REQ(:PATH)%",
                       "Attributes": {"code": "%RESPONSE_CODE%"}}}});
        check(otel).unwrap();
        for (bad, says) in [
            (
                serde_json::json!({"Name": "builtin/aws/lambda"}),
                "EnvoyExtensions[0].Name",
            ),
            (
                serde_json::json!({"Name": "builtin/wasm", "Arguments": {"PluginConfig": {"VmConfig": {
                    "Code": {"Local": {"Filename": "plugin.wasm"}}}}}}),
                "Code.Local.Filename",
            ),
            (
                serde_json::json!({"Name": "builtin/ext-authz", "Arguments": {"Config": {}}}),
                "Config.GrpcService",
            ),
            (
                serde_json::json!({"Name": "builtin/otel-access-logging", "Arguments": {"Config": {}}}),
                "Config.GrpcService.Target.URI",
            ),
            (
                serde_json::json!({"Name": "builtin/ext-authz", "Arguments": {"Config": {
                    "HttpService": {"Target": {"URI": "nowhere"}}}}}),
                "Config.HttpService.Target.URI",
            ),
            (
                serde_json::json!({"Name": "builtin/ext-authz", "Arguments": {"Config": {
                    "GrpcService": {"Target": {"Service": {"Name": "authz"}}}}}}),
                "Target.Service",
            ),
            (serde_json::json!({"Name": "lua"}), "EnvoyExtensions[0].Name"),
            (
                serde_json::json!({"Name": "builtin/lua", "Arguments": {"Listener": "both", "Script": "x"}}),
                "Arguments.Listener",
            ),
            (
                serde_json::json!({"Name": "builtin/lua", "Arguments": {"Listener": "inbound"}}),
                "Arguments.Script",
            ),
            (
                serde_json::json!({"Name": "builtin/lua", "Arguments": {"Listenr": "inbound"}}),
                "Listenr",
            ),
            (
                serde_json::json!({"Name": "builtin/property-override", "Arguments": {"Patches": [{
                    "ResourceFilter": {"ResourceType": "cluster", "TrafficDirection": "outbound"},
                    "Op": "add", "Path": "/outlier_detection/consecutive_6xx", "Value": 7}]}}),
                "Patches[0].Path",
            ),
            (
                serde_json::json!({"Name": "builtin/property-override", "Arguments": {"Patches": [{
                    "ResourceFilter": {"ResourceType": "secret", "TrafficDirection": "outbound"},
                    "Op": "remove", "Path": "/name"}]}}),
                "ResourceType",
            ),
            (
                serde_json::json!({"Name": "builtin/lua", "EnvoyVersion": ">= 1.20",
                    "Arguments": {"Listener": "inbound", "Script": "x"}}),
                "EnvoyVersion",
            ),
        ] {
            let e = check(bad.clone()).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
