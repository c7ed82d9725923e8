//! Access logs (`proxy-defaults`' `AccessLogs`): once a build has made its listeners, every
//! HTTP connection manager and TCP proxy on them logs each request or connection, and each
//! listener logs the connections no filter chain accepted (unless `DisableListenerLogs`).
//! Applied after the builders, so every kind (sidecars, ingress and terminating gateways)
//! gets them the same way, and a builder cannot forget them.

use super::{BuildError, LISTENER, Resources};
use envoy_types::pb::envoy::config::accesslog::v3::{
    AccessLog, AccessLogFilter, ResponseFlagFilter, access_log, access_log_filter,
};
use envoy_types::pb::envoy::config::core::v3::{
    DataSource, SubstitutionFormatString, data_source, substitution_format_string,
};
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
use envoy_types::pb::envoy::extensions::access_loggers::file::v3::{FileAccessLog, file_access_log};
use envoy_types::pb::envoy::extensions::access_loggers::stream::v3::{
    StderrAccessLog, StdoutAccessLog, stderr_access_log, stdout_access_log,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::google::protobuf::{self as pb, Any};
use envoy_types::util::pack_any;
use prost::{Message, Name};
use proxycfg::ConfigSnapshot;
use structs::ConfigEntry;
use structs::config_entry::{AccessLogType, AccessLogsConfig};

/// The fields of a log line when `AccessLogs` names no format: what a request or
/// connection was, where it went, and how it ended (Envoy's command operators).
const DEFAULT_FIELDS: [(&str, &str); 22] = [
    ("start_time", "%START_TIME%"),
    ("route_name", "%ROUTE_NAME%"),
    ("method", "%REQ(:METHOD)%"),
    ("path", "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"),
    ("protocol", "%PROTOCOL%"),
    ("response_code", "%RESPONSE_CODE%"),
    ("response_flags", "%RESPONSE_FLAGS%"),
    ("response_code_details", "%RESPONSE_CODE_DETAILS%"),
    ("connection_termination_details", "%CONNECTION_TERMINATION_DETAILS%"),
    ("bytes_received", "%BYTES_RECEIVED%"),
    ("bytes_sent", "%BYTES_SENT%"),
    ("duration", "%DURATION%"),
    ("upstream_service_time", "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%"),
    ("x_forwarded_for", "%REQ(X-FORWARDED-FOR)%"),
    ("user_agent", "%REQ(USER-AGENT)%"),
    ("request_id", "%REQ(X-REQUEST-ID)%"),
    ("authority", "%REQ(:AUTHORITY)%"),
    ("upstream_host", "%UPSTREAM_HOST%"),
    ("upstream_cluster", "%UPSTREAM_CLUSTER%"),
    ("downstream_local_address", "%DOWNSTREAM_LOCAL_ADDRESS%"),
    ("downstream_remote_address", "%DOWNSTREAM_REMOTE_ADDRESS%"),
    ("requested_server_name", "%REQUESTED_SERVER_NAME%"),
];

/// The snapshot's access-log settings, when they are on. Never for a proxyless gRPC client
/// (a connect-native service): it is not Envoy, and logs nothing of what it is sent.
fn settings(snap: &ConfigSnapshot) -> Option<&AccessLogsConfig> {
    if snap.service.connect.native {
        return None;
    }
    match snap.proxy_defaults.as_ref()?.as_deref()? {
        ConfigEntry::ProxyDefaults(d) if d.access_logs.enabled => Some(&d.access_logs),
        _ => None,
    }
}

fn json_value(v: &serde_json::Value) -> pb::Value {
    use pb::value::Kind;
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(pb::ListValue {
            values: a.iter().map(json_value).collect(),
        }),
        serde_json::Value::Object(o) => Kind::StructValue(json_struct(o)),
    };
    pb::Value { kind: Some(kind) }
}

fn json_struct(o: &serde_json::Map<String, serde_json::Value>) -> pb::Struct {
    pb::Struct {
        fields: o.iter().map(|(k, v)| (k.clone(), json_value(v))).collect(),
    }
}

/// How a line is formatted: the configured text or JSON, else [`DEFAULT_FIELDS`] as JSON.
fn format(cfg: &AccessLogsConfig) -> SubstitutionFormatString {
    let format = if !cfg.text_format.is_empty() {
        substitution_format_string::Format::TextFormatSource(DataSource {
            specifier: Some(data_source::Specifier::InlineString(format!(
                "{}\n",
                cfg.text_format.trim_end_matches('\n')
            ))),
            ..Default::default()
        })
    } else {
        let fields = cfg.json_fields().unwrap_or_else(|| {
            DEFAULT_FIELDS
                .iter()
                .map(|(k, v)| ((*k).to_owned(), serde_json::Value::String((*v).to_owned())))
                .collect()
        });
        substitution_format_string::Format::JsonFormat(json_struct(&fields))
    };
    SubstitutionFormatString {
        format: Some(format),
        ..Default::default()
    }
}

/// One access log as `cfg` says, with `filter` (the listener-level one logs only
/// connections no filter chain accepted).
fn access_log(cfg: &AccessLogsConfig, filter: Option<AccessLogFilter>) -> AccessLog {
    let format = format(cfg);
    let (name, config) = match cfg.log_type {
        AccessLogType::File => (
            "envoy.access_loggers.file",
            pack_any(FileAccessLog {
                path: cfg.path.clone(),
                access_log_format: Some(file_access_log::AccessLogFormat::LogFormat(format)),
            }),
        ),
        AccessLogType::Stdout => (
            "envoy.access_loggers.stdout",
            pack_any(StdoutAccessLog {
                access_log_format: Some(stdout_access_log::AccessLogFormat::LogFormat(format)),
            }),
        ),
        AccessLogType::Stderr => (
            "envoy.access_loggers.stderr",
            pack_any(StderrAccessLog {
                access_log_format: Some(stderr_access_log::AccessLogFormat::LogFormat(format)),
            }),
        ),
    };
    AccessLog {
        name: name.to_owned(),
        filter,
        config_type: Some(access_log::ConfigType::TypedConfig(config)),
    }
}

fn decode<T: Message + Default>(any: &Any, what: &str) -> Result<T, BuildError> {
    T::decode(any.value.as_slice()).map_err(|e| BuildError::Invalid(format!("access logs: decoding {what}: {e}")))
}

/// Adds the access logs to every listener `out` holds, when `proxy-defaults` turns them on.
pub(crate) fn apply(snap: &ConfigSnapshot, out: &mut Resources) -> Result<(), BuildError> {
    let Some(cfg) = settings(snap) else { return Ok(()) };
    let Some(listeners) = out.by_type.get_mut(LISTENER) else {
        return Ok(());
    };
    let per_request = access_log(cfg, None);
    let unmatched = AccessLogFilter {
        filter_specifier: Some(access_log_filter::FilterSpecifier::ResponseFlagFilter(
            ResponseFlagFilter {
                // NR: no filter chain (or route) matched.
                flags: vec!["NR".to_owned()],
            },
        )),
    };
    for (name, any) in listeners.iter_mut() {
        let mut listener: Listener = decode(any, name)?;
        if !cfg.disable_listener_logs {
            listener.access_log = vec![access_log(cfg, Some(unmatched.clone()))];
        }
        for chain in &mut listener.filter_chains {
            for f in &mut chain.filters {
                let Some(filter::ConfigType::TypedConfig(typed)) = &mut f.config_type else {
                    continue;
                };
                if typed.type_url == HttpConnectionManager::type_url() {
                    let mut hcm: HttpConnectionManager = decode(typed, name)?;
                    hcm.access_log = vec![per_request.clone()];
                    *typed = pack_any(hcm);
                } else if typed.type_url == TcpProxy::type_url() {
                    let mut tcp: TcpProxy = decode(typed, name)?;
                    tcp.access_log = vec![per_request.clone()];
                    *typed = pack_any(tcp);
                }
            }
        }
        *any = pack_any(listener);
    }
    Ok(())
}
