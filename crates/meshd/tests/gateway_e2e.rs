//! Gateways end to end with real Envoys, after Consul's ingress and terminating gateway
//! cases: a plain HTTP client outside the mesh reaches `api` and `web` through an ingress
//! gateway (routed by Host, over mTLS to their sidecars, intentions applied); a mesh service
//! reaches `ext`, an HTTPS server outside the mesh with its own CA, through a terminating
//! gateway that originates TLS and verifies it (a wrong CA file breaks the call; a deny
//! intention blocks the caller). Both gateways are registered by `meshd connect envoy
//! -gateway ... -register`: the ingress gateway with a local agent (agent mode: the agent
//! cache's data sources), the terminating gateway with the server's catalog.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use serde_json::json;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use test_support::reserve_port as free_port;

use crate::mesh;
use mesh::{Mesh, Proc, wait_for};

/// A backend answering `<name> <path> x-from=<header>`.
pub(crate) fn backend(name: &'static str) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let text = String::from_utf8_lossy(&buf);
            let path = text.split_whitespace().nth(1).unwrap_or("?").to_owned();
            let from = text
                .lines()
                .find_map(|l| l.strip_prefix("x-from: "))
                .unwrap_or("")
                .trim()
                .to_owned();
            let body = format!("{name} {path} x-from={from}");
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

/// Runs `meshd tls ...` in `dir`.
pub(crate) fn tls(dir: &Path, args: &[&str]) {
    std::fs::create_dir_all(dir).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_meshd"))
        .arg("tls")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "meshd tls {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `ext`: an HTTPS server outside the mesh, with a certificate for `ext.example.com` from a
/// CA of its own. Returns the server, its port and that CA's file.
async fn external_https(dir: &Path) -> (Proc, u16, PathBuf) {
    tls(dir, &["ca", "create"]);
    tls(
        dir,
        &["cert", "create", "-server", "-additional-dnsname", "ext.example.com"],
    );
    let script = dir.join("ext.py");
    std::fs::write(
        &script,
        "import http.server, ssl, sys\n\
         class H(http.server.BaseHTTPRequestHandler):\n\
         \x20   def do_GET(self):\n\
         \x20       body = ('ext ' + self.path).encode()\n\
         \x20       self.send_response(200)\n\
         \x20       self.send_header('Content-Length', str(len(body)))\n\
         \x20       self.end_headers()\n\
         \x20       self.wfile.write(body)\n\
         \x20   def log_message(self, *args):\n\
         \x20       pass\n\
         srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), H)\n\
         ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\n\
         ctx.load_cert_chain(sys.argv[2], sys.argv[3])\n\
         srv.socket = ctx.wrap_socket(srv.socket, server_side=True)\n\
         open(sys.argv[1] + '.tmp', 'w').write(str(srv.server_address[1]))\n\
         import os; os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n\
         srv.serve_forever()\n",
    )
    .unwrap();
    let port_file = dir.join("ext.port");
    let child = Command::new("python3")
        .arg(&script)
        .arg(&port_file)
        .arg(dir.join("dc1-server-meshd-0.pem"))
        .arg(dir.join("dc1-server-meshd-0-key.pem"))
        .spawn()
        .expect("python3 runs the external HTTPS service");
    let proc = Proc(child);
    let port = wait_for(|| async { std::fs::read_to_string(&port_file).ok()?.trim().parse::<u16>().ok() }).await;
    (proc, port, dir.join("meshd-agent-ca.pem"))
}

/// Runs a gateway under `meshd connect envoy -gateway KIND -register` against the API at
/// `http` and xDS at `grpc`; returns the supervisor and Envoy's admin URL.
async fn gateway(http: &str, grpc: &str, kind: &str, name: &str, port: u16, dir: &Path) -> (Proc, String) {
    let address = format!("127.0.0.1:{port}");
    let which = [
        "-gateway",
        kind,
        "-service",
        name,
        "-register",
        "-address",
        &address,
        "-node",
        "node-gw",
    ];
    mesh::run_proxy(&which, http, &["-grpc-addr", grpc], &dir.join(name)).await
}

/// One request to `port` with `host` as the Host header: (status, body), `None` when the
/// connection fails.
async fn request(client: &reqwest::Client, port: u16, host: &str, path: &str) -> Option<(u16, String)> {
    let resp = client
        .get(format!("http://127.0.0.1:{port}{path}"))
        .header("host", host)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    let status = resp.status().as_u16();
    Some((status, resp.text().await.ok()?))
}

async fn until(
    client: &reqwest::Client,
    port: u16,
    host: &str,
    path: &str,
    want: impl Fn(Option<(u16, String)>) -> bool,
) {
    wait_for(|| async { want(request(client, port, host, path).await).then_some(()) }).await;
}

async fn delete(mesh: &Mesh, path: &str) {
    let resp = mesh.client.delete(format!("{}{path}", mesh.http)).send().await.unwrap();
    assert!(resp.status().is_success(), "{path}: {}", resp.text().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_and_terminating_gateways_with_real_envoys() {
    let t0 = std::time::Instant::now();
    let mesh = Mesh::start();
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    for name in ["api", "web"] {
        mesh.put(
            "/v1/config",
            json!({"Kind": "service-defaults", "Name": name, "Protocol": "http"}),
        )
        .await;
    }
    let (ingress_port, ingress_listener, ext_up) = (free_port(), free_port(), free_port());
    let (tls_listener, tcp_listener, wildcard_listener) = (free_port(), free_port(), free_port());
    // Port 1: HTTP routed by host. Port 2: TLS from the mesh CA, api under its default
    // host. Port 3: tcp to ext, out again through the terminating gateway. Port 4: `*`,
    // every http service under its default host.
    mesh.put(
        "/v1/config",
        json!({"Kind": "ingress-gateway", "Name": "ingress", "Listeners": [
            {"Port": ingress_listener, "Protocol": "http", "Services": [
                {"Name": "api", "Hosts": ["api.ingress"], "RequestHeaders": {"Add": {"x-from": "ingress"}}},
                {"Name": "web", "Hosts": ["web.ingress"]}]},
            {"Port": tls_listener, "Protocol": "http", "TLS": {"Enabled": true}, "Services": [{"Name": "api"}]},
            {"Port": tcp_listener, "Protocol": "tcp", "Services": [{"Name": "ext"}]},
            {"Port": wildcard_listener, "Protocol": "http", "Services": [{"Name": "*"}]}]}),
    )
    .await;
    let (_ext, ext_port, ext_ca) = external_https(&dir.path().join("ext")).await;
    let wrong_ca = {
        let other = dir.path().join("other");
        tls(&other, &["ca", "create"]);
        other.join("meshd-agent-ca.pem")
    };
    mesh.put(
        "/v1/catalog/register",
        json!({"Node": "external", "Address": "127.0.0.1", "Service": {"Service": "ext", "Port": ext_port}}),
    )
    .await;
    let link = |ca: &Path| {
        json!({"Kind": "terminating-gateway", "Name": "terminating", "Services": [
            {"Name": "ext", "CAFile": ca.display().to_string(), "SNI": "ext.example.com"}]})
    };
    mesh.put("/v1/config", link(&ext_ca)).await;

    let (api_port, web_port) = (backend("api"), backend("web"));
    mesh.register("node-api", "api", api_port, free_port(), json!([]), json!({}))
        .await;
    mesh.register(
        "node-web",
        "web",
        web_port,
        free_port(),
        json!([{"DestinationName": "ext", "LocalBindPort": ext_up}]),
        json!({}),
    )
    .await;
    let (api, _) = mesh.envoy("api", "node-api", dir.path()).await;
    let (web, _) = mesh.envoy("web", "node-web", dir.path()).await;
    // The ingress gateway's agent, joined to the server.
    let agent = test_support::process::start_agent(
        std::path::Path::new(env!("CARGO_BIN_EXE_meshd")),
        [
            "-dev",
            "-node",
            "node-gw",
            "-advertise",
            "127.0.0.1",
            "-retry-join",
            mesh.http.trim_start_matches("http://"),
            "-log-level",
            "warn",
        ],
    );
    let _agent = Proc(agent.child);
    let (ingress, ingress_admin) =
        gateway(&agent.http, &agent.grpc, "ingress", "ingress", ingress_port, dir.path()).await;
    let (terminating, _) = gateway(
        &mesh.http,
        &mesh.grpc,
        "terminating",
        "terminating",
        free_port(),
        dir.path(),
    )
    .await;

    println!("{:>5.1} s envoys started", t0.elapsed().as_secs_f64());
    // Ingress: routed by Host to two services, through their sidecars (mTLS), with the
    // entry's request header added for api only.
    let ok = |prefix: &'static str| {
        move |r: Option<(u16, String)>| r.is_some_and(|(s, b)| s == 200 && b.starts_with(prefix))
    };
    until(&client, ingress_listener, "api.ingress", "/", ok("api")).await;
    let (s, body) = request(&client, ingress_listener, "api.ingress", "/v1/users")
        .await
        .unwrap();
    assert_eq!((s, body.as_str()), (200, "api /v1/users x-from=ingress"));
    until(&client, ingress_listener, "web.ingress", "/", ok("web")).await;
    let (s, body) = request(&client, ingress_listener, "web.ingress", "/").await.unwrap();
    assert_eq!((s, body.as_str()), (200, "web / x-from="));
    // `*`: every http service (not the tcp one), each under `<service>.ingress.*`.
    until(&client, wildcard_listener, "web.ingress.consul", "/", ok("web")).await;
    let (s, body) = request(&client, wildcard_listener, "api.ingress.example.org", "/w")
        .await
        .unwrap();
    assert_eq!((s, body.as_str()), (200, "api /w x-from="));
    let (s, _) = request(&client, wildcard_listener, "ext.ingress.consul", "/")
        .await
        .unwrap();
    assert_eq!(s, 404, "ext is tcp: not exposed by an http wildcard");
    // The port in the Host header does not matter; an unknown host is a 404.
    let (s, _) = request(
        &client,
        ingress_listener,
        &format!("api.ingress:{ingress_listener}"),
        "/",
    )
    .await
    .unwrap();
    assert_eq!(s, 200);
    let (s, _) = request(&client, ingress_listener, "nobody.ingress", "/").await.unwrap();
    assert_eq!(s, 404);
    println!("{:>5.1} s ingress routed", t0.elapsed().as_secs_f64());
    // The gateway calls as itself: a deny intention ingress -> api is enforced by api's
    // sidecar, while web stays reachable.
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-intentions", "Name": "api", "Sources": [{"Name": "ingress", "Action": "deny"}]}),
    )
    .await;
    until(&client, ingress_listener, "api.ingress", "/", |r| {
        r.is_some_and(|(s, _)| s == 403)
    })
    .await;
    let (s, _) = request(&client, ingress_listener, "web.ingress", "/").await.unwrap();
    assert_eq!(s, 200);
    let listeners = mesh::get(&client, &format!("{ingress_admin}/listeners")).await.unwrap();
    assert!(
        listeners.contains(&format!("http:127.0.0.1:{ingress_listener}")),
        "{listeners}"
    );

    // TLS: a client trusting only the mesh CA reaches api under its default name (the
    // gateway's certificate carries it); the deny intention above still applies, so 403.
    let roots: serde_json::Value = mesh
        .client
        .get(format!("{}/v1/connect/ca/roots", mesh.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut tls_client = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .resolve("api.ingress.consul", ([127, 0, 0, 1], tls_listener).into());
    for root in roots["Roots"].as_array().unwrap() {
        let pem = root["RootCert"].as_str().unwrap();
        tls_client = tls_client.add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).unwrap());
    }
    let tls_client = tls_client.build().unwrap();
    let url = format!("https://api.ingress.consul:{tls_listener}/secure");
    let status = wait_for(|| async {
        let resp = tls_client.get(&url).timeout(Duration::from_secs(5)).send().await.ok()?;
        Some(resp.status().as_u16())
    })
    .await;
    assert_eq!(
        status, 403,
        "verified TLS to the gateway, then api's sidecar applied the intention"
    );
    delete(&mesh, "/v1/config/service-intentions/api").await;
    let body = wait_for(|| async {
        let resp = tls_client.get(&url).timeout(Duration::from_secs(5)).send().await.ok()?;
        (resp.status().as_u16() == 200).then_some(())?;
        resp.text().await.ok()
    })
    .await;
    assert!(body.starts_with("api /secure"), "{body}");
    println!("{:>5.1} s ingress TLS", t0.elapsed().as_secs_f64());

    println!("{:>5.1} s ingress intention", t0.elapsed().as_secs_f64());
    // Terminating: web reaches ext through the gateway, which verifies ext with its CA file.
    until(&client, ext_up, "ext", "/", ok("ext")).await;
    let (s, body) = request(&client, ext_up, "ext", "/status").await.unwrap();
    assert_eq!((s, body.as_str()), (200, "ext /status"));
    println!("{:>5.1} s terminating reached", t0.elapsed().as_secs_f64());
    // A CA that did not sign ext's certificate: the gateway refuses ext, the call fails.
    mesh.put("/v1/config", link(&wrong_ca)).await;
    until(&client, ext_up, "ext", "/", |r| r.is_none_or(|(s, _)| s != 200)).await;
    for _ in 0..5 {
        let r = request(&client, ext_up, "ext", "/").await;
        assert!(r.as_ref().is_none_or(|(s, _)| *s != 200), "{r:?}");
    }
    println!("{:>5.1} s wrong CA refused", t0.elapsed().as_secs_f64());
    mesh.put("/v1/config", link(&ext_ca)).await;
    until(&client, ext_up, "ext", "/", ok("ext")).await;
    println!("{:>5.1} s CA restored", t0.elapsed().as_secs_f64());
    // A deny intention web -> ext is enforced by the gateway.
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-intentions", "Name": "ext", "Sources": [{"Name": "web", "Action": "deny"}]}),
    )
    .await;
    until(&client, ext_up, "ext", "/", |r| r.is_none_or(|(s, _)| s != 200)).await;
    delete(&mesh, "/v1/config/service-intentions/ext").await;
    until(&client, ext_up, "ext", "/", ok("ext")).await;

    println!("{:>5.1} s intention applied and removed", t0.elapsed().as_secs_f64());
    // In through the ingress gateway's tcp listener, out through the terminating gateway.
    let raw = wait_for(|| async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", tcp_listener)).await.ok()?;
        conn.write_all(b"GET /via-ingress HTTP/1.0\r\nHost: ext\r\n\r\n")
            .await
            .ok()?;
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut out))
            .await
            .ok()?
            .ok()?;
        let text = String::from_utf8_lossy(&out).into_owned();
        text.contains("ext /via-ingress").then_some(text)
    })
    .await;
    assert!(raw.starts_with("HTTP/1.0 200"), "{raw}");
    println!(
        "{:>5.1} s ingress tcp to the terminating gateway",
        t0.elapsed().as_secs_f64()
    );

    let mesh_gw = mesh_gateway(&mesh, dir.path(), &roots).await;
    println!("{:>5.1} s mesh gateway", t0.elapsed().as_secs_f64());

    // Nothing was refused by an Envoy along the way.
    for t in ["Cluster", "Listener", "Route", "Secret"] {
        assert_eq!(
            mesh.metric(&format!(r#"meshd_xds_nacks_total{{type="{t}"}}"#)).await,
            0.0,
            "{t}"
        );
    }
    mesh::stop_together(vec![api, web, ingress, terminating, mesh_gw]);
}

/// A mesh gateway (`-gateway mesh`, registered in the server's catalog with its `lan` and
/// `wan` addresses) routes a connection by its SNI to api's sidecar without terminating it:
/// a client holding web's leaf reaches api's backend through it, api's sidecar checks the
/// client certificate and applies the intentions with web's identity; no certificate, or a
/// name no service has, gets nothing. Returns the gateway's supervisor.
async fn mesh_gateway(mesh: &Mesh, dir: &Path, roots: &serde_json::Value) -> Proc {
    let port = free_port();
    let which = [
        "-gateway",
        "mesh",
        "-register",
        "-address",
        &format!("127.0.0.1:{port}"),
        "-wan-address",
        "127.0.0.2:443",
        "-node",
        "node-gw",
    ];
    let (gateway, _) = mesh::run_proxy(
        &which,
        &mesh.http,
        &["-grpc-addr", &mesh.grpc],
        &dir.join("mesh-gateway"),
    )
    .await;
    let registered: serde_json::Value = mesh
        .client
        .get(format!("{}/v1/catalog/service/mesh-gateway", mesh.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let tagged = &registered[0]["ServiceTaggedAddresses"];
    assert_eq!(
        tagged["lan"],
        json!({"Address": "127.0.0.1", "Port": port}),
        "{registered}"
    );
    assert_eq!(
        tagged["wan"],
        json!({"Address": "127.0.0.2", "Port": 443}),
        "{registered}"
    );
    assert_eq!(registered[0]["ServiceKind"], "mesh-gateway");

    let leaf: serde_json::Value = mesh
        .client
        .get(format!("{}/v1/agent/connect/ca/leaf/web", mesh.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let pem = format!(
        "{}{}",
        leaf["CertPEM"].as_str().unwrap(),
        leaf["PrivateKeyPEM"].as_str().unwrap()
    );
    let trust_domain = roots["TrustDomain"].as_str().unwrap();
    let host = format!("api.default.dc1.internal.{trust_domain}");
    let nobody = format!("nobody.default.dc1.internal.{trust_domain}");
    let client = |identity: bool| {
        // The server certificate is api's, named by its SPIFFE id rather than a host name:
        // not checked here; api's sidecar checks this side's.
        let mut b = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .resolve(&host, ([127, 0, 0, 1], port).into())
            .resolve(&nobody, ([127, 0, 0, 1], port).into());
        if identity {
            b = b.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
        }
        b.build().unwrap()
    };
    let (web, anonymous) = (client(true), client(false));
    let get = |c: &reqwest::Client, host: &str| {
        let req = c
            .get(format!("https://{host}:{port}/through-the-mesh-gateway"))
            .timeout(Duration::from_secs(5));
        async move {
            let resp = req.send().await.ok()?;
            Some((resp.status().as_u16(), resp.text().await.ok()?))
        }
    };
    let body = wait_for(|| async { get(&web, &host).await.filter(|(s, _)| *s == 200).map(|(_, b)| b) }).await;
    assert_eq!(body, "api /through-the-mesh-gateway x-from=");
    assert_eq!(
        get(&anonymous, &host).await,
        None,
        "api's sidecar requires a mesh certificate"
    );
    assert_eq!(get(&web, &nobody).await, None, "no service has that name: closed");
    // The caller is web, as api's sidecar sees it.
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-intentions", "Name": "api", "Sources": [{"Name": "web", "Action": "deny"}]}),
    )
    .await;
    wait_for(|| async { get(&web, &host).await.filter(|(s, _)| *s == 403) }).await;
    delete(mesh, "/v1/config/service-intentions/api").await;
    wait_for(|| async { get(&web, &host).await.filter(|(s, _)| *s == 200) }).await;
    gateway
}

/// The grpcio side of the gRPC case: `serve PORT_FILE` answers `/echo.Echo/Say` with
/// `echo <request>`; `call ADDR AUTHORITY` calls it once and prints the answer or the status.
const GRPC_ECHO: &str = r#"
import concurrent.futures, os, sys
import grpc
if sys.argv[1] == "serve":
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
    say = grpc.unary_unary_rpc_method_handler(lambda request, context: b"echo " + request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("echo.Echo", {"Say": say}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    open(sys.argv[2] + ".tmp", "w").write(str(port))
    os.rename(sys.argv[2] + ".tmp", sys.argv[2])
    server.wait_for_termination()
else:
    channel = grpc.insecure_channel("ipv4:" + sys.argv[2], options=[("grpc.default_authority", sys.argv[3])])
    try:
        print(channel.unary_unary("/echo.Echo/Say")(b"hi", timeout=5).decode())
    except grpc.RpcError as e:
        print(e.code().name, e.details())
        sys.exit(1)
"#;

/// Starts the grpcio echo server; returns it, its port and the script (the client is the
/// same script).
async fn grpc_echo(dir: &Path) -> (Proc, u16, PathBuf) {
    let script = dir.join("grpc_echo.py");
    std::fs::write(&script, GRPC_ECHO).unwrap();
    let port_file = dir.join("grpc_echo.port");
    let child = Command::new(test_support::python())
        .arg(&script)
        .args(["serve"])
        .arg(&port_file)
        .spawn()
        .expect("the pinned Python runs the grpcio echo server");
    let proc = Proc(child);
    let port = wait_for(|| async { std::fs::read_to_string(&port_file).ok()?.trim().parse::<u16>().ok() }).await;
    (proc, port, script)
}

/// One grpcio call (`script`, see [`GRPC_ECHO`]) to 127.0.0.1:`port` with `:authority`
/// `authority`: (succeeded, output).
fn grpc_call(script: &Path, port: u16, authority: &str) -> (bool, String) {
    let out = Command::new(test_support::python())
        .arg(script)
        .args(["call", &format!("127.0.0.1:{port}"), authority])
        .output()
        .expect("the pinned Python runs the grpcio client");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// Envoy's `/ready` answer: `LIVE` once it has its first configuration.
async fn live(client: &reqwest::Client, admin: &str) -> bool {
    mesh::get(client, &format!("{admin}/ready"))
        .await
        .is_some_and(|s| s.trim() == "LIVE")
}

/// A proxy's build problems, as its status shows them.
async fn problems(mesh: &Mesh, proxy: &str) -> String {
    let status = mesh::get(&mesh.client, &format!("{}/v1/internal/proxy-status/{proxy}", mesh.http))
        .await
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&status).unwrap_or_default();
    v["BuildErrors"].to_string()
}

/// Gateways with no config entry yet are ready (Envoy `LIVE`, the terminating gateway's port
/// accepting connections) and say why they serve nothing; entries written later take effect
/// in the same Envoys. A service registered by host name (`localhost`) listening on IPv4 only
/// is reached through the terminating gateway (resolved IPv4 only, as Consul's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_without_entries_are_ready_then_follow_their_entries() {
    let t0 = std::time::Instant::now();
    let mesh = Mesh::start();
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let (tgw_port, igw_port, igw_listener, ext_up) = (free_port(), free_port(), free_port(), free_port());
    let (_tgw, tgw_admin) = gateway(&mesh.http, &mesh.grpc, "terminating", "tgw", tgw_port, dir.path()).await;
    let (_igw, igw_admin) = gateway(&mesh.http, &mesh.grpc, "ingress", "igw", igw_port, dir.path()).await;
    wait_for(|| async { (live(&client, &tgw_admin).await && live(&client, &igw_admin).await).then_some(()) }).await;
    // The terminating gateway listens on its port (its health check passes), matching nothing.
    wait_for(|| async { std::net::TcpStream::connect(("127.0.0.1", tgw_port)).ok() }).await;
    let said = problems(&mesh, "tgw").await;
    assert!(said.contains("no services linked"), "{said}");
    let said = problems(&mesh, "igw").await;
    assert!(said.contains("no ingress-gateway config entry"), "{said}");
    println!(
        "{:>5.1} s both gateways ready with no entry",
        t0.elapsed().as_secs_f64()
    );

    // ext: registered as `localhost`, listening on 127.0.0.1 only.
    let ext_port = backend("ext");
    mesh.put(
        "/v1/catalog/register",
        json!({"Node": "external", "Address": "localhost", "Service": {"Service": "ext", "Port": ext_port}}),
    )
    .await;
    mesh.put(
        "/v1/config",
        json!({"Kind": "terminating-gateway", "Name": "tgw", "Services": [{"Name": "ext"}]}),
    )
    .await;
    let web_port = backend("web");
    mesh.register(
        "node-web",
        "web",
        web_port,
        free_port(),
        json!([{"DestinationName": "ext", "LocalBindPort": ext_up}]),
        json!({}),
    )
    .await;
    let (_web, _) = mesh.envoy("web", "node-web", dir.path()).await;
    let ok = |prefix: &'static str| {
        move |r: Option<(u16, String)>| r.is_some_and(|(s, b)| s == 200 && b.starts_with(prefix))
    };
    until(&client, ext_up, "ext", "/by-name", ok("ext /by-name")).await;
    let clusters = mesh::get(
        &client,
        &format!("{tgw_admin}/config_dump?resource=dynamic_active_clusters"),
    )
    .await
    .unwrap();
    assert!(
        clusters.contains("LOGICAL_DNS") && clusters.contains("V4_ONLY"),
        "{clusters}"
    );
    println!("{:>5.1} s ext reached by host name", t0.elapsed().as_secs_f64());

    // The ingress gateway's entry, written after its Envoy started.
    mesh.put(
        "/v1/config",
        json!({"Kind": "ingress-gateway", "Name": "igw", "Listeners": [
            {"Port": igw_listener, "Protocol": "tcp", "Services": [{"Name": "web"}]}]}),
    )
    .await;
    until(&client, igw_listener, "web", "/late", ok("web /late")).await;
    println!("{:>5.1} s ingress entry applied", t0.elapsed().as_secs_f64());

    // A gRPC client (grpcio) through an ingress host with a port: it sends the port in
    // `:authority`, and the host names it.
    let (_echo, echo_port, grpc_script) = grpc_echo(dir.path()).await;
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-defaults", "Name": "echo", "Protocol": "grpc"}),
    )
    .await;
    mesh.register("node-echo", "echo", echo_port, free_port(), json!([]), json!({}))
        .await;
    let (_echo_proxy, _) = mesh.envoy("echo", "node-echo", dir.path()).await;
    let grpc_listener = free_port();
    let authority = format!("localhost:{grpc_listener}");
    mesh.put(
        "/v1/config",
        json!({"Kind": "ingress-gateway", "Name": "igw", "Listeners": [
            {"Port": igw_listener, "Protocol": "tcp", "Services": [{"Name": "web"}]},
            {"Port": grpc_listener, "Protocol": "grpc", "Services": [{"Name": "echo", "Hosts": [authority]}]}]}),
    )
    .await;
    let said = wait_for(|| async {
        let (ok, out) = grpc_call(&grpc_script, grpc_listener, &authority);
        ok.then_some(out)
    })
    .await;
    assert_eq!(said.trim(), "echo hi");
    // Another authority matches no host of the listener.
    let (ok, out) = grpc_call(&grpc_script, grpc_listener, &format!("elsewhere:{grpc_listener}"));
    assert!(!ok, "{out}");
    println!(
        "{:>5.1} s grpc through an ingress host with a port",
        t0.elapsed().as_secs_f64()
    );
    // Subsets behind the terminating gateway: ext now has two instances by version (at IP
    // addresses: EDS), a resolver whose default subset is v2 and a router sending
    // `x-version: v1` to v1; then the router and the resolver go and the whole service
    // answers again.
    let (v1, v2) = (backend("ext-v1"), backend("ext-v2"));
    for (id, port, version) in [("ext-v1", v1, "v1"), ("ext-v2", v2, "v2")] {
        mesh.put(
            "/v1/catalog/register",
            json!({"Node": "external", "Address": "localhost", "Service": {"ID": id, "Service": "ext", "Address": "127.0.0.1", "Port": port, "Meta": {"version": version}}}),
        )
        .await;
    }
    mesh.put(
        "/v1/catalog/deregister",
        json!({"Node": "external", "ServiceID": "ext"}),
    )
    .await;
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-defaults", "Name": "ext", "Protocol": "http"}),
    )
    .await;
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-resolver", "Name": "ext", "DefaultSubset": "v2", "Subsets": {
            "v1": {"Filter": "Service.Meta.version == v1"}, "v2": {"Filter": "Service.Meta.version == v2"}}}),
    )
    .await;
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-router", "Name": "ext", "Routes": [
            {"Match": {"HTTP": {"Header": [{"Name": "x-version", "Exact": "v1"}]}}, "Destination": {"ServiceSubset": "v1"}}]}),
    )
    .await;
    let via = |version: Option<&'static str>| {
        let client = client.clone();
        async move {
            let mut req = client
                .get(format!("http://127.0.0.1:{ext_up}/s"))
                .timeout(Duration::from_secs(5));
            if let Some(v) = version {
                req = req.header("x-version", v);
            }
            let resp = req.send().await.ok()?;
            (resp.status() == 200).then_some(())?;
            resp.text().await.ok()
        }
    };
    // Settled once several requests in a row go where they should: before the router and
    // the resolver are in place everywhere, round robin over all instances can answer from
    // the right one by chance.
    wait_for(|| async {
        for _ in 0..6 {
            via(Some("v1")).await.filter(|b| b.starts_with("ext-v1 /s"))?;
            via(None).await.filter(|b| b.starts_with("ext-v2 /s"))?;
        }
        Some(())
    })
    .await;
    for _ in 0..10 {
        assert!(via(Some("v1")).await.unwrap_or_default().starts_with("ext-v1 "));
        assert!(via(None).await.unwrap_or_default().starts_with("ext-v2 "));
    }
    println!(
        "{:>5.1} s subsets routed through the terminating gateway",
        t0.elapsed().as_secs_f64()
    );
    delete(&mesh, "/v1/config/service-router/ext").await;
    delete(&mesh, "/v1/config/service-resolver/ext").await;
    let seen = parking_lot::Mutex::new(std::collections::BTreeSet::new());
    wait_for(|| async {
        let body = via(None).await?;
        let mut seen = seen.lock();
        seen.insert(body.split_whitespace().next().unwrap_or("").to_owned());
        (seen.len() == 2).then_some(())
    })
    .await;
    let seen = seen.into_inner();
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        ["ext-v1", "ext-v2"],
        "the whole service again"
    );
    println!(
        "{:>5.1} s resolver deleted: the whole service",
        t0.elapsed().as_secs_f64()
    );

    // The same Envoys all along: none was restarted to pick the entries up.
    for admin in [&tgw_admin, &igw_admin] {
        let info = mesh::get(&client, &format!("{admin}/server_info")).await.unwrap();
        let v: serde_json::Value = serde_json::from_str(&info).unwrap();
        assert_eq!(v["command_line_options"]["restart_epoch"], 0, "{admin}");
    }
    assert!(!problems(&mesh, "tgw").await.contains("no services linked"));
    for t in ["Cluster", "Listener"] {
        assert_eq!(
            mesh.metric(&format!(r#"meshd_xds_nacks_total{{type="{t}"}}"#)).await,
            0.0,
            "{t}"
        );
    }
}
