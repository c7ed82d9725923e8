//! Binding rules: which logins (`Selector`, a filter expression over the verified
//! identity) get what (`BindType`), named how (`BindName`, with `${field}` taken from the
//! identity).

use crate::config::{ConfigError, Settings, err};
use crate::identity::{Identity, LoginError};
use std::collections::BTreeMap;
use structs::acl::{AclAuthMethod, AclBindingRule};
use structs::filter::{Filter, JwtIdentity, ServiceAccountIdentity};

/// What a login's token gets: the names of each kind, in rule order, without repeats.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bindings {
    /// Service identities.
    pub service_identities: Vec<String>,
    /// Node identities (in this datacenter).
    pub node_identities: Vec<String>,
    /// Roles, by name (ones that do not exist are the caller's to leave out).
    pub roles: Vec<String>,
    /// Policies, by name (likewise).
    pub policies: Vec<String>,
}

impl Bindings {
    /// True when no rule bound anything.
    pub fn is_empty(&self) -> bool {
        self.service_identities.is_empty()
            && self.node_identities.is_empty()
            && self.roles.is_empty()
            && self.policies.is_empty()
    }
}

/// Checks `rule` against `method`'s type: its selector parses over the identity's fields,
/// and its bind name uses only fields the method provides and makes a valid name.
pub fn check_rule(method: &AclAuthMethod, rule: &AclBindingRule) -> Result<(), ConfigError> {
    let fields: Vec<String> = match Settings::parse(method)? {
        Settings::Jwt(cfg) => {
            parse_selector::<JwtIdentity>(&rule.selector)?;
            cfg.claims.values().map(|n| format!("value.{n}")).collect()
        }
        Settings::Kubernetes(_) => {
            parse_selector::<ServiceAccountIdentity>(&rule.selector)?;
            SERVICE_ACCOUNT_FIELDS.iter().map(|f| (*f).to_owned()).collect()
        }
    };
    // Every field as a valid name's character: what is left must make a valid name too.
    let sample: BTreeMap<String, String> = fields.into_iter().map(|f| (f, "a".to_owned())).collect();
    let name = interpolate(&rule.bind_name, &sample).map_err(|why| err("BindName", why))?;
    check_name(&rule.bind_type, &name).map_err(|why| err("BindName", why))
}

const SERVICE_ACCOUNT_FIELDS: &[&str] = &["serviceaccount.namespace", "serviceaccount.name", "serviceaccount.uid"];

fn parse_selector<T: structs::filter::Record>(selector: &str) -> Result<Filter<T>, ConfigError> {
    Filter::<T>::parse(selector).map_err(|e| err("Selector", e.to_string()))
}

/// What `rules` (those of `method`) bind for `identity`.
pub fn bind<'a>(
    method: &AclAuthMethod,
    rules: impl IntoIterator<Item = &'a AclBindingRule>,
    identity: &Identity,
) -> Result<Bindings, LoginError> {
    let fields = fields_of(identity);
    let mut out = Bindings::default();
    for rule in rules.into_iter().filter(|r| r.auth_method == method.name) {
        let matched = match identity {
            Identity::Jwt(i) => selects::<JwtIdentity>(rule, i),
            Identity::ServiceAccount(i) => selects::<ServiceAccountIdentity>(rule, i),
        }?;
        if !matched {
            continue;
        }
        let name = interpolate(&rule.bind_name, &fields)
            .and_then(|name| check_name(&rule.bind_type, &name).map(|()| name))
            .map_err(|why| LoginError::Denied(format!("binding rule {}: BindName: {why}", rule.id)))?;
        let list = match rule.bind_type.as_str() {
            "service" => &mut out.service_identities,
            "node" => &mut out.node_identities,
            "role" => &mut out.roles,
            "policy" => &mut out.policies,
            other => {
                return Err(LoginError::Unavailable(format!(
                    "binding rule {}: BindType {other:?} is not supported",
                    rule.id
                )));
            }
        };
        if !list.contains(&name) {
            list.push(name);
        }
    }
    Ok(out)
}

fn selects<T: structs::filter::Record>(rule: &AclBindingRule, record: &T) -> Result<bool, LoginError> {
    let filter = Filter::<T>::parse(&rule.selector)
        .map_err(|e| LoginError::Unavailable(format!("binding rule {}: Selector: {e}", rule.id)))?;
    Ok(filter.matches(record))
}

/// The fields a bind name may use, with this identity's values.
fn fields_of(identity: &Identity) -> BTreeMap<String, String> {
    match identity {
        Identity::Jwt(i) => i.value.iter().map(|(k, v)| (format!("value.{k}"), v.clone())).collect(),
        Identity::ServiceAccount(i) => [
            ("serviceaccount.namespace", &i.namespace),
            ("serviceaccount.name", &i.name),
            ("serviceaccount.uid", &i.uid),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.clone()))
        .collect(),
    }
}

/// `text` with each `${field}` replaced by its value.
pub(crate) fn interpolate(text: &str, fields: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unterminated \"${{\" at offset {}", text.len() - rest.len() + start))?;
        let field = after[..end].trim();
        let value = fields.get(field).ok_or_else(|| {
            let known: Vec<&str> = fields.keys().map(String::as_str).collect();
            format!(
                "unknown field {field:?} (this method provides: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            )
        })?;
        out.push_str(value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A bound name must be one the token's identity or link can carry.
fn check_name(bind_type: &str, name: &str) -> Result<(), String> {
    let lower = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let ok = match bind_type {
        "service" | "node" => {
            !name.is_empty()
                && name.len() <= 256
                && name.chars().all(|c| lower(c) || c == '-' || c == '_')
                && name.starts_with(lower)
                && name.ends_with(lower)
        }
        _ => {
            !name.is_empty()
                && name.len() <= 128
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        }
    };
    if ok {
        return Ok(());
    }
    Err(match bind_type {
        "service" | "node" => format!(
            "{name:?} is not a valid {bind_type} name (lowercase letters, digits, '-' or '_', starting and ending with a letter or digit)"
        ),
        _ => format!("{name:?} is not a valid {bind_type} name (1 to 128 letters, digits, '-' or '_')"),
    })
}
