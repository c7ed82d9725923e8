//! An agent joined to several servers (`-retry-join C,A -retry-join B`, C a closed port)
//! syncs with the first that answers, and when that server is killed its registrations,
//! heartbeats and forwarded reads go to the next. Two `-dev` servers share no state, so each
//! catalog shows what reached that server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::agents;
use agents::{Proc, get, meshd, put, wait_for};
use serde_json::{Value, json};
use test_support::process::start_server;

/// The JSON at `url`, or `None` while it cannot be read.
async fn json_at(client: &reqwest::Client, url: &str) -> Option<Value> {
    serde_json::from_str(&get(client, url).await?).ok()
}

/// Whether `server`'s catalog has `service` on node `n1`.
async fn has_service(client: &reqwest::Client, server: &str, service: &str) -> bool {
    json_at(client, &format!("{server}/v1/catalog/service/{service}"))
        .await
        .and_then(|v| v.as_array().map(|a| a.iter().any(|s| s["Node"] == "n1")))
        .unwrap_or(false)
}

/// Whether `server` holds a passing liveness check for node `n1` (its heartbeats arrive).
async fn alive_at(client: &reqwest::Client, server: &str) -> bool {
    json_at(client, &format!("{server}/v1/health/node/n1"))
        .await
        .and_then(|v| {
            v.as_array().map(|a| {
                a.iter()
                    .any(|c| c["CheckID"] == "serfHealth" && c["Status"] == "passing")
            })
        })
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_moves_to_the_next_server_when_its_server_dies() {
    let a = start_server(meshd(), ["-dev", "-log-level", "warn"]);
    let (mut a_proc, a_http) = (Proc(a.child), a.http);
    let b = start_server(meshd(), ["-dev", "-log-level", "warn"]);
    let (_b_proc, b_http) = (Proc(b.child), b.http);
    let closed = format!("127.0.0.1:{}", test_support::reserve_port());
    let bare = |http: &str| http.trim_start_matches("http://").to_owned();
    let agent = test_support::process::start_agent(
        meshd(),
        [
            "-dev",
            "-node",
            "n1",
            "-advertise",
            "127.0.0.1",
            // A list in one value, and the flag repeated.
            "-retry-join",
            &format!("{closed},{}", bare(&a_http)),
            "-retry-join",
            &bare(&b_http),
            "-sync-interval",
            "2s",
            "-log-level",
            "warn",
        ],
    );
    let (_agent_proc, agent_http) = (Proc(agent.child), agent.http);
    let client = reqwest::Client::new();
    let register = |name: &'static str| {
        let (client, agent_http) = (client.clone(), agent_http.clone());
        async move {
            put(
                &client,
                &format!("{agent_http}/v1/agent/service/register"),
                json!({"Name": name, "Port": 8080}),
            )
            .await;
        }
    };

    // The closed port is skipped: A gets the registration and the heartbeats, B nothing.
    register("web").await;
    wait_for("web registered at A", || async {
        (has_service(&client, &a_http, "web").await && alive_at(&client, &a_http).await).then_some(())
    })
    .await;
    assert!(!has_service(&client, &b_http, "web").await);
    let members = json_at(&client, &format!("{agent_http}/v1/agent/members"))
        .await
        .unwrap();
    let status = |addr: &str| {
        members
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["Name"] == addr)
            .map(|m| m["Status"].clone())
    };
    assert_eq!(status(&closed), Some(json!(4)), "{members}");
    assert_eq!(status(&bare(&a_http)), Some(json!(1)), "{members}");

    // A crashes: a new registration (a partial sync), the full sync of what was there
    // before, and the heartbeats all reach B.
    let _ = a_proc.0.kill();
    let _ = a_proc.0.wait();
    register("api").await;
    wait_for("api, web and the heartbeats at B", || async {
        (has_service(&client, &b_http, "api").await
            && has_service(&client, &b_http, "web").await
            && alive_at(&client, &b_http).await)
            .then_some(())
    })
    .await;

    // Reads the agent forwards go to B too.
    let services = json_at(&client, &format!("{agent_http}/v1/catalog/services"))
        .await
        .unwrap();
    assert!(services.get("api").is_some(), "{services}");
}
