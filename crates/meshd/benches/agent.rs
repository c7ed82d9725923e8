//! Agent benchmark (prints figures; asserts nothing), with a real `meshd server` (durable
//! data dir) and a real `meshd agent`:
//!
//! - start to in sync: an agent whose config file holds `SERVICES` services (each with a TTL
//!   check), from spawning it to the server listing all of them;
//! - check churn: every TTL check flipped to passing once through the agent's API, from the
//!   first request to the server showing all of them passing;
//! - the agent's RSS, idle, with those services.
//!
//! Run: `cargo xtask bench agent` (or `cargo bench -p meshd --bench agent`). Scale with
//! `SERVICES=` (1000), `CLIENTS=` (8, concurrent HTTP clients for the churn).
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A meshd process started here; killed (by its pid) when dropped.
struct Proc {
    child: Child,
    addr: String,
}

impl Proc {
    fn start(args: &[&str], ready: &str) -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_meshd"))
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix(ready)
            .unwrap_or_else(|| panic!("not ready: {line:?}"))
            .to_owned();
        Proc { child, addr }
    }

    fn rss_kib(&self) -> u64 {
        test_support::figures::rss_kib(self.child.id())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits on this plain thread. The bench has no async runtime, so nothing else is blocked.
#[allow(
    clippy::disallowed_methods,
    reason = "a plain thread outside any runtime: blocking it stalls no worker"
)]
fn pause(d: Duration) {
    std::thread::sleep(d);
}

/// Polls `probe` every `every` until it holds.
fn wait_until(what: &str, limit: Duration, every: Duration, mut probe: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !probe() {
        assert!(start.elapsed() < limit, "{what} not reached within {limit:?}");
        pause(every);
    }
    start.elapsed()
}

fn main() {
    let services = env_usize("SERVICES", 1000);
    let clients = env_usize("CLIENTS", 8).max(1);
    let dir = tempfile::tempdir().unwrap();
    let server = Proc::start(
        &[
            "server",
            "-http-addr",
            "127.0.0.1:0",
            "-grpc-addr",
            "127.0.0.1:0",
            "-dns-addr",
            "127.0.0.1:0",
            "-log-level",
            "warn",
            "-data-dir",
            dir.path().join("server").to_str().unwrap(),
        ],
        "meshd server listening on http://",
    );
    let defs: Vec<Value> = (0..services)
        .map(|i| {
            json!({"name": format!("svc-{i}"), "port": 10000 + i,
                   "check": {"check_id": format!("ttl-{i}"), "ttl": "10m"}})
        })
        .collect();
    let config = dir.path().join("agent.json");
    std::fs::write(&config, serde_json::to_vec(&json!({"services": defs})).unwrap()).unwrap();
    let http = reqwest::blocking::Client::new();
    let node_url = format!("http://{}/v1/health/node/bench-node", server.addr);
    let count = |status: &str| -> usize {
        let Ok(resp) = http.get(&node_url).send() else { return 0 };
        let checks: Vec<Value> = resp.json().unwrap_or_default();
        checks
            .iter()
            .filter(|c| c["CheckID"].as_str().is_some_and(|id| id.starts_with("ttl-")) && c["Status"] == status)
            .count()
    };

    println!(
        "agent benchmark: {services} services with one TTL check each, {clients} churn clients; server on a data dir"
    );
    // The server's write latency while the agent syncs and churns: a probe registration
    // every 20 ms, timed from request to durable response.
    let probing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let probe = {
        let (probing, url) = (probing.clone(), format!("http://{}/v1/catalog/register", server.addr));
        std::thread::spawn(move || {
            let http = reqwest::blocking::Client::new();
            let mut took = Vec::new();
            let mut i = 0u64;
            while probing.load(std::sync::atomic::Ordering::Relaxed) {
                let body = json!({"Node": "probe", "Address": "10.9.9.9",
                    "Service": {"Service": "probe", "Port": 1 + i % 60000}});
                let t0 = Instant::now();
                if http.put(&url).json(&body).send().is_ok_and(|r| r.status().is_success()) {
                    took.push(t0.elapsed());
                }
                i += 1;
                pause(Duration::from_millis(20));
            }
            took
        })
    };
    let started = Instant::now();
    let agent = Proc::start(
        &[
            "agent",
            "-node",
            "bench-node",
            "-dev",
            "-retry-join",
            &server.addr,
            "-http-addr",
            "127.0.0.1:0",
            "-grpc-addr",
            "127.0.0.1:0",
            "-dns-addr",
            "127.0.0.1:0",
            "-advertise",
            "127.0.0.1",
            "-log-level",
            "warn",
            "-config-file",
            config.to_str().unwrap(),
        ],
        "meshd agent listening on http://",
    );
    let ready = started.elapsed();
    // Each poll's answer lists every check of the node (about 5 MB at 10,000 services), so
    // large nodes are polled less often: the load generator and the server it measures share
    // two cores. 20 ms up to 2,000 services, then 1 ms per 100 (100 ms at 10,000).
    let every = Duration::from_millis((services as u64 / 100).max(20));
    wait_until("in sync", Duration::from_secs(120), every, || {
        count("critical") == services
    });
    let in_sync = started.elapsed();
    println!(
        "start to in sync:   {:>8.0} ms  (agent ready after {:.0} ms; target <= 5000 ms)",
        in_sync.as_secs_f64() * 1e3,
        ready.as_secs_f64() * 1e3
    );

    let agent_url = format!("http://{}", agent.addr);
    let churn_start = Instant::now();
    std::thread::scope(|s| {
        for c in 0..clients {
            let agent_url = &agent_url;
            s.spawn(move || {
                let http = reqwest::blocking::Client::new();
                for i in (c..services).step_by(clients) {
                    let resp = http
                        .put(format!("{agent_url}/v1/agent/check/pass/ttl-{i}"))
                        .send()
                        .unwrap();
                    assert!(resp.status().is_success());
                }
            });
        }
    });
    let requests_done = churn_start.elapsed();
    wait_until("churn seen", Duration::from_secs(120), every, || {
        count("passing") == services
    });
    let churn = churn_start.elapsed();
    println!(
        "check churn:        {:>8.0} ms  ({services} flips sent in {:.0} ms; target <= 2000 ms)",
        churn.as_secs_f64() * 1e3,
        requests_done.as_secs_f64() * 1e3
    );

    probing.store(false, std::sync::atomic::Ordering::Relaxed);
    let mut writes = probe.join().unwrap();
    println!(
        "server writes meanwhile: {} probe registrations, {}",
        writes.len(),
        test_support::figures::latency_summary(&mut writes)
    );
    pause(Duration::from_secs(2));
    println!(
        "agent RSS idle:     {:>8.1} MiB  (Consul's client agent: ~87 MB); server RSS {:.1} MiB",
        agent.rss_kib() as f64 / 1024.0,
        server.rss_kib() as f64 / 1024.0
    );
}
