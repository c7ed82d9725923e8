//! KV benchmark (prints figures; asserts nothing), against a real `meshd server` on a fresh
//! data dir: durable KV writes per second from concurrent clients, 10,000 blocking
//! listings of one prefix woken by one write under it, and a snapshot of 100,000 keys saved
//! (`GET /v1/snapshot`) and restored into a second server on its own data dir.
//!
//! Run: `cargo xtask bench kv` (or `cargo bench -p meshd --bench kv`). Scale with `WRITES=`
//! (20000), `WRITERS=` (64), `WAITERS=` (10000), `SNAPSHOT_KEYS=` (100000).
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};
use test_support::figures::{env_usize, latency_summary, ms};

fn cpu_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

async fn writes(url: &str, writes: usize, writers: usize) {
    let client = reqwest::Client::new();
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..writers {
        let (client, url) = (client.clone(), url.to_owned());
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let mut i = w;
            while i < writes {
                let sent = Instant::now();
                let resp = client
                    .put(format!("{url}/v1/kv/bench/{}/{i}", i % 100))
                    .body(vec![b'v'; 64])
                    .send()
                    .await
                    .unwrap();
                assert!(resp.status().is_success());
                latencies.push(sent.elapsed());
                i += writers;
            }
            latencies
        });
    }
    let mut latencies = Vec::with_capacity(writes);
    while let Some(done) = tasks.join_next().await {
        latencies.extend(done.unwrap());
    }
    let elapsed = start.elapsed();
    println!(
        "  {writes} PUT /v1/kv (64-byte values) from {writers} concurrent clients in {} = {:.0} durable writes/s   [target >= 5000/s]",
        ms(elapsed),
        writes as f64 / elapsed.as_secs_f64()
    );
    println!(
        "    each write, request to durable answer: {}",
        latency_summary(&mut latencies)
    );
}

async fn prefix_watchers(url: &str, pid: u32, waiters: usize) {
    let client = reqwest::Client::new();
    for i in 0..10 {
        client
            .put(format!("{url}/v1/kv/watch/key-{i}"))
            .body("v")
            .send()
            .await
            .unwrap();
    }
    let resp = client.get(format!("{url}/v1/kv/watch/?recurse")).send().await.unwrap();
    let index: u64 = resp.headers()["x-consul-index"].to_str().unwrap().parse().unwrap();
    let host = url.trim_start_matches("http://");
    let mut rx =
        test_support::http::park_waiters(host, &format!("/v1/kv/watch/?recurse&index={index}&wait=5m"), waiters);
    let ready = Instant::now();
    while (test_support::process::metric(&client, url, "meshd_http_blocking_queries ").await as usize) < waiters {
        if ready.elapsed() > Duration::from_secs(120) {
            println!("  only some of the {waiters} listings got parked; not measured");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A write elsewhere in the store first: it must wake none of them.
    client
        .put(format!("{url}/v1/kv/elsewhere"))
        .body("v")
        .send()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (cpu0, t0) = (cpu_of(pid), Instant::now());
    client
        .put(format!("{url}/v1/kv/watch/key-new"))
        .body("v")
        .send()
        .await
        .unwrap();
    let (mut first, mut last, mut open, mut moved) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for _ in 0..waiters {
        let woken = rx.recv().await.unwrap();
        first.push(woken.first - t0);
        last.push(woken.last - t0);
        moved += usize::from(woken.index.is_some_and(|i| i > index));
        open.push(woken.conn);
    }
    let cpu = cpu_of(pid) - cpu0;
    drop(open);
    println!(
        "  {waiters} blocking GET /v1/kv/watch/?recurse woken by one write under the prefix ({moved} saw a new index; the write elsewhere woke none early): first byte {}   [target p99 <= 50 ms]",
        latency_summary(&mut first)
    );
    println!(
        "    last byte {}; server CPU {} = {:.1} µs per woken query",
        latency_summary(&mut last),
        ms(cpu),
        cpu.as_secs_f64() * 1e6 / waiters as f64
    );
}

/// Fills the store to `keys` keys (64-byte values, in transactions of 64), then saves a
/// snapshot and restores it into a second server on a fresh data dir.
async fn snapshot(url: &str, keys: usize) {
    let client = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    let value = "dmFsdWUtdmFsdWUtdmFsdWUtdmFsdWUtdmFsdWUtdmFsdWUtdmFsdWUtdmFsdWUt"; // 48 bytes, base64
    for w in 0..16 {
        let (client, url) = (client.clone(), url.to_owned());
        tasks.spawn(async move {
            let mut i = w * 64;
            while i < keys {
                let ops: Vec<serde_json::Value> = (i..(i + 64).min(keys))
                    .map(|k| serde_json::json!({"KV": {"Verb": "set", "Key": format!("snap/{}/{k}", k % 1000), "Value": value}}))
                    .collect();
                let resp = client.put(format!("{url}/v1/txn")).json(&ops).send().await.unwrap();
                assert!(resp.status().is_success(), "{}", resp.text().await.unwrap_or_default());
                i += 16 * 64;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let t0 = Instant::now();
    let resp = client.get(format!("{url}/v1/snapshot")).send().await.unwrap();
    assert!(resp.status().is_success());
    let archive = resp.bytes().await.unwrap();
    let saved = t0.elapsed();
    println!(
        "  snapshot of {keys} keys (and the rest of the store): GET /v1/snapshot in {}, archive {:.1} MiB",
        ms(saved),
        archive.len() as f64 / (1 << 20) as f64
    );
    let dir = tempfile::tempdir().unwrap();
    let mut fresh = test_support::process::start_server(
        std::path::Path::new(env!("CARGO_BIN_EXE_meshd")),
        [
            std::ffi::OsStr::new("-log-level"),
            "warn".as_ref(),
            "-data-dir".as_ref(),
            dir.path().as_os_str(),
        ],
    );
    let t0 = Instant::now();
    let resp = client
        .put(format!("{}/v1/snapshot", fresh.http))
        .body(archive.clone())
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.text().await.unwrap_or_default());
    let restored = t0.elapsed();
    let listed: Vec<String> = client
        .get(format!("{}/v1/kv/snap/?keys", fresh.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed.len(), keys, "every key restored");
    println!(
        "    PUT /v1/snapshot into a fresh server on a data dir (verified, one durable write): {}; {} keys listed after",
        ms(restored),
        listed.len()
    );
    let _ = fresh.child.kill();
    let _ = fresh.child.wait();
}

fn main() {
    let (n_writes, writers, waiters) = (
        env_usize("WRITES", 20_000),
        env_usize("WRITERS", 64),
        env_usize("WAITERS", 10_000),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut server = test_support::process::start_server(
            std::path::Path::new(env!("CARGO_BIN_EXE_meshd")),
            [
                std::ffi::OsStr::new("-log-level"),
                "warn".as_ref(),
                "-data-dir".as_ref(),
                dir.path().as_os_str(),
            ],
        );
        println!("KV benchmark (real meshd server on a fresh data dir, 2 cores shared with the load generator)");
        writes(&server.http, n_writes, writers).await;
        prefix_watchers(&server.http, server.child.id(), waiters).await;
        snapshot(&server.http, env_usize("SNAPSHOT_KEYS", 100_000)).await;
        let _ = server.child.kill();
        let _ = server.child.wait();
    });
}
