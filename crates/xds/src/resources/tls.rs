//! TLS: the proxy's two secrets (leaf, CA bundle) and the contexts that reference them over
//! SDS (on the ADS stream), with a SAN match on the peer's SPIFFE id for upstreams.

use super::{BuildError, Resources, SECRET};
use envoy_types::pb::envoy::config::core::v3::{DataSource, TransportSocket, data_source, transport_socket};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SdsSecretConfig, Secret,
    SubjectAltNameMatcher, TlsCertificate, TlsParameters, UpstreamTlsContext, common_tls_context, secret,
    subject_alt_name_matcher, tls_parameters::TlsProtocol,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::util::pack_any;
use proxycfg::ConfigSnapshot;
use structs::ConfigEntry;
use structs::IndexedCaRoots;
use structs::config_entry::TlsDirectionConfig;

fn inline(text: &str) -> Option<DataSource> {
    Some(DataSource {
        specifier: Some(data_source::Specifier::InlineString(text.to_owned())),
        ..Default::default()
    })
}

/// The PEM bundle of every trusted root.
fn bundle(roots: &IndexedCaRoots) -> String {
    roots
        .roots
        .iter()
        .map(|r| r.root_cert.trim_end().to_owned() + "\n")
        .collect()
}

/// Name of the secret holding the proxy's leaf certificate and key.
pub const LEAF_SECRET: &str = "default";
/// Name of the secret holding the CA bundle.
pub const ROOTS_SECRET: &str = "ROOTCA";

fn sds(name: &str) -> SdsSecretConfig {
    SdsSecretConfig {
        name: name.to_owned(),
        sds_config: super::core::ads(),
    }
}

/// Which direction of the mesh config entry's TLS settings.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Direction {
    /// The public listener.
    Incoming,
    /// Upstream clusters.
    Outgoing,
}

fn protocol(version: &str) -> TlsProtocol {
    match version {
        "TLSv1_0" => TlsProtocol::TlSv10,
        "TLSv1_1" => TlsProtocol::TlSv11,
        "TLSv1_2" => TlsProtocol::TlSv12,
        "TLSv1_3" => TlsProtocol::TlSv13,
        // `TLS_AUTO` and unset (the mesh entry's validation refuses anything else).
        _ => TlsProtocol::TlsAuto,
    }
}

/// The TLS parameters the `mesh` config entry sets for `direction` (none: Envoy's defaults).
pub(crate) fn mesh_params(mesh: Option<&ConfigEntry>, direction: Direction) -> Option<TlsParameters> {
    let Some(ConfigEntry::Mesh(mesh)) = mesh else {
        return None;
    };
    let tls = mesh.tls.as_ref()?;
    let cfg: &TlsDirectionConfig = match direction {
        Direction::Incoming => tls.incoming.as_ref()?,
        Direction::Outgoing => tls.outgoing.as_ref()?,
    };
    if cfg.tls_min_version.is_empty() && cfg.tls_max_version.is_empty() && cfg.cipher_suites.is_empty() {
        return None;
    }
    let min = protocol(&cfg.tls_min_version);
    let mut max = protocol(&cfg.tls_max_version);
    // Envoy's default maximum for upstream connections is TLS 1.2: a minimum of 1.3 with no
    // maximum would leave no version at all, so the maximum follows the minimum.
    if max == TlsProtocol::TlsAuto && min == TlsProtocol::TlSv13 {
        max = TlsProtocol::TlSv13;
    }
    Some(TlsParameters {
        tls_minimum_protocol_version: min as i32,
        tls_maximum_protocol_version: max as i32,
        cipher_suites: cfg
            .cipher_suites
            .iter()
            .filter_map(|c| structs::config_entry::envoy_cipher_name(c).map(str::to_owned))
            .collect(),
        ..Default::default()
    })
}

fn common(match_san: Option<&str>, tls_params: Option<TlsParameters>) -> CommonTlsContext {
    let match_typed_subject_alt_names = match_san
        .map(|uri| {
            vec![SubjectAltNameMatcher {
                san_type: subject_alt_name_matcher::SanType::Uri as i32,
                matcher: Some(StringMatcher {
                    match_pattern: Some(string_matcher::MatchPattern::Exact(uri.to_owned())),
                    ..Default::default()
                }),
                ..Default::default()
            }]
        })
        .unwrap_or_default();
    CommonTlsContext {
        tls_params,
        tls_certificate_sds_secret_configs: vec![sds(LEAF_SECRET)],
        validation_context_type: Some(common_tls_context::ValidationContextType::CombinedValidationContext(
            common_tls_context::CombinedCertificateValidationContext {
                default_validation_context: Some(CertificateValidationContext {
                    match_typed_subject_alt_names,
                    ..Default::default()
                }),
                validation_context_sds_secret_config: Some(sds(ROOTS_SECRET)),
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}

/// The proxy's two secrets: its leaf (certificate and key) and the CA bundle.
pub(crate) fn build_secrets(snap: &ConfigSnapshot, out: &mut Resources) -> Result<(), BuildError> {
    let cp = snap
        .connect_proxy()
        .ok_or(BuildError::Incomplete("not a connect-proxy"))?;
    let roots = snap.roots.as_deref().ok_or(BuildError::Incomplete("CA roots"))?;
    let leaf = cp.leaf.as_deref().ok_or(BuildError::Incomplete("leaf certificate"))?;
    let leaf_secret = Secret {
        name: LEAF_SECRET.into(),
        r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: inline(&leaf.cert_pem),
            private_key: inline(&leaf.private_key_pem),
            ..Default::default()
        })),
    };
    let roots_secret = Secret {
        name: ROOTS_SECRET.into(),
        r#type: Some(secret::Type::ValidationContext(CertificateValidationContext {
            trusted_ca: inline(&bundle(roots)),
            ..Default::default()
        })),
    };
    out.insert(SECRET, LEAF_SECRET.into(), pack_any(leaf_secret));
    out.insert(SECRET, ROOTS_SECRET.into(), pack_any(roots_secret));
    Ok(())
}

/// Inbound mTLS: present our leaf, require a client certificate from the mesh's CA.
pub(crate) fn downstream(tls_params: Option<TlsParameters>) -> TransportSocket {
    let ctx = DownstreamTlsContext {
        common_tls_context: Some(common(None, tls_params)),
        require_client_certificate: Some(BoolValue { value: true }),
        ..Default::default()
    };
    TransportSocket {
        name: "tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(ctx))),
    }
}

/// Outbound mTLS to a target: our leaf, the CA bundle, SNI, and the target's SPIFFE id.
pub(crate) fn upstream(sni: &str, spiffe_id: &str, tls_params: Option<TlsParameters>) -> TransportSocket {
    let ctx = UpstreamTlsContext {
        common_tls_context: Some(common(Some(spiffe_id), tls_params)),
        sni: sni.to_owned(),
        ..Default::default()
    };
    TransportSocket {
        name: "tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(ctx))),
    }
}
