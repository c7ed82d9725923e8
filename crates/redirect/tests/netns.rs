//! The rules installed in a real network namespace (made by the test with `ip netns`):
//! what they redirect and what they leave alone, checked with real connections.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use redirect::{Ipv4Cidr, Rules};
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A network namespace of this test's own, deleted when dropped.
struct Netns {
    name: String,
    path: PathBuf,
    /// The outbound listener (127.0.0.1:15001 inside), bound once: binding it again for
    /// each dial could meet the last dial's connection still closing on that port.
    outbound: std::sync::OnceLock<TcpListener>,
}

impl Netns {
    fn new(tag: &str) -> Self {
        let name = format!("meshd-redirect-{tag}-{}", std::process::id());
        let ok = |args: &[&str]| {
            let out = Command::new("ip")
                .args(args)
                .output()
                .expect("ip (iproute2) is needed to make namespaces");
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        ok(&["netns", "add", &name]);
        ok(&["-n", &name, "link", "set", "lo", "up"]);
        let path = PathBuf::from("/var/run/netns").join(&name);
        Self {
            name,
            path,
            outbound: std::sync::OnceLock::new(),
        }
    }

    /// The namespace's outbound listener, bound on first use.
    fn outbound(&self) -> &TcpListener {
        self.outbound.get_or_init(|| {
            self.run(|| {
                let listener = TcpListener::bind("127.0.0.1:15001").unwrap();
                listener.set_nonblocking(true).unwrap();
                listener
            })
        })
    }

    /// Runs `f` on a thread inside the namespace.
    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                let fd = std::fs::File::open(&self.path).unwrap();
                rustix::thread::move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&fd),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .unwrap();
                f()
            })
            .join()
            .unwrap()
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

fn rules(proxy_uid: u32) -> Rules {
    Rules {
        proxy_uid,
        inbound_port: 21000,
        outbound_port: 15001,
        exclude_inbound_ports: vec![19000],
        exclude_outbound_ports: vec![9999],
        exclude_outbound_cidrs: vec!["127.0.0.3/32".parse().unwrap()],
        exclude_uids: vec![4343],
        dns: Some(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8600)),
    }
}

/// Dials `to` inside the namespace with the outbound listener on 127.0.0.1:15001: the
/// address the listener saw dialed, or `None` when the connection went elsewhere (refused:
/// nothing listens at `to`).
fn dial(ns: &Netns, to: SocketAddrV4) -> Option<SocketAddrV4> {
    let listener = ns.outbound();
    ns.run(|| match TcpStream::connect(to) {
        Ok(_conn) => {
            let (accepted, _) = listener.accept().expect("redirected to the outbound listener");
            Some(rustix::net::sockopt::ip_original_dst(&accepted).unwrap())
        }
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => None,
        Err(e) => panic!("connect {to}: {e}"),
    })
}

#[test]
fn outbound_tcp_goes_to_the_outbound_listener_except_what_is_excluded() {
    let ns = Netns::new("out");
    let path = Some(ns.path.as_path());
    assert_eq!(redirect::installed(path).unwrap(), None);
    // This test runs as root (uid 0): a proxy of another uid, so our traffic is the app's.
    redirect::apply(&rules(4242), path).unwrap();
    assert_eq!(
        redirect::installed(path).unwrap(),
        Some(redirect::rule_count(&rules(4242)))
    );
    let target = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 80);
    assert_eq!(dial(&ns, target), Some(target), "the original destination is kept");
    // Left alone: loopback 127.0.0.1, an excluded port, an excluded network.
    assert_eq!(dial(&ns, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 80)), None);
    assert_eq!(dial(&ns, SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 9999)), None);
    assert_eq!(dial(&ns, SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 3), 80)), None);
    // The rules live in that namespace only.
    assert_eq!(redirect::installed(None).unwrap(), None);
}

#[test]
fn the_proxy_user_is_never_redirected() {
    let ns = Netns::new("uid");
    let path = Some(ns.path.as_path());
    redirect::apply(&rules(0), path).unwrap();
    assert_eq!(dial(&ns, SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 80)), None);
    let mut excluded = rules(4242);
    excluded.exclude_uids = vec![0];
    redirect::apply(&excluded, path).unwrap();
    assert_eq!(dial(&ns, SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 80)), None);
}

#[test]
fn applying_is_idempotent_and_remove_deletes_everything() {
    let ns = Netns::new("idem");
    let path = Some(ns.path.as_path());
    let mut r = rules(4242);
    redirect::apply(&r, path).unwrap();
    redirect::apply(&r, path).unwrap();
    assert_eq!(redirect::installed(path).unwrap(), Some(redirect::rule_count(&r)));
    // A new set replaces the old one whole.
    r.exclude_outbound_ports = vec![1, 2, 3];
    r.dns = None;
    redirect::apply(&r, path).unwrap();
    assert_eq!(redirect::installed(path).unwrap(), Some(redirect::rule_count(&r)));
    assert!(redirect::remove(path).unwrap());
    assert_eq!(redirect::installed(path).unwrap(), None);
    assert!(!redirect::remove(path).unwrap(), "nothing left to remove");
    let target = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 80);
    assert_eq!(dial(&ns, target), None, "nothing is redirected after -remove");
}

#[test]
fn a_missing_namespace_is_named() {
    let e = redirect::apply(&rules(1), Some(Path::new("/var/run/netns/meshd-no-such-ns"))).unwrap_err();
    assert!(e.to_string().contains("meshd-no-such-ns"), "{e}");
}

#[test]
fn cidrs_parse_or_say_why() {
    let c: Ipv4Cidr = "10.1.2.3/8".parse().unwrap();
    assert_eq!(c.prefix, 8);
    assert!("10.0.0.0/33".parse::<Ipv4Cidr>().unwrap_err().contains("at most 32"));
    assert!("fd00::/8".parse::<Ipv4Cidr>().unwrap_err().contains("IPv4"));
    assert_eq!("10.0.0.1".parse::<Ipv4Cidr>().unwrap().prefix, 32);
}

/// A connection open before the rules keeps working after them: only a connection's first
/// packet is redirected (the kernel starts tracking the namespace's connections with the
/// rules, and would otherwise take the next packet of this one for a new connection).
#[test]
fn connections_open_before_the_rules_are_left_alone() {
    use std::io::{Read, Write};
    let ns = Netns::new("open");
    let path = Some(ns.path.as_path());
    ns.run(|| {
        let listener = TcpListener::bind("127.0.0.2:7000").unwrap();
        let mut client = TcpStream::connect("127.0.0.2:7000").unwrap();
        let (mut server, _) = listener.accept().unwrap();
        for s in [&client, &server] {
            s.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        }
        redirect::apply(&rules(4242), None).unwrap();
        client.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        server.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
        server.write_all(b"pong").unwrap();
        client.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"pong");
    });
    assert!(redirect::remove(path).unwrap());
}
