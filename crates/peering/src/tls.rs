//! TLS of the peering calls, as Consul's: a server accepting peers presents a certificate its
//! own CA signed for `server.<dc>.peering.<trust-domain>` — the name a peering token carries,
//! with the CA's roots — and a dialing server verifies it with those roots (then with the
//! roots the peer sends over the stream, so a rotation of the peer's CA is followed). No
//! client certificate is asked for: the peers authenticate each other with the secrets the
//! token starts, which TLS keeps from anyone on the path.

use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// What a dialing server verifies a peer's servers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DialTls {
    /// The peer's CA roots (PEM).
    pub ca_pems: Vec<String>,
    /// The name the peer's servers present (`server.<dc>.peering.<trust-domain>`).
    pub server_name: String,
}

impl DialTls {
    /// tonic's client TLS for these roots and name; refused without roots (never plaintext).
    pub fn client_config(&self) -> Result<tonic::transport::ClientTlsConfig, String> {
        if self.ca_pems.is_empty() {
            return Err("no CA to verify the peer's servers with (the peering token carried none)".into());
        }
        let roots = self
            .ca_pems
            .iter()
            .map(|pem| tonic::transport::Certificate::from_pem(pem.as_bytes()));
        Ok(tonic::transport::ClientTlsConfig::new()
            .ca_certificates(roots)
            .domain_name(self.server_name.clone()))
    }
}

/// The server side: the certificate this server presents to peers, signed again when the CA
/// changes or half its life has passed.
#[derive(Debug, Default)]
pub struct ServerCert {
    cached: Mutex<Option<Cached>>,
}

#[derive(Debug)]
struct Cached {
    /// The CA write it was signed after.
    ca_index: u64,
    /// The name it is for.
    server_name: String,
    /// When to sign a new one.
    renew_at: SystemTime,
    config: Arc<rustls::ServerConfig>,
}

impl ServerCert {
    /// The TLS configuration serving `server_name` with a certificate of `state`'s CA.
    pub fn config(
        &self,
        state: &catalog::State,
        datacenter: &str,
        server_name: &str,
        now: SystemTime,
    ) -> Result<Arc<rustls::ServerConfig>, String> {
        let ca = state
            .ca()
            .ok_or("the CA is not initialised: no certificate to present to peers")?;
        let mut cached = self.cached.lock();
        if let Some(c) = cached.as_ref()
            && c.ca_index == ca.modify_index.0
            && c.server_name == server_name
            && now < c.renew_at
        {
            return Ok(Arc::clone(&c.config));
        }
        let cert = catalog::ca::sign_server_leaf(&ca, datacenter, server_name, now)
            .map_err(|e| format!("cannot sign this server's peering certificate: {e}"))?;
        let config = server_config(&cert.cert_pem, &cert.private_key_pem)?;
        let (after, before) = (cert.valid_after.0, cert.valid_before.0);
        let half = before.duration_since(after).unwrap_or(Duration::ZERO) / 2;
        *cached = Some(Cached {
            ca_index: ca.modify_index.0,
            server_name: server_name.to_owned(),
            renew_at: after + half,
            config: Arc::clone(&config),
        });
        Ok(config)
    }
}

/// A rustls server configuration presenting `cert_pem` (leaf first) with `key_pem`, speaking
/// HTTP/2 (gRPC), asking for no client certificate.
fn server_config(cert_pem: &str, key_pem: &str) -> Result<Arc<rustls::ServerConfig>, String> {
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the peering certificate: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| format!("the peering key: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("the peering certificate: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}
