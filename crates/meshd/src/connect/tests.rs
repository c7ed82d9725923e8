use super::*;
use std::time::Duration;

fn envoy_args(flags: &[&str]) -> EnvoyArgs {
    use clap::Parser;
    let argv = ["meshd", "connect", "envoy", "-sidecar-for", "web"].iter().chain(flags);
    let cli = crate::cli::Cli::try_parse_from(crate::cli::normalize_args(argv.map(|s| (*s).to_owned()))).unwrap();
    let crate::cli::Command::Connect(crate::cli::ConnectCommand::Envoy(args)) = cli.command else {
        panic!("not connect envoy")
    };
    *args
}

#[tokio::test]
async fn grpc_addr_takes_several_servers_of_one_scheme() {
    let addrs = |servers: &[XdsServer]| servers.iter().map(|s| s.addr.to_string()).collect::<Vec<_>>();
    let (servers, tls) = xds_targets(&envoy_args(&[])).await.unwrap();
    assert_eq!(
        (addrs(&servers), tls),
        (vec!["127.0.0.1:8502".to_owned()], None),
        "the default"
    );

    // Comma-separated, repeated, or both; in the order given.
    let args = envoy_args(&["-grpc-addr", "127.0.0.1:1,127.0.0.2:2", "--grpc-addr=[::1]:3"]);
    let (servers, tls) = xds_targets(&args).await.unwrap();
    assert_eq!(addrs(&servers), ["127.0.0.1:1", "127.0.0.2:2", "[::1]:3"]);
    assert_eq!(servers[2].host, "::1");
    assert_eq!(tls, None);

    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\n").unwrap();
    let ca = ca.to_str().unwrap();
    let args = envoy_args(&[
        "-grpc-addr",
        "https://127.0.0.1:1,https://127.0.0.2:2",
        "-grpc-ca-file",
        ca,
    ]);
    let (servers, tls) = xds_targets(&args).await.unwrap();
    assert_eq!(
        servers.iter().map(|s| s.host.as_str()).collect::<Vec<_>>(),
        ["127.0.0.1", "127.0.0.2"]
    );
    assert!(tls.is_some());

    let mixed = envoy_args(&["-grpc-addr", "127.0.0.1:1,https://127.0.0.2:2", "-grpc-ca-file", ca]);
    let err = format!("{:#}", xds_targets(&mixed).await.unwrap_err());
    assert!(
        err.starts_with("-grpc-addr 127.0.0.1:1,https://127.0.0.2:2: mixes plaintext and https://")
            && !err.contains('\n'),
        "{err}"
    );
}

#[test]
fn the_admin_is_a_unix_socket_in_the_run_dir_unless_admin_bind_asks_for_tcp() {
    let args = envoy_args(&["-run-dir", "rel/run"]);
    let dir = RunDir::new(&args, true).unwrap();
    let cwd = std::env::current_dir().unwrap();
    assert_eq!(
        dir.path,
        cwd.join("rel/run"),
        "made absolute: Envoy writes the path as given"
    );
    assert_eq!(
        admin_of(&args, Some(&dir)).unwrap(),
        AdminAddr::Unix(cwd.join("rel/run/admin.sock"))
    );
    let tcp = envoy_args(&["-admin-bind", "127.0.0.1:19000"]);
    assert_eq!(
        admin_of(&tcp, Some(&dir)).unwrap(),
        AdminAddr::Tcp("127.0.0.1:19000".parse().unwrap())
    );
    // Without -run-dir a supervised Envoy gets a private directory, removed with it.
    let temp = RunDir::new(&envoy_args(&[]), true).unwrap();
    let path = temp.path.clone();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o700);
    drop(temp);
    assert!(!path.exists());
    let long = format!("/tmp/{}", "d".repeat(80));
    let err = format!(
        "{:#}",
        RunDir::new(&envoy_args(&["-run-dir", &long]), true).err().unwrap()
    );
    assert!(err.starts_with("-run-dir: ") && err.contains("too long"), "{err}");
}

#[test]
fn a_missing_or_unusable_envoy_is_one_line_naming_envoy_binary() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let one_line = |e: anyhow::Error| {
        let text = format!("{e:#}");
        assert!(!text.contains('\n'), "{text}");
        text
    };
    // `envoy` from PATH: not there, then there.
    let err = one_line(envoy_binary("envoy".as_ref(), Some(bin.clone().into_os_string())).unwrap_err());
    assert_eq!(
        err,
        "no envoy on PATH: install Envoy, or give its path with -envoy-binary PATH"
    );
    assert!(envoy_binary("envoy".as_ref(), None).is_err(), "no PATH at all");
    let envoy = bin.join("envoy");
    std::fs::write(&envoy, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&envoy, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(
        envoy_binary("envoy".as_ref(), Some(bin.clone().into_os_string())).is_err(),
        "not executable: not the one"
    );
    std::fs::set_permissions(&envoy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = std::env::join_paths([dir.path().join("nowhere"), bin.clone()]).unwrap();
    assert_eq!(envoy_binary("envoy".as_ref(), Some(path)).unwrap(), envoy);
    // A path given: it must be an executable file.
    assert_eq!(envoy_binary(&envoy, None).unwrap(), envoy);
    let missing = dir.path().join("no-envoy");
    let err = one_line(envoy_binary(&missing, None).unwrap_err());
    assert!(
        err.starts_with("-envoy-binary ") && err.contains("no such file"),
        "{err}"
    );
    let err = one_line(envoy_binary(&bin, None).unwrap_err());
    assert!(err.contains("-envoy-binary") && err.contains("not a file"), "{err}");
    std::fs::set_permissions(&envoy, std::fs::Permissions::from_mode(0o600)).unwrap();
    let err = one_line(envoy_binary(&envoy, None).unwrap_err());
    assert!(err.contains("-envoy-binary") && err.contains("not executable"), "{err}");
}

#[test]
fn envoy_logs_warnings_unless_told_otherwise() {
    let extra = |flags: &[&str]| envoy_extra_args(&envoy_args(flags)).join(" ");
    assert_eq!(extra(&[]), "-l warn");
    assert_eq!(extra(&["-envoy-log-level", "debug"]), "-l debug");
    // An explicit level after `--` wins: Envoy refuses `-l` twice.
    assert_eq!(
        extra(&["--", "-l", "error", "--concurrency", "1"]),
        "-l error --concurrency 1"
    );
    assert_eq!(extra(&["--", "--log-level=trace"]), "--log-level=trace");
    assert_eq!(extra(&["--", "--concurrency", "1"]), "-l warn --concurrency 1");
}

#[tokio::test]
async fn a_token_file_replaced_by_rename_is_seen_and_its_neighbours_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "one\n").unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let _watcher = watch_token_file(&token, tx).unwrap();

    std::fs::write(dir.path().join("unrelated"), "x").unwrap();
    // Reading the token is what regenerating the bootstrap does: no event either.
    std::fs::read_to_string(&token).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(rx.try_recv().is_err(), "an unrelated file or a read raised an event");

    let before = token_stamp(&token);
    let staged = dir.path().join("token.tmp");
    std::fs::write(&staged, "two\n").unwrap();
    // The staging file's own events may or may not be filtered; only the rename matters.
    tokio::time::sleep(Duration::from_millis(100)).await;
    while rx.try_recv().is_ok() {}
    std::fs::rename(&staged, &token).unwrap();
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("no event for the rename")
        .unwrap();
    assert_ne!(token_stamp(&token), before, "a rename shows in the stamp");
}

#[test]
fn the_token_flag_is_a_token_and_empty_is_none() {
    assert_eq!(envoy_args(&[]).token, None);
    assert_eq!(envoy_args(&["-token", ""]).token, None);
    let args = envoy_args(&["-token", "s3cr3t"]);
    assert_eq!(args.token, Token::new("s3cr3t"));
    assert_eq!(token_of(&args).unwrap(), Token::new("s3cr3t"));
    assert!(!format!("{args:?}").contains("s3cr3t"), "flags print without the token");

    // A token file is read trimmed; an empty one is no token.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, " from-file\n").unwrap();
    let args = envoy_args(&["-token-file", file.to_str().unwrap()]);
    assert_eq!(token_of(&args).unwrap(), Token::new("from-file"));
    std::fs::write(&file, "\n").unwrap();
    assert_eq!(token_of(&args).unwrap(), None);
}
