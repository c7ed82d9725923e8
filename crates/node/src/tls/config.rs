//! The TLS flags made into rustls server configurations, checked at start: every problem is
//! one line naming the flag (and the file), never the key's content.

use crate::cli::TlsArgs;
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why the TLS flags cannot be used; each names the flag.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    /// A TLS listener was asked for without the certificate and key to serve.
    #[error("{listener} needs -tls-cert-file and -tls-key-file")]
    NoIdentity {
        /// The listener's flag (`-https-addr`, `-grpc-tls-addr`).
        listener: &'static str,
    },
    /// One of the certificate and key was given without the other.
    #[error("{given} needs {missing}")]
    HalfIdentity {
        /// The flag given.
        given: &'static str,
        /// The flag missing.
        missing: &'static str,
    },
    /// Client verification was asked for without a CA to verify with.
    #[error("-tls-verify-incoming needs -tls-ca-file (the CA that signs client certificates)")]
    VerifyWithoutCa,
    /// A file cannot be read.
    #[error("{flag} {}: cannot read: {error}", path.display())]
    Read {
        /// The flag naming the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A file's content is not what the flag needs.
    #[error("{flag} {}: {problem}", path.display())]
    Content {
        /// The flag naming the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong, without the file's content.
        problem: String,
    },
    /// The private key is not the certificate's.
    #[error("-tls-key-file {}: the key does not match the certificate of -tls-cert-file {}", key.display(), cert.display())]
    KeyMismatch {
        /// The key file.
        key: PathBuf,
        /// The certificate file.
        cert: PathBuf,
    },
}

/// The server side of the TLS flags: what the HTTPS and xDS TLS listeners serve.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The HTTPS API's configuration (ALPN `h2` and `http/1.1`; a listener speaking HTTP/1.1
    /// only offers that alone, see `node::http_serve::Versions`).
    pub http: Arc<rustls::ServerConfig>,
    /// xDS over TLS (ALPN `h2`: gRPC).
    pub grpc: Arc<rustls::ServerConfig>,
}

/// The TLS flags, checked and loaded.
#[derive(Debug, Clone, Default)]
pub struct TlsSettings {
    /// Set when a TLS listener is asked for.
    pub server: Option<ServerTls>,
    /// The CA file's PEM (`-tls-ca-file`): it verifies clients with `-tls-verify-incoming`
    /// and, on an agent, the servers it joins over `https://`.
    pub ca_pem: Option<Vec<u8>>,
}

/// The crypto provider of every TLS configuration meshd builds (ring, as rcgen and reqwest).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsSettings {
    /// Checks and loads the TLS flags (see [`TlsSetupError`] for what is refused).
    pub fn load(args: &TlsArgs) -> Result<Self, TlsSetupError> {
        Self::load_for(args, false)
    }

    /// As [`TlsSettings::load`]; with `grpc_own_names` the gRPC TLS listener may run without
    /// `-tls-cert-file`, serving only the mode's own names (a server's peering name).
    pub fn load_for(args: &TlsArgs, grpc_own_names: bool) -> Result<Self, TlsSetupError> {
        let listener = match (args.https_addr, args.grpc_tls_addr) {
            (Some(_), _) => Some("-https-addr"),
            (None, Some(_)) if !grpc_own_names => Some("-grpc-tls-addr"),
            (None, _) => None,
        };
        let identity = match (&args.cert_file, &args.key_file) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (Some(_), None) => {
                return Err(TlsSetupError::HalfIdentity {
                    given: "-tls-cert-file",
                    missing: "-tls-key-file",
                });
            }
            (None, Some(_)) => {
                return Err(TlsSetupError::HalfIdentity {
                    given: "-tls-key-file",
                    missing: "-tls-cert-file",
                });
            }
            (None, None) => None,
        };
        if args.verify_incoming && args.ca_file.is_none() {
            return Err(TlsSetupError::VerifyWithoutCa);
        }
        let ca = match &args.ca_file {
            Some(path) => Some(load_ca(path)?),
            None => None,
        };
        let wanted = listener.is_some() || args.grpc_tls_addr.is_some();
        let server = match (listener, identity) {
            (Some(listener), None) => return Err(TlsSetupError::NoIdentity { listener }),
            (None, None) => None,
            (_, Some(_)) if !wanted => None,
            (_, Some((cert, key))) => {
                let verifier = match (&ca, &args.ca_file) {
                    (Some((_, roots)), Some(path)) if args.verify_incoming => Some(
                        WebPkiClientVerifier::builder_with_provider(Arc::clone(roots), provider())
                            .build()
                            .map_err(|e| {
                                content("-tls-ca-file", path, format!("cannot verify clients with it: {e}"))
                            })?,
                    ),
                    _ => None,
                };
                let chain = load_chain(cert)?;
                let key_der = load_key(key)?;
                let http = server_config(
                    cert,
                    key,
                    chain.clone(),
                    key_der.clone_key(),
                    verifier.clone(),
                    crate::http_serve::Versions::Http1And2.alpn(),
                )?;
                let grpc = server_config(cert, key, chain, key_der, verifier, vec![b"h2".to_vec()])?;
                Some(ServerTls { http, grpc })
            }
        };
        Ok(Self {
            server,
            ca_pem: ca.map(|(pem, _)| pem),
        })
    }
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsSetupError> {
    std::fs::read(path).map_err(|error| TlsSetupError::Read {
        flag,
        path: path.to_owned(),
        error,
    })
}

fn content(flag: &'static str, path: &Path, problem: impl Into<String>) -> TlsSetupError {
    TlsSetupError::Content {
        flag,
        path: path.to_owned(),
        problem: problem.into(),
    }
}

/// The certificates of a PEM file (at least one).
fn certificates(flag: &'static str, path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| content(flag, path, format!("bad PEM: {e}")))?;
    if certs.is_empty() {
        return Err(content(
            flag,
            path,
            "no PEM certificate (BEGIN CERTIFICATE) in the file",
        ));
    }
    Ok(certs)
}

fn load_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let pem = read("-tls-cert-file", path)?;
    certificates("-tls-cert-file", path, &pem)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsSetupError> {
    let pem = read("-tls-key-file", path)?;
    // The parser's own message could quote a line of the file: say only what was expected.
    PrivateKeyDer::from_pem_slice(&pem).map_err(|_| {
        content(
            "-tls-key-file",
            path,
            "no usable PEM private key (PKCS#8, PKCS#1 or SEC1) in the file",
        )
    })
}

/// The CA file's PEM and its certificates as trust anchors.
fn load_ca(path: &Path) -> Result<(Vec<u8>, Arc<RootCertStore>), TlsSetupError> {
    let pem = read("-tls-ca-file", path)?;
    let mut roots = RootCertStore::empty();
    for cert in certificates("-tls-ca-file", path, &pem)? {
        roots
            .add(cert)
            .map_err(|e| content("-tls-ca-file", path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok((pem, Arc::new(roots)))
}

fn server_config(
    cert_path: &Path,
    key_path: &Path,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_verifier: Option<Arc<dyn ClientCertVerifier>>,
    alpn: Vec<Vec<u8>>,
) -> Result<Arc<rustls::ServerConfig>, TlsSetupError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| content("-tls-cert-file", cert_path, e.to_string()))?;
    let builder = match client_verifier {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => TlsSetupError::KeyMismatch {
            key: key_path.to_owned(),
            cert: cert_path.to_owned(),
        },
        other => content("-tls-key-file", key_path, format!("cannot serve with it: {other}")),
    })?;
    config.alpn_protocols = alpn;
    Ok(Arc::new(config))
}
