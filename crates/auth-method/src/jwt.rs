//! `jwt` logins: the token's signature, issuer, audience and times checked, its claims mapped.

use crate::config::{JwtConfig, KeySource};
use crate::identity::LoginError;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{DecodingKey, Validation};
use parking_lot::Mutex;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use structs::filter::JwtIdentity;

/// How long a fetched key set is used before it is fetched again.
const KEYS_FRESH: Duration = Duration::from_secs(300);
/// A token naming a key the set lacks fetches it again, at most this often (a rotation
/// shows up at once; a flood of made-up key ids does not become a flood of fetches).
const REFETCH_AFTER: Duration = Duration::from_secs(10);

/// A fetched key set and when it was fetched.
type Fetched = (Instant, Arc<JwkSet>);

/// Fetched key sets by (source URL, CA).
#[derive(Default)]
pub(crate) struct KeyCache {
    sets: Mutex<HashMap<(String, String), Fetched>>,
}

pub(crate) async fn verify(
    cache: &KeyCache,
    clients: &crate::fetch::Clients,
    cfg: &JwtConfig,
    bearer: &str,
) -> Result<JwtIdentity, LoginError> {
    let header =
        jsonwebtoken::decode_header(bearer).map_err(|e| LoginError::Denied(format!("BearerToken: not a JWT: {e}")))?;
    if !cfg.algorithms.contains(&header.alg) {
        return Err(LoginError::Denied(format!(
            "BearerToken: signed with {:?}, not one of the method's JWTSupportedAlgs",
            header.alg
        )));
    }
    let mut validation = Validation::new(header.alg);
    validation.required_spec_claims.clear();
    // Times are checked below, with Consul's three leeways.
    validation.validate_exp = false;
    validation.validate_nbf = false;
    if cfg.audiences.is_empty() {
        validation.validate_aud = false;
    } else {
        validation.set_audience(&cfg.audiences);
    }
    if !cfg.issuer.is_empty() {
        validation.set_issuer(&[&cfg.issuer]);
    }
    let claims = match &cfg.keys {
        KeySource::Static(keys) => decode_with(keys, bearer, &validation)?,
        KeySource::Jwks { url, ca } | KeySource::Discovery { url, ca } => {
            let discovery = matches!(cfg.keys, KeySource::Discovery { .. });
            let kid = header.kid.as_deref();
            let set = cache.get(clients, url, ca, discovery, kid).await?;
            decode_with(&keys_of(&set, kid), bearer, &validation)?
        }
    };
    check_times(cfg, &claims, SystemTime::now())?;
    Ok(identity(cfg, &claims))
}

/// The keys of `set` a token naming `kid` may be signed with (every key when it names none).
fn keys_of(set: &JwkSet, kid: Option<&str>) -> Vec<DecodingKey> {
    set.keys
        .iter()
        .filter(|k| kid.is_none() || k.common.key_id.as_deref() == kid)
        .filter_map(|k| DecodingKey::from_jwk(k).ok())
        .collect()
}

fn decode_with(keys: &[DecodingKey], bearer: &str, validation: &Validation) -> Result<Map<String, Value>, LoginError> {
    use jsonwebtoken::errors::ErrorKind;
    let mut last = String::from("no key of the method verifies it");
    for key in keys {
        match jsonwebtoken::decode::<Map<String, Value>>(bearer, key, validation) {
            Ok(data) => return Ok(data.claims),
            // Another key may verify it.
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::InvalidSignature | ErrorKind::InvalidAlgorithm | ErrorKind::InvalidKeyFormat
                ) => {}
            Err(e) => {
                last = match e.kind() {
                    ErrorKind::InvalidAudience | ErrorKind::MissingRequiredClaim(_) if validation.aud.is_some() => {
                        "its audience (aud) is not one of the method's BoundAudiences".to_owned()
                    }
                    ErrorKind::InvalidIssuer => "its issuer (iss) is not the method's BoundIssuer".to_owned(),
                    _ => e.to_string(),
                };
                break;
            }
        }
    }
    Err(LoginError::Denied(format!("BearerToken: {last}")))
}

fn seconds(claims: &Map<String, Value>, name: &str) -> Option<f64> {
    claims.get(name).and_then(Value::as_f64)
}

/// `exp`, `nbf` and `iat` against `now`, each with its leeway plus the clock skew.
fn check_times(cfg: &JwtConfig, claims: &Map<String, Value>, now: SystemTime) -> Result<(), LoginError> {
    let now = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let skew = cfg.clock_skew.unwrap_or_default().as_secs_f64();
    if let (Some(exp), Some(leeway)) = (seconds(claims, "exp"), cfg.expiration_leeway)
        && now > exp + leeway.as_secs_f64() + skew
    {
        return Err(LoginError::Denied("BearerToken: expired (exp)".into()));
    }
    if let (Some(nbf), Some(leeway)) = (seconds(claims, "nbf"), cfg.not_before_leeway)
        && now < nbf - leeway.as_secs_f64() - skew
    {
        return Err(LoginError::Denied("BearerToken: not valid yet (nbf)".into()));
    }
    if let Some(iat) = seconds(claims, "iat")
        && cfg.clock_skew.is_some()
        && now < iat - skew
    {
        return Err(LoginError::Denied("BearerToken: issued in the future (iat)".into()));
    }
    Ok(())
}

/// A claim by name, or by JSON pointer (`/a/b`).
fn claim<'a>(claims: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    if name.starts_with('/') {
        let mut v: Option<&Value> = None;
        for part in name.split('/').skip(1) {
            let part = part.replace("~1", "/").replace("~0", "~");
            v = match v {
                None => claims.get(&part),
                Some(Value::Object(m)) => m.get(&part),
                Some(Value::Array(items)) => part.parse::<usize>().ok().and_then(|i| items.get(i)),
                Some(_) => None,
            };
            v?;
        }
        return v;
    }
    claims.get(name)
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The mapped claims: every `ClaimMappings` name present (`""` when the token lacks the
/// claim or it is not a scalar), every `ListClaimMappings` name present (a scalar claim is
/// a list of one).
fn identity(cfg: &JwtConfig, claims: &Map<String, Value>) -> JwtIdentity {
    let mut out = JwtIdentity::default();
    for (from, to) in &cfg.claims {
        let value = claim(claims, from).and_then(scalar).unwrap_or_default();
        out.value.insert(to.clone(), value);
    }
    for (from, to) in &cfg.list_claims {
        let items = match claim(claims, from) {
            Some(Value::Array(items)) => items.iter().filter_map(scalar).collect(),
            Some(v) => scalar(v).into_iter().collect(),
            None => Vec::new(),
        };
        out.list.insert(to.clone(), items);
    }
    out
}

impl KeyCache {
    /// The key set at `url` (a JWKS document, or an OpenID provider's, whose `jwks_uri` is
    /// fetched), fetched again when stale or when it lacks `kid`.
    async fn get(
        &self,
        clients: &crate::fetch::Clients,
        url: &str,
        ca: &str,
        discovery: bool,
        kid: Option<&str>,
    ) -> Result<Arc<JwkSet>, LoginError> {
        let key = (url.to_owned(), ca.to_owned());
        if let Some((at, set)) = self.sets.lock().get(&key).cloned() {
            let has_kid = kid.is_none_or(|k| set.find(k).is_some());
            if at.elapsed() < KEYS_FRESH && (has_kid || at.elapsed() < REFETCH_AFTER) {
                return Ok(set);
            }
        }
        let set = Arc::new(
            fetch(&clients.get(ca).map_err(LoginError::Unavailable)?, url, discovery)
                .await
                .map_err(LoginError::Unavailable)?,
        );
        self.sets.lock().insert(key, (Instant::now(), set.clone()));
        Ok(set)
    }
}

async fn fetch(client: &reqwest::Client, url: &str, discovery: bool) -> Result<JwkSet, String> {
    let jwks_url = if discovery {
        let well_known = format!("{}/.well-known/openid-configuration", url.trim_end_matches('/'));
        let doc: Value = get_json(client, &well_known).await?;
        let issuer = doc.get("issuer").and_then(Value::as_str).unwrap_or_default();
        if issuer.trim_end_matches('/') != url.trim_end_matches('/') {
            return Err(format!(
                "the OpenID provider at {url} names another issuer ({issuer:?}): not using its keys"
            ));
        }
        doc.get("jwks_uri")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("the OpenID provider at {url} names no jwks_uri"))?
            .to_owned()
    } else {
        url.to_owned()
    };
    let doc: Value = get_json(client, &jwks_url).await?;
    serde_json::from_value(doc).map_err(|e| format!("the key set at {jwks_url}: {e}"))
}

async fn get_json(client: &reqwest::Client, url: &str) -> Result<Value, String> {
    let resp = client
        .get(url)
        .send()
        .await
        .map_err(|e| format!("fetching {url}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("fetching {url}: HTTP {}", resp.status()));
    }
    resp.json().await.map_err(|e| format!("fetching {url}: not JSON: {e}"))
}

#[cfg(test)]
impl KeyCache {
    /// Forgets every fetched set (the next login fetches again).
    pub(crate) fn expire_all(&self) {
        self.sets.lock().clear();
    }
}
