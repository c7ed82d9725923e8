//! Connect CA types: roots, issued leaf certificates, SPIFFE identities.

use crate::Index;
use crate::validate::{Problem, ValidationError};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use std::{fmt, str::FromStr, time::SystemTime};

/// An RFC 3339 timestamp as Consul writes it (`2026-11-22T10:00:00Z`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub SystemTime);

impl Default for Timestamp {
    fn default() -> Self {
        Timestamp(SystemTime::UNIX_EPOCH)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        humantime::format_rfc3339_seconds(self.0).fmt(f)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_rfc3339_weak(&s)
            .map(Timestamp)
            .map_err(|e| de::Error::custom(format!("invalid timestamp {s:?}: {e}")))
    }
}

/// One CA root certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CaRoot {
    /// Root id (Consul uses the key id in colon-hex).
    #[serde(rename = "ID")]
    pub id: String,
    /// Human name.
    #[serde(rename = "Name")]
    pub name: String,
    /// Serial number of the certificate.
    #[serde(rename = "SerialNumber")]
    pub serial_number: u64,
    /// Subject key id of the signing key, colon-hex.
    #[serde(rename = "SigningKeyID")]
    pub signing_key_id: String,
    /// Trust domain of a root from another cluster; empty for ours.
    #[serde(rename = "ExternalTrustDomain")]
    pub external_trust_domain: String,
    /// Start of validity.
    #[serde(rename = "NotBefore")]
    pub not_before: Timestamp,
    /// End of validity.
    #[serde(rename = "NotAfter")]
    pub not_after: Timestamp,
    /// PEM certificate.
    #[serde(rename = "RootCert")]
    pub root_cert: String,
    /// PEM intermediates, if leaves are signed by one.
    #[serde(rename = "IntermediateCerts")]
    pub intermediate_certs: Vec<String>,
    /// The root that signs new leaves.
    #[serde(rename = "Active")]
    pub active: bool,
    /// `ec` or `rsa`.
    #[serde(rename = "PrivateKeyType")]
    pub private_key_type: String,
    /// Key size.
    #[serde(rename = "PrivateKeyBits")]
    pub private_key_bits: u32,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

/// The trust bundle: every root still trusted, with the active one named.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IndexedCaRoots {
    /// Id of the root that signs new leaves.
    #[serde(rename = "ActiveRootID")]
    pub active_root_id: String,
    /// SPIFFE trust domain (`<cluster id>.consul`).
    #[serde(rename = "TrustDomain")]
    pub trust_domain: String,
    /// Every trusted root, active first.
    #[serde(rename = "Roots")]
    pub roots: Vec<CaRoot>,
    /// Catalog index the bundle was read at.
    #[serde(skip)]
    pub index: Index,
}

impl IndexedCaRoots {
    /// The active root, if any.
    pub fn active(&self) -> Option<&CaRoot> {
        self.roots.iter().find(|r| r.active)
    }
}

/// A leaf certificate issued to a service identity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IssuedCert {
    /// Serial number, colon-hex.
    #[serde(rename = "SerialNumber")]
    pub serial_number: String,
    /// PEM certificate (leaf, then intermediates).
    #[serde(rename = "CertPEM")]
    pub cert_pem: String,
    /// PEM private key.
    #[serde(rename = "PrivateKeyPEM")]
    pub private_key_pem: String,
    /// Service name the certificate identifies.
    #[serde(rename = "Service")]
    pub service: String,
    /// SPIFFE URI in the certificate.
    #[serde(rename = "ServiceURI")]
    pub service_uri: String,
    /// Start of validity.
    #[serde(rename = "ValidAfter")]
    pub valid_after: Timestamp,
    /// End of validity.
    #[serde(rename = "ValidBefore")]
    pub valid_before: Timestamp,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

impl IssuedCert {
    /// When the certificate should be replaced: two thirds into its validity (Consul renews
    /// leaves in the last third of their life).
    pub fn renew_at(&self) -> std::time::SystemTime {
        let life = self
            .valid_before
            .0
            .duration_since(self.valid_after.0)
            .unwrap_or_default();
        self.valid_after.0 + life * 2 / 3
    }
}

/// A service's SPIFFE identity:
/// `spiffe://<trust-domain>/ns/<namespace>/dc/<datacenter>/svc/<service>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SpiffeIdService {
    /// Trust domain (host part).
    pub trust_domain: String,
    /// Namespace (`default`).
    pub namespace: String,
    /// Datacenter.
    pub datacenter: String,
    /// Service name.
    pub service: String,
}

impl SpiffeIdService {
    /// The identity of `service` in the default namespace.
    pub fn new(trust_domain: &str, datacenter: &str, service: &str) -> Self {
        Self {
            trust_domain: trust_domain.to_owned(),
            namespace: "default".to_owned(),
            datacenter: datacenter.to_owned(),
            service: service.to_owned(),
        }
    }
}

impl fmt::Display for SpiffeIdService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/dc/{}/svc/{}",
            self.trust_domain, self.namespace, self.datacenter, self.service
        )
    }
}

impl FromStr for SpiffeIdService {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, ValidationError> {
        let bad = |why: &str| ValidationError::new("ServiceURI", Problem::Invalid(format!("{s:?}: {why}")));
        let rest = s
            .strip_prefix("spiffe://")
            .ok_or_else(|| bad("must start with spiffe://"))?;
        let (host, path) = rest.split_once('/').ok_or_else(|| bad("missing path"))?;
        let parts: Vec<&str> = path.split('/').collect();
        match parts.as_slice() {
            ["ns", ns, "dc", dc, "svc", svc]
                if !host.is_empty() && !ns.is_empty() && !dc.is_empty() && !svc.is_empty() =>
            {
                Ok(Self {
                    trust_domain: host.to_owned(),
                    namespace: (*ns).to_owned(),
                    datacenter: (*dc).to_owned(),
                    service: (*svc).to_owned(),
                })
            }
            _ => Err(bad("expected /ns/<namespace>/dc/<datacenter>/svc/<service>")),
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_leaf_is_renewed_two_thirds_into_its_life() {
        let start = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000);
        let cert = IssuedCert {
            valid_after: Timestamp(start),
            valid_before: Timestamp(start + std::time::Duration::from_secs(300)),
            ..Default::default()
        };
        assert_eq!(cert.renew_at(), start + std::time::Duration::from_secs(200));
    }
    use super::*;

    #[test]
    fn spiffe_round_trip() {
        let id = SpiffeIdService::new("11111111-2222.consul", "dc1", "web");
        let s = id.to_string();
        assert_eq!(s, "spiffe://11111111-2222.consul/ns/default/dc/dc1/svc/web");
        assert_eq!(s.parse::<SpiffeIdService>().unwrap(), id);
        assert!("spiffe://x/ns/default/svc/web".parse::<SpiffeIdService>().is_err());
        assert!("http://x/ns/a/dc/b/svc/c".parse::<SpiffeIdService>().is_err());
    }

    #[test]
    fn timestamp_round_trip() {
        let t: Timestamp = serde_json::from_str("\"2026-11-22T10:00:00Z\"").unwrap();
        assert_eq!(serde_json::to_string(&t).unwrap(), "\"2026-11-22T10:00:00Z\"");
    }
}
