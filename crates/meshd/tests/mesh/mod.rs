//! What the end-to-end tests with a real Envoy share: a `meshd server -dev`, catalog
//! registrations over its HTTP API, Envoys run under `meshd connect envoy`, polling.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;
use test_support::envoy;

/// A child process killed (by its own pid handle) when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGTERM: the supervisors drain their Envoy (1 s) and clean up after it.
        supervisor::process::terminate_blocking(&mut self.0, Duration::from_secs(10));
    }
}

/// Stops `procs` together (each drains for about a second: one after the other they would
/// add up).
pub fn stop_together(procs: Vec<Proc>) {
    std::thread::scope(|s| {
        for p in procs {
            s.spawn(move || drop(p));
        }
    });
}

pub struct Mesh {
    _server: Proc,
    pub http: String,
    pub grpc: String,
    pub client: reqwest::Client,
}

impl Mesh {
    pub fn start() -> Mesh {
        Self::of(test_support::process::start_server(
            std::path::Path::new(env!("CARGO_BIN_EXE_meshd")),
            ["-dev", "-log-level", "warn"],
        ))
    }

    /// The mesh of a server already started (stopped when the mesh is dropped).
    pub fn of(server: test_support::process::ServerProcess) -> Mesh {
        let test_support::process::ServerProcess { child, http, grpc, .. } = server;
        Mesh {
            _server: Proc(child),
            http,
            grpc,
            client: reqwest::Client::new(),
        }
    }

    /// Kills the server with SIGKILL (by its own handle): a crash, no goodbye to its streams.
    pub fn kill_server(&mut self) {
        let _ = self._server.0.kill();
        let _ = self._server.0.wait();
    }

    pub async fn put(&self, path: &str, body: Value) {
        let resp = self
            .client
            .put(format!("{}{path}", self.http))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{path}: {}", resp.text().await.unwrap());
    }

    pub async fn register(
        &self,
        node: &str,
        service: &str,
        port: u16,
        proxy_port: u16,
        upstreams: Value,
        config: Value,
    ) {
        self.put(
            "/v1/catalog/register",
            json!({"Node": node, "Address": "127.0.0.1", "Service": {"Service": service, "Port": port}}),
        )
        .await;
        let proxy = json!({"Kind": "connect-proxy", "ID": format!("{service}-sidecar-proxy"), "Service": format!("{service}-sidecar-proxy"),
            "Port": proxy_port, "Proxy": {"DestinationServiceName": service, "LocalServicePort": port, "Upstreams": upstreams, "Config": config}});
        self.put(
            "/v1/catalog/register",
            json!({"Node": node, "Address": "127.0.0.1", "Service": proxy}),
        )
        .await;
    }

    /// Runs Envoy for a sidecar under `meshd connect envoy` (which supervises it); returns
    /// the supervisor process and Envoy's admin URL.
    pub async fn envoy(&self, service: &str, node: &str, dir: &Path) -> (Proc, String) {
        let run_dir = dir.join(format!("{service}-{node}"));
        run_envoy(service, node, &self.http, &["-grpc-addr", &self.grpc], &run_dir).await
    }

    pub async fn metric(&self, name: &str) -> f64 {
        test_support::process::metric(&self.client, &self.http, name).await
    }
}

/// Runs Envoy for `service`'s sidecar on `node` under `meshd connect envoy` against the API at
/// `http`, with `xds` (the xDS flags: address, CA, token file) added; returns the supervisor
/// and Envoy's admin URL once it listens.
pub async fn run_envoy<S: AsRef<std::ffi::OsStr>>(
    service: &str,
    node: &str,
    http: &str,
    xds: &[S],
    run_dir: &Path,
) -> (Proc, String) {
    run_proxy(&["-sidecar-for", service, "-node", node], http, xds, run_dir).await
}

/// Runs Envoy under `meshd connect envoy` for the proxy `which` names (`-sidecar-for ...`,
/// `-gateway ... -register ...`) against the API at `http`, with `xds` added; returns the
/// supervisor and Envoy's admin URL once it listens.
pub async fn run_proxy<S: AsRef<std::ffi::OsStr>>(
    which: &[&str],
    http: &str,
    xds: &[S],
    run_dir: &Path,
) -> (Proc, String) {
    let admin_file = run_dir.join("admin-0.addr");
    let child = Command::new(env!("CARGO_BIN_EXE_meshd"))
        .args(["connect", "envoy"])
        .args(which)
        .args(["-http-addr", http.trim_start_matches("http://")])
        .args(xds)
        .args([
            "-admin-bind",
            "127.0.0.1:0",
            "-log-level",
            "warn",
            "-drain-time",
            "1s",
            "-run-dir",
        ])
        .arg(run_dir)
        .arg("-envoy-binary")
        .arg(envoy())
        .args(["--", "-l", "error"])
        .spawn()
        .unwrap();
    let proc = Proc(child);
    let admin = wait_for(|| async { std::fs::read_to_string(&admin_file).ok().filter(|s| !s.is_empty()) }).await;
    (proc, format!("http://{}", admin.trim()))
}

/// Polls `check` until it yields a value (real processes: there is no clock to pause).
pub async fn wait_for<T, F: std::future::Future<Output = Option<T>>>(mut check: impl FnMut() -> F) -> T {
    for _ in 0..600 {
        if let Some(v) = check().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("condition not reached within 30 s");
}

pub async fn get(client: &reqwest::Client, url: &str) -> Option<String> {
    let resp = client.get(url).timeout(Duration::from_secs(2)).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    resp.text().await.ok()
}
