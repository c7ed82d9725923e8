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
use envoy_types::pb::google::protobuf::Any;
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

// Envoy's `google.protobuf.Struct` is a map, which prost encodes in (random) hash order: a
// JSON format would encode differently on every build, and its listeners would be resent
// for nothing. These mirror the messages on the wire (a map is a repeated key/value entry)
// with the fields in the JSON's own order, so one entry always encodes the same.

/// `google.protobuf.Struct`, its fields in order.
#[derive(Clone, PartialEq, Message)]
struct OrderedStruct {
    #[prost(message, repeated, tag = "1")]
    fields: Vec<OrderedEntry>,
}

/// One entry of `Struct.fields`.
#[derive(Clone, PartialEq, Message)]
struct OrderedEntry {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(message, optional, tag = "2")]
    value: Option<OrderedValue>,
}

/// `google.protobuf.Value`.
#[derive(Clone, PartialEq, Message)]
struct OrderedValue {
    #[prost(oneof = "OrderedKind", tags = "1, 2, 3, 4, 5, 6")]
    kind: Option<OrderedKind>,
}

/// `google.protobuf.Value.kind`.
#[derive(Clone, PartialEq, prost::Oneof)]
enum OrderedKind {
    #[prost(int32, tag = "1")]
    Null(i32),
    #[prost(double, tag = "2")]
    Number(f64),
    #[prost(string, tag = "3")]
    String(String),
    #[prost(bool, tag = "4")]
    Bool(bool),
    #[prost(message, tag = "5")]
    Struct(OrderedStruct),
    #[prost(message, tag = "6")]
    List(OrderedList),
}

/// `google.protobuf.ListValue`.
#[derive(Clone, PartialEq, Message)]
struct OrderedList {
    #[prost(message, repeated, tag = "1")]
    values: Vec<OrderedValue>,
}

/// `SubstitutionFormatString` with only its `json_format` (field 2).
#[derive(Clone, PartialEq, Message)]
struct JsonLogFormat {
    #[prost(message, optional, tag = "2")]
    json_format: Option<OrderedStruct>,
}

/// `FileAccessLog` with a `log_format` (field 5) of [`JsonLogFormat`].
#[derive(Clone, PartialEq, Message)]
struct JsonFileLog {
    #[prost(string, tag = "1")]
    path: String,
    #[prost(message, optional, tag = "5")]
    log_format: Option<JsonLogFormat>,
}

/// `StdoutAccessLog`/`StderrAccessLog` with a `log_format` (field 1) of [`JsonLogFormat`].
#[derive(Clone, PartialEq, Message)]
struct JsonStreamLog {
    #[prost(message, optional, tag = "1")]
    log_format: Option<JsonLogFormat>,
}

fn json_value(v: &serde_json::Value) -> OrderedValue {
    let kind = match v {
        serde_json::Value::Null => OrderedKind::Null(0),
        serde_json::Value::Bool(b) => OrderedKind::Bool(*b),
        serde_json::Value::Number(n) => OrderedKind::Number(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => OrderedKind::String(s.clone()),
        serde_json::Value::Array(a) => OrderedKind::List(OrderedList {
            values: a.iter().map(json_value).collect(),
        }),
        serde_json::Value::Object(o) => OrderedKind::Struct(json_struct(o)),
    };
    OrderedValue { kind: Some(kind) }
}

fn json_struct(o: &serde_json::Map<String, serde_json::Value>) -> OrderedStruct {
    OrderedStruct {
        fields: o
            .iter()
            .map(|(k, v)| OrderedEntry {
                key: k.clone(),
                value: Some(json_value(v)),
            })
            .collect(),
    }
}

/// An `Any` of type `T` whose bytes are `value`'s (a wire-compatible stand-in for `T`).
fn any_of<T: Name>(value: &impl Message) -> Any {
    Any {
        type_url: T::type_url(),
        value: value.encode_to_vec(),
    }
}

/// The logger's name and configuration: the `TextFormat`, else the `JSONFormat`, else
/// [`DEFAULT_FIELDS`] as JSON.
fn logger(cfg: &AccessLogsConfig) -> (&'static str, Any) {
    let name = match cfg.log_type {
        AccessLogType::File => "envoy.access_loggers.file",
        AccessLogType::Stdout => "envoy.access_loggers.stdout",
        AccessLogType::Stderr => "envoy.access_loggers.stderr",
    };
    if !cfg.text_format.is_empty() {
        let format = SubstitutionFormatString {
            format: Some(substitution_format_string::Format::TextFormatSource(DataSource {
                specifier: Some(data_source::Specifier::InlineString(format!(
                    "{}\n",
                    cfg.text_format.trim_end_matches('\n')
                ))),
                ..Default::default()
            })),
            ..Default::default()
        };
        let config = match cfg.log_type {
            AccessLogType::File => pack_any(FileAccessLog {
                path: cfg.path.clone(),
                access_log_format: Some(file_access_log::AccessLogFormat::LogFormat(format)),
            }),
            AccessLogType::Stdout => pack_any(StdoutAccessLog {
                access_log_format: Some(stdout_access_log::AccessLogFormat::LogFormat(format)),
            }),
            AccessLogType::Stderr => pack_any(StderrAccessLog {
                access_log_format: Some(stderr_access_log::AccessLogFormat::LogFormat(format)),
            }),
        };
        return (name, config);
    }
    let fields = cfg.json_fields().unwrap_or_else(|| {
        DEFAULT_FIELDS
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::String((*v).to_owned())))
            .collect()
    });
    let log_format = Some(JsonLogFormat {
        json_format: Some(json_struct(&fields)),
    });
    let config = match cfg.log_type {
        AccessLogType::File => any_of::<FileAccessLog>(&JsonFileLog {
            path: cfg.path.clone(),
            log_format,
        }),
        AccessLogType::Stdout => any_of::<StdoutAccessLog>(&JsonStreamLog { log_format }),
        AccessLogType::Stderr => any_of::<StderrAccessLog>(&JsonStreamLog { log_format }),
    };
    (name, config)
}

/// One access log as `cfg` says, with `filter` (the listener-level one logs only
/// connections no filter chain accepted).
fn access_log(cfg: &AccessLogsConfig, filter: Option<AccessLogFilter>) -> AccessLog {
    let (name, config) = logger(cfg);
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
