//! The `handshake` step of `meshd troubleshoot upstream` (`docs/troubleshoot.md`): meshd
//! dials each healthy instance of a target the request reaches (a few at most), as the
//! source's Envoy would — the source's certificate, the target's SNI — and reports what the
//! instance's proxy presents (trusted by the source's roots? valid now? the destination's
//! SPIFFE identity?) and whether it accepts the source's certificate. This is what a proxy
//! meshd did not configure, an expired certificate Envoy still holds, or an instance whose
//! proxy was set up by another CA would show, where the certificates meshd holds look fine.

use crate::troubleshoot_upstream::{Probe, Step, step, verify_chain};
use parking_lot::Mutex;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::sync::Arc;
use std::time::Duration;
use structs::{IndexedCaRoots, IssuedCert};
use tokio::io::AsyncReadExt;

/// How long a connection and its handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long meshd waits after the handshake for the instance's proxy to refuse the source's
/// certificate (TLS 1.3 servers say so after the client thinks the handshake done).
const REFUSAL_WAIT: Duration = Duration::from_millis(300);

/// Dials each of `probe`'s instances with the source's `leaf`, judging what they present
/// against the source's `roots`: one step per instance.
pub async fn handshake(leaf: &IssuedCert, roots: &IndexedCaRoots, probe: &Probe) -> Vec<Step> {
    let dials = probe.instances.iter().map(|(who, addr)| async move {
        match dial(leaf, roots, probe, addr).await {
            Ok(seen) => step("handshake", true, format!("{who} at {addr}: {seen}")),
            Err(why) => step("handshake", false, format!("{who} at {addr}: {why}")),
        }
    });
    futures_util::future::join_all(dials).await
}

async fn dial(leaf: &IssuedCert, roots: &IndexedCaRoots, probe: &Probe, addr: &str) -> Result<String, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the source's certificate is unreadable: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(leaf.private_key_pem.as_bytes())
        .map_err(|e| format!("the source's private key is unreadable: {e}"))?;
    let provider = crate::tls::config::provider();
    let capture = Arc::new(Capture {
        seen: Mutex::new(Vec::new()),
        algorithms: provider.signature_verification_algorithms,
    });
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(capture.clone())
        .with_client_auth_cert(chain, key)
        .map_err(|e| format!("the source's certificate cannot be used: {e}"))?;
    let name = ServerName::try_from(probe.sni.clone())
        .or_else(|_| ServerName::try_from("destination.invalid".to_owned()))
        .map_err(|e| e.to_string())?;
    let connect = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("cannot connect from this meshd: {e}"))?;
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("the TLS handshake fails: {e}"))
    };
    let mut stream = tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| format!("no TLS handshake within {CONNECT_TIMEOUT:?}"))??;
    let presented = capture.seen.lock().clone();
    let identity = judge_presented(&presented, roots, &probe.service)?;
    // The proxy may still refuse the source's certificate: it says so with an alert.
    let mut byte = [0u8; 1];
    match tokio::time::timeout(REFUSAL_WAIT, stream.read(&mut byte)).await {
        Ok(Err(e)) => Err(format!(
            "presents {identity} (trusted), but refuses the source's certificate: {e}"
        )),
        Ok(Ok(0)) => Ok(format!(
            "presents {identity} (trusted), accepts the source's certificate, then closes the connection (an intention's deny does so)"
        )),
        _ => Ok(format!(
            "presents {identity} (trusted) and accepts the source's certificate"
        )),
    }
}

/// Whether the chain an instance presented is trusted by `roots` now and names `service`:
/// the identity it names if so.
pub fn judge_presented(
    presented: &[CertificateDer<'static>],
    roots: &IndexedCaRoots,
    service: &str,
) -> Result<String, String> {
    let Some((leaf, intermediates)) = presented.split_first() else {
        return Err("presents no certificate".into());
    };
    let uris = spiffe_uris(leaf);
    let shown = uris
        .first()
        .cloned()
        .unwrap_or_else(|| "a certificate without a SPIFFE identity".into());
    verify_chain(leaf, intermediates, roots).map_err(|e| {
        let why = if e.contains("BadSignature") || e.contains("UnknownIssuer") {
            format!("{e} (not issued by a CA of the source's roots)")
        } else {
            e
        };
        format!("presents {shown}, which the source does not trust: {why}")
    })?;
    let wanted = format!("/svc/{service}");
    let prefix = format!("spiffe://{}/", roots.trust_domain);
    match uris.iter().find(|u| u.starts_with(&prefix) && u.ends_with(&wanted)) {
        Some(uri) => Ok(uri.clone()),
        None => Err(format!(
            "presents {shown}, not {service}'s identity (spiffe://{}/.../svc/{service}): the source's Envoy refuses it",
            roots.trust_domain
        )),
    }
}

fn spiffe_uris(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    let Ok(Some(san)) = parsed.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::URI(uri) => Some((*uri).to_owned()),
            _ => None,
        })
        .collect()
}

/// Accepts any server certificate, keeping it to be judged after the handshake (so that an
/// untrusted one is reported with what it is, not only refused); handshake signatures are
/// verified as usual.
#[derive(Debug)]
struct Capture {
    seen: Mutex<Vec<CertificateDer<'static>>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Capture {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut seen = self.seen.lock();
        seen.push(end_entity.clone().into_owned());
        seen.extend(intermediates.iter().map(|c| c.clone().into_owned()));
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::troubleshoot_upstream::test_certs::{ca, leaf, roots};

    fn presented(cert: &IssuedCert) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn what_an_instance_presents_is_judged_as_the_source_envoy_would() {
        let (ours, issuer) = ca("ours");
        let (_, other) = ca("theirs");
        let good = presented(&leaf(&issuer, false));
        assert_eq!(
            judge_presented(&good, &roots(ours.clone()), "web"),
            Ok("spiffe://t.consul/ns/default/dc/dc1/svc/web".to_owned())
        );
        // Trusted, but another service's identity.
        let why = judge_presented(&good, &roots(ours.clone()), "api").unwrap_err();
        assert!(why.contains("not api's identity"), "{why}");
        let expired = judge_presented(&presented(&leaf(&issuer, true)), &roots(ours.clone()), "web").unwrap_err();
        assert!(expired.to_lowercase().contains("expired"), "{expired}");
        let foreign = judge_presented(&presented(&leaf(&other, false)), &roots(ours), "web").unwrap_err();
        assert!(foreign.contains("does not trust"), "{foreign}");
        assert!(judge_presented(&[], &roots(String::new()), "web").is_err());
    }
}
