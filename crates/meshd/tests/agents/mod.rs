//! What the agent end-to-end tests share: the binary, process guards, polling and HTTP.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // each test file uses part of it; a panic is the failure report

use serde_json::Value;
use std::path::Path;
use std::process::Child;
use std::time::Duration;

/// A child process stopped (SIGTERM, by its own pid handle) when dropped.
pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        supervisor::process::terminate_blocking(&mut self.0, Duration::from_secs(10));
    }
}

/// The `meshd` binary under test.
pub(crate) fn meshd() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_meshd"))
}

/// Polls `check` until it yields a value (real processes: there is no clock to pause).
pub(crate) async fn wait_for<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    for _ in 0..1200 {
        if let Some(v) = check().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not reached within 60 s");
}

/// A successful GET's body, or `None`.
pub(crate) async fn get(client: &reqwest::Client, url: &str) -> Option<String> {
    let resp = client.get(url).timeout(Duration::from_secs(2)).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    resp.text().await.ok()
}

/// A PUT that must succeed.
pub(crate) async fn put(client: &reqwest::Client, url: &str, body: Value) {
    let resp = client.put(url).json(&body).send().await.unwrap();
    assert!(resp.status().is_success(), "{url}: {}", resp.text().await.unwrap());
}
