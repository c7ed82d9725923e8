//! Soak (prints figures; asserts nothing): a real `meshd server` on a fresh data dir (so the
//! write-ahead log, its snapshots and segment rotation are soaked too; `DEV=1` for `-dev`),
//! 100 synthetic proxies
//! holding delta ADS streams, each with upstreams to the 10 churned services; then `CYCLES`
//! (10,000) register/deregister cycles of an instance of one of those services. Every
//! `SAMPLE` (1,000) cycles the server's live tokio tasks, open file descriptors and RSS are
//! sampled; after the warm-up (the first sample) their slopes per 1,000 cycles are printed.
//! Flat (a slope near 0) means nothing leaks per cycle.
//!
//! Run: `cargo xtask soak` (`CYCLES=`, `SAMPLE=`, `PROXIES=` to scale).
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;
use test_support::ads::{delta_proxy, proc_stat};
use test_support::figures::env_usize;
use tokio::sync::mpsc;

const SERVICES: usize = 10;

async fn gauge(client: &reqwest::Client, http: &str, name: &str) -> f64 {
    test_support::process::metric(client, http, name).await
}

/// Least-squares slope of `ys` over `xs`.
fn slope(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let cov: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let var: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    if var == 0.0 { 0.0 } else { cov / var }
}

#[tokio::main(worker_threads = 2)]
async fn main() {
    let cycles = env_usize("CYCLES", 10_000);
    let sample = env_usize("SAMPLE", 1_000).max(1);
    let proxies = env_usize("PROXIES", 100);
    let data = tempfile::tempdir().unwrap();
    let store: Vec<String> = if std::env::var_os("DEV").is_some_and(|v| v == "1") {
        vec!["-dev".into()]
    } else {
        vec!["-data-dir".into(), data.path().display().to_string()]
    };
    println!("store: {}", store.join(" "));
    let server = test_support::process::start_server(
        std::path::Path::new(env!("CARGO_BIN_EXE_meshd")),
        store.iter().map(String::as_str).chain(["-log-level", "error"]),
    );
    let mut child = server.child;
    let pid = child.id();
    let http = reqwest::Client::new();
    let put = |path: &str, body: serde_json::Value| {
        let req = http.put(format!("{}{path}", server.http)).json(&body);
        async move { req.send().await.unwrap().error_for_status().unwrap() }
    };
    for s in 0..SERVICES {
        put(
            "/v1/catalog/register",
            json!({"Node": format!("svc-node-{s}"), "Address": "10.100.0.1", "Service": {"Kind": "connect-proxy",
            "ID": format!("svc-{s}-sidecar-proxy"), "Service": format!("svc-{s}-sidecar-proxy"), "Port": 21000,
            "Proxy": {"DestinationServiceName": format!("svc-{s}")}}}),
        )
        .await;
    }
    for i in 0..proxies {
        let upstreams: Vec<_> = (0..SERVICES)
            .map(|j| json!({"DestinationName": format!("svc-{j}"), "LocalBindPort": 9000 + j}))
            .collect();
        put(
            "/v1/catalog/register",
            json!({"Node": format!("node-{i}"), "Address": "10.0.0.1", "Service": {"Kind": "connect-proxy",
            "ID": format!("app-{i}-sidecar-proxy"), "Service": format!("app-{i}-sidecar-proxy"), "Port": 21000,
            "Proxy": {"DestinationServiceName": format!("app-{i}"), "Upstreams": upstreams}}}),
        )
        .await;
    }
    let marker = Arc::new(AtomicU64::new(0));
    let (report, mut reports) = mpsc::unbounded_channel();
    let (ready, mut readies) = mpsc::unbounded_channel();
    let gate = Arc::new(tokio::sync::Semaphore::new(64));
    for i in 0..proxies {
        let permit = Arc::clone(&gate).acquire_owned().await.unwrap();
        tokio::spawn(delta_proxy(
            server.grpc.clone(),
            i,
            Arc::clone(&marker),
            report.clone(),
            ready.clone(),
            permit,
            None,
        ));
    }
    for _ in 0..proxies {
        readies.recv().await.unwrap();
    }
    // The streams' receipts are not measured here: drain them.
    tokio::spawn(async move { while reports.recv().await.is_some() {} });

    println!("soak: {cycles} register/deregister cycles, {proxies} delta streams watching {SERVICES} churned services");
    println!(
        "  {:>7}  {:>6}  {:>6}  {:>9}  {:>8}",
        "cycles", "tasks", "fds", "RSS MiB", "s"
    );
    let start = Instant::now();
    let (mut xs, mut tasks, mut fds, mut rss) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for c in 1..=cycles {
        let s = c % SERVICES;
        put(
            "/v1/catalog/register",
            json!({"Node": format!("churn-{c}"), "Address": "10.200.0.1", "Service": {"Kind": "connect-proxy",
            "ID": format!("svc-{s}-sidecar-proxy"), "Service": format!("svc-{s}-sidecar-proxy"), "Port": 21000,
            "Proxy": {"DestinationServiceName": format!("svc-{s}")}}}),
        )
        .await;
        put("/v1/catalog/deregister", json!({"Node": format!("churn-{c}")})).await;
        if c % sample == 0 {
            let t = gauge(&http, &server.http, "meshd_runtime_tasks").await;
            let f = gauge(&http, &server.http, "meshd_process_open_fds").await;
            let (_, r) = proc_stat(pid);
            // proc_stat's RSS is in KiB.
            println!(
                "  {c:>7}  {t:>6}  {f:>6}  {:>9.1}  {:>8.1}",
                r as f64 / 1024.0,
                start.elapsed().as_secs_f64()
            );
            xs.push(c as f64 / 1000.0);
            tasks.push(t);
            fds.push(f);
            rss.push(r as f64);
        }
    }
    if xs.len() >= 3 {
        // The first sample is the warm-up.
        let (xs, tasks, fds, rss) = (&xs[1..], &tasks[1..], &fds[1..], &rss[1..]);
        println!(
            "  slopes after warm-up, per 1,000 cycles: tasks {:+.2}, fds {:+.2}, RSS {:+.1} KiB   [target: flat]",
            slope(xs, tasks),
            slope(xs, fds),
            slope(xs, rss)
        );
    } else {
        println!("  (too few samples for slopes: raise CYCLES or lower SAMPLE)");
    }
    let _ = child.kill();
    let _ = child.wait();
}
