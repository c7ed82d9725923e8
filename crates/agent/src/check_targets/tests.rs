use super::*;
use std::time::Duration;

fn http(url: &str, method: &str) -> CheckKind {
    CheckKind::Http {
        url: url.into(),
        method: method.into(),
        header: Default::default(),
        body: String::new(),
        tls_skip_verify: false,
        tls_server_name: String::new(),
        interval: Duration::from_secs(10),
        timeout: Duration::from_secs(1),
    }
}

fn tcp(addr: &str) -> CheckKind {
    CheckKind::Tcp {
        addr: addr.into(),
        interval: Duration::from_secs(10),
        timeout: Duration::from_secs(1),
    }
}

fn service(address: &str, port: u16) -> NodeService {
    NodeService {
        service: "web".into(),
        address: address.into(),
        port,
        ..NodeService::default()
    }
}

#[test]
fn cidr_blocks_parse_and_match() {
    let v4: Cidr = "10.1.0.0/16".parse().unwrap();
    assert!(v4.contains("10.1.200.3".parse().unwrap()));
    assert!(!v4.contains("10.2.0.1".parse().unwrap()));
    assert!(v4.contains("::ffff:10.1.0.9".parse().unwrap()));
    let host: Cidr = "192.168.1.5".parse().unwrap();
    assert_eq!(host.to_string(), "192.168.1.5/32");
    assert!(host.contains("192.168.1.5".parse().unwrap()) && !host.contains("192.168.1.6".parse().unwrap()));
    let all: Cidr = "0.0.0.0/0".parse().unwrap();
    assert!(all.contains("8.8.8.8".parse().unwrap()) && !all.contains("::1".parse().unwrap()));
    let v6: Cidr = "fd00::/8".parse().unwrap();
    assert!(v6.contains("fd12::1".parse().unwrap()) && !v6.contains("fe80::1".parse().unwrap()));
    assert_eq!(Cidr::parse_list("10.0.0.0/8, ::1,").unwrap().len(), 2);
    assert!(Cidr::parse_list("10.0.0.0/33").unwrap_err().contains("0 to 32"));
    assert!(
        Cidr::parse_list("example.com")
            .unwrap_err()
            .contains("not a CIDR block")
    );
}

#[test]
fn a_service_check_may_probe_its_own_address_and_port_only() {
    let rules = TargetRules {
        advertise: "10.0.0.5",
        allowed: &[],
        protected: &[],
    };
    let local = rules.owner(&service("", 8080));
    for ok in [
        http("http://127.0.0.1:8080/health", "GET"),
        http("http://localhost:8080/", "POST"),
        http("http://[::1]:8080/", "GET"),
        http("http://10.0.0.5:8080/", "PUT"),
        http("http://0.0.0.0:8080/", "GET"),
        tcp("127.0.0.2:8080"),
        tcp("[::1]:8080"),
    ] {
        rules.check(&ok, Some(&local)).unwrap();
    }
    // Another port (an Envoy admin's), another host, a name that would need resolving.
    for (bad, field) in [
        (http("http://127.0.0.1:19000/quitquitquit", "GET"), "HTTP"),
        (http("http://127.0.0.1/", "GET"), "HTTP"),
        (http("http://10.0.0.6:8080/", "GET"), "HTTP"),
        (http("http://web.internal:8080/", "GET"), "HTTP"),
        (http("http://127.0.0.1.nip.io:8080/", "GET"), "HTTP"),
        (tcp("127.0.0.1:19000"), "TCP"),
        (http("http://127.0.0.1:19000/quitquitquit", "POST"), "Method"),
    ] {
        let e = rules.check(&bad, Some(&local)).unwrap_err();
        assert_eq!(e.field, field, "{bad:?}: {e}");
    }
    let e = rules
        .check(&http("http://127.0.0.1:19000/x", "GET"), Some(&local))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "HTTP: 127.0.0.1:19000 is not the service's own port on this host (10.0.0.5, or loopback, port \
         8080), and not in the agent's -check-allowed-targets (none)"
    );
    // A service registered with the advertise address or a loopback one runs here too.
    for address in ["10.0.0.5", "127.0.0.1", "localhost"] {
        let here = rules.owner(&service(address, 8080));
        rules
            .check(&http("http://localhost:8080/", "POST"), Some(&here))
            .unwrap();
        rules.check(&tcp("10.0.0.5:8080"), Some(&here)).unwrap();
    }
    // A service at another address owns nothing unless the allowlist covers that address:
    // a registration cannot claim a metadata endpoint or another host to probe it.
    for address in ["10.9.9.9", "169.254.169.254", "metadata.google.internal"] {
        let elsewhere = rules.owner(&service(address, 80));
        let e = rules
            .check(&http(&format!("http://{address}/"), "GET"), Some(&elsewhere))
            .unwrap_err();
        assert!(e.to_string().contains("off this host"), "{e}");
        assert!(
            rules
                .check(&http("http://127.0.0.1/", "GET"), Some(&elsewhere))
                .is_err()
        );
    }
    let allowed = Cidr::parse_list("10.9.0.0/16").unwrap();
    let with = TargetRules {
        allowed: &allowed,
        ..rules
    };
    let remote = with.owner(&service("10.9.9.9", 80));
    with.check(&http("http://10.9.9.9/", "POST"), Some(&remote)).unwrap();
    assert!(with.check(&http("http://10.9.9.9:81/", "POST"), Some(&remote)).is_err());
    // No port, nothing of its own.
    let portless = rules.owner(&service("", 0));
    assert!(rules.check(&tcp("127.0.0.1:80"), Some(&portless)).is_err());
    // TTL and alias checks have no target.
    rules.check(&CheckKind::Ttl(Duration::from_secs(1)), None).unwrap();
}

#[test]
fn the_allowlist_opens_gets_and_node_checks_but_never_other_methods() {
    let allowed: Vec<Cidr> = Cidr::parse_list("127.0.0.1/32,10.2.0.0/16").unwrap();
    let rules = TargetRules {
        advertise: "127.0.0.1",
        allowed: &allowed,
        protected: &[],
    };
    let local = rules.owner(&service("", 8080));
    rules
        .check(&http("http://127.0.0.1:19000/stats", "GET"), Some(&local))
        .unwrap();
    rules
        .check(&http("http://localhost:19000/stats", "HEAD"), Some(&local))
        .unwrap();
    rules.check(&tcp("10.2.3.4:5432"), None).unwrap();
    let e = rules
        .check(&http("http://127.0.0.1:19000/quitquitquit", "POST"), Some(&local))
        .unwrap_err();
    assert_eq!(e.field, "Method");
    assert!(rules.check(&http("http://10.2.3.4/", "DELETE"), None).is_err());
    // Without the allowlist, a node check may probe nothing.
    let closed = TargetRules {
        advertise: "127.0.0.1",
        allowed: &[],
        protected: &[],
    };
    let e = closed.check(&tcp("127.0.0.1:22"), None).unwrap_err();
    assert!(e.to_string().contains("a node check may only probe"), "{e}");
}

#[test]
fn a_port_shared_with_another_service_is_not_the_service_own() {
    let rules = TargetRules {
        advertise: "127.0.0.1",
        allowed: &[],
        protected: &[],
    };
    let web = rules.owner(&service("", 9000));
    let api = rules.owner(&service("127.0.0.1", 9000));
    assert!(web.same_place(&api));
    assert!(!web.same_place(&rules.owner(&service("", 9001))));
    let shared = web.shared_with(Some("api".into()));
    let e = rules
        .check(&http("http://127.0.0.1:9000/secrets", "GET"), Some(&shared))
        .unwrap_err();
    assert!(e.to_string().contains("also those of service \"api\""), "{e}");
}

#[test]
fn the_agent_own_listeners_are_never_targets() {
    let allowed = Cidr::parse_list("0.0.0.0/0").unwrap();
    let listeners: Vec<std::net::SocketAddr> = vec!["127.0.0.1:8500".parse().unwrap(), "0.0.0.0:8502".parse().unwrap()];
    let rules = TargetRules {
        advertise: "10.0.0.5",
        allowed: &allowed,
        protected: &listeners,
    };
    // Even as the service's own port (a registration claiming the agent's port).
    let claims = rules.owner(&service("", 8500));
    for (kind, field) in [
        (
            http("http://127.0.0.1:8500/v1/agent/service/deregister/api", "PUT"),
            "HTTP",
        ),
        (http("http://localhost:8500/v1/agent/self", "GET"), "HTTP"),
        (tcp("10.0.0.5:8502"), "TCP"),
    ] {
        let e = rules.check(&kind, Some(&claims)).unwrap_err();
        assert_eq!(e.field, field);
        assert!(e.to_string().contains("this agent's own listener"), "{e}");
    }
    rules.check(&tcp("10.0.0.7:8500"), None).unwrap();
}
