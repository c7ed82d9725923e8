//! `meshd acl` against a real server with ACLs on: bootstrap (once), a policy from a rules
//! file, a token linking it; the token works for what the policy grants and nothing else.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use crate::mesh;
use mesh::Proc;

fn meshd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_meshd")).args(args).output().unwrap()
}

fn field(out: &Output, name: &str) -> String {
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_then_a_policy_and_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = test_support::process::start_server(
        Path::new(env!("CARGO_BIN_EXE_meshd")),
        [
            "-dev",
            "-log-level",
            "warn",
            "-acl-enabled",
            "-acl-default-policy",
            "deny",
        ],
    );
    let _server = Proc(server.child);
    let addr = server.http.clone();

    let boot = meshd(&["acl", "bootstrap", "-http-addr", &addr]);
    assert!(boot.status.success(), "{}", String::from_utf8_lossy(&boot.stderr));
    let management = field(&boot, "SecretID:");
    assert!(String::from_utf8_lossy(&boot.stdout).contains("global-management"));
    let again = meshd(&["acl", "bootstrap", "-http-addr", &addr]);
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        err.contains("ACL bootstrap no longer allowed") && err.lines().count() == 1,
        "{err}"
    );

    let token_file = dir.path().join("management.token");
    std::fs::write(&token_file, &management).unwrap();
    let rules = dir.path().join("web.hcl");
    std::fs::write(&rules, "service \"web\" {\n  policy = \"write\"\n}\n").unwrap();
    let tf = token_file.to_str().unwrap();
    let policy = meshd(&[
        "acl",
        "policy",
        "create",
        "-http-addr",
        &addr,
        "-token-file",
        tf,
        "-name",
        "web-write",
        "-rules",
        &format!("@{}", rules.display()),
    ]);
    assert!(policy.status.success(), "{}", String::from_utf8_lossy(&policy.stderr));
    assert_eq!(field(&policy, "Name:"), "web-write");

    let bad = meshd(&[
        "acl",
        "policy",
        "create",
        "-http-addr",
        &addr,
        "-token-file",
        tf,
        "-name",
        "bad",
        "-rules",
        "service \"web\" { policy = \"wirte\" }",
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("line 1, column"));

    let token = meshd(&[
        "acl",
        "token",
        "create",
        "-http-addr",
        &addr,
        "-token-file",
        tf,
        "-policy-name",
        "web-write",
        "-description",
        "web",
    ]);
    assert!(token.status.success(), "{}", String::from_utf8_lossy(&token.stderr));
    let secret = field(&token, "SecretID:");
    let client = reqwest::Client::new();
    let leaf = |service: &str| {
        client
            .get(format!("{addr}/v1/agent/connect/ca/leaf/{service}"))
            .header("X-Consul-Token", &secret)
            .send()
    };
    assert_eq!(leaf("web").await.unwrap().status(), 200);
    assert_eq!(leaf("db").await.unwrap().status(), 403);

    // Identities and a lifetime, printed back as Consul's CLI prints them.
    let create = |extra: &[&str]| {
        let mut args = vec!["acl", "token", "create", "-http-addr", &addr, "-token-file", tf];
        args.extend_from_slice(extra);
        meshd(&args)
    };
    let token = create(&[
        "-service-identity",
        "api",
        "-node-identity",
        "n1:dc1",
        "-expires-ttl",
        "1h",
    ]);
    assert!(token.status.success(), "{}", String::from_utf8_lossy(&token.stderr));
    let out = String::from_utf8_lossy(&token.stdout);
    for line in [
        "Service Identities:",
        "   api (Datacenters: all)",
        "Node Identities:",
        "   n1 (Datacenter: dc1)",
    ] {
        assert!(out.lines().any(|l| l == line), "{line:?} missing from:\n{out}");
    }
    assert!(out.contains("Expiration Time:  "), "{out}");
    // A lifetime that is no duration is refused before any request; one out of range by
    // the server; each in one line naming it.
    for (ttl, says) in [("2x", "-expires-ttl \"2x\""), ("30s", "ExpirationTTL")] {
        let bad = create(&["-expires-ttl", ttl]);
        assert!(!bad.status.success());
        let err = String::from_utf8_lossy(&bad.stderr);
        assert!(err.contains(says) && err.trim().lines().count() == 1, "{err}");
    }
}
