//! DNS benchmark (prints figures; asserts nothing): `web.service.consul` A queries over UDP
//! against a real `meshd server` on a fresh data dir, the server pinned to CPU 0 and this
//! load generator to CPU 1 (when `taskset` can pin them). Prints answers per second, the
//! server's CPU over the run (so the rate per full core of the server), and the latency
//! percentiles of each query, send to answer.
//!
//! Run: `cargo xtask bench dns` (or `cargo bench -p meshd --bench dns`). Scale with
//! `QUERIES=` (200000 per level), `IN_FLIGHT=` (queries outstanding at once; by default
//! three levels, 1, 8 and 64: the latency alone, a load a core keeps up with, and a queue),
//! `INSTANCES=` (5 healthy instances of `web`).
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};
use test_support::figures::{env_usize, ms, percentile, pin};
use tokio::net::UdpSocket;

/// CPU time (user and system) process `pid` has used.
fn cpu_of(pid: u32) -> Duration {
    test_support::ads::proc_stat(pid).0
}

/// An A query for `name` with `id`, recursion desired.
fn query(id: u16, name: &str) -> Vec<u8> {
    let mut q = Vec::with_capacity(12 + name.len() + 6);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// One client: `count` queries, one at a time, on its own socket; the latency of each
/// answered one and how many went unanswered within a second.
async fn client(dns: String, count: usize) -> (Vec<Duration>, usize) {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.connect(&dns).await.unwrap();
    let mut latencies = Vec::with_capacity(count);
    let mut lost = 0;
    let mut buf = [0u8; 1500];
    for i in 0..count {
        let id = i as u16;
        let sent = Instant::now();
        socket.send(&query(id, "web.service.consul")).await.unwrap();
        loop {
            match tokio::time::timeout(Duration::from_secs(1), socket.recv(&mut buf)).await {
                Ok(Ok(len)) if len >= 12 && buf[..2] == id.to_be_bytes() => {
                    assert_eq!(buf[3] & 0x0f, 0, "an answer, not an error");
                    latencies.push(sent.elapsed());
                    break;
                }
                // An answer to an earlier, given-up query.
                Ok(Ok(_)) => {}
                _ => {
                    lost += 1;
                    break;
                }
            }
        }
    }
    (latencies, lost)
}

async fn run(dns: &str, pid: u32, queries: usize, in_flight: usize, label: &str) {
    let per_client = queries.div_ceil(in_flight);
    let cpu_before = cpu_of(pid);
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..in_flight {
        tasks.spawn(client(dns.to_owned(), per_client));
    }
    let (mut latencies, mut lost) = (Vec::with_capacity(queries), 0);
    while let Some(done) = tasks.join_next().await {
        let (l, n) = done.unwrap();
        latencies.extend(l);
        lost += n;
    }
    let elapsed = start.elapsed();
    let server_cpu = cpu_of(pid).saturating_sub(cpu_before);
    latencies.sort();
    let answered = latencies.len();
    let rate = answered as f64 / elapsed.as_secs_f64();
    let share = server_cpu.as_secs_f64() / elapsed.as_secs_f64();
    println!(
        "  {label}: {answered} answers in {} = {rate:.0} answers/s ({lost} unanswered), server CPU {:.0}% of a core = {:.0} answers/s per server core   [target >= 50000 qps on one core]",
        ms(elapsed),
        share * 100.0,
        if share > 0.0 { rate / share } else { 0.0 },
    );
    println!(
        "    each query, send to answer: p50 {}  p99 {}  max {}   [target p99 <= 1 ms]",
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
        ms(latencies.last().copied().unwrap_or_default()),
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let queries = env_usize("QUERIES", 200_000);
    let levels: Vec<usize> = match std::env::var("IN_FLIGHT") {
        Ok(_) => vec![env_usize("IN_FLIGHT", 8).max(1)],
        Err(_) => vec![1, 8, 64],
    };
    let instances = env_usize("INSTANCES", 5);
    let dir = tempfile::tempdir().unwrap();
    let mut server = test_support::process::start_server(
        env!("CARGO_BIN_EXE_meshd").as_ref(),
        [
            "-data-dir",
            dir.path().join("data").to_str().unwrap(),
            "-log-level",
            "warn",
        ],
    );
    let http = reqwest::Client::new();
    for i in 0..instances {
        let body = serde_json::json!({
            "Node": format!("node-{i}"),
            "Address": format!("10.0.{}.{}", i / 250, i % 250 + 1),
            "Service": {"ID": format!("web-{i}"), "Service": "web", "Port": 8080},
            "Check": {"CheckID": format!("web-{i}-alive"), "Name": "alive", "Status": "passing", "ServiceID": format!("web-{i}")},
        });
        let resp = http
            .put(format!("{}/v1/catalog/register", server.http))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success());
    }
    let pid = server.child.id();
    println!("dns: web.service.consul A over UDP, {instances} healthy instances, server on a data dir");
    // Warm-up: every path the measured queries take.
    run(&server.dns, pid, 5_000.min(queries), 8, "warm-up").await;
    let me = std::process::id();
    let pinned = pin(pid, "0") && pin(me, "1");
    if !pinned {
        println!("  `taskset` could not pin the processes: measured unpinned");
    }
    for in_flight in levels {
        let label = if pinned {
            format!("{in_flight} in flight, server pinned to CPU 0, load on CPU 1")
        } else {
            format!("{in_flight} in flight, unpinned")
        };
        run(&server.dns, pid, queries, in_flight, &label).await;
    }
    let _ = server.child.kill();
    let _ = server.child.wait();
}
