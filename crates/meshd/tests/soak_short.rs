//! The soak's short form (the long one is `cargo xtask soak`): a real server with streams
//! watching, 300 register/deregister cycles of instances they watch; afterwards the server's
//! live tokio tasks and open file descriptors are back where they were after the warm-up.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use test_support::ads::delta_proxy;
use tokio::sync::mpsc;

use crate::mesh;
use mesh::{Proc, wait_for};

const SERVICES: usize = 3;
const STREAMS: usize = 10;

async fn churn(client: &reqwest::Client, http: &str, from: usize, to: usize) {
    for c in from..to {
        let s = c % SERVICES;
        let reg = json!({"Node": format!("churn-{c}"), "Address": "10.200.0.1", "Service": {"Kind": "connect-proxy",
            "ID": format!("svc-{s}-sidecar-proxy"), "Service": format!("svc-{s}-sidecar-proxy"), "Port": 21000,
            "Proxy": {"DestinationServiceName": format!("svc-{s}")}}});
        let r = client
            .put(format!("{http}/v1/catalog/register"))
            .json(&reg)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
        let r = client
            .put(format!("{http}/v1/catalog/deregister"))
            .json(&json!({"Node": format!("churn-{c}")}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_leaves_no_tasks_or_fds_behind() {
    let server = test_support::process::start_server(
        std::path::Path::new(env!("CARGO_BIN_EXE_meshd")),
        ["-dev", "-log-level", "warn"],
    );
    let _server = Proc(server.child);
    let http = server.http.clone();
    let client = reqwest::Client::new();
    for i in 0..STREAMS {
        let upstreams: Vec<_> = (0..SERVICES)
            .map(|j| json!({"DestinationName": format!("svc-{j}"), "LocalBindPort": 9000 + j}))
            .collect();
        let reg = json!({"Node": format!("node-{i}"), "Address": "10.0.0.1", "Service": {"Kind": "connect-proxy",
            "ID": format!("app-{i}-sidecar-proxy"), "Service": format!("app-{i}-sidecar-proxy"), "Port": 21000,
            "Proxy": {"DestinationServiceName": format!("app-{i}"), "Upstreams": upstreams}}});
        let r = client
            .put(format!("{http}/v1/catalog/register"))
            .json(&reg)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
    let (report, mut reports) = mpsc::unbounded_channel();
    let (ready, mut readies) = mpsc::unbounded_channel();
    let gate = Arc::new(tokio::sync::Semaphore::new(STREAMS));
    for i in 0..STREAMS {
        let permit = Arc::clone(&gate).acquire_owned().await.unwrap();
        tokio::spawn(delta_proxy(
            server.grpc.clone(),
            i,
            Arc::new(AtomicU64::new(0)),
            report.clone(),
            ready.clone(),
            permit,
            None,
        ));
    }
    for _ in 0..STREAMS {
        readies.recv().await.unwrap();
    }
    tokio::spawn(async move { while reports.recv().await.is_some() {} });

    let gauges = || async {
        let tasks = test_support::process::metric(&client, &http, "meshd_runtime_tasks").await;
        let fds = test_support::process::metric(&client, &http, "meshd_process_open_fds").await;
        (tasks, fds)
    };
    churn(&client, &http, 0, 50).await;
    let (tasks0, fds0) = gauges().await;
    assert!(tasks0 > 0.0 && fds0 > 0.0, "the gauges are exported");
    churn(&client, &http, 50, 350).await;
    // Back to the warm-up's level (a few tasks and descriptors of slack for connections the
    // client's pool may hold).
    wait_for(|| async {
        let (tasks, fds) = gauges().await;
        (tasks <= tasks0 + 3.0 && fds <= fds0 + 3.0).then_some(())
    })
    .await;
}
