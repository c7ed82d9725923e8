use super::*;

fn norm(args: &[&str]) -> Vec<String> {
    normalize_args(args.iter().map(|s| (*s).to_owned()))
}

#[test]
fn single_dash_long_flags_become_double_dash() {
    assert_eq!(
        norm(&[
            "meshd",
            "server",
            "-data-dir=/x",
            "-dev",
            "--http-addr",
            "127.0.0.1:0",
            "-h",
            "-"
        ]),
        vec![
            "meshd",
            "server",
            "--data-dir=/x",
            "--dev",
            "--http-addr",
            "127.0.0.1:0",
            "-h",
            "-"
        ]
    );
    assert_eq!(
        norm(&["meshd", "connect", "--", "-log-level"]),
        vec!["meshd", "connect", "--", "-log-level"]
    );
}

#[cfg(feature = "agent")]
#[test]
fn parses_agent_flags_in_both_spellings() {
    let cli = Cli::try_parse_from(norm(&[
        "meshd",
        "agent",
        "-dev",
        "-retry-join",
        "127.0.0.1:1",
        "--retry-join=127.0.0.1:2",
        "-config-file",
        "a.json",
        "-leave-on-terminate=false",
        "-http-addr",
        "127.0.0.1:0",
    ]))
    .unwrap();
    let Command::Agent(args) = cli.command else {
        panic!("not agent")
    };
    assert!(args.dev);
    assert_eq!(args.retry_join, ["127.0.0.1:1", "127.0.0.1:2"]);
    assert_eq!(args.leave_on_terminate, Some(false));
    assert_eq!(args.config_file, [PathBuf::from("a.json")]);
    let cli = Cli::try_parse_from(norm(&["meshd", "agent", "-leave-on-terminate"])).unwrap();
    let Command::Agent(args) = cli.command else {
        panic!("not agent")
    };
    assert_eq!(args.leave_on_terminate, Some(true));
    assert_eq!(args.node, None);
}

#[test]
fn parses_server_flags_in_both_spellings() {
    let cli = Cli::try_parse_from(norm(&[
        "meshd",
        "server",
        "-dev",
        "-http-addr",
        "127.0.0.1:0",
        "--datacenter=dc9",
    ]))
    .unwrap();
    let Command::Server(args) = cli.command else {
        panic!("not server")
    };
    assert!(args.dev);
    assert_eq!(args.http_addr.0.map(|a| a.port()), Some(0));
    assert_eq!(args.datacenter, "dc9");
    assert!(Cli::try_parse_from(norm(&["meshd", "server", "-http-addr", "nonsense"])).is_err());
    let cli = Cli::try_parse_from(norm(&[
        "meshd",
        "server",
        "-dev",
        "-http-addr",
        "off",
        "-grpc-addr",
        "off",
    ]))
    .unwrap();
    let Command::Server(args) = cli.command else {
        panic!("not server")
    };
    assert_eq!((args.http_addr, args.grpc_addr), (Listen(None), Listen(None)));
    let cli = Cli::try_parse_from(norm(&[
        "meshd",
        "connect",
        "envoy",
        "-sidecar-for",
        "web",
        "-bootstrap",
        "--",
        "--base-id",
        "7",
    ]))
    .unwrap();
    let Command::Connect(ConnectCommand::Envoy(args)) = cli.command else {
        panic!("not connect envoy")
    };
    assert_eq!(args.sidecar_for.as_deref(), Some("web"));
    assert!(args.bootstrap);
    assert_eq!(args.envoy_args, vec!["--base-id", "7"]);
}

#[cfg(feature = "server")]
#[test]
fn parses_tls_flags_and_grpc_addresses() {
    let cli = Cli::try_parse_from(norm(&[
        "meshd",
        "server",
        "-dev",
        "-https-addr",
        "127.0.0.1:0",
        "-grpc-tls-addr=127.0.0.1:0",
        "-tls-cert-file",
        "c.pem",
        "-tls-key-file",
        "k.pem",
        "-tls-ca-file",
        "ca.pem",
        "-tls-verify-incoming",
    ]))
    .unwrap();
    let Command::Server(args) = cli.command else {
        panic!("not server")
    };
    assert_eq!(args.tls.https_addr.map(|a| a.port()), Some(0));
    assert!(args.tls.grpc_tls_addr.is_some() && args.tls.verify_incoming);
    assert_eq!(args.tls.key_file, Some(PathBuf::from("k.pem")));

    let parse = |s: &str| s.parse::<GrpcAddr>();
    let plain = parse("127.0.0.1:8502").unwrap();
    assert_eq!((plain.tls, plain.host.as_str(), plain.port), (false, "127.0.0.1", 8502));
    assert_eq!(parse("http://127.0.0.1:8502").unwrap(), plain);
    let tls = parse("https://server.dc1.meshd:8503").unwrap();
    assert_eq!((tls.tls, tls.host.as_str(), tls.port), (true, "server.dc1.meshd", 8503));
    assert_eq!(tls.to_string(), "https://server.dc1.meshd:8503");
    let v6 = parse("https://[::1]:8503/").unwrap();
    assert_eq!(
        (v6.host.as_str(), v6.to_string()),
        ("::1", "https://[::1]:8503".to_owned())
    );
    for bad in ["127.0.0.1", "https://:1", "https://h:port", "https://u@h:1"] {
        assert!(parse(bad).is_err(), "{bad}");
    }

    let cli = Cli::try_parse_from(norm(&[
        "meshd",
        "tls",
        "cert",
        "create",
        "-server",
        "-dc",
        "dc2",
        "-additional-dnsname",
        "a.example",
        "-additional-ipaddress",
        "10.0.0.1",
    ]))
    .unwrap();
    let Command::Tls(TlsCommand::Cert(TlsCertCommand::Create(args))) = cli.command else {
        panic!("not tls cert create")
    };
    assert!(args.server && !args.client);
    assert_eq!(args.dc, "dc2");
    assert_eq!(
        args.additional_ipaddress,
        ["10.0.0.1".parse::<std::net::IpAddr>().unwrap()]
    );
    assert!(
        Cli::try_parse_from(norm(&["meshd", "tls", "cert", "create"])).is_err(),
        "-server or -client"
    );
    assert!(Cli::try_parse_from(norm(&["meshd", "tls", "cert", "create", "-server", "-client"])).is_err());
}
