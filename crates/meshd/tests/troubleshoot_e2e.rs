//! `meshd troubleshoot upstream` against real Envoys: web's requests to a healthy upstream,
//! to a subset with no healthy instance, to a service an intention denies, to a service
//! with no instance at all, and to an instance whose Envoy holds a certificate web does not
//! trust (set up by another meshd, another CA) are each walked, and the step named as
//! failing is the one that makes web's Envoy fail the same request.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use serde_json::{Value, json};
use std::process::Command;
use std::time::Duration;
use test_support::http::named_backend as backend;
use test_support::reserve_port as free_port;

use crate::mesh;
use mesh::{Mesh, wait_for};

/// `meshd troubleshoot upstream` for web's sidecar: (its text, its JSON).
fn troubleshoot(mesh: &Mesh, upstream: &str, path: &str) -> (String, Value) {
    let run = |json: bool| {
        let out = Command::new(env!("CARGO_BIN_EXE_meshd"))
            .args([
                "troubleshoot",
                "upstream",
                "-http-addr",
                &mesh.http,
                "-proxy-id",
                "web-sidecar-proxy",
            ])
            .args(["-upstream", upstream, "-path", path])
            .args(json.then_some("-json"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let text = run(false);
    println!("{text}");
    (text, serde_json::from_str(&run(true)).unwrap())
}

/// A request through web's upstream listener on `port`: its status (0: the connection
/// failed or was reset).
async fn status(client: &reqwest::Client, port: u16, path: &str) -> u16 {
    match client
        .get(format!("http://127.0.0.1:{port}{path}"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
    {
        Ok(resp) => resp.status().as_u16(),
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_failing_request_is_walked_to_the_step_where_envoy_fails_it() {
    let mesh = Mesh::start();
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    for name in ["api", "denied", "missing", "rogue"] {
        mesh.put(
            "/v1/config",
            json!({"Kind": "service-defaults", "Name": name, "Protocol": "http"}),
        )
        .await;
    }
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-resolver", "Name": "api", "DefaultSubset": "v1",
               "Subsets": {"v1": {"Filter": "Service.Meta.version == v1"}, "v2": {"Filter": "Service.Meta.version == v2"}}}),
    )
    .await;
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-router", "Name": "api", "Routes": [
            {"Match": {"HTTP": {"PathPrefix": "/v2"}}, "Destination": {"ServiceSubset": "v2"}}]}),
    )
    .await;
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-intentions", "Name": "denied", "Sources": [{"Name": "web", "Action": "deny"}]}),
    )
    .await;
    for (service, node) in [("api", "node-api"), ("denied", "node-denied")] {
        let port = backend(service);
        mesh.put(
            "/v1/catalog/register",
            json!({"Node": node, "Address": "127.0.0.1", "Service": {"Service": service, "Port": port, "Meta": {"version": "v1"}}}),
        )
        .await;
        let proxy = format!("{service}-sidecar-proxy");
        mesh.put(
            "/v1/catalog/register",
            json!({"Node": node, "Address": "127.0.0.1", "Service": {"Kind": "connect-proxy", "ID": proxy, "Service": proxy,
                   "Port": free_port(), "Meta": {"version": "v1"}, "Proxy": {"DestinationServiceName": service, "LocalServicePort": port}}}),
        )
        .await;
    }
    // rogue's only instance: its Envoy was set up by another meshd (its own CA), registered
    // here with the port that Envoy listens on.
    let other = Mesh::start();
    let rogue_public = free_port();
    other
        .register(
            "node-rogue",
            "rogue",
            backend("rogue"),
            rogue_public,
            json!([]),
            json!({}),
        )
        .await;
    let rogue_port = backend("rogue");
    mesh.register("node-rogue", "rogue", rogue_port, rogue_public, json!([]), json!({}))
        .await;
    let (api_up, denied_up, missing_up, rogue_up) = (free_port(), free_port(), free_port(), free_port());
    mesh.register(
        "node-web",
        "web",
        backend("web"),
        free_port(),
        json!([{"DestinationName": "api", "LocalBindPort": api_up},
               {"DestinationName": "denied", "LocalBindPort": denied_up},
               {"DestinationName": "missing", "LocalBindPort": missing_up},
               {"DestinationName": "rogue", "LocalBindPort": rogue_up}]),
        json!({}),
    )
    .await;
    let (_api, _) = mesh.envoy("api", "node-api", dir.path()).await;
    let (_denied, _) = mesh.envoy("denied", "node-denied", dir.path()).await;
    let (_rogue, _) = other.envoy("rogue", "node-rogue", dir.path()).await;
    let (_web, web_admin) = mesh.envoy("web", "node-web", dir.path()).await;
    wait_for(|| async { (status(&client, api_up, "/").await == 200).then_some(()) }).await;

    // (e) The healthy path: every step passes, and Envoy serves it.
    let (text, walk) = troubleshoot(&mesh, "api", "/");
    assert!(walk["FailsAt"].is_null(), "{text}");
    let steps: Vec<&str> = walk["Steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["Step"].as_str().unwrap())
        .collect();
    assert_eq!(
        steps,
        [
            "certificate",
            "listener",
            "route",
            "target",
            "instances",
            "handshake",
            "mtls",
            "intention"
        ],
        "{text}"
    );
    assert!(text.contains("The request gets through."));

    // (b) A route to a subset with no healthy instance: the instances step; Envoy answers 503.
    let (text, walk) = troubleshoot(&mesh, "api", "/v2/x");
    assert_eq!(walk["FailsAt"], "instances", "{text}");
    assert!(
        text.contains("route 1 of 2 matches /v2/x") && text.contains("subset v2"),
        "{text}"
    );
    assert_eq!(status(&client, api_up, "/v2/x").await, 503);

    // (a) An intention that denies: the intention step, with the intention; Envoy refuses.
    let (text, walk) = troubleshoot(&mesh, "denied", "/");
    assert_eq!(walk["FailsAt"], "intention", "{text}");
    assert!(text.contains("Matched L4 intention web => denied: deny"), "{text}");
    let denied = status(&client, denied_up, "/").await;
    assert!(
        denied == 403 || denied == 503 || denied == 0,
        "Envoy let it through: {denied}"
    );

    // (c) A service nobody registered: no instance; Envoy answers 503.
    let (text, walk) = troubleshoot(&mesh, "missing", "/");
    assert_eq!(walk["FailsAt"], "instances", "{text}");
    assert_eq!(status(&client, missing_up, "/").await, 503);

    // (d) An instance whose Envoy presents a certificate web does not trust (another CA):
    // every certificate meshd holds is fine, the handshake is not; Envoy fails the request.
    let (text, walk) = troubleshoot(&mesh, "rogue", "/");
    assert_eq!(walk["FailsAt"], "handshake", "{text}");
    assert!(
        text.contains("rogue-sidecar-proxy on node-rogue at 127.0.0.1:")
            && text.contains("which the source does not trust"),
        "{text}"
    );
    assert_eq!(status(&client, rogue_up, "/").await, 503);

    // An upstream the proxy does not have: the upstream step, naming the ones it has.
    let (text, walk) = troubleshoot(&mesh, "nope", "/");
    assert_eq!(walk["FailsAt"], "upstream", "{text}");
    assert!(text.contains("its upstreams: api, denied, missing, rogue"), "{text}");

    // `troubleshoot proxy` on web's Envoy: resource by resource, its config dump is what
    // meshd sent (and what is wrong is what the walks found: clusters with no endpoint).
    let out = Command::new(env!("CARGO_BIN_EXE_meshd"))
        .args([
            "troubleshoot",
            "proxy",
            "-http-addr",
            &mesh.http,
            "-envoy-admin",
            &web_admin,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    println!("{text}");
    let matched = text
        .lines()
        .find(|l| l.contains("resources Envoy runs match what meshd sent"))
        .unwrap_or_else(|| panic!("{text}"));
    for t in ["Clusters", "ClusterLoadAssignments", "Listeners", "RouteConfigurations"] {
        assert!(matched.contains(t), "{text}");
    }
    assert!(
        !text.contains("does not hold it") && !text.contains("does not send it") && !text.contains("at version"),
        "{text}"
    );
}
