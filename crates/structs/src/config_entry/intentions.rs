//! `service-intentions`: who may call a service.

use super::{ConfigEntryKind, check_entry_name};
use crate::proxy::string_enum;
use crate::validate::{Problem, Validate, ValidationError, check_name};
use crate::{Index, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

string_enum! {
    /// Allow or deny.
    IntentionAction {
        /// Let the connection or request through.
        #[default]
        Allow = "allow",
        /// Refuse it.
        Deny = "deny",
    }
}

/// A header condition of an L7 permission.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IntentionHttpHeaderPermission {
    /// Header name.
    #[serde(rename = "Name")]
    pub name: String,
    /// Header present.
    #[serde(rename = "Present", skip_serializing_if = "std::ops::Not::not")]
    pub present: bool,
    /// Exact value.
    #[serde(rename = "Exact", skip_serializing_if = "String::is_empty")]
    pub exact: String,
    /// Value prefix.
    #[serde(rename = "Prefix", skip_serializing_if = "String::is_empty")]
    pub prefix: String,
    /// Value suffix.
    #[serde(rename = "Suffix", skip_serializing_if = "String::is_empty")]
    pub suffix: String,
    /// A substring of the value (Consul 1.19+).
    #[serde(rename = "Contains", skip_serializing_if = "String::is_empty")]
    pub contains: String,
    /// Value regex.
    #[serde(rename = "Regex", skip_serializing_if = "String::is_empty")]
    pub regex: String,
    /// Compare `Exact`, `Prefix`, `Suffix` or `Contains` without regard to ASCII case
    /// (Consul 1.19+).
    #[serde(rename = "IgnoreCase", skip_serializing_if = "std::ops::Not::not")]
    pub ignore_case: bool,
    /// Negate the match.
    #[serde(rename = "Invert", skip_serializing_if = "std::ops::Not::not")]
    pub invert: bool,
}

/// HTTP conditions of an L7 permission.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IntentionHttpPermission {
    /// Exact path.
    #[serde(rename = "PathExact", skip_serializing_if = "String::is_empty")]
    pub path_exact: String,
    /// Path prefix.
    #[serde(rename = "PathPrefix", skip_serializing_if = "String::is_empty")]
    pub path_prefix: String,
    /// Path regex.
    #[serde(rename = "PathRegex", skip_serializing_if = "String::is_empty")]
    pub path_regex: String,
    /// Header conditions.
    #[serde(rename = "Header", skip_serializing_if = "Vec::is_empty")]
    pub header: Vec<IntentionHttpHeaderPermission>,
    /// Methods.
    #[serde(rename = "Methods", skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
}

/// One L7 rule: an action for requests matching the HTTP conditions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IntentionPermission {
    /// Allow or deny.
    #[serde(rename = "Action")]
    pub action: IntentionAction,
    /// Conditions.
    #[serde(rename = "HTTP", skip_serializing_if = "Option::is_none")]
    pub http: Option<IntentionHttpPermission>,
    /// A token the request must also carry for the permission to match.
    #[serde(rename = "JWT", skip_serializing_if = "Option::is_none")]
    pub jwt: Option<IntentionJwtRequirement>,
}

/// `JWT`: a request must carry a token valid for one of the providers, with the claims that
/// provider's entry lists.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IntentionJwtRequirement {
    /// The providers (any one of them).
    #[serde(rename = "Providers", skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<IntentionJwtProvider>,
}

/// One provider of a [`IntentionJwtRequirement`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IntentionJwtProvider {
    /// The `jwt-provider` entry's name.
    #[serde(rename = "Name")]
    pub name: String,
    /// Claims the token must hold (all of them).
    #[serde(rename = "VerifyClaims", skip_serializing_if = "Vec::is_empty")]
    pub verify_claims: Vec<IntentionJwtClaimVerification>,
}

/// A claim a token must hold: the value at `Path` in its payload is `Value`, or a list that
/// contains it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IntentionJwtClaimVerification {
    /// Keys from the payload's top down.
    #[serde(rename = "Path", skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<String>,
    /// The expected string.
    #[serde(rename = "Value", skip_serializing_if = "String::is_empty")]
    pub value: String,
}

impl IntentionJwtRequirement {
    /// Checks the requirement at `at`: at least one provider, each named, claim paths
    /// without empty keys.
    fn validate(&self, at: &str) -> Result<(), ValidationError> {
        if self.providers.is_empty() {
            return Err(ValidationError::new(
                format!("{at}.Providers"),
                Problem::Required("(at least one provider)"),
            ));
        }
        for (i, p) in self.providers.iter().enumerate() {
            let pat = format!("{at}.Providers[{i}]");
            check_name(&format!("{pat}.Name"), &p.name, "")?;
            for (k, c) in p.verify_claims.iter().enumerate() {
                if c.path.is_empty() || c.path.iter().any(String::is_empty) {
                    return Err(ValidationError::new(
                        format!("{pat}.VerifyClaims[{k}].Path"),
                        Problem::Invalid("must name at least one key, none empty".into()),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The provider names it refers to, with the field naming each.
    pub fn provider_fields<'a>(&'a self, at: &'a str) -> impl Iterator<Item = (String, &'a str)> + 'a {
        self.providers
            .iter()
            .enumerate()
            .map(move |(i, p)| (format!("{at}.Providers[{i}].Name"), p.name.as_str()))
    }
}

/// One source of a `service-intentions` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SourceIntention {
    /// Source service name, or `*`.
    #[serde(rename = "Name")]
    pub name: String,
    /// Source namespace (only `default` here).
    #[serde(rename = "Namespace", skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The peer the source is in (cluster peering); empty: this cluster.
    #[serde(rename = "Peer", skip_serializing_if = "String::is_empty")]
    pub peer: String,
    /// L4 action; exclusive with `Permissions`.
    #[serde(rename = "Action", skip_serializing_if = "Option::is_none")]
    pub action: Option<IntentionAction>,
    /// L7 rules; exclusive with `Action`.
    #[serde(rename = "Permissions", skip_serializing_if = "Vec::is_empty")]
    pub permissions: Vec<IntentionPermission>,
    /// Computed precedence (read-only).
    #[serde(rename = "Precedence")]
    pub precedence: u32,
    /// `consul` (the only source type).
    #[serde(rename = "Type")]
    pub source_type: String,
    /// Human description.
    #[serde(rename = "Description", skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Id of the legacy intention this source was made from.
    #[serde(rename = "LegacyID", skip_serializing_if = "String::is_empty")]
    pub legacy_id: String,
    /// Metadata of the legacy intention; keys untouched.
    #[serde(rename = "LegacyMeta", skip_serializing_if = "BTreeMap::is_empty")]
    pub legacy_meta: BTreeMap<String, String>,
    /// Creation time of the legacy intention.
    #[serde(rename = "LegacyCreateTime", skip_serializing_if = "Option::is_none")]
    pub legacy_create_time: Option<Timestamp>,
    /// Update time of the legacy intention.
    #[serde(rename = "LegacyUpdateTime", skip_serializing_if = "Option::is_none")]
    pub legacy_update_time: Option<Timestamp>,
}

/// Intentions for one destination service (or `*`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceIntentions {
    /// Destination service name, or `*`.
    #[serde(rename = "Name")]
    pub name: String,
    /// Sources and what they may do.
    #[serde(
        rename = "Sources",
        serialize_with = "crate::json::ser::null_if_empty",
        deserialize_with = "crate::json::read::null_as_default"
    )]
    pub sources: Vec<SourceIntention>,
    /// A token every request to the service must carry, whatever its source.
    #[serde(rename = "JWT", skip_serializing_if = "Option::is_none")]
    pub jwt: Option<IntentionJwtRequirement>,
    /// User metadata; keys untouched.
    #[serde(rename = "Meta", skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

fn check_name_or_wildcard(field: &str, name: &str) -> Result<(), ValidationError> {
    if name == "*" {
        Ok(())
    } else {
        check_name(field, name, "")
    }
}

impl Validate for ServiceIntentions {
    fn validate(&self) -> Result<(), ValidationError> {
        if self.name != "*" {
            check_entry_name(ConfigEntryKind::ServiceIntentions, &self.name)?;
        }
        let mut seen = BTreeSet::new();
        for (i, src) in self.sources.iter().enumerate() {
            let at = format!("Sources[{i}]");
            check_name_or_wildcard(&format!("{at}.Name"), &src.name)?;
            if !src.peer.is_empty() {
                crate::validate::check_peer_name(&format!("{at}.Peer"), &src.peer)?;
            }
            if !seen.insert((src.peer.as_str(), src.name.as_str())) {
                let from = if src.peer.is_empty() {
                    String::new()
                } else {
                    format!(" of peer {:?}", src.peer)
                };
                return Err(ValidationError::new(
                    format!("{at}.Name"),
                    Problem::Duplicate(format!("source {:?}{from}", src.name)),
                ));
            }
            if !matches!(src.source_type.as_str(), "" | "consul") {
                return Err(ValidationError::new(
                    format!("{at}.Type"),
                    Problem::Invalid(format!(
                        "unsupported source type {:?}: expected consul",
                        src.source_type
                    )),
                ));
            }
            match (&src.action, src.permissions.is_empty()) {
                (Some(_), false) => {
                    return Err(ValidationError::new(
                        format!("{at}.Action"),
                        Problem::NotAllowed("together with Permissions: set one or the other"),
                    ));
                }
                (None, true) => {
                    return Err(ValidationError::new(
                        format!("{at}.Action"),
                        Problem::Required("(or Permissions)"),
                    ));
                }
                _ => {}
            }
            for (j, perm) in src.permissions.iter().enumerate() {
                let pat = format!("{at}.Permissions[{j}].HTTP");
                let Some(http) = &perm.http else {
                    return Err(ValidationError::new(pat, Problem::Required("")));
                };
                http.validate(&pat)?;
                if let Some(jwt) = &perm.jwt {
                    jwt.validate(&format!("{at}.Permissions[{j}].JWT"))?;
                }
            }
        }
        if let Some(jwt) = &self.jwt {
            jwt.validate("JWT")?;
        }
        Ok(())
    }
}

impl ServiceIntentions {
    /// Every provider name the entry refers to, with the field naming it.
    pub fn jwt_provider_refs(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        if let Some(jwt) = &self.jwt {
            out.extend(jwt.provider_fields("JWT").map(|(f, n)| (f, n.to_owned())));
        }
        for (i, src) in self.sources.iter().enumerate() {
            for (j, perm) in src.permissions.iter().enumerate() {
                if let Some(jwt) = &perm.jwt {
                    let at = format!("Sources[{i}].Permissions[{j}].JWT");
                    out.extend(jwt.provider_fields(&at).map(|(f, n)| (f, n.to_owned())));
                }
            }
        }
        out
    }
}

impl IntentionHttpPermission {
    /// Checks an HTTP permission at `pat`: one path form at most, paths from `/`, regular
    /// expressions, header matches and methods.
    fn validate(&self, pat: &str) -> Result<(), ValidationError> {
        let paths = [&self.path_exact, &self.path_prefix, &self.path_regex]
            .iter()
            .filter(|p| !p.is_empty())
            .count();
        if paths > 1 {
            return Err(ValidationError::new(
                format!("{pat}.PathExact"),
                Problem::Invalid("set at most one of PathExact, PathPrefix and PathRegex".into()),
            ));
        }
        for p in [&self.path_exact, &self.path_prefix] {
            if !p.is_empty() && !p.starts_with('/') {
                return Err(ValidationError::new(
                    format!("{pat}.PathPrefix"),
                    Problem::Invalid(format!("{p:?} must begin with '/'")),
                ));
            }
        }
        super::routing::check_regex(&format!("{pat}.PathRegex"), &self.path_regex)?;
        for (k, h) in self.header.iter().enumerate() {
            let at = format!("{pat}.Header[{k}]");
            super::routing::check_header_match(
                &at,
                &h.name,
                &[
                    ("Present", h.present),
                    ("Exact", !h.exact.is_empty()),
                    ("Prefix", !h.prefix.is_empty()),
                    ("Suffix", !h.suffix.is_empty()),
                    ("Contains", !h.contains.is_empty()),
                ],
                &h.regex,
            )?;
            if h.ignore_case
                && [&h.exact, &h.prefix, &h.suffix, &h.contains]
                    .iter()
                    .all(|v| v.is_empty())
            {
                return Err(ValidationError::new(
                    format!("{at}.IgnoreCase"),
                    Problem::Invalid("applies only to Exact, Prefix, Suffix or Contains".into()),
                ));
            }
        }
        for (k, m) in self.methods.iter().enumerate() {
            super::routing::check_method(&format!("{pat}.Methods[{k}]"), m)?;
        }
        Ok(())
    }
}
