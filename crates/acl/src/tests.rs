#![allow(clippy::unwrap_used)]

use crate::{Access, Authorizer, GLOBAL_MANAGEMENT_RULES, Resource, Rules};

fn authz(texts: &[&str], default_allow: bool) -> Authorizer {
    let rules: Vec<Rules> = texts.iter().map(|t| Rules::parse(t).unwrap()).collect();
    Authorizer::new(&rules, default_allow)
}

/// Rules as Consul's HCL 1 takes them (the layouts its docs and users write), each read
/// the same as the one-block-per-line form.
#[test]
fn consul_hcl1_layouts_parse_as_their_multiline_forms() {
    let corpus = [
        (
            r#"service "web" { policy = "write" } node_prefix "" { policy = "read" }"#,
            "service \"web\" {\n policy = \"write\"\n}\nnode_prefix \"\" {\n policy = \"read\"\n}",
        ),
        (
            r#"service_prefix "" { policy = "read" intentions = "read" }"#,
            "service_prefix \"\" {\n policy = \"read\"\n intentions = \"read\"\n}",
        ),
        (
            "service \"db\" {\n\tpolicy = \"read\",\n\tintentions = \"deny\"\n}",
            "service \"db\" {\n policy = \"read\"\n intentions = \"deny\"\n}",
        ),
        (
            r#"acl = "read" operator = "write" keyring = "read""#,
            "acl = \"read\"\noperator = \"write\"\nkeyring = \"read\"",
        ),
        (
            "# a comment { with braces }\nkey_prefix \"app/{x}\" { policy = \"list\" } session_prefix \"\" { policy = \"write\" }",
            "key_prefix \"app/{x}\" {\n policy = \"list\"\n}\nsession_prefix \"\" {\n policy = \"write\"\n}",
        ),
        (
            r#"agent_prefix "" { policy = "read" } event_prefix "" { policy = "read" } query_prefix "" { policy = "read" }"#,
            "agent_prefix \"\" {\n policy = \"read\"\n}\nevent_prefix \"\" {\n policy = \"read\"\n}\nquery_prefix \"\" {\n policy = \"read\"\n}",
        ),
    ];
    for (one_line, multiline) in corpus {
        let got = Rules::parse(one_line).unwrap_or_else(|e| panic!("{one_line}: {e}"));
        assert_eq!(got, Rules::parse(multiline).unwrap(), "{one_line}");
    }
    // What HCL 1 does not take either is still an error, at its place in the text as written.
    let e = Rules::parse(r#"service "web" { policy = }"#).unwrap_err();
    assert_eq!(e.line, 1, "{e}");
}

#[test]
fn hcl_and_json_forms_parse_to_the_same_rules() {
    let hcl = r#"
service "web" { policy = "write" }
service_prefix "" {
  policy     = "read"
  intentions = "read"
}
node_prefix "" { policy = "read" }
operator = "read"
key_prefix "" { policy = "read" }
"#;
    let json = r#"{"service": {"web": {"policy": "write"}},
        "service_prefix": {"": {"policy": "read", "intentions": "read"}},
        "node_prefix": {"": {"policy": "read"}}, "operator": "read",
        "key_prefix": {"": {"policy": "read"}}}"#;
    let a = Rules::parse(hcl).unwrap();
    let b = Rules::parse(json).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.operator, Some(Access::Read));
    assert_eq!(a.named.len(), 4);
    assert_eq!(a.named[0].resource, Resource::Service);
    assert_eq!(Rules::parse("").unwrap(), Rules::default());
}

#[test]
fn errors_name_line_and_column() {
    let e =
        Rules::parse("service \"web\" { policy = \"write\" }\nservice \"db\" { policy = \"wirte\" }\n").unwrap_err();
    assert_eq!((e.line, e.column), (2, 25), "{e}");
    assert!(e.message.contains("\"wirte\" is not an access level"), "{e}");

    let e = Rules::parse("operator = \"read\"\n\n  bogus \"x\" { policy = \"read\" }").unwrap_err();
    assert_eq!((e.line, e.column), (3, 3), "{e}");
    assert!(e.message.contains("unknown rule \"bogus\""), "{e}");

    // A syntax error, from the HCL parser.
    let e = Rules::parse("service \"web\" {\n  policy = \n}").unwrap_err();
    assert_eq!(e.line, 2, "{e}");

    let e = Rules::parse("service \"web\" { intentions = \"read\" }").unwrap_err();
    assert!(e.message.contains("policy is required"), "{e}");
    let e = Rules::parse("node \"n\" {\n policy = \"read\"\n intentions = \"read\"\n}").unwrap_err();
    assert!(e.message.contains("unknown field \"intentions\""), "{e}");
    let e = Rules::parse("service = \"read\"").unwrap_err();
    assert!(e.message.contains("service is a block"), "{e}");
    let e = Rules::parse("operator = read").unwrap_err();
    assert!(e.message.contains("expected a quoted access level"), "{e}");

    let e =
        Rules::parse("{\"service\": {\"web\": {\"policy\": \"write\"}},\n \"node\": {\"n1\": {\"policy\": \"nope\"}}}")
            .unwrap_err();
    assert_eq!(e.line, 2, "{e}");
    assert!(e.message.contains("\"nope\" is not an access level"), "{e}");
    let e = Rules::parse("{\"service\": ").unwrap_err();
    assert!(e.message.contains("invalid JSON"), "{e}");
}

#[test]
fn exact_beats_longest_prefix_beats_default() {
    let a = authz(
        &[r#"
service_prefix "" { policy = "read" }
service_prefix "api-" { policy = "write" }
service "api-internal" { policy = "deny" }
"#],
        false,
    );
    assert!(a.service_read("web"));
    assert!(!a.service_write("web"));
    assert!(a.service_write("api-public"));
    assert!(!a.service_read("api-internal"));
    // No node rule: the default policy (deny).
    assert!(!a.node_read("n1"));
    let allow = authz(&[r#"service "web" { policy = "read" }"#], true);
    assert!(allow.node_write("n1"));
    assert!(!allow.service_write("web"), "a matching rule holds over the default");
}

#[test]
fn merged_policies_take_deny_then_write_then_read() {
    let a = authz(
        &[
            "service \"web\" { policy = \"read\" }\nservice \"db\" { policy = \"write\" }",
            "service \"web\" { policy = \"write\" }\nservice \"db\" { policy = \"deny\" }",
        ],
        true,
    );
    assert!(a.service_write("web"));
    assert!(!a.service_read("db"));
}

#[test]
fn intentions_follow_the_service_policy_unless_set() {
    let a = authz(
        &[r#"
service "web" { policy = "write" }
service "db" {
  policy = "read"
  intentions = "write"
}
service "cache" { policy = "deny" }
"#],
        true,
    );
    assert!(a.intention_read("web"));
    assert!(!a.intention_write("web"), "service write implies intentions read only");
    assert!(a.intention_write("db"));
    assert!(!a.intention_read("cache"));
    assert!(a.intention_write("other"), "default allow");
}

#[test]
fn acl_management_needs_an_explicit_rule_and_mesh_follows_operator() {
    let allow = Authorizer::default_policy(true);
    assert!(allow.service_write("x") && allow.operator_write());
    assert!(!allow.acl_read() && !allow.acl_write());
    let deny = Authorizer::default_policy(false);
    assert!(!deny.service_read("x") && !deny.mesh_read());

    let a = authz(&[r#"operator = "write""#], false);
    assert!(a.mesh_write());
    let a = authz(&["operator = \"write\"\nmesh = \"read\""], false);
    assert!(a.mesh_read() && !a.mesh_write());
    assert!(a.peering_write(), "peering follows operator");
    let a = authz(&["operator = \"write\"\npeering = \"read\""], false);
    assert!(a.peering_read() && !a.peering_write());
    let a = authz(&[r#"peering = "write""#], false);
    assert!(a.peering_read() && a.peering_write() && !a.operator_read());
    let a = authz(&[r#"acl = "read""#], false);
    assert!(a.acl_read() && !a.acl_write());
}

#[test]
fn global_management_grants_everything() {
    let a = authz(&[GLOBAL_MANAGEMENT_RULES], false);
    assert!(a.acl_write() && a.operator_write() && a.mesh_write() && a.peering_write());
    assert!(a.service_write("any") && a.intention_write("any"));
    assert!(a.node_write("n") && a.agent_write("n"));
}

#[test]
fn identities() {
    let s = Authorizer::new(&[Rules::service_identity("web")], false);
    assert!(s.service_write("web") && s.service_write("web-sidecar-proxy"));
    assert!(!s.service_write("db") && s.service_read("db") && s.node_read("n1"));
    assert!(!s.node_write("n1"));
    let n = Authorizer::new(&[Rules::node_identity("n1")], false);
    assert!(n.node_write("n1") && !n.node_write("n2") && n.service_read("web"));
    assert!(!n.service_write("web"));
}

#[test]
fn rules_round_trip_through_json() {
    let r = Rules::parse(GLOBAL_MANAGEMENT_RULES).unwrap();
    let back: Rules = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(r, back);
}

#[test]
fn key_rules_and_a_recursive_delete_needs_write_on_everything_under_it() {
    let a = authz(
        &[r#"
key_prefix "app/" { policy = "write" }
key_prefix "app/secret/" { policy = "read" }
key "app/locked" { policy = "deny" }
key_prefix "" { policy = "read" }
"#],
        false,
    );
    assert!(a.key_read("other") && !a.key_write("other"));
    assert!(a.key_write("app/x") && a.key_read("app/secret/db") && !a.key_write("app/secret/db"));
    assert!(!a.key_read("app/locked"));
    // Every rule under the prefix must grant write.
    assert!(
        !a.key_write_prefix("app/"),
        "a read-only prefix and a denied key lie under app/"
    );
    assert!(a.key_write_prefix("app/public/"));
    assert!(!a.key_write_prefix("app/secret/"));
    assert!(!a.key_write_prefix(""));
    // The default policy alone.
    assert!(authz(&[], true).key_write_prefix(""));
    assert!(!authz(&[], false).key_read("x"));
    // Consul's `list` level: on keys it reads (and lists) but does not write; anywhere else
    // it is refused by name, in HCL and JSON alike.
    let a = authz(&[r#"key_prefix "cfg/" { policy = "list" }"#], false);
    assert!(a.key_read("cfg/a") && !a.key_write("cfg/a") && !a.key_read("other"));
    let a = authz(
        &[
            r#"key_prefix "cfg/" { policy = "list" }"#,
            r#"key_prefix "cfg/" { policy = "write" }"#,
        ],
        false,
    );
    assert!(a.key_write("cfg/a"), "write takes precedence over list");
    for bad in [
        r#"service "web" { policy = "list" }"#,
        r#"operator = "list""#,
        r#"{"node": {"n1": {"policy": "list"}}}"#,
    ] {
        let e = Rules::parse(bad).unwrap_err();
        assert!(
            e.message
                .contains("applies only to the policy of key and key_prefix rules"),
            "{bad}: {e}"
        );
    }
    assert!(Rules::parse(r#"{"key": {"a": {"policy": "list"}}}"#).is_ok());
}

#[test]
fn service_write_on_any_service() {
    assert!(authz(&[r#"service "web" { policy = "write" }"#], false).service_write_any());
    assert!(authz(&[r#"service_prefix "app-" { policy = "write" }"#], false).service_write_any());
    assert!(!authz(&[r#"service_prefix "" { policy = "read" }"#], false).service_write_any());
    assert!(authz(&[], true).service_write_any());
    assert!(!authz(&[], false).service_write_any());
}
