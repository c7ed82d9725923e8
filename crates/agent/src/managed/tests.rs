use super::*;

#[test]
fn statuses_follow_the_daemon_events() {
    let mut s = BTreeMap::new();
    record(
        &mut s,
        DaemonEvent::Started {
            id: "web-proxy".into(),
            pid: 10,
            attempt: 1,
        },
    );
    assert_eq!(s["web-proxy"].state, "running");
    assert_eq!((s["web-proxy"].pid, s["web-proxy"].restarts), (Some(10), 0));
    record(
        &mut s,
        DaemonEvent::Exited {
            id: "web-proxy".into(),
            pid: 10,
            status: Some("exit status: 1".into()),
        },
    );
    assert_eq!(s["web-proxy"].state, "restarting");
    assert_eq!(s["web-proxy"].last_exit, "pid 10: exit status: 1");
    record(
        &mut s,
        DaemonEvent::Failed {
            id: "web-proxy".into(),
            reason: "cannot run /nope: No such file or directory".into(),
        },
    );
    assert_eq!(s["web-proxy"].state, "failed");
    assert!(s["web-proxy"].error.contains("/nope"));
    record(
        &mut s,
        DaemonEvent::Started {
            id: "web-proxy".into(),
            pid: 11,
            attempt: 2,
        },
    );
    assert_eq!((s["web-proxy"].pid, s["web-proxy"].restarts), (Some(11), 1));
    assert!(s["web-proxy"].error.is_empty());
    record(
        &mut s,
        DaemonEvent::Adopted {
            id: "db-proxy".into(),
            pid: 20,
        },
    );
    assert!(s["db-proxy"].adopted);
    record(&mut s, DaemonEvent::Stopped { id: "web-proxy".into() });
    assert!(!s.contains_key("web-proxy"));
}

#[test]
fn the_default_command_runs_meshd_connect_envoy_against_this_agent_without_secrets() {
    let config = ManagedConfig {
        data_dir: None,
        allow_root: false,
        program: "/usr/bin/meshd".into(),
        http_addr: "0.0.0.0:8500".parse().unwrap_or_else(|_| unreachable!()),
        grpc_addr: "127.0.0.1:8502".parse().unwrap_or_else(|_| unreachable!()),
        envoy_binary: Some("/opt/envoy".into()),
        drain_time: std::time::Duration::from_secs(2),
    };
    let with_token = Managed {
        command: Vec::new(),
        token: structs::Token::new("s3cr3t"),
        local_token: structs::Token::new("l0cal"),
    };
    let d = spec(
        &config,
        std::path::Path::new("/d/run"),
        "web-sidecar-proxy",
        "web",
        &with_token,
    );
    assert_eq!(d.command, PathBuf::from("/usr/bin/meshd"));
    assert_eq!(
        d.args.join(" "),
        format!(
            "connect envoy -proxy-id web-sidecar-proxy -http-addr 127.0.0.1:8500 -grpc-addr 127.0.0.1:8502 \
         -drain-time 2000ms -run-dir /d/run/web-sidecar-proxy -base-id {} -envoy-binary /opt/envoy",
            base_id(std::path::Path::new("/d/run/web-sidecar-proxy"))
        )
    );
    assert_eq!(
        d.token,
        structs::Token::new("l0cal"),
        "the local token, handed over in CONNECT_PROXY_TOKEN"
    );
    assert!(
        !d.args
            .iter()
            .any(|a| a.contains("s3cr3t") || a.contains("l0cal") || a.contains("token"))
    );
    assert!(
        !d.args.iter().any(|a| a == "-admin-bind"),
        "Envoy's admin stays on its private Unix socket"
    );
    assert!(!format!("{with_token:?}").contains("s3cr3t"), "never printed");
    assert!(!format!("{with_token:?}").contains("l0cal"), "never printed");
    assert_eq!(d.sidecar_for, "web");
    let custom = Managed {
        command: vec!["/bin/proxy".into(), "-v".into()],
        token: None,
        local_token: None,
    };
    let d = spec(&config, std::path::Path::new("/d/run"), "web-proxy", "web", &custom);
    assert_eq!(
        (d.command, d.args),
        (PathBuf::from("/bin/proxy"), vec!["-v".to_owned()])
    );
}
