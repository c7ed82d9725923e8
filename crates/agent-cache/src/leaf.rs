//! Leaf certificates in agent mode: the agent generates the key pair, sends a certificate
//! signing request to a server, and keeps the private key to itself. A certificate is renewed
//! at a jittered point in the last third of its validity, and at once when the CA's active
//! root changes (followed through the roots cache).

use crate::cache::{Cache, CacheType, FetchError, Fetched};
use crate::types::{Http, Roots, RootsKey};
use parking_lot::Mutex;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime};
use structs::{IndexedCaRoots, IssuedCert, SpiffeIdService};
use tracing::info;

/// The server endpoint that signs a CSR (see the HTTP API's docs).
pub const SIGN_PATH: &str = api_client::paths::CA_SIGN;

/// The body of a signing request.
#[derive(Debug, Serialize)]
pub struct SignRequest<'a> {
    /// The PEM certificate signing request.
    #[serde(rename = "CSR")]
    pub csr: &'a str,
}

/// The certificate of one service identity, requested with one token (the signing request
/// carries it: the servers sign only for a token with `service:write` on the service).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeafKey {
    /// Service name.
    pub service: String,
    /// DNS SANs besides the SPIFFE id (sorted; other SANs are another certificate).
    pub dns_sans: Vec<String>,
    /// The requester's ACL token (none: the agent's).
    pub token: Option<structs::Token>,
}

/// The last certificate issued for a service.
#[derive(Clone)]
struct Issued {
    cert: Arc<IssuedCert>,
    index: u64,
    /// The active root when it was requested.
    root_id: String,
    renew_at: SystemTime,
}

/// Leaf certificates signed by the servers from keys generated here.
pub struct Leaf {
    http: Http,
    roots: Cache<Roots>,
    datacenter: String,
    issued: Mutex<HashMap<LeafKey, Issued>>,
    /// Index of the last certificate issued (any service); values start above 1.
    counter: AtomicU64,
}

impl Leaf {
    /// Leaves for services of `datacenter`, following the active root through `roots`.
    pub fn new(http: Http, roots: Cache<Roots>, datacenter: impl Into<String>) -> Self {
        Self {
            http,
            roots,
            datacenter: datacenter.into(),
            issued: Mutex::new(HashMap::new()),
            counter: AtomicU64::new(1),
        }
    }

    async fn sign(&self, key: &LeafKey, roots: &IndexedCaRoots) -> Result<Issued, FetchError> {
        let service = key.service.as_str();
        // None: the agent's.
        let token = key.token.clone().or_else(|| self.http.servers().token());
        let Some(active) = roots.active() else {
            return Err(FetchError::Unavailable("the CA has no active root yet".into()));
        };
        if roots.trust_domain.is_empty() {
            return Err(FetchError::Unavailable("the CA has no trust domain yet".into()));
        }
        let (key_pem, csr) = signing_request(
            &roots.trust_domain,
            &self.datacenter,
            service,
            &key.dns_sans,
            active.private_key_bits,
        )
        .map_err(|e| FetchError::Unavailable(format!("cannot make a signing request for {service:?}: {e}")))?;
        let mut cert: IssuedCert = self
            .http
            .servers()
            .put_json_answer_as(token.as_ref(), SIGN_PATH, &SignRequest { csr: &csr })
            .await
            .map_err(|e| FetchError::api(&format!("signing the leaf of {service:?}"), &e))?;
        if cert.service != service {
            return Err(FetchError::Unavailable(format!(
                "signing the leaf of {service:?}: the server answered a certificate for {:?}",
                cert.service
            )));
        }
        cert.private_key_pem = key_pem;
        let renew_at = jittered_renewal(&cert, SystemTime::now());
        info!(service, serial = %cert.serial_number, valid_before = ?cert.valid_before.0, "leaf certificate signed");
        Ok(Issued {
            cert: Arc::new(cert),
            index: self.counter.fetch_add(1, Relaxed) + 1,
            root_id: roots.active_root_id.clone(),
            renew_at,
        })
    }
}

impl CacheType for Leaf {
    type Request = LeafKey;
    type Value = Arc<IssuedCert>;

    /// A certificate whose renewals have all failed, close to its expiry: the failure shows.
    fn stale(&self, cert: &Arc<IssuedCert>) -> bool {
        nearly_expired(cert, SystemTime::now())
    }

    async fn fetch(&self, key: &LeafKey, min_index: u64) -> Result<Fetched<Self::Value>, FetchError> {
        let mut roots_watch = self.roots.watch(&RootsKey);
        let mut roots = match roots_watch.next().await {
            Some(Ok(f)) => f.value,
            Some(Err(e)) => return Err(FetchError::Unavailable(format!("CA roots: {e}"))),
            None => return Err(FetchError::ShuttingDown),
        };
        loop {
            let held = self.issued.lock().get(key).cloned();
            let Some(held) = held else { break };
            if held.root_id != roots.active_root_id {
                info!(service = %key.service, "the CA's active root changed: renewing the leaf now");
                break;
            }
            let Ok(until_renewal) = held.renew_at.duration_since(SystemTime::now()) else {
                break;
            };
            if held.index > min_index {
                // Issued after what the caller holds (a fresh entry over a kept certificate).
                return Ok(Fetched {
                    value: held.cert,
                    index: held.index,
                });
            }
            tokio::select! {
                () = tokio::time::sleep(until_renewal) => {}
                next = roots_watch.next() => match next {
                    Some(Ok(f)) => roots = f.value,
                    // Errors are reported only before a first value, which there was.
                    Some(Err(_)) => {}
                    None => return Err(FetchError::ShuttingDown),
                },
            }
        }
        let issued = self.sign(key, &roots).await?;
        self.issued.lock().insert(key.clone(), issued.clone());
        Ok(Fetched {
            value: issued.cert,
            index: issued.index,
        })
    }
}

/// A new key pair (ECDSA on the CA's curve) and a CSR for `service`'s SPIFFE identity and
/// `dns_sans`: `(private key PEM, CSR PEM)`.
pub fn signing_request(
    trust_domain: &str,
    datacenter: &str,
    service: &str,
    dns_sans: &[String],
    key_bits: u32,
) -> Result<(String, String), rcgen::Error> {
    let algorithm = if key_bits == 384 {
        &rcgen::PKCS_ECDSA_P384_SHA384
    } else {
        &rcgen::PKCS_ECDSA_P256_SHA256
    };
    let key = KeyPair::generate_for(algorithm)?;
    let uri = SpiffeIdService::new(trust_domain, datacenter, service).to_string();
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, service);
    params.distinguished_name = dn;
    params.subject_alt_names = vec![SanType::URI(uri.try_into()?)];
    for name in dns_sans {
        params
            .subject_alt_names
            .push(SanType::DnsName(name.clone().try_into()?));
    }
    let csr = params.serialize_request(&key)?.pem()?;
    Ok((key.serialize_pem(), csr))
}

/// When to renew `cert`, received at `now`: a uniformly random point between two thirds and
/// nine tenths of its validity, so the leaves of many agents do not all renew at once — but
/// never sooner than a tenth of its life (at least a second) from now, so a clock that differs
/// from the server's cannot make the agent sign again and again.
fn jittered_renewal(cert: &IssuedCert, now: SystemTime) -> SystemTime {
    let life = cert
        .valid_before
        .0
        .duration_since(cert.valid_after.0)
        .unwrap_or_default();
    let fraction = 2.0 / 3.0 + fastrand::f64() * (0.9 - 2.0 / 3.0);
    let planned = cert.valid_after.0 + Duration::from_secs_f64(life.as_secs_f64() * fraction);
    planned.max(now + (life / 10).max(Duration::from_secs(1)))
}

/// True once `cert` is in the last tenth of its validity: the renewals planned before that
/// point have all failed.
fn nearly_expired(cert: &IssuedCert, now: SystemTime) -> bool {
    let life = cert
        .valid_before
        .0
        .duration_since(cert.valid_after.0)
        .unwrap_or_default();
    now + life / 10 >= cert.valid_before.0
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn signing_requests_carry_the_spiffe_identity_and_not_the_key() {
        let (key, csr) = signing_request("td.consul", "dc1", "web", &[], 256).unwrap();
        assert!(key.contains("PRIVATE KEY"));
        assert!(csr.contains("CERTIFICATE REQUEST"));
        assert!(!csr.contains("PRIVATE KEY"));
        let parsed = rcgen::CertificateSigningRequestParams::from_pem(&csr).unwrap();
        let uris: Vec<String> = parsed
            .params
            .subject_alt_names
            .iter()
            .filter_map(|s| match s {
                SanType::URI(u) => Some(u.as_str().to_owned()),
                _ => None,
            })
            .collect();
        assert_eq!(uris, vec!["spiffe://td.consul/ns/default/dc/dc1/svc/web".to_owned()]);
    }

    #[test]
    fn signing_requests_carry_the_dns_sans() {
        let sans = vec!["shop.example.com".to_owned(), "*.shop.example.com".to_owned()];
        let (_, csr) = signing_request("td.consul", "dc1", "ing", &sans, 256).unwrap();
        let parsed = rcgen::CertificateSigningRequestParams::from_pem(&csr).unwrap();
        let dns: Vec<String> = parsed
            .params
            .subject_alt_names
            .iter()
            .filter_map(|s| match s {
                SanType::DnsName(d) => Some(d.as_str().to_owned()),
                _ => None,
            })
            .collect();
        assert_eq!(dns, sans);
    }

    #[test]
    fn renewal_falls_in_the_last_third_of_validity() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let cert = IssuedCert {
            valid_after: structs::Timestamp(start),
            valid_before: structs::Timestamp(start + Duration::from_secs(3000)),
            ..IssuedCert::default()
        };
        for _ in 0..200 {
            let at = jittered_renewal(&cert, start)
                .duration_since(start)
                .unwrap()
                .as_secs_f64();
            assert!((2000.0..=2700.0).contains(&at), "{at}");
        }
    }

    #[test]
    fn a_clock_ahead_of_the_servers_cannot_make_renewal_due_at_once() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let cert = IssuedCert {
            valid_after: structs::Timestamp(start),
            valid_before: structs::Timestamp(start + Duration::from_secs(3000)),
            ..IssuedCert::default()
        };
        // The agent's clock is past the whole validity already.
        let now = start + Duration::from_secs(5000);
        let at = jittered_renewal(&cert, now).duration_since(now).unwrap();
        assert!(at >= Duration::from_secs(300), "{at:?}");
        assert!(nearly_expired(&cert, now));
        assert!(!nearly_expired(&cert, start + Duration::from_secs(2000)));
    }
}
