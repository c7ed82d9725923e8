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
    #[serde(rename = "Meta", skip_serializing_if = "BTreeMap::is_empty")]
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
    pub jwks_cluster: Option<JwksCluster>,
    /// Retries of a failed fetch.
    #[serde(rename = "RetryPolicy", skip_serializing_if = "Option::is_none")]
    pub retry_policy: Option<JwksRetryPolicy>,
}

/// `JWKSCluster`: the Envoy cluster that reaches the key set's host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwksCluster {
    /// `STRICT_DNS`, `LOGICAL_DNS` or `STATIC` (default: `STATIC` for an IP address,
    /// `STRICT_DNS` for a host name).
    #[serde(rename = "DiscoveryType", skip_serializing_if = "String::is_empty")]
    pub discovery_type: String,
    /// The CA that the key set's `https://` host is checked against.
    #[serde(rename = "TLSCertificates", skip_serializing_if = "Option::is_none")]
    pub tls_certificates: Option<JwksTlsCertificates>,
    /// Connect timeout (default 5s).
    #[serde(rename = "ConnectTimeout", skip_serializing_if = "Option::is_none")]
    pub connect_timeout: Option<crate::duration::GoDuration>,
}

/// `JWKSCluster.TLSCertificates`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwksTlsCertificates {
    /// A certificate provider instance of Envoy's bootstrap (refused: meshd's bootstrap
    /// defines none).
    #[serde(rename = "CaCertificateProviderInstance", skip_serializing_if = "Option::is_none")]
    pub ca_certificate_provider_instance: Option<serde_json::Value>,
    /// Trusted CA certificates.
    #[serde(rename = "TrustedCA", skip_serializing_if = "Option::is_none")]
    pub trusted_ca: Option<JwksTrustedCa>,
}

/// Trusted CA certificates (PEM): exactly one source.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwksTrustedCa {
    /// A file on the proxy's host.
    #[serde(rename = "Filename", skip_serializing_if = "String::is_empty")]
    pub filename: String,
    /// An environment variable of the proxy.
    #[serde(rename = "EnvironmentVariable", skip_serializing_if = "String::is_empty")]
    pub environment_variable: String,
    /// The PEM itself.
    #[serde(rename = "InlineString", skip_serializing_if = "String::is_empty")]
    pub inline_string: String,
    /// The PEM, base64.
    #[serde(rename = "InlineBytes", skip_serializing_if = "String::is_empty")]
    pub inline_bytes: String,
}

/// `RetryPolicy` of a remote key set's fetch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwksRetryPolicy {
    /// Retries after the first attempt.
    #[serde(rename = "NumRetries")]
    pub num_retries: u32,
    /// Back-off between attempts (Envoy's default: 1s base, 10s max).
    #[serde(rename = "RetryPolicyBackOff", skip_serializing_if = "Option::is_none")]
    pub retry_policy_back_off: Option<JwksBackOff>,
}

/// Back-off of [`JwksRetryPolicy`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwksBackOff {
    /// First interval.
    #[serde(rename = "BaseInterval", skip_serializing_if = "Option::is_none")]
    pub base_interval: Option<crate::duration::GoDuration>,
    /// Largest interval.
    #[serde(rename = "MaxInterval", skip_serializing_if = "Option::is_none")]
    pub max_interval: Option<crate::duration::GoDuration>,
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
            (None, Some(r)) => check_remote(r)?,
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

/// The parts of a remote key set's URL: whether it is `https`, its host and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwksUrl {
    /// `https://`.
    pub tls: bool,
    /// Host name or IP address (no brackets).
    pub host: String,
    /// Port (the scheme's default when the URL names none).
    pub port: u16,
}

impl RemoteJwks {
    /// The URL's scheme, host and port; `None` when it is not an `http(s)://` URL with a
    /// host.
    pub fn url(&self) -> Option<JwksUrl> {
        let (tls, rest) = if let Some(rest) = self.uri.strip_prefix("https://") {
            (true, rest)
        } else {
            (false, self.uri.strip_prefix("http://")?)
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.contains('@') {
            return None;
        }
        let default_port = if tls { 443 } else { 80 };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6.split_once(']')?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().ok()?,
                None if after.is_empty() => default_port,
                None => return None,
            };
            (host.to_owned(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_owned(), p.parse().ok()?),
                None => (authority.to_owned(), default_port),
            }
        };
        let valid_host = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
        (valid_host && port != 0).then_some(JwksUrl { tls, host, port })
    }
}

/// Remote keys: a URL with a host, a cluster meshd can build, a sane retry policy.
fn check_remote(r: &RemoteJwks) -> Result<(), ValidationError> {
    if r.url().is_none() {
        return Err(invalid(
            "JSONWebKeySet.Remote.URI",
            format!("{:?}: expected an http:// or https:// URL with a host", r.uri),
        ));
    }
    if let Some(c) = &r.jwks_cluster {
        if !matches!(c.discovery_type.as_str(), "" | "STATIC" | "STRICT_DNS" | "LOGICAL_DNS") {
            return Err(invalid(
                "JSONWebKeySet.Remote.JWKSCluster.DiscoveryType",
                format!("{:?}: expected STATIC, STRICT_DNS or LOGICAL_DNS", c.discovery_type),
            ));
        }
        if c.discovery_type == "STATIC" && r.url().is_some_and(|u| u.host.parse::<std::net::IpAddr>().is_err()) {
            return Err(invalid(
                "JSONWebKeySet.Remote.JWKSCluster.DiscoveryType",
                "STATIC needs an IP address in the URI; use STRICT_DNS or LOGICAL_DNS for a host name",
            ));
        }
        if let Some(tls) = &c.tls_certificates {
            check_jwks_tls(tls)?;
        }
    }
    if let Some(b) = r.retry_policy.as_ref().and_then(|p| p.retry_policy_back_off.as_ref()) {
        let at = "JSONWebKeySet.Remote.RetryPolicy.RetryPolicyBackOff";
        if b.base_interval.is_none_or(|d| d.is_zero()) {
            return Err(invalid(&format!("{at}.BaseInterval"), "must be more than zero"));
        }
        if let (Some(base), Some(max)) = (b.base_interval, b.max_interval)
            && max.0 < base.0
        {
            return Err(invalid(
                &format!("{at}.MaxInterval"),
                "must not be less than BaseInterval",
            ));
        }
    }
    Ok(())
}

fn check_jwks_tls(tls: &JwksTlsCertificates) -> Result<(), ValidationError> {
    let at = "JSONWebKeySet.Remote.JWKSCluster.TLSCertificates";
    if tls.ca_certificate_provider_instance.is_some() {
        return Err(invalid(
            &format!("{at}.CaCertificateProviderInstance"),
            "is not supported: Envoy's bootstrap from meshd defines no certificate provider instances; use TrustedCA",
        ));
    }
    let Some(ca) = &tls.trusted_ca else {
        return Err(invalid(&format!("{at}.TrustedCA"), "is required"));
    };
    let set = [
        &ca.filename,
        &ca.environment_variable,
        &ca.inline_string,
        &ca.inline_bytes,
    ]
    .iter()
    .filter(|s| !s.is_empty())
    .count();
    if set != 1 {
        return Err(invalid(
            &format!("{at}.TrustedCA"),
            "set exactly one of Filename, EnvironmentVariable, InlineString and InlineBytes",
        ));
    }
    if !ca.inline_bytes.is_empty() {
        base64::engine::general_purpose::STANDARD
            .decode(ca.inline_bytes.trim())
            .map_err(|e| invalid(&format!("{at}.TrustedCA.InlineBytes"), format!("is not base64: {e}")))?;
    }
    Ok(())
}

impl LocalJwks {
    /// The inline key set's JSON (`JWKS` decoded), when it is valid base64.
    pub fn jwks_json(&self) -> Option<String> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(self.jwks.trim())
            .ok()?;
        String::from_utf8(bytes).ok()
    }
}

impl JwksTrustedCa {
    /// `InlineBytes` decoded, when it is valid base64.
    pub fn inline_bytes_decoded(&self) -> Option<Vec<u8>> {
        base64::engine::general_purpose::STANDARD
            .decode(self.inline_bytes.trim())
            .ok()
    }
}
