//! The generated bootstrap is accepted by the real Envoy.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use supervisor::bootstrap::{BootstrapConfig, bootstrap_json};
use test_support::envoy;

#[test]
fn bootstrap_passes_envoy_validate() {
    for token in ["", "secret-token"] {
        let cfg = BootstrapConfig {
            proxy_id: "web-sidecar-proxy".into(),
            node_name: "node-1".into(),
            cluster: "web".into(),
            admin_bind: "127.0.0.1:19000".parse().unwrap(),
            xds_addr: "127.0.0.1:8502".parse().unwrap(),
            token: token.into(),
        };
        let json = bootstrap_json(&cfg);
        assert_eq!(json["dynamic_resources"]["ads_config"]["api_type"], "DELTA_GRPC");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bootstrap.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
        let out = Command::new(envoy())
            .args(["--mode", "validate", "-l", "error", "-c"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
