//! The main job, end to end on this machine: a `meshd server` on a temporary data dir, two
//! services with sidecars, two real Envoys, traffic through the mesh over mTLS, an intention
//! that denies it and its removal that allows it again. Every process it starts is stopped.
//!
//! Run: `cargo xtask demo` (it installs the pinned Envoy first).
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

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

#[tokio::main]
async fn main() {
    let envoy =
        std::env::var("MESHD_ENVOY").expect("MESHD_ENVOY must name the Envoy binary (cargo xtask demo sets it)");
    let data_dir = tempfile::tempdir().unwrap();
    println!("1. starting meshd server (data dir {})", data_dir.path().display());
    let test_support::process::ServerProcess { child, http, grpc } = test_support::process::start_server(
        &meshd(),
        [
            std::ffi::OsStr::new("-log-level"),
            "warn".as_ref(),
            "-data-dir".as_ref(),
            data_dir.path().as_os_str(),
        ],
    );
    let server = Proc("meshd server", child);
    println!("   HTTP API {http}, xDS {grpc}");

    let client = reqwest::Client::new();
    let put = |path: &str, body: Value| {
        let req = client.put(format!("{http}{path}")).json(&body);
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
        "2. registering api (backend :{api_port}, sidecar :{api_proxy}) and web (backend :{web_port}, sidecar :{web_proxy}, upstream api on :{upstream})"
    );
    for (node, svc, port, proxy, upstreams) in [
        ("node-api", "api", api_port, api_proxy, json!([])),
        (
            "node-web",
            "web",
            web_port,
            web_proxy,
            json!([{"DestinationName": "api", "LocalBindPort": upstream}]),
        ),
    ] {
        put(
            "/v1/catalog/register",
            json!({"Node": node, "Address": "127.0.0.1", "Service": {"Service": svc, "Port": port}}),
        )
        .await;
        put(
            "/v1/catalog/register",
            json!({"Node": node, "Address": "127.0.0.1", "Service": {"Kind": "connect-proxy",
            "ID": format!("{svc}-sidecar-proxy"), "Service": format!("{svc}-sidecar-proxy"), "Port": proxy,
            "Proxy": {"DestinationServiceName": svc, "LocalServicePort": port, "Upstreams": upstreams}}}),
        )
        .await;
    }

    println!("3. starting two Envoys with `meshd connect envoy -sidecar-for ...`");
    let dir = tempfile::tempdir().unwrap();
    let mut envoys = Vec::new();
    for svc in ["api", "web"] {
        let run_dir = dir.path().join(svc);
        let admin_file = run_dir.join("admin-0.addr");
        let child = Command::new(meshd())
            .args([
                "connect",
                "envoy",
                "-sidecar-for",
                svc,
                "-http-addr",
                http.trim_start_matches("http://"),
                "-grpc-addr",
                &grpc,
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
            .args(["-envoy-binary", &envoy, "--", "-l", "error"])
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

    let url = format!("http://127.0.0.1:{upstream}/");
    println!("4. GET {url} (web's upstream listener -> mTLS -> api's sidecar -> api)");
    let body = until("traffic through the mesh", async || get(&url).await.ok()).await;
    println!("   200: {body:?}");

    println!("5. intention web -> api: deny");
    put(
        "/v1/connect/intentions/exact?source=web&destination=api",
        json!({"Action": "deny"}),
    )
    .await;
    let err = until("the deny to apply", async || get(&url).await.err()).await;
    println!("   blocked: {err}");

    println!("6. intention web -> api: allow");
    put(
        "/v1/connect/intentions/exact?source=web&destination=api",
        json!({"Action": "allow"}),
    )
    .await;
    let body = until("the allow to apply", async || get(&url).await.ok()).await;
    println!("   200 again: {body:?}");

    println!("7. stopping everything this demo started");
    drop(envoys);
    drop(server);
    println!("done");
}
