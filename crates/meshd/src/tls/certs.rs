//! `meshd tls ca create` and `meshd tls cert create` (after `consul tls`): a CA, and server or
//! client certificates it signs, for the HTTPS API and xDS over TLS. Keys are written mode
//! 0600 and never overwritten.

use crate::cli::{TlsCaCommand, TlsCaCreateArgs, TlsCertCommand, TlsCertCreateArgs, TlsCommand};
use anyhow::{Context, Result, bail};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How far back certificates are valid from, for clocks slightly behind.
const BACKDATE: Duration = Duration::from_secs(60);

/// Runs a `meshd tls` command; prints the files written.
pub fn run(command: TlsCommand) -> Result<()> {
    let written = match command {
        TlsCommand::Ca(TlsCaCommand::Create(args)) => create_ca(&args)?,
        TlsCommand::Cert(TlsCertCommand::Create(args)) => create_cert(&args)?,
    };
    let mut out = std::io::stdout().lock();
    for path in written {
        // Nobody reading is not an error: the files are written.
        let shown = path.strip_prefix(".").unwrap_or(&path);
        let _ = writeln!(out, "==> Saved {}", shown.display());
    }
    Ok(())
}

/// The CA's file names in `dir`: (certificate, key).
pub fn ca_files(dir: &Path, domain: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{domain}-agent-ca.pem")),
        dir.join(format!("{domain}-agent-ca-key.pem")),
    )
}

/// Writes a new CA; refuses to replace one.
pub fn create_ca(args: &TlsCaCreateArgs) -> Result<Vec<PathBuf>> {
    check_label("-domain", &args.domain)?;
    let (cert_path, key_path) = ca_files(&args.dir, &args.domain);
    for path in [&cert_path, &key_path] {
        if path.exists() {
            bail!("{} already exists: remove it or use another -dir", path.display());
        }
    }
    let key = KeyPair::generate().context("generating the CA key")?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!("{} Agent CA {}", args.domain, u64::from_be_bytes(random::<8>()?) >> 1),
    );
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params, args.days)?;
    let cert = params.self_signed(&key).context("signing the CA certificate")?;
    write_new(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
    write_new(&cert_path, cert.pem().as_bytes(), 0o644)?;
    Ok(vec![cert_path, key_path])
}

/// Writes a new server or client certificate signed by the CA, at the first free index.
pub fn create_cert(args: &TlsCertCreateArgs) -> Result<Vec<PathBuf>> {
    check_label("-domain", &args.domain)?;
    check_label("-dc", &args.dc)?;
    let role = if args.server { "server" } else { "client" };
    let (default_ca, default_key) = ca_files(&args.dir, &args.domain);
    let ca_path = args.ca.clone().unwrap_or(default_ca);
    let ca_key_path = args.key.clone().unwrap_or(default_key);
    let ca_pem =
        std::fs::read_to_string(&ca_path).with_context(|| format!("-ca {}: cannot read", ca_path.display()))?;
    let ca_key_pem = std::fs::read_to_string(&ca_key_path)
        .with_context(|| format!("-key {}: cannot read", ca_key_path.display()))?;
    // The parser's own message could quote the key file: say only what was expected.
    let ca_key = KeyPair::from_pem(&ca_key_pem)
        .map_err(|_| anyhow::anyhow!("-key {}: not a PEM private key", ca_key_path.display()))?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)
        .map_err(|e| anyhow::anyhow!("-ca {}: not a usable CA certificate: {e}", ca_path.display()))?;

    let name = format!("{role}.{}.{}", args.dc, args.domain);
    let mut sans = vec![
        SanType::DnsName(name.as_str().try_into().context("the certificate's name")?),
        SanType::DnsName("localhost".try_into().context("localhost")?),
        SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()),
    ];
    for dns in &args.additional_dnsname {
        let ia5 = dns
            .as_str()
            .try_into()
            .map_err(|_| anyhow::anyhow!("-additional-dnsname {dns:?}: not a DNS name"))?;
        sans.push(SanType::DnsName(ia5));
    }
    sans.extend(args.additional_ipaddress.iter().map(|ip| SanType::IpAddress(*ip)));
    // Each name once, in the order given: `-additional-ipaddress 127.0.0.1` or
    // `-additional-dnsname localhost` repeat a default.
    let mut seen = Vec::with_capacity(sans.len());
    sans.retain(|san| {
        let new = !seen.contains(san);
        if new {
            seen.push(san.clone());
        }
        new
    });

    let key = KeyPair::generate().context("generating the key")?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    params.distinguished_name = dn;
    params.subject_alt_names = sans;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    // Servers are also clients of each other (as Consul's server certificates).
    params.extended_key_usages = if args.server {
        vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth]
    } else {
        vec![ExtendedKeyUsagePurpose::ClientAuth]
    };
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, args.days)?;
    let cert = params.signed_by(&key, &issuer).context("signing the certificate")?;

    let prefix = format!("{}-{role}-{}", args.dc, args.domain);
    for n in 0u32.. {
        let cert_path = args.dir.join(format!("{prefix}-{n}.pem"));
        let key_path = args.dir.join(format!("{prefix}-{n}-key.pem"));
        if cert_path.exists() || key_path.exists() {
            continue;
        }
        write_new(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
        write_new(&cert_path, cert.pem().as_bytes(), 0o644)?;
        return Ok(vec![cert_path, key_path]);
    }
    bail!("no free file name for {prefix}-N.pem in {}", args.dir.display())
}

/// Datacenter and domain go into names and file names: letters, digits and `-` only.
fn check_label(flag: &str, value: &str) -> Result<()> {
    if value.is_empty() || !value.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        bail!("{flag} {value:?}: use letters, digits and '-'");
    }
    Ok(())
}

fn validity(params: &mut CertificateParams, days: u32) -> Result<()> {
    let now = SystemTime::now();
    params.not_before = (now - BACKDATE).into();
    params.not_after = (now + Duration::from_secs(u64::from(days) * 86_400)).into();
    params.serial_number = Some(SerialNumber::from(u64::from_be_bytes(random::<8>()?) >> 1));
    Ok(())
}

fn random<const N: usize>() -> Result<[u8; N]> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    Ok(bytes)
}

/// Creates `path` with `mode` and `bytes`; an existing file is an error (never replaced).
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}
