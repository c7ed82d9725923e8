//! Agent mode end to end with the real Envoy: one `meshd server`, two `meshd agent`s with
//! their own nodes, `api` and `web` registered with their local agents (sidecars from
//! `Connect.SidecarService`), and an Envoy per sidecar from `meshd connect envoy
//! -sidecar-for`, configured by its agent's xDS from the agent cache. The agents reach the
//! server through a recording relay, so the test can read everything the server sent them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use crate::agents;
use agents::{Proc, get, meshd, put, wait_for};
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use test_support::envoy;
use test_support::http::named_backend as backend;
use test_support::reserve_port as free_port;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Relays TCP connections to the server's current HTTP address and keeps every byte the
/// server sent back.
#[derive(Clone)]
struct Relay {
    addr: String,
    target: Arc<Mutex<String>>,
    from_server: Arc<Mutex<Vec<u8>>>,
    to_server: Arc<Mutex<Vec<u8>>>,
}

impl Relay {
    async fn start(target: &str) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = Relay {
            addr: listener.local_addr().unwrap().to_string(),
            target: Arc::new(Mutex::new(target.to_owned())),
            from_server: Arc::default(),
            to_server: Arc::default(),
        };
        let r = relay.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let target = r.target.lock().clone();
                let (from, to) = (Arc::clone(&r.from_server), Arc::clone(&r.to_server));
                tokio::spawn(async move {
                    // The server is away: the agent sees the connection close at once.
                    let Ok(server) = TcpStream::connect(&target).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pipe(cr, sw, to), pipe(sr, cw, from));
                });
            }
        });
        relay
    }

    fn received(&self) -> String {
        String::from_utf8_lossy(&self.from_server.lock()).into_owned()
    }

    fn sent(&self) -> String {
        String::from_utf8_lossy(&self.to_server.lock()).into_owned()
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    log: Arc<Mutex<Vec<u8>>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        log.lock().extend_from_slice(&buf[..n]);
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

fn start_agent(node: &str, relay: &Relay) -> (Proc, String, String) {
    // Each agent's exposed check listener on a port of its own (one is enough here).
    let expose = free_port().to_string();
    let p = test_support::process::start_agent(
        meshd(),
        [
            "-dev",
            "-node",
            node,
            "-advertise",
            "127.0.0.1",
            "-retry-join",
            &relay.addr,
            "-log-level",
            "warn",
            "-expose-min-port",
            &expose,
            "-expose-max-port",
            &expose,
        ],
    );
    (Proc(p.child), p.http, p.grpc)
}

/// `meshd connect envoy -sidecar-for` against an agent; returns the supervisor and Envoy's
/// admin URL.
async fn envoy_for(service: &str, agent_http: &str, agent_grpc: &str, dir: &Path) -> (Proc, String) {
    let run_dir = dir.join(service);
    let admin_file = run_dir.join("admin-0.addr");
    let child = Command::new(meshd())
        .args(["connect", "envoy", "-sidecar-for", service])
        .args([
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
        .arg("-envoy-binary")
        .arg(envoy())
        .args(["--", "-l", "error"])
        .spawn()
        .unwrap();
    let proc = Proc(child);
    let admin = wait_for("Envoy's admin address", || async {
        std::fs::read_to_string(&admin_file).ok().filter(|s| !s.is_empty())
    })
    .await;
    (proc, format!("http://{}", admin.trim()))
}

/// Hosts of `api`'s cluster in an Envoy's `/clusters`.
async fn api_hosts(client: &reqwest::Client, admin: &str) -> Option<Vec<String>> {
    let text = get(client, &format!("{admin}/clusters")).await?;
    Some(
        text.lines()
            .filter(|l| l.starts_with("api.default.dc1") && l.contains("::cx_total::"))
            .filter_map(|l| l.split("::").nth(1).map(str::to_owned))
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_configure_their_envoys_from_the_cache_and_ride_out_a_server_restart() {
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().join("server");
    let server_args = |dir: &Path| {
        vec![
            "-data-dir".to_owned(),
            dir.display().to_string(),
            "-log-level".to_owned(),
            "warn".to_owned(),
        ]
    };
    let server = test_support::process::start_server(meshd(), server_args(&data_dir));
    let mut server_proc = Some(Proc(server.child));
    let relay = Relay::start(server.http.trim_start_matches("http://")).await;
    let server_http = server.http.clone();
    let client = reqwest::Client::new();

    let (_agent_a, a_http, a_grpc) = start_agent("node-api", &relay);
    let (_agent_b, b_http, b_grpc) = start_agent("node-web", &relay);

    let (api_port, web_port) = (backend("api-1"), backend("web"));
    let (api_proxy, web_proxy, upstream, by_query) = (free_port(), free_port(), free_port(), free_port());
    put(
        &client,
        &format!("{a_http}/v1/agent/service/register"),
        json!({"Name": "api", "ID": "api", "Port": api_port,
               "Check": {"CheckID": "api-http", "Name": "api over HTTP",
                         "HTTP": format!("http://127.0.0.1:{api_port}/health"), "Interval": "1s"},
               "Connect": {"SidecarService": {"Port": api_proxy, "Proxy": {"Expose": {"Checks": true}}}}}),
    )
    .await;
    // A prepared query selecting api, for web's second upstream (through the agent's cache).
    let created = client
        .post(format!("{server_http}/v1/query"))
        .json(&json!({"Name": "api-query", "Service": {"Service": "api"}}))
        .send()
        .await
        .unwrap();
    assert!(created.status().is_success());
    put(
        &client,
        &format!("{b_http}/v1/agent/service/register"),
        json!({"Name": "web", "ID": "web", "Port": web_port,
               "Connect": {"SidecarService": {"Port": web_proxy, "Proxy": {
                   "Upstreams": [{"DestinationName": "api", "LocalBindPort": upstream},
                                 {"DestinationType": "prepared_query", "DestinationName": "api-query",
                                  "LocalBindPort": by_query}]}}}}),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (_api_envoy, api_admin) = envoy_for("api", &a_http, &a_grpc, &dir.path().join("a")).await;
    let (_web_envoy, web_admin) = envoy_for("web", &b_http, &b_grpc, &dir.path().join("b")).await;
    let through_mesh = format!("http://127.0.0.1:{upstream}/");

    // web → api over the mesh, with the SPIFFE leaves the agents had signed.
    assert_eq!(
        wait_for("traffic web → api", || get(&client, &through_mesh)).await,
        "api-1"
    );
    let by_query = format!("http://127.0.0.1:{by_query}/");
    assert_eq!(
        wait_for("traffic web → api through the prepared query", || get(
            &client, &by_query
        ))
        .await,
        "api-1"
    );
    exposed_check_passes_through_the_proxy(&client, &a_http, &api_admin).await;
    let certs = get(&client, &format!("{web_admin}/certs")).await.unwrap();
    assert!(certs.contains("/ns/default/dc/dc1/svc/web"), "web's leaf: {certs}");
    let certs = get(&client, &format!("{api_admin}/certs")).await.unwrap();
    assert!(certs.contains("/ns/default/dc/dc1/svc/api"), "api's leaf: {certs}");
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

    troubleshoot_through_an_agent(&b_http, &web_admin);

    // A deny intention (written at the server) blocks it; deleting it restores it.
    let intention = format!("{server_http}/v1/connect/intentions/exact?source=web&destination=api");
    put(&client, &intention, json!({"Action": "deny"})).await;
    wait_for("the deny intention to apply", || async {
        get(&client, &through_mesh).await.is_none().then_some(())
    })
    .await;
    assert!(client.delete(&intention).send().await.unwrap().status().is_success());
    assert_eq!(
        wait_for("the intention to go", || get(&client, &through_mesh)).await,
        "api-1"
    );

    // A critical check on api's host takes api out of web's Envoy; passing brings it back.
    put(
        &client,
        &format!("{a_http}/v1/agent/check/register"),
        json!({"Name": "api-alive", "CheckID": "api-alive", "ServiceID": "api", "TTL": "600s"}),
    )
    .await;
    put(&client, &format!("{a_http}/v1/agent/check/fail/api-alive"), json!(null)).await;
    wait_for("api to leave web's Envoy", || async {
        api_hosts(&client, &web_admin).await.filter(Vec::is_empty).map(|_| ())
    })
    .await;
    put(&client, &format!("{a_http}/v1/agent/check/pass/api-alive"), json!(null)).await;
    assert_eq!(wait_for("api back", || get(&client, &through_mesh)).await, "api-1");

    // The server stops: the agents keep their Envoys configured and traffic flows.
    drop(server_proc.take());
    for _ in 0..10 {
        assert_eq!(
            get(&client, &through_mesh).await.as_deref(),
            Some("api-1"),
            "traffic with the server away"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // It comes back (same data dir); an instance registered after that reaches web's Envoy.
    let server = test_support::process::start_server(meshd(), server_args(&data_dir));
    let _server_again = Proc(server.child);
    *relay.target.lock() = server.http.trim_start_matches("http://").to_owned();
    let (api2_port, api2_proxy) = (backend("api-2"), free_port());
    put(
        &client,
        &format!("{a_http}/v1/agent/service/register"),
        json!({"Name": "api", "ID": "api-2", "Port": api2_port,
               "Connect": {"SidecarService": {"Port": api2_proxy}}}),
    )
    .await;
    let (_api2_envoy, _) = envoy_for("api-2", &a_http, &a_grpc, &dir.path().join("a2")).await;
    let hosts = wait_for("the new instance in web's Envoy", || async {
        api_hosts(&client, &web_admin).await.filter(|h| h.len() == 2)
    })
    .await;
    assert!(
        hosts.iter().any(|h| h.ends_with(&format!(":{api2_proxy}"))),
        "{hosts:?}"
    );
    let seen = Mutex::new(std::collections::BTreeSet::new());
    wait_for("both instances to answer", || async {
        if let Some(b) = get(&client, &through_mesh).await {
            seen.lock().insert(b);
        }
        (seen.lock().len() == 2).then_some(())
    })
    .await;

    // An upstream that cannot be served is an error shown in the proxy's status and counted,
    // not an upstream that quietly goes; the others keep working; removing it clears the
    // error. (Config entries that break a chain are refused at write time; an upstream in a
    // datacenter nobody knows, with no mesh gateway mode, asks the servers for that
    // datacenter's instances, and they have no path there.)
    let web = |upstreams: Value| {
        json!({"Name": "web", "ID": "web", "Port": web_port,
               "Connect": {"SidecarService": {"Port": web_proxy, "Proxy": {"Upstreams": upstreams}}}})
    };
    let elsewhere = free_port();
    put(
        &client,
        &format!("{b_http}/v1/agent/service/register"),
        web(json!([{"DestinationName": "api", "LocalBindPort": upstream},
                   {"DestinationName": "api", "Datacenter": "dc2", "LocalBindPort": elsewhere}])),
    )
    .await;
    let status_url = format!("{b_http}/v1/internal/proxy-status/web-sidecar-proxy");
    let status = wait_for("the error in web's proxy status", || async {
        let v: Value = serde_json::from_str(&get(&client, &status_url).await?).ok()?;
        (!v["Errors"].as_object()?.is_empty()).then_some(v)
    })
    .await;
    assert_eq!(status["Source"], "local", "{status}");
    let errors = status["Errors"].as_object().unwrap();
    assert!(
        errors
            .values()
            .any(|why| why.as_str().unwrap().contains("No path to datacenter \"dc2\"")),
        "{status}"
    );
    let counted = test_support::process::metric(&client, &b_http, "meshd_proxycfg_data_source_errors_total").await;
    assert!(counted >= 1.0, "the error is counted");
    assert!(
        wait_for("web → api still", || get(&client, &through_mesh))
            .await
            .starts_with("api-"),
        "the other upstream keeps working"
    );
    put(
        &client,
        &format!("{b_http}/v1/agent/service/register"),
        web(json!([{"DestinationName": "api", "LocalBindPort": upstream}])),
    )
    .await;
    wait_for("the error to clear", || async {
        let v: Value = serde_json::from_str(&get(&client, &status_url).await?).ok()?;
        v["Errors"].as_object()?.is_empty().then_some(())
    })
    .await;

    // The agent's own Connect CA endpoints answer from its cache: the leaf with the key made
    // on the agent (which never crossed the relay), the roots with the index to block on.
    let leaf: Value = serde_json::from_str(
        &get(&client, &format!("{a_http}/v1/agent/connect/ca/leaf/api"))
            .await
            .unwrap(),
    )
    .unwrap();
    assert!(leaf["PrivateKeyPEM"].as_str().unwrap().contains("PRIVATE KEY"));
    assert!(leaf["ServiceURI"].as_str().unwrap().ends_with("/svc/api"), "{leaf}");
    let roots = client
        .get(format!("{a_http}/v1/agent/connect/ca/roots"))
        .send()
        .await
        .unwrap();
    assert!(roots.headers().contains_key("x-consul-index"));
    let roots: Value = roots.json().await.unwrap();
    assert_eq!(roots["Roots"].as_array().unwrap().len(), 1, "{roots}");

    // Everything the server sent the agents: certificates, never a private key; the agents
    // sent signing requests.
    let received = relay.received();
    assert!(
        received.contains("BEGIN CERTIFICATE"),
        "the agents got their certificates through the relay"
    );
    assert!(!received.contains("PRIVATE KEY"), "a private key came from the server");
    assert!(relay.sent().contains("CERTIFICATE REQUEST"), "the agents sent CSRs");
}

/// `Expose.Checks`: api's HTTP check runs through its sidecar's exposed listener (a plain-HTTP
/// path on the agent's expose port) and passes; Envoy counts the check's requests there.
/// `meshd troubleshoot` asked of web's agent: the walk to api (served by the other agent)
/// dials api's Envoy and gets through; web's Envoy runs exactly what the agent sent it.
fn troubleshoot_through_an_agent(agent_http: &str, web_admin: &str) {
    let run = |args: &[&str]| {
        let out = Command::new(meshd())
            .arg("troubleshoot")
            .args(args)
            .args(["-http-addr", agent_http])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let walk = run(&["upstream", "-proxy-id", "web-sidecar-proxy", "-upstream", "api"]);
    assert!(walk.contains("The request gets through."), "{walk}");
    assert!(
        walk.contains("ok handshake   api-sidecar-proxy on node-api at ") && walk.contains("/svc/api (trusted)"),
        "{walk}"
    );
    let proxy = run(&["proxy", "-envoy-admin", web_admin]);
    assert!(proxy.contains("resources Envoy runs match what meshd sent"), "{proxy}");
    assert!(
        !proxy.contains("does not hold it") && !proxy.contains("does not send it") && !proxy.contains("at version"),
        "{proxy}"
    );
}

async fn exposed_check_passes_through_the_proxy(client: &reqwest::Client, agent_http: &str, admin: &str) {
    let path = wait_for("api's check to pass through its proxy", || async {
        let checks: Value = serde_json::from_str(&get(client, &format!("{agent_http}/v1/agent/checks")).await?).ok()?;
        (checks["api-http"]["Status"] == "passing").then_some(())?;
        let stats = get(
            client,
            &format!("{admin}/stats?filter=^http\\.exposed_path_health\\.downstream_rq_2xx$"),
        )
        .await?;
        let served: u64 = stats.rsplit(": ").next()?.trim().parse().ok()?;
        (served > 0).then_some(stats)
    })
    .await;
    println!("exposed check: {}", path.trim());
    let sidecar: Value = serde_json::from_str(
        &get(client, &format!("{agent_http}/v1/agent/service/api-sidecar-proxy"))
            .await
            .unwrap(),
    )
    .unwrap();
    let paths = &sidecar["Proxy"]["Expose"]["Paths"];
    assert_eq!(paths[0]["Path"], "/health", "{sidecar}");
    assert_eq!(paths[0]["ParsedFromCheck"], true, "{sidecar}");
}
