//! The main job, end to end on this machine, in agent mode: a `meshd server` on a temporary
//! data dir, two `meshd agent`s (nodes `node-api` and `node-web`), `api` and `web` registered
//! with their local agents (sidecars from `Connect.SidecarService`), a real Envoy attached to
//! each agent, traffic through the mesh over mTLS, an intention that denies it and one that
//! allows it again. Every process it starts is stopped.
//!
//! Run: `cargo xtask demo` (it installs the pinned Envoy first). `cargo xtask demo multi-dc`
//! runs a second act instead: two datacenters, failover between them through mesh gateways
//! (`demo/multi_dc.rs`).
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

#[path = "demo/multi_dc.rs"]
mod multi_dc;

struct Proc(&'static str, Child);

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGTERM: the server shuts down cleanly, the supervisors drain their Envoy first.
        supervisor::process::terminate_blocking(&mut self.1, Duration::from_secs(10));
        println!("   stopped {} (pid {})", self.0, self.1.id());
    }
}

use test_support::http::named_backend as backend;
use test_support::reserve_port as free_port;

fn meshd() -> PathBuf {
    std::env::var("MESHD_BIN").map(PathBuf::from).unwrap_or_else(|_| {
        let exe = std::env::current_exe().unwrap();
        exe.parent().and_then(|p| p.parent()).unwrap().join("meshd")
    })
}

async fn get(url: &str) -> Result<String, String> {
    let resp = reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp.text().await.map_err(|e| e.to_string())?;
    if status.is_success() {
        Ok(body)
    } else {
        Err(format!("HTTP {status}"))
    }
}

async fn until<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("gave up waiting for {what}");
}

/// Step 2: two agents joining the server at `http`, with their HTTP and xDS addresses.
fn start_agents(http: &str) -> Vec<(Proc, String, String)> {
    println!("2. starting two agents that join it (nodes node-api and node-web)");
    let mut agents = Vec::new();
    for node in ["node-api", "node-web"] {
        let started = test_support::process::start_agent(
            &meshd(),
            [
                "-dev",
                "-node",
                node,
                "-advertise",
                "127.0.0.1",
                "-retry-join",
                http.trim_start_matches("http://"),
                "-log-level",
                "warn",
            ],
        );
        println!("   agent {node}: HTTP {}, xDS {}", started.http, started.grpc);
        agents.push((
            Proc(
                if node == "node-api" {
                    "meshd agent (node-api)"
                } else {
                    "meshd agent (node-web)"
                },
                started.child,
            ),
            started.http,
            started.grpc,
        ));
    }

    agents
}

/// Step 4: an Envoy per agent with `meshd connect envoy -sidecar-for ...`, and the
/// directory holding their run dirs.
async fn start_envoys(agents: &[(Proc, String, String)], envoy: &str) -> (tempfile::TempDir, Vec<Proc>) {
    let dir = tempfile::tempdir().unwrap();
    let mut envoys = Vec::new();
    for (svc, (_, agent_http, agent_grpc)) in ["api", "web"].into_iter().zip(agents) {
        let run_dir = dir.path().join(svc);
        let admin_file = run_dir.join("admin-0.addr");
        let child = Command::new(meshd())
            .args([
                "connect",
                "envoy",
                "-sidecar-for",
                svc,
                "-http-addr",
                agent_http.trim_start_matches("http://"),
                "-grpc-addr",
                agent_grpc,
            ])
            .args([
                "-admin-bind",
                "127.0.0.1:0",
                "-log-level",
                "warn",
                "-drain-time",
                "1s",
                "-run-dir",
            ])
            .arg(&run_dir)
            .args(["-envoy-binary", envoy, "--", "-l", "error"])
            .spawn()
            .unwrap();
        envoys.push(Proc(
            if svc == "api" {
                "meshd connect envoy (api)"
            } else {
                "meshd connect envoy (web)"
            },
            child,
        ));
        let admin = until("Envoy's admin address", async || {
            std::fs::read_to_string(&admin_file).ok().filter(|s| !s.is_empty())
        })
        .await;
        println!("   envoy for {svc}: admin http://{}", admin.trim());
    }

    (dir, envoys)
}

#[tokio::main]
async fn main() {
    let envoy =
        std::env::var("MESHD_ENVOY").expect("MESHD_ENVOY must name the Envoy binary (cargo xtask demo sets it)");
    match std::env::args().nth(1).as_deref() {
        None => {}
        Some("multi-dc") => return multi_dc::run(&envoy).await,
        Some(other) => panic!("unknown act {other:?}: expected none, or multi-dc"),
    }
    let tmp = tempfile::tempdir().unwrap();
    // A path that does not exist yet: the server creates it private (0700).
    let data_dir = tmp.path().join("server");
    println!("1. starting meshd server (data dir {})", data_dir.display());
    let test_support::process::ServerProcess { child, http, grpc, .. } = test_support::process::start_server(
        &meshd(),
        [
            std::ffi::OsStr::new("-log-level"),
            "warn".as_ref(),
            "-data-dir".as_ref(),
            data_dir.as_os_str(),
        ],
    );
    let server = Proc("meshd server", child);
    println!("   HTTP API {http}, xDS {grpc}");

    let agents = start_agents(&http);

    let client = reqwest::Client::new();
    let put = |url: String, body: Value| {
        let req = client.put(url).json(&body);
        async move {
            req.send()
                .await
                .unwrap()
                .error_for_status()
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    let (api_port, web_port) = (backend("hello from api, through the mesh"), backend("web"));
    let (api_proxy, web_proxy, upstream) = (free_port(), free_port(), free_port());
    println!(
        "3. registering api with node-api's agent (backend :{api_port}, sidecar :{api_proxy}) and web with node-web's (backend :{web_port}, sidecar :{web_proxy}, upstream api on :{upstream})"
    );
    put(
        format!("{}/v1/agent/service/register", agents[0].1),
        json!({"Name": "api", "Port": api_port, "Connect": {"SidecarService": {"Port": api_proxy}}}),
    )
    .await;
    put(
        format!("{}/v1/agent/service/register", agents[1].1),
        json!({"Name": "web", "Port": web_port, "Connect": {"SidecarService": {"Port": web_proxy,
            "Proxy": {"Upstreams": [{"DestinationName": "api", "LocalBindPort": upstream}]}}}}),
    )
    .await;

    println!("4. starting an Envoy per agent with `meshd connect envoy -sidecar-for ...` (configured by that agent)");
    let (_envoy_dirs, envoys) = start_envoys(&agents, &envoy).await;

    let url = format!("http://127.0.0.1:{upstream}/");
    println!("5. GET {url} (web's upstream listener -> mTLS -> api's sidecar -> api)");
    let body = until("traffic through the mesh", async || get(&url).await.ok()).await;
    println!("   200: {body:?}");

    let intention = format!("{http}/v1/connect/intentions/exact?source=web&destination=api");
    println!("6. intention web -> api: deny (written at the server; the agents' caches pick it up)");
    put(intention.clone(), json!({"Action": "deny"})).await;
    let err = until("the deny to apply", async || get(&url).await.err()).await;
    println!("   blocked: {err}");

    println!("7. intention web -> api: allow");
    put(intention, json!({"Action": "allow"})).await;
    let body = until("the allow to apply", async || get(&url).await.ok()).await;
    println!("   200 again: {body:?}");

    println!("8. stopping everything this demo started");
    drop(envoys);
    drop(agents);
    drop(server);
    println!("done");
}
