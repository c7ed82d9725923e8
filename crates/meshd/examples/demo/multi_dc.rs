//! The optional second act (`cargo xtask demo multi-dc`): two datacenters. dc1 (the
//! primary) and dc2 each run a `meshd server` on a data dir and a `meshd agent`; each agent
//! runs its datacenter's mesh gateway. `api` runs in both datacenters, `web` in dc1 with api
//! as its upstream and a resolver (written in dc1, replicated to dc2) failing api over to
//! dc2. web's requests reach dc1's api; when it fails its check they reach dc2's, through
//! both mesh gateways; when it passes again they come back.

use super::{Proc, backend, free_port, get, meshd, until};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;

/// One datacenter: its server and agent (HTTP, xDS).
struct Datacenter {
    server: Proc,
    server_http: String,
    agent: Proc,
    http: String,
    grpc: String,
}

fn start_datacenter(name: &'static str, dir: &Path, join_wan: Option<&str>) -> Datacenter {
    let data_dir = dir.join(format!("server-{name}"));
    let mut args: Vec<String> = [
        "-log-level",
        "warn",
        "-datacenter",
        name,
        "-node",
        &format!("server-{name}"),
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(["-data-dir".to_owned(), data_dir.display().to_string()]);
    if let Some(primary) = join_wan {
        args.extend(["-primary-datacenter", "dc1", "-retry-join-wan", primary].map(str::to_owned));
    }
    let server = test_support::process::start_server(&meshd(), &args);
    let agent = test_support::process::start_agent(
        &meshd(),
        [
            "-dev",
            "-datacenter",
            name,
            "-node",
            &format!("agent-{name}"),
            "-advertise",
            "127.0.0.1",
            "-retry-join",
            server.http.trim_start_matches("http://"),
            "-log-level",
            "warn",
        ],
    );
    println!(
        "   {name}: server HTTP {} (data dir {}), agent HTTP {}",
        server.http,
        data_dir.display(),
        agent.http
    );
    let (server_name, agent_name) = if name == "dc1" {
        ("meshd server (dc1)", "meshd agent (dc1)")
    } else {
        ("meshd server (dc2)", "meshd agent (dc2)")
    };
    Datacenter {
        server: Proc(server_name, server.child),
        server_http: server.http,
        agent: Proc(agent_name, agent.child),
        http: agent.http,
        grpc: agent.grpc,
    }
}

/// `meshd connect envoy` with `which` against `dc`'s agent; returns it and Envoy's admin URL.
async fn envoy(label: &'static str, which: &[&str], dc: &Datacenter, dir: &Path, envoy: &str) -> (Proc, String) {
    let run_dir = dir.join(label.replace(' ', "-"));
    let admin_file = run_dir.join("admin-0.addr");
    let child = Command::new(meshd())
        .args(["connect", "envoy"])
        .args(which)
        .args([
            "-http-addr",
            dc.http.trim_start_matches("http://"),
            "-grpc-addr",
            &dc.grpc,
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
    let proc = Proc(label, child);
    let admin = until("Envoy's admin address", async || {
        std::fs::read_to_string(&admin_file).ok().filter(|s| !s.is_empty())
    })
    .await;
    println!("   {label}: admin http://{}", admin.trim());
    (proc, format!("http://{}", admin.trim()))
}

async fn put(url: String, body: Value) {
    reqwest::Client::new()
        .put(url)
        .json(&body)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
}

/// `api` with a TTL check and a sidecar, registered with `dc`'s agent; its check passing.
async fn register_api(dc: &Datacenter, says: &'static str) {
    let port = backend(says);
    put(
        format!("{}/v1/agent/service/register", dc.http),
        json!({"Name": "api", "Port": port, "Check": {"TTL": "1h"},
               "Connect": {"SidecarService": {"Port": free_port()}}}),
    )
    .await;
    put(format!("{}/v1/agent/check/pass/service:api", dc.http), Value::Null).await;
}

pub(crate) async fn run(envoy_bin: &str) {
    let tmp = tempfile::tempdir().unwrap();
    println!("1. starting dc1 (the primary) and dc2 (joining it over the WAN): a server and an agent each");
    let dc1 = start_datacenter("dc1", tmp.path(), None);
    let dc2 = start_datacenter("dc2", tmp.path(), Some(dc1.server_http.trim_start_matches("http://")));
    until("dc1 to list both datacenters", async || {
        let dcs = get(&format!("{}/v1/catalog/datacenters", dc1.server_http)).await.ok()?;
        (dcs.contains("dc2")).then_some(())
    })
    .await;
    println!(
        "   dc1 lists the datacenters: {}",
        get(&format!("{}/v1/catalog/datacenters", dc1.server_http))
            .await
            .unwrap()
    );

    println!("2. a mesh gateway in each datacenter (`meshd connect envoy -gateway mesh -register`, through its agent)");
    let mut procs = Vec::new();
    for (dc, label) in [(&dc1, "mesh gateway (dc1)"), (&dc2, "mesh gateway (dc2)")] {
        let address = format!("127.0.0.1:{}", free_port());
        let which = ["-gateway", "mesh", "-register", "-address", &address];
        let (proc, admin) = envoy(label, &which, dc, tmp.path(), envoy_bin).await;
        procs.push((proc, admin));
    }

    println!(
        "3. api in both datacenters; web in dc1, its upstream api failing over to dc2 (a resolver written in dc1)"
    );
    register_api(&dc1, "api in dc1").await;
    register_api(&dc2, "api in dc2").await;
    let upstream = free_port();
    put(
        format!("{}/v1/agent/service/register", dc1.http),
        json!({"Name": "web", "Port": backend("web"), "Connect": {"SidecarService": {"Port": free_port(),
            "Proxy": {"Upstreams": [{"DestinationName": "api", "LocalBindPort": upstream,
                                     "MeshGateway": {"Mode": "local"}}]}}}}),
    )
    .await;
    put(
        format!("{}/v1/config", dc1.server_http),
        json!({"Kind": "service-resolver", "Name": "api", "Failover": {"*": {"Datacenters": ["dc2"]}}}),
    )
    .await;
    for (dc, svc, label) in [
        (&dc1, "api", "sidecar of api (dc1)"),
        (&dc2, "api", "sidecar of api (dc2)"),
        (&dc1, "web", "sidecar of web (dc1)"),
    ] {
        let (proc, _) = envoy(label, &["-sidecar-for", svc], dc, tmp.path(), envoy_bin).await;
        procs.push((proc, String::new()));
    }

    let url = format!("http://127.0.0.1:{upstream}/");
    println!("4. GET {url} (web's upstream): dc1's api answers");
    let body = until("api in dc1", async || {
        get(&url).await.ok().filter(|b| b.contains("dc1"))
    })
    .await;
    println!("   200: {body:?}");

    println!("5. api in dc1 fails its check: web's requests fail over to dc2, through both mesh gateways");
    put(format!("{}/v1/agent/check/fail/service:api", dc1.http), Value::Null).await;
    let body = until("api in dc2", async || {
        get(&url).await.ok().filter(|b| b.contains("dc2"))
    })
    .await;
    println!("   200: {body:?}");
    let stats = get(&format!(
        "{}/stats?filter=mesh_gateway_remote.dc2.downstream_cx_total",
        procs[0].1
    ))
    .await
    .unwrap_or_default();
    println!("   dc1's gateway sent it on to dc2's: {}", stats.trim());

    println!("6. api in dc1 passes again: web's requests come back to dc1");
    put(format!("{}/v1/agent/check/pass/service:api", dc1.http), Value::Null).await;
    let body = until("api in dc1 again", async || {
        get(&url).await.ok().filter(|b| b.contains("dc1"))
    })
    .await;
    println!("   200: {body:?}");

    println!("7. stopping everything this act started");
    drop(procs);
    let Datacenter {
        server: s1, agent: a1, ..
    } = dc1;
    let Datacenter {
        server: s2, agent: a2, ..
    } = dc2;
    drop((a1, a2));
    drop((s2, s1));
    println!("done");
}
