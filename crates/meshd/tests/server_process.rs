//! The real `meshd server` process: command-line errors, clean shutdown, and that every
//! acknowledged write survives `kill -9`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use serde_json::{Value, json};
use std::process::{Child, Command};
use std::sync::mpsc;
use std::thread;

struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let started = test_support::process::start_server(
            std::path::Path::new(env!("CARGO_BIN_EXE_meshd")),
            ["-log-level", "warn"].iter().chain(args),
        );
        Server {
            child: started.child,
            addr: started.http,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.addr)
    }

    fn terminate(mut self) -> std::process::ExitStatus {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Only our own child, by its pid handle.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_fail(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_meshd")).args(args).output().unwrap();
    (out.status.code().unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn bad_command_lines_fail_with_one_line() {
    let (code, err) = run_fail(&["server"]);
    assert_eq!(
        (code, err.as_str()),
        (1, "meshd: one of -data-dir, -dev or -store etcd is required\n")
    );
    let (code, err) = run_fail(&["server", "-dev", "-bogus"]);
    assert_eq!(code, 2);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("meshd: unexpected argument '--bogus'"), "{err}");
    let (code, err) = run_fail(&["server", "-dev", "-http-addr", "nowhere"]);
    assert_eq!((code, err.lines().count()), (2, 1), "{err}");
    let file = tempfile::NamedTempFile::new().unwrap();
    let (code, err) = run_fail(&[
        "server",
        "-data-dir",
        file.path().to_str().unwrap(),
        "-http-addr",
        "127.0.0.1:0",
        "-dns-addr",
        "off",
        "-log-level",
        "off",
    ]);
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("meshd: cannot use data dir"), "{err}");
    assert!(err.trim_end().ends_with("is not a directory"), "{err}");
    assert_eq!(err.matches("is not a directory").count(), 1, "said once: {err}");
}

fn register(client: &reqwest::blocking::Client, server: &str, node: &str) -> reqwest::Result<bool> {
    let body = json!({"Node": node, "Address": "10.1.2.3", "Service": {"Service": "api", "ID": node, "Port": 8080}});
    let resp = client.put(format!("{server}/v1/catalog/register")).json(&body).send()?;
    Ok(resp.status().is_success())
}

fn nodes(server: &Server) -> (Vec<String>, u64) {
    let resp = reqwest::blocking::get(server.url("/v1/catalog/nodes")).unwrap();
    let index = resp.headers()["x-consul-index"].to_str().unwrap().parse().unwrap();
    let body: Value = resp.json().unwrap();
    (
        body.as_array()
            .unwrap()
            .iter()
            .map(|n| n["Node"].as_str().unwrap().to_owned())
            .collect(),
        index,
    )
}

#[test]
fn sigterm_shuts_down_cleanly_and_state_persists() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let server = Server::start(&["-data-dir", data_dir, "-node", "srv"]);
    let client = reqwest::blocking::Client::new();
    assert!(register(&client, &server.addr, "n1").unwrap());
    let (_, index) = nodes(&server);
    let status = server.terminate();
    assert!(status.success(), "{status:?}");
    let server = Server::start(&["-data-dir", data_dir, "-node", "srv"]);
    let (names, again) = nodes(&server);
    // n1, and the server's own node (servers are in their catalog; its API's new port is
    // registered again, so the index may have moved on, never back).
    assert_eq!(names, vec!["n1", "srv"]);
    assert!(again >= index, "{again} < {index}");
    assert!(server.terminate().success());
}

/// A data dir after a realistic run (ACL bootstrap, a token, the CA, a snapshot's worth of
/// writes) holds secrets: it is the owner's only, and one that was wider is tightened at
/// start.
#[test]
fn the_data_dir_and_its_files_are_the_owners_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = Server::start(&["-data-dir", data.to_str().unwrap(), "-acl-enabled"]);
    let client = reqwest::blocking::Client::new();
    let boot: Value = client
        .put(server.url("/v1/acl/bootstrap"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let mgmt = boot["SecretID"].as_str().unwrap().to_owned();
    let token = client
        .put(server.url("/v1/acl/token"))
        .header("X-Consul-Token", &mgmt)
        .json(&json!({"ServiceIdentities": [{"ServiceName": "web"}]}))
        .send()
        .unwrap();
    assert!(token.status().is_success());
    let roots = client
        .get(server.url("/v1/connect/ca/roots"))
        .header("X-Consul-Token", &mgmt)
        .send()
        .unwrap();
    assert!(roots.status().is_success());
    for i in 0..50 {
        let node = format!("n{i}");
        let resp = client
            .put(server.url("/v1/catalog/register"))
            .header("X-Consul-Token", &mgmt)
            .json(&json!({"Node": node, "Address": "10.0.0.1"}))
            .send()
            .unwrap();
        assert!(resp.status().is_success());
    }
    assert!(server.terminate().success());
    let files = test_support::assert_private_tree(&data);
    assert!(files >= 2, "LOCK and a log segment at least: {files}");
    // The log holds the management token's secret: nobody else may read it.
    let log_holds_secret = std::fs::read_dir(&data)
        .unwrap()
        .flatten()
        .any(|e| std::fs::read(e.path()).is_ok_and(|bytes| bytes.windows(mgmt.len()).any(|w| w == mgmt.as_bytes())));
    assert!(log_holds_secret, "the test looks at the files that hold secrets");
}

/// SIGTERM the moment the ready line is out: the handler is in place before that line, so
/// the exit is the clean one (status 0), never the signal's default action. It once was
/// installed only when the server first waited on it, just after the line.
#[test]
fn sigterm_right_after_the_ready_line_is_a_clean_exit() {
    for _ in 0..10 {
        let server = Server::start(&["-dev"]);
        let status = server.terminate();
        assert!(status.success(), "{status:?}");
    }
}

/// A deterministic sequence for choosing kill points.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound
    }
}

#[test]
fn acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap().to_owned();
    let mut rng = Lcg(0x5eed);
    let mut all_acked: Vec<String> = Vec::new();
    let mut last_index = 0;
    for round in 0..5 {
        let server = Server::start(&["-data-dir", &data_dir]);
        // What was acknowledged before every earlier crash is all there.
        let (present, index) = nodes(&server);
        for name in &all_acked {
            assert!(present.contains(name), "round {round}: acknowledged {name} lost");
        }
        assert!(
            index >= last_index,
            "round {round}: index went back from {last_index} to {index}"
        );

        // Four writers register nodes as fast as they can; kill -9 after a seeded number of
        // acknowledgements, with writes in flight.
        let kill_after = 20 + rng.next(200) as usize;
        let (ack, acks) = mpsc::channel::<String>();
        let mut writers = Vec::new();
        for w in 0..4 {
            let (addr, ack) = (server.addr.clone(), ack.clone());
            writers.push(thread::spawn(move || {
                let client = reqwest::blocking::Client::new();
                for i in 0.. {
                    let name = format!("r{round}-w{w}-{i}");
                    match register(&client, &addr, &name) {
                        Ok(true) => {
                            if ack.send(name).is_err() {
                                return;
                            }
                        }
                        _ => return, // the server is gone
                    }
                }
            }));
        }
        drop(ack);
        let mut acked: Vec<String> = (0..kill_after).map(|_| acks.recv().unwrap()).collect();
        let mut server = server;
        server.child.kill().unwrap();
        server.child.wait().unwrap();
        for w in writers {
            w.join().unwrap();
        }
        acked.extend(acks.try_iter());
        assert!(acked.len() >= kill_after);
        all_acked.extend(acked);
        last_index = index;
    }
    let server = Server::start(&["-data-dir", &data_dir]);
    let (present, _) = nodes(&server);
    for name in &all_acked {
        assert!(present.contains(name), "acknowledged {name} lost");
    }
    println!(
        "{} acknowledged writes across 5 kill -9 rounds, all present",
        all_acked.len()
    );
}

/// The blocking queries parked now, from the server's own gauge.
async fn parked(client: &reqwest::Client, server: &Server) -> u64 {
    test_support::process::metric(client, &server.addr, "meshd_http_blocking_queries ").await as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_blocking_queries_do_not_hold_shutdown() {
    const PARKED: u64 = 1_000;
    let server = Server::start(&["-dev"]);
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let index: u64 = client
        .get(server.url("/v1/catalog/services"))
        .send()
        .await
        .unwrap()
        .headers()["x-consul-index"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let url = server.url(&format!("/v1/catalog/services?index={index}&wait=10m"));
    let mut queries = tokio::task::JoinSet::new();
    for _ in 0..PARKED {
        let (client, url) = (client.clone(), url.clone());
        queries.spawn(async move { client.get(&url).send().await.map(|r| r.status()) });
    }
    // Until the server reports every query parked (no fixed sleep).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while parked(&client, &server).await < PARKED {
        assert!(std::time::Instant::now() < deadline, "queries never parked");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let stopping = std::time::Instant::now();
    let status = tokio::task::spawn_blocking(move || server.terminate()).await.unwrap();
    let took = stopping.elapsed();
    assert!(status.success(), "exit {status}");
    assert!(
        took < std::time::Duration::from_secs(15),
        "a server with {PARKED} parked queries took {took:?} to stop"
    );
    // Each parked query was answered (as if its wait had ended), none was cut.
    while let Some(done) = queries.join_next().await {
        assert_eq!(done.unwrap().unwrap(), reqwest::StatusCode::OK);
    }
}
