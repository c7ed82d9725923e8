//! `meshd connect envoy -gateway=ingress|terminating -service NAME -register -address
//! HOST:PORT -bootstrap` against a real server and a real agent: the gateway is registered
//! (catalog on the server's node, or with the agent) and the bootstrap is for it. Bad flags
//! fail with one clear line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::Duration;

/// A process stopped (SIGTERM, then SIGKILL) by its own handle when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        supervisor::process::terminate_blocking(&mut self.0, Duration::from_secs(10));
    }
}

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_meshd"))
}

fn meshd(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn addr(http: &str) -> &str {
    http.strip_prefix("http://").unwrap_or(http)
}

fn get(url: &str) -> serde_json::Value {
    reqwest::blocking::get(url).unwrap().json().unwrap()
}

#[test]
fn register_on_a_server_then_bootstrap() {
    let run = tempfile::tempdir().unwrap();
    let server = test_support::process::start_server(bin(), ["-dev", "-log-level", "warn"]);
    let _server = Proc(server.child);
    let http = addr(&server.http).to_owned();
    let out = meshd(&[
        "connect",
        "envoy",
        "-gateway=ingress",
        "-service",
        "ing",
        "-register",
        "-address",
        "10.0.0.5:8443",
        "-node",
        "gw-node",
        "-http-addr",
        &http,
        "-bootstrap",
        // Where the bootstrap's admin socket would be (else a temp dir kept for Envoy).
        "-run-dir",
        run.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let bootstrap: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(bootstrap["node"]["id"], "ing", "{bootstrap}");
    assert_eq!(bootstrap["node"]["cluster"], "ing");
    let nodes = get(&format!("{}/v1/catalog/service/ing", server.http));
    assert_eq!(nodes.as_array().unwrap().len(), 1, "{nodes}");
    let n = &nodes[0];
    assert_eq!(
        (
            &n["Node"],
            &n["ServiceKind"],
            &n["ServiceID"],
            &n["ServiceAddress"],
            &n["ServicePort"]
        ),
        (
            &"gw-node".into(),
            &"ingress-gateway".into(),
            &"ing".into(),
            &"10.0.0.5".into(),
            &8443.into()
        )
    );

    // Without -node, a server registers it on its own node, as the agent it also is (as
    // Consul's servers do); a terminating gateway registers the same way.
    let out = meshd(&[
        "connect",
        "envoy",
        "-gateway",
        "terminating",
        "-service",
        "tgw",
        "-register",
        "-address",
        "10.0.0.6:9000",
        "-http-addr",
        &http,
        "-bootstrap",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let own = get(&format!("{}/v1/agent/self", server.http))["Config"]["NodeName"].clone();
    let nodes = get(&format!("{}/v1/catalog/service/tgw", server.http));
    assert_eq!(nodes.as_array().map(Vec::len), Some(1), "{nodes}");
    assert_eq!(nodes[0]["Node"], own, "{nodes}");
    assert_eq!(nodes[0]["ServiceKind"], "terminating-gateway", "{nodes}");
}

#[test]
fn register_with_an_agent_then_bootstrap() {
    let run = tempfile::tempdir().unwrap();
    let server = test_support::process::start_server(bin(), ["-dev", "-log-level", "warn"]);
    let _server = Proc(server.child);
    let agent = test_support::process::start_agent(
        bin(),
        [
            "-dev",
            "-node",
            "edge",
            "-advertise",
            "127.0.0.1",
            "-retry-join",
            addr(&server.http),
            "-log-level",
            "warn",
        ],
    );
    let _agent = Proc(agent.child);
    let out = meshd(&[
        "connect",
        "envoy",
        "-gateway=terminating",
        "-service",
        "tgw",
        "-register",
        "-address",
        "127.0.0.1:9443",
        "-http-addr",
        addr(&agent.http),
        "-bootstrap",
        "-run-dir",
        run.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let bootstrap: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(bootstrap["node"]["id"], "tgw", "{bootstrap}");
    // The agent's node: the proxy it serves is found there.
    assert_eq!(bootstrap["node"]["metadata"]["node_name"], "edge", "{bootstrap}");
    // A -node naming another node than the agent's is refused: the agent would never serve it.
    let out = meshd(&[
        "connect",
        "envoy",
        "-gateway=terminating",
        "-service",
        "tgw",
        "-node",
        "elsewhere",
        "-http-addr",
        addr(&agent.http),
        "-bootstrap",
        "-run-dir",
        run.path().to_str().unwrap(),
    ]);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("-node \"elsewhere\": the agent at") && err.contains("\"edge\""),
        "{err}"
    );
    let services = get(&format!("{}/v1/agent/services", agent.http));
    let tgw = &services["tgw"];
    assert_eq!(tgw["Kind"], "terminating-gateway", "{services}");
    assert_eq!((&tgw["Address"], &tgw["Port"]), (&"127.0.0.1".into(), &9443.into()));
}

#[test]
fn bad_gateway_flags_fail_with_one_line() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["-gateway=ingress", "-bootstrap"],
            "-gateway ingress needs -service NAME",
        ),
        (
            &["-gateway=ingress", "-service", "ing", "-register", "-bootstrap"],
            "-register needs -address HOST:PORT",
        ),
        (
            &[
                "-gateway=ingress",
                "-service",
                "ing",
                "-register",
                "-address",
                "10.0.0.5",
                "-bootstrap",
            ],
            "expected HOST:PORT",
        ),
        (&["-gateway=egress", "-service", "a"], "invalid value 'egress'"),
        (
            &[
                "-gateway=ingress",
                "-service",
                "ing",
                "-register",
                "-address",
                "10.0.0.5:443",
                "-wan-address",
                "203.0.113.5:443",
                "-bootstrap",
            ],
            "-wan-address \"203.0.113.5:443\": only a mesh gateway (-gateway mesh) has one",
        ),
    ];
    for (flags, expect) in cases {
        let mut args = vec!["connect", "envoy", "-http-addr", "127.0.0.1:1"];
        args.extend_from_slice(flags);
        let out = meshd(&args);
        assert!(!out.status.success(), "{flags:?}");
        let err = stderr(&out);
        assert!(err.contains(expect), "{flags:?}: {err}");
        if !expect.starts_with("invalid value") {
            assert_eq!(err.trim().lines().count(), 1, "{flags:?}: {err}");
        }
    }
}
