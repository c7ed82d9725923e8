//! The API gateway's entries in the catalog: the write-time check of an inline
//! certificate (it parses, and its key is the certificate's), and the index keys a write
//! touches through the entries' derived status (`structs::config_entry::api_gateway_binding`):
//! a route's status follows its gateways and the services it names, a gateway's its
//! routes and certificates.

use crate::keys::IndexKey;
use crate::state::State;
use imbl::OrdSet;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::collections::BTreeSet;
use structs::config_entry::api_gateway_binding::route_service_names;
use structs::config_entry::{CERTIFICATE_KINDS, InlineCertificate};
use structs::{ConfigEntry, ConfigEntryKind, Problem, ValidationError};

/// The kinds whose entries carry a derived status.
const WITH_STATUS: [ConfigEntryKind; 3] = [
    ConfigEntryKind::ApiGateway,
    ConfigEntryKind::HttpRoute,
    ConfigEntryKind::TcpRoute,
];

fn invalid(field: &str, why: String) -> ValidationError {
    ValidationError::new(
        format!("{} {field}", ConfigEntryKind::InlineCertificate),
        Problem::Invalid(why),
    )
}

/// An inline certificate's chain parses, its leaf is valid X.509, and its private key is
/// the leaf's (Envoy would refuse the listener otherwise, and only at push time).
pub(crate) fn check_inline_certificate(c: &InlineCertificate) -> Result<(), ValidationError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(c.certificate.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| invalid("Certificate", format!("not a PEM certificate chain: {e}")))?;
    let Some(leaf) = certs.first() else {
        return Err(invalid("Certificate", "holds no PEM certificate".into()));
    };
    for (i, cert) in certs.iter().enumerate() {
        x509_parser::parse_x509_certificate(cert).map_err(|e| {
            invalid(
                "Certificate",
                format!("certificate {i} of the chain does not parse: {e}"),
            )
        })?;
    }
    let key = PrivateKeyDer::from_pem_slice(c.private_key.as_bytes())
        .map_err(|e| invalid("PrivateKey", format!("not a PEM private key: {e}")))?;
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| invalid("PrivateKey", format!("unsupported private key: {e}")))?;
    let certified = rustls::sign::CertifiedKey::new(vec![leaf.clone()], signing);
    match certified.keys_match() {
        Ok(()) => Ok(()),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => Err(invalid(
            "PrivateKey",
            "is not the key of the chain's first certificate".into(),
        )),
        // The key type cannot say its public key: the handshake will tell.
        Err(_) => Ok(()),
    }
}

impl State {
    fn entries_iter(&self, kind: ConfigEntryKind) -> impl Iterator<Item = &std::sync::Arc<ConfigEntry>> {
        self.config
            .range((kind, String::new())..)
            .take_while(move |((k, _), _)| *k == kind)
            .map(|(_, e)| e)
    }

    /// Adds the keys of the gateway and route entries whose status a write changed: a
    /// written route (its own key is bumped) changes its gateways' status, and a tcp-route
    /// may take a tcp listener from the others; a gateway written changes its routes'; a
    /// certificate the gateways'. Else, the routes naming a service whose instances changed.
    pub(crate) fn touch_api_gateways(&self, bumped: &mut OrdSet<IndexKey>) {
        let written = |k: ConfigEntryKind| bumped.contains(&IndexKey::ConfigKind(k));
        let mut touched = Vec::new();
        let every = |kind: ConfigEntryKind, out: &mut Vec<IndexKey>| {
            out.extend(
                self.entries_iter(kind)
                    .map(|e| IndexKey::ConfigEntry(kind, e.name().to_owned())),
            );
        };
        let family_written = WITH_STATUS.iter().chain(CERTIFICATE_KINDS.iter()).any(|k| written(*k));
        if family_written {
            every(ConfigEntryKind::ApiGateway, &mut touched);
            if written(ConfigEntryKind::ApiGateway) {
                every(ConfigEntryKind::HttpRoute, &mut touched);
            }
            if written(ConfigEntryKind::ApiGateway) || written(ConfigEntryKind::TcpRoute) {
                every(ConfigEntryKind::TcpRoute, &mut touched);
            }
        } else {
            let services: BTreeSet<&str> = bumped
                .iter()
                .filter_map(|k| match k {
                    IndexKey::Service(name) => Some(name.as_str()),
                    _ => None,
                })
                .collect();
            if services.is_empty() {
                return;
            }
            for kind in [ConfigEntryKind::HttpRoute, ConfigEntryKind::TcpRoute] {
                for e in self.entries_iter(kind) {
                    // On every health change of any service: no allocation per route.
                    if route_service_names(e).any(|s| services.contains(s)) {
                        touched.push(IndexKey::ConfigEntry(kind, e.name().to_owned()));
                    }
                }
            }
        }
        // Only the entries' own keys: a kind's key would wake every watcher of the route
        // list (each API gateway's proxy) on every health change of a backend.
        bumped.extend(touched);
    }
}
