use super::*;
use crate::service::{ServiceAddress, Weights};
use crate::{Node, NodeService, ServiceKind};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// A canary `web` instance with most fields set.
fn web12() -> CheckServiceNode {
    let mut service = NodeService {
        kind: ServiceKind::Typical,
        id: "web-12".into(),
        service: "web".into(),
        tags: vec!["canary".into(), "v2".into(), "primary".into()],
        address: "10.0.1.12".into(),
        meta: map(&[
            ("version", "v2"),
            ("app-version", "2.1.0"),
            ("owner", ""),
            ("note", "a \"quoted\" word\n"),
            ("path", r"C:\dir"),
        ]),
        port: 8080,
        weights: Weights { passing: 3, warning: 1 },
        ..NodeService::default()
    };
    service.tagged_addresses.insert(
        "lan_ipv4".into(),
        ServiceAddress {
            address: "10.0.1.12".into(),
            port: 8080,
        },
    );
    service.connect.native = true;
    CheckServiceNode {
        node: Node {
            id: "3f2a9c1e".into(),
            node: "node-a".into(),
            address: "10.0.0.1".into(),
            datacenter: "dc1".into(),
            tagged_addresses: map(&[("lan", "10.0.0.1"), ("wan", "198.51.100.1")]),
            meta: map(&[("zone", "us-east-1b"), ("rack", "r1"), ("city", "Zürich")]),
            ..Node::default()
        },
        service,
        checks: vec![],
    }
}

/// A plain instance: no tags, no service meta.
fn bare(id: &str, zone: &str) -> CheckServiceNode {
    CheckServiceNode {
        node: Node {
            node: "node-b".into(),
            meta: map(&[("zone", zone)]),
            ..Node::default()
        },
        service: NodeService {
            id: id.into(),
            service: "web".into(),
            port: 8080,
            ..NodeService::default()
        },
        checks: vec![],
    }
}

fn parse(expr: &str) -> Filter {
    Filter::parse(expr).unwrap_or_else(|e| panic!("{expr:?} should parse: {e}"))
}

/// Evaluates `expr` against [`web12`].
fn eval(expr: &str) -> bool {
    parse(expr).matches(&web12())
}

#[track_caller]
fn assert_all(cases: &[(&str, bool)]) {
    for (expr, want) in cases {
        assert_eq!(eval(expr), *want, "{expr}");
    }
}

fn err(expr: &str) -> FilterError {
    match Filter::<CheckServiceNode>::parse(expr) {
        Ok(f) => panic!("{expr:?} should not parse, got {f:?}"),
        Err(e) => {
            assert!(e.offset() <= expr.len(), "{expr:?}: offset of {e} is past the end");
            e
        }
    }
}

fn msg(expr: &str) -> String {
    err(expr).to_string()
}

#[test]
fn empty_expression_matches_everything() {
    for expr in ["", "   ", "\t\r\n "] {
        let f = parse(expr);
        assert!(f.matches_everything());
        assert!(f.matches(&web12()));
        assert!(f.matches(&CheckServiceNode::default()));
    }
    assert!(Filter::default().matches(&web12()));
    assert!(!parse("Service.ID == web-12").matches_everything());
}

#[test]
fn equality_on_strings() {
    assert_all(&[
        ("Service.ID == web-12", true),
        ("Service.ID == web-1", false),
        ("Service.ID != web-1", true),
        ("Service.ID != web-12", false),
        ("Service.Service == web", true),
        ("Service.Address == 10.0.1.12", true),
        ("Service.Kind == \"\"", true),
        ("Service.SocketPath == \"\"", true),
        ("Node.ID == 3f2a9c1e", true),
        ("Node.Node == node-a", true),
        ("Node.Address == 10.0.0.1", true),
        ("Node.Datacenter == dc1", true),
        ("Node.Datacenter == DC1", false),
        ("Node.TaggedAddresses.wan == 198.51.100.1", true),
    ]);
    let mut proxy = web12();
    proxy.service.kind = ServiceKind::ConnectProxy;
    assert!(parse("Service.Kind == connect-proxy").matches(&proxy));
    assert!(parse("Service.Kind is not empty").matches(&proxy));
}

#[test]
fn meta_values_and_missing_keys() {
    assert_all(&[
        ("Service.Meta.version == v2", true),
        ("Service.Meta.version != v2", false),
        ("Service.Meta.app-version == 2.1.0", true),
        ("Service.Meta[\"app-version\"] == \"2.1.0\"", true),
        ("Service.Meta[`version`] == v2", true),
        ("Service.Meta[ \"version\" ] == v2", true),
        ("Node.Meta.zone == us-east-1b", true),
        ("Node.Meta[\"zone\"] != \"us-east-1a\"", true),
        ("Node.TaggedAddresses[\"lan\"] == 10.0.0.1", true),
        // Present but empty.
        ("Service.Meta.owner is empty", true),
        ("Service.Meta.owner == \"\"", true),
        // Missing: reads as the empty string.
        ("Service.Meta.missing == v2", false),
        ("Service.Meta.missing != v2", true),
        ("Service.Meta.missing == \"\"", true),
        ("Service.Meta.missing is empty", true),
        ("Service.Meta[\"missing\"] is not empty", false),
        ("Service.Meta.missing matches \".\"", false),
        ("Node.Meta.missing not matches \".\"", true),
    ]);
    let absent = bare("web-1", "us-east-1a");
    assert!(!parse("Service.Meta.version == v2").matches(&absent));
    assert!(parse("Service.Meta.version != v2").matches(&absent));
}

#[test]
fn membership_in_lists_maps_and_strings() {
    assert_all(&[
        // Tags: exact membership, not substring.
        ("\"canary\" in Service.Tags", true),
        ("canary in Service.Tags", true),
        ("can in Service.Tags", false),
        ("stable in Service.Tags", false),
        ("stable not in Service.Tags", true),
        ("canary not in Service.Tags", false),
        ("Service.Tags contains v2", true),
        ("Service.Tags contains V2", false),
        ("Service.Tags not contains canary", false),
        ("Service.Tags not contains stable", true),
        // Maps: key membership.
        ("version in Service.Meta", true),
        ("v2 in Service.Meta", false),
        ("missing not in Service.Meta", true),
        ("Service.Meta contains owner", true),
        ("zone in Node.Meta", true),
        ("Node.TaggedAddresses contains wan", true),
        ("lan_ipv4 in Service.TaggedAddresses", true),
        ("Service.TaggedAddresses not contains wan_ipv4", true),
        // Strings: substring.
        ("\"eb-1\" in Service.ID", true),
        ("Service.Service contains we", true),
        ("Service.ID not contains xyz", true),
        ("east in Node.Meta.zone", true),
        ("Node.Meta[\"zone\"] contains west", false),
        ("\"\" in Service.Meta.missing", true),
        ("\"rich\" in Node.Meta[\"city\"]", true),
        ("\"ur\" in Node.Meta[\"city\"]", false),
    ]);
}

#[test]
fn regular_expressions() {
    assert_all(&[
        ("Service.ID matches \"^web-[0-9]+$\"", true),
        ("Service.ID not matches \"^web-[0-9]+$\"", false),
        ("Service.ID matches `^web-\\d+$`", true),
        // Unanchored search, like Go's regexp.MatchString.
        ("Service.ID matches eb", true),
        ("Service.ID matches \"^eb\"", false),
        ("Node.Meta.zone matches \"^us-(east|west)-[0-9][a-z]$\"", true),
        ("Service.Meta.version matches \"(?i)^V2$\"", true),
        ("Node.Meta.city matches \"^Z\\\\pL+ich$\"", true),
    ]);
}

#[test]
fn emptiness() {
    assert_all(&[
        ("Service.Tags is empty", false),
        ("Service.Tags is not empty", true),
        ("Service.Meta is empty", false),
        ("Service.Meta is not empty", true),
        ("Service.TaggedAddresses is not empty", true),
        ("Node.TaggedAddresses is empty", false),
        ("Service.Address is empty", false),
        ("Service.SocketPath is empty", true),
        ("Service.Kind is empty", true),
    ]);
    let b = bare("web-1", "us-east-1a");
    for expr in [
        "Service.Tags is empty",
        "Service.Meta is empty",
        "Service.TaggedAddresses is empty",
        "Node.ID is empty",
    ] {
        assert!(parse(expr).matches(&b), "{expr}");
    }
}

#[test]
fn integers_and_booleans() {
    assert_all(&[
        ("Service.Port == 8080", true),
        ("Service.Port == \"8080\"", true),
        ("Service.Port == 8081", false),
        ("Service.Port != 8081", true),
        ("Service.Port == 0", false),
        ("Service.Weights.Passing == 3", true),
        ("Service.Weights.Warning != 1", false),
        ("Service.EnableTagOverride == false", true),
        ("Service.EnableTagOverride == F", true),
        ("Service.Connect.Native == true", true),
        ("Service.Connect.Native == 1", true),
        ("Service.Connect.Native != True", false),
    ]);
}

#[test]
fn precedence_is_not_then_and_then_or() {
    const T: &str = "Service.ID == web-12";
    const F: &str = "Service.ID == web-1";
    let cases = [
        // `or` binds loosest: T or (T and F).
        (format!("{T} or {T} and {F}"), true),
        (format!("({T} or {T}) and {F}"), false),
        // (F and T) or T.
        (format!("{F} and {T} or {T}"), true),
        (format!("{F} and ({T} or {T})"), false),
        // `not` binds tightest: (not T) and F, (not T) or T.
        (format!("not {T} and {F}"), false),
        (format!("not ({T} and {F})"), true),
        (format!("not {T} or {T}"), true),
        (format!("not ({T} or {T})"), false),
        (format!("{T} and not {F}"), true),
        (format!("not not {T}"), true),
        (format!("not not not {T}"), false),
        (format!("not (not {T})"), true),
        // Long chains.
        (format!("{F} or {F} or {F} or {T}"), true),
        (format!("{T} and {T} and {T} and {F}"), false),
        (format!("(({T}))"), true),
        (format!("((({F}) or ({T} and (not {F}))))"), true),
    ];
    for (expr, want) in cases {
        assert_eq!(eval(&expr), want, "{expr}");
    }
}

#[test]
fn quoting_forms() {
    assert_all(&[
        ("Service.ID == \"web-12\"", true),
        ("Service.ID == `web-12`", true),
        ("Service.ID == web-12", true),
        // Go's escapes in double quotes.
        ("Service.Meta.note == \"a \\\"quoted\\\" word\\n\"", true),
        ("Node.Meta.city == \"Z\\u00fcrich\"", true),
        ("Node.Meta.city == \"Z\\U000000FCrich\"", true),
        ("Node.Meta.city == \"Zürich\"", true),
        ("Node.Meta.rack == \"\\x72\\x31\"", true),
        ("Node.Meta.rack == \"r\\t1\"", false),
        // Raw strings keep backslashes.
        ("Service.Meta.path == `C:\\dir`", true),
        ("Service.Meta.path == \"C:\\\\dir\"", true),
        // Keywords as values must be quoted to be read as values everywhere.
        ("Service.ID != \"and\"", true),
        ("\"not\" not in Service.Tags", true),
        // Whitespace is optional around == and parentheses, and may be any of space, tab, newline.
        ("Service.ID==\"web-12\"and(Node.Node==node-a)", true),
        ("Service.ID\t==\n`web-12`\r\nand\tNode.Node == node-a", true),
    ]);
}

#[test]
fn realistic_subset_filters() {
    let v1 = {
        let mut n = bare("web-3", "us-east-1a");
        n.service.meta = map(&[("version", "v1")]);
        n.service.tags = vec!["stable".into()];
        n
    };
    let v2_east_1a = {
        let mut n = bare("web-4", "us-east-1a");
        n.service.meta = map(&[("version", "v2")]);
        n
    };
    let sidecar = {
        let mut n = bare("web-12-sidecar-proxy", "us-east-1b");
        n.service.kind = ServiceKind::ConnectProxy;
        n
    };
    let all = [web12(), v1, v2_east_1a, sidecar, bare("web-5", "us-west-2a")];
    let select = |expr: &str| -> Vec<String> {
        let f = parse(expr);
        all.iter()
            .filter(|n| f.matches(n))
            .map(|n| n.service.id.clone())
            .collect()
    };
    assert_eq!(select("Service.Meta.version == v1"), ["web-3"]);
    assert_eq!(select("\"canary\" in Service.Tags"), ["web-12"]);
    assert_eq!(
        select("Service.Meta.version == v2 and Node.Meta.zone != \"us-east-1a\""),
        ["web-12"]
    );
    assert_eq!(select("Service.Meta.version == v2"), ["web-12", "web-4"]);
    assert_eq!(
        select("not (Service.ID matches \"^web-[0-9]+$\")"),
        ["web-12-sidecar-proxy"]
    );
    assert_eq!(
        select("Service.Meta.version != v2"),
        ["web-3", "web-12-sidecar-proxy", "web-5"]
    );
    assert_eq!(
        select("Service.Kind == \"\" and (Service.Meta.version is empty or Node.Meta.zone matches \"^us-west-\")"),
        ["web-5"]
    );
    assert_eq!(
        select(""),
        ["web-12", "web-3", "web-4", "web-12-sidecar-proxy", "web-5"]
    );
}

#[test]
fn from_str_and_display() {
    let f: Filter = "Service.Meta.version == v2".parse().unwrap();
    assert!(f.matches(&web12()));
    assert_eq!(f.to_string(), "Service.Meta.version == v2");
    assert_eq!(f.as_str(), "Service.Meta.version == v2");
    let e = "Service.Meta.version ==".parse::<Filter>().unwrap_err();
    assert_eq!(e.offset(), 23);
}

#[test]
fn lexical_errors() {
    assert_eq!(
        msg("Service.ID = web"),
        "unexpected character '=' at offset 11 (equality is \"==\")"
    );
    assert_eq!(
        msg("Service.ID == web && Node.Node == a"),
        "unexpected character '&' at offset 18 (conjunction is \"and\")"
    );
    assert_eq!(
        msg("!Service.Tags is empty"),
        "unexpected character '!' at offset 0 (inequality is \"!=\"; negation is \"not\")"
    );
    assert_eq!(
        msg("Service.ID == 'web'"),
        "unexpected character '\\'' at offset 14 (quote strings with \" or `)"
    );
    assert_eq!(msg("Service.ID == café"), "unexpected character 'é' at offset 17");
    assert_eq!(msg("Service.ID == \"web"), "unterminated string starting at offset 14");
    assert_eq!(msg("Service.ID == `web"), "unterminated string starting at offset 14");
    assert_eq!(
        msg("Service.ID == \"web\\\""),
        "unterminated string starting at offset 14"
    );
    assert_eq!(
        msg("Service.ID == \"a\\qb\""),
        "invalid escape sequence \"\\q\" at offset 16"
    );
    assert_eq!(
        msg("Service.ID == \"a\\xff\""),
        "invalid escape sequence \"\\xff\" at offset 16"
    );
    assert_eq!(
        msg("Service.ID == \"a\\u12\""),
        "invalid escape sequence \"\\u12\" at offset 16"
    );
    assert_eq!(
        msg("Service.ID == \"\\ud800\""),
        "invalid escape sequence \"\\ud800\" at offset 15"
    );
    assert_eq!(
        msg("Service.ID == \"\\'\""),
        "invalid escape sequence \"\\'\" at offset 15"
    );
}

#[test]
fn syntax_errors() {
    let cases = [
        (
            "Service.Meta.version ==",
            "expected a value after \"==\" at offset 23, found end of input",
        ),
        (
            "Service.Meta.version == )",
            "expected a value after \"==\" at offset 24, found \")\"",
        ),
        (
            "Service.ID contains",
            "expected a value after \"contains\" at offset 19, found end of input",
        ),
        (
            "Service.ID not matches (",
            "expected a value after \"matches\" at offset 23, found \"(\"",
        ),
        (
            "Service.ID",
            "expected an operator (==, !=, in, not in, contains, not contains, matches, not matches, is empty, is not empty) \
             after \"Service.ID\" at offset 10, found end of input",
        ),
        (
            "Service.ID web",
            "expected an operator (==, !=, in, not in, contains, not contains, matches, not matches, is empty, is not empty) \
             after \"Service.ID\" at offset 11, found \"web\"",
        ),
        (
            "Service.ID is",
            "expected \"empty\" or \"not empty\" after \"is\" at offset 13, found end of input",
        ),
        (
            "Service.ID is not full",
            "expected \"empty\" after \"is not\" at offset 18, found \"full\"",
        ),
        (
            "Service.ID not equals x",
            "expected \"in\", \"contains\" or \"matches\" after \"not\" at offset 15, found \"equals\"",
        ),
        (
            "Service.ID == web and",
            "expected an expression after \"and\" at offset 21, found end of input",
        ),
        (
            "Service.ID == web or or",
            "expected an expression after \"or\" at offset 21, found \"or\"",
        ),
        (
            "not",
            "expected an expression after \"not\" at offset 3, found end of input",
        ),
        (
            "and in Service.Tags",
            "expected an expression at offset 0, found \"and\"",
        ),
        (
            "Service.ID == or Node.Node == a",
            "expected a value after \"==\" (quote \"or\" to compare with it) at offset 14, found \"or\"",
        ),
        (
            "Service.ID == web Node.Node == a",
            "expected \"and\", \"or\" or the end of the expression at offset 18, found \"Node.Node\"",
        ),
        (
            "Service.ID == web)",
            "expected \"and\", \"or\" or the end of the expression at offset 17, found \")\"",
        ),
        ("()", "expected an expression after \"(\" at offset 1, found \")\""),
        ("== web", "expected an expression at offset 0, found \"==\""),
        (
            "\"canary\" == Service.Tags",
            "expected a selector before \"==\" at offset 0, found string \"canary\"",
        ),
        (
            "`canary` is empty",
            "expected a selector before \"is empty\" at offset 0, found string `canary`",
        ),
        (
            "\"canary\" in",
            "expected a selector after \"in\" at offset 11, found end of input",
        ),
        (
            "\"canary\" not in \"Service.Tags\"",
            "expected a selector after \"in\" at offset 16, found string \"Service.Tags\"",
        ),
        (
            "Service.Meta[\"version\"] in Service.Tags",
            "expected a value before \"in\" at offset 0, found selector Service.Meta[\"version\"]",
        ),
        (
            "Service.Meta[version] == v2",
            "expected a quoted map key after \"[\" at offset 13, found \"version\"",
        ),
        (
            "Service.Meta[\"version\" == v2",
            "expected \"]\" after the map key at offset 23, found \"==\"",
        ),
        (
            "x in Service.Meta[",
            "expected a quoted map key after \"[\" at offset 18, found end of input",
        ),
    ];
    for (expr, want) in cases {
        let e = err(expr);
        assert!(matches!(e, FilterError::Syntax { .. }), "{expr}: {e:?}");
        assert_eq!(e.to_string(), want, "{expr}");
    }
}

#[test]
fn unbalanced_and_deep_parentheses() {
    assert_eq!(
        msg("(Service.ID == web"),
        "unclosed \"(\" at offset 0: expected \")\" at offset 18, found end of input"
    );
    assert_eq!(
        msg("not ((Service.ID == web) Node.Node == a)"),
        "unclosed \"(\" at offset 4: expected \")\" at offset 25, found \"Node.Node\""
    );
    let nested = |depth: usize| format!("{}Service.ID == web-12{}", "(".repeat(depth), ")".repeat(depth));
    assert!(eval(&nested(MAX_DEPTH)));
    assert_eq!(
        err(&nested(MAX_DEPTH + 1)),
        FilterError::TooDeep {
            offset: MAX_DEPTH,
            max: MAX_DEPTH
        }
    );
    assert_eq!(
        msg(&nested(40)),
        "parentheses nested deeper than 32 levels at offset 32"
    );
    // Long chains and repeated `not` do not nest.
    let chain = vec!["Service.ID == web-1"; 5000].join(" or ");
    assert!(!eval(&chain));
    assert!(eval(&format!("{}Service.ID == web-12", "not not ".repeat(5000))));
}

#[test]
fn unknown_selectors() {
    let cases = [
        ("Service.Foo == x", 0, "Service.Foo"),
        ("service.id == web-12", 0, "service.id"),
        ("Checks.Foo == passing", 0, "Checks.Foo"),
        ("Service == web", 0, "Service"),
        ("Service.Meta. == x", 0, "Service.Meta."),
        ("Service.TaggedAddresses.lan == x", 0, "Service.TaggedAddresses.lan"),
        ("Service.Tags[\"a\"] == b", 0, "Service.Tags[\"a\"]"),
        ("8080 == Service.Port", 0, "8080"),
        ("x in Service.Bar", 5, "Service.Bar"),
        ("Service.ID == a or x not in Node.Tags", 28, "Node.Tags"),
    ];
    for (expr, offset, selector) in cases {
        let e = err(expr);
        assert!(
            matches!(&e, FilterError::UnknownSelector { offset: o, selector: s, .. } if *o == offset && s == selector),
            "{expr}: {e:?}"
        );
    }
    let m = msg("Service.Foo == x");
    assert!(
        m.starts_with("unknown selector \"Service.Foo\" at offset 0: known selectors are Service.ID, "),
        "{m}"
    );
    assert!(
        m.contains("Service.Meta.<key>")
            && m.contains("Node.TaggedAddresses.<key>")
            && m.ends_with("Service.Proxy.Expose.Paths.Protocol"),
        "{m}"
    );
}

#[test]
fn operators_a_selector_does_not_take() {
    const COLLECTION: &str = "use \"in\", \"not in\", \"contains\", \"not contains\", \"is empty\" or \"is not empty\"";
    let cases = [
        ("Service.Tags == canary", format!("operator \"==\" at offset 13 does not apply to \"Service.Tags\" (a list): {COLLECTION}")),
        ("Service.Tags matches \"^c\"", format!("operator \"matches\" at offset 13 does not apply to \"Service.Tags\" (a list): {COLLECTION}")),
        ("Service.Meta != x", format!("operator \"!=\" at offset 13 does not apply to \"Service.Meta\" (a map): {COLLECTION}")),
        ("Node.Meta not matches x", format!("operator \"not matches\" at offset 10 does not apply to \"Node.Meta\" (a map): {COLLECTION}")),
        ("Service.Port contains 80", "operator \"contains\" at offset 13 does not apply to \"Service.Port\" (an integer): use \"==\" or \"!=\"".to_owned()),
        ("\"80\" not in Service.Port", "operator \"not in\" at offset 5 does not apply to \"Service.Port\" (an integer): use \"==\" or \"!=\"".to_owned()),
        ("Service.Port is empty", "operator \"is empty\" at offset 13 does not apply to \"Service.Port\" (an integer): use \"==\" or \"!=\"".to_owned()),
        ("Service.Connect.Native matches t", "operator \"matches\" at offset 23 does not apply to \"Service.Connect.Native\" (a boolean): use \"==\" or \"!=\"".to_owned()),
    ];
    for (expr, want) in cases {
        let e = err(expr);
        assert!(matches!(e, FilterError::UnsupportedOperator { .. }), "{expr}: {e:?}");
        assert_eq!(e.to_string(), want, "{expr}");
    }
}

#[test]
fn values_of_the_wrong_type() {
    assert_eq!(
        msg("Service.Port == web"),
        "invalid value \"web\" for \"Service.Port\" at offset 16: expected an integer from 0 to 65535"
    );
    assert_eq!(
        msg("Service.Port != 70000"),
        "invalid value \"70000\" for \"Service.Port\" at offset 16: expected an integer from 0 to 65535"
    );
    assert_eq!(
        msg("Service.Weights.Passing == -1"),
        "invalid value \"-1\" for \"Service.Weights.Passing\" at offset 27: expected an integer from 0 to 4294967295"
    );
    assert_eq!(
        msg("Service.Connect.Native == yes"),
        "invalid value \"yes\" for \"Service.Connect.Native\" at offset 26: expected true or false"
    );
}

#[test]
fn invalid_regular_expressions_fail_to_parse() {
    let e = err("Service.ID matches \"web-([\"");
    let FilterError::InvalidRegex {
        offset,
        pattern,
        reason,
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!((*offset, pattern.as_str()), (19, "web-(["));
    assert!(!reason.is_empty() && !reason.contains('\n'), "{reason:?}");
    assert_eq!(
        e.to_string(),
        format!("invalid regular expression \"web-([\" at offset 19: {reason}")
    );
    assert_eq!(
        msg("Service.ID not matches `(`"),
        "invalid regular expression \"(\" at offset 23: unclosed group"
    );
    // Patterns whose compiled form is too large are refused rather than built.
    assert!(matches!(
        err("Service.ID matches `(\\w{100}){100}`"),
        FilterError::InvalidRegex { .. }
    ));
}

proptest! {
    #[test]
    fn parse_never_panics(s in "\\PC{0,64}") {
        if let Err(e) = Filter::<CheckServiceNode>::parse(&s) {
            prop_assert!(e.offset() <= s.len());
        }
    }

    #[test]
    fn token_soup_never_panics(words in prop::collection::vec(prop::sample::select(vec![
        "Service.ID", "Service.Tags", "Service.Meta", "Service.Meta.version", "Service.Port", "Node.Meta",
        "==", "!=", "in", "not", "contains", "matches", "is", "empty", "and", "or", "(", ")", "[", "]",
        "\"v2\"", "`^w`", "v2", "8080", "\"x", "\"\\u00e9\"", "=", "Bogus.Field",
    ]), 0..14)) {
        let expr = words.join(" ");
        match Filter::parse(&expr) {
            Ok(f) => { f.matches(&web12()); f.matches(&CheckServiceNode::default()); }
            Err(e) => prop_assert!(e.offset() <= expr.len(), "{}: {}", expr, e),
        }
    }
}

/// Each record has its own selectors: the field names of its JSON, as Consul's filters name
/// them; another record's selectors are unknown there, and the error lists the right ones.
#[test]
fn each_record_kind_has_its_own_selectors() {
    let web = web12();
    let node = web.node.clone();
    let service = web.service.clone();
    let check = crate::HealthCheck {
        node: "node-a".into(),
        check_id: "web-12-alive".into(),
        name: "alive".into(),
        status: crate::HealthStatus::Critical,
        service_id: "web-12".into(),
        service_name: "web".into(),
        service_tags: vec!["canary".into()],
        check_type: "ttl".into(),
        ..crate::HealthCheck::default()
    };
    let row: CatalogRow = (std::sync::Arc::new(node.clone()), std::sync::Arc::new(service.clone()));

    fn yes<T: Record>(expr: &str, record: &T) -> bool {
        Filter::<T>::parse(expr)
            .unwrap_or_else(|e| panic!("{expr:?}: {e}"))
            .matches(record)
    }
    assert!(yes("Meta.zone == us-east-1b and Node == node-a", &node));
    assert!(yes(
        "TaggedAddresses.wan == 198.51.100.1 and lan in TaggedAddresses",
        &node
    ));
    assert!(!yes("Datacenter != dc1", &node));
    assert!(yes("Service == web and canary in Tags and Port == 8080", &service));
    assert!(yes(
        "Meta[\"app-version\"] matches `^2\\.` and lan_ipv4 in TaggedAddresses",
        &service
    ));
    assert!(yes(
        "Weights.Passing == 3 and Connect.Native == true and Kind == \"\"",
        &service
    ));
    assert!(yes(
        "Status == critical and ServiceName == web and canary in ServiceTags",
        &check
    ));
    assert!(!yes("Type != ttl", &check));
    assert!(yes(
        "NodeMeta.zone == us-east-1b and ServiceMeta.version == v2 and ServicePort == 8080",
        &row
    ));
    assert!(yes(
        "v2 in ServiceTags and Node == node-a and ServiceConnect.Native == true",
        &row
    ));

    let unknown = |e: FilterError| match e {
        FilterError::UnknownSelector { selector, known, .. } => (selector, known),
        other => panic!("{other:?}"),
    };
    let (selector, known) = unknown(Filter::<Node>::parse("Service.ID == x").unwrap_err());
    assert_eq!(selector, "Service.ID");
    assert_eq!(
        known,
        "ID, Node, Address, Datacenter, TaggedAddresses, TaggedAddresses.<key>, Meta, Meta.<key>"
    );
    let (_, known) = unknown(Filter::<crate::HealthCheck>::parse("Checks.Status == x").unwrap_err());
    assert!(known.starts_with("Node, CheckID, Name, Status"), "{known}");
    // Types follow the record: a check's Status is a string, a service's Port an integer.
    let e = Filter::<NodeService>::parse("Port == web").unwrap_err();
    assert!(matches!(e, FilterError::InvalidValue { .. }), "{e:?}");
    let e = Filter::<CatalogRow>::parse("ServiceTags == web").unwrap_err();
    assert!(matches!(e, FilterError::UnsupportedOperator { .. }), "{e:?}");
}

/// Selectors into a health result's checks: a test on `Checks.<field>` matches when some
/// check passes it (negated: none does); `Checks` as a whole is a list of check ids.
#[test]
fn checks_selectors_match_any_check() {
    let check = |id: &str, status: &str| crate::HealthCheck {
        node: "node-a".into(),
        check_id: id.into(),
        name: format!("{id} check"),
        status: status.parse().unwrap(),
        output: format!("HTTP GET: {status}"),
        ..crate::HealthCheck::default()
    };
    let mut n = web12();
    n.checks = vec![check("serfHealth", "passing"), check("service:web-12", "critical")];
    let eval = |expr: &str, n: &CheckServiceNode| Filter::<CheckServiceNode>::parse(expr).unwrap().matches(n);
    for (expr, want) in [
        ("Checks.Status == critical", true),
        ("Checks.Status == warning", false),
        ("Checks.Status != critical", false),
        ("Checks.Status != warning", true),
        ("Checks.CheckID == serfHealth", true),
        ("Checks.Output contains \"GET: crit\"", true),
        ("Checks.Name matches \"^service:\"", true),
        ("serfHealth in Checks", true),
        ("serf in Checks", false),
        ("Checks is not empty", true),
        ("Checks.Status == critical and Service.ID == web-12", true),
    ] {
        assert_eq!(eval(expr, &n), want, "{expr}");
    }
    n.checks.clear();
    assert!(eval("Checks is empty", &n));
    assert!(!eval("Checks.Status == passing", &n));
}

/// Selectors into a proxy's nested blocks, as Consul's filters name them under each record's
/// proxy (`Proxy.*` on a service, `Service.Proxy.*` on a health result, `ServiceProxy.*` on a
/// catalog row): an upstream test matches when some upstream passes it.
#[test]
fn nested_proxy_selectors() {
    let upstream = |name: &str, dc: &str| crate::proxy::Upstream {
        destination_name: name.into(),
        datacenter: dc.into(),
        local_bind_port: 9191,
        ..crate::proxy::Upstream::default()
    };
    let mut svc = NodeService {
        kind: ServiceKind::ConnectProxy,
        id: "web-sidecar-proxy".into(),
        service: "web-sidecar-proxy".into(),
        ..NodeService::default()
    };
    svc.proxy.upstreams = vec![upstream("db", ""), upstream("cache", "dc2")];
    svc.proxy.expose.paths = vec![crate::proxy::ExposePath {
        path: "/health".into(),
        protocol: "http".into(),
        ..crate::proxy::ExposePath::default()
    }];
    let on_service = |expr: &str, s: &NodeService| Filter::<NodeService>::parse(expr).unwrap().matches(s);
    for (expr, want) in [
        ("Proxy.Upstreams.DestinationName == db", true),
        ("Proxy.Upstreams.DestinationName == api", false),
        ("Proxy.Upstreams.DestinationName != api", true),
        ("Proxy.Upstreams.Datacenter == dc2", true),
        ("Proxy.Upstreams is not empty", true),
        ("cache in Proxy.Upstreams", true),
        ("Proxy.Mode == \"\"", true),
        ("Proxy.MeshGateway.Mode == \"\"", true),
        ("Proxy.Expose.Paths.Path == /health", true),
        ("Proxy.Expose.Checks == false", true),
    ] {
        assert_eq!(on_service(expr, &svc), want, "{expr}");
    }
    let mut n = web12();
    n.service = svc.clone();
    assert!(
        Filter::<CheckServiceNode>::parse("Service.Proxy.Upstreams.DestinationName == cache")
            .unwrap()
            .matches(&n)
    );
    let row: CatalogRow = (std::sync::Arc::new(n.node.clone()), std::sync::Arc::new(svc));
    assert!(
        Filter::<CatalogRow>::parse("ServiceProxy.Upstreams.DestinationName == db")
            .unwrap()
            .matches(&row)
    );
    let plain = NodeService::default();
    assert!(on_service("Proxy.Upstreams is empty", &plain));
    assert!(!on_service("Proxy.Upstreams.DestinationName == db", &plain));
}
