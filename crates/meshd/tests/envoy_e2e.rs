//! End to end with the real Envoy: `meshd server`, two services with sidecars, two Envoys
//! started through `meshd connect envoy`, traffic over mTLS governed by intentions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use test_support::envoy;
use test_support::http::named_backend as backend;
use test_support::reserve_port as free_port;

use crate::mesh;
use mesh::{Mesh, Proc, get, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_flows_over_mtls_and_intentions_govern_it() {
    let mesh = Mesh::start();
    let dir = tempfile::tempdir().unwrap();
    let (api_port, web_port) = (backend("api-1"), backend("web"));
    let (api_proxy, web_proxy, upstream, by_query) = (free_port(), free_port(), free_port(), free_port());
    mesh.register("node-api", "api", api_port, api_proxy, json!([]), json!({}))
        .await;
    // A prepared query selecting api, for web's second upstream.
    let created = mesh
        .client
        .post(format!("{}/v1/query", mesh.http))
        .json(&json!({"Name": "api-query", "Service": {"Service": "api"}}))
        .send()
        .await
        .unwrap();
    assert!(created.status().is_success());
    mesh.register(
        "node-web",
        "web",
        web_port,
        web_proxy,
        json!([{"DestinationName": "api", "LocalBindPort": upstream},
               {"DestinationType": "prepared_query", "DestinationName": "api-query", "LocalBindPort": by_query}]),
        json!({}),
    )
    .await;
    // Access logs on every proxy, to one file both Envoys append to.
    let access_log = dir.path().join("access.log");
    let format = r#"{"cluster": "%UPSTREAM_CLUSTER%", "sent": "%BYTES_SENT%"}"#;
    mesh.put(
        "/v1/config",
        json!({"Kind": "proxy-defaults", "Name": "global", "AccessLogs": {
            "Enabled": true, "Type": "file", "Path": access_log, "JSONFormat": format}}),
    )
    .await;
    let (_api_envoy, api_admin) = mesh.envoy("api", "node-api", dir.path()).await;
    let (_web_envoy, web_admin) = mesh.envoy("web", "node-web", dir.path()).await;
    let client = reqwest::Client::new();
    let through_mesh = format!("http://127.0.0.1:{upstream}/");

    // web's upstream listener reaches api's backend through api's sidecar.
    let body = wait_for(|| get(&client, &through_mesh)).await;
    assert_eq!(body, "api-1");
    // So does the prepared-query upstream, over a cluster of its own (the query's SNI),
    // verifying api's identity.
    let by_query = format!("http://127.0.0.1:{by_query}/");
    assert_eq!(wait_for(|| get(&client, &by_query)).await, "api-1");
    let clusters = get(&client, &format!("{web_admin}/clusters")).await.unwrap();
    assert!(clusters.contains("api-query.default.dc1.query."), "{clusters}");
    // A connection that ends is logged by both sidecars: web's outbound TCP proxy (to api's
    // cluster) and api's inbound one (to its local app), one JSON line each.
    let once = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    assert_eq!(get(&once, &through_mesh).await.as_deref(), Some("api-1"));
    let lines = wait_for(|| async {
        let text = std::fs::read_to_string(&access_log).ok()?;
        let lines: Vec<Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        let clusters: Vec<&str> = lines.iter().filter_map(|l| l["cluster"].as_str()).collect();
        (clusters.iter().any(|c| c.starts_with("api.default.dc1.internal.")) && clusters.contains(&"local_app"))
            .then_some(lines)
    })
    .await;
    assert!(
        lines.iter().all(|l| l.as_object().unwrap().len() == 2),
        "the configured fields only: {lines:?}"
    );

    // Both proxies are in sync, as the server sees them over HTTP and over CSDS.
    let status = wait_for(|| async {
        let all: Vec<Value> =
            serde_json::from_str(&get(&client, &format!("{}/v1/internal/xds-status", mesh.http)).await?).ok()?;
        let settled = all.len() == 2
            && all.iter().all(|s| {
                s["Types"].as_array().unwrap().iter().all(|t| {
                    let r = &t["Resources"];
                    r.get("STALE").is_none() && r.get("ERROR").is_none() && t["Pending"] == 0
                })
            });
        settled.then_some(all)
    })
    .await;
    for s in &status {
        assert_eq!(
            s["Server"],
            meshd::host_name(),
            "a server is named after its host by default"
        );
        assert_eq!(s["Stuck"], false);
        assert!(
            s["Types"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["Resources"]["SYNCED"].as_u64() > Some(0)),
            "{s}"
        );
    }
    let rows = csds_rows(&mesh.grpc).await;
    let nodes: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(nodes, ["api-sidecar-proxy", "web-sidecar-proxy"].into_iter().collect());
    assert!(
        rows.iter().all(|r| r.3 == "SYNCED" || r.3 == "NOT_SENT"),
        "every resource sent is acknowledged: {rows:?}"
    );
    for t in ["Listener", "Cluster", "ClusterLoadAssignment", "Secret"] {
        assert!(rows.iter().any(|r| r.1 == t && r.3 == "SYNCED"), "{t} synced: {rows:?}");
    }

    // The SPIFFE certificates are the ones in use.
    let certs = get(&client, &format!("{web_admin}/certs")).await.unwrap();
    assert!(
        certs.contains("/ns/default/dc/dc1/svc/web"),
        "web's leaf is loaded: {certs}"
    );
    let certs = get(&client, &format!("{api_admin}/certs")).await.unwrap();
    assert!(certs.contains("/ns/default/dc/dc1/svc/api"), "api's leaf is loaded");
    // api's inbound listener completed TLS handshakes (the mesh traffic is mTLS).
    let ssl = get(
        &client,
        &format!("{api_admin}/stats?filter=^listener\\..*ssl\\.handshake$"),
    )
    .await
    .unwrap();
    let handshakes: u64 = ssl
        .lines()
        .filter_map(|l| l.rsplit(": ").next()?.trim().parse::<u64>().ok())
        .sum();
    assert!(handshakes >= 1, "no TLS handshake on api's public listener: {ssl}");

    // A deny intention stops it; deleting it restores it.
    mesh.put(
        "/v1/connect/intentions/exact?source=web&destination=api",
        json!({"Action": "deny"}),
    )
    .await;
    wait_for(|| async { get(&client, &through_mesh).await.is_none().then_some(()) }).await;
    let resp = mesh
        .client
        .delete(format!(
            "{}/v1/connect/intentions/exact?source=web&destination=api",
            mesh.http
        ))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    assert_eq!(wait_for(|| get(&client, &through_mesh)).await, "api-1");

    escape_hatch_replaces_apis_public_listener(&mesh, &client, &api_admin, &through_mesh, (api_port, api_proxy)).await;

    // A second api instance shows up in web's Envoy.
    let (api2_port, api2_proxy) = (backend("api-2"), free_port());
    mesh.register("node-api2", "api", api2_port, api2_proxy, json!([]), json!({}))
        .await;
    let (_api2_envoy, _) = mesh.envoy("api", "node-api2", dir.path()).await;
    let clusters = wait_for(|| async {
        let text = get(&client, &format!("{web_admin}/clusters")).await?;
        let hosts = text
            .lines()
            .filter(|l| l.starts_with("api.default.dc1") && l.contains("::cx_total::"))
            .count();
        (hosts == 2).then_some(text)
    })
    .await;
    assert!(clusters.contains(&format!("127.0.0.1:{api2_proxy}")), "{clusters}");
    // web may learn of the new endpoint before api-2's own Envoy has its listener (the
    // instance has no health check to hold it back): keep asking until both have answered.
    let seen = std::cell::RefCell::new(std::collections::BTreeSet::new());
    wait_for(|| async {
        if let Some(b) = get(&client, &through_mesh).await {
            seen.borrow_mut().insert(b);
        }
        (seen.borrow().len() == 2).then_some(())
    })
    .await;
    assert_eq!(
        seen.into_inner().into_iter().collect::<Vec<_>>(),
        vec!["api-1", "api-2"],
        "both instances serve"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_config_is_not_resent_in_a_loop() {
    let mesh = Mesh::start();
    let dir = tempfile::tempdir().unwrap();
    let (port, proxy_port) = (backend("bad"), free_port());
    // Envoy cannot bind a listener to this address: it NACKs the listener.
    mesh.register(
        "node-bad",
        "bad",
        port,
        proxy_port,
        json!([]),
        json!({"bind_address": "not-an-ip"}),
    )
    .await;
    let (envoy, admin) = mesh.envoy("bad", "node-bad", dir.path()).await;
    let nacks = r#"meshd_xds_nacks_total{type="Listener"}"#;
    wait_for(|| async { (mesh.metric(nacks).await >= 1.0).then_some(()) }).await;
    // The counts settle first: a later change of the proxy's snapshot may legitimately send
    // the listener once more (and have it rejected once more). A resend loop never settles.
    let responses = r#"meshd_xds_responses_total{type="Listener"}"#;
    let mut sent = mesh.metric(responses).await;
    let mut settled = false;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = mesh.metric(responses).await;
        if now == sent {
            settled = true;
            break;
        }
        sent = now;
    }
    assert!(settled, "the listener is resent again and again: {sent} responses");
    let nacked = mesh.metric(nacks).await;
    // Envoy keeps its stream; nothing is resent while nothing changes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(mesh.metric(responses).await, sent, "no resend loop");
    assert_eq!(mesh.metric(nacks).await, nacked);
    assert!(nacked >= 1.0 && nacked <= sent, "{nacked} NACKs of {sent} responses");

    // The rejection is where operators look: the sync status and CSDS say ERROR, with
    // Envoy's own detail.
    let client = reqwest::Client::new();
    let all: Vec<Value> = serde_json::from_str(
        &get(
            &client,
            &format!("{}/v1/internal/xds-status?node=bad-sidecar-proxy", mesh.http),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    let listeners = all[0]["Types"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["TypeUrl"].as_str().unwrap().ends_with("Listener"))
        .unwrap();
    assert!(listeners["Resources"]["ERROR"].as_u64() >= Some(1), "{listeners}");
    let detail = listeners["LastNack"]["Error"].as_str().unwrap();
    assert!(detail.contains("not-an-ip"), "Envoy's detail: {detail}");
    let rows = csds_rows(&mesh.grpc).await;
    assert!(
        rows.iter()
            .any(|r| r.1 == "Listener" && r.3 == "ERROR" && r.4.contains("not-an-ip")),
        "{rows:?}"
    );
    troubleshoot_a_rejecting_then_a_stale_envoy(&mesh, &envoy, &admin).await;
}

/// `meshd troubleshoot proxy` against the real Envoy that rejected its listener, then
/// paused (SIGSTOP) while meshd sends it a change.
async fn troubleshoot_a_rejecting_then_a_stale_envoy(mesh: &Mesh, envoy: &Proc, admin: &str) {
    let troubleshoot = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_meshd"))
            .args(["troubleshoot", "proxy", "-http-addr", &mesh.http, "-envoy-admin", admin])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let out = troubleshoot(&[]);
    println!("{out}");
    let first = out.lines().nth(1).unwrap();
    assert!(
        first.contains("rejected its Listeners") && first.contains("not-an-ip"),
        "what is wrong first, with Envoy's own error: {out}"
    );
    assert!(out.contains("ok Envoy 1.") && out.contains("LIVE"), "{out}");
    // Resource by resource, what Envoy runs is what meshd sent (the rejected listener aside,
    // reported above): nothing missing, nothing left over.
    assert!(
        out.contains("resources Envoy runs match what meshd sent")
            && !out.contains("does not hold it")
            && !out.contains("which meshd does not send"),
        "{out}"
    );

    // Paused, it answers nothing: a change meshd sends stays unanswered, and is reported
    // stale once it has waited long enough.
    let pid = envoy_pid(envoy.0.id());
    let signal = |sig: &str| {
        assert!(
            Command::new("kill")
                .args([sig, &pid.to_string()])
                .status()
                .unwrap()
                .success()
        )
    };
    signal("-STOP");
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-intentions", "Name": "bad", "Sources": [{"Name": "web", "Action": "deny"}]}),
    )
    .await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/internal/troubleshoot/proxy/bad-sidecar-proxy", mesh.http);
    let stale = wait_for(|| async {
        let found: Value = serde_json::from_str(&get(&client, &url).await?).ok()?;
        found["Problems"]
            .as_array()?
            .iter()
            .find(|p| p["Kind"] == "stale")
            .map(|p| p["Message"].as_str().unwrap().to_owned())
    })
    .await;
    assert!(stale.contains("has not answered"), "{stale}");
    let out = troubleshoot(&["-proxy-id", "bad-sidecar-proxy"]);
    println!("{out}");
    assert!(out.contains("is stale") && out.contains("does not answer"), "{out}");
    signal("-CONT");
}

/// The pid of the Envoy a `meshd connect envoy` process (our own child) runs: its child.
fn envoy_pid(supervisor: u32) -> u32 {
    let children = wait_children(supervisor);
    children
        .into_iter()
        .find(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "envoy"))
        .expect("the supervisor runs an envoy")
}

fn wait_children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
    }
    out
}

/// Every resource CSDS reports: (node, type, name, status, error detail).
async fn csds_rows(grpc: &str) -> Vec<(String, String, String, String, String)> {
    use envoy_types::pb::envoy::service::status::v3::client_status_discovery_service_client::ClientStatusDiscoveryServiceClient;
    use envoy_types::pb::envoy::service::status::v3::{ClientStatusRequest, ConfigStatus};
    let mut client = ClientStatusDiscoveryServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let resp = client
        .fetch_client_status(ClientStatusRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut rows = Vec::new();
    for config in resp.config {
        let node = config.node.unwrap_or_default().id;
        for g in config.generic_xds_configs {
            let status = ConfigStatus::try_from(g.config_status)
                .unwrap()
                .as_str_name()
                .to_owned();
            rows.push((
                node.clone(),
                g.type_url.rsplit('.').next().unwrap().to_owned(),
                g.name,
                status,
                g.error_state.map(|e| e.details).unwrap_or_default(),
            ));
        }
    }
    rows
}

/// `meshd connect envoy` for api's sidecar, supervising Envoy (the default) with a run dir
/// the test can read, a token from a file, the given drain time and a 2 s parent shutdown.
fn supervised_envoy(mesh: &Mesh, dir: &Path, drain_time: &str) -> (Proc, PathBuf) {
    let run_dir = dir.join("run");
    let token = dir.join("token");
    if !token.exists() {
        std::fs::write(&token, "token-one\n").unwrap();
    }
    let child = Command::new(env!("CARGO_BIN_EXE_meshd"))
        .args([
            "connect",
            "envoy",
            "-proxy-id",
            "api-sidecar-proxy",
            "-node",
            "node-api",
        ])
        .args([
            "-http-addr",
            mesh.http.trim_start_matches("http://"),
            "-grpc-addr",
            &mesh.grpc,
        ])
        // No -admin-bind: the admin is the default, a Unix socket in the run dir.
        .args(["-drain-time", drain_time, "-parent-shutdown-time", "2s"])
        .args(["-log-level", "warn", "-token-file"])
        .arg(&token)
        .arg("-run-dir")
        .arg(&run_dir)
        .arg("-envoy-binary")
        .arg(envoy())
        .args(["--", "-l", "error", "--concurrency", "1"])
        .spawn()
        .unwrap();
    (Proc(child), run_dir)
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    supervisor::process::signal(pid, sig).unwrap();
}

async fn server_info(run_dir: &Path, epoch: u32) -> Option<Value> {
    let addr = supervisor::envoy::read_admin_address(&run_dir.join(format!("admin-{epoch}.addr")))?;
    let (code, text) = supervisor::envoy::admin_request(addr, "GET", "/server_info")
        .await
        .ok()?;
    (code == 200).then(|| serde_json::from_str(&text).ok())?
}

/// The admin interface of a supervised Envoy is `admin.sock` in its run dir, mode 0600,
/// and its bootstrap has no TCP admin.
fn assert_private_admin(run_dir: &Path, epoch: u32) {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let socket = run_dir.join("admin.sock");
    let addr = supervisor::envoy::read_admin_address(&run_dir.join(format!("admin-{epoch}.addr")));
    assert_eq!(addr, Some(supervisor::envoy::AdminAddr::Unix(socket.clone())));
    let meta = std::fs::metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let bootstrap: Value =
        serde_json::from_slice(&std::fs::read(run_dir.join(format!("bootstrap-{epoch}.json"))).unwrap()).unwrap();
    assert_eq!(
        bootstrap["admin"]["address"],
        json!({"pipe": {"path": socket, "mode": 0o600}}),
        "no TCP admin"
    );
}

async fn wait_live(run_dir: &Path, epoch: u32) -> Value {
    wait_for(|| async { server_info(run_dir, epoch).await.filter(|i| i["state"] == "LIVE") }).await
}

/// The Envoy child of `supervisor` (the only process among its children running Envoy).
fn envoy_child(supervisor: u32) -> u32 {
    let bin = envoy();
    let mut found = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{supervisor}/task")).unwrap().flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for pid in children.split_whitespace().filter_map(|p| p.parse::<u32>().ok()) {
            if std::fs::read_link(format!("/proc/{pid}/exe")).ok().as_deref() == Some(bin.as_path()) {
                found.push(pid);
            }
        }
    }
    assert_eq!(found.len(), 1, "expected one Envoy child of {supervisor}: {found:?}");
    found[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_envoy_hot_restarts_when_the_bootstrap_changes_and_drains_on_sigterm() {
    let mesh = Mesh::start();
    let dir = tempfile::tempdir().unwrap();
    mesh.register("node-api", "api", backend("api-1"), free_port(), json!([]), json!({}))
        .await;
    let (mut proc, run_dir) = supervised_envoy(&mesh, dir.path(), "1s");
    let pid = proc.0.id();
    let info = wait_live(&run_dir, 0).await;
    assert_eq!(info["command_line_options"]["restart_epoch"], 0);
    assert_eq!(info["command_line_options"]["log_level"], "error", "-l after -- wins");
    assert_private_admin(&run_dir, 0);
    let first_envoy = envoy_child(pid);

    // SIGHUP with nothing changed: no restart.
    signal(pid, rustix::process::Signal::HUP);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!run_dir.join("admin-1.addr").exists(), "restarted without a change");
    assert_eq!(envoy_child(pid), first_envoy);

    // A new token changes the bootstrap: SIGHUP hot-restarts into epoch 1.
    std::fs::write(dir.path().join("token"), "token-two\n").unwrap();
    signal(pid, rustix::process::Signal::HUP);
    let info = wait_live(&run_dir, 1).await;
    assert_eq!(info["command_line_options"]["restart_epoch"], 1);
    assert_private_admin(&run_dir, 1);
    let bootstrap = std::fs::read_to_string(run_dir.join("bootstrap-1.json")).unwrap();
    assert!(bootstrap.contains("token-two"), "{bootstrap}");
    // The parent exits after the parent-shutdown time and is cleaned up; one Envoy remains.
    wait_for(|| async { (!run_dir.join("admin-0.addr").exists()).then_some(()) }).await;
    let second_envoy = envoy_child(pid);
    assert_ne!(second_envoy, first_envoy);
    assert!(!supervisor::process::ProcessId::of(first_envoy).is_some_and(|p| p.is_alive()));

    // A rotated token file is noticed without a signal: epoch 2.
    std::fs::write(dir.path().join("token"), "token-three-longer\n").unwrap();
    wait_live(&run_dir, 2).await;
    let bootstrap = std::fs::read_to_string(run_dir.join("bootstrap-2.json")).unwrap();
    assert!(bootstrap.contains("token-three-longer"), "{bootstrap}");
    wait_for(|| async { (!run_dir.join("admin-1.addr").exists()).then_some(()) }).await;
    let second_envoy = envoy_child(pid);

    // SIGTERM: Envoy drains for the drain time, then both exit; exit code 0.
    let t0 = std::time::Instant::now();
    signal(pid, rustix::process::Signal::TERM);
    let status = wait_for(|| std::future::ready(proc.0.try_wait().unwrap())).await;
    assert!(status.success(), "{status}");
    assert!(t0.elapsed() >= Duration::from_secs(1), "exited without draining");
    assert!(!supervisor::process::ProcessId::of(second_envoy).is_some_and(|p| p.is_alive()));
    let left: Vec<_> = std::fs::read_dir(&run_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "run dir not cleaned: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_killed_with_sigkill_leaves_no_envoy_behind() {
    let mesh = Mesh::start();
    let dir = tempfile::tempdir().unwrap();
    mesh.register("node-api", "api", backend("api-1"), free_port(), json!([]), json!({}))
        .await;
    let (mut proc, run_dir) = supervised_envoy(&mesh, dir.path(), "1s");
    let info = wait_live(&run_dir, 0).await;
    let envoy_pid = supervisor::process::ProcessId::of(envoy_child(proc.0.id())).unwrap();
    proc.0.kill().unwrap();
    proc.0.wait().unwrap();
    // The kernel kills the tied child when its supervisor dies.
    wait_for(|| async { (!envoy_pid.is_alive()).then_some(()) }).await;
    // A killed supervisor cannot clean Envoy's shared memory; the test does.
    clean_shared_memory(&info);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_replaces_the_process_with_envoy() {
    let mesh = Mesh::start();
    let dir = tempfile::tempdir().unwrap();
    let admin_file = dir.path().join("admin");
    // A base id of this test's own (unique per process on this host).
    let base_id = (30_000_000 + std::process::id() % 1_000_000).to_string();
    let child = Command::new(env!("CARGO_BIN_EXE_meshd"))
        .args([
            "connect",
            "envoy",
            "-exec",
            "-proxy-id",
            "api-sidecar-proxy",
            "-admin-bind",
            "127.0.0.1:0",
        ])
        // Envoy's hot-restart sockets go there (else to a temp dir kept for it).
        .arg("-run-dir")
        .arg(dir.path().join("run"))
        .args(["-grpc-addr", &mesh.grpc, "-envoy-binary"])
        .arg(envoy())
        .args(["-http-addr", mesh.http.trim_start_matches("http://")])
        .args(["--", "--base-id", &base_id, "-l", "error", "--admin-address-path"])
        .arg(&admin_file)
        .spawn()
        .unwrap();
    let proc = Proc(child);
    wait_for(|| async { std::fs::read_to_string(&admin_file).ok().filter(|s| !s.is_empty()) }).await;
    let exe = std::fs::read_link(format!("/proc/{}/exe", proc.0.id())).unwrap();
    assert_eq!(exe, envoy(), "the meshd process became Envoy");
    // Its hot-restart sockets are files of the run dir, not abstract sockets.
    let id = base_id.parse::<u64>().unwrap() * 10;
    assert!(dir.path().join(format!("run/hot-restart_parent_{id}")).exists());
    let admin = std::fs::read_to_string(&admin_file).unwrap();
    let info = get(&reqwest::Client::new(), &format!("http://{}/server_info", admin.trim()))
        .await
        .unwrap();
    drop(proc);
    clean_shared_memory(&serde_json::from_str(&info).unwrap());
}

/// Removes the shared memory of the Envoy described by `server_info`.
fn clean_shared_memory(server_info: &Value) {
    let base: u32 = server_info["command_line_options"]["base_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    supervisor::envoy::clean_stale_shared_memory(base).unwrap();
}

/// A backend that answers `name` after `delay` (an in-flight request, seen from the mesh).
async fn slow_backend(name: &'static str, delay: Duration) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                tokio::time::sleep(delay).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    name.len()
                );
                let _ = conn.write_all(format!("{head}{name}").as_bytes()).await;
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_connect_envoy_lets_an_in_flight_mesh_request_complete() {
    let mesh = Mesh::start();
    let dir = tempfile::tempdir().unwrap();
    let (api_port, web_port) = (
        slow_backend("api-slow", Duration::from_millis(1500)).await,
        backend("web"),
    );
    let upstream = free_port();
    mesh.register("node-api", "api", api_port, free_port(), json!([]), json!({}))
        .await;
    let upstreams = json!([{"DestinationName": "api", "LocalBindPort": upstream}]);
    mesh.register("node-web", "web", web_port, free_port(), upstreams, json!({}))
        .await;
    // api's sidecar drains for 3 s on SIGTERM; web's is the client side of the mesh.
    let (mut api, run_dir) = supervised_envoy(&mesh, dir.path(), "3s");
    wait_live(&run_dir, 0).await;
    let (_web, _) = mesh.envoy("web", "node-web", dir.path()).await;
    let client = reqwest::Client::new();
    let through_mesh = format!("http://127.0.0.1:{upstream}/");
    assert_eq!(wait_for(|| get(&client, &through_mesh)).await, "api-slow");

    // A request is in flight through api's sidecar when its supervisor gets SIGTERM.
    // Its own generous timeout: the backend takes 1.5 s, and two Envoys on a loaded machine
    // more (the shared `get`'s 2 s would cut it short).
    let in_flight = tokio::spawn({
        let (client, url) = (client.clone(), through_mesh.clone());
        async move {
            let resp = client.get(&url).timeout(Duration::from_secs(30)).send().await.ok()?;
            resp.status().is_success().then_some(())?;
            resp.text().await.ok()
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = std::time::Instant::now();
    signal(api.0.id(), rustix::process::Signal::TERM);
    assert_eq!(
        in_flight.await.unwrap().as_deref(),
        Some("api-slow"),
        "the in-flight request was cut"
    );
    let status = wait_for(|| std::future::ready(api.0.try_wait().unwrap())).await;
    assert!(status.success(), "{status}");
    assert!(t0.elapsed() >= Duration::from_secs(3), "exited before the drain time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_bind_serves_envoys_metrics_at_slash_metrics() {
    let mesh = Mesh::start();
    let dir = tempfile::tempdir().unwrap();
    mesh.register("node-web", "web", backend("web"), free_port(), json!([]), json!({}))
        .await;
    let metrics = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_meshd"))
        .args(["connect", "envoy", "-sidecar-for", "web", "-node", "node-web"])
        .args([
            "-http-addr",
            mesh.http.trim_start_matches("http://"),
            "-grpc-addr",
            &mesh.grpc,
        ])
        // The admin is its Unix socket: the metrics listener forwards to it.
        .args(["-prometheus-bind", &format!("127.0.0.1:{metrics}")])
        .args(["-log-level", "warn", "-drain-time", "1s", "-run-dir"])
        .arg(dir.path().join("run"))
        .arg("-envoy-binary")
        .arg(envoy())
        .args(["--", "--concurrency", "1"])
        .spawn()
        .unwrap();
    let _envoy = Proc(child);
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{metrics}/metrics");
    let body = wait_for(|| get(&client, &url)).await;
    assert!(
        body.contains("# TYPE envoy_"),
        "Prometheus text: {}",
        &body[..body.len().min(300)]
    );
    assert!(
        body.contains("envoy_control_plane_connected_state"),
        "Envoy's own metrics"
    );
    // Only /metrics: the rest of the admin interface is not exposed there.
    let other = client
        .get(format!("http://127.0.0.1:{metrics}/quitquitquit"))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404);
    // No `-l` given: Envoy logs warnings and worse.
    let envoy_pid = envoy_child(_envoy.0.id());
    let cmdline = std::fs::read_to_string(format!("/proc/{envoy_pid}/cmdline")).unwrap();
    let args: Vec<&str> = cmdline.split('\0').collect();
    assert!(args.windows(2).any(|w| w == ["-l", "warn"]), "{args:?}");
}

/// Runs `meshd connect envoy` with `flags` and `PATH` set to `path`: its exit code and stderr
/// once it exits, within 10 s (it used to retry a missing Envoy for ever).
async fn connect_envoy_exit(flags: &[&str], path: &Path) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_meshd"))
        .args([
            "connect",
            "envoy",
            "-proxy-id",
            "web-sidecar-proxy",
            "-admin-bind",
            "127.0.0.1:0",
        ])
        .args(flags)
        .env("PATH", path)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!("still running after 10 s: {}", String::from_utf8_lossy(&out.stderr));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test]
async fn a_missing_envoy_is_one_line_naming_envoy_binary_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    // No Envoy on PATH, none given.
    let (code, stderr) = connect_envoy_exit(&[], dir.path()).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(
        stderr,
        "meshd: no envoy on PATH: install Envoy, or give its path with -envoy-binary PATH\n"
    );
    // A path that is not there.
    let missing = dir.path().join("envoy");
    let (code, stderr) = connect_envoy_exit(&["-envoy-binary", missing.to_str().unwrap()], dir.path()).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("-envoy-binary") && stderr.contains("no such file"),
        "{stderr}"
    );
}

#[test]
fn prometheus_bind_needs_a_fixed_admin_port() {
    let out = Command::new(env!("CARGO_BIN_EXE_meshd"))
        .args(["connect", "envoy", "-proxy-id", "web-sidecar-proxy", "-bootstrap"])
        .args(["-admin-bind", "127.0.0.1:0", "-prometheus-bind", "127.0.0.1:20200"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("-prometheus-bind") && stderr.contains("-admin-bind"),
        "{stderr}"
    );
}

/// api's sidecar re-registered with `envoy_public_listener_json` (a TCP proxy to local_app
/// with a stat prefix of the user's): api's Envoy serves that listener, web still reaches api
/// through it (the mesh's mTLS was put in), and a deny intention still stops it (so was the
/// RBAC). A malformed escape hatch is a 400 naming the field.
async fn escape_hatch_replaces_apis_public_listener(
    mesh: &Mesh,
    client: &reqwest::Client,
    api_admin: &str,
    through_mesh: &str,
    (api_port, api_proxy): (u16, u16),
) {
    let listener = json!({"name": "custom_public",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": api_proxy}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": "custom_public", "cluster": "local_app"}}]}]});
    mesh.register(
        "node-api",
        "api",
        api_port,
        api_proxy,
        json!([]),
        json!({"envoy_public_listener_json": listener.to_string()}),
    )
    .await;
    let once = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let served = wait_for(|| async {
        assert_eq!(get(&once, through_mesh).await.as_deref(), Some("api-1"));
        let stats = get(
            client,
            &format!("{api_admin}/stats?filter=^tcp\\.custom_public\\.downstream_cx_total$"),
        )
        .await?;
        let n: u64 = stats.rsplit(": ").next()?.trim().parse().ok()?;
        (n > 0).then_some(n)
    })
    .await;
    println!("escape hatch: api's own public listener served {served} connection(s)");
    let dump = get(client, &format!("{api_admin}/config_dump?resource=dynamic_listeners"))
        .await
        .unwrap();
    assert!(
        dump.contains("custom_public") && dump.contains("DownstreamTlsContext"),
        "{dump}"
    );
    let intention = format!("{}/v1/connect/intentions/exact?source=web&destination=api", mesh.http);
    mesh.put(&intention.replace(&mesh.http, ""), json!({"Action": "deny"}))
        .await;
    wait_for(|| async { get(&once, through_mesh).await.is_none().then_some(()) }).await;
    assert!(
        mesh.client
            .delete(&intention)
            .send()
            .await
            .unwrap()
            .status()
            .is_success()
    );
    assert_eq!(wait_for(|| get(&once, through_mesh)).await, "api-1");

    let bad = json!({"Node": "node-api", "Address": "127.0.0.1", "Service": {"Kind": "connect-proxy",
        "ID": "api-sidecar-proxy", "Service": "api-sidecar-proxy", "Port": api_proxy,
        "Proxy": {"DestinationServiceName": "api", "LocalServicePort": api_port,
                  "Config": {"envoy_public_listener_json": r#"{"name": "x", "filter_chains": [{"filterz": []}]}"#}}}});
    let resp = mesh
        .client
        .put(format!("{}/v1/catalog/register", mesh.http))
        .json(&bad)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("Config.envoy_public_listener_json") && text.contains("filterz"),
        "{text}"
    );
}
