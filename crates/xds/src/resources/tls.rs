//! TLS contexts: our leaf and the CA bundle, inline (no SDS).

use envoy_types::pb::envoy::config::core::v3::{DataSource, TransportSocket, data_source, transport_socket};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SubjectAltNameMatcher, TlsCertificate,
    UpstreamTlsContext, common_tls_context, subject_alt_name_matcher,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::util::pack_any;
use structs::{IndexedCaRoots, IssuedCert};

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

fn common(leaf: &IssuedCert, roots: &IndexedCaRoots, match_san: Option<&str>) -> CommonTlsContext {
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
        tls_certificates: vec![TlsCertificate {
            certificate_chain: inline(&leaf.cert_pem),
            private_key: inline(&leaf.private_key_pem),
            ..Default::default()
        }],
        validation_context_type: Some(common_tls_context::ValidationContextType::ValidationContext(
            CertificateValidationContext {
                trusted_ca: inline(&bundle(roots)),
                match_typed_subject_alt_names,
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}

/// Inbound mTLS: present our leaf, require a client certificate from the mesh's CA.
pub(crate) fn downstream(leaf: &IssuedCert, roots: &IndexedCaRoots) -> TransportSocket {
    let ctx = DownstreamTlsContext {
        common_tls_context: Some(common(leaf, roots, None)),
        require_client_certificate: Some(BoolValue { value: true }),
        ..Default::default()
    };
    TransportSocket {
        name: "tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(ctx))),
    }
}

/// Outbound mTLS to a target: our leaf, the CA bundle, SNI, and the target's SPIFFE id.
pub(crate) fn upstream(leaf: &IssuedCert, roots: &IndexedCaRoots, sni: &str, spiffe_id: &str) -> TransportSocket {
    let ctx = UpstreamTlsContext {
        common_tls_context: Some(common(leaf, roots, Some(spiffe_id))),
        sni: sni.to_owned(),
        ..Default::default()
    };
    TransportSocket {
        name: "tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(ctx))),
    }
}
