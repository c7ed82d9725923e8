//! Consul's HTTP conventions answer the same on a server and on an agent: the same request,
//! sent to a real `meshd server` (ACLs on, default deny) and to a real `meshd agent` joined
//! to it, gets the same status and body. The table covers boolean flags in every spelling
//! Consul accepts (and one it refuses), blocking-query parameters (`?index`, `?wait`, good
//! and bad), the token from the header, a bearer token and `?token=`, and the error bodies.
//! Endpoints both serve themselves (the CA roots, the engine's status views) and forwarded
//! ones (health) are in it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::agents;
use agents::{Proc, meshd, wait_for};
use serde_json::{Value, json};

const MANAGEMENT: &str = "0c1d2e3f-4a5b-4c6d-8e7f-901a2b3c4d5e";

/// How a request carries its token.
#[derive(Clone, Copy, Debug)]
enum Carry {
    None,
    Header,
    Bearer,
    Query,
}

struct Answer {
    status: u16,
    index: Option<String>,
    body: String,
}

async fn get(client: &reqwest::Client, base: &str, path: &str, token: Option<&str>, carry: Carry) -> Answer {
    let mut url = format!("{base}{path}");
    let mut req = client.get(&url);
    match (carry, token) {
        (Carry::Header, Some(t)) => req = req.header("X-Consul-Token", t),
        (Carry::Bearer, Some(t)) => req = req.header("Authorization", format!("Bearer {t}")),
        (Carry::Query, Some(t)) => {
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str(&format!("token={t}"));
            req = client.get(&url);
        }
        _ => {}
    }
    let resp = req.send().await.unwrap();
    let index = resp
        .headers()
        .get("x-consul-index")
        .map(|v| v.to_str().unwrap().to_owned());
    Answer {
        status: resp.status().as_u16(),
        index,
        body: resp.text().await.unwrap().trim().to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_and_an_agent_answer_the_same_request_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let management = dir.path().join("management.token");
    std::fs::write(&management, MANAGEMENT).unwrap();
    let server = test_support::process::start_server(
        meshd(),
        [
            "-dev",
            "-log-level",
            "warn",
            "-acl-enabled",
            "-acl-default-policy",
            "deny",
            "-acl-initial-management-token-file",
            management.to_str().unwrap(),
        ],
    );
    let _server_proc = Proc(server.child);
    let client = reqwest::Client::new();
    let put = |path: &str, body: Value| {
        client
            .put(format!("{}{path}", server.http))
            .header("X-Consul-Token", MANAGEMENT)
            .json(&body)
            .send()
    };
    // The agent's own token, and a token that may read everything but the engine's views.
    let made: Value = put(
        "/v1/acl/token",
        json!({"NodeIdentities": [{"NodeName": "conv", "Datacenter": "dc1"}]}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let agent_token = dir.path().join("agent.token");
    std::fs::write(&agent_token, made["SecretID"].as_str().unwrap()).unwrap();
    let policy = put(
        "/v1/acl/policy",
        json!({"Name": "reader", "Rules": "service_prefix \"\" { policy = \"read\" }\nnode_prefix \"\" { policy = \"read\" }"}),
    );
    assert_eq!(policy.await.unwrap().status(), 200);
    let made: Value = put("/v1/acl/token", json!({"Policies": [{"Name": "reader"}]}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let reader = made["SecretID"].as_str().unwrap().to_owned();
    // web: one instance passing, one critical, so `?passing` changes the answer.
    for (id, status) in [("web-ok", "passing"), ("web-bad", "critical")] {
        let registered = put(
            "/v1/catalog/register",
            json!({"Node": format!("n-{id}"), "Address": "10.0.0.1",
                   "Service": {"ID": id, "Service": "web", "Port": 80},
                   "Check": {"CheckID": format!("c-{id}"), "Name": "c", "Status": status, "ServiceID": id}}),
        );
        assert_eq!(registered.await.unwrap().status(), 200);
    }
    let agent = test_support::process::start_agent(
        meshd(),
        [
            "-dev",
            "-node",
            "conv",
            "-retry-join",
            server.http.trim_start_matches("http://"),
            "-log-level",
            "warn",
            "-acl-enabled",
            "-acl-default-policy",
            "deny",
            "-acl-agent-token-file",
            agent_token.to_str().unwrap(),
        ],
    );
    let _agent_proc = Proc(agent.child);
    let (s, a) = (server.http.as_str(), agent.http.as_str());
    // The agent's cache has the roots before the comparisons start.
    let roots_index = wait_for("the agent serves the CA roots", || async {
        let answer = get(
            &client,
            a,
            "/v1/agent/connect/ca/roots",
            Some(MANAGEMENT),
            Carry::Header,
        )
        .await;
        (answer.status == 200).then_some(answer.index.unwrap())
    })
    .await;

    let mut rows: Vec<(String, Option<&str>, Carry)> = Vec::new();
    let m = Some(MANAGEMENT);
    // Booleans, every spelling Go's ParseBool accepts, and one it refuses.
    for spelling in [
        "", "=", "=1", "=t", "=T", "=true", "=TRUE", "=True", "=0", "=f", "=F", "=false", "=FALSE", "=False", "=yes",
    ] {
        rows.push((
            format!("/v1/health/service/web?passing{spelling}"),
            Some(reader.as_str()),
            Carry::Header,
        ));
    }
    // Blocking queries: at the current index (answers after the wait), an empty index,
    // malformed ones, a wait above the maximum (capped, answers at once without an index).
    for query in [
        format!("index={roots_index}&wait=50ms"),
        "index=&wait=50ms".to_owned(),
        "index=x".to_owned(),
        "index=-1".to_owned(),
        "wait=nope".to_owned(),
        "wait=10".to_owned(),
        "index=0&wait=1h".to_owned(),
    ] {
        rows.push((format!("/v1/agent/connect/ca/roots?{query}"), m, Carry::Header));
    }
    // The token, carried every way, refused when missing, unknown or short of rights.
    for carry in [Carry::Header, Carry::Bearer, Carry::Query] {
        rows.push(("/v1/internal/xds-status".to_owned(), m, carry));
        rows.push(("/v1/internal/xds-status".to_owned(), Some("not-a-token"), carry));
        rows.push(("/v1/internal/xds-status".to_owned(), Some(reader.as_str()), carry));
        rows.push(("/v1/health/service/web".to_owned(), Some(reader.as_str()), carry));
    }
    rows.push(("/v1/internal/xds-status".to_owned(), None, Carry::None));
    rows.push(("/v1/internal/proxy-status/nope".to_owned(), m, Carry::Header));
    // One metrics route on both: its refusal of an unknown format.
    rows.push(("/v1/agent/metrics?format=xml".to_owned(), m, Carry::Header));
    // One version route on both, open to anyone.
    rows.push(("/v1/agent/version".to_owned(), None, Carry::None));
    // Error bodies.
    rows.push((
        "/v1/health/service/web?dc=elsewhere".to_owned(),
        Some(reader.as_str()),
        Carry::Header,
    ));
    rows.push((
        "/v1/health/service/web?node-meta=nocolon".to_owned(),
        Some(reader.as_str()),
        Carry::Header,
    ));

    let mut seen = std::collections::BTreeSet::new();
    for (path, token, carry) in &rows {
        let (on_server, on_agent) = tokio::join!(
            get(&client, s, path, *token, *carry),
            get(&client, a, path, *token, *carry)
        );
        let what = format!("GET {path} ({carry:?})");
        assert_eq!(
            (on_server.status, &on_server.body),
            (on_agent.status, &on_agent.body),
            "{what}: the server and the agent disagree"
        );
        assert_eq!(on_server.index, on_agent.index, "{what}: X-Consul-Index differs");
        seen.insert(on_server.status);
    }
    // The table exercised answers of every kind, so agreeing was not trivial.
    assert!(
        [200, 400, 403, 404].iter().all(|s| seen.contains(s)),
        "statuses seen: {seen:?}"
    );
    // And what the spellings mean: true filters the critical instance out, false keeps it.
    let count = |body: String| serde_json::from_str::<Vec<Value>>(&body).unwrap().len();
    let passing = |q: &'static str| {
        let (client, reader) = (client.clone(), reader.clone());
        async move {
            let path = format!("/v1/health/service/web?passing{q}");
            get(&client, a, &path, Some(&reader), Carry::Header).await
        }
    };
    assert_eq!(count(passing("=True").await.body), 1);
    assert_eq!(count(passing("=False").await.body), 2);
    assert_eq!(passing("=yes").await.status, 400);
    let version = get(&client, a, "/v1/agent/version", None, Carry::None).await;
    let version: Value = serde_json::from_str(&version.body).unwrap();
    assert_eq!(version["HumanVersion"], env!("CARGO_PKG_VERSION"));
    // Both serve their metrics as Consul's JSON by default, and as Prometheus text.
    for base in [s, a] {
        let json = get(&client, base, "/v1/agent/metrics", m, Carry::Header).await;
        assert_eq!(json.status, 200, "{base}: {}", json.body);
        let json: Value = serde_json::from_str(&json.body).unwrap();
        assert!(
            json["Gauges"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["Name"] == "meshd_xds_streams"),
            "{base}: {json}"
        );
        let text = get(&client, base, "/v1/agent/metrics?format=prometheus", m, Carry::Header).await;
        assert!(text.body.ends_with("# EOF"), "{base}: {}", text.body);
    }
}
