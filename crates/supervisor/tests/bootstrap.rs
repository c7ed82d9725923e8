//! The generated bootstrap is accepted by the real Envoy.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use supervisor::bootstrap::{BootstrapConfig, XdsTls, bootstrap_json};
use test_support::envoy;

/// A CA certificate in PEM (Envoy parses `trusted_ca` when validating).
const CA_PEM: &str = include_str!("ca.pem");

#[test]
fn bootstrap_passes_envoy_validate() {
    let tls = |server_name: &str| {
        Some(XdsTls {
            ca_pem: CA_PEM.into(),
            server_name: server_name.into(),
        })
    };
    for (token, xds_tls) in [
        ("", None),
        ("secret-token", None),
        ("", tls("127.0.0.1")),
        ("secret-token", tls("server.dc1.meshd")),
    ] {
        let cfg = BootstrapConfig {
            proxy_id: "web-sidecar-proxy".into(),
            node_name: "node-1".into(),
            cluster: "web".into(),
            admin_bind: "127.0.0.1:19000".parse().unwrap(),
            xds_addr: "127.0.0.1:8502".parse().unwrap(),
            token: token.into(),
            xds_tls: xds_tls.clone(),
        };
        let json = bootstrap_json(&cfg);
        assert_eq!(json["dynamic_resources"]["ads_config"]["api_type"], "DELTA_GRPC");
        let socket = &json["static_resources"]["clusters"][0]["transport_socket"];
        match &xds_tls {
            None => assert!(socket.is_null()),
            Some(tls) => {
                let context = &socket["typed_config"];
                assert_eq!(context["common_tls_context"]["alpn_protocols"][0], "h2");
                assert_eq!(
                    context["common_tls_context"]["validation_context"]["trusted_ca"]["inline_string"],
                    CA_PEM
                );
                let san = &context["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"][0];
                assert_eq!(san["matcher"]["exact"], tls.server_name.as_str());
                // SNI for host names only.
                assert_eq!(context["sni"].is_null(), tls.server_name == "127.0.0.1");
            }
        }
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
