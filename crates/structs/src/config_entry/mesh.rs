//! `mesh`: mesh-wide settings (the single entry named `mesh`).

use super::{ConfigEntryKind, check_entry_name};
use crate::Index;
use crate::validate::{Problem, Validate, ValidationError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Transparent-proxy settings for the whole mesh.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshTransparentProxyConfig {
    /// Only let transparent proxies reach destinations in the mesh.
    #[serde(rename = "MeshDestinationsOnly")]
    pub mesh_destinations_only: bool,
}

/// TLS settings for one direction.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsDirectionConfig {
    /// `TLSv1_0` .. `TLSv1_3`, or empty for Envoy's default.
    #[serde(rename = "TLSMinVersion", skip_serializing_if = "String::is_empty")]
    pub tls_min_version: String,
    /// `TLSv1_0` .. `TLSv1_3`, or empty for Envoy's default.
    #[serde(rename = "TLSMaxVersion", skip_serializing_if = "String::is_empty")]
    pub tls_max_version: String,
    /// Cipher suites (TLS 1.2 and below).
    #[serde(rename = "CipherSuites", skip_serializing_if = "Vec::is_empty")]
    pub cipher_suites: Vec<String>,
}

/// TLS settings of sidecars.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshTlsConfig {
    /// For inbound (public listener) connections.
    #[serde(rename = "Incoming", skip_serializing_if = "Option::is_none")]
    pub incoming: Option<TlsDirectionConfig>,
    /// For outbound (upstream) connections.
    #[serde(rename = "Outgoing", skip_serializing_if = "Option::is_none")]
    pub outgoing: Option<TlsDirectionConfig>,
}

/// HTTP settings of sidecars.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshHttpConfig {
    /// Strip `X-Forwarded-Client-Cert` from incoming requests.
    #[serde(rename = "SanitizeXForwardedClientCert")]
    pub sanitize_x_forwarded_client_cert: bool,
    /// For requests proxies receive from the mesh.
    #[serde(rename = "Incoming", skip_serializing_if = "Option::is_none")]
    pub incoming: Option<MeshDirectionalHttpConfig>,
}

/// HTTP settings for one direction (only `Incoming` exists).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshDirectionalHttpConfig {
    /// What the proxy does to a request before anything else sees it.
    #[serde(rename = "RequestNormalization", skip_serializing_if = "Option::is_none")]
    pub request_normalization: Option<RequestNormalization>,
}

/// How inbound HTTP requests are normalized, before the intentions (RBAC) and the
/// application see them. All defaults: the path normalized (RFC 3986), slashes not merged,
/// escaped slashes kept, headers with underscores allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RequestNormalization {
    /// Turn the RFC 3986 normalization of the path off (Envoy's `normalize_path`).
    #[serde(rename = "InsecureDisablePathNormalization")]
    pub insecure_disable_path_normalization: bool,
    /// Merge repeated slashes in the path (Envoy's `merge_slashes`).
    #[serde(rename = "MergeSlashes")]
    pub merge_slashes: bool,
    /// What to do with `%2F`, `%2f`, `%5C` and `%5c` in the path: one of
    /// [`PATH_WITH_ESCAPED_SLASHES_ACTIONS`], empty for the first.
    #[serde(rename = "PathWithEscapedSlashesAction")]
    pub path_with_escaped_slashes_action: String,
    /// What to do with a request header whose name has an underscore: one of
    /// [`HEADERS_WITH_UNDERSCORES_ACTIONS`], empty for the first.
    #[serde(rename = "HeadersWithUnderscoresAction")]
    pub headers_with_underscores_action: String,
}

/// Values of `PathWithEscapedSlashesAction` (Envoy's names), the default first.
pub const PATH_WITH_ESCAPED_SLASHES_ACTIONS: [&str; 5] = [
    "IMPLEMENTATION_SPECIFIC_DEFAULT",
    "KEEP_UNCHANGED",
    "REJECT_REQUEST",
    "UNESCAPE_AND_REDIRECT",
    "UNESCAPE_AND_FORWARD",
];

/// Values of `HeadersWithUnderscoresAction` (Envoy's names), the default first.
pub const HEADERS_WITH_UNDERSCORES_ACTIONS: [&str; 3] = ["ALLOW", "REJECT_REQUEST", "DROP_HEADER"];

/// `Peering` of the `mesh` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshPeeringConfig {
    /// The peering calls cross the mesh gateways: this cluster's tokens name its mesh
    /// gateways (which route the servers' peering name to them), and its servers dial
    /// their peers through its own mesh gateways.
    #[serde(rename = "PeerThroughMeshGateways")]
    pub peer_through_mesh_gateways: bool,
}

/// The `mesh` config entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshConfig {
    /// Always `mesh`.
    #[serde(rename = "Name", skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Transparent-proxy settings.
    #[serde(rename = "TransparentProxy")]
    pub transparent_proxy: MeshTransparentProxyConfig,
    /// TLS settings.
    #[serde(rename = "TLS", skip_serializing_if = "Option::is_none")]
    pub tls: Option<MeshTlsConfig>,
    /// Consul's `ValidateClusters`: only `false` (see [`super::DefaultOnly`]).
    #[serde(rename = "ValidateClusters", skip_serializing_if = "Option::is_none")]
    pub validate_clusters: super::DefaultOnly,
    /// HTTP settings.
    #[serde(rename = "HTTP", skip_serializing_if = "Option::is_none")]
    pub http: Option<MeshHttpConfig>,
    /// Let services opt into permissive mTLS.
    #[serde(
        rename = "AllowEnablingPermissiveMutualTLS",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub allow_enabling_permissive_mutual_tls: bool,
    /// Cluster peering settings.
    #[serde(rename = "Peering", skip_serializing_if = "Option::is_none")]
    pub peering: Option<MeshPeeringConfig>,
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

const TLS_VERSIONS: [&str; 5] = ["TLS_AUTO", "TLSv1_0", "TLSv1_1", "TLSv1_2", "TLSv1_3"];

/// Cipher suites a mesh may name (TLS 1.2 and below), by IANA name, and the name Envoy
/// (BoringSSL) knows each by. Either name is accepted.
const CIPHER_SUITES: [(&str, &str); 12] = [
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        "ECDHE-ECDSA-AES128-GCM-SHA256",
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
    ),
    ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "ECDHE-RSA-AES128-GCM-SHA256"),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        "ECDHE-RSA-CHACHA20-POLY1305",
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
    ),
    ("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "ECDHE-RSA-AES256-GCM-SHA384"),
    ("TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA", "ECDHE-ECDSA-AES128-SHA"),
    ("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", "ECDHE-RSA-AES128-SHA"),
    ("TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA", "ECDHE-ECDSA-AES256-SHA"),
    ("TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA", "ECDHE-RSA-AES256-SHA"),
    ("TLS_RSA_WITH_AES_128_GCM_SHA256", "AES128-GCM-SHA256"),
    ("TLS_RSA_WITH_AES_256_GCM_SHA384", "AES256-GCM-SHA384"),
];

/// Envoy's name of a cipher suite given by its IANA or Envoy name; `None` if unknown.
pub fn envoy_cipher_name(name: &str) -> Option<&'static str> {
    CIPHER_SUITES
        .iter()
        .find(|(iana, envoy)| *iana == name || *envoy == name)
        .map(|(_, envoy)| *envoy)
}

impl MeshConfig {
    /// Whether the peering calls cross the mesh gateways (`Peering.PeerThroughMeshGateways`).
    pub fn peer_through_mesh_gateways(&self) -> bool {
        self.peering.as_ref().is_some_and(|p| p.peer_through_mesh_gateways)
    }

    /// `HTTP.Incoming.RequestNormalization`, if set.
    pub fn request_normalization(&self) -> Option<&RequestNormalization> {
        self.http.as_ref()?.incoming.as_ref()?.request_normalization.as_ref()
    }
}

/// Position of a TLS version in [`TLS_VERSIONS`] (`TLS_AUTO` and unset: none).
fn version_rank(v: &str) -> Option<usize> {
    TLS_VERSIONS.iter().skip(1).position(|t| *t == v)
}

impl Validate for MeshConfig {
    fn validate(&self) -> Result<(), ValidationError> {
        check_entry_name(ConfigEntryKind::Mesh, &self.name)?;
        super::check_default_only(
            "ValidateClusters",
            &self.validate_clusters,
            &[],
            "meshd's routes never name a cluster it does not send (Envoy's validate_clusters stays off)",
        )?;
        if let Some(tls) = &self.tls {
            for (dir, cfg) in [("Incoming", &tls.incoming), ("Outgoing", &tls.outgoing)] {
                let Some(cfg) = cfg else { continue };
                check_tls_params(
                    &format!("TLS.{dir}"),
                    &cfg.tls_min_version,
                    &cfg.tls_max_version,
                    &cfg.cipher_suites,
                )?;
            }
        }
        if let Some(rn) = self.request_normalization() {
            check_request_normalization(rn)?;
        }
        Ok(())
    }
}

fn check_request_normalization(rn: &RequestNormalization) -> Result<(), ValidationError> {
    let at = "HTTP.Incoming.RequestNormalization";
    for (field, value, allowed) in [
        (
            "PathWithEscapedSlashesAction",
            &rn.path_with_escaped_slashes_action,
            &PATH_WITH_ESCAPED_SLASHES_ACTIONS[..],
        ),
        (
            "HeadersWithUnderscoresAction",
            &rn.headers_with_underscores_action,
            &HEADERS_WITH_UNDERSCORES_ACTIONS[..],
        ),
    ] {
        if !value.is_empty() && !allowed.contains(&value.as_str()) {
            return Err(ValidationError::new(
                format!("{at}.{field}"),
                Problem::Invalid(format!(
                    "unknown action {value:?}: expected one of {}",
                    allowed.join(", ")
                )),
            ));
        }
    }
    Ok(())
}

/// Checks TLS versions and cipher suites as the mesh entry takes them; `at` prefixes the
/// field names (`TLS.Incoming`, `Listeners[0].TLS`). Shared with the gateway entries.
pub(crate) fn check_tls_params(at: &str, min: &str, max: &str, ciphers: &[String]) -> Result<(), ValidationError> {
    check_tls_versions(at, ("TLSMinVersion", min), ("TLSMaxVersion", max), ciphers)
}

/// [`check_tls_params`] for an entry whose version fields have other names (the API
/// gateway's `MinVersion` and `MaxVersion`): (field name, value) of each.
pub(crate) fn check_tls_versions(
    at: &str,
    (min_field, min): (&str, &str),
    (max_field, max): (&str, &str),
    ciphers: &[String],
) -> Result<(), ValidationError> {
    for (field, v) in [(min_field, min), (max_field, max)] {
        if !v.is_empty() && !TLS_VERSIONS.contains(&v) {
            return Err(ValidationError::new(
                format!("{at}.{field}"),
                Problem::Invalid(format!(
                    "unknown TLS version {v:?}: expected one of {}",
                    TLS_VERSIONS.join(", ")
                )),
            ));
        }
    }
    if let (Some(lo), Some(hi)) = (version_rank(min), version_rank(max))
        && lo > hi
    {
        return Err(ValidationError::new(
            format!("{at}.{min_field}"),
            Problem::Invalid(format!("{min} is above {max_field} {max}")),
        ));
    }
    if !ciphers.is_empty() && min == "TLSv1_3" {
        return Err(ValidationError::new(
            format!("{at}.CipherSuites"),
            Problem::NotAllowed(if min_field == "MinVersion" {
                "with MinVersion TLSv1_3: TLS 1.3 cipher suites are not configurable"
            } else {
                "with TLSMinVersion TLSv1_3: TLS 1.3 cipher suites are not configurable"
            }),
        ));
    }
    for (i, c) in ciphers.iter().enumerate() {
        if envoy_cipher_name(c).is_none() {
            return Err(ValidationError::new(
                format!("{at}.CipherSuites[{i}]"),
                Problem::Invalid(format!("unknown or unsupported cipher suite {c:?}")),
            ));
        }
    }
    Ok(())
}
