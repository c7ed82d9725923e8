//! A method's `Config`, read into the settings of its type. Every key must be one the type
//! defines (a misspelt setting is an error, not ignored), and every value must make sense.

use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;
use structs::acl::AclAuthMethod;

/// Why a method's settings (or a binding rule) cannot be used; `field` is the JSON path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ConfigError {
    /// The setting at fault (`Config.JWKSURL`, `Selector`, ...).
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

pub(crate) fn err(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.to_owned(),
        reason: reason.into(),
    }
}

/// Checks `method`'s `Config` for its type (called before the method is written).
pub fn check_method(method: &AclAuthMethod) -> Result<(), ConfigError> {
    Settings::parse(method).map(|_| ())
}

/// A method's settings.
pub(crate) enum Settings {
    Jwt(JwtConfig),
    Kubernetes(KubernetesConfig),
}

/// Where a `jwt` method's keys come from.
pub(crate) enum KeySource {
    /// The public keys in the config.
    Static(Vec<DecodingKey>),
    /// A JWKS document at a URL, and the CA that signs its server's certificate.
    Jwks { url: String, ca: String },
    /// An OpenID provider's discovery document (which names the JWKS), and its CA.
    Discovery { url: String, ca: String },
}

pub(crate) struct JwtConfig {
    pub(crate) keys: KeySource,
    pub(crate) algorithms: Vec<Algorithm>,
    pub(crate) audiences: Vec<String>,
    pub(crate) issuer: String,
    /// Claim (a name, or a JSON pointer starting with `/`) -> `value.<name>`.
    pub(crate) claims: BTreeMap<String, String>,
    /// Claim -> `list.<name>`.
    pub(crate) list_claims: BTreeMap<String, String>,
    /// `None`: that check is off (a setting of -1).
    pub(crate) expiration_leeway: Option<Duration>,
    pub(crate) not_before_leeway: Option<Duration>,
    pub(crate) clock_skew: Option<Duration>,
}

pub(crate) struct KubernetesConfig {
    pub(crate) host: String,
    pub(crate) ca: String,
    pub(crate) reviewer_jwt: String,
}

const JWT_KEYS: &[&str] = &[
    "JWTValidationPubKeys",
    "JWKSURL",
    "JWKSCACert",
    "OIDCDiscoveryURL",
    "OIDCDiscoveryCACert",
    "JWTSupportedAlgs",
    "BoundAudiences",
    "BoundIssuer",
    "ClaimMappings",
    "ListClaimMappings",
    "ExpirationLeeway",
    "NotBeforeLeeway",
    "ClockSkewLeeway",
];
const KUBERNETES_KEYS: &[&str] = &["Host", "CACert", "ServiceAccountJWT"];

/// Consul's defaults when a leeway is 0.
const DEFAULT_LEEWAY: Duration = Duration::from_secs(150);
const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(60);

impl Settings {
    pub(crate) fn parse(method: &AclAuthMethod) -> Result<Settings, ConfigError> {
        let known = match method.kind.as_str() {
            "jwt" => JWT_KEYS,
            "kubernetes" => KUBERNETES_KEYS,
            other => return Err(err("Type", format!("{other:?} is not supported (jwt or kubernetes)"))),
        };
        if let Some(unknown) = method.config.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(err(
                &format!("Config.{unknown}"),
                format!(
                    "not a setting of a {} auth method (known: {})",
                    method.kind,
                    known.join(", ")
                ),
            ));
        }
        let c = Reader(&method.config);
        if method.kind == "kubernetes" {
            return kubernetes(&c).map(Settings::Kubernetes);
        }
        jwt(&c).map(Settings::Jwt)
    }
}

fn kubernetes(c: &Reader<'_>) -> Result<KubernetesConfig, ConfigError> {
    let host = c.string("Host")?;
    if host.is_empty() {
        return Err(err("Config.Host", "required: the Kubernetes API's URL"));
    }
    check_url("Config.Host", &host)?;
    let ca = c.string("CACert")?;
    check_ca("Config.CACert", &ca)?;
    let reviewer_jwt = c.string("ServiceAccountJWT")?;
    if reviewer_jwt.is_empty() {
        return Err(err(
            "Config.ServiceAccountJWT",
            "required: the token meshd presents to the TokenReview API",
        ));
    }
    Ok(KubernetesConfig {
        host: host.trim_end_matches('/').to_owned(),
        ca,
        reviewer_jwt,
    })
}

fn jwt(c: &Reader<'_>) -> Result<JwtConfig, ConfigError> {
    let pems = c.strings("JWTValidationPubKeys")?;
    let jwks = c.string("JWKSURL")?;
    let discovery = c.string("OIDCDiscoveryURL")?;
    let jwks_ca = c.string("JWKSCACert")?;
    let discovery_ca = c.string("OIDCDiscoveryCACert")?;
    let sources = usize::from(!pems.is_empty()) + usize::from(!jwks.is_empty()) + usize::from(!discovery.is_empty());
    if sources != 1 {
        return Err(err(
            "Config",
            "exactly one of JWTValidationPubKeys, JWKSURL and OIDCDiscoveryURL must be set",
        ));
    }
    if !jwks_ca.is_empty() && jwks.is_empty() {
        return Err(err("Config.JWKSCACert", "only with JWKSURL"));
    }
    if !discovery_ca.is_empty() && discovery.is_empty() {
        return Err(err("Config.OIDCDiscoveryCACert", "only with OIDCDiscoveryURL"));
    }
    check_ca("Config.JWKSCACert", &jwks_ca)?;
    check_ca("Config.OIDCDiscoveryCACert", &discovery_ca)?;
    let mut static_keys = Vec::new();
    for (i, pem) in pems.iter().enumerate() {
        static_keys.push(public_key(pem).ok_or_else(|| {
            err(
                &format!("Config.JWTValidationPubKeys[{i}]"),
                "not a PEM RSA, EC or Ed25519 public key",
            )
        })?);
    }
    let keys = if !pems.is_empty() {
        KeySource::Static(static_keys)
    } else if !jwks.is_empty() {
        check_url("Config.JWKSURL", &jwks)?;
        KeySource::Jwks { url: jwks, ca: jwks_ca }
    } else {
        check_url("Config.OIDCDiscoveryURL", &discovery)?;
        KeySource::Discovery {
            url: discovery,
            ca: discovery_ca,
        }
    };
    let claims = c.map("ClaimMappings")?;
    let list_claims = c.map("ListClaimMappings")?;
    for (field, map) in [("ClaimMappings", &claims), ("ListClaimMappings", &list_claims)] {
        for (claim, name) in map {
            if claim.is_empty()
                || name.is_empty()
                || !name
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
            {
                return Err(err(
                    &format!("Config.{field}"),
                    format!("{claim:?} -> {name:?}: a claim maps to a name of letters, digits, '_' or '-'"),
                ));
            }
        }
    }
    Ok(JwtConfig {
        keys,
        algorithms: algorithms(c)?,
        audiences: c.strings("BoundAudiences")?,
        issuer: c.string("BoundIssuer")?,
        claims,
        list_claims,
        expiration_leeway: c.leeway("ExpirationLeeway", DEFAULT_LEEWAY)?,
        not_before_leeway: c.leeway("NotBeforeLeeway", DEFAULT_LEEWAY)?,
        clock_skew: c.leeway("ClockSkewLeeway", DEFAULT_CLOCK_SKEW)?,
    })
}

fn algorithms(c: &Reader<'_>) -> Result<Vec<Algorithm>, ConfigError> {
    let names = c.strings("JWTSupportedAlgs")?;
    if names.is_empty() {
        return Ok(vec![Algorithm::RS256]);
    }
    names
        .iter()
        .map(|n| match Algorithm::from_str(n) {
            // Shared secrets are not public keys: a method verifies, it never holds a secret.
            Ok(Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) | Err(_) => Err(err(
                "Config.JWTSupportedAlgs",
                format!("{n:?} is not supported (RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384 or EdDSA)"),
            )),
            Ok(a) => Ok(a),
        })
        .collect()
}

/// A PEM public key of any type jsonwebtoken verifies with.
pub(crate) fn public_key(pem: &str) -> Option<DecodingKey> {
    let b = pem.as_bytes();
    DecodingKey::from_rsa_pem(b)
        .or_else(|_| DecodingKey::from_ec_pem(b))
        .or_else(|_| DecodingKey::from_ed_pem(b))
        .ok()
}

fn check_url(field: &str, url: &str) -> Result<(), ConfigError> {
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "https" | "http") && u.host().is_some() => Ok(()),
        _ => Err(err(field, format!("{url:?} is not an http(s) URL"))),
    }
}

fn check_ca(field: &str, pem: &str) -> Result<(), ConfigError> {
    if pem.is_empty() {
        return Ok(());
    }
    match reqwest::Certificate::from_pem_bundle(pem.as_bytes()) {
        Ok(certs) if !certs.is_empty() => Ok(()),
        _ => Err(err(field, "not a PEM certificate")),
    }
}

/// Typed reads of a `Config` map; errors name `Config.<key>`.
struct Reader<'a>(&'a Map<String, Value>);

impl Reader<'_> {
    fn string(&self, key: &str) -> Result<String, ConfigError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(err(&format!("Config.{key}"), "must be a string")),
        }
    }

    fn strings(&self, key: &str) -> Result<Vec<String>, ConfigError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<String>>>()
                .ok_or_else(|| err(&format!("Config.{key}"), "must be a list of strings")),
            Some(_) => Err(err(&format!("Config.{key}"), "must be a list of strings")),
        }
    }

    fn map(&self, key: &str) -> Result<BTreeMap<String, String>, ConfigError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(BTreeMap::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_owned())))
                .collect::<Option<BTreeMap<String, String>>>()
                .ok_or_else(|| err(&format!("Config.{key}"), "must map strings to strings")),
            Some(_) => Err(err(&format!("Config.{key}"), "must map strings to strings")),
        }
    }

    /// A leeway: a duration (`"30s"`, or nanoseconds as a number), 0 for `default`, -1 to
    /// turn the check off.
    fn leeway(&self, key: &str, default: Duration) -> Result<Option<Duration>, ConfigError> {
        let bad = || {
            err(
                &format!("Config.{key}"),
                "must be a duration like \"150s\", 0 (the default) or -1 (off)",
            )
        };
        let nanos: i128 = match self.0.get(key) {
            None | Some(Value::Null) => 0,
            Some(Value::Number(n)) => n.as_i64().map(i128::from).ok_or_else(bad)?,
            Some(Value::String(s)) => match s.strip_prefix('-') {
                Some(rest) if rest.parse::<u64>().is_ok() || structs::GoDuration::parse(rest).is_ok() => -1,
                Some(_) => return Err(bad()),
                None => structs::GoDuration::parse(s).map_err(|_| bad())?.0.as_nanos() as i128,
            },
            Some(_) => return Err(bad()),
        };
        Ok(match nanos {
            0 => Some(default),
            n if n < 0 => None,
            n => Some(Duration::from_nanos(u64::try_from(n).map_err(|_| bad())?)),
        })
    }
}
