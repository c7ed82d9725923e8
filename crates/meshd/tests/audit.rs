//! The audit log on a real server with ACLs and a data dir: a script of mixed writes by
//! three tokens, accepted and refused, is recorded exactly, in index order, with accessor
//! ids and no secret, in the catalog and in the audit file, and survives `kill -9`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use reqwest::blocking::Client;
use serde_json::{Value, json};
use std::path::Path;
use std::process::Child;

struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(data: &Path, audit_file: &Path) -> Server {
        let started = test_support::process::start_server(
            Path::new(env!("CARGO_BIN_EXE_meshd")),
            [
                "-log-level",
                "warn",
                "-data-dir",
                data.to_str().unwrap(),
                "-acl-enabled",
                "-acl-default-policy",
                "deny",
                "-audit-file",
                audit_file.to_str().unwrap(),
            ],
        );
        Server {
            child: started.child,
            addr: started.http,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Only our own child, by its pid handle.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request of the script, and what the log must say of it.
struct Expect {
    accessor: String,
    method: &'static str,
    path: String,
    accepted: bool,
}

fn send(client: &Client, server: &Server, token: &str, method: &str, path: &str, body: Option<String>) -> u16 {
    let url = format!("{}{path}", server.addr);
    let req = match method {
        "PUT" => client.put(url),
        "DELETE" => client.delete(url),
        _ => unreachable!(),
    };
    let req = if token.is_empty() {
        req
    } else {
        req.header("X-Consul-Token", token)
    };
    let req = match body {
        Some(body) => req.body(body),
        None => req,
    };
    req.send().unwrap().status().as_u16()
}

fn audit(client: &Client, server: &Server, token: &str, query: &str) -> (u16, Vec<Value>) {
    let resp = client
        .get(format!("{}/v1/internal/audit{query}", server.addr))
        .header("X-Consul-Token", token)
        .send()
        .unwrap();
    let status = resp.status().as_u16();
    (
        status,
        if status == 200 {
            resp.json().unwrap()
        } else {
            Vec::new()
        },
    )
}

/// Three tokens (management, a writer of `app/` keys, an operator reader) and their
/// accessors, made through the API.
fn tokens(client: &Client, server: &Server) -> [(String, String); 3] {
    let boot: Value = client
        .put(format!("{}/v1/acl/bootstrap", server.addr))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let mgmt = (
        boot["SecretID"].as_str().unwrap().to_owned(),
        boot["AccessorID"].as_str().unwrap().to_owned(),
    );
    let mut made = Vec::new();
    for (name, rules, secret) in [
        (
            "writer",
            "key_prefix \"app/\" { policy = \"write\" }",
            "8f1d2c3b-0000-4000-8000-00000000aaaa",
        ),
        ("reader", "operator = \"read\"", "8f1d2c3b-0000-4000-8000-00000000bbbb"),
    ] {
        let policy = json!({"Name": name, "Rules": rules});
        assert_eq!(
            send(
                client,
                server,
                &mgmt.0,
                "PUT",
                "/v1/acl/policy",
                Some(policy.to_string())
            ),
            200
        );
        let token: Value = client
            .put(format!("{}/v1/acl/token", server.addr))
            .header("X-Consul-Token", &mgmt.0)
            .json(&json!({"SecretID": secret, "Policies": [{"Name": name}]}))
            .send()
            .unwrap()
            .json()
            .unwrap();
        made.push((secret.to_owned(), token["AccessorID"].as_str().unwrap().to_owned()));
    }
    let reader = made.pop().unwrap();
    let writer = made.pop().unwrap();
    [mgmt, writer, reader]
}

/// The script: 50 writes, 15 of them refused (403s and 400s).
fn script(client: &Client, server: &Server, tokens: &[(String, String); 3]) -> Vec<Expect> {
    let [mgmt, writer, reader] = tokens;
    let mut expected = Vec::new();
    let mut run = |who: &(String, String), method: &'static str, path: String, body: Option<Value>, accepted: bool| {
        let status = send(client, server, &who.0, method, &path, body.map(|b| b.to_string()));
        assert_eq!(status == 200, accepted, "{method} {path}: {status}");
        expected.push(Expect {
            accessor: who.1.clone(),
            method,
            path,
            accepted,
        });
    };
    for i in 0..15 {
        run(
            writer,
            "PUT",
            format!("/v1/kv/app/k{i}"),
            Some(json!(format!("s3cr3t-value-{i}"))),
            true,
        );
        if i % 3 == 0 {
            run(writer, "PUT", format!("/v1/kv/other/k{i}"), Some(json!("x")), false);
        }
    }
    for i in 0..10 {
        let entry = json!({"Kind": "service-defaults", "Name": format!("svc{i}"), "Protocol": "http"});
        run(mgmt, "PUT", "/v1/config".into(), Some(entry), true);
        if i % 2 == 0 {
            let bad = json!({"Kind": "service-defaults", "Name": format!("svc{i}"), "Protocol": "carrier-pigeon"});
            run(mgmt, "PUT", "/v1/config".into(), Some(bad), false);
        }
    }
    for i in 0..5 {
        let node = json!({"Node": format!("n{i}"), "Address": "10.0.0.1"});
        run(reader, "PUT", "/v1/catalog/register".into(), Some(node), false);
        let intention = json!({"Kind": "service-intentions", "Name": format!("svc{i}"),
            "Sources": [{"Name": "web", "Action": "allow"}]});
        run(mgmt, "PUT", "/v1/config".into(), Some(intention), true);
        run(writer, "DELETE", format!("/v1/kv/app/k{i}"), None, true);
    }
    assert_eq!(expected.len(), 50);
    assert_eq!(expected.iter().filter(|e| !e.accepted).count(), 15);
    expected
}

/// The log's records from `first_seq` on are exactly the script's, in order.
fn check(records: &[Value], first_seq: u64, expected: &[Expect]) {
    let script: Vec<&Value> = records
        .iter()
        .filter(|r| r["Seq"].as_u64().unwrap() >= first_seq)
        .collect();
    assert_eq!(script.len(), expected.len(), "{script:#?}");
    let mut last_index = 0;
    for (r, e) in script.iter().zip(expected) {
        let what = format!("{} {} in {r}", e.method, e.path);
        assert_eq!(r["AccessorID"], e.accessor.as_str(), "{what}");
        assert_eq!(r["Method"], e.method, "{what}");
        assert_eq!(r["Path"], e.path.as_str(), "{what}");
        assert_eq!(r["Accepted"], e.accepted, "{what}");
        assert!(r["RemoteAddr"].as_str().unwrap().starts_with("127.0.0.1:"), "{what}");
        if !e.accepted {
            assert!(!r["Error"].as_str().unwrap().is_empty(), "a refusal says why: {what}");
        }
        let index = r["Index"].as_u64().unwrap();
        assert!(index > last_index, "in index order: {what}");
        last_index = index;
    }
}

#[test]
fn a_script_of_writes_is_audited_exactly_without_secrets_and_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let (data, audit_file) = (dir.path().join("data"), dir.path().join("audit").join("audit.log"));
    let client = Client::new();
    let mut server = Server::start(&data, &audit_file);
    let tokens = tokens(&client, &server);
    let [mgmt, writer, reader] = &tokens;
    let (_, setup) = audit(&client, &server, &mgmt.0, "");
    // The bootstrap (no token yet), two policies and two tokens.
    assert_eq!(setup.len(), 5, "{setup:#?}");
    let first_seq = setup.last().unwrap()["Seq"].as_u64().unwrap() + 1;
    let expected = script(&client, &server, &tokens);

    // Who may read it: operator:read, not a writer of keys.
    let (status, records) = audit(&client, &server, &reader.0, "");
    assert_eq!(status, 200);
    check(&records, first_seq, &expected);
    assert_eq!(audit(&client, &server, &writer.0, "").0, 403);
    // Filters.
    let (_, by_writer) = audit(&client, &server, &mgmt.0, &format!("?accessor={}", writer.1));
    assert_eq!(
        by_writer.len(),
        expected.iter().filter(|e| e.accessor == writer.1).count()
    );
    let (_, refused) = audit(&client, &server, &mgmt.0, "?accepted=false");
    assert_eq!(refused.len(), 15);
    let (_, kv) = audit(&client, &server, &mgmt.0, "?kind=kv&limit=3");
    assert_eq!(kv.len(), 3);
    assert!(kv.iter().all(|r| r["Kind"] == "kv"));
    let (status, _) = audit(&client, &server, &mgmt.0, "?since=yesterday");
    assert_eq!(status, 400);

    // kill -9: every acknowledged write's record is there after the restart.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    drop(server);
    let server = Server::start(&data, &audit_file);
    let (_, after) = audit(&client, &server, &mgmt.0, "");
    check(&after, first_seq, &expected);
    assert_eq!(after, records[..after.len()].to_vec(), "the same records");

    // The file holds the same records, and no secret is anywhere in the log.
    let text = std::fs::read_to_string(&audit_file).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines, after, "the audit file and the catalog's log agree");
    let listing = serde_json::to_string(&after).unwrap();
    let mut secrets: Vec<String> = tokens.iter().map(|t| t.0.clone()).collect();
    secrets.extend((0..15).map(|i| format!("s3cr3t-value-{i}")));
    for secret in &secrets {
        assert!(!text.contains(secret.as_str()), "{secret} in the audit file");
        assert!(!listing.contains(secret.as_str()), "{secret} in the audit listing");
    }
    test_support::assert_private_tree(audit_file.parent().unwrap());
}
