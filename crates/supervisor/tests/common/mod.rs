//! Real-Envoy helpers shared by the agent tests and the hot-restart benchmark: the pinned
//! binary, a tiny HTTP backend, a static bootstrap, and a request-per-connection client.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The pinned Envoy, installed into `.tools/` and named by `cargo xtask test` in
/// `MESHD_ENVOY`. Fails loudly when missing: these tests never skip.
pub fn envoy() -> PathBuf {
    std::env::var_os("MESHD_ENVOY")
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .expect(
            "MESHD_ENVOY must name the pinned Envoy binary: run the tests with `cargo xtask test`, which installs it",
        )
}

/// A base id no other Envoy on this host uses: derived from this process and a slot.
pub fn base_id(slot: u32) -> u32 {
    20_000_000 + (std::process::id() % 1_000_000) * 8 + slot
}

/// A port that was free a moment ago (listener ports must be fixed for a hot restart to hand
/// the socket over).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An HTTP/1.1 backend: `GET /slow` answers after `slow`, anything else at once; every answer
/// is 200 `ok`, then the connection closes.
pub async fn backend(slow: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                if buf.starts_with(b"GET /slow") {
                    tokio::time::sleep(slow).await;
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                    .await;
            });
        }
    });
    addr
}

/// A static bootstrap: admin on an ephemeral port, one HTTP listener on `listen` routing to
/// `backend`. `generation` changes the config without changing its behaviour.
pub fn bootstrap(listen: u16, backend: SocketAddr, generation: u32) -> String {
    serde_json::json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [{
                "name": "ingress",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": format!("ingress_gen{generation}"),
                        "route_config": {"virtual_hosts": [{
                            "name": "all", "domains": ["*"],
                            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "backend", "timeout": "10s"}}],
                        }]},
                        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
                    },
                }]}],
            }],
            "clusters": [{
                "name": "backend", "type": "STATIC", "connect_timeout": "1s",
                "load_assignment": {"cluster_name": "backend", "endpoints": [{"lb_endpoints": [{"endpoint": {
                    "address": {"socket_address": {"address": backend.ip().to_string(), "port_value": backend.port()}}}}]}]},
            }],
        },
    })
    .to_string()
}

/// One request on a fresh connection; `Ok(status)` or why it failed.
pub async fn get(addr: SocketAddr, path: &str) -> Result<u16, String> {
    let io = async {
        let mut s = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.map_err(|e| format!("write: {e}"))?;
        // Complete once the whole response is in (headers + content-length), as an HTTP
        // client sees it, not when the server gets round to closing the connection.
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&buf).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_owned())
                    })
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                if body.len() >= len {
                    return head
                        .split_whitespace()
                        .nth(1)
                        .and_then(|c| c.parse().ok())
                        .ok_or(format!("bad response {text:?}"));
                }
            }
            match s.read(&mut chunk).await {
                Ok(0) => return Err(format!("connection closed after {} bytes: {text:?}", buf.len())),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(format!("read: {e}")),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), io)
        .await
        .unwrap_or_else(|_| Err("timed out".into()))
}

/// Requests at a steady rate until stopped; counts successes and failures.
pub struct Load {
    pub ok: Arc<AtomicU64>,
    pub failed: Arc<AtomicU64>,
    pub errors: Arc<parking_lot::Mutex<Vec<String>>>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    pub fn start(addr: SocketAddr, per_second: u32) -> Load {
        let ok = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let stop = tokio_util::sync::CancellationToken::new();
        let (o, f, e, st) = (ok.clone(), failed.clone(), errors.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut inflight = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    _ = st.cancelled() => break,
                    _ = tick.tick() => {
                        let (o, f, e) = (o.clone(), f.clone(), e.clone());
                        inflight.spawn(async move {
                            match get(addr, "/").await {
                                Ok(200) => { o.fetch_add(1, Ordering::Relaxed); }
                                other => {
                                    f.fetch_add(1, Ordering::Relaxed);
                                    e.lock().push(format!("{other:?}"));
                                }
                            }
                        });
                    }
                    Some(_) = inflight.join_next() => {}
                }
            }
            while inflight.join_next().await.is_some() {}
        });
        Load {
            ok,
            failed,
            errors,
            stop,
            task,
        }
    }

    /// Stops sending, waits for in-flight requests; returns (ok, failed).
    pub async fn finish(self) -> (u64, u64) {
        self.stop.cancel();
        self.task.await.unwrap();
        (self.ok.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed))
    }
}

/// Polls `f` every 20 ms for up to `limit`.
pub async fn wait_for(limit: Duration, what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The pid of this process's Envoy child running with `base_id`.
pub fn envoy_child_pid(base_id: u32) -> u32 {
    let me = std::process::id();
    let bin = envoy();
    let mut found = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{me}/task")).unwrap().flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for pid in children.split_whitespace().filter_map(|p| p.parse::<u32>().ok()) {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
            let args: Vec<String> = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .unwrap_or_default()
                .split('\0')
                .map(str::to_owned)
                .collect();
            let has_base = args
                .windows(2)
                .any(|w| w[0] == "--base-id" && w[1] == base_id.to_string());
            if exe.as_deref() == Some(bin.as_path()) && has_base {
                found.push(pid);
            }
        }
    }
    assert_eq!(
        found.len(),
        1,
        "expected one envoy child with base id {base_id}: {found:?}"
    );
    found[0]
}
