//! `jwt-provider`: an issuer of JSON Web Tokens and where its keys are (Consul's shape). Its
//! tokens are checked by the sidecars of services whose intentions require it (intentions'
//! `JWT`, still refused when written: until the proxies enforce them, a provider has no
//! effect, as in Consul without a referencing intention).

use super::{ConfigEntryKind, check_entry_name};
use crate::Index;
use crate::validate::{Problem, Validate, ValidationError};
use base64::Engine;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A JWT provider.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwtProvider {
    /// The provider's name, which intentions refer to.
    #[serde(rename = "Name")]
    pub name: String,
    /// The `iss` its tokens must carry (any when empty).
    #[serde(rename = "Issuer", skip_serializing_if = "String::is_empty")]
    pub issuer: String,
    /// Where the keys that sign its tokens are.
    #[serde(rename = "JSONWebKeySet")]
    pub json_web_key_set: JsonWebKeySet,
    /// The `aud` values accepted (any when empty).
    #[serde(rename = "Audiences", skip_serializing_if = "Vec::is_empty")]
    pub audiences: Vec<String>,
    /// Where a request carries its token (default: `Authorization: Bearer`).
    #[serde(rename = "Locations", skip_serializing_if = "Vec::is_empty")]
    pub locations: Vec<JwtLocation>,
    /// The verified payload forwarded to the application in a header.
    #[serde(rename = "Forwarding", skip_serializing_if = "Option::is_none")]
    pub forwarding: Option<JwtForwarding>,
    /// Clock skew allowed on `exp` and `nbf`, seconds (default 30).
    #[serde(rename = "ClockSkewSeconds", skip_serializing_if = "crate::json::ser::is_default")]
    pub clock_skew_seconds: u32,
    /// Verified tokens cached per proxy.
    #[serde(rename = "CacheConfig", skip_serializing_if = "Option::is_none")]
    pub cache_config: Option<JwtCacheConfig>,
    /// User metadata; keys untouched.
    #[serde(rename = "Meta")]
    pub meta: BTreeMap<String, String>,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

/// `JSONWebKeySet`: exactly one of `Local` and `Remote`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JsonWebKeySet {
    /// Keys given here or in a file on the proxies' hosts.
    #[serde(rename = "Local", skip_serializing_if = "Option::is_none")]
    pub local: Option<LocalJwks>,
    /// Keys fetched from a URL.
    #[serde(rename = "Remote", skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteJwks>,
}

/// Local keys: exactly one of `JWKS` (base64 of the JSON key set) and `Filename`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LocalJwks {
    /// Base64 of the JSON Web Key Set.
    #[serde(rename = "JWKS", skip_serializing_if = "String::is_empty")]
    pub jwks: String,
    /// A file holding the key set.
    #[serde(rename = "Filename", skip_serializing_if = "String::is_empty")]
    pub filename: String,
}

/// Remote keys.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RemoteJwks {
    /// `http://` or `https://` URL of the key set.
    #[serde(rename = "URI")]
    pub uri: String,
    /// Fetch timeout, ms (default 1000).
    #[serde(rename = "RequestTimeoutMs", skip_serializing_if = "crate::json::ser::is_default")]
    pub request_timeout_ms: u32,
    /// How long fetched keys are kept (default 5m).
    #[serde(rename = "CacheDuration", skip_serializing_if = "Option::is_none")]
    pub cache_duration: Option<crate::duration::GoDuration>,
    /// Fetch in the background rather than on the first request.
    #[serde(rename = "FetchAsynchronously")]
    pub fetch_asynchronously: bool,
    /// Send the host as SNI.
    #[serde(rename = "UseSNI")]
    pub use_sni: bool,
    /// How the key set's host is reached (the cluster's DNS type, TLS, timeout).
    #[serde(rename = "JWKSCluster", skip_serializing_if = "Option::is_none")]
    pub jwks_cluster: Option<serde_json::Value>,
    /// Retries of a failed fetch.
    #[serde(rename = "RetryPolicy", skip_serializing_if = "Option::is_none")]
    pub retry_policy: Option<serde_json::Value>,
}

/// One place a token may be: exactly one of `Header`, `QueryParam` and `Cookie`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwtLocation {
    /// A header (`Name`, `ValuePrefix` such as `Bearer `, `Forward` it on).
    #[serde(rename = "Header", skip_serializing_if = "Option::is_none")]
    pub header: Option<JwtHeader>,
    /// A query parameter.
    #[serde(rename = "QueryParam", skip_serializing_if = "Option::is_none")]
    pub query_param: Option<JwtNamed>,
    /// A cookie.
    #[serde(rename = "Cookie", skip_serializing_if = "Option::is_none")]
    pub cookie: Option<JwtNamed>,
}

/// A header holding a token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwtHeader {
    /// The header's name.
    #[serde(rename = "Name")]
    pub name: String,
    /// What comes before the token in it.
    #[serde(rename = "ValuePrefix", skip_serializing_if = "String::is_empty")]
    pub value_prefix: String,
    /// Keep the header on the request to the application.
    #[serde(rename = "Forward")]
    pub forward: bool,
}

/// A query parameter or cookie holding a token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwtNamed {
    /// Its name.
    #[serde(rename = "Name")]
    pub name: String,
}

/// `Forwarding`: the verified payload in a header.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwtForwarding {
    /// The header's name.
    #[serde(rename = "HeaderName")]
    pub header_name: String,
    /// Pad the base64url payload.
    #[serde(rename = "PadForwardPayloadHeader")]
    pub pad_forward_payload_header: bool,
}

/// `CacheConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwtCacheConfig {
    /// Tokens kept.
    #[serde(rename = "Size")]
    pub size: u32,
}

fn invalid(field: &str, why: impl Into<String>) -> ValidationError {
    ValidationError::new(field, Problem::Invalid(why.into()))
}

impl Validate for JwtProvider {
    fn validate(&self) -> Result<(), ValidationError> {
        check_entry_name(ConfigEntryKind::JwtProvider, &self.name)?;
        let set = &self.json_web_key_set;
        match (&set.local, &set.remote) {
            (Some(l), None) => check_local(l)?,
            (None, Some(r)) => {
                if !(r.uri.starts_with("http://") || r.uri.starts_with("https://")) || r.uri.len() <= "https://".len() {
                    return Err(invalid(
                        "JSONWebKeySet.Remote.URI",
                        format!("{:?}: expected an http:// or https:// URL", r.uri),
                    ));
                }
            }
            _ => return Err(invalid("JSONWebKeySet", "set exactly one of Local and Remote")),
        }
        for (i, l) in self.locations.iter().enumerate() {
            let at = format!("Locations[{i}]");
            let named = [
                l.header.as_ref().map(|h| &h.name),
                l.query_param.as_ref().map(|q| &q.name),
                l.cookie.as_ref().map(|c| &c.name),
            ];
            if named.iter().flatten().count() != 1 {
                return Err(invalid(&at, "set exactly one of Header, QueryParam and Cookie"));
            }
            if named.iter().flatten().any(|n| n.is_empty()) {
                return Err(invalid(&format!("{at}.Name"), "is required"));
            }
        }
        if let Some(f) = &self.forwarding
            && f.header_name.is_empty()
        {
            return Err(invalid("Forwarding.HeaderName", "is required"));
        }
        Ok(())
    }
}

/// Local keys: exactly one source; inline ones must be base64 of a JSON key set.
fn check_local(l: &LocalJwks) -> Result<(), ValidationError> {
    match (l.jwks.is_empty(), l.filename.is_empty()) {
        (false, true) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(l.jwks.trim())
                .map_err(|e| invalid("JSONWebKeySet.Local.JWKS", format!("is not base64: {e}")))?;
            let set: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| invalid("JSONWebKeySet.Local.JWKS", format!("is not a JSON key set: {e}")))?;
            if !set.get("keys").is_some_and(serde_json::Value::is_array) {
                return Err(invalid("JSONWebKeySet.Local.JWKS", "the key set has no \"keys\" list"));
            }
            Ok(())
        }
        (true, false) => Ok(()),
        _ => Err(invalid("JSONWebKeySet.Local", "set exactly one of JWKS and Filename")),
    }
}
