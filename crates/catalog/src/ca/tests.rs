use super::*;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::*;

fn der(pem_text: &str) -> Vec<u8> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem_text.as_bytes()).unwrap();
    pem.contents
}

#[test]
fn leaf_chains_to_root_with_spiffe_id() {
    let ca = CaState::bootstrap(CaConfig::default(), None).unwrap();
    let root = ca.active().unwrap();
    let leaf = sign_leaf(&ca, "dc1", "web", SystemTime::now()).unwrap();
    assert_eq!(
        leaf.service_uri,
        format!("spiffe://{}/ns/default/dc/dc1/svc/web", ca.trust_domain())
    );

    let root_der = der(&root.root.root_cert);
    let leaf_der = der(&leaf.cert_pem);
    let (_, root_cert) = X509Certificate::from_der(&root_der).unwrap();
    let (_, leaf_cert) = X509Certificate::from_der(&leaf_der).unwrap();
    leaf_cert
        .verify_signature(Some(root_cert.public_key()))
        .expect("leaf is signed by the root");
    assert_eq!(leaf_cert.issuer(), root_cert.subject());
    assert!(!leaf_cert.is_ca());
    let sans = leaf_cert.subject_alternative_name().unwrap().unwrap();
    assert!(sans.value.general_names.contains(&GeneralName::URI(&leaf.service_uri)));
    let ttl = leaf.valid_before.0.duration_since(leaf.valid_after.0).unwrap();
    assert_eq!(ttl, Duration::from_secs(72 * 3600 + 60));
    // The key in the response matches the certificate.
    let key = KeyPair::from_pem(&leaf.private_key_pem).unwrap();
    assert_eq!(key.public_key_raw(), &*leaf_cert.public_key().subject_public_key.data);
}

#[test]
fn root_is_a_ca_for_the_trust_domain_without_a_dns_name_constraint() {
    let ca = CaState::bootstrap(CaConfig::default(), None).unwrap();
    let root_der = der(&ca.active().unwrap().root.root_cert);
    let (_, root) = X509Certificate::from_der(&root_der).unwrap();
    assert!(root.is_ca());
    root.verify_signature(None).expect("self-signed");
    // No name constraint: an ingress gateway's leaf carries the hosts it serves, which lie
    // outside the trust domain, and clients that enforce constraints would refuse it.
    assert!(
        !root
            .extensions()
            .iter()
            .any(|e| matches!(e.parsed_extension(), ParsedExtension::NameConstraints(_))),
        "no name constraints"
    );
    let sans = root.subject_alternative_name().unwrap().unwrap();
    let uri = format!("spiffe://{}", ca.trust_domain());
    assert!(sans.value.general_names.contains(&GeneralName::URI(&uri)));
}

#[test]
fn rotation_keeps_old_root_until_its_leaves_expire() {
    let ca = CaState::bootstrap(CaConfig::default(), None).unwrap();
    let old_id = ca.active().unwrap().root.id.clone();
    let now = SystemTime::now();
    let old_leaf = sign_leaf(&ca, "dc1", "api", now).unwrap();
    let rotated = ca
        .reconfigure(
            CaConfig {
                private_key_bits: 384,
                ..CaConfig::default()
            },
            now,
        )
        .unwrap();
    let new_root = rotated.active().unwrap();
    assert_ne!(new_root.root.id, old_id);
    assert_eq!(new_root.root.private_key_bits, 384);
    let bundle = rotated.bundle(now);
    assert_eq!(bundle.roots.len(), 2);
    assert_eq!(bundle.active_root_id, new_root.root.id);
    assert_eq!(
        bundle.trust_domain,
        ca.trust_domain(),
        "rotation keeps the trust domain"
    );
    // The old root outlives every leaf it signed, and not much more.
    let keep_until = rotated
        .roots
        .iter()
        .find(|r| r.root.id == old_id)
        .unwrap()
        .keep_until
        .unwrap();
    assert!(keep_until.0 >= old_leaf.valid_before.0);
    let later = keep_until.0 + Duration::from_secs(1);
    assert_eq!(rotated.bundle(later).roots.len(), 1);
    // New leaves come from the new root.
    let new_leaf = sign_leaf(&rotated, "dc1", "api", now).unwrap();
    let new_root_der = der(&new_root.root.root_cert);
    let (_, new_root_cert) = X509Certificate::from_der(&new_root_der).unwrap();
    let leaf_der = der(&new_leaf.cert_pem);
    let (_, leaf_cert) = X509Certificate::from_der(&leaf_der).unwrap();
    leaf_cert.verify_signature(Some(new_root_cert.public_key())).unwrap();
}

#[test]
fn rejects_what_the_built_in_ca_cannot_do() {
    let err = CaState::bootstrap(
        CaConfig {
            private_key_type: "rsa".into(),
            private_key_bits: 2048,
            ..CaConfig::default()
        },
        None,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            CaError::InvalidConfig {
                field: "Config.PrivateKeyType",
                ..
            }
        ),
        "{err}"
    );
    let ca = CaState::bootstrap(CaConfig::default(), None).unwrap();
    let err = ca
        .reconfigure(
            CaConfig {
                private_key_bits: 521,
                ..CaConfig::default()
            },
            SystemTime::now(),
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Config.PrivateKeyBits: 521 is not supported for ec keys: use 256 or 384"
    );
    let id = new_uuid().unwrap();
    assert_eq!(id.len(), 36);
    let parsed = uuid::Uuid::parse_str(&id).unwrap();
    assert_eq!(parsed.get_version(), Some(uuid::Version::Random));
    assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122);
    assert_eq!(parsed.hyphenated().to_string(), id, "lower-case hyphenated form");
}

/// A CSR as an agent makes it, for the URIs given (the key stays here).
fn csr(uris: &[&str]) -> (KeyPair, String) {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = CertificateParams::default();
    params.subject_alt_names = uris.iter().map(|u| SanType::URI(ia5(u).unwrap())).collect();
    let pem = params.serialize_request(&key).unwrap().pem().unwrap();
    (key, pem)
}

#[test]
fn csr_signing_certifies_the_agents_key_without_ever_holding_it() {
    let ca = CaState::bootstrap(CaConfig::default(), None).unwrap();
    let uri = format!("spiffe://{}/ns/default/dc/dc1/svc/web", ca.trust_domain());
    let (key, pem) = csr(&[&uri]);
    let leaf = sign_csr(&ca, "dc1", &pem, &|_, _| true, SystemTime::now()).unwrap();
    assert!(leaf.private_key_pem.is_empty());
    assert_eq!(
        (leaf.service.as_str(), leaf.service_uri.as_str()),
        ("web", uri.as_str())
    );
    let root_der = der(&ca.active().unwrap().root.root_cert);
    let leaf_der = der(&leaf.cert_pem);
    let (_, root_cert) = X509Certificate::from_der(&root_der).unwrap();
    let (_, leaf_cert) = X509Certificate::from_der(&leaf_der).unwrap();
    leaf_cert.verify_signature(Some(root_cert.public_key())).unwrap();
    assert_eq!(key.public_key_raw(), &*leaf_cert.public_key().subject_public_key.data);
    assert!(!leaf_cert.is_ca());
}

#[test]
fn csr_signing_refuses_identities_outside_this_ca() {
    let ca = CaState::bootstrap(CaConfig::default(), None).unwrap();
    let td = ca.trust_domain();
    let refused = |uris: &[&str]| {
        let (_, pem) = csr(uris);
        sign_csr(&ca, "dc1", &pem, &|_, _| true, SystemTime::now())
            .unwrap_err()
            .to_string()
    };
    assert!(refused(&["spiffe://other.consul/ns/default/dc/dc1/svc/web"]).contains("trust domain"));
    assert!(refused(&[&format!("spiffe://{td}/ns/default/dc/dc2/svc/web")]).contains("datacenter"));
    assert!(refused(&[]).contains("exactly one URI SAN"));
    let two = [
        format!("spiffe://{td}/ns/default/dc/dc1/svc/web"),
        format!("spiffe://{td}/ns/default/dc/dc1/svc/db"),
    ];
    assert!(refused(&[&two[0], &two[1]]).contains("found 2"));
    assert!(refused(&["https://example.com/web"]).contains("URI SAN"));
    let garbage = sign_csr(&ca, "dc1", "not a csr", &|_, _| true, SystemTime::now()).unwrap_err();
    assert!(matches!(garbage, CsrError::Invalid(_)), "{garbage}");
}

/// The DNS SANs of a PEM certificate.
pub(super) fn dns_sans_of(cert_pem: &str) -> Vec<String> {
    let der = der(cert_pem);
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    let sans = cert.subject_alternative_name().unwrap().unwrap();
    sans.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(d) => Some((*d).to_owned()),
            _ => None,
        })
        .collect()
}

#[test]
fn leaves_carry_the_dns_sans_asked_for() {
    let ca = CaState::bootstrap(CaConfig::default(), None).unwrap();
    let sans = vec!["web.example.com".to_owned(), "*.ingress.example.com".to_owned()];
    let leaf = sign_leaf_with_sans(&ca, "dc1", "ing", &sans, SystemTime::now()).unwrap();
    assert_eq!(dns_sans_of(&leaf.cert_pem), sans);
    let der = der(&leaf.cert_pem);
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    let names = &cert.subject_alternative_name().unwrap().unwrap().value.general_names;
    assert!(
        names.contains(&GeneralName::URI(&leaf.service_uri)),
        "the SPIFFE id stays"
    );
    assert!(dns_sans_of(&sign_leaf(&ca, "dc1", "ing", SystemTime::now()).unwrap().cert_pem).is_empty());
    for bad in ["", "a..b", "-a.com", "a.*.com", "a b.com", "x.com:8080"] {
        let err = sign_leaf_with_sans(&ca, "dc1", "ing", &[bad.to_owned()], SystemTime::now()).unwrap_err();
        assert_eq!(err, CaError::InvalidDnsSan(bad.to_owned()), "{bad:?}");
    }
    // The servers' peering names are theirs alone: a service's leaf never carries one.
    let td = ca.trust_domain();
    for reserved in [
        format!("server.dc1.peering.{td}"),
        format!("*.dc1.peering.{td}"),
        format!("PEERING.{td}"),
    ] {
        let err =
            sign_leaf_with_sans(&ca, "dc1", "ing", std::slice::from_ref(&reserved), SystemTime::now()).unwrap_err();
        assert_eq!(err, CaError::ReservedDnsSan(reserved.clone()), "{reserved}");
    }
    let server = sign_server_leaf(&ca, "dc1", &format!("server.dc1.peering.{td}"), SystemTime::now()).unwrap();
    assert_eq!(dns_sans_of(&server.cert_pem), [format!("server.dc1.peering.{td}")]);
    assert_eq!(server.service_uri, format!("spiffe://{td}/agent/server/dc/dc1"));
    assert!(!server.private_key_pem.is_empty());
}

#[test]
fn csr_signing_keeps_the_csrs_dns_sans_and_checks_them() {
    let ca = CaState::bootstrap(CaConfig::default(), None).unwrap();
    let uri = format!("spiffe://{}/ns/default/dc/dc1/svc/ing", ca.trust_domain());
    let with_dns = |dns: &str| {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = vec![SanType::URI(ia5(&uri).unwrap()), SanType::DnsName(ia5(dns).unwrap())];
        params.serialize_request(&key).unwrap().pem().unwrap()
    };
    let may_claim = |service: &str, name: &str| service == "ing" && name.ends_with(".example.com");
    let leaf = sign_csr(&ca, "dc1", &with_dns("shop.example.com"), &may_claim, SystemTime::now()).unwrap();
    assert_eq!(dns_sans_of(&leaf.cert_pem), ["shop.example.com"]);
    for bad in ["bad_name.com", "*"] {
        let err = sign_csr(&ca, "dc1", &with_dns(bad), &may_claim, SystemTime::now()).unwrap_err();
        assert!(matches!(err, CsrError::Identity(_)), "{bad}: {err:?}");
        assert!(err.to_string().contains("is not a DNS name"), "{err}");
    }
    // A name the service may not claim.
    let err = sign_csr(&ca, "dc1", &with_dns("bank.example.org"), &may_claim, SystemTime::now()).unwrap_err();
    assert!(err.to_string().contains("may not claim"), "{err}");
}

#[test]
fn a_rotation_that_shortens_the_leaf_ttl_keeps_the_old_root_for_the_old_ttl() {
    let ca = CaState::bootstrap(CaConfig::default(), None).unwrap();
    let now = SystemTime::now();
    let old_leaf = sign_leaf(&ca, "dc1", "api", now).unwrap();
    let rotated = ca
        .reconfigure(
            CaConfig {
                private_key_bits: 384,
                leaf_cert_ttl: structs::duration::GoDuration(Duration::from_secs(3600)),
                ..CaConfig::default()
            },
            now,
        )
        .unwrap();
    let at = rotated.next_prune_at().unwrap();
    assert!(at >= old_leaf.valid_before.0 + ROOT_PRUNE_MARGIN, "{at:?}");
    assert!(rotated.pruned(at - Duration::from_secs(1)).is_none());
    let pruned = rotated.pruned(at).unwrap();
    assert_eq!(pruned.roots.len(), 1);
    assert!(pruned.roots[0].root.active);
}

/// A secondary datacenter's CA: the primary signs its intermediate (a CA limited to leaves)
/// for a key it never sees; the secondary's leaves carry the intermediate and chain to the
/// primary's root; its bundle is the primary's roots; it refuses to be configured or to sign
/// intermediates itself.
#[test]
fn a_secondary_signs_with_an_intermediate_of_the_primarys_root() {
    let primary = CaState::bootstrap(CaConfig::default(), None).unwrap();
    let now = SystemTime::now();
    let (csr, key) = intermediate_csr(&primary.trust_domain(), &primary.config).unwrap();
    let (cert_pem, root_id) = sign_intermediate(&primary, &csr, now).unwrap();
    assert_eq!(root_id, primary.active().unwrap().root.id);
    let roots = primary.bundle(now);
    let secondary = CaState::following(
        None,
        &roots,
        Intermediate {
            cert_pem: cert_pem.clone(),
            private_key_pem: key,
            root_id,
        },
    )
    .unwrap();
    assert_eq!(secondary.trust_domain(), primary.trust_domain());
    assert!(
        secondary.roots.iter().all(|r| r.private_key_pem.is_empty()),
        "no root key leaves the primary"
    );
    let bundle = secondary.bundle(now);
    assert_eq!(bundle.active_root_id, roots.active_root_id);
    assert_eq!(bundle.roots[0].intermediate_certs, std::slice::from_ref(&cert_pem));

    let leaf = sign_leaf(&secondary, "dc2", "api", now).unwrap();
    assert_eq!(
        leaf.service_uri,
        format!("spiffe://{}/ns/default/dc/dc2/svc/api", primary.trust_domain())
    );
    let blocks: Vec<_> = x509_parser::pem::Pem::iter_from_buffer(leaf.cert_pem.as_bytes())
        .map(|p| p.unwrap().contents)
        .collect();
    assert_eq!(blocks.len(), 2, "the leaf, then the intermediate");
    let root_der = der(&primary.active().unwrap().root.root_cert);
    let (_, root) = X509Certificate::from_der(&root_der).unwrap();
    let (_, leaf_cert) = X509Certificate::from_der(&blocks[0]).unwrap();
    let (_, inter) = X509Certificate::from_der(&blocks[1]).unwrap();
    inter
        .verify_signature(Some(root.public_key()))
        .expect("signed by the primary's root");
    leaf_cert
        .verify_signature(Some(inter.public_key()))
        .expect("signed by the intermediate");
    assert!(inter.is_ca());
    let constraints = inter.basic_constraints().unwrap().unwrap().value;
    assert_eq!(constraints.path_len_constraint, Some(0), "it signs leaves only");
    assert!(inter.validity().not_after.timestamp() <= root.validity().not_after.timestamp());

    // A CSR for another trust domain, or with other names, is refused.
    let (other, _) = intermediate_csr("11111111-2222-3333-4444-555555555555.consul", &primary.config).unwrap();
    assert!(matches!(
        sign_intermediate(&primary, &other, now),
        Err(CsrError::Identity(_))
    ));
    // The secondary neither signs intermediates nor takes a configuration of its own.
    assert!(matches!(
        sign_intermediate(&secondary, &csr, now),
        Err(CsrError::Identity(_))
    ));
    let err = secondary.reconfigure(CaConfig::default(), now).unwrap_err();
    assert!(err.to_string().contains("follows the primary"), "{err}");
}

#[test]
fn a_cluster_id_given_at_bootstrap_is_the_trust_domain() {
    let id = "7e3c0d5a-1b2c-4d3e-8f4a-5b6c7d8e9f00";
    let ca = CaState::bootstrap(CaConfig::default(), Some(id)).unwrap();
    assert_eq!(ca.cluster_id, id);
    assert_eq!(ca.trust_domain(), format!("{id}.consul"));
    assert!(ca.active().is_some());
    assert!(CaState::bootstrap(CaConfig::default(), Some("not-a-uuid")).is_err());
}
