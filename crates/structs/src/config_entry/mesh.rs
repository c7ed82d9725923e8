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
    #[serde(rename = "CipherSuites")]
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
    /// HTTP settings.
    #[serde(rename = "HTTP", skip_serializing_if = "Option::is_none")]
    pub http: Option<MeshHttpConfig>,
    /// Let services opt into permissive mTLS.
    #[serde(rename = "AllowEnablingPermissiveMutualTLS")]
    pub allow_enabling_permissive_mutual_tls: bool,
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

const TLS_VERSIONS: [&str; 5] = ["TLS_AUTO", "TLSv1_0", "TLSv1_1", "TLSv1_2", "TLSv1_3"];

impl Validate for MeshConfig {
    fn validate(&self) -> Result<(), ValidationError> {
        check_entry_name(ConfigEntryKind::Mesh, &self.name)?;
        if let Some(tls) = &self.tls {
            for (dir, cfg) in [("Incoming", &tls.incoming), ("Outgoing", &tls.outgoing)] {
                let Some(cfg) = cfg else { continue };
                for (field, v) in [
                    ("TLSMinVersion", &cfg.tls_min_version),
                    ("TLSMaxVersion", &cfg.tls_max_version),
                ] {
                    if !v.is_empty() && !TLS_VERSIONS.contains(&v.as_str()) {
                        return Err(ValidationError::new(
                            format!("TLS.{dir}.{field}"),
                            Problem::Invalid(format!(
                                "unknown TLS version {v:?}: expected one of {}",
                                TLS_VERSIONS.join(", ")
                            )),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}
