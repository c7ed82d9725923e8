//! Sidecar ports of agents sharing a host: each agent gives sidecars (and managed proxies)
//! registered without a port one from its own range (`-sidecar-min-port`/`-sidecar-max-port`,
//! or the config file's `ports`), skipping ports its registrations use; a full range is a 400
//! naming it; a range upside down is a start error. With Consul's default range every agent
//! handed out 21000, and their Envoys bound the same port.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::agents;
use agents::{Proc, meshd};
use serde_json::{Value, json};

/// Registers `body` with the agent at `agent`: the status and the answer.
async fn register(client: &reqwest::Client, agent: &str, body: Value) -> (u16, String) {
    let resp = client
        .put(format!("{agent}/v1/agent/service/register"))
        .json(&body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// The port the agent at `agent` gave service `id`.
async fn port_of(client: &reqwest::Client, agent: &str, id: &str) -> u64 {
    let services: Value = client
        .get(format!("{agent}/v1/agent/services"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    services[id]["Port"]
        .as_u64()
        .unwrap_or_else(|| panic!("no {id}: {services}"))
}

fn sidecar_of(name: &str, port: u16) -> Value {
    json!({"Name": name, "Port": port, "Connect": {"SidecarService": {}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_on_one_host_give_sidecars_ports_from_their_own_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let server = test_support::process::start_server(meshd(), ["-dev", "-log-level", "warn"]);
    let _server = Proc(server.child);
    let join = server.http.trim_start_matches("http://").to_owned();
    // Agent a: its range from flags; agent b: from its config file.
    let a = test_support::process::start_agent(
        meshd(),
        [
            "-dev",
            "-node",
            "a",
            "-retry-join",
            &join,
            "-log-level",
            "warn",
            "-sidecar-min-port",
            "22000",
            "-sidecar-max-port",
            "22002",
        ],
    );
    let _a = Proc(a.child);
    let b_config = dir.path().join("b.json");
    std::fs::write(
        &b_config,
        r#"{"ports": {"sidecar_min_port": 22100, "sidecar_max_port": 22199}}"#,
    )
    .unwrap();
    let b = test_support::process::start_agent(
        meshd(),
        [
            "-dev",
            "-node",
            "b",
            "-retry-join",
            &join,
            "-log-level",
            "warn",
            "-config-file",
            b_config.to_str().unwrap(),
        ],
    );
    let _b = Proc(b.child);
    let client = reqwest::Client::new();

    // The same registration on both agents: ports that do not collide.
    for agent in [&a.http, &b.http] {
        let (status, text) = register(&client, agent, sidecar_of("web", 8080)).await;
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(port_of(&client, &a.http, "web-sidecar-proxy").await, 22000);
    assert_eq!(port_of(&client, &b.http, "web-sidecar-proxy").await, 22100);

    // A service of a's own on 22001: skipped. A managed proxy (Consul 1.4's `Connect.Proxy`)
    // takes its port from the same range.
    let (status, text) = register(&client, &a.http, json!({"Name": "db", "Port": 22001})).await;
    assert_eq!(status, 200, "{text}");
    let (status, text) = register(
        &client,
        &a.http,
        json!({"Name": "api", "Port": 9090, "Connect": {"Proxy": {}}}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(port_of(&client, &a.http, "api-proxy").await, 22002);

    // a's range is used up: a 400 naming it.
    let (status, text) = register(&client, &a.http, sidecar_of("cache", 6379)).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("no free sidecar port left in 22000-22002"), "{text}");

    // `PUT /v1/agent/reload` reads b's config file again, as SIGHUP does.
    std::fs::write(
        &b_config,
        r#"{"ports": {"sidecar_min_port": 22100, "sidecar_max_port": 22199}, "services": [{"name": "cfg", "port": 7000}]}"#,
    )
    .unwrap();
    let reload = |client: &reqwest::Client| client.put(format!("{}/v1/agent/reload", b.http)).send();
    let cfg_port = |client: &reqwest::Client| {
        let request = client.get(format!("{}/v1/agent/services", b.http)).send();
        async move {
            let services: serde_json::Value = request.await.unwrap().json().await.unwrap();
            services["cfg"]["Port"].clone()
        }
    };
    let resp = reload(&client).await.unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    assert_eq!(cfg_port(&client).await, 7000);
    // A file that cannot be used: a 500 with the reason, and nothing changed.
    std::fs::write(&b_config, r#"{"services": [{"name": "cfg", "prot": 1}]}"#).unwrap();
    let resp = reload(&client).await.unwrap();
    assert_eq!(resp.status(), 500);
    let text = resp.text().await.unwrap();
    assert!(
        text.starts_with("Failed to reload configs: ") && text.contains("prot"),
        "{text}"
    );
    assert_eq!(cfg_port(&client).await, 7000);
}

#[test]
fn a_sidecar_port_range_upside_down_is_a_start_error() {
    let out = std::process::Command::new(meshd())
        .args(["agent", "-dev", "-retry-join", "127.0.0.1:1", "-dns-addr", "off"])
        .args(["-sidecar-min-port", "22010", "-sidecar-max-port", "22000"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.lines().count() == 1 && stderr.contains("-sidecar-min-port 22010 is above -sidecar-max-port 22000"),
        "{stderr}"
    );
}
