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

pub(crate) fn inline(text: &str) -> Option<DataSource> {
    Some(DataSource {
        specifier: Some(data_source::Specifier::InlineString(text.to_owned())),
        ..Default::default()
    })
}

/// The PEM bundle of every trusted root.
fn bundle(roots: &IndexedCaRoots) -> String {
    pem_bundle(roots.roots.iter().map(|r| r.root_cert.as_str()))
}

/// Certificates in PEM, one after the other.
fn pem_bundle<'a>(pems: impl IntoIterator<Item = &'a str>) -> String {
    pems.into_iter().map(|pem| pem.trim_end().to_owned() + "\n").collect()
}

/// Name of the secret holding the proxy's leaf certificate and key.
pub const LEAF_SECRET: &str = "default";
/// Name of the secret holding the CA bundle.
pub const ROOTS_SECRET: &str = "ROOTCA";

pub(crate) fn sds(name: &str) -> SdsSecretConfig {
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
pub(crate) fn mesh_params(
    snap: &ConfigSnapshot,
    mesh: Option<&ConfigEntry>,
    direction: Direction,
) -> Option<TlsParameters> {
    let mut out = configured_params(mesh, direction);
    // A P-384 root signs P-384 leaves. In TLS 1.2 (Envoy's default maximum toward upstreams)
    // a peer may present an ECDSA certificate only on a curve the other side offers, and
    // Envoy offers X25519 and P-256 by default: the handshake would fail. While any root of
    // the bundle is P-384 (a rotation to it, or away from it, included), both sides offer it.
    let p384 = snap
        .roots
        .as_deref()
        .is_some_and(|r| r.roots.iter().any(|root| root.private_key_bits == 384));
    if p384 {
        let p = out.get_or_insert_with(TlsParameters::default);
        p.ecdh_curves = ["X25519", "P-256", "P-384"].map(str::to_owned).to_vec();
    }
    out
}

/// The parameters the `mesh` entry sets for `direction`.
fn configured_params(mesh: Option<&ConfigEntry>, direction: Direction) -> Option<TlsParameters> {
    let Some(ConfigEntry::Mesh(mesh)) = mesh else {
        return None;
    };
    let tls = mesh.tls.as_ref()?;
    let cfg: &TlsDirectionConfig = match direction {
        Direction::Incoming => tls.incoming.as_ref()?,
        Direction::Outgoing => tls.outgoing.as_ref()?,
    };
    params(&cfg.tls_min_version, &cfg.tls_max_version, &cfg.cipher_suites)
}

/// TLS parameters from versions and cipher names (none when all are unset: Envoy's
/// defaults).
pub(crate) fn params(min_version: &str, max_version: &str, ciphers: &[String]) -> Option<TlsParameters> {
    if min_version.is_empty() && max_version.is_empty() && ciphers.is_empty() {
        return None;
    }
    let min = protocol(min_version);
    let mut max = protocol(max_version);
    // Envoy's default maximum for upstream connections is TLS 1.2: a minimum of 1.3 with no
    // maximum would leave no version at all, so the maximum follows the minimum.
    if max == TlsProtocol::TlsAuto && min == TlsProtocol::TlSv13 {
        max = TlsProtocol::TlSv13;
    }
    Some(TlsParameters {
        tls_minimum_protocol_version: min as i32,
        tls_maximum_protocol_version: max as i32,
        cipher_suites: ciphers
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

/// A secret holding a leaf certificate and its key.
pub(crate) fn leaf_secret(name: &str, leaf: &structs::IssuedCert) -> Secret {
    Secret {
        name: name.to_owned(),
        r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: inline(&leaf.cert_pem),
            private_key: inline(&leaf.private_key_pem),
            ..Default::default()
        })),
    }
}

/// The CA bundle secret.
pub(crate) fn roots_secret(roots: &IndexedCaRoots) -> Secret {
    Secret {
        name: ROOTS_SECRET.into(),
        r#type: Some(secret::Type::ValidationContext(CertificateValidationContext {
            trusted_ca: inline(&bundle(roots)),
            ..Default::default()
        })),
    }
}

/// The proxy's two secrets: its leaf (certificate and key) and the CA bundle.
pub(crate) fn build_secrets(snap: &ConfigSnapshot, out: &mut Resources) -> Result<(), BuildError> {
    let roots = snap.roots.as_deref().ok_or(BuildError::Incomplete("CA roots"))?;
    let leaf = match &snap.kind {
        proxycfg::KindSnapshot::ConnectProxy(cp) => cp.leaf.as_deref(),
        proxycfg::KindSnapshot::IngressGateway(g) => g.leaf.as_deref(),
        proxycfg::KindSnapshot::ApiGateway(g) => g.leaf.as_deref(),
        // It terminates no TLS: no secret at all.
        proxycfg::KindSnapshot::MeshGateway(_) => return Ok(()),
        // Its leaves are per represented service (see the gateway builder).
        proxycfg::KindSnapshot::TerminatingGateway(_) => {
            out.insert(SECRET, ROOTS_SECRET.into(), pack_any(roots_secret(roots)));
            return Ok(());
        }
    };
    let leaf = leaf.ok_or(BuildError::Incomplete("leaf certificate"))?;
    out.insert(SECRET, LEAF_SECRET.into(), pack_any(leaf_secret(LEAF_SECRET, leaf)));
    out.insert(SECRET, ROOTS_SECRET.into(), pack_any(roots_secret(roots)));
    // The roots of each peer an upstream is in.
    if let proxycfg::KindSnapshot::ConnectProxy(cp) = &snap.kind {
        let peered = cp.peered.values().chain(cp.peer_targets.values());
        for bundle in peered.filter_map(|p| p.bundle.as_ref()) {
            out.insert(
                SECRET,
                peer_roots_secret_name(&bundle.peer),
                pack_any(peer_roots_secret(bundle)),
            );
        }
    }
    Ok(())
}

/// A certificate from an external SDS server: `cluster` (in Envoy's bootstrap) serves
/// `resource` over gRPC.
pub(crate) fn external_sds(cluster: &str, resource: &str) -> SdsSecretConfig {
    use envoy_types::pb::envoy::config::core::v3::{
        ApiConfigSource, ApiVersion, ConfigSource, GrpcService, api_config_source, config_source, grpc_service,
    };
    SdsSecretConfig {
        name: resource.to_owned(),
        sds_config: Some(ConfigSource {
            resource_api_version: ApiVersion::V3 as i32,
            config_source_specifier: Some(config_source::ConfigSourceSpecifier::ApiConfigSource(ApiConfigSource {
                api_type: api_config_source::ApiType::Grpc as i32,
                transport_api_version: ApiVersion::V3 as i32,
                grpc_services: vec![GrpcService {
                    target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(grpc_service::EnvoyGrpc {
                        cluster_name: cluster.to_owned(),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            })),
            ..Default::default()
        }),
    }
}

/// A TLS server that asks for no client certificate (an ingress listener facing clients
/// outside the mesh): `certificate` over SDS, ALPN for the listener's protocol.
pub(crate) fn downstream_server(
    certificate: SdsSecretConfig,
    tls_params: Option<TlsParameters>,
    alpn: &[&str],
) -> TransportSocket {
    downstream_server_of(vec![certificate], tls_params, alpn)
}

/// A TLS server with several certificates, which Envoy picks from by the client's SNI (an
/// exact DNS SAN first, then a wildcard, then the first certificate).
pub(crate) fn downstream_server_of(
    certificates: Vec<SdsSecretConfig>,
    tls_params: Option<TlsParameters>,
    alpn: &[&str],
) -> TransportSocket {
    let ctx = DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_params,
            tls_certificate_sds_secret_configs: certificates,
            alpn_protocols: alpn.iter().map(|p| (*p).to_owned()).collect(),
            ..Default::default()
        }),
        ..Default::default()
    };
    TransportSocket {
        name: "tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(ctx))),
    }
}

/// Inbound mTLS presenting the leaf in secret `leaf` (a terminating gateway presents the
/// certificate of the service the connection is for) and requiring a mesh client certificate.
pub(crate) fn downstream_as(leaf: &str, tls_params: Option<TlsParameters>) -> TransportSocket {
    let mut common = common(None, tls_params);
    common.tls_certificate_sds_secret_configs = vec![sds(leaf)];
    let ctx = DownstreamTlsContext {
        common_tls_context: Some(common),
        require_client_certificate: Some(BoolValue { value: true }),
        ..Default::default()
    };
    TransportSocket {
        name: "tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(ctx))),
    }
}

/// TLS originated to a service outside the mesh: its CA bundle (a file on the gateway's
/// host), an optional client certificate, and SNI (also the name the certificate must carry).
pub(crate) fn upstream_external(ca_file: &str, cert_file: &str, key_file: &str, sni: &str) -> TransportSocket {
    let file = |path: &str| {
        Some(DataSource {
            specifier: Some(data_source::Specifier::Filename(path.to_owned())),
            ..Default::default()
        })
    };
    let match_typed_subject_alt_names = if sni.is_empty() {
        Vec::new()
    } else {
        vec![SubjectAltNameMatcher {
            san_type: subject_alt_name_matcher::SanType::Dns as i32,
            matcher: Some(StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Exact(sni.to_owned())),
                ..Default::default()
            }),
            ..Default::default()
        }]
    };
    let tls_certificates = if cert_file.is_empty() {
        Vec::new()
    } else {
        vec![TlsCertificate {
            certificate_chain: file(cert_file),
            private_key: file(key_file),
            ..Default::default()
        }]
    };
    let ctx = UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificates,
            validation_context_type: Some(common_tls_context::ValidationContextType::ValidationContext(
                CertificateValidationContext {
                    trusted_ca: file(ca_file),
                    match_typed_subject_alt_names,
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
        sni: sni.to_owned(),
        ..Default::default()
    };
    TransportSocket {
        name: "tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(ctx))),
    }
}

/// The SDS reference to the proxy's leaf secret.
pub(crate) fn leaf_sds() -> SdsSecretConfig {
    sds(LEAF_SECRET)
}

/// The TLS parameters of a gateway listener's TLS settings (none: Envoy's defaults).
pub(crate) fn gateway_params(cfg: &structs::config_entry::GatewayTlsConfig) -> Option<TlsParameters> {
    params(&cfg.tls_min_version, &cfg.tls_max_version, &cfg.cipher_suites)
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

/// The name of the secret holding a peer's roots.
pub(crate) fn peer_roots_secret_name(peer: &str) -> String {
    format!("peer-roots/{peer}")
}

/// The secret holding a peer's roots (what its services' certificates chain to).
pub(crate) fn peer_roots_secret(bundle: &structs::peering::PeerTrustBundle) -> Secret {
    Secret {
        name: peer_roots_secret_name(&bundle.peer),
        r#type: Some(secret::Type::ValidationContext(CertificateValidationContext {
            trusted_ca: inline(&pem_bundle(bundle.root_pems.iter().map(String::as_str))),
            ..Default::default()
        })),
    }
}

/// Outbound mTLS to a peer's service: our leaf, the peer's roots, the SNI the peer's
/// gateways route, and one of the SPIFFE ids the peer says its instances present.
pub(crate) fn upstream_peer(
    sni: &str,
    spiffe_ids: &[String],
    peer: &str,
    tls_params: Option<TlsParameters>,
) -> TransportSocket {
    let match_typed_subject_alt_names = spiffe_ids
        .iter()
        .map(|uri| SubjectAltNameMatcher {
            san_type: subject_alt_name_matcher::SanType::Uri as i32,
            matcher: Some(StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Exact(uri.clone())),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    let ctx = UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_params,
            tls_certificate_sds_secret_configs: vec![sds(LEAF_SECRET)],
            validation_context_type: Some(common_tls_context::ValidationContextType::CombinedValidationContext(
                common_tls_context::CombinedCertificateValidationContext {
                    default_validation_context: Some(CertificateValidationContext {
                        match_typed_subject_alt_names,
                        ..Default::default()
                    }),
                    validation_context_sds_secret_config: Some(sds(&peer_roots_secret_name(peer))),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
        sni: sni.to_owned(),
        ..Default::default()
    };
    TransportSocket {
        name: "tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(ctx))),
    }
}

/// Inbound mTLS accepting this cluster's callers and those of `peers`: each trust domain's
/// certificates verified with its own roots only (Envoy's SPIFFE validator), so a peer's CA
/// can never vouch for an identity of this cluster.
pub(crate) fn downstream_trusting(
    tls_params: Option<TlsParameters>,
    roots: &IndexedCaRoots,
    peers: &[structs::peering::PeerTrustBundle],
) -> TransportSocket {
    use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        SpiffeCertValidatorConfig, spiffe_cert_validator_config::TrustDomain,
    };
    let mut trust_domains = vec![TrustDomain {
        name: roots.trust_domain.clone(),
        trust_bundle: inline(&bundle(roots)),
        ..Default::default()
    }];
    for peer in peers {
        // Each trust domain once, this cluster's with its own roots only.
        if trust_domains.iter().any(|t| t.name == peer.trust_domain) {
            continue;
        }
        trust_domains.push(TrustDomain {
            name: peer.trust_domain.clone(),
            trust_bundle: inline(&pem_bundle(peer.root_pems.iter().map(String::as_str))),
            ..Default::default()
        });
    }
    let validator = TypedExtensionConfig {
        name: "envoy.tls.cert_validator.spiffe".into(),
        typed_config: Some(pack_any(SpiffeCertValidatorConfig {
            trust_domains,
            ..Default::default()
        })),
    };
    let ctx = DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_params,
            tls_certificate_sds_secret_configs: vec![sds(LEAF_SECRET)],
            validation_context_type: Some(common_tls_context::ValidationContextType::ValidationContext(
                CertificateValidationContext {
                    custom_validator_config: Some(validator),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
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
