//! `meshd connect grpc-bootstrap -service NAME` as written, against a real server: no
//! `-cert-dir` needed — the certificates go to a private directory under the temp dir
//! (`$TMPDIR/meshd-grpc-<uid>/<instance id>`, mode 0700) and the bootstrap JSON is printed on
//! stdout naming them; a directory there that is not private is refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::Duration;

/// A process stopped (SIGTERM, then SIGKILL) by its own handle when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        supervisor::process::terminate_blocking(&mut self.0, Duration::from_secs(10));
    }
}

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_meshd"))
}

fn addr(url: &str) -> &str {
    url.strip_prefix("http://").unwrap_or(url)
}

/// `meshd connect grpc-bootstrap -service client` with `TMPDIR` set to `tmp`.
fn grpc_bootstrap(http: &str, grpc: &str, tmp: &Path) -> Output {
    Command::new(bin())
        .args(["connect", "grpc-bootstrap", "-service", "client"])
        .args(["-http-addr", addr(http), "-grpc-addr", addr(grpc)])
        .env("TMPDIR", tmp)
        .output()
        .unwrap()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn without_cert_dir_the_files_go_to_a_private_temp_directory() {
    let server = test_support::process::start_server(bin(), ["-dev", "-log-level", "warn"]);
    let _server = Proc(server.child);
    let registered = reqwest::blocking::Client::new()
        .put(format!("{}/v1/catalog/register", server.http))
        .json(&serde_json::json!({"Node": "node-client", "Address": "127.0.0.1",
            "Service": {"Service": "client", "ID": "client/1", "Port": 1, "Connect": {"Native": true}}}))
        .send()
        .unwrap();
    assert!(registered.status().is_success());
    let tmp = tempfile::tempdir().unwrap();

    let out = grpc_bootstrap(&server.http, &server.grpc, tmp.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bootstrap: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the bootstrap JSON on stdout");
    assert_eq!(bootstrap["node"]["id"], "client/1");
    let uid = std::fs::metadata(tmp.path()).unwrap().uid();
    let base = tmp.path().join(format!("meshd-grpc-{uid}"));
    // The instance id as one path component.
    let dir = base.join("client_1");
    let provider = &bootstrap["certificate_providers"]["meshd"]["config"];
    for (field, file) in [
        ("certificate_file", "cert.pem"),
        ("private_key_file", "key.pem"),
        ("ca_certificate_file", "roots.pem"),
    ] {
        let path = PathBuf::from(provider[field].as_str().unwrap());
        assert_eq!(path, dir.join(file), "{field}");
        assert!(
            std::fs::read_to_string(&path).unwrap().contains("BEGIN"),
            "{file} written"
        );
    }
    assert_eq!(mode(&base), 0o700);
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("key.pem")), 0o600);

    // Again: the same directory, reused.
    let again = grpc_bootstrap(&server.http, &server.grpc, tmp.path());
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    let second: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(second["certificate_providers"], bootstrap["certificate_providers"]);

    // A directory others may open is not used.
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let refused = grpc_bootstrap(&server.http, &server.grpc, tmp.path());
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("not a private directory"), "{stderr}");
    assert!(refused.stdout.is_empty(), "no bootstrap printed");
}
