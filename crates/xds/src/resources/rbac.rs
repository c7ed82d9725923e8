//! Intentions as RBAC rules: one [`Rbac`] for the HTTP RBAC filter of listeners that speak
//! HTTP ([`rules_http`]), one for the network RBAC filter of TCP listeners ([`rules_l4`]).
//!
//! Intentions are evaluated in precedence order ([`Intention::evaluation_order`]): for a
//! given source, the highest-precedence intention whose source matches decides, alone. An
//! intention with an `Action` decides the whole connection (or every request of it); one with
//! `Permissions` decides per request: its permissions are tried in order, the first that
//! matches applies its action, and a request that none matches gets the default (never a
//! lower-precedence intention).
//!
//! The RBAC is the mirror of the mesh's default. With a default of allow its action is DENY
//! and its policies describe what is denied; with a default of deny its action is ALLOW and
//! they describe what is allowed. The "wanted" action below is the one the policies describe:
//! - `consul-intentions-layer4`: every source whose deciding intention has the wanted action,
//!   with permission `any`.
//! - `consul-intentions-layer7-<n>`: one policy per intention with permissions (on HTTP
//!   listeners) that has some of the wanted action, numbered from 0 in evaluation order, its
//!   sources as principal; permission k of the wanted action is
//!   `match(k) AND NOT match(j)` for every earlier permission j of the other action (so the
//!   first match wins).
//!
//! A wildcard-source intention excludes the sources that a more precise intention decides
//! (`not_id` of each), and nothing after a wildcard intention ever decides, so it produces no
//! rule. Sources match on the client certificate's SPIFFE id in any datacenter.
//!
//! A TCP listener cannot see requests, so an intention with permissions fails closed there:
//! it counts as a deny for its source. An intention with neither an action nor permissions
//! (invalid) is a deny too.
//!
//! Envoy's `policies` is a map, which prost encodes in (random) hash order; the content
//! version of a resource is the hash of its encoding, so [`http_filter_config`] and
//! [`network_filter_config`] encode the policies in name order instead.

use envoy_types::pb::envoy::config::rbac::v3::{
    MetadataSource, Permission, Policy, Principal, Rbac, SourcedMetadata, permission, principal, rbac,
};
use envoy_types::pb::envoy::config::route::v3::{HeaderMatcher, header_matcher};
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    ListMatcher, MetadataMatcher, PathMatcher, RegexMatcher, StringMatcher, ValueMatcher, list_matcher,
    metadata_matcher, path_matcher, string_matcher, value_matcher,
};
use envoy_types::pb::google::protobuf::Any;
use prost::{Message, Name};
use std::collections::{BTreeMap, BTreeSet};
use structs::Intention;
use structs::config_entry::{
    IntentionAction, IntentionHttpHeaderPermission, IntentionJwtClaimVerification, IntentionJwtRequirement,
    IntentionPermission,
};

#[cfg(test)]
mod tests;

/// Name of the policy of the sources decided by an L4 intention.
const LAYER4: &str = "consul-intentions-layer4";

/// The policy name of the `n`-th intention with permissions.
fn layer7_name(n: usize) -> String {
    format!("consul-intentions-layer7-{n}")
}

/// The trust domains a listener accepts callers from: its own cluster's and, by peer name,
/// those of the peers whose roots it trusts. With no peer, a source's SPIFFE id matches in
/// any trust domain (only this cluster's roots verify a caller); with peers, each
/// intention's sources match in their own trust domain only (a peer's `web` is not this
/// cluster's `web`), and an intention naming a peer not trusted here decides nothing (its
/// callers fail the TLS handshake).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Trust<'a> {
    /// This cluster's trust domain.
    pub(crate) local: &'a str,
    /// The trusted peers' trust domains, by peer name.
    pub(crate) peers: Option<&'a BTreeMap<String, String>>,
}

impl Trust<'_> {
    /// The host pattern of `peer`'s (empty: this cluster's) SPIFFE ids; `None` for a peer
    /// not trusted here.
    fn host(&self, peer: &str) -> Option<String> {
        match self.peers.filter(|p| !p.is_empty()) {
            None if peer.is_empty() => Some("[^/]+".to_owned()),
            None => None,
            Some(_) if peer.is_empty() => Some(regex_escape(self.local)),
            Some(peers) => peers.get(peer).map(|td| regex_escape(td)),
        }
    }
}

/// RBAC rules for the HTTP RBAC filter, from `intentions` (any order); `None` when every
/// request is allowed.
pub(crate) fn rules_http(intentions: &[Intention], default_allow: bool) -> Option<Rbac> {
    rules(intentions, default_allow, true, Trust::default())
}

/// RBAC rules for the network RBAC filter, from `intentions` (any order); `None` when every
/// connection is allowed. Intentions with permissions deny their source (fail closed).
pub(crate) fn rules_l4(intentions: &[Intention], default_allow: bool) -> Option<Rbac> {
    rules(intentions, default_allow, false, Trust::default())
}

/// [`rules_http`] for callers of the trust domains of `trust`.
pub(crate) fn rules_http_trusting(intentions: &[Intention], default_allow: bool, trust: Trust<'_>) -> Option<Rbac> {
    rules(intentions, default_allow, true, trust)
}

/// [`rules_l4`] for callers of the trust domains of `trust`.
pub(crate) fn rules_l4_trusting(intentions: &[Intention], default_allow: bool, trust: Trust<'_>) -> Option<Rbac> {
    rules(intentions, default_allow, false, trust)
}

/// What an intention does on a listener of the kind being built.
#[derive(Clone)]
enum Effect {
    /// Decides every connection or request of its sources.
    Whole(IntentionAction),
    /// Decides per request: the first rule that matches applies its action.
    Requests(Vec<Rule>),
}

/// One per-request rule of an intention.
#[derive(Clone)]
struct Rule {
    action: IntentionAction,
    matches: Permission,
}

fn effect(ixn: &Intention, http: bool) -> Effect {
    // No action and no permissions is invalid: deny rather than guess.
    let action = ixn.action.unwrap_or(IntentionAction::Deny);
    if !http {
        // An L4 filter can neither evaluate permissions nor check tokens: fail closed.
        return if ixn.permissions.is_empty() && ixn.jwt.is_none() {
            Effect::Whole(action)
        } else {
            Effect::Whole(IntentionAction::Deny)
        };
    }
    let mut rules = Vec::new();
    // The entry's token requirement comes first: a request without it is refused, whatever
    // the intention would have done.
    if let Some(jwt) = &ixn.jwt {
        rules.push(Rule {
            action: IntentionAction::Deny,
            matches: not(jwt_match(jwt)),
        });
    }
    if ixn.permissions.is_empty() {
        if rules.is_empty() || action == IntentionAction::Deny {
            return Effect::Whole(action);
        }
        rules.push(Rule { action, matches: any() });
    } else {
        rules.extend(ixn.permissions.iter().map(|p| Rule {
            action: p.action,
            matches: permission_match(p),
        }));
    }
    Effect::Requests(rules)
}

fn rules(intentions: &[Intention], default_allow: bool, http: bool, trust: Trust<'_>) -> Option<Rbac> {
    let wanted = if default_allow {
        IntentionAction::Deny
    } else {
        IntentionAction::Allow
    };
    let mut ordered: Vec<&Intention> = intentions.iter().collect();
    ordered.sort_by(|a, b| Intention::evaluation_order(a, b));
    // The intentions that decide for some source: the first per source (`web → api`
    // shadows `web → *`), and none after a wildcard source of the same cluster or peer (it
    // matches every source there). Intentions of peers not trusted here decide nothing.
    let mut seen = BTreeSet::new();
    let mut wildcards = BTreeSet::new();
    let mut deciding: Vec<(&Intention, Effect, String)> = Vec::new();
    for ixn in ordered {
        let peer = ixn.source_peer.as_str();
        let Some(host) = trust.host(peer) else { continue };
        if wildcards.contains(peer) || !seen.insert((peer, ixn.source_name.as_str())) {
            continue;
        }
        deciding.push((ixn, effect(ixn, http), host));
        if ixn.source_name == structs::intention::WILDCARD {
            wildcards.insert(peer);
        }
    }
    let mut layer4 = Vec::new();
    let mut policies = BTreeMap::new();
    let mut layer7 = 0;
    for (i, (ixn, eff, host)) in deciding.iter().enumerate() {
        match eff {
            Effect::Whole(action) if *action == wanted => layer4.push(principal(ixn, host, &deciding[..i], wanted)),
            Effect::Whole(_) => {}
            Effect::Requests(rules) => {
                let permissions = request_permissions(rules, wanted);
                if !permissions.is_empty() {
                    policies.insert(
                        layer7_name(layer7),
                        Policy {
                            permissions,
                            principals: vec![principal(ixn, host, &deciding[..i], wanted)],
                            ..Default::default()
                        },
                    );
                    layer7 += 1;
                }
            }
        }
    }
    if !layer4.is_empty() {
        policies.insert(
            LAYER4.to_owned(),
            Policy {
                permissions: vec![any()],
                principals: layer4,
                ..Default::default()
            },
        );
    }
    if default_allow && policies.is_empty() {
        return None;
    }
    let action = if default_allow {
        rbac::Action::Deny
    } else {
        rbac::Action::Allow
    };
    Some(Rbac {
        action: action as i32,
        policies: policies.into_iter().collect(),
        ..Default::default()
    })
}

/// The sources `ixn` decides for: its own, less those of the more precise intentions
/// evaluated before it (`earlier`). An earlier intention that puts its sources in the layer-4
/// policy needs no exception: everything of theirs is in the policy already.
fn principal(
    ixn: &Intention,
    host: &str,
    earlier: &[(&Intention, Effect, String)],
    wanted: IntentionAction,
) -> Principal {
    let own = source_principal_in(&ixn.source_name, host);
    let exceptions: Vec<Principal> = earlier
        .iter()
        .filter(|(o, eff, _)| {
            !matches!(eff, Effect::Whole(a) if *a == wanted)
                && o.source_name != ixn.source_name
                && ixn.matches_peer_source(&o.source_peer, &o.source_name)
        })
        .map(|(o, _, host)| Principal {
            identifier: Some(principal::Identifier::NotId(Box::new(source_principal_in(
                &o.source_name,
                host,
            )))),
        })
        .collect();
    if exceptions.is_empty() {
        return own;
    }
    let mut ids = vec![own];
    ids.extend(exceptions);
    Principal {
        identifier: Some(principal::Identifier::AndIds(principal::Set { ids })),
    }
}

/// The principal of `source` in any trust domain.
#[cfg(test)]
fn source_principal(source: &str) -> Principal {
    source_principal_in(source, "[^/]+")
}

/// The principal of `source` in the trust domains `host` (a regex) matches.
fn source_principal_in(source: &str, host: &str) -> Principal {
    let service = if source == structs::intention::WILDCARD {
        "[^/]+".to_owned()
    } else {
        regex_escape(source)
    };
    Principal {
        identifier: Some(principal::Identifier::Authenticated(principal::Authenticated {
            principal_name: Some(StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::SafeRegex(regex(format!(
                    "^spiffe://{host}/ns/default/dc/[^/]+/svc/{service}$"
                )))),
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

fn regex(regex: String) -> RegexMatcher {
    RegexMatcher {
        regex,
        ..Default::default()
    }
}

/// The Envoy permissions of the requests that `rules` (first match wins) give the `wanted`
/// action: each rule of that action, less the earlier ones of the other action.
fn request_permissions(rules: &[Rule], wanted: IntentionAction) -> Vec<Permission> {
    let mut out = Vec::new();
    let mut earlier_other: Vec<Permission> = Vec::new();
    for rule in rules {
        let matched = rule.matches.clone();
        if rule.action == wanted {
            let mut all = vec![matched];
            all.extend(earlier_other.iter().cloned().map(not));
            out.push(and(all));
        } else if is_any(&matched) {
            // Every later permission is shadowed.
            break;
        } else {
            earlier_other.push(matched);
        }
    }
    out
}

/// The requests one permission matches: all of its HTTP conditions, and its token
/// requirement.
fn permission_match(perm: &IntentionPermission) -> Permission {
    let mut parts = Vec::new();
    if let Some(jwt) = &perm.jwt {
        parts.push(jwt_match(jwt));
    }
    let Some(http) = &perm.http else {
        return and(parts);
    };
    let path = |pattern| Permission {
        rule: Some(permission::Rule::UrlPath(PathMatcher {
            rule: Some(path_matcher::Rule::Path(string_match(pattern))),
        })),
    };
    if !http.path_exact.is_empty() {
        parts.push(path(string_matcher::MatchPattern::Exact(http.path_exact.clone())));
    }
    if !http.path_prefix.is_empty() {
        parts.push(path(string_matcher::MatchPattern::Prefix(http.path_prefix.clone())));
    }
    if !http.path_regex.is_empty() {
        parts.push(path(string_matcher::MatchPattern::SafeRegex(regex(
            http.path_regex.clone(),
        ))));
    }
    parts.extend(http.header.iter().map(header_permission));
    if !http.methods.is_empty() {
        parts.push(or(http
            .methods
            .iter()
            .map(|m| {
                header(
                    ":method",
                    header_matcher::HeaderMatchSpecifier::StringMatch(string_match(
                        string_matcher::MatchPattern::Exact(m.clone()),
                    )),
                    false,
                )
            })
            .collect()));
    }
    and(parts)
}

/// One header condition. A condition with only a name means the header is present; one that
/// (invalidly) sets several value conditions requires them all (inverted: the header is
/// present and fails one of them).
fn header_permission(h: &IntentionHttpHeaderPermission) -> Permission {
    use header_matcher::HeaderMatchSpecifier::{PresentMatch, StringMatch};
    use string_matcher::MatchPattern;
    let mut specs = Vec::new();
    let value = |pattern| {
        StringMatch(StringMatcher {
            match_pattern: Some(pattern),
            ignore_case: h.ignore_case,
        })
    };
    if !h.exact.is_empty() {
        specs.push(value(MatchPattern::Exact(h.exact.clone())));
    }
    if !h.prefix.is_empty() {
        specs.push(value(MatchPattern::Prefix(h.prefix.clone())));
    }
    if !h.suffix.is_empty() {
        specs.push(value(MatchPattern::Suffix(h.suffix.clone())));
    }
    if !h.contains.is_empty() {
        specs.push(value(MatchPattern::Contains(h.contains.clone())));
    }
    if !h.regex.is_empty() {
        specs.push(StringMatch(string_match(MatchPattern::SafeRegex(regex(
            h.regex.clone(),
        )))));
    }
    if specs.is_empty() {
        specs.push(PresentMatch(true));
    }
    if specs.len() == 1
        && let Some(spec) = specs.pop()
    {
        return header(&h.name, spec, h.invert);
    }
    let all = and(specs.into_iter().map(|s| header(&h.name, s, false)).collect());
    if h.invert {
        // Like an inverted single condition, never matches an absent header.
        and(vec![header(&h.name, PresentMatch(true), false), not(all)])
    } else {
        all
    }
}

fn header(name: &str, spec: header_matcher::HeaderMatchSpecifier, invert: bool) -> Permission {
    Permission {
        rule: Some(permission::Rule::Header(HeaderMatcher {
            name: name.to_owned(),
            invert_match: invert,
            header_match_specifier: Some(spec),
            ..Default::default()
        })),
    }
}

fn string_match(pattern: string_matcher::MatchPattern) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(pattern),
        ..Default::default()
    }
}

fn any() -> Permission {
    Permission {
        rule: Some(permission::Rule::Any(true)),
    }
}

fn is_any(p: &Permission) -> bool {
    matches!(p.rule, Some(permission::Rule::Any(true)))
}

fn not(p: Permission) -> Permission {
    match p.rule {
        Some(permission::Rule::NotRule(inner)) => *inner,
        rule => Permission {
            rule: Some(permission::Rule::NotRule(Box::new(Permission { rule }))),
        },
    }
}

/// The requests whose token satisfies `req`: one of its providers verified a token (its
/// payload is in the JWT filter's metadata) holding every claim listed for it.
fn jwt_match(req: &IntentionJwtRequirement) -> Permission {
    or(req
        .providers
        .iter()
        .map(|p| {
            let key = super::jwt::payload_key(&p.name);
            let mut parts = vec![metadata(
                &key,
                &[],
                ValueMatcher {
                    match_pattern: Some(value_matcher::MatchPattern::PresentMatch(true)),
                },
            )];
            parts.extend(p.verify_claims.iter().map(|c| claim_match(&key, c)));
            and(parts)
        })
        .collect())
}

/// A claim at `c.Path` of the payload under `key`: the string `c.Value`, or a list holding it.
fn claim_match(key: &str, c: &IntentionJwtClaimVerification) -> Permission {
    let exact = || ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::StringMatch(string_match(
            string_matcher::MatchPattern::Exact(c.value.clone()),
        ))),
    };
    let in_list = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(ListMatcher {
            match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(exact()))),
        }))),
    };
    or(vec![metadata(key, &c.path, exact()), metadata(key, &c.path, in_list)])
}

/// The JWT filter's dynamic metadata at `key` then `path` matching `value`.
fn metadata(key: &str, path: &[String], value: ValueMatcher) -> Permission {
    let segment = |k: &str| metadata_matcher::PathSegment {
        segment: Some(metadata_matcher::path_segment::Segment::Key(k.to_owned())),
    };
    Permission {
        rule: Some(permission::Rule::SourcedMetadata(SourcedMetadata {
            metadata_matcher: Some(MetadataMatcher {
                filter: super::jwt::FILTER.to_owned(),
                path: std::iter::once(key)
                    .chain(path.iter().map(String::as_str))
                    .map(segment)
                    .collect(),
                value: Some(value),
                ..Default::default()
            }),
            // The request's dynamic metadata, where the JWT filter puts payloads.
            metadata_source: MetadataSource::Dynamic as i32,
        })),
    }
}

/// All of `parts` (flattened; `any` when there are none).
fn and(parts: Vec<Permission>) -> Permission {
    let mut rules = Vec::new();
    for p in parts {
        match p.rule {
            Some(permission::Rule::AndRules(set)) => rules.extend(set.rules),
            Some(permission::Rule::Any(true)) => {}
            _ => rules.push(p),
        }
    }
    if rules.len() > 1 {
        Permission {
            rule: Some(permission::Rule::AndRules(permission::Set { rules })),
        }
    } else {
        rules.pop().unwrap_or_else(any)
    }
}

/// Any of `parts` (nothing matches when there are none).
fn or(mut parts: Vec<Permission>) -> Permission {
    if parts.len() > 1 {
        Permission {
            rule: Some(permission::Rule::OrRules(permission::Set { rules: parts })),
        }
    } else {
        parts.pop().unwrap_or_else(|| not(any()))
    }
}

/// [`Rbac`] with its policies as a list in name order: the same encoding as the map's (a
/// map is a repeated key/value entry), in an order that does not change between builds.
#[derive(Clone, PartialEq, prost::Message)]
struct OrderedRbac {
    #[prost(int32, tag = "1")]
    action: i32,
    #[prost(message, repeated, tag = "2")]
    policies: Vec<PolicyEntry>,
    #[prost(message, optional, tag = "3")]
    audit_logging_options: Option<rbac::AuditLoggingOptions>,
}

/// One entry of [`Rbac::policies`] on the wire.
#[derive(Clone, PartialEq, prost::Message)]
struct PolicyEntry {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, tag = "2")]
    policy: Option<Policy>,
}

/// The `rules` field (1) of both RBAC filters' configurations.
#[derive(Clone, PartialEq, prost::Message)]
struct RulesField {
    #[prost(message, optional, tag = "1")]
    rules: Option<OrderedRbac>,
}

/// `config` with `rules` in its `rules` field (1 in both filters), encoded in a stable order:
/// the rules' field first, then the rest of the configuration (protobuf fields may come in
/// any order; this is the order prost itself writes).
fn pack_with_rules<T: Message + Name>(rules: Rbac, config: &T) -> Any {
    let mut policies: Vec<PolicyEntry> = rules
        .policies
        .into_iter()
        .map(|(name, policy)| PolicyEntry {
            name,
            policy: Some(policy),
        })
        .collect();
    policies.sort_by(|a, b| a.name.cmp(&b.name));
    let mut value = RulesField {
        rules: Some(OrderedRbac {
            action: rules.action,
            policies,
            audit_logging_options: rules.audit_logging_options,
        }),
    }
    .encode_to_vec();
    value.extend(config.encode_to_vec());
    Any {
        type_url: T::type_url(),
        value,
    }
}

/// The HTTP RBAC filter's configuration enforcing `rules`, encoded in a stable order.
pub(crate) fn http_filter_config(rules: Rbac) -> Any {
    pack_with_rules(rules, &HttpRbac::default())
}

/// The network RBAC filter's configuration enforcing `rules`, encoded in a stable order.
pub(crate) fn network_filter_config(rules: Rbac, stat_prefix: &str) -> Any {
    pack_with_rules(
        rules,
        &NetworkRbac {
            stat_prefix: stat_prefix.to_owned(),
            ..Default::default()
        },
    )
}
