//! Agent-managed sidecars end to end with the real Envoy: two `meshd agent`s run the Envoys
//! of their services' sidecars themselves (no `meshd connect envoy` started here); restarting
//! or killing an agent under load drops no request and keeps the same Envoy; a killed proxy
//! is restarted; deregistering stops it and cleans up; a `-dev` agent stops its proxies.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use crate::agents;
use agents::{Proc, get, meshd, put, wait_for};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use test_support::envoy;
use test_support::http::named_backend as backend;
use test_support::reserve_port as free_port;

/// Kills (by pid) every process whose command line names `dir` when dropped: the managed
/// proxies an agent with a data dir leaves running, should the test fail before it stops
/// them itself.
struct KillUnder(PathBuf);

impl Drop for KillUnder {
    fn drop(&mut self) {
        let needle = self.0.to_string_lossy().into_owned();
        let Ok(procs) = std::fs::read_dir("/proc") else { return };
        for p in procs.filter_map(Result::ok) {
            let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&needle) {
                let _ = supervisor::process::signal(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

/// `GET path` on the admin interface of the managed Envoy of `proxy` under the agent data
/// dir `data_dir` (its epoch 0): a Unix socket, the body when the answer is a 200.
async fn admin_get(data_dir: &Path, proxy: &str, path: &str) -> Option<String> {
    let file = data_dir.join(format!("proxies/run/{proxy}/admin-0.addr"));
    let addr = supervisor::envoy::read_admin_address(&file)?;
    assert!(
        matches!(&addr, supervisor::envoy::AdminAddr::Unix(_)),
        "a managed Envoy's admin is a Unix socket: {addr}"
    );
    match supervisor::envoy::admin_request(addr, "GET", path).await {
        Ok((200, body)) => Some(body),
        _ => None,
    }
}

/// An agent that runs its sidecars, at fixed addresses so a restart comes back where it was.
struct Agent {
    http: String,
    grpc: String,
    args: Vec<String>,
    proc: Option<Proc>,
}

impl Agent {
    fn new(node: &str, server: &str, data_dir: Option<&Path>) -> Agent {
        let mut args: Vec<String> = vec![
            "-node".into(),
            node.into(),
            "-advertise".into(),
            "127.0.0.1".into(),
            "-retry-join".into(),
            server.trim_start_matches("http://").into(),
            "-managed-sidecars".into(),
            // Tests may run as root (in containers); proxies as root must be allowed then.
            "-allow-managed-root".into(),
            // The test registers a proxy with its own command through the API.
            "-allow-managed-api-registration".into(),
            "-envoy-binary".into(),
            envoy().to_string_lossy().into_owned(),
            // A restart must not take the node's services out of the catalog.
            "-leave-on-terminate=false".into(),
            "-log-level".into(),
            "warn".into(),
        ];
        match data_dir {
            Some(dir) => args.extend(["-data-dir".into(), dir.display().to_string()]),
            None => args.push("-dev".into()),
        }
        let mut agent = Agent {
            http: format!("127.0.0.1:{}", free_port()),
            grpc: format!("127.0.0.1:{}", free_port()),
            args,
            proc: None,
        };
        agent.start();
        agent
    }

    fn start(&mut self) {
        let p = test_support::process::start_agent_at(meshd(), &self.http, &self.grpc, &self.args);
        self.proc = Some(Proc(p.child));
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    /// SIGTERM, and wait until it has exited.
    fn stop(&mut self) {
        drop(self.proc.take());
    }

    /// SIGKILL: no chance to clean up anything.
    fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.0.kill().unwrap();
            p.0.wait().unwrap();
        }
    }

    async fn proxy(&self, client: &reqwest::Client, id: &str) -> Option<Value> {
        serde_json::from_str(&get(client, &self.url(&format!("/v1/agent/connect/proxy/{id}"))).await?).ok()
    }
}

/// The pid of the running managed proxy process (`meshd connect envoy`) of `id`.
async fn daemon_pid(client: &reqwest::Client, agent: &Agent, id: &str) -> Option<u32> {
    let v = agent.proxy(client, id).await?;
    (v["Status"]["State"] == "running")
        .then(|| v["Status"]["Pid"].as_u64())?
        .map(|p| p as u32)
}

/// The Envoy a `meshd connect envoy` process runs (its only child, spawned by whichever of
/// its threads: each thread lists its own children).
fn envoy_of(daemon: u32) -> Option<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{daemon}/task")).ok()?;
    tasks.filter_map(Result::ok).find_map(|t| {
        let children = std::fs::read_to_string(t.path().join("children")).ok()?;
        children.split_whitespace().next()?.parse().ok()
    })
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z'))
}

/// The `-base-id` a managed proxy process was given.
fn base_id_of(daemon: u32) -> u64 {
    let cmdline = std::fs::read(format!("/proc/{daemon}/cmdline")).unwrap();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let at = args.iter().position(|a| a == "-base-id").expect("a -base-id argument");
    args[at + 1].parse().unwrap()
}

/// Requests at `per_second` through `url` until stopped: (ok, failed).
fn load(url: String, per_second: u64, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<(u64, u64, Vec<String>)> {
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        let (ok, failed) = (AtomicU64::new(0), AtomicU64::new(0));
        let mut errors = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / per_second));
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            // A slow answer on a loaded machine is not a dropped request: 10 s each.
            match client.get(&url).timeout(Duration::from_secs(10)).send().await {
                Ok(r) if r.status().is_success() => {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
                Ok(r) => {
                    failed.fetch_add(1, Ordering::Relaxed);
                    errors.push(format!("HTTP {}", r.status()));
                }
                Err(e) => {
                    failed.fetch_add(1, Ordering::Relaxed);
                    errors.push(e.to_string());
                }
            }
        }
        (ok.into_inner(), failed.into_inner(), errors)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_run_their_sidecars_and_restarts_drop_no_request() {
    let server = test_support::process::start_server(meshd(), ["-dev", "-log-level", "warn"]);
    let _server = Proc(server.child);
    let data = tempfile::tempdir().unwrap();
    let a_dir: PathBuf = data.path().join("agent-api");
    let _cleanup = KillUnder(data.path().to_path_buf());
    let mut a = Agent::new("node-api", &server.http, Some(&a_dir));
    let mut b = Agent::new("node-web", &server.http, None);
    let client = reqwest::Client::new();
    // Access logs to Envoy's standard output (the default type), until checked below.
    put(
        &client,
        &format!("{}/v1/config", server.http),
        json!({"Kind": "proxy-defaults", "Name": "global", "AccessLogs": {"Enabled": true}}),
    )
    .await;

    let (api_port, web_port) = (backend("api-1"), backend("web"));
    let (api_proxy, web_proxy, upstream) = (free_port(), free_port(), free_port());
    put(
        &client,
        &a.url("/v1/agent/service/register"),
        json!({"Name": "api", "ID": "api", "Port": api_port, "Connect": {"SidecarService": {"Port": api_proxy}}}),
    )
    .await;
    put(
        &client,
        &b.url("/v1/agent/service/register"),
        json!({"Name": "web", "ID": "web", "Port": web_port, "Connect": {"SidecarService": {"Port": web_proxy,
            "Proxy": {"Upstreams": [{"DestinationName": "api", "LocalBindPort": upstream}]}}}}),
    )
    .await;
    let through_mesh = format!("http://127.0.0.1:{upstream}/");
    assert_eq!(
        wait_for("traffic web → api", || get(&client, &through_mesh)).await,
        "api-1"
    );
    let api_daemon = wait_for("api's proxy running", || daemon_pid(&client, &a, "api-sidecar-proxy")).await;
    let api_envoy = envoy_of(api_daemon).expect("api's Envoy");
    let web_daemon = wait_for("web's proxy running", || daemon_pid(&client, &b, "web-sidecar-proxy")).await;
    let web_envoy = envoy_of(web_daemon).expect("web's Envoy");
    // mTLS between the two managed Envoys.
    let certs = admin_get(&a_dir, "api-sidecar-proxy", "/certs").await.unwrap();
    assert!(certs.contains("/ns/default/dc/dc1/svc/api"), "api's leaf: {certs}");
    assert!(a_dir.join("proxies/daemons/pids/api-sidecar-proxy.pid").exists());
    assert!(a_dir.join("proxies/daemons/logs/api-sidecar-proxy-stderr.log").exists());
    // The access logs on Envoy's stdout reach the supervisor's log of it: api's inbound
    // connection to its application, as JSON.
    let stdout_log = a_dir.join("proxies/daemons/logs/api-sidecar-proxy-stdout.log");
    let line = wait_for("an access log line on api's Envoy's stdout", || async {
        let text = std::fs::read_to_string(&stdout_log).ok()?;
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["upstream_cluster"] == "local_app")
    })
    .await;
    println!("access log on stdout: {line}");
    put(
        &client,
        &format!("{}/v1/config", server.http),
        json!({"Kind": "proxy-defaults", "Name": "global"}),
    )
    .await;

    // Restart (5 × SIGTERM, then 5 × SIGKILL) the api host's agent under 200 requests/s.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = load(through_mesh.clone(), 200, Arc::clone(&stop));
    for round in 0..10 {
        if round < 5 {
            a.stop();
        } else {
            a.kill();
        }
        assert!(alive(api_envoy), "round {round}: the Envoy outlives its agent");
        a.start();
        let v = wait_for("the proxy re-adopted", || async {
            let v = a.proxy(&client, "api-sidecar-proxy").await?;
            (v["Status"]["Adopted"] == true).then_some(v)
        })
        .await;
        assert_eq!(v["Status"]["Pid"], api_daemon, "round {round}: the same proxy process");
        assert_eq!(envoy_of(api_daemon), Some(api_envoy), "round {round}: the same Envoy");
        // Its new agent serves it again before the next restart, and traffic runs a while.
        wait_for("the proxy's config served again", || async {
            let s: Value =
                serde_json::from_str(&get(&client, &a.url("/v1/internal/proxy-status/api-sidecar-proxy")).await?)
                    .ok()?;
            s["SnapshotVersion"].as_u64().map(|_| ())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let (ok, failed, errors) = traffic.await.unwrap();
    println!("requests through the mesh during 10 agent restarts: {ok} ok, {failed} failed");
    assert_eq!(failed, 0, "failed requests: {errors:?}");
    // That traffic ran through the restarts; its rate is the benchmarks' to measure (a
    // loaded machine sends fewer than the 200/s asked).
    assert!(ok >= 50, "too little traffic ran through the restarts to tell: {ok}");

    // The proxy process killed: restarted (the first restarts are immediate), LIVE again.
    supervisor::process::signal(api_daemon, rustix::process::Signal::KILL).unwrap();
    let restarted = wait_for("a new proxy process", || async {
        daemon_pid(&client, &a, "api-sidecar-proxy")
            .await
            .filter(|p| *p != api_daemon)
    })
    .await;
    let v = a.proxy(&client, "api-sidecar-proxy").await.unwrap();
    assert_eq!(v["Status"]["Restarts"], 1, "{v}");
    // (Adopted by this agent, so only that it ended is known, not how.)
    assert!(
        v["Status"]["LastExit"]
            .as_str()
            .unwrap()
            .contains(&format!("pid {api_daemon}")),
        "{v}"
    );
    wait_for("the new Envoy LIVE", || async {
        let ready = admin_get(&a_dir, "api-sidecar-proxy", "/ready").await?;
        (ready.trim() == "LIVE" && envoy_of(restarted).is_some()).then_some(())
    })
    .await;
    assert_eq!(wait_for("traffic again", || get(&client, &through_mesh)).await, "api-1");

    // The Envoy itself killed: its proxy process starts a new one, LIVE again.
    let killed_envoy = envoy_of(restarted).unwrap();
    supervisor::process::signal(killed_envoy, rustix::process::Signal::KILL).unwrap();
    wait_for("a new Envoy LIVE", || async {
        let fresh = envoy_of(restarted).filter(|p| *p != killed_envoy)?;
        let ready = admin_get(&a_dir, "api-sidecar-proxy", "/ready").await?;
        (ready.trim() == "LIVE").then_some(fresh)
    })
    .await;
    assert_eq!(daemon_pid(&client, &a, "api-sidecar-proxy").await, Some(restarted));
    assert_eq!(
        wait_for("traffic once more", || get(&client, &through_mesh)).await,
        "api-1"
    );

    // A proxy whose program does not exist: accepted, its status says why, retried with
    // back-off, and the other proxies go on.
    put(
        &client,
        &a.url("/v1/agent/service/register"),
        json!({"Name": "batch", "Port": free_port(), "Connect": {"Proxy": {
            "ExecMode": "daemon", "Command": ["/nonexistent/proxy-binary", "-x"]}}}),
    )
    .await;
    let failed_status = wait_for("the missing program reported", || async {
        let v = a.proxy(&client, "batch-proxy").await?;
        (v["Status"]["State"] == "failed").then_some(v)
    })
    .await;
    assert!(
        failed_status["Status"]["Error"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/proxy-binary"),
        "{failed_status}"
    );
    // The others go on: a request through the mesh gets through (a few tries within 5 s: on
    // a machine this loaded one request can outlast its 2 s timeout).
    let mut answered = None;
    for _ in 0..5 {
        answered = get(&client, &through_mesh).await;
        if answered.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(answered.as_deref(), Some("api-1"));
    // What meshd cannot run is refused at registration, naming the field.
    let script = client
        .put(a.url("/v1/agent/service/register"))
        .json(&json!({"Name": "cron", "Connect": {"Proxy": {"ExecMode": "script"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(script.status(), reqwest::StatusCode::BAD_REQUEST);
    assert!(script.text().await.unwrap().contains("Connect.Proxy.ExecMode"));
    put(&client, &a.url("/v1/agent/service/deregister/batch"), json!(null)).await;

    // What the agent and its supervisor wrote (registrations, pid files, logs, the daemon
    // snapshot, Envoy bootstraps) is the owner's only.
    let files = test_support::assert_private_tree(&a_dir);
    assert!(files >= 5, "only {files} files under {}", a_dir.display());

    // Deregistered: the proxy and its Envoy are gone within 6 s, with their files.
    let envoy_now = envoy_of(restarted).unwrap();
    let shm = PathBuf::from(format!("/dev/shm/envoy_shared_memory_{}", base_id_of(restarted) * 10));
    assert!(shm.exists(), "{} while Envoy runs", shm.display());
    let t0 = std::time::Instant::now();
    put(&client, &a.url("/v1/agent/service/deregister/api"), json!(null)).await;
    wait_for("the proxy gone", || async {
        (!alive(restarted) && !alive(envoy_now)).then_some(())
    })
    .await;
    println!("deregistered: proxy and Envoy gone after {:?}", t0.elapsed());
    // Bounded well below anything that would leave the proxy behind (figures: the line above).
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    assert!(!a_dir.join("proxies/daemons/pids/api-sidecar-proxy.pid").exists());
    assert!(!shm.exists(), "{} left behind", shm.display());

    // A -dev agent stops its proxies with it.
    b.stop();
    assert!(
        !alive(web_daemon) && !alive(web_envoy),
        "web's proxy outlived its -dev agent"
    );
    a.stop();
}
