//! The built-in CA: a root per trust domain, leaf certificates for SPIFFE service identities,
//! and rotation that keeps an old root trusted until the last leaf it signed has expired.
//!
//! Certificates are built with rcgen and read back with x509-parser; no ASN.1 is written by
//! hand. Keys are ECDSA (P-256 or P-384): the signing backend cannot generate RSA keys.
//!
//! Several datacenters share one trust domain, the primary's. A secondary datacenter's CA
//! holds no root key: it holds the primary's roots (public parts) and an intermediate
//! certificate the primary's active root signed for a key the secondary generated (its CSR:
//! the primary's key never leaves it), and signs its leaves with that intermediate; a leaf's
//! PEM then carries the intermediate after it, so a peer holding only the roots verifies it.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};
use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime};
use structs::{CaRoot, GoDuration, Index, IndexedCaRoots, IssuedCert, SpiffeIdService, Timestamp};

/// Why the CA could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaError {
    /// The configuration asks for something the built-in CA cannot do.
    #[error("{field}: {reason}")]
    InvalidConfig {
        /// The offending field of the CA configuration.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Key generation, encoding or signing failed.
    #[error("CA crypto failure")]
    Crypto(#[from] rcgen::Error),
    /// The system's random number generator failed.
    #[error("CA crypto failure: no randomness")]
    Random(#[from] getrandom::Error),
    /// There is no active root to sign with.
    #[error("the CA has no active root")]
    NoActiveRoot,
    /// A DNS SAN asked for a leaf is not a DNS name.
    #[error("DNS SAN {0:?} is not a DNS name (letters, digits, '-', dot-separated; '*.' only first)")]
    InvalidDnsSan(String),
    /// A DNS SAN asked for a service's leaf is one of the servers' peering names.
    #[error("DNS SAN {0:?} is reserved: names under peering.<trust domain> are the servers' (peers verify them)")]
    ReservedDnsSan(String),
}

/// The CA's configuration (`/v1/connect/ca/configuration` → `Config`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaConfig {
    /// Lifetime of issued leaf certificates.
    #[serde(rename = "LeafCertTTL")]
    pub leaf_cert_ttl: GoDuration,
    /// Lifetime of roots.
    #[serde(rename = "RootCertTTL")]
    pub root_cert_ttl: GoDuration,
    /// `ec` (the only type the built-in CA generates).
    #[serde(rename = "PrivateKeyType")]
    pub private_key_type: String,
    /// 256 or 384.
    #[serde(rename = "PrivateKeyBits")]
    pub private_key_bits: u32,
}

impl Default for CaConfig {
    fn default() -> Self {
        Self {
            leaf_cert_ttl: GoDuration(Duration::from_secs(72 * 3600)),
            root_cert_ttl: GoDuration(Duration::from_secs(10 * 365 * 24 * 3600)),
            private_key_type: "ec".into(),
            private_key_bits: 256,
        }
    }
}

impl CaConfig {
    /// Checks the configuration against what the built-in CA can do.
    pub fn validate(&self) -> Result<(), CaError> {
        if self.private_key_type != "ec" {
            return Err(CaError::InvalidConfig {
                field: "Config.PrivateKeyType",
                reason: format!(
                    "{:?} is not supported by the built-in CA: use \"ec\"",
                    self.private_key_type
                ),
            });
        }
        if !matches!(self.private_key_bits, 256 | 384) {
            return Err(CaError::InvalidConfig {
                field: "Config.PrivateKeyBits",
                reason: format!("{} is not supported for ec keys: use 256 or 384", self.private_key_bits),
            });
        }
        let hour = Duration::from_secs(3600);
        if self.leaf_cert_ttl.0 < hour || self.leaf_cert_ttl.0 > 365 * 24 * hour {
            return Err(CaError::InvalidConfig {
                field: "Config.LeafCertTTL",
                reason: "must be between 1h and 8760h".into(),
            });
        }
        if self.root_cert_ttl.0 <= self.leaf_cert_ttl.0 {
            return Err(CaError::InvalidConfig {
                field: "Config.RootCertTTL",
                reason: "must be longer than LeafCertTTL".into(),
            });
        }
        Ok(())
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        if self.private_key_bits == 384 {
            &rcgen::PKCS_ECDSA_P384_SHA384
        } else {
            &rcgen::PKCS_ECDSA_P256_SHA256
        }
    }
}

/// How long after its last leaf expired a rotated-out root is removed from the state: the
/// minute leaves are backdated by, for clocks that differ between servers and proxies.
pub const ROOT_PRUNE_MARGIN: Duration = Duration::from_secs(60);

/// One root with its signing key, and how long an inactive root stays trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredRoot {
    /// The public part.
    pub root: CaRoot,
    /// PEM private key (persisted: the store's data dir must be protected).
    pub private_key_pem: String,
    /// For a rotated-out root: when its last leaf expires, after which it is dropped.
    pub keep_until: Option<Timestamp>,
}

/// A secondary datacenter's signing certificate: signed by the primary's root `root_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intermediate {
    /// The certificate (PEM).
    pub cert_pem: String,
    /// Its private key (PEM; persisted: the store's data dir must be protected).
    pub private_key_pem: String,
    /// The id of the primary's root that signed it.
    pub root_id: String,
}

/// Everything the CA keeps durably.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaState {
    /// Cluster id (a UUID); the trust domain is `<cluster id>.consul`.
    pub cluster_id: String,
    /// The configuration.
    pub config: CaConfig,
    /// Roots, active first.
    pub roots: Vec<StoredRoot>,
    /// Index of the write that created the CA.
    pub create_index: Index,
    /// Index of the last CA write.
    pub modify_index: Index,
    /// In a secondary datacenter: the intermediate its leaves are signed with (its roots
    /// are then the primary's, without keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intermediate: Option<Intermediate>,
}

impl CaState {
    /// The SPIFFE trust domain.
    pub fn trust_domain(&self) -> String {
        format!("{}.consul", self.cluster_id)
    }

    /// The active root.
    pub fn active(&self) -> Option<&StoredRoot> {
        self.roots.iter().find(|r| r.root.active)
    }

    /// The trust bundle as of `now`: the active root and every rotated-out root whose
    /// leaves may still be in use.
    pub fn bundle(&self, now: SystemTime) -> IndexedCaRoots {
        let roots: Vec<CaRoot> = self
            .roots
            .iter()
            .filter(|r| r.root.active || r.keep_until.is_none_or(|t| t.0 > now))
            .map(|r| {
                let mut root = r.root.clone();
                // A secondary's active root lists the intermediate it signs with, as Consul's.
                if let (true, Some(i)) = (root.active, &self.intermediate) {
                    root.intermediate_certs = vec![i.cert_pem.clone()];
                }
                root
            })
            .collect();
        IndexedCaRoots {
            active_root_id: self.active().map(|r| r.root.id.clone()).unwrap_or_default(),
            trust_domain: self.trust_domain(),
            roots,
            index: self.modify_index,
        }
    }

    /// True in a secondary datacenter: the CA follows the primary's.
    pub fn is_secondary(&self) -> bool {
        self.intermediate.is_some()
    }

    /// A secondary datacenter's CA: the primary's trust domain and `roots` (their public
    /// parts), the configuration of `current` (if any), and `intermediate` to sign with.
    /// `None` when `roots` has no trust domain of the built-in form (`<cluster id>.consul`)
    /// or no active root.
    pub fn following(current: Option<&CaState>, roots: &IndexedCaRoots, intermediate: Intermediate) -> Option<Self> {
        let cluster_id = roots.trust_domain.strip_suffix(".consul")?.to_owned();
        roots.roots.iter().find(|r| r.active)?;
        let stored = roots
            .roots
            .iter()
            .map(|r| {
                let mut root = r.clone();
                root.intermediate_certs = Vec::new();
                StoredRoot {
                    root,
                    private_key_pem: String::new(),
                    keep_until: None,
                }
            })
            .collect();
        Some(Self {
            cluster_id,
            config: current.map(|c| c.config.clone()).unwrap_or_default(),
            roots: stored,
            create_index: current.map_or(Index(0), |c| c.create_index),
            modify_index: current.map_or(Index(0), |c| c.modify_index),
            intermediate: Some(intermediate),
        })
    }

    /// When the next rotated-out root may be removed: its last leaf expired (its rotation
    /// time + the leaf TTL, [`StoredRoot::keep_until`]) and [`ROOT_PRUNE_MARGIN`] passed.
    pub fn next_prune_at(&self) -> Option<SystemTime> {
        self.roots
            .iter()
            .filter(|r| !r.root.active)
            .filter_map(|r| r.keep_until.map(|t| t.0 + ROOT_PRUNE_MARGIN))
            .min()
    }

    /// This CA without the rotated-out roots no leaf they signed can still need at `now`
    /// (see [`CaState::next_prune_at`]); `None` when there is none to remove.
    pub fn pruned(&self, now: SystemTime) -> Option<Self> {
        let keep = |r: &StoredRoot| r.root.active || r.keep_until.is_none_or(|t| t.0 + ROOT_PRUNE_MARGIN > now);
        if self.roots.iter().all(keep) {
            return None;
        }
        let mut next = self.clone();
        next.roots.retain(keep);
        Some(next)
    }

    /// A new CA with a root, and `cluster_id` (a UUID) or a fresh one.
    pub fn bootstrap(config: CaConfig, cluster_id: Option<&str>) -> Result<Self, CaError> {
        config.validate()?;
        let cluster_id = match cluster_id {
            Some(id) if uuid::Uuid::parse_str(id).is_ok() => id.to_ascii_lowercase(),
            Some(id) => {
                return Err(CaError::InvalidConfig {
                    field: "ClusterID",
                    reason: format!("{id:?} is not a UUID"),
                });
            }
            None => new_uuid()?,
        };
        let root = generate_root(&format!("{cluster_id}.consul"), &config, 1)?;
        Ok(Self {
            cluster_id,
            config,
            roots: vec![root],
            create_index: Index(0),
            modify_index: Index(0),
            intermediate: None,
        })
    }

    /// Applies a new configuration. A change of key type or size rotates the root: the new
    /// root becomes active and the old one stays in the bundle until its leaves expire.
    pub fn reconfigure(&self, config: CaConfig, now: SystemTime) -> Result<Self, CaError> {
        config.validate()?;
        if self.is_secondary() {
            return Err(CaError::InvalidConfig {
                field: "Config",
                reason: "this datacenter's CA follows the primary datacenter's: configure it there".into(),
            });
        }
        let mut next = self.clone();
        let rotate = config.private_key_type != self.config.private_key_type
            || config.private_key_bits != self.config.private_key_bits;
        let signed_with = self.config.leaf_cert_ttl.0;
        next.config = config;
        if rotate {
            let previous = self.active().map(|r| r.root.id.clone());
            next.rotate(now)?;
            // The old root's leaves carry the old TTL, which this write may have shortened.
            let keep_until = Timestamp(now + signed_with.max(next.config.leaf_cert_ttl.0));
            for r in next.roots.iter_mut().filter(|r| Some(&r.root.id) == previous.as_ref()) {
                r.keep_until = Some(keep_until);
            }
        }
        Ok(next)
    }

    /// Makes a new root active; the previous active root is kept until `now` + leaf TTL.
    pub fn rotate(&mut self, now: SystemTime) -> Result<(), CaError> {
        let keep_until = Timestamp(now + self.config.leaf_cert_ttl.0);
        for r in &mut self.roots {
            if r.root.active {
                r.root.active = false;
                r.keep_until = Some(keep_until);
            }
        }
        let generation = self.roots.len() as u64 + 1;
        let new_root = generate_root(&self.trust_domain(), &self.config, generation)?;
        // Drop roots whose leaves are all expired; the new active root goes first.
        self.roots.retain(|r| r.keep_until.is_none_or(|t| t.0 > now));
        self.roots.insert(0, new_root);
        Ok(())
    }
}

fn random_bytes<const N: usize>() -> Result<[u8; N], CaError> {
    let mut buf = [0u8; N];
    getrandom::fill(&mut buf).map_err(CaError::from)?;
    Ok(buf)
}

/// A random (version 4) UUID.
///
/// The bytes come from `random_bytes` rather than `Uuid::new_v4`, which panics when the OS
/// RNG fails: here that failure is reported as a `CaError` like every other CA failure.
pub fn new_uuid() -> Result<String, CaError> {
    let uuid = uuid::Builder::from_random_bytes(random_bytes::<16>()?).into_uuid();
    Ok(uuid.hyphenated().to_string())
}

fn colon_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

fn offset(t: SystemTime) -> time::OffsetDateTime {
    time::OffsetDateTime::from(t)
}

fn random_serial() -> Result<(SerialNumber, u64), CaError> {
    // 63 bits keeps it positive in DER and representable in Consul's uint64 field.
    let raw = u64::from_be_bytes(random_bytes::<8>()?) >> 1;
    let serial = raw.max(1);
    Ok((SerialNumber::from(serial), serial))
}

fn ia5(s: &str) -> Result<rcgen::string::Ia5String, CaError> {
    rcgen::string::Ia5String::try_from(s).map_err(CaError::from)
}

/// Generates a self-signed root for `trust_domain`: CA, URI SAN `spiffe://<trust-domain>`.
/// No DNS name constraint (as Consul's built-in CA): an ingress gateway's leaf carries the
/// hosts it serves as DNS names, which lie outside the trust domain, and clients enforcing a
/// constraint (Envoy, rustls, browsers) would refuse it. What a leaf may name is decided when
/// it is signed (a service's SPIFFE id, and DNS names only for the hosts of its gateway).
pub fn generate_root(trust_domain: &str, config: &CaConfig, generation: u64) -> Result<StoredRoot, CaError> {
    let key = KeyPair::generate_for(config.algorithm()).map_err(CaError::from)?;
    let now = SystemTime::now();
    let not_before = now - Duration::from_secs(60);
    let not_after = now + config.root_cert_ttl.0;
    let (serial, serial_u64) = random_serial()?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("meshd CA {generation}"));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.subject_alt_names = vec![SanType::URI(ia5(&format!("spiffe://{trust_domain}"))?)];
    params.not_before = offset(not_before);
    params.not_after = offset(not_after);
    params.serial_number = Some(serial);
    let key_id = colon_hex(&params.key_identifier(&key));
    let cert = params.self_signed(&key).map_err(CaError::from)?;
    Ok(StoredRoot {
        root: CaRoot {
            id: key_id.clone(),
            name: format!("meshd CA Root Cert {generation}"),
            serial_number: serial_u64,
            signing_key_id: key_id,
            external_trust_domain: String::new(),
            not_before: Timestamp(not_before),
            not_after: Timestamp(not_after),
            root_cert: cert.pem(),
            intermediate_certs: Vec::new(),
            active: true,
            private_key_type: config.private_key_type.clone(),
            private_key_bits: config.private_key_bits,
            create_index: Index(0),
            modify_index: Index(0),
        },
        private_key_pem: key.serialize_pem(),
        keep_until: None,
    })
}

/// Signs a leaf for `service` in `datacenter` with the active root: URI SAN
/// `spiffe://<trust-domain>/ns/default/dc/<dc>/svc/<service>`, client and server auth,
/// valid for the configured leaf TTL. The key pair is generated here (server mode).
pub fn sign_leaf(ca: &CaState, datacenter: &str, service: &str, now: SystemTime) -> Result<IssuedCert, CaError> {
    sign_leaf_with_sans(ca, datacenter, service, &[], now)
}

/// As [`sign_leaf`], with `dns_sans` as DNS SANs besides the SPIFFE id (an ingress gateway
/// serving TLS for its hosts). Each must be a DNS name, `*.` allowed as its first label.
pub fn sign_leaf_with_sans(
    ca: &CaState,
    datacenter: &str,
    service: &str,
    dns_sans: &[String],
    now: SystemTime,
) -> Result<IssuedCert, CaError> {
    let key = KeyPair::generate_for(ca.config.algorithm()).map_err(CaError::from)?;
    let mut cert = issue(ca, datacenter, service, dns_sans, &key, now)?;
    cert.private_key_pem = key.serialize_pem();
    Ok(cert)
}

/// A server's certificate for the peering stream, signed by the active root (or the
/// intermediate): URI SAN `spiffe://<trust-domain>/agent/server/dc/<dc>`, DNS SAN
/// `server_name` (`server.<dc>.peering.<trust-domain>`, what a peer's token says to verify),
/// with the key pair generated here.
pub fn sign_server_leaf(
    ca: &CaState,
    datacenter: &str,
    server_name: &str,
    now: SystemTime,
) -> Result<IssuedCert, CaError> {
    let key = KeyPair::generate_for(ca.config.algorithm()).map_err(CaError::from)?;
    let identity = Identity {
        uri: format!("spiffe://{}/agent/server/dc/{datacenter}", ca.trust_domain()),
        common_name: server_name.to_owned(),
        service: String::new(),
    };
    let mut cert = issue_as(ca, &identity, &[server_name.to_owned()], &key, now)?;
    cert.private_key_pem = key.serialize_pem();
    Ok(cert)
}

/// Why a certificate signing request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    /// The request is not a valid PEM CSR with a valid signature.
    #[error("CSR: {0}")]
    Invalid(String),
    /// The request does not name exactly one SPIFFE service identity of this CA.
    #[error("CSR: {0}")]
    Identity(String),
    /// The CA could not sign.
    #[error(transparent)]
    Ca(#[from] CaError),
}

/// Signs a leaf for the public key of `csr_pem` (agent mode: the private key stays with the
/// agent). The CSR must carry exactly one URI SAN, a SPIFFE service identity in this CA's
/// trust domain and `datacenter`; the certificate is built as [`sign_leaf_with_sans`]'s, with
/// the CSR's DNS SANs (each checked as a DNS name) and nothing else it asks for.
///
/// `may_claim(service, name)` says whether the service may carry DNS name `name`; any
/// other DNS SAN is refused.
pub fn sign_csr(
    ca: &CaState,
    datacenter: &str,
    csr_pem: &str,
    may_claim: &dyn Fn(&str, &str) -> bool,
    now: SystemTime,
) -> Result<IssuedCert, CsrError> {
    let csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)
        .map_err(|e| CsrError::Invalid(format!("cannot read it: {e}")))?;
    let uris: Vec<&str> = csr
        .params
        .subject_alt_names
        .iter()
        .filter_map(|san| match san {
            SanType::URI(uri) => Some(uri.as_str()),
            _ => None,
        })
        .collect();
    let [uri] = uris.as_slice() else {
        return Err(CsrError::Identity(format!(
            "expected exactly one URI SAN (a SPIFFE service identity), found {}",
            uris.len()
        )));
    };
    let id: SpiffeIdService = uri
        .parse()
        .map_err(|e| CsrError::Identity(format!("URI SAN {uri:?}: {e}")))?;
    let trust_domain = ca.trust_domain();
    if id.trust_domain != trust_domain {
        return Err(CsrError::Identity(format!(
            "URI SAN {uri:?}: trust domain {:?} is not this CA's ({trust_domain:?})",
            id.trust_domain
        )));
    }
    if id.datacenter != datacenter {
        return Err(CsrError::Identity(format!(
            "URI SAN {uri:?}: datacenter {:?} is not this server's ({datacenter:?})",
            id.datacenter
        )));
    }
    if id.namespace != "default" {
        return Err(CsrError::Identity(format!(
            "URI SAN {uri:?}: namespace {:?} does not exist (only \"default\")",
            id.namespace
        )));
    }
    let dns_sans: Vec<String> = csr
        .params
        .subject_alt_names
        .iter()
        .filter_map(|san| match san {
            SanType::DnsName(name) => Some(name.as_str().to_owned()),
            _ => None,
        })
        .collect();
    for name in &dns_sans {
        if !is_dns_name(name) {
            return Err(CsrError::Identity(format!(
                "DNS SAN {name:?} is not a DNS name (letters, digits, '-', dot-separated; '*.' only first)"
            )));
        }
        if !may_claim(&id.service, name) {
            return Err(CsrError::Identity(format!(
                "DNS SAN {name:?}: service {:?} may not claim it (a CSR may carry only the hosts of the service's \
                 ingress-gateway config entry)",
                id.service
            )));
        }
    }
    Ok(issue(ca, datacenter, &id.service, &dns_sans, &csr.public_key, now)?)
}

/// The leaf certificate of `service` for `key`, signed by the active root (no private key in
/// the result).
fn issue(
    ca: &CaState,
    datacenter: &str,
    service: &str,
    dns_sans: &[String],
    key: &impl rcgen::PublicKeyData,
    now: SystemTime,
) -> Result<IssuedCert, CaError> {
    // A service's certificate never carries a server's peering name (a peer dialing this
    // cluster would take it for its servers').
    let reserved = format!("peering.{}", ca.trust_domain());
    if let Some(name) = dns_sans
        .iter()
        .find(|n| n.to_ascii_lowercase() == reserved || n.to_ascii_lowercase().ends_with(&format!(".{reserved}")))
    {
        return Err(CaError::ReservedDnsSan(name.clone()));
    }
    let identity = Identity {
        uri: SpiffeIdService::new(&ca.trust_domain(), datacenter, service).to_string(),
        common_name: service.to_owned(),
        service: service.to_owned(),
    };
    issue_as(ca, &identity, dns_sans, key, now)
}

/// Whom a leaf identifies.
struct Identity {
    /// Its SPIFFE id (the URI SAN).
    uri: String,
    /// Its subject's common name.
    common_name: String,
    /// The service it is for (none for a server's).
    service: String,
}

/// The leaf of `identity` for `key`, signed by the active root or the intermediate.
fn issue_as(
    ca: &CaState,
    identity: &Identity,
    dns_sans: &[String],
    key: &impl rcgen::PublicKeyData,
    now: SystemTime,
) -> Result<IssuedCert, CaError> {
    let (signer_cert, signer_key) = match &ca.intermediate {
        Some(i) => (&i.cert_pem, &i.private_key_pem),
        None => {
            let root = ca.active().ok_or(CaError::NoActiveRoot)?;
            (&root.root.root_cert, &root.private_key_pem)
        }
    };
    let signer_key = KeyPair::from_pem(signer_key).map_err(CaError::from)?;
    let issuer = Issuer::from_ca_cert_pem(signer_cert, signer_key).map_err(CaError::from)?;
    let spiffe = identity.uri.clone();
    let (serial, _) = random_serial()?;
    let serial_text = colon_hex(serial.as_ref());
    let valid_after = now - Duration::from_secs(60);
    let valid_before = now + ca.config.leaf_cert_ttl.0;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, identity.common_name.as_str());
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
        KeyUsagePurpose::KeyAgreement,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params.subject_alt_names = vec![SanType::URI(ia5(&spiffe)?)];
    for name in dns_sans {
        if !is_dns_name(name) {
            return Err(CaError::InvalidDnsSan(name.clone()));
        }
        params.subject_alt_names.push(SanType::DnsName(ia5(name)?));
    }
    params.use_authority_key_identifier_extension = true;
    params.not_before = offset(valid_after);
    params.not_after = offset(valid_before);
    params.serial_number = Some(serial);
    let cert = params.signed_by(key, &issuer).map_err(CaError::from)?;
    // A secondary's leaf carries its intermediate: peers hold only the roots.
    let cert_pem = match &ca.intermediate {
        Some(i) => format!("{}{}", cert.pem(), i.cert_pem),
        None => cert.pem(),
    };
    Ok(IssuedCert {
        serial_number: serial_text,
        cert_pem,
        private_key_pem: String::new(),
        service: identity.service.clone(),
        service_uri: spiffe,
        valid_after: Timestamp(valid_after),
        valid_before: Timestamp(valid_before),
        create_index: ca.modify_index,
        modify_index: ca.modify_index,
    })
}

/// A key and a certificate signing request for a secondary datacenter's intermediate in
/// `trust_domain` (URI SAN `spiffe://<trust-domain>`): `(csr_pem, key_pem)`.
pub fn intermediate_csr(trust_domain: &str, config: &CaConfig) -> Result<(String, String), CaError> {
    let key = KeyPair::generate_for(config.algorithm()).map_err(CaError::from)?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "meshd secondary CA");
    params.distinguished_name = dn;
    params.subject_alt_names = vec![SanType::URI(ia5(&format!("spiffe://{trust_domain}"))?)];
    let csr = params.serialize_request(&key).map_err(CaError::from)?;
    Ok((csr.pem().map_err(CaError::from)?, key.serialize_pem()))
}

/// The primary signs a secondary datacenter's intermediate for the key of `csr_pem` with its
/// active root: a CA that may sign leaves only (path length 0), for this trust domain (the
/// CSR's one URI SAN must be `spiffe://<trust-domain>`), valid a year or until the root
/// expires, whichever is first. Returns the certificate (PEM) and the root's id.
pub fn sign_intermediate(ca: &CaState, csr_pem: &str, now: SystemTime) -> Result<(String, String), CsrError> {
    if ca.is_secondary() {
        return Err(CsrError::Identity(
            "this datacenter is not the primary: intermediates are signed by the primary's CA".into(),
        ));
    }
    let csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)
        .map_err(|e| CsrError::Invalid(format!("cannot read it: {e}")))?;
    let want = format!("spiffe://{}", ca.trust_domain());
    let uris: Vec<&str> = csr
        .params
        .subject_alt_names
        .iter()
        .map(|san| match san {
            SanType::URI(uri) => uri.as_str(),
            _ => "",
        })
        .collect();
    if uris != [want.as_str()] {
        return Err(CsrError::Identity(format!(
            "an intermediate's CSR must carry exactly one SAN, the URI {want:?}"
        )));
    }
    let root = ca.active().ok_or(CaError::NoActiveRoot)?;
    let root_key = KeyPair::from_pem(&root.private_key_pem).map_err(CaError::from)?;
    let issuer = Issuer::from_ca_cert_pem(&root.root.root_cert, root_key).map_err(CaError::from)?;
    let (serial, _) = random_serial()?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "meshd secondary CA");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.subject_alt_names = vec![SanType::URI(ia5(&want)?)];
    params.use_authority_key_identifier_extension = true;
    params.not_before = offset(now - Duration::from_secs(60));
    params.not_after = offset((now + Duration::from_secs(365 * 24 * 3600)).min(root.root.not_after.0));
    params.serial_number = Some(serial);
    let cert = params.signed_by(&csr.public_key, &issuer).map_err(CaError::from)?;
    Ok((cert.pem(), root.root.id.clone()))
}

/// A DNS name for a certificate: dot-separated labels of letters, digits and `-` (not at
/// either end), at most 63 bytes each and 253 in all; the first label may be `*`.
pub fn is_dns_name(name: &str) -> bool {
    let rest = name.strip_prefix("*.").unwrap_or(name);
    name.len() <= 253
        && rest.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests;
