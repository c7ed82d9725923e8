//! The rules are checked two ways: their exact shape for the readable cases, and their
//! meaning for all of them: a small interpreter of Envoy's RBAC (as Envoy evaluates it) must
//! agree, on a grid of requests, with a direct evaluation of the intentions (Consul's
//! semantics, written independently of the Envoy structures).

use super::*;
use envoy_types::util::pack_any;
use structs::config_entry::IntentionHttpPermission;

use IntentionAction::{Allow, Deny};

// ---- building intentions ----

fn ixn_to(src: &str, dst: &str) -> Intention {
    let mut i = Intention {
        source_ns: "default".into(),
        source_name: src.into(),
        destination_ns: "default".into(),
        destination_name: dst.into(),
        ..Default::default()
    };
    i.update_precedence();
    i
}

/// An L4 intention `src → api`.
fn l4(src: &str, action: IntentionAction) -> Intention {
    Intention {
        action: Some(action),
        ..ixn_to(src, "api")
    }
}

/// An L7 intention `src → api`.
fn l7(src: &str, permissions: Vec<IntentionPermission>) -> Intention {
    Intention {
        permissions,
        ..ixn_to(src, "api")
    }
}

fn perm(action: IntentionAction, http: IntentionHttpPermission) -> IntentionPermission {
    IntentionPermission {
        action,
        http: Some(http),
        jwt: None,
    }
}

fn prefix(action: IntentionAction, p: &str) -> IntentionPermission {
    perm(
        action,
        IntentionHttpPermission {
            path_prefix: p.into(),
            ..Default::default()
        },
    )
}

fn exact(action: IntentionAction, p: &str) -> IntentionPermission {
    perm(
        action,
        IntentionHttpPermission {
            path_exact: p.into(),
            ..Default::default()
        },
    )
}

fn methods(action: IntentionAction, ms: &[&str]) -> IntentionPermission {
    perm(
        action,
        IntentionHttpPermission {
            methods: ms.iter().map(|m| (*m).to_owned()).collect(),
            ..Default::default()
        },
    )
}

fn hdr(name: &str) -> IntentionHttpHeaderPermission {
    IntentionHttpHeaderPermission {
        name: name.into(),
        ..Default::default()
    }
}

fn headers(action: IntentionAction, hs: Vec<IntentionHttpHeaderPermission>) -> IntentionPermission {
    perm(
        action,
        IntentionHttpPermission {
            header: hs,
            ..Default::default()
        },
    )
}

// ---- building expected Envoy structures ----

fn src(name: &str) -> Principal {
    source_principal(name)
}

fn except(name: &str, exceptions: &[&str]) -> Principal {
    let mut ids = vec![src(name)];
    ids.extend(exceptions.iter().map(|e| Principal {
        identifier: Some(principal::Identifier::NotId(Box::new(src(e)))),
    }));
    Principal {
        identifier: Some(principal::Identifier::AndIds(principal::Set { ids })),
    }
}

fn path_prefix(p: &str) -> Permission {
    Permission {
        rule: Some(permission::Rule::UrlPath(PathMatcher {
            rule: Some(path_matcher::Rule::Path(string_match(
                string_matcher::MatchPattern::Prefix(p.into()),
            ))),
        })),
    }
}

fn path_exact(p: &str) -> Permission {
    Permission {
        rule: Some(permission::Rule::UrlPath(PathMatcher {
            rule: Some(path_matcher::Rule::Path(string_match(
                string_matcher::MatchPattern::Exact(p.into()),
            ))),
        })),
    }
}

fn and_of(rules: Vec<Permission>) -> Permission {
    Permission {
        rule: Some(permission::Rule::AndRules(permission::Set { rules })),
    }
}

fn policy(principals: Vec<Principal>, permissions: Vec<Permission>) -> Policy {
    Policy {
        principals,
        permissions,
        ..Default::default()
    }
}

fn rbac_of(action: rbac::Action, policies: Vec<(&str, Policy)>) -> Rbac {
    Rbac {
        action: action as i32,
        policies: policies.into_iter().map(|(n, p)| (n.to_owned(), p)).collect(),
        ..Default::default()
    }
}

// ---- an interpreter of Envoy's RBAC ----

#[derive(Debug, Clone)]
struct Request {
    source: &'static str,
    method: &'static str,
    path: &'static str,
    headers: Vec<(&'static str, &'static str)>,
    /// The provider that verified the request's token, and the token's payload.
    jwt: Option<(&'static str, serde_json::Value)>,
}

impl Request {
    /// What the JWT filter put in the dynamic metadata at `path` (payload key first).
    fn jwt_metadata(&self, path: &[&str]) -> Option<&serde_json::Value> {
        let (provider, payload) = self.jwt.as_ref()?;
        let (key, rest) = path.split_first()?;
        if *key != crate::resources::jwt::payload_key(provider) {
            return None;
        }
        rest.iter().try_fold(payload, |v, k| v.get(k))
    }
}

impl Request {
    fn header(&self, name: &str) -> Option<&'static str> {
        if name == ":method" {
            return Some(self.method);
        }
        let values: Vec<&str> = self
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
            .collect();
        // Envoy joins repeated headers with commas; the grid never repeats one.
        assert!(values.len() <= 1);
        values.first().copied()
    }
}

fn string_matches(m: &StringMatcher, value: &str) -> bool {
    // Envoy's `ignore_case` lowers both sides (ASCII).
    let fold = |s: &str| {
        if m.ignore_case {
            s.to_ascii_lowercase()
        } else {
            s.to_owned()
        }
    };
    let value = fold(value);
    match m.match_pattern.as_ref().expect("pattern") {
        string_matcher::MatchPattern::Exact(e) => value == fold(e),
        string_matcher::MatchPattern::Prefix(p) => value.starts_with(&fold(p)),
        string_matcher::MatchPattern::Suffix(s) => value.ends_with(&fold(s)),
        string_matcher::MatchPattern::Contains(c) => value.contains(&fold(c)),
        other => panic!("the interpreter does not evaluate {other:?}"),
    }
}

/// The service of a source principal (`None` for the wildcard).
fn principal_service(m: &StringMatcher) -> Option<String> {
    let Some(string_matcher::MatchPattern::SafeRegex(r)) = &m.match_pattern else {
        panic!("principals are regexes: {m:?}");
    };
    let service = r
        .regex
        .strip_prefix("^spiffe://[^/]+/ns/default/dc/[^/]+/svc/")
        .and_then(|s| s.strip_suffix('$'))
        .expect("a SPIFFE id pattern");
    (service != "[^/]+").then(|| service.replace('\\', ""))
}

fn principal_matches(p: &Principal, source: &str) -> bool {
    match p.identifier.as_ref().expect("identifier") {
        principal::Identifier::Authenticated(a) => {
            principal_service(a.principal_name.as_ref().expect("name")).is_none_or(|s| s == source)
        }
        principal::Identifier::AndIds(set) => set.ids.iter().all(|p| principal_matches(p, source)),
        principal::Identifier::OrIds(set) => set.ids.iter().any(|p| principal_matches(p, source)),
        principal::Identifier::NotId(p) => !principal_matches(p, source),
        principal::Identifier::Any(any) => *any,
        other => panic!("unexpected principal {other:?}"),
    }
}

/// Envoy's `HeaderUtility::matchHeaders`: a missing header matches only a present-match
/// (absence when inverted or with `present_match: false`).
fn header_matches(h: &HeaderMatcher, req: &Request) -> bool {
    use header_matcher::HeaderMatchSpecifier::{PresentMatch, StringMatch};
    assert!(!h.treat_missing_header_as_empty);
    let spec = h.header_match_specifier.as_ref().expect("specifier");
    let Some(value) = req.header(&h.name) else {
        return match spec {
            PresentMatch(present) => *present == h.invert_match,
            _ => false,
        };
    };
    let matched = match spec {
        PresentMatch(present) => *present,
        StringMatch(m) => string_matches(m, value),
        other => panic!("unexpected header specifier {other:?}"),
    };
    matched != h.invert_match
}

fn permission_matches(p: &Permission, req: &Request, http: bool) -> bool {
    match p.rule.as_ref().expect("rule") {
        permission::Rule::Any(any) => {
            assert!(*any);
            true
        }
        permission::Rule::AndRules(set) => {
            assert!(set.rules.len() > 1, "an and of one is the rule itself");
            set.rules.iter().all(|p| permission_matches(p, req, http))
        }
        permission::Rule::OrRules(set) => {
            assert!(set.rules.len() > 1, "an or of one is the rule itself");
            set.rules.iter().any(|p| permission_matches(p, req, http))
        }
        permission::Rule::NotRule(p) => !permission_matches(p, req, http),
        permission::Rule::UrlPath(PathMatcher {
            rule: Some(path_matcher::Rule::Path(m)),
        }) => {
            assert!(http, "an L4 filter has no path");
            string_matches(m, req.path)
        }
        permission::Rule::Header(h) => {
            assert!(http, "an L4 filter has no headers");
            header_matches(h, req)
        }
        permission::Rule::SourcedMetadata(m) => {
            assert!(http, "an L4 filter has no JWT metadata");
            assert_eq!(m.metadata_source, MetadataSource::Dynamic as i32);
            let m = m.metadata_matcher.as_ref().expect("matcher");
            assert_eq!(m.filter, crate::resources::jwt::FILTER);
            assert!(!m.invert);
            let path: Vec<&str> = m
                .path
                .iter()
                .map(|s| match &s.segment {
                    Some(metadata_matcher::path_segment::Segment::Key(k)) => k.as_str(),
                    None => panic!("empty segment"),
                })
                .collect();
            value_matches(m.value.as_ref().expect("value"), req.jwt_metadata(&path))
        }
        other => panic!("unexpected permission {other:?}"),
    }
}

/// Envoy's `ValueMatcher` on a metadata value (`None`: absent).
fn value_matches(m: &ValueMatcher, value: Option<&serde_json::Value>) -> bool {
    match (m.match_pattern.as_ref().expect("pattern"), value) {
        (value_matcher::MatchPattern::PresentMatch(true), v) => v.is_some(),
        (value_matcher::MatchPattern::StringMatch(sm), Some(serde_json::Value::String(v))) => string_matches(sm, v),
        (value_matcher::MatchPattern::ListMatch(lm), Some(serde_json::Value::Array(items))) => {
            let Some(list_matcher::MatchPattern::OneOf(inner)) = &lm.match_pattern else {
                panic!("list matcher without one_of")
            };
            items.iter().any(|i| value_matches(inner, Some(i)))
        }
        (value_matcher::MatchPattern::StringMatch(_) | value_matcher::MatchPattern::ListMatch(_), _) => false,
        (other, _) => panic!("the interpreter does not evaluate {other:?}"),
    }
}

/// Whether Envoy lets `req` through `rules` (`None`: no filter).
fn envoy_allows(rules: Option<&Rbac>, req: &Request, http: bool) -> bool {
    let Some(rules) = rules else { return true };
    let matched = rules.policies.values().any(|p| {
        assert!(
            !p.principals.is_empty() && !p.permissions.is_empty(),
            "Envoy requires both"
        );
        p.principals.iter().any(|pr| principal_matches(pr, req.source))
            && p.permissions.iter().any(|pe| permission_matches(pe, req, http))
    });
    if rules.action == rbac::Action::Deny as i32 {
        !matched
    } else {
        assert_eq!(rules.action, rbac::Action::Allow as i32);
        matched
    }
}

// ---- the intentions' meaning, directly ----

fn consul_header_matches(h: &IntentionHttpHeaderPermission, req: &Request) -> bool {
    let value_conditions = [&h.exact, &h.prefix, &h.suffix, &h.contains, &h.regex];
    let is_presence = value_conditions.iter().all(|c| c.is_empty());
    match req.header(&h.name) {
        // Envoy (and so Consul): an absent header matches only an inverted presence.
        None => is_presence && h.invert,
        Some(value) => {
            assert!(h.regex.is_empty(), "the model does not evaluate regexes");
            // Consul's IgnoreCase: the value conditions compare without ASCII case.
            let fold = |s: &str| if h.ignore_case { s.to_lowercase() } else { s.to_owned() };
            let value = fold(value);
            let matched = (h.exact.is_empty() || value == fold(&h.exact))
                && value.starts_with(&fold(&h.prefix))
                && value.ends_with(&fold(&h.suffix))
                && value.contains(&fold(&h.contains));
            matched != h.invert
        }
    }
}

/// A token verified by one of the requirement's providers, holding each of its claims (a
/// string equal to the value, or a list holding it).
fn consul_jwt_satisfied(r: &IntentionJwtRequirement, req: &Request) -> bool {
    let Some((provider, payload)) = &req.jwt else {
        return false;
    };
    r.providers.iter().any(|p| {
        p.name == *provider
            && p.verify_claims
                .iter()
                .all(|c| match c.path.iter().try_fold(payload, |v, k| v.get(k)) {
                    Some(serde_json::Value::String(s)) => *s == c.value,
                    Some(serde_json::Value::Array(items)) => items.iter().any(|i| i.as_str() == Some(&c.value)),
                    _ => false,
                })
    })
}

fn consul_permission_matches(p: &IntentionPermission, req: &Request) -> bool {
    if p.jwt.as_ref().is_some_and(|j| !consul_jwt_satisfied(j, req)) {
        return false;
    }
    let Some(http) = &p.http else { return true };
    assert!(http.path_regex.is_empty(), "the model does not evaluate regexes");
    (http.path_exact.is_empty() || req.path == http.path_exact)
        && req.path.starts_with(http.path_prefix.as_str())
        && http.header.iter().all(|h| consul_header_matches(h, req))
        && (http.methods.is_empty() || http.methods.iter().any(|m| m == req.method))
}

/// The highest-precedence intention matching the source decides; permissions in order, the
/// first match wins, none: the default. On L4, permissions cannot be evaluated: deny.
fn consul_allows(intentions: &[Intention], default_allow: bool, http: bool, req: &Request) -> bool {
    let best = intentions
        .iter()
        .filter(|i| i.matches_source(req.source) && i.matches_destination("api"))
        .min_by(|a, b| Intention::evaluation_order(a, b));
    match best {
        None => default_allow,
        // Tokens are checked on HTTP listeners only: elsewhere their sources are refused.
        Some(i) if i.jwt.is_some() && !http => false,
        // A request without the entry's token is refused, whatever the intention says.
        Some(i) if i.jwt.as_ref().is_some_and(|j| !consul_jwt_satisfied(j, req)) => false,
        Some(i) if i.permissions.is_empty() => i.action == Some(Allow),
        Some(_) if !http => false,
        Some(i) => i
            .permissions
            .iter()
            .find(|p| consul_permission_matches(p, req))
            .map_or(default_allow, |p| p.action == Allow),
    }
}

const SOURCES: [&str; 4] = ["web", "db", "admin", "other"];

fn grid() -> Vec<Request> {
    let header_sets: [Vec<(&'static str, &'static str)>; 6] = [
        vec![],
        vec![("x-user", "alice")],
        vec![("x-user", "bob-admin")],
        vec![("x-debug", "1")],
        vec![("x-user", "alice"), ("x-debug", "")],
        vec![("x-user", "Mr-ALICE-Admin")],
    ];
    let tokens = [
        None,
        Some((
            "okta",
            serde_json::json!({"role": "admin", "groups": ["eng", "ops"], "org": {"unit": "eng"}}),
        )),
        Some(("okta", serde_json::json!({"role": "user", "groups": "ops"}))),
        Some(("auth0", serde_json::json!({"role": "admin"}))),
    ];
    let mut out = Vec::new();
    for source in SOURCES {
        for method in ["GET", "POST", "DELETE"] {
            for path in ["/", "/admin", "/admin/x", "/api/v1", "/health"] {
                for headers in &header_sets {
                    for jwt in &tokens {
                        out.push(Request {
                            source,
                            method,
                            path,
                            headers: headers.clone(),
                            jwt: jwt.clone(),
                        });
                    }
                }
            }
        }
    }
    out
}

/// The rules mean the intentions, for both defaults and both kinds of listener.
fn assert_same_meaning(intentions: &[Intention]) {
    for default_allow in [true, false] {
        let http_rules = rules_http(intentions, default_allow);
        let l4_rules = rules_l4(intentions, default_allow);
        for req in grid() {
            assert_eq!(
                envoy_allows(http_rules.as_ref(), &req, true),
                consul_allows(intentions, default_allow, true, &req),
                "HTTP, default allow {default_allow}, {req:?}\nintentions: {intentions:#?}\nrules: {http_rules:#?}"
            );
            assert_eq!(
                envoy_allows(l4_rules.as_ref(), &req, false),
                consul_allows(intentions, default_allow, false, &req),
                "L4, default allow {default_allow}, {req:?}\nintentions: {intentions:#?}\nrules: {l4_rules:#?}"
            );
        }
    }
}

// ---- shapes ----

#[test]
fn no_intentions() {
    assert_eq!(rules_http(&[], true), None);
    assert_eq!(rules_l4(&[], true), None);
    let deny_all = Some(rbac_of(rbac::Action::Allow, vec![]));
    assert_eq!(rules_http(&[], false), deny_all);
    assert_eq!(rules_l4(&[], false), deny_all);
}

#[test]
fn deny_admin_allow_rest_default_allow() {
    let set = [l7("web", vec![prefix(Deny, "/admin"), prefix(Allow, "/")])];
    assert_eq!(
        rules_http(&set, true),
        Some(rbac_of(
            rbac::Action::Deny,
            vec![(
                "consul-intentions-layer7-0",
                policy(vec![src("web")], vec![path_prefix("/admin")])
            )]
        ))
    );
    assert_same_meaning(&set);
}

#[test]
fn deny_admin_allow_rest_default_deny() {
    let set = [l7("web", vec![prefix(Deny, "/admin"), prefix(Allow, "/")])];
    assert_eq!(
        rules_http(&set, false),
        Some(rbac_of(
            rbac::Action::Allow,
            vec![(
                "consul-intentions-layer7-0",
                policy(
                    vec![src("web")],
                    vec![and_of(vec![path_prefix("/"), not(path_prefix("/admin"))])]
                )
            )]
        ))
    );
    assert_same_meaning(&set);
}

#[test]
fn wildcard_with_permissions_and_a_precise_l4_allow() {
    let set = [
        l7("*", vec![prefix(Deny, "/admin"), prefix(Allow, "/")]),
        l4("web", Allow),
    ];
    // Default allow: the wildcard's denials are not web's.
    assert_eq!(
        rules_http(&set, true),
        Some(rbac_of(
            rbac::Action::Deny,
            vec![(
                "consul-intentions-layer7-0",
                policy(vec![except("*", &["web"])], vec![path_prefix("/admin")])
            )]
        ))
    );
    // Default deny: web is allowed everything, so it needs no exception from the wildcard.
    assert_eq!(
        rules_http(&set, false),
        Some(rbac_of(
            rbac::Action::Allow,
            vec![
                ("consul-intentions-layer4", policy(vec![src("web")], vec![any()])),
                (
                    "consul-intentions-layer7-0",
                    policy(
                        vec![src("*")],
                        vec![and_of(vec![path_prefix("/"), not(path_prefix("/admin"))])]
                    )
                ),
            ]
        ))
    );
    assert_same_meaning(&set);
    // And a precise L4 deny: excepted under default deny, part of layer 4 under default allow.
    let set = [l7("*", vec![prefix(Allow, "/api")]), l4("db", Deny)];
    assert_eq!(
        rules_http(&set, false),
        Some(rbac_of(
            rbac::Action::Allow,
            vec![(
                "consul-intentions-layer7-0",
                policy(vec![except("*", &["db"])], vec![path_prefix("/api")])
            )]
        ))
    );
    assert_same_meaning(&set);
}

#[test]
fn a_precise_l7_intention_is_excepted_from_a_wildcard_l4_one() {
    let set = [l4("*", Deny), l7("web", vec![exact(Allow, "/health")])];
    assert_eq!(
        rules_http(&set, true),
        Some(rbac_of(
            rbac::Action::Deny,
            vec![(
                "consul-intentions-layer4",
                policy(vec![except("*", &["web"])], vec![any()])
            )]
        ))
    );
    assert_same_meaning(&set);
}

#[test]
fn methods_and_headers() {
    let set = [l7(
        "web",
        vec![perm(
            Allow,
            IntentionHttpPermission {
                path_regex: "/api/v[0-9]+/.*".into(),
                header: vec![
                    IntentionHttpHeaderPermission {
                        present: true,
                        ..hdr("x-present")
                    },
                    IntentionHttpHeaderPermission {
                        exact: "alice".into(),
                        ..hdr("x-exact")
                    },
                    IntentionHttpHeaderPermission {
                        prefix: "al".into(),
                        ..hdr("x-prefix")
                    },
                    IntentionHttpHeaderPermission {
                        suffix: "ce".into(),
                        invert: true,
                        ..hdr("x-suffix")
                    },
                    IntentionHttpHeaderPermission {
                        regex: "a.*e".into(),
                        ..hdr("x-regex")
                    },
                ],
                methods: vec!["GET".into(), "HEAD".into()],
                ..Default::default()
            },
        )],
    )];
    use header_matcher::HeaderMatchSpecifier::{PresentMatch, StringMatch};
    use string_matcher::MatchPattern;
    let expected = and_of(vec![
        Permission {
            rule: Some(permission::Rule::UrlPath(PathMatcher {
                rule: Some(path_matcher::Rule::Path(string_match(MatchPattern::SafeRegex(regex(
                    "/api/v[0-9]+/.*".into(),
                ))))),
            })),
        },
        header("x-present", PresentMatch(true), false),
        header(
            "x-exact",
            StringMatch(string_match(MatchPattern::Exact("alice".into()))),
            false,
        ),
        header(
            "x-prefix",
            StringMatch(string_match(MatchPattern::Prefix("al".into()))),
            false,
        ),
        header(
            "x-suffix",
            StringMatch(string_match(MatchPattern::Suffix("ce".into()))),
            true,
        ),
        header(
            "x-regex",
            StringMatch(string_match(MatchPattern::SafeRegex(regex("a.*e".into())))),
            false,
        ),
        Permission {
            rule: Some(permission::Rule::OrRules(permission::Set {
                rules: vec![
                    header(
                        ":method",
                        StringMatch(string_match(MatchPattern::Exact("GET".into()))),
                        false,
                    ),
                    header(
                        ":method",
                        StringMatch(string_match(MatchPattern::Exact("HEAD".into()))),
                        false,
                    ),
                ],
            })),
        },
    ]);
    assert_eq!(
        rules_http(&set, false),
        Some(rbac_of(
            rbac::Action::Allow,
            vec![("consul-intentions-layer7-0", policy(vec![src("web")], vec![expected]))]
        ))
    );
    // The regex-free part, by meaning.
    let set = [
        l7(
            "web",
            vec![
                methods(Deny, &["DELETE"]),
                perm(
                    Allow,
                    IntentionHttpPermission {
                        path_prefix: "/api".into(),
                        header: vec![IntentionHttpHeaderPermission {
                            prefix: "al".into(),
                            ..hdr("x-user")
                        }],
                        methods: vec!["GET".into(), "POST".into()],
                        ..Default::default()
                    },
                ),
                headers(
                    Deny,
                    vec![IntentionHttpHeaderPermission {
                        suffix: "admin".into(),
                        ..hdr("x-user")
                    }],
                ),
                headers(Allow, vec![hdr("x-debug")]),
            ],
        ),
        l7("db", vec![methods(Allow, &["GET"])]),
        l4("*", Deny),
    ];
    assert_same_meaning(&set);
}

#[test]
fn invert() {
    let set = [l7(
        "web",
        vec![
            headers(
                Deny,
                vec![IntentionHttpHeaderPermission {
                    exact: "alice".into(),
                    invert: true,
                    ..hdr("x-user")
                }],
            ),
            headers(
                Allow,
                vec![IntentionHttpHeaderPermission {
                    present: true,
                    invert: true,
                    ..hdr("x-debug")
                }],
            ),
        ],
    )];
    use header_matcher::HeaderMatchSpecifier::{PresentMatch, StringMatch};
    let not_alice = header(
        "x-user",
        StringMatch(string_match(string_matcher::MatchPattern::Exact("alice".into()))),
        true,
    );
    assert_eq!(
        rules_http(&set, true),
        Some(rbac_of(
            rbac::Action::Deny,
            vec![(
                "consul-intentions-layer7-0",
                policy(vec![src("web")], vec![not_alice.clone()])
            )]
        ))
    );
    assert_eq!(
        rules_http(&set, false),
        Some(rbac_of(
            rbac::Action::Allow,
            vec![(
                "consul-intentions-layer7-0",
                policy(
                    vec![src("web")],
                    vec![and_of(vec![
                        header("x-debug", PresentMatch(true), true),
                        not(not_alice)
                    ])]
                )
            )]
        ))
    );
    assert_same_meaning(&set);
    // Several value conditions on one header (not meant to be set together) are inverted
    // as a whole, and like one condition never match an absent header.
    let both = headers(
        Deny,
        vec![IntentionHttpHeaderPermission {
            prefix: "bob".into(),
            suffix: "admin".into(),
            invert: true,
            ..hdr("x-user")
        }],
    );
    assert_same_meaning(&[l7("web", vec![both])]);
}

#[test]
fn contains_and_ignore_case() {
    let set = [l7(
        "web",
        vec![
            headers(
                Deny,
                vec![IntentionHttpHeaderPermission {
                    contains: "admin".into(),
                    ignore_case: true,
                    ..hdr("x-user")
                }],
            ),
            headers(
                Allow,
                vec![IntentionHttpHeaderPermission {
                    exact: "ALICE".into(),
                    ignore_case: true,
                    ..hdr("x-user")
                }],
            ),
            headers(
                Allow,
                vec![IntentionHttpHeaderPermission {
                    contains: "ALICE".into(),
                    ..hdr("x-user")
                }],
            ),
        ],
    )];
    use header_matcher::HeaderMatchSpecifier::StringMatch;
    use string_matcher::MatchPattern;
    let Some(rules) = rules_http(&set, false) else {
        panic!("default deny needs rules")
    };
    let text = format!("{rules:?}");
    assert!(
        text.contains("Contains(\"admin\")") && text.contains("ignore_case: true"),
        "{text}"
    );
    assert_eq!(
        header_permission(&IntentionHttpHeaderPermission {
            suffix: "Admin".into(),
            ignore_case: true,
            invert: true,
            ..hdr("x-user")
        }),
        header(
            "x-user",
            StringMatch(StringMatcher {
                match_pattern: Some(MatchPattern::Suffix("Admin".into())),
                ignore_case: true,
            }),
            true,
        )
    );
    assert_same_meaning(&set);
    for invert in [false, true] {
        let one = headers(
            Allow,
            vec![IntentionHttpHeaderPermission {
                contains: "LiC".into(),
                ignore_case: true,
                invert,
                ..hdr("x-user")
            }],
        );
        assert_same_meaning(&[l7("web", vec![one])]);
    }
}

#[test]
fn first_matching_permission_wins() {
    let set = [l7(
        "web",
        vec![
            exact(Allow, "/admin/x"),
            prefix(Deny, "/admin"),
            prefix(Allow, "/"),
            // Shadowed by the allow of everything before it.
            exact(Deny, "/health"),
        ],
    )];
    assert_eq!(
        rules_http(&set, true),
        Some(rbac_of(
            rbac::Action::Deny,
            vec![(
                "consul-intentions-layer7-0",
                policy(
                    vec![src("web")],
                    vec![
                        and_of(vec![path_prefix("/admin"), not(path_exact("/admin/x"))]),
                        and_of(vec![
                            path_exact("/health"),
                            not(path_exact("/admin/x")),
                            not(path_prefix("/"))
                        ]),
                    ]
                )
            )]
        ))
    );
    assert_same_meaning(&set);
    // The same permissions the other way round: the exception never applies.
    assert_same_meaning(&[l7("web", vec![prefix(Deny, "/admin"), exact(Allow, "/admin/x")])]);
    // A permission without conditions matches everything and shadows the rest.
    let catch_all = IntentionPermission {
        action: Allow,
        http: None,
        jwt: None,
    };
    let set = [l7("web", vec![catch_all, prefix(Deny, "/admin")])];
    assert_eq!(rules_http(&set, true), None);
    assert_same_meaning(&set);
}

#[test]
fn l4_fails_closed_on_intentions_with_permissions() {
    let set = [l7("web", vec![prefix(Allow, "/")])];
    assert_eq!(
        rules_l4(&set, true),
        Some(rbac_of(
            rbac::Action::Deny,
            vec![("consul-intentions-layer4", policy(vec![src("web")], vec![any()]))]
        ))
    );
    assert_eq!(rules_l4(&set, false), Some(rbac_of(rbac::Action::Allow, vec![])));
    // A wildcard allow does not let the L7 intention's source in either.
    let set = [l7("web", vec![prefix(Allow, "/")]), l4("*", Allow)];
    assert_eq!(
        rules_l4(&set, false),
        Some(rbac_of(
            rbac::Action::Allow,
            vec![(
                "consul-intentions-layer4",
                policy(vec![except("*", &["web"])], vec![any()])
            )]
        ))
    );
    assert_same_meaning(&set);
    // A wildcard L7 intention on L4 denies everyone it decides for.
    let set = [l7("*", vec![prefix(Allow, "/")]), l4("db", Allow)];
    assert_eq!(
        rules_l4(&set, true),
        Some(rbac_of(
            rbac::Action::Deny,
            vec![(
                "consul-intentions-layer4",
                policy(vec![except("*", &["db"])], vec![any()])
            )]
        ))
    );
    assert_same_meaning(&set);
}

#[test]
fn an_intention_without_action_or_permissions_denies() {
    let set = [ixn_to("web", "api")];
    assert_eq!(
        rules_http(&set, true),
        Some(rbac_of(
            rbac::Action::Deny,
            vec![("consul-intentions-layer4", policy(vec![src("web")], vec![any()]))]
        ))
    );
    assert_eq!(rules_l4(&set, false), Some(rbac_of(rbac::Action::Allow, vec![])));
    assert_same_meaning(&set);
}

/// Only the highest-precedence intention of a source decides: `web → api` shadows
/// `web → *`, and `* → api` (precedence 8) shadows `db → *` (precedence 6).
#[test]
fn shadowed_intentions_make_no_rules() {
    let set = [
        l4("web", Allow),
        Intention {
            action: Some(Deny),
            ..ixn_to("web", "*")
        },
        l4("*", Allow),
        Intention {
            action: Some(Deny),
            ..ixn_to("db", "*")
        },
    ];
    assert_eq!(rules_http(&set, true), None);
    assert_eq!(rules_l4(&set, true), None);
    assert_same_meaning(&set);
    let set = [
        l7("web", vec![prefix(Deny, "/admin")]),
        Intention {
            permissions: vec![prefix(Deny, "/")],
            ..ixn_to("web", "*")
        },
    ];
    assert_same_meaning(&set);
}

#[test]
fn several_intentions_with_permissions() {
    let set = [
        l7("web", vec![prefix(Deny, "/admin"), prefix(Allow, "/")]),
        l7("db", vec![methods(Allow, &["GET"]), prefix(Deny, "/")]),
        l4("admin", Allow),
        l7("*", vec![exact(Allow, "/health")]),
    ];
    let http = rules_http(&set, false).unwrap();
    let names: Vec<&String> = http.policies.keys().collect::<BTreeSet<_>>().into_iter().collect();
    assert_eq!(
        names,
        [
            "consul-intentions-layer4",
            "consul-intentions-layer7-0",
            "consul-intentions-layer7-1",
            "consul-intentions-layer7-2"
        ]
    );
    // Evaluation order among equal precedence is by name: db, then web.
    assert_eq!(http.policies["consul-intentions-layer7-0"].principals, vec![src("db")]);
    assert_eq!(http.policies["consul-intentions-layer7-1"].principals, vec![src("web")]);
    assert_eq!(
        http.policies["consul-intentions-layer7-2"].principals,
        vec![except("*", &["db", "web"])]
    );
    assert_same_meaning(&set);
    // Any order in, the same rules out.
    let mut reversed = set.to_vec();
    reversed.reverse();
    assert_eq!(rules_http(&reversed, false), Some(http));
}

// ---- encoding ----

#[test]
fn filter_configs_encode_policies_in_name_order() {
    let set = [
        l7("web", vec![prefix(Deny, "/admin"), prefix(Allow, "/")]),
        l7("db", vec![methods(Deny, &["DELETE"])]),
        l7("other", vec![exact(Deny, "/x")]),
        l4("admin", Deny),
    ];
    let rules = rules_http(&set, true).unwrap();
    assert_eq!(rules.policies.len(), 4);
    let http = http_filter_config(rules.clone());
    let network = network_filter_config(rules.clone(), "connect_authz");
    assert_eq!(http.type_url, HttpRbac::type_url());
    assert_eq!(network.type_url, NetworkRbac::type_url());
    // The same content, read back.
    assert_eq!(
        HttpRbac::decode(http.value.as_slice()).unwrap(),
        HttpRbac {
            rules: Some(rules.clone()),
            ..Default::default()
        }
    );
    assert_eq!(
        NetworkRbac::decode(network.value.as_slice()).unwrap(),
        NetworkRbac {
            rules: Some(rules.clone()),
            stat_prefix: "connect_authz".into(),
            ..Default::default()
        }
    );
    // The same bytes every time, whatever order the hash map iterates in.
    for _ in 0..20 {
        let again = rules_http(&set, true).unwrap();
        assert_eq!(http_filter_config(again.clone()), http);
        assert_eq!(network_filter_config(again, "connect_authz"), network);
    }
    // With one policy, exactly prost's encoding.
    let one = rules_http(&[l4("db", Deny)], true).unwrap();
    assert_eq!(
        http_filter_config(one.clone()),
        pack_any(HttpRbac {
            rules: Some(one.clone()),
            ..Default::default()
        })
    );
    assert_eq!(
        network_filter_config(one.clone(), "connect_authz"),
        pack_any(NetworkRbac {
            rules: Some(one),
            stat_prefix: "connect_authz".into(),
            ..Default::default()
        })
    );
}

// ---- JWT requirements ----

/// Claims a provider checks: a path and the value.
type Claims<'a> = &'a [(&'a [&'a str], &'a str)];

fn jwt(providers: &[(&str, Claims<'_>)]) -> IntentionJwtRequirement {
    IntentionJwtRequirement {
        providers: providers
            .iter()
            .map(|(name, claims)| structs::config_entry::IntentionJwtProvider {
                name: (*name).into(),
                verify_claims: claims
                    .iter()
                    .map(|(path, value)| IntentionJwtClaimVerification {
                        path: path.iter().map(|p| (*p).to_owned()).collect(),
                        value: (*value).into(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn with_jwt(mut ixn: Intention, req: IntentionJwtRequirement) -> Intention {
    ixn.jwt = Some(req);
    ixn
}

#[test]
fn an_entry_token_requirement_refuses_requests_without_it() {
    let okta = jwt(&[("okta", &[])]);
    // An allow needs the token; a deny stays a deny; a wildcard is not weakened by it.
    assert_same_meaning(&[with_jwt(l4("web", Allow), okta.clone())]);
    assert_same_meaning(&[with_jwt(l4("web", Deny), okta.clone())]);
    assert_same_meaning(&[with_jwt(l4("web", Allow), okta.clone()), l4("*", Allow)]);
    assert_same_meaning(&[with_jwt(l4("*", Allow), okta.clone()), l4("db", Deny)]);
    // With claims, a list claim holding the value, a nested claim, either of two providers.
    let claims = jwt(&[
        ("okta", &[(&["role"], "admin"), (&["org", "unit"], "eng")]),
        ("auth0", &[(&["role"], "admin")]),
    ]);
    assert_same_meaning(&[with_jwt(l4("web", Allow), claims)]);
    assert_same_meaning(&[with_jwt(l4("web", Allow), jwt(&[("okta", &[(&["groups"], "ops")])]))]);
    // With permissions: the token first, then the first matching permission.
    assert_same_meaning(&[with_jwt(
        l7("web", vec![prefix(Deny, "/admin"), prefix(Allow, "/")]),
        okta.clone(),
    )]);
    assert_same_meaning(&[with_jwt(l7("web", vec![prefix(Allow, "/api")]), okta), l4("*", Deny)]);
}

#[test]
fn a_permission_token_requirement_is_part_of_its_match() {
    let mut admin = prefix(Allow, "/admin");
    admin.jwt = Some(jwt(&[("okta", &[(&["role"], "admin")])]));
    let mut deny_users = prefix(Deny, "/");
    deny_users.jwt = Some(jwt(&[("okta", &[(&["role"], "user")])]));
    assert_same_meaning(&[l7(
        "web",
        vec![admin.clone(), prefix(Deny, "/admin"), prefix(Allow, "/")],
    )]);
    assert_same_meaning(&[l7("web", vec![deny_users, admin.clone()]), l4("*", Allow)]);
    // An entry requirement and a permission's together.
    assert_same_meaning(&[with_jwt(l7("web", vec![admin]), jwt(&[("auth0", &[]), ("okta", &[])]))]);
}

#[test]
fn token_conditions_are_the_jwt_filters_metadata() {
    let ixns = [with_jwt(l4("web", Allow), jwt(&[("okta", &[(&["role"], "admin")])]))];
    let rules = rules_http(&ixns, false).unwrap();
    let text = format!("{rules:?}");
    for expected in [
        "envoy.filters.http.jwt_authn",
        "jwt_payload_okta",
        "\"role\"",
        "PresentMatch(true)",
        "OneOf",
    ] {
        assert!(text.contains(expected), "{expected} in {text}");
    }
    // An L4 listener cannot check tokens: the source is refused.
    assert_eq!(rules_l4(&ixns, false), Some(rbac_of(rbac::Action::Allow, vec![])));
}

// ---- peers ----

fn regexes(rbac: &Rbac) -> Vec<String> {
    fn collect(p: &Principal, out: &mut Vec<String>) {
        match &p.identifier {
            Some(principal::Identifier::Authenticated(a)) => {
                if let Some(StringMatcher {
                    match_pattern: Some(string_matcher::MatchPattern::SafeRegex(r)),
                    ..
                }) = &a.principal_name
                {
                    out.push(r.regex.clone());
                }
            }
            Some(principal::Identifier::AndIds(set)) => set.ids.iter().for_each(|p| collect(p, out)),
            Some(principal::Identifier::NotId(p)) => collect(p, out),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for policy in rbac.policies.values() {
        for p in &policy.principals {
            collect(p, &mut out);
        }
    }
    out.sort();
    out
}

#[test]
fn with_peers_each_source_matches_in_its_own_trust_domain_only() {
    let peer = |name: &str, peer: &str, action| Intention {
        source_peer: peer.into(),
        ..l4(name, action)
    };
    let intentions = vec![
        l4("web", Allow),
        peer("web", "cluster-b", Allow),
        peer("*", "cluster-b", Deny),
        // A peer this sidecar does not trust: decides nothing (its callers fail TLS).
        peer("web", "cluster-z", Allow),
        l4("*", Allow),
    ];
    let peers = BTreeMap::from([("cluster-b".to_owned(), "b.consul".to_owned())]);
    let trust = Trust {
        local: "a.consul",
        peers: Some(&peers),
    };
    let rules = rules_l4_trusting(&intentions, false, trust).unwrap();
    assert_eq!(
        regexes(&rules),
        [
            "^spiffe://a\\.consul/ns/default/dc/[^/]+/svc/[^/]+$",
            "^spiffe://a\\.consul/ns/default/dc/[^/]+/svc/web$",
            "^spiffe://b\\.consul/ns/default/dc/[^/]+/svc/web$",
        ],
        "the local wildcard is this cluster's only; the peer's deny-all is the default"
    );
    // Without peers trusted, nothing changes: any trust domain (only local roots verify).
    let plain = rules_l4(&[l4("web", Allow)], false).unwrap();
    assert_eq!(regexes(&plain), ["^spiffe://[^/]+/ns/default/dc/[^/]+/svc/web$"]);
    assert!(rules_l4(&[peer("web", "cluster-b", Allow)], false).is_some_and(|r| r.policies.is_empty()));
}
