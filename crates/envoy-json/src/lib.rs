//! Envoy's JSON, as users write it in escape hatches (`envoy_public_listener_json` and the
//! rest), decoded into the protobuf Envoy is sent: each field checked against Envoy's own API
//! definitions (compiled from the `envoy-types` sources at build time), `@type` URLs of nested
//! `Any` fields resolved among Envoy's types. A misspelt field, a wrong type or an unknown
//! type URL is an error naming it, when the config is written, rather than a rejection by
//! Envoy later.

use bounded_maps::ClearingCache;
use prost_reflect::{DescriptorPool, DynamicMessage, ReflectMessage};
use serde_json::Value;
use std::sync::OnceLock;

/// An encoded Envoy message and its type URL: what a `google.protobuf.Any` carries. (Kept
/// apart from envoy-types' own `Any`, so that what depends on this crate does not wait for
/// Envoy's generated types to compile.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    /// `type.googleapis.com/<full name>`.
    pub type_url: String,
    /// The message's protobuf encoding.
    pub value: Vec<u8>,
}

/// Envoy's API descriptors (see build.rs).
static DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy.pb"));

/// The pool of Envoy's types, decoded on first use (it fails only if build.rs made a bad
/// descriptor set).
fn pool() -> Result<&'static DescriptorPool, Error> {
    static POOL: OnceLock<Result<DescriptorPool, String>> = OnceLock::new();
    POOL.get_or_init(|| DescriptorPool::decode(DESCRIPTORS).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Error::Invalid {
            ty: "descriptor set".into(),
            message: e.clone(),
        })
}

/// Why Envoy JSON could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Not JSON at all.
    #[error("is not JSON: {0}")]
    Json(String),
    /// Not an object.
    #[error("must be a JSON object (an Envoy {0})")]
    NotObject(String),
    /// `@type` names another type.
    #[error("has \"@type\": {given:?}, expected {expected:?}")]
    WrongType {
        /// What the JSON said.
        given: String,
        /// What this key holds.
        expected: String,
    },
    /// A field Envoy's type does not have, a value of the wrong kind, an unknown nested type.
    #[error("is not a valid Envoy {ty}: {message}")]
    Invalid {
        /// The expected type.
        ty: String,
        /// What the decoder said (it names the field).
        message: String,
    },
}

/// The type URL of Envoy type `full_name`.
pub fn type_url(full_name: &str) -> String {
    format!("type.googleapis.com/{full_name}")
}

/// Envoy's JSON of an encoded message (`type_url`: `type.googleapis.com/<full name>`), as
/// Envoy's config dump would show it: what a dry run compares.
pub fn to_json(type_url: &str, bytes: &[u8]) -> Result<Value, Error> {
    let full_name = type_url.rsplit('/').next().unwrap_or(type_url);
    let invalid = |message: String| Error::Invalid {
        ty: full_name.to_owned(),
        message,
    };
    let descriptor = pool()?
        .get_message_by_name(full_name)
        .ok_or_else(|| invalid("no such Envoy type".into()))?;
    let message = DynamicMessage::decode(descriptor, bytes).map_err(|e| invalid(e.to_string()))?;
    serde_json::to_value(&message).map_err(|e| invalid(e.to_string()))
}

/// Decodes `json` as Envoy type `full_name` (`envoy.config.listener.v3.Listener`). An
/// `@type` at the top, if present, must name that type.
pub fn decode(full_name: &str, json: &str) -> Result<Encoded, Error> {
    let mut value: Value = serde_json::from_str(json).map_err(|e| Error::Json(e.to_string()))?;
    let Some(object) = value.as_object_mut() else {
        return Err(Error::NotObject(full_name.to_owned()));
    };
    let expected = type_url(full_name);
    if let Some(given) = object.remove("@type") {
        let given = given.as_str().unwrap_or_default().to_owned();
        if given != expected {
            return Err(Error::WrongType { given, expected });
        }
    }
    let descriptor = pool()?.get_message_by_name(full_name).ok_or_else(|| Error::Invalid {
        ty: full_name.to_owned(),
        message: "no such Envoy type".into(),
    })?;
    let mut track = serde_path_to_error::Track::new();
    let message = DynamicMessage::deserialize(descriptor, serde_path_to_error::Deserializer::new(value, &mut track))
        .map_err(|e| {
            let path = track.path().to_string();
            Error::Invalid {
                ty: full_name.to_owned(),
                message: if path == "." {
                    e.to_string()
                } else {
                    format!("{path}: {e}")
                },
            }
        })?;
    Ok(Encoded {
        type_url: expected,
        value: prost_reflect::prost::Message::encode_to_vec(&message),
    })
}

/// [`decode`], remembered: the same JSON always gives the same bytes. (Envoy's maps are hash
/// maps, which encode in a different order each time: an escape hatch decoded afresh on
/// every build would change its proxy's resource version, and be resent, for nothing.)
pub fn decode_cached(full_name: &str, json: &str) -> Result<Encoded, Error> {
    static CACHE: OnceLock<ClearingCache<(String, String), (), Encoded>> = OnceLock::new();
    CACHE
        .get_or_init(|| ClearingCache::new(4096))
        .get_or_try_make((full_name.to_owned(), json.to_owned()), (), || decode(full_name, json))
}

/// A change to an Envoy resource by field path (`/outlier_detection/consecutive_5xx`, proto
/// field names): `Some(value)` sets the field (intermediate messages made as needed; the
/// value is Envoy JSON for the field), `None` clears it. Repeated fields and maps cannot be
/// stepped through.
#[derive(Debug, Clone, PartialEq)]
pub struct Patch<'a> {
    /// The path, from `/`.
    pub path: &'a str,
    /// The new value, or none to remove the field.
    pub value: Option<&'a Value>,
}

/// Checks that `path` names a field of Envoy type `full_name` reachable through singular
/// message fields, and that `value` (if any) is valid for it.
pub fn check_patch(full_name: &str, patch: &Patch<'_>) -> Result<(), Error> {
    let descriptor = pool()?.get_message_by_name(full_name).ok_or_else(|| Error::Invalid {
        ty: full_name.to_owned(),
        message: "no such Envoy type".into(),
    })?;
    let mut message = DynamicMessage::new(descriptor);
    apply_to(&mut message, patch)
}

/// Applies `patch` to `resource` (an Envoy resource), re-encoding it.
pub fn apply_patch(resource: &Encoded, patch: &Patch<'_>) -> Result<Encoded, Error> {
    let name = resource.type_url.rsplit('/').next().unwrap_or_default();
    let invalid = |message: String| Error::Invalid {
        ty: name.to_owned(),
        message,
    };
    let descriptor = pool()?
        .get_message_by_name(name)
        .ok_or_else(|| invalid("no such Envoy type".into()))?;
    let mut message =
        DynamicMessage::decode(descriptor, resource.value.as_slice()).map_err(|e| invalid(e.to_string()))?;
    apply_to(&mut message, patch)?;
    Ok(Encoded {
        type_url: resource.type_url.clone(),
        value: prost_reflect::prost::Message::encode_to_vec(&message),
    })
}

fn apply_to(message: &mut DynamicMessage, patch: &Patch<'_>) -> Result<(), Error> {
    let ty = message.descriptor().full_name().to_owned();
    let invalid = |message: String| Error::Invalid {
        ty: ty.clone(),
        message,
    };
    let Some(rest) = patch.path.strip_prefix('/') else {
        return Err(invalid(format!("path {:?} must begin with /", patch.path)));
    };
    let steps: Vec<&str> = rest.split('/').collect();
    let (last, through) = steps.split_last().ok_or_else(|| invalid("empty path".into()))?;
    let mut at = message;
    let mut walked = String::new();
    for step in through {
        walked.push('/');
        walked.push_str(step);
        let field = at
            .descriptor()
            .get_field_by_name(step)
            .ok_or_else(|| invalid(format!("{walked}: no such field")))?;
        if field.is_list() || field.is_map() || field.kind().as_message().is_none() {
            return Err(invalid(format!(
                "{walked}: only singular message fields can be stepped through"
            )));
        }
        at = at
            .get_field_mut(&field)
            .as_message_mut()
            .ok_or_else(|| invalid(format!("{walked}: not a message")))?;
    }
    let field = at
        .descriptor()
        .get_field_by_name(last)
        .ok_or_else(|| invalid(format!("{}: no such field", patch.path)))?;
    match patch.value {
        None => at.clear_field(&field),
        Some(value) => {
            // The value decoded as the field of a message holding only it.
            let mut holder = serde_json::Map::new();
            holder.insert(field.name().to_owned(), value.clone());
            let parsed = DynamicMessage::deserialize(at.descriptor(), Value::Object(holder))
                .map_err(|e| invalid(format!("{}: {e}", patch.path)))?;
            at.set_field(&field, parsed.get_field(&field).into_owned());
        }
    }
    Ok(())
}

/// Envoy's `Listener`.
pub const LISTENER: &str = "envoy.config.listener.v3.Listener";
/// Envoy's `Cluster`.
pub const CLUSTER: &str = "envoy.config.cluster.v3.Cluster";
/// The tracing settings of an HTTP connection manager.
pub const HCM_TRACING: &str =
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager.Tracing";

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::listener::v3::Listener;
    use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;

    #[test]
    fn a_listener_decodes_with_its_nested_typed_configs() {
        let json = r#"{
            "@type": "type.googleapis.com/envoy.config.listener.v3.Listener",
            "name": "public_listener",
            "address": {"socket_address": {"address": "0.0.0.0", "port_value": 21000}},
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                "statPrefix": "x", "cluster": "local_app", "idle_timeout": "30s"}}]}]}"#;
        let any = decode(LISTENER, json).unwrap();
        assert_eq!(any.type_url, type_url(LISTENER));
        let l: Listener = prost_reflect::prost::Message::decode(&*any.value).unwrap();
        assert_eq!(l.name, "public_listener");
        let Some(envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(cfg)) =
            &l.filter_chains[0].filters[0].config_type
        else {
            panic!("{l:?}")
        };
        let tcp: TcpProxy = prost_reflect::prost::Message::decode(&*cfg.value).unwrap();
        assert_eq!(tcp.stat_prefix, "x", "JSON names and proto names both read");
        assert_eq!(tcp.idle_timeout.unwrap().seconds, 30);
    }

    #[test]
    fn bad_json_names_the_problem() {
        let cases = [
            ("{", "is not JSON"),
            ("[1]", "must be a JSON object"),
            (
                r#"{"@type": "type.googleapis.com/envoy.api.v2.Listener"}"#,
                "envoy.api.v2.Listener",
            ),
            (r#"{"nmae": "x"}"#, "nmae"),
            (r#"{"name": 5}"#, "name"),
            (
                r#"{"filter_chains": [{"filters": [{"name": 5}]}]}"#,
                "filter_chains[0].filters[0].name",
            ),
            (
                r#"{"filter_chains": [{"filters": [{"name": "f", "typed_config": {"@type": "type.googleapis.com/no.Such"}}]}]}"#,
                "no.Such",
            ),
        ];
        for (json, says) in cases {
            let e = decode(LISTENER, json).unwrap_err().to_string();
            assert!(e.contains(says), "{json}: {e}");
        }
    }

    #[test]
    fn patches_set_and_clear_fields_by_path() {
        let cluster = decode(CLUSTER, r#"{"name": "api", "connect_timeout": "5s"}"#).unwrap();
        let v = serde_json::json!(7);
        let set = Patch {
            path: "/outlier_detection/consecutive_5xx",
            value: Some(&v),
        };
        check_patch(CLUSTER, &set).unwrap();
        let patched = apply_patch(&cluster, &set).unwrap();
        let c: envoy_types::pb::envoy::config::cluster::v3::Cluster =
            prost_reflect::prost::Message::decode(&*patched.value).unwrap();
        assert_eq!(c.outlier_detection.unwrap().consecutive_5xx.unwrap().value, 7);
        assert_eq!(c.name, "api", "the rest is kept");
        let clear = Patch {
            path: "/connect_timeout",
            value: None,
        };
        let c: envoy_types::pb::envoy::config::cluster::v3::Cluster =
            prost_reflect::prost::Message::decode(&*apply_patch(&cluster, &clear).unwrap().value).unwrap();
        assert!(c.connect_timeout.is_none());
        let text = serde_json::json!("x");
        for (path, value, says) in [
            ("/no_such", Some(&v), "/no_such: no such field"),
            ("outlier_detection", Some(&v), "must begin with /"),
            ("/outlier_detection/consecutive_5xx", Some(&text), "consecutive_5xx"),
            (
                "/health_checks/timeout",
                Some(&v),
                "/health_checks: only singular message fields",
            ),
        ] {
            let e = check_patch(CLUSTER, &Patch { path, value }).unwrap_err().to_string();
            assert!(e.contains(says), "{path}: {e}");
        }
    }

    #[test]
    fn tracing_and_clusters_decode() {
        let t = r#"{"random_sampling": {"value": 50}, "provider": {"name": "envoy.tracers.zipkin", "typed_config": {
            "@type": "type.googleapis.com/envoy.config.trace.v3.ZipkinConfig", "collector_cluster": "zipkin",
            "collector_endpoint": "/api/v2/spans", "collector_endpoint_version": "HTTP_JSON"}}}"#;
        assert!(decode(HCM_TRACING, t).is_ok());
        let c = r#"{"name": "local_app", "type": "STATIC", "connect_timeout": "1s"}"#;
        assert!(decode(CLUSTER, c).is_ok());
    }
}
