//! Intentions as RBAC rules.
//!
//! With the mesh's default of allow, the rules deny the sources of deny intentions; a deny
//! for `*` excludes the sources that a more precise allow intention lets in. With a default of
//! deny it is the mirror image. Sources match on the client certificate's SPIFFE id in any
//! datacenter. Intentions with L7 permissions apply to HTTP listeners only and are not
//! evaluated here yet: they are skipped (an L4 listener cannot see requests).

use envoy_types::pb::envoy::config::rbac::v3::{Permission, Policy, Principal, Rbac, permission, principal, rbac};
use envoy_types::pb::envoy::r#type::matcher::v3::{RegexMatcher, StringMatcher, string_matcher};
use structs::Intention;
use structs::config_entry::IntentionAction;

fn source_principal(source: &str) -> Principal {
    let service = if source == structs::intention::WILDCARD {
        "[^/]+".to_owned()
    } else {
        regex_escape(source)
    };
    Principal {
        identifier: Some(principal::Identifier::Authenticated(principal::Authenticated {
            principal_name: Some(StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::SafeRegex(RegexMatcher {
                    regex: format!("^spiffe://[^/]+/ns/default/dc/[^/]+/svc/{service}$"),
                    ..Default::default()
                })),
                ..Default::default()
            }),
        })),
    }
}

fn regex_escape(s: &str) -> String {
    s.chars().fold(String::new(), |mut out, c| {
        if !c.is_ascii_alphanumeric() && c != '-' && c != '_' {
            out.push('\\');
        }
        out.push(c);
        out
    })
}

/// RBAC rules for `intentions` (any order) or `None` when every connection is allowed.
pub(crate) fn rules(intentions: &[Intention], default_allow: bool) -> Option<Rbac> {
    let mut ordered: Vec<&Intention> = intentions.iter().filter(|i| i.permissions.is_empty()).collect();
    ordered.sort_by(|a, b| Intention::evaluation_order(a, b));
    let wanted = if default_allow {
        IntentionAction::Deny
    } else {
        IntentionAction::Allow
    };
    let mut principals = Vec::new();
    for (i, ixn) in ordered.iter().enumerate() {
        if ixn.action != Some(wanted) {
            continue;
        }
        // More precise intentions of the other action, evaluated first, carve out exceptions.
        let exceptions: Vec<Principal> = ordered[..i]
            .iter()
            .filter(|o| {
                o.action != Some(wanted) && o.source_name != ixn.source_name && ixn.matches_source(&o.source_name)
            })
            .map(|o| source_principal(&o.source_name))
            .collect();
        let principal = if exceptions.is_empty() {
            source_principal(&ixn.source_name)
        } else {
            let mut ids = vec![source_principal(&ixn.source_name)];
            ids.extend(exceptions.into_iter().map(|p| Principal {
                identifier: Some(principal::Identifier::NotId(Box::new(p))),
            }));
            Principal {
                identifier: Some(principal::Identifier::AndIds(principal::Set { ids })),
            }
        };
        principals.push(principal);
    }
    if default_allow && principals.is_empty() {
        return None;
    }
    let action = if default_allow {
        rbac::Action::Deny
    } else {
        rbac::Action::Allow
    };
    let policies = if principals.is_empty() {
        Default::default()
    } else {
        [(
            "consul-intentions-layer4".to_owned(),
            Policy {
                permissions: vec![Permission {
                    rule: Some(permission::Rule::Any(true)),
                }],
                principals,
                ..Default::default()
            },
        )]
        .into_iter()
        .collect()
    };
    Some(Rbac {
        action: action as i32,
        policies,
        ..Default::default()
    })
}
