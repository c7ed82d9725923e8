//! An Envoy bootstrapped with several xDS servers (`meshd connect envoy -grpc-addr A,B,C`)
//! moves its stream to another one when the server it uses dies, and a server that never
//! answers (C, a closed port) does not keep it from starting.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use test_support::http::named_backend as backend;
use test_support::reserve_port as free_port;

use crate::mesh;
use mesh::{Mesh, get, run_envoy, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_moves_to_another_xds_server_when_its_server_dies() {
    // Two `-dev` servers share no state: each knows web's sidecar with its own public port,
    // so Envoy's listener tells which server configured it.
    let mut servers = [Mesh::start(), Mesh::start()];
    let ports = [free_port(), free_port()];
    let web = backend("web");
    for (mesh, port) in servers.iter().zip(ports) {
        mesh.register("node-web", "web", web, port, json!([]), json!({})).await;
    }
    // Reserved and never listened on: connections to it are refused.
    let closed = free_port();
    let grpc = format!("{},{},127.0.0.1:{closed}", servers[0].grpc, servers[1].grpc);
    let dir = tempfile::tempdir().unwrap();
    let (_envoy, admin) = run_envoy(
        "web",
        "node-web",
        &servers[0].http,
        &["-grpc-addr", &grpc],
        &dir.path().join("web"),
    )
    .await;
    let client = reqwest::Client::new();
    let listener = |port: u16| format!("public_listener:0.0.0.0:{port}");
    let listeners_url = format!("{admin}/listeners");
    let listeners = || get(&client, &listeners_url);

    let first = wait_for(|| async {
        let now = listeners().await?;
        ports.iter().position(|p| now.contains(&listener(*p)))
    })
    .await;
    let other = 1 - first;

    // Killed: Envoy reconnects to the other server and takes its configuration whole (the
    // dead server's listener is gone, the other's is there).
    servers[first].kill_server();
    wait_for(|| async {
        let now = listeners().await?;
        (now.contains(&listener(ports[other])) && !now.contains(&listener(ports[first]))).then_some(())
    })
    .await;
    let connected = get(
        &client,
        &format!("{admin}/stats?filter=^control_plane.connected_state$"),
    )
    .await
    .unwrap();
    assert!(connected.contains("control_plane.connected_state: 1"), "{connected}");
}
