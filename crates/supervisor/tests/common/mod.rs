//! Real-Envoy helpers of the agent tests and the hot-restart benchmark: a static bootstrap,
//! a load generator and process lookups (the shared peers come from `test-support`).
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use test_support::envoy;
use test_support::http::get;

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
