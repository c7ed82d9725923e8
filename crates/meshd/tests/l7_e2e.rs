//! L7 traffic management end to end with real Envoys: a router, a splitter and a resolver
//! with subsets, failover and a redirect shape what web's Envoy does with requests for
//! `api`; L7 intentions are enforced by api's Envoys. Backends answer with their own name
//! and the path they saw.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use test_support::reserve_port as free_port;

use crate::mesh;
use mesh::{Mesh, wait_for};

/// A backend answering `<name> <path>`, then each request header whose name has an
/// underscore (` x_user: bob`); when `flaky`, every other request is a 503. Returns its port
/// and how many requests it has seen.
fn backend(name: &'static str, flaky: bool) -> (u16, Arc<AtomicU64>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&seen);
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let buf = read_head(&mut conn);
            let text = String::from_utf8_lossy(&buf);
            let path = text.split_whitespace().nth(1).unwrap_or("?").to_owned();
            let underscored: String = text
                .lines()
                .skip(1)
                .filter(|l| l.split_once(':').is_some_and(|(n, _)| n.contains('_')))
                .map(|l| format!(" {l}"))
                .collect();
            let n = count.fetch_add(1, Ordering::SeqCst);
            let (status, body) = if flaky && n.is_multiple_of(2) {
                ("503 Service Unavailable", "unavailable".to_owned())
            } else {
                ("200 OK", format!("{name} {path}{underscored}"))
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, seen)
}

/// A request's line and headers, read from `conn` (up to the blank line, or what came before
/// the connection ended).
fn read_head(conn: &mut std::net::TcpStream) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    buf
}

/// Registers `service` on `node` with a sidecar carrying `meta`, and the sidecar's own
/// health check (passing) so the test can turn the instance critical.
async fn register(mesh: &Mesh, node: &str, service: &str, port: u16, proxy_port: u16, meta: Value, upstreams: Value) {
    mesh.put(
        "/v1/catalog/register",
        json!({"Node": node, "Address": "127.0.0.1",
               "Service": {"Service": service, "Port": port, "Meta": meta}}),
    )
    .await;
    let proxy = format!("{service}-sidecar-proxy");
    mesh.put(
        "/v1/catalog/register",
        json!({"Node": node, "Address": "127.0.0.1",
               "Service": {"Kind": "connect-proxy", "ID": proxy, "Service": proxy, "Port": proxy_port, "Meta": meta,
                           "Proxy": {"DestinationServiceName": service, "LocalServicePort": port, "Upstreams": upstreams}},
               "Check": {"CheckID": format!("{proxy}-alive"), "Name": "alive", "ServiceID": proxy, "Status": "passing"}}),
    )
    .await;
}

async fn set_check(mesh: &Mesh, node: &str, service: &str, status: &str) {
    let proxy = format!("{service}-sidecar-proxy");
    mesh.put(
        "/v1/catalog/register",
        json!({"Node": node, "Address": "127.0.0.1", "SkipNodeUpdate": true,
               "Check": {"CheckID": format!("{proxy}-alive"), "Name": "alive", "ServiceID": proxy, "Status": status}}),
    )
    .await;
}

/// One request through web's upstream listener: (status, body).
async fn request(client: &reqwest::Client, port: u16, path: &str, headers: &[(&str, &str)]) -> Option<(u16, String)> {
    let mut req = client
        .get(format!("http://127.0.0.1:{port}{path}"))
        .timeout(Duration::from_secs(5));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.ok()?;
    let status = resp.status().as_u16();
    Some((status, resp.text().await.ok()?))
}

/// Polls until a request answers `status` with a body starting with `prefix`.
async fn until(client: &reqwest::Client, port: u16, path: &str, headers: &[(&str, &str)], status: u16, prefix: &str) {
    wait_for(|| async {
        let (s, body) = request(client, port, path, headers).await?;
        (s == status && body.starts_with(prefix)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_splits_retries_failover_redirects_and_l7_intentions() {
    let mesh = Mesh::start();
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    for name in ["api", "flaky", "old-api"] {
        mesh.put(
            "/v1/config",
            json!({"Kind": "service-defaults", "Name": name, "Protocol": "http"}),
        )
        .await;
    }
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-resolver", "Name": "api", "DefaultSubset": "v1",
               "Subsets": {"v1": {"Filter": "Service.Meta.version == v1"}, "v2": {"Filter": "Service.Meta.version == v2"}},
               "Failover": {"v1": {"ServiceSubset": "v2"}}}),
    )
    .await;
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-splitter", "Name": "api",
               "Splits": [{"Weight": 80, "ServiceSubset": "v1"}, {"Weight": 20, "ServiceSubset": "v2"}]}),
    )
    .await;
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-router", "Name": "api", "Routes": [
            {"Match": {"HTTP": {"Header": [{"Name": "x-version", "Exact": "2"}]}}, "Destination": {"ServiceSubset": "v2"}},
            {"Match": {"HTTP": {"PathPrefix": "/rewrite/"}}, "Destination": {"ServiceSubset": "v2", "PrefixRewrite": "/v2/"}},
            {"Match": {"HTTP": {"PathPrefix": "/retry"}},
             "Destination": {"Service": "flaky", "NumRetries": 3, "RetryOnStatusCodes": [503]}},
            {"Match": {"HTTP": {"PathPrefix": "/primary"}}, "Destination": {"ServiceSubset": "v1"}}
        ]}),
    )
    .await;
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-resolver", "Name": "old-api", "Redirect": {"Service": "api", "ServiceSubset": "v2"}}),
    )
    .await;
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-intentions", "Name": "api", "Sources": [{"Name": "web", "Permissions": [
            {"Action": "deny", "HTTP": {"PathPrefix": "/admin"}},
            {"Action": "allow", "HTTP": {"PathPrefix": "/"}}]}]}),
    )
    .await;

    let (v1_port, _) = backend("api-v1", false);
    let (v2_port, _) = backend("api-v2", false);
    let (flaky_port, flaky_seen) = backend("flaky", true);
    let (web_port, _) = backend("web", false);
    let (api_up, old_up) = (free_port(), free_port());
    register(
        &mesh,
        "node-v1",
        "api",
        v1_port,
        free_port(),
        json!({"version": "v1"}),
        json!([]),
    )
    .await;
    register(
        &mesh,
        "node-v2",
        "api",
        v2_port,
        free_port(),
        json!({"version": "v2"}),
        json!([]),
    )
    .await;
    register(
        &mesh,
        "node-flaky",
        "flaky",
        flaky_port,
        free_port(),
        json!({}),
        json!([]),
    )
    .await;
    register(
        &mesh,
        "node-web",
        "web",
        web_port,
        free_port(),
        json!({}),
        json!([{"DestinationName": "api", "LocalBindPort": api_up},
               {"DestinationName": "old-api", "LocalBindPort": old_up}]),
    )
    .await;
    let (_v1, _) = mesh.envoy("api", "node-v1", dir.path()).await;
    let (_v2, _) = mesh.envoy("api", "node-v2", dir.path()).await;
    let (_flaky, _) = mesh.envoy("flaky", "node-flaky", dir.path()).await;
    let (_web, web_admin) = mesh.envoy("web", "node-web", dir.path()).await;

    // Everything is up once both subsets answer their own routes.
    until(&client, api_up, "/primary", &[], 200, "api-v1").await;
    until(&client, api_up, "/", &[("x-version", "2")], 200, "api-v2").await;
    dry_run_of_a_splitter_change(&mesh, &client, &web_admin).await;

    // The header route reaches v2, every time.
    for _ in 0..20 {
        let (s, body) = request(&client, api_up, "/h", &[("x-version", "2")]).await.unwrap();
        assert_eq!((s, body.as_str()), (200, "api-v2 /h"));
    }

    // The prefix rewrite: /rewrite/x arrives as /v2/x.
    let (s, body) = request(&client, api_up, "/rewrite/x", &[]).await.unwrap();
    assert_eq!((s, body.as_str()), (200, "api-v2 /v2/x"));

    // 80/20 over 2,000 requests, within 5 points.
    let mut v1 = 0u32;
    let total = 2_000u32;
    for _ in 0..total {
        let (s, body) = request(&client, api_up, "/split", &[]).await.unwrap();
        assert_eq!(s, 200, "{body}");
        if body.starts_with("api-v1") {
            v1 += 1;
        } else {
            assert!(body.starts_with("api-v2"), "{body}");
        }
    }
    let share = f64::from(v1) / f64::from(total);
    println!("split: {v1} of {total} to v1 ({:.1} %)", share * 100.0);
    assert!((0.75..=0.85).contains(&share), "v1 got {:.1} %", share * 100.0);

    // Retries on 503 turn a backend failing every other request into 100 % success.
    let before = flaky_seen.load(Ordering::SeqCst);
    for _ in 0..50 {
        let (s, body) = request(&client, api_up, "/retry", &[]).await.unwrap();
        assert_eq!((s, body.as_str()), (200, "flaky /retry"));
    }
    let attempts = flaky_seen.load(Ordering::SeqCst) - before;
    assert!(
        attempts >= 75,
        "the backend failed only {} times: retries not exercised",
        attempts - 50
    );

    // A redirect: old-api's chain resolves to api's v2 subset.
    until(&client, old_up, "/", &[], 200, "api-v2").await;

    // L7 intentions: /admin is denied by api's Envoys, / is allowed.
    let (s, _) = request(&client, api_up, "/admin/users", &[]).await.unwrap();
    assert_eq!(s, 403);
    // Spellings of the same path are normalized before the rule sees them (sent verbatim on
    // a raw connection: an HTTP client library would resolve the dot segments itself).
    // Repeated slashes are not merged by default, as in Consul (`MergeSlashes` in the mesh entry).
    let upstream_addr: std::net::SocketAddr = format!("127.0.0.1:{api_up}").parse().unwrap();
    for path in ["/%61dmin", "/x/../admin", "/./admin", "/ADMIN/../admin"] {
        let status = test_support::http::get(upstream_addr, path).await;
        assert_eq!(status, Ok(403), "{path}");
    }
    let (s, _) = request(&client, api_up, "/", &[]).await.unwrap();
    assert_eq!(s, 200);

    // Failover: v1's only instance turns critical, /primary lands on v2; then back.
    set_check(&mesh, "node-v1", "api", "critical").await;
    until(&client, api_up, "/primary", &[], 200, "api-v2").await;
    let clusters = mesh::get(&client, &format!("{web_admin}/clusters")).await.unwrap();
    assert!(
        clusters.contains("failover~v1.api.default.dc1"),
        "an aggregate cluster fails v1 over: {clusters}"
    );
    set_check(&mesh, "node-v1", "api", "passing").await;
    until(&client, api_up, "/primary", &[], 200, "api-v1").await;

    // Nothing failed to build along the way (the counter is exported, at zero).
    let metrics = mesh::get(&client, &format!("{}/v1/agent/metrics?format=prometheus", mesh.http))
        .await
        .unwrap();
    assert!(metrics.contains("\nmeshd_xds_build_failures_total 0\n"), "{metrics}");
    assert_eq!(mesh.metric(r#"meshd_xds_nacks_total{type="Route"}"#).await, 0.0);
    assert_eq!(mesh.metric(r#"meshd_xds_nacks_total{type="Cluster"}"#).await, 0.0);
    assert_eq!(mesh.metric(r#"meshd_xds_nacks_total{type="Listener"}"#).await, 0.0);
}

/// One raw request through `addr` (see [`test_support::http::exchange`]): its status and
/// body, and for a redirect its `location`.
async fn raw(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Option<(u16, String)> {
    raw_or_why(addr, path, headers).await.ok()
}

/// [`raw`], for a request that must be answered: the test fails saying why it was not.
async fn answered(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    raw_or_why(addr, path, headers)
        .await
        .unwrap_or_else(|why| panic!("GET {path} at {addr} with {headers:?} got no answer: {why}"))
}

async fn raw_or_why(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Result<(u16, String), String> {
    let r = test_support::http::exchange(addr, path, headers).await?;
    let body = match r.header("location") {
        Some(location) if (300..400).contains(&r.status) => location.to_owned(),
        _ => r.body,
    };
    Ok((r.status, body))
}

/// Polls until a raw request answers `status`.
async fn until_raw(addr: SocketAddr, path: &str, headers: &[(&str, &str)], status: u16) {
    wait_for(|| async { (raw(addr, path, headers).await?.0 == status).then_some(()) }).await;
}

/// Polls until a raw request answers `status` (the listener update is in), then until the
/// Envoy at `admin` has drained the filter chains it replaced: web's Envoy pools its
/// connections to api's, and those on a replaced chain keep its old settings until then.
async fn until_updated(
    client: &reqwest::Client,
    admin: &str,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    status: u16,
) {
    until_raw(addr, path, headers, status).await;
    wait_for(|| async {
        let stats = mesh::get(
            client,
            &format!("{admin}/stats?filter=listener_manager.total_.*draining"),
        )
        .await?;
        let gauges: Vec<&str> = stats.lines().collect();
        (gauges.len() == 2 && gauges.iter().all(|g| g.ends_with(": 0"))).then_some(())
    })
    .await;
}

/// A request and what it must get: a status, and the backend's answer for a 200 (the path
/// and underscored headers it received) or the `location` of a redirect (else anything).
type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], u16, &'a str);

async fn expect(addr: SocketAddr, phase: &str, cases: &[Case<'_>]) {
    for &(path, headers, status, seen) in cases {
        let (s, body) = answered(addr, path, headers).await;
        println!("{phase}: {path} {headers:?} -> {s} {body:?}");
        assert_eq!(s, status, "{phase}: {path} {headers:?}: {body}");
        if !seen.is_empty() {
            assert_eq!(body, seen, "{phase}: {path} {headers:?}");
        }
    }
}

/// The `mesh` entry's `HTTP.Incoming.RequestNormalization` decides what api's Envoy makes of
/// a request before its L7 intentions judge it, and so what the application receives:
/// Consul's defaults (path normalized; slashes, escaped slashes and underscored headers left
/// alone), then merging and unescaping, then rejecting, then redirecting with path
/// normalization off. Header conditions `Contains` with and without `IgnoreCase` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_normalization_decides_what_l7_intentions_see() {
    let started = std::time::Instant::now();
    let mesh = Mesh::start();
    let dir = tempfile::tempdir().unwrap();
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-defaults", "Name": "api", "Protocol": "http"}),
    )
    .await;
    let header = |h: Value| json!({"Action": "deny", "HTTP": {"Header": [h]}});
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-intentions", "Name": "api", "Sources": [{"Name": "web", "Permissions": [
            {"Action": "deny", "HTTP": {"PathPrefix": "/admin"}},
            header(json!({"Name": "x-user", "Exact": "admin"})),
            header(json!({"Name": "x_user", "Exact": "admin"})),
            header(json!({"Name": "x-role", "Contains": "admin", "IgnoreCase": true})),
            header(json!({"Name": "x-team", "Contains": "ops"})),
            {"Action": "allow", "HTTP": {"PathPrefix": "/"}}]}]}),
    )
    .await;
    let (api_port, _) = backend("api", false);
    let (web_port, _) = backend("web", false);
    let api_up = free_port();
    // Every proxy traces to a Zipkin receiver of the test's, through an extra static cluster.
    let (zipkin_port, spans) = zipkin_receiver();
    mesh.put("/v1/config", tracing_defaults(zipkin_port)).await;
    register(&mesh, "node-api", "api", api_port, free_port(), json!({}), json!([])).await;
    register(
        &mesh,
        "node-web",
        "web",
        web_port,
        free_port(),
        json!({}),
        json!([{"DestinationName": "api", "LocalBindPort": api_up}]),
    )
    .await;
    let (_api, api_admin) = mesh.envoy("api", "node-api", dir.path()).await;
    let (_web, web_admin) = mesh.envoy("web", "node-web", dir.path()).await;
    let client = reqwest::Client::new();
    let up: SocketAddr = format!("127.0.0.1:{api_up}").parse().unwrap();
    until_raw(up, "/public/x", &[], 200).await;
    traced_by_both_sidecars(up, &spans, &[&api_admin, &web_admin]).await;

    // No mesh entry: the path is normalized (dot segments resolved), nothing else.
    expect(
        up,
        "defaults",
        &[
            ("/public/x", &[], 200, "api /public/x"),
            ("/admin", &[], 403, ""),
            ("/public/../admin", &[], 403, ""),
            ("//admin", &[], 200, "api //admin"),
            ("/public/..%2Fadmin", &[], 200, "api /public/..%2Fadmin"),
            ("/public/..%2fadmin", &[], 200, "api /public/..%2fadmin"),
            ("/public/..%5Cadmin", &[], 200, "api /public/..%5Cadmin"),
            ("/public/x", &[("x-user", "admin")], 403, ""),
            ("/public/x", &[("x_user", "admin")], 403, ""),
            ("/public/x", &[("x_user", "bob")], 200, "api /public/x x_user: bob"),
            // Contains with IgnoreCase matches any case; without, only the same case.
            ("/public/x", &[("x-role", "SuperADMIN")], 403, ""),
            ("/public/x", &[("x-team", "OPS-east")], 200, "api /public/x"),
            ("/public/x", &[("x-team", "ops-east")], 403, ""),
        ],
    )
    .await;

    let normalization = |rn: Value| json!({"Kind": "mesh", "HTTP": {"Incoming": {"RequestNormalization": rn}}});
    mesh.put(
        "/v1/config",
        normalization(
            json!({"MergeSlashes": true, "PathWithEscapedSlashesAction": "UNESCAPE_AND_FORWARD",
            "HeadersWithUnderscoresAction": "DROP_HEADER"}),
        ),
    )
    .await;
    until_updated(&client, &api_admin, up, "//admin", &[], 403).await;
    expect(
        up,
        "merge, unescape, drop",
        &[
            ("//admin", &[], 403, ""),
            ("/public//x", &[], 200, "api /public/x"),
            ("/public/..%2Fadmin", &[], 403, ""),
            ("/public/..%2fadmin", &[], 403, ""),
            ("/public/..%5Cadmin", &[], 403, ""),
            ("/public%2Fx", &[], 200, "api /public/x"),
            ("/public/x", &[("x-user", "admin")], 403, ""),
            // Dropped before the intentions and the application see it.
            ("/public/x", &[("x_user", "admin")], 200, "api /public/x"),
        ],
    )
    .await;

    mesh.put(
        "/v1/config",
        normalization(json!({"PathWithEscapedSlashesAction": "REJECT_REQUEST",
            "HeadersWithUnderscoresAction": "REJECT_REQUEST"})),
    )
    .await;
    until_updated(&client, &api_admin, up, "/public%2Fx", &[], 400).await;
    expect(
        up,
        "reject",
        &[
            ("/public/..%2Fadmin", &[], 400, ""),
            ("/public/..%5Cadmin", &[], 400, ""),
            ("/public/x", &[("x_user", "bob")], 400, ""),
            ("/public/x", &[], 200, "api /public/x"),
            ("//admin", &[], 200, "api //admin"),
        ],
    )
    .await;

    mesh.put(
        "/v1/config",
        normalization(json!({"InsecureDisablePathNormalization": true,
            "PathWithEscapedSlashesAction": "UNESCAPE_AND_REDIRECT"})),
    )
    .await;
    until_updated(&client, &api_admin, up, "/public/../admin", &[], 200).await;
    expect(
        up,
        "redirect, no path normalization",
        &[
            ("/public%2Fx", &[], 307, "/public/x"),
            ("/public/../admin", &[], 200, "api /public/../admin"),
            ("/public/x", &[("x_user", "bob")], 200, "api /public/x x_user: bob"),
        ],
    )
    .await;

    // A value Consul does not know is refused at write time, naming the field.
    let resp = mesh
        .client
        .put(format!("{}/v1/config", mesh.http))
        .json(&normalization(json!({"PathWithEscapedSlashesAction": "UNESCAPE"})))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("HTTP.Incoming.RequestNormalization.PathWithEscapedSlashesAction"),
        "{text}"
    );

    rate_limits(&mesh, &client, &api_admin, up).await;
    extensions(&mesh, &client, (&api_admin, &web_admin), up).await;
    jwt(&mesh, &client, &api_admin, up).await;
    assert_eq!(mesh.metric(r#"meshd_xds_nacks_total{type="Listener"}"#).await, 0.0);
    println!(
        "request normalization end to end: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Service-defaults' `RateLimits` on api: 10 requests a second (burst 10) on every path, 1 on
/// `/limited`. Requests sent at up to 100 a second for two seconds get about 10 answers a
/// second from the application and 429s for the rest; `/limited` has a bucket of its own.
async fn rate_limits(mesh: &Mesh, client: &reqwest::Client, api_admin: &str, up: SocketAddr) {
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-defaults", "Name": "api", "Protocol": "http", "RateLimits": {"InstanceLevel": {
            "RequestsPerSecond": 10, "RequestsMaxBurst": 10,
            "Routes": [{"PathPrefix": "/limited", "RequestsPerSecond": 1}]}}}),
    )
    .await;
    until_updated(client, api_admin, up, "/limited", &[], 429).await;
    let start = std::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let (mut accepted, mut limited) = (0u32, 0u32);
    while start.elapsed() < Duration::from_secs(2) {
        tick.tick().await;
        // Two at a time: one after another, a loaded machine (the suite runs tests
        // concurrently) sent 30 a second, too few for the refusals counted below.
        let (a, b) = tokio::join!(raw(up, "/public/x", &[]), raw(up, "/public/x", &[]));
        for answer in [a, b] {
            match answer.map(|r| r.0) {
                Some(200) => accepted += 1,
                Some(429) => limited += 1,
                other => panic!("rate limited request: {other:?}"),
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "rate limit 10/s: {accepted} accepted, {limited} refused with 429 in {secs:.2} s ({:.1} accepted/s)",
        f64::from(accepted) / secs
    );
    // The bucket starts full (10) and gains 10 a second.
    let most = 10 + 10 * secs.ceil() as u32;
    assert!((10..=most).contains(&accepted), "{accepted} accepted in {secs:.2} s");
    assert!(limited >= 40, "{limited} refused in {secs:.2} s");
    // A bad limit is refused at write time, naming the field.
    let resp = mesh
        .client
        .put(format!("{}/v1/config", mesh.http))
        .json(
            &json!({"Kind": "service-defaults", "Name": "api", "RateLimits": {"InstanceLevel": {
            "Routes": [{"PathPrefix": "limited", "RequestsPerSecond": 1}]}}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let text = resp.text().await.unwrap();
    assert!(text.contains("RateLimits.InstanceLevel.Routes[0].PathPrefix"), "{text}");
}

/// `proxy-defaults` whose `Config` has every Envoy trace to Zipkin at `port` on this host
/// (Consul's `envoy_tracing_json` and `envoy_extra_static_clusters_json`).
fn tracing_defaults(port: u16) -> Value {
    let tracing = json!({"http": {"name": "envoy.tracers.zipkin", "typed_config": {
        "@type": "type.googleapis.com/envoy.config.trace.v3.ZipkinConfig",
        "collector_cluster": "zipkin", "collector_endpoint": "/api/v2/spans",
        "collector_endpoint_version": "HTTP_JSON"}}});
    let cluster = json!({"name": "zipkin", "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": "zipkin", "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}});
    json!({"Kind": "proxy-defaults", "Name": "global", "Config": {
        "envoy_tracing_json": tracing.to_string(),
        "envoy_extra_static_clusters_json": cluster.to_string(),
        "envoy_stats_flush_interval": "1s"}})
}

/// A Zipkin collector: every span posted to it (JSON v2), kept. Returns its port.
fn zipkin_receiver() -> (u16, Arc<parking_lot::Mutex<Vec<Value>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let spans = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let kept = Arc::clone(&spans);
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let kept = Arc::clone(&kept);
            std::thread::spawn(move || zipkin_connection(conn, &kept));
        }
    });
    (port, spans)
}

/// Serves one connection of the Zipkin collector: each request's JSON body (an array of
/// spans, sized or chunked) is kept, each answered 202.
fn zipkin_connection(mut conn: std::net::TcpStream, kept: &parking_lot::Mutex<Vec<Value>>) {
    let mut buf = Vec::new();
    let more = |conn: &mut std::net::TcpStream, buf: &mut Vec<u8>| {
        let mut chunk = [0u8; 8192];
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    };
    loop {
        let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            if !more(&mut conn, &mut buf) {
                return;
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let start = head_end + 4;
        let body = if head.contains("transfer-encoding: chunked") {
            loop {
                if let Some((body, used)) = dechunk(&buf[start..]) {
                    buf.drain(..start + used);
                    break body;
                }
                if !more(&mut conn, &mut buf) {
                    return;
                }
            }
        } else {
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < start + len {
                if !more(&mut conn, &mut buf) {
                    return;
                }
            }
            buf.drain(..start + len).skip(start).collect()
        };
        if let Ok(Value::Array(spans)) = serde_json::from_slice(&body) {
            kept.lock().extend(spans);
        }
        let answer: &[u8] = b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n";
        if conn.write_all(answer).is_err() {
            return;
        }
    }
}

/// A chunked body at the start of `data`, if all there: the body and the bytes it took.
fn dechunk(data: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let line_end = at + data[at..].windows(2).position(|w| w == b"\r\n")?;
        let size_text = String::from_utf8_lossy(&data[at..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        at = line_end + 2;
        if size == 0 {
            // The last chunk, then (no trailers) the empty line.
            return (data.len() >= at + 2).then_some((body, at + 2));
        }
        if data.len() < at + size + 2 {
            return None;
        }
        body.extend_from_slice(&data[at..at + size]);
        at += size + 2;
    }
}

/// A request that asks to be traced (`x-client-trace-id`) through web's upstream listener
/// leaves spans of one trace from both sidecars at the collector: web's (egress) and api's
/// (ingress), each named after its service.
async fn traced_by_both_sidecars(up: SocketAddr, spans: &parking_lot::Mutex<Vec<Value>>, admins: &[&str]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let one_trace = loop {
        // Five traced requests: Envoy's Zipkin tracer sends as soon as it holds five spans
        // (else every five seconds).
        for _ in 0..5 {
            let trace_id = format!("{:016x}", rand_id());
            let r = test_support::http::exchange(up, "/traced", &[("x-client-trace-id", &trace_id)])
                .await
                .unwrap();
            assert_eq!(r.status, 200);
        }
        let mut found = None;
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let all = spans.lock();
            let mut by_trace: std::collections::BTreeMap<&str, Vec<&Value>> = Default::default();
            for s in all.iter() {
                if s["tags"]["http.url"].as_str().is_some_and(|u| u.ends_with("/traced"))
                    && let Some(t) = s["traceId"].as_str()
                {
                    by_trace.entry(t).or_default().push(s);
                }
            }
            found = by_trace
                .into_values()
                .find(|spans| {
                    let services: std::collections::BTreeSet<&str> = spans
                        .iter()
                        .filter_map(|s| s["localEndpoint"]["serviceName"].as_str())
                        .collect();
                    services.contains("web") && services.contains("api")
                })
                .map(|spans| spans.into_iter().cloned().collect::<Vec<Value>>());
            if found.is_some() {
                break;
            }
        }
        if let Some(spans) = found {
            break spans;
        }
        if std::time::Instant::now() > deadline {
            let client = reqwest::Client::new();
            for admin in admins {
                let stats = mesh::get(&client, &format!("{admin}/stats?filter=tracing")).await;
                println!("{admin}: {stats:?}");
            }
            panic!(
                "no trace with spans from both sidecars within 30 s: {:#?}",
                spans.lock()
            );
        }
    };
    let who: Vec<(&str, &str)> = one_trace
        .iter()
        .map(|s| {
            (
                s["localEndpoint"]["serviceName"].as_str().unwrap_or("?"),
                s["kind"].as_str().unwrap_or("?"),
            )
        })
        .collect();
    println!("traced request: one trace, spans {who:?}");
    assert!(
        one_trace.iter().any(|s| s["kind"] == "CLIENT") && one_trace.iter().any(|s| s["kind"] == "SERVER"),
        "web's egress and api's ingress: {one_trace:#?}"
    );
}

/// A number unlikely to repeat between runs and requests.
fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    h.finish()
}

/// `EnvoyExtensions`: Lua on api's inbound side adds a response header; a property override
/// on web's outbound cluster to api shows in web's config dump. A Consul extension meshd
/// does not run is a 400 naming it.
async fn extensions(mesh: &Mesh, client: &reqwest::Client, (api_admin, web_admin): (&str, &str), up: SocketAddr) {
    let lua = "function envoy_on_response(handle) handle:headers():add('x-lua', 'from-api') end";
    let (authz_port, checks) = authz_server().await;
    let (otel_port, exported) = raw_collector();
    let module = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(module.path(), NOOP_WASM).unwrap();
    let module_path = module.path().to_str().unwrap().to_owned();
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-defaults", "Name": "api", "Protocol": "http", "EnvoyExtensions": [
            {"Name": "builtin/lua", "Required": true, "Arguments": {"ProxyType": "connect-proxy",
             "Listener": "inbound", "Script": lua}},
            {"Name": "builtin/ext-authz", "Required": true, "Arguments": {"Config": {
             "GrpcService": {"Target": {"URI": format!("127.0.0.1:{authz_port}"), "Timeout": "2s"}}}}},
            {"Name": "builtin/otel-access-logging", "Arguments": {"Config": {
             "GrpcService": {"Target": {"URI": format!("127.0.0.1:{otel_port}")}}, "Body": "%REQ(:PATH)%",
             "BufferFlushInterval": "0.1s"}}},
            {"Name": "builtin/wasm", "Required": true, "Arguments": {"PluginConfig": {"Name": "noop",
             "VmConfig": {"Code": {"Local": {"Filename": module_path}}}}}}]}),
    )
    .await;
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-defaults", "Name": "web", "EnvoyExtensions": [
            {"Name": "builtin/property-override", "Arguments": {"Patches": [{
                "ResourceFilter": {"ResourceType": "cluster", "TrafficDirection": "outbound",
                                   "Services": [{"Name": "api"}]},
                "Op": "add", "Path": "/outlier_detection/consecutive_5xx", "Value": 7}]}}]}),
    )
    .await;
    let header = wait_for(|| async {
        let r = test_support::http::exchange(up, "/public/x", &[("x-allow", "yes")])
            .await
            .ok()?;
        r.header("x-lua").map(str::to_owned)
    })
    .await;
    assert_eq!(header, "from-api");
    // The authorization service decides: without its header a request is refused. Web's
    // Envoy may still hold a pooled connection on api's replaced filter chain (no Lua, no
    // authorization) until api's Envoy has drained it: wait for that first.
    until_updated(client, api_admin, up, "/public/x", &[("x-allow", "no")], 403).await;
    let denied = test_support::http::exchange(up, "/public/x", &[("x-allow", "no")])
        .await
        .unwrap();
    assert_eq!(denied.status, 403, "{}", denied.body);
    assert!(
        checks.load(Ordering::SeqCst) >= 2,
        "the authorization service was asked"
    );
    // The Wasm module loaded (api's listener has the filter; requests go through it).
    let listeners = mesh::get(client, &format!("{api_admin}/config_dump?resource=dynamic_listeners"))
        .await
        .unwrap();
    assert!(listeners.contains("envoy.filters.http.wasm"), "{listeners}");
    // The OpenTelemetry access log's export (gRPC over HTTP/2, uncompressed) carries the
    // record's body: the path of a request.
    wait_for(|| async {
        test_support::http::exchange(up, "/otel-seen", &[("x-allow", "yes")])
            .await
            .ok()?;
        let bytes = exported.lock().clone();
        bytes
            .windows(b"/otel-seen".len())
            .any(|w| w == b"/otel-seen")
            .then_some(())
    })
    .await;
    let dump = wait_for(|| async {
        let dump = mesh::get(
            client,
            &format!("{web_admin}/config_dump?resource=dynamic_active_clusters"),
        )
        .await?;
        dump.contains("\"consecutive_5xx\": 7").then_some(dump)
    })
    .await;
    assert!(dump.contains("outlier_detection"), "{dump}");
    println!(
        "extensions: Lua header x-lua: {header}; ext-authz asked {} times, x-allow: no refused 403; web's cluster to api has consecutive_5xx 7",
        checks.load(Ordering::SeqCst)
    );
    let resp = mesh
        .client
        .put(format!("{}/v1/config", mesh.http))
        .json(&json!({"Kind": "service-defaults", "Name": "api", "EnvoyExtensions": [
            {"Name": "builtin/aws/lambda", "Arguments": {}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("EnvoyExtensions[0].Name") && text.contains("builtin/aws/lambda"),
        "{text}"
    );
    // api plain again, while the Wasm module's file is still there: no authorization asked.
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-defaults", "Name": "api", "Protocol": "http"}),
    )
    .await;
    until_updated(client, api_admin, up, "/public/x", &[("x-allow", "no")], 200).await;
}

/// A gRPC authorization service (Envoy's `envoy.service.auth.v3.Authorization`): allows a
/// request whose `x-allow` header is `yes`, refuses any other with 403. Returns its port and
/// how many checks it answered.
async fn authz_server() -> (u16, Arc<AtomicU64>) {
    use envoy_types::pb::envoy::service::auth::v3::authorization_server::{Authorization, AuthorizationServer};
    use envoy_types::pb::envoy::service::auth::v3::{CheckRequest, CheckResponse, DeniedHttpResponse, check_response};
    struct Authz(Arc<AtomicU64>);
    #[tonic::async_trait]
    impl Authorization for Authz {
        async fn check(
            &self,
            req: tonic::Request<CheckRequest>,
        ) -> Result<tonic::Response<CheckResponse>, tonic::Status> {
            self.0.fetch_add(1, Ordering::SeqCst);
            let allow = req
                .get_ref()
                .attributes
                .as_ref()
                .and_then(|a| a.request.as_ref())
                .and_then(|r| r.http.as_ref())
                .and_then(|h| h.headers.get("x-allow"))
                .is_some_and(|v| v == "yes");
            let (code, http_response) = if allow {
                (0, None)
            } else {
                let denied = DeniedHttpResponse {
                    status: Some(envoy_types::pb::envoy::r#type::v3::HttpStatus { code: 403 }),
                    body: "refused by the authorization service".into(),
                    ..Default::default()
                };
                (7, Some(check_response::HttpResponse::DeniedResponse(denied)))
            };
            Ok(tonic::Response::new(CheckResponse {
                status: Some(envoy_types::pb::google::rpc::Status {
                    code,
                    ..Default::default()
                }),
                http_response,
                ..Default::default()
            }))
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let checks = Arc::new(AtomicU64::new(0));
    let svc = AuthorizationServer::new(Authz(Arc::clone(&checks)));
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
    });
    (port, checks)
}

/// A socket an OpenTelemetry exporter sends to: keeps every byte it receives (it answers
/// nothing; the test looks for a record's content in the request). Returns its port.
fn raw_collector() -> (u16, Arc<parking_lot::Mutex<Vec<u8>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let kept = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let bytes = Arc::clone(&kept);
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let bytes = Arc::clone(&bytes);
            std::thread::spawn(move || {
                let mut chunk = [0u8; 8192];
                while let Ok(n) = conn.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    let mut b = bytes.lock();
                    if b.len() < 1 << 20 {
                        b.extend_from_slice(&chunk[..n]);
                    }
                }
            });
        }
    });
    (port, kept)
}

/// A proxy-wasm module (ABI 0.2.1) assembled by hand: memory, and entry points that accept
/// everything (VM start and configuration succeed, request headers continue).
const NOOP_WASM: &[u8] = &[
    0, 97, 115, 109, 1, 0, 0, 0, 1, 27, 5, 96, 0, 0, 96, 1, 127, 1, 127, 96, 2, 127, 127, 0, 96, 2, 127, 127, 1, 127,
    96, 3, 127, 127, 127, 1, 127, 3, 7, 6, 0, 1, 2, 3, 3, 4, 5, 3, 1, 0, 1, 7, 157, 1, 7, 6, 109, 101, 109, 111, 114,
    121, 2, 0, 23, 112, 114, 111, 120, 121, 95, 97, 98, 105, 95, 118, 101, 114, 115, 105, 111, 110, 95, 48, 95, 50, 95,
    49, 0, 0, 24, 112, 114, 111, 120, 121, 95, 111, 110, 95, 109, 101, 109, 111, 114, 121, 95, 97, 108, 108, 111, 99,
    97, 116, 101, 0, 1, 23, 112, 114, 111, 120, 121, 95, 111, 110, 95, 99, 111, 110, 116, 101, 120, 116, 95, 99, 114,
    101, 97, 116, 101, 0, 2, 17, 112, 114, 111, 120, 121, 95, 111, 110, 95, 118, 109, 95, 115, 116, 97, 114, 116, 0, 3,
    18, 112, 114, 111, 120, 121, 95, 111, 110, 95, 99, 111, 110, 102, 105, 103, 117, 114, 101, 0, 4, 24, 112, 114, 111,
    120, 121, 95, 111, 110, 95, 114, 101, 113, 117, 101, 115, 116, 95, 104, 101, 97, 100, 101, 114, 115, 0, 5, 10, 28,
    6, 2, 0, 11, 5, 0, 65, 128, 8, 11, 2, 0, 11, 4, 0, 65, 1, 11, 4, 0, 65, 1, 11, 4, 0, 65, 0, 11,
];

/// Keys and tokens made by PyJWT (RS256): the JWKS of the local and the remote provider,
/// and tokens valid, signed by another key, expired, without the required claim, for
/// another audience, and of the remote provider.
fn pyjwt_tokens() -> Value {
    const SCRIPT: &str = r#"
import json, time, jwt
from cryptography.hazmat.primitives.asymmetric import rsa
def key(): return rsa.generate_private_key(public_exponent=65537, key_size=2048)
def jwk(k, kid):
    d = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(k.public_key()))
    d.update(kid=kid, alg="RS256", use="sig")
    return d
good, other, remote = key(), key(), key()
now = int(time.time())
def tok(k, kid, **claims):
    c = {"iss": "https://issuer.meshd.test", "aud": "api", "iat": now, "exp": now + 3600, "role": "admin"}
    c.update(claims)
    return jwt.encode(c, k, algorithm="RS256", headers={"kid": kid})
print(json.dumps({
    "local_jwks": {"keys": [jwk(good, "k1")]},
    "remote_jwks": {"keys": [jwk(remote, "r1")]},
    "valid": tok(good, "k1"),
    "other_key": tok(other, "k1"),
    "expired": tok(good, "k1", iat=now - 7200, exp=now - 3600),
    "no_claim": tok(good, "k1", role="user"),
    "wrong_audience": tok(good, "k1", aud="db"),
    "remote": tok(remote, "r1", iss="https://remote.meshd.test"),
}))
"#;
    let out = std::process::Command::new(test_support::python())
        .args(["-c", SCRIPT])
        .output()
        .expect("run the pinned Python with PyJWT");
    assert!(out.status.success(), "PyJWT: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// An HTTP server answering every request with `jwks`; returns its port and how many
/// requests it answered.
fn jwks_server(jwks: String) -> (u16, Arc<AtomicU64>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let fetched = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&fetched);
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            read_head(&mut conn);
            count.fetch_add(1, Ordering::SeqCst);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{jwks}",
                jwks.len()
            );
        }
    });
    (port, fetched)
}

/// Intentions' `JWT` with tokens signed by PyJWT: the entry requires a token of the local
/// provider with `role: admin`; `/remote` also needs one of a provider whose keys the test
/// serves (fetched once, then cached). Every bad token is refused, a valid one allowed, its
/// payload forwarded to the application.
async fn jwt(mesh: &Mesh, client: &reqwest::Client, api_admin: &str, up: SocketAddr) {
    use base64::Engine;
    let t = pyjwt_tokens();
    let token = |name: &str| format!("Bearer {}", t[name].as_str().unwrap());
    let (jwks_port, fetched) = jwks_server(t["remote_jwks"].to_string());
    // The providers, then the intentions requiring their tokens (api is plain again: the
    // extensions phase turned its extensions off).
    mesh.put(
        "/v1/config",
        json!({"Kind": "jwt-provider", "Name": "local-keys", "Issuer": "https://issuer.meshd.test",
            "Audiences": ["api"], "JSONWebKeySet": {"Local": {
                "JWKS": base64::engine::general_purpose::STANDARD.encode(t["local_jwks"].to_string())}},
            "Forwarding": {"HeaderName": "x_jwt_payload"}}),
    )
    .await;
    mesh.put(
        "/v1/config",
        json!({"Kind": "jwt-provider", "Name": "remote-keys", "Issuer": "https://remote.meshd.test",
            "JSONWebKeySet": {"Remote": {"URI": format!("http://127.0.0.1:{jwks_port}/jwks.json"),
                "CacheDuration": "5m", "FetchAsynchronously": true}},
            "Locations": [{"Header": {"Name": "x-remote-token", "ValuePrefix": "Bearer "}}]}),
    )
    .await;
    mesh.put(
        "/v1/config",
        json!({"Kind": "service-intentions", "Name": "api",
            "JWT": {"Providers": [{"Name": "local-keys", "VerifyClaims": [{"Path": ["role"], "Value": "admin"}]}]},
            "Sources": [{"Name": "web", "Permissions": [
                {"Action": "allow", "HTTP": {"PathPrefix": "/remote"}, "JWT": {"Providers": [{"Name": "remote-keys"}]}},
                {"Action": "deny", "HTTP": {"PathPrefix": "/remote"}},
                {"Action": "allow", "HTTP": {"PathPrefix": "/"}}]}]}),
    )
    .await;
    until_updated(client, api_admin, up, "/public/x", &[], 403).await;
    let valid = token("valid");
    let cases: [(&str, &str, u16); 6] = [
        ("no token", "", 403),
        ("signed by another key", &token("other_key"), 403),
        ("expired", &token("expired"), 403),
        ("without role admin", &token("no_claim"), 403),
        ("for another audience", &token("wrong_audience"), 403),
        ("valid", &valid, 200),
    ];
    for (what, auth, status) in cases {
        let headers: Vec<(&str, &str)> = if auth.is_empty() {
            vec![]
        } else {
            vec![("authorization", auth)]
        };
        let (s, body) = answered(up, "/public/x", &headers).await;
        println!("jwt: {what} -> {s}");
        assert_eq!(s, status, "{what}: {body}");
        if status == 200 {
            // The verified payload reaches the application (base64url of the claims).
            let payload = body.split("x_jwt_payload: ").nth(1).expect("payload forwarded").trim();
            let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(payload)
                .unwrap();
            let claims: Value = serde_json::from_slice(&claims).unwrap();
            assert_eq!(claims["role"], "admin", "{claims}");
        }
    }
    // `/remote` needs the remote provider's token as well; its keys are fetched once.
    let remote = token("remote");
    let with_both = [("authorization", valid.as_str()), ("x-remote-token", remote.as_str())];
    assert_eq!(answered(up, "/remote/x", &[("authorization", &valid)]).await.0, 403);
    for _ in 0..5 {
        let (s, body) = answered(up, "/remote/x", &with_both).await;
        assert_eq!(s, 200, "{body}");
    }
    let wrong = [("authorization", valid.as_str()), ("x-remote-token", valid.as_str())];
    assert_eq!(answered(up, "/remote/x", &wrong).await.0, 403);
    // Fetched once by Envoy's main thread for every worker (`FetchAsynchronously`), then
    // cached: more requests fetch nothing.
    assert_eq!(fetched.load(Ordering::SeqCst), 1, "the remote key set is fetched once");
    for _ in 0..5 {
        assert_eq!(answered(up, "/remote/y", &with_both).await.0, 200);
    }
    assert_eq!(fetched.load(Ordering::SeqCst), 1, "the remote key set is cached");
    println!(
        "jwt: missing, foreign-key, expired, claim-less and wrong-audience tokens refused (403); valid allowed; remote keys fetched {} time(s) for 11 requests",
        fetched.load(Ordering::SeqCst)
    );
    // A provider that intentions require cannot go, and one that does not exist cannot be
    // required.
    let resp = mesh
        .client
        .delete(format!("{}/v1/config/jwt-provider/local-keys", mesh.http))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let text = resp.text().await.unwrap();
    assert!(text.contains("JWT.Providers[0].Name"), "{text}");
    let resp = mesh
        .client
        .put(format!("{}/v1/config", mesh.http))
        .json(&json!({"Kind": "service-intentions", "Name": "web",
            "JWT": {"Providers": [{"Name": "nobody"}]}, "Sources": [{"Name": "api", "Action": "allow"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    assert!(resp.text().await.unwrap().contains("no jwt-provider named \"nobody\""));
}

/// The routes of web's Envoy as its config dump shows them.
async fn envoy_routes(client: &reqwest::Client, admin: &str) -> String {
    let dump = mesh::get(client, &format!("{admin}/config_dump?resource=dynamic_route_configs"))
        .await
        .unwrap();
    let dump: Value = serde_json::from_str(&dump).unwrap();
    dump["configs"].to_string()
}

/// A dry run of the splitter going 80/20 → 10/90: exactly web's sidecar (the one proxy with
/// an `api` upstream) would change, in one route, by the two weights; nothing is stored and
/// web's Envoy receives nothing. A breaking change answers as the real write would.
/// A dry run's answer: `body` put to `path` (which asks for the dry run).
async fn dry_run(client: &reqwest::Client, http: &str, path: &str, body: &Value) -> Value {
    client
        .put(format!("{http}{path}"))
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn dry_run_of_a_splitter_change(mesh: &Mesh, client: &reqwest::Client, web_admin: &str) {
    let splitter_url = format!("{}/v1/config/service-splitter/api", mesh.http);
    let entry_before = mesh::get(client, &splitter_url).await.unwrap();
    let routes_before = envoy_routes(client, web_admin).await;
    let change = json!({"Kind": "service-splitter", "Name": "api",
        "Splits": [{"Weight": 10, "ServiceSubset": "v1"}, {"Weight": 90, "ServiceSubset": "v2"}]});
    let resp = client
        .put(format!("{}/v1/config?dry-run", mesh.http))
        .json(&change)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let index_header = resp.headers()["X-Consul-Index"].to_str().unwrap().to_owned();
    let answer: Value = resp.json().await.unwrap();
    println!("dry run: {answer:#}");
    assert_eq!(answer["DryRun"], true);
    assert_eq!(answer["Index"].to_string(), index_header);
    let proxies = &answer["Proxies"];
    assert_eq!(proxies["Total"], 1, "{answer:#}");
    assert_eq!(proxies["NotSimulatedTotal"], 0, "{answer:#}");
    // The proxies registered but not served here are counted, not passed over in silence.
    let (here, elsewhere) = (
        proxies["ServedHere"].as_u64().unwrap(),
        proxies["ServedElsewhere"].as_u64().unwrap(),
    );
    assert_eq!((here, elsewhere), (4, 0), "{answer:#}");
    let item = &proxies["Items"][0];
    assert_eq!(item["ProxyID"], "web-sidecar-proxy");
    let resources = item["Resources"].as_array().unwrap();
    assert!(
        resources
            .iter()
            .all(|r| r["Type"] == "route" && r["Change"] == "changed"),
        "only a route changes: {resources:#?}"
    );
    let weights: Vec<(Value, Value)> = resources
        .iter()
        .flat_map(|r| r["Fields"].as_array().unwrap().iter())
        .filter(|f| f["Path"].as_str().unwrap().ends_with(".weight"))
        .map(|f| (f["Before"].clone(), f["After"].clone()))
        .collect();
    assert_eq!(
        weights,
        [(json!(8000), json!(1000)), (json!(2000), json!(9000))],
        "{resources:#?}"
    );
    // Nothing stored, nothing sent: the state's index has not moved (a second dry run
    // reports it), the entry is as it was, and web's Envoy has the same routes.
    let again = dry_run(client, &mesh.http, "/v1/config?dry-run", &change).await;
    assert_eq!(again["Index"], answer["Index"], "the index did not move");
    // The command prints the same, for people.
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), change.to_string()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshd"))
        .args(["config", "write", "-dry-run", "-http-addr", &mesh.http])
        .arg(file.path())
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    println!("{text}");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("1 proxies would change") && text.contains("clusters[0].weight: 8000 -> 1000"),
        "{text}"
    );
    assert_eq!(mesh::get(client, &splitter_url).await.unwrap(), entry_before);
    assert_eq!(
        envoy_routes(client, web_admin).await,
        routes_before,
        "web's Envoy got nothing"
    );
    // A registration: a new v2 instance of api would change web's load assignment of the v2
    // target (and nothing else anywhere).
    let instance = json!({"Node": "node-v2b", "Address": "127.0.0.2", "Service": {"Kind": "connect-proxy",
        "ID": "api-sidecar-proxy", "Service": "api-sidecar-proxy", "Port": 21000, "Meta": {"version": "v2"},
        "Proxy": {"DestinationServiceName": "api", "LocalServicePort": 8080}}});
    let answer = dry_run(client, &mesh.http, "/v1/catalog/register?dry-run", &instance).await;
    assert_eq!(answer["Proxies"]["Total"], 1, "{answer:#}");
    let resources = answer["Proxies"]["Items"][0]["Resources"].as_array().unwrap();
    assert!(
        resources.iter().all(|r| r["Type"] == "endpoints") && !resources.is_empty(),
        "{resources:#?}"
    );
    // An intention through the legacy API: api's two sidecars would enforce it.
    let answer = dry_run(
        client,
        &mesh.http,
        "/v1/connect/intentions/exact?source=web&destination=api&dry-run",
        &json!({"Action": "deny"}),
    )
    .await;
    assert_eq!(answer["Proxies"]["Total"], 2, "{answer:#}");
    for item in answer["Proxies"]["Items"].as_array().unwrap() {
        assert_eq!(item["Service"], "api-sidecar-proxy", "{answer:#}");
        assert!(
            item["Resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["Type"] == "listener"),
            "{answer:#}"
        );
    }
    // A change the real write would refuse: the same 400, with or without dry-run.
    let broken = json!({"Kind": "service-splitter", "Name": "api", "Splits": [{"Weight": 100, "ServiceSubset": "v9"}]});
    let mut answers = Vec::new();
    for path in ["/v1/config?dry-run", "/v1/config"] {
        let resp = client
            .put(format!("{}{path}", mesh.http))
            .json(&broken)
            .send()
            .await
            .unwrap();
        answers.push((resp.status().as_u16(), resp.text().await.unwrap()));
    }
    assert_eq!(answers[0].0, 400, "{answers:?}");
    assert_eq!(answers[0], answers[1]);
    // A sidecar registered with no Envoy connected here (an agent's, say) is counted as
    // served elsewhere: not simulated, and said.
    mesh.put(
        "/v1/catalog/register",
        json!({"Node": "node-ghost", "Address": "127.0.0.1", "Service": {"Kind": "connect-proxy", "ID": "ghost-sidecar-proxy",
               "Service": "ghost-sidecar-proxy", "Port": 21999, "Proxy": {"DestinationServiceName": "ghost",
               "Upstreams": [{"DestinationName": "api", "LocalBindPort": 21998}]}}}),
    )
    .await;
    let with_ghost = dry_run(client, &mesh.http, "/v1/config?dry-run", &change).await;
    assert_eq!(with_ghost["Proxies"]["ServedElsewhere"], 1, "{with_ghost:#}");
    assert_eq!(with_ghost["Proxies"]["Total"], 1, "{with_ghost:#}");
    mesh.put("/v1/catalog/deregister", json!({"Node": "node-ghost"})).await;
}
