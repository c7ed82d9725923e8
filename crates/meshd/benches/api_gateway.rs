//! The API gateway at scale, next to the ingress gateway with the same services (prints
//! figures; asserts nothing): the targets of issue #36 and `docs/gateways.md`.
//!
//! A real `meshd server` on a fresh data dir (`DEV=1` for `-dev`) and real Envoys under
//! `meshd connect envoy`, on the 2 cores. `SERVICES` (1,500) connect-native services, each
//! with one instance; the first `SAMPLE` (20) are served by one mTLS backend presenting each
//! service's own leaf (chosen by SNI), the others' instances listen nowhere.
//!
//! 1. API gateway: one `api-gateway` with an http listener, then `SERVICES` http-routes
//!    (`svc-N.example.com` to `svc-N`), written one after the other. Converged when Envoy
//!    has a cluster with endpoints for every service, its route configuration lists every
//!    host, and a request to each sampled service through the gateway answers 200: the
//!    time from the last write is printed. [target <= 5 s]
//! 2. `ROUNDS` (30) endpoint changes of a sampled service (its instance moves between the
//!    backend's two ports), each timed from the start of the write until a request through
//!    the gateway is answered from the new port. [target p99 <= 100 ms]
//! 3. The same with an ingress gateway exposing the same services under the same hosts (one
//!    entry write).
//!
//! Run: `cargo xtask bench gateway`.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};
use test_support::figures::{BenchStore, env_usize, ms, percentile};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn svc(i: usize) -> String {
    format!("svc-{i:04}")
}

async fn put(client: &reqwest::Client, url: String, body: Value) {
    let resp = client.put(&url).json(&body).send().await.unwrap();
    assert!(resp.status().is_success(), "{url}: {}", resp.text().await.unwrap());
}

async fn get_json(client: &reqwest::Client, url: &str) -> Value {
    client.get(url).send().await.unwrap().json().await.unwrap()
}

async fn text(client: &reqwest::Client, url: &str) -> String {
    match client.get(url).timeout(Duration::from_secs(10)).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Certificates by SNI, whatever names they carry (a mesh leaf names a SPIFFE id, not the
/// SNI the gateway sends).
#[derive(Debug, Default)]
struct BySni(std::collections::HashMap<String, Arc<rustls::sign::CertifiedKey>>);

impl rustls::server::ResolvesServerCert for BySni {
    fn resolve(&self, hello: rustls::server::ClientHello<'_>) -> Option<Arc<rustls::sign::CertifiedKey>> {
        self.0.get(hello.server_name()?).cloned()
    }
}

/// A TLS server on two ports presenting, by SNI, the leaf of the service the SNI names
/// (`<service>.default.<dc>.internal.<trust domain>`), answering every request 200 with the
/// service's name.
async fn backend(client: &reqwest::Client, http: &str, services: &[String]) -> (u16, u16) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut resolver = BySni::default();
    let provider = rustls::crypto::ring::default_provider();
    let roots = get_json(client, &format!("{http}/v1/connect/ca/roots")).await;
    let trust_domain = roots["TrustDomain"].as_str().unwrap().to_owned();
    for s in services {
        let leaf = get_json(client, &format!("{http}/v1/agent/connect/ca/leaf/{s}")).await;
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(leaf["CertPEM"].as_str().unwrap().as_bytes())
                .collect::<Result<_, _>>()
                .unwrap();
        let key = PrivateKeyDer::from_pem_slice(leaf["PrivateKeyPEM"].as_str().unwrap().as_bytes()).unwrap();
        let signing = provider.key_provider.load_private_key(key).unwrap();
        let sni = format!("{s}.default.dc1.internal.{trust_domain}");
        resolver
            .0
            .insert(sni, Arc::new(rustls::sign::CertifiedKey::new(certs, signing)));
    }
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let mut ports = Vec::new();
    for which in 0..2 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        ports.push(listener.local_addr().unwrap().port());
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else { return };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let Ok(mut tls) = acceptor.accept(conn).await else {
                        return;
                    };
                    let service = tls
                        .get_ref()
                        .1
                        .server_name()
                        .unwrap_or("?")
                        .split('.')
                        .next()
                        .unwrap_or("?");
                    let name = format!("{service}@{which}");
                    let mut buf = vec![0u8; 8192];
                    let mut seen = Vec::new();
                    loop {
                        let Ok(n) = tls.read(&mut buf).await else { return };
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            seen.drain(..end + 4);
                            let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{name}", name.len());
                            if tls.write_all(reply.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
    }
    (ports[0], ports[1])
}

/// Registers `service` as a connect-native instance on its own node at `port`.
async fn register(client: &reqwest::Client, http: &str, service: &str, port: u16) {
    put(
        client,
        format!("{http}/v1/catalog/register"),
        json!({"Node": format!("node-{service}"), "Address": "127.0.0.1",
               "Service": {"Service": service, "ID": service, "Port": port, "Connect": {"Native": true}}}),
    )
    .await;
}

/// Runs a gateway's Envoy under `meshd connect envoy`; its supervisor and admin URL.
async fn gateway(kind: &str, name: &str, http: &str, grpc: &str, dir: &Path) -> (Killed, String) {
    let run_dir = dir.join(name);
    let child = Command::new(env!("CARGO_BIN_EXE_meshd"))
        .args(["connect", "envoy", "-gateway", kind, "-service", name, "-register"])
        .args(["-address", "127.0.0.1:1", "-node", &format!("node-{name}")])
        .args(["-http-addr", http.trim_start_matches("http://"), "-grpc-addr", grpc])
        .args(["-admin-bind", "127.0.0.1:0", "-log-level", "error", "-run-dir"])
        .arg(&run_dir)
        .arg("-envoy-binary")
        .arg(test_support::envoy())
        .args(["--", "-l", "error"])
        .spawn()
        .unwrap();
    let proc = Killed(child);
    let admin_file = run_dir.join("admin-0.addr");
    for _ in 0..600 {
        if let Some(a) = std::fs::read_to_string(&admin_file)
            .ok()
            .filter(|s| !s.trim().is_empty())
        {
            return (proc, format!("http://{}", a.trim()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name}'s Envoy did not start");
}

/// How far Envoy is: (services with a cluster holding endpoints, hosts in its routes).
async fn progress(client: &reqwest::Client, admin: &str, services: usize) -> (usize, usize) {
    let clusters = text(client, &format!("{admin}/clusters")).await;
    let mut with_hosts = std::collections::BTreeSet::new();
    for line in clusters.lines() {
        if line.starts_with("svc-") && line.contains("::health_flags::") {
            with_hosts.insert(line.split('.').next().unwrap_or_default().to_owned());
        }
    }
    let routes = text(client, &format!("{admin}/config_dump?resource=dynamic_route_configs")).await;
    let hosts = (0..services)
        .filter(|i| routes.contains(&format!("\"{}.example.com\"", svc(*i))))
        .count();
    (with_hosts.len(), hosts)
}

/// Waits until Envoy has every service and every sampled request answers; the time since
/// `since`.
async fn converge(
    client: &reqwest::Client,
    admin: &str,
    port: u16,
    services: usize,
    sample: usize,
    since: Instant,
) -> Duration {
    loop {
        let (clusters, hosts) = progress(client, admin, services).await;
        if clusters == services && hosts == services {
            let mut all = true;
            for i in 0..sample {
                let resp = client
                    .get(format!("http://127.0.0.1:{port}/"))
                    .header("host", format!("{}.example.com", svc(i)))
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await;
                let ok = match resp {
                    Ok(r) => {
                        r.status() == 200 && r.text().await.unwrap_or_default().starts_with(&format!("{}@", svc(i)))
                    }
                    Err(_) => false,
                };
                all &= ok;
            }
            if all {
                return since.elapsed();
            }
        }
        if since.elapsed() > Duration::from_secs(300) {
            panic!("not converged after 300 s: {clusters} clusters with endpoints, {hosts} hosts");
        }
        // Each look at 1,500 clusters costs Envoy some CPU too: not too often.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One request to sampled service 0 through the gateway: which backend port answered.
async fn answered_by(client: &reqwest::Client, port: u16) -> Option<String> {
    let resp = client
        .get(format!("http://127.0.0.1:{port}/"))
        .header("host", format!("{}.example.com", svc(0)))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    Some(resp.text().await.ok()?.rsplit('@').next()?.to_owned())
}

/// `rounds` endpoint changes of sampled service 0 (its instance moves to the backend's
/// other port), each timed from the start of the write until a request through the gateway
/// is answered from the new port: the change has reached Envoy's load assignment (requests
/// in a loop, so the figure is the data path's, not an admin poll's).
async fn endpoint_changes(
    client: &reqwest::Client,
    http: &str,
    port: u16,
    ports: (u16, u16),
    rounds: usize,
) -> Vec<Duration> {
    let mut took = Vec::new();
    for round in 0..rounds {
        let (to, which) = if round % 2 == 0 { (ports.1, "1") } else { (ports.0, "0") };
        let start = Instant::now();
        register(client, http, &svc(0), to).await;
        while answered_by(client, port).await.as_deref() != Some(which) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the change never reached Envoy"
            );
        }
        took.push(start.elapsed());
    }
    took.sort();
    // Back where it started for the next gateway.
    if rounds % 2 == 1 {
        register(client, http, &svc(0), ports.0).await;
    }
    took
}

fn report(what: &str, converged: Duration, mut changes: Vec<Duration>) {
    changes.sort();
    println!(
        "  {what:<16} converged {:>8} after the last write [target <= 5 s]; endpoint change p50 {} p99 {} max {} [target p99 <= 100 ms]",
        ms(converged),
        ms(percentile(&changes, 0.50)),
        ms(percentile(&changes, 0.99)),
        ms(*changes.last().unwrap()),
    );
}

#[tokio::main]
async fn main() {
    let services = env_usize("SERVICES", 1500);
    let sample = env_usize("SAMPLE", 20).min(services);
    let rounds = env_usize("ROUNDS", 30);
    let store = BenchStore::from_env();
    let test_support::process::ServerProcess { child, http, grpc, .. } = test_support::process::start_server(
        Path::new(env!("CARGO_BIN_EXE_meshd")),
        store.args().into_iter().chain(["-log-level".into(), "error".into()]),
    );
    let _server = Killed(child);
    let client = reqwest::Client::new();
    let dir = tempfile::tempdir().unwrap();
    println!(
        "api gateway benchmark ({}, real Envoys, {services} services over {services} http-routes, {sample} sampled, 2 cores)",
        store.describe()
    );
    put(
        &client,
        format!("{http}/v1/config"),
        json!({"Kind": "proxy-defaults", "Name": "global", "Config": {"protocol": "http"}}),
    )
    .await;
    let names: Vec<String> = (0..services).map(svc).collect();
    let ports = backend(&client, &http, &names[..sample]).await;
    for (i, name) in names.iter().enumerate() {
        register(&client, &http, name, if i < sample { ports.0 } else { 1 }).await;
    }

    // 1 and 2: the API gateway.
    let (api_envoy, admin) = gateway("api", "gw", &http, &grpc, dir.path()).await;
    let api_port = test_support::reserve_port();
    put(
        &client,
        format!("{http}/v1/config"),
        json!({"Kind": "api-gateway", "Name": "gw", "Listeners": [{"Name": "web", "Port": api_port, "Protocol": "http"}]}),
    )
    .await;
    let writes = Instant::now();
    for name in &names {
        put(
            &client,
            format!("{http}/v1/config"),
            json!({"Kind": "http-route", "Name": name, "Parents": [{"Name": "gw"}],
                   "Hostnames": [format!("{name}.example.com")], "Rules": [{"Services": [{"Name": name}]}]}),
        )
        .await;
    }
    let last_write = Instant::now();
    println!("  {services} http-routes written in {}", ms(last_write - writes));
    let converged = converge(&client, &admin, api_port, services, sample, last_write).await;
    let changes = endpoint_changes(&client, &http, api_port, ports, rounds).await;
    report("api gateway", converged, changes);
    drop(api_envoy);

    // 3: the ingress gateway with the same services.
    let (_ingress_envoy, admin) = gateway("ingress", "ing", &http, &grpc, dir.path()).await;
    let ingress_port = test_support::reserve_port();
    let exposed: Vec<Value> = names
        .iter()
        .map(|n| json!({"Name": n, "Hosts": [format!("{n}.example.com")]}))
        .collect();
    put(
        &client,
        format!("{http}/v1/config"),
        json!({"Kind": "ingress-gateway", "Name": "ing", "Listeners": [{"Port": ingress_port, "Protocol": "http", "Services": exposed}]}),
    )
    .await;
    let last_write = Instant::now();
    let converged = converge(&client, &admin, ingress_port, services, sample, last_write).await;
    let changes = endpoint_changes(&client, &http, ingress_port, ports, rounds).await;
    report("ingress gateway", converged, changes);
}
