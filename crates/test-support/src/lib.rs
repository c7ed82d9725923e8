//! What meshd's tests, benchmarks and examples share, so no test crate keeps its own copy:
//!
//! - [`envoy`]: the pinned Envoy (fails loudly when missing: tests never skip) and base ids
//!   no other Envoy on the host uses;
//! - [`ReservedPort`]: a port held for a process that will bind it later (Envoy listeners),
//!   without the race of "bind, read the port, release";
//! - [`http`]: tiny HTTP backends bound on `127.0.0.1:0` and a one-request client;
//! - [`fixtures`]: catalog values the tests build again and again;
//! - [`process`]: the real `meshd server` on ephemeral ports;
//! - [`etcd`]: a real etcd cluster (the pinned etcd, `MESHD_ETCD`) whose members can be
//!   killed and restarted;
//! - [`figures`]: percentiles and units for benchmark output.
//!
//! Test code: panics are the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[cfg(feature = "ads")]
pub mod ads;
pub mod etcd;
pub mod figures;
pub mod fixtures;
pub mod http;
pub mod process;

use socket2::{Domain, Socket, Type};
use std::net::SocketAddr;
use std::path::PathBuf;

/// The pinned Envoy, installed into `.tools/` and named by `cargo xtask test` in
/// `MESHD_ENVOY`, as its canonical path (what `/proc/PID/exe` of a running Envoy reads, even
/// when `.tools` is a link). Panics when missing: tests that need it never skip.
pub fn envoy() -> PathBuf {
    std::env::var_os("MESHD_ENVOY")
        .and_then(|p| std::fs::canonicalize(p).ok())
        .expect(
            "MESHD_ENVOY must name the pinned Envoy binary: run the tests with `cargo xtask test`, which installs it",
        )
}

/// The Python with the pinned clients (grpcio), from `MESHD_PYTHON`; fails loudly when unset.
pub fn python() -> PathBuf {
    std::env::var_os("MESHD_PYTHON").map(PathBuf::from).expect(
        "MESHD_PYTHON must name the virtualenv's Python with the pinned clients: run the tests with `cargo xtask test`, which installs it",
    )
}

/// A hot-restart base id no other Envoy on this host uses: derived from this process and a
/// slot (each test of one process takes its own slot).
pub fn base_id(slot: u32) -> u32 {
    20_000_000 + (std::process::id() % 1_000_000) * 8 + slot
}

/// A loopback port held for a process that binds it later (an Envoy listener, whose port
/// must be known before Envoy starts). The socket is bound with `SO_REUSEADDR` but never
/// listens: the kernel never hands the port out to an ephemeral (`:0`) bind or to a bind
/// without `SO_REUSEADDR`, while a listener that asks for the port with `SO_REUSEADDR`, as
/// Envoy's do, gets it. Hold it until that process listens; drop it after.
#[derive(Debug)]
pub struct ReservedPort {
    socket: Socket,
    port: u16,
}

impl ReservedPort {
    /// Reserves a free port on 127.0.0.1.
    pub fn new() -> Self {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("creating a socket");
        socket.set_reuse_address(true).expect("setting SO_REUSEADDR");
        let any: SocketAddr = ([127, 0, 0, 1], 0).into();
        socket.bind(&any.into()).expect("binding 127.0.0.1:0");
        let port = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map(|a| a.port())
            .expect("reading the reserved port");
        Self { socket, port }
    }

    /// The reserved port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether the reservation is still held (it is until dropped).
    pub fn is_held(&self) -> bool {
        self.socket.local_addr().is_ok()
    }
}

/// Reservations held until the test process exits.
static HELD: parking_lot::Mutex<Vec<ReservedPort>> = parking_lot::Mutex::new(Vec::new());

/// Reserves a free loopback port for the rest of this test process (see [`ReservedPort`]):
/// for tests that hand ports to Envoys they start and stop along the way.
pub fn reserve_port() -> u16 {
    let reserved = ReservedPort::new();
    let port = reserved.port();
    HELD.lock().push(reserved);
    port
}

impl Default for ReservedPort {
    fn default() -> Self {
        Self::new()
    }
}

/// Asserts that `dir` and everything below it is its owner's only: directories `0700`,
/// files `0600` (or narrower); sockets may be narrower still. Returns how many files it
/// looked at, so a caller can tell an empty tree from a checked one.
pub fn assert_private_tree(dir: &std::path::Path) -> usize {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir).expect("the tree's root").permissions().mode() & 0o777;
    assert_eq!(
        mode & 0o077,
        0,
        "{} is {mode:o}: group or others may enter",
        dir.display()
    );
    let mut files = 0;
    for entry in std::fs::read_dir(dir).expect("listing the tree").flatten() {
        let meta = entry.metadata().expect("an entry's metadata");
        if meta.file_type().is_symlink() {
            continue;
        }
        if meta.is_dir() {
            files += assert_private_tree(&entry.path());
            continue;
        }
        let mode = meta.permissions().mode() & 0o777;
        assert_eq!(
            mode & 0o077,
            0,
            "{} is {mode:o}: group or others may read it",
            entry.path().display()
        );
        files += 1;
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserved_port_is_refused_to_others_and_given_to_a_reuseaddr_listener() {
        let reserved = ReservedPort::new();
        assert!(reserved.is_held());
        let addr: SocketAddr = ([127, 0, 0, 1], reserved.port()).into();
        let plain = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        assert!(
            plain.bind(&addr.into()).is_err(),
            "a bind without SO_REUSEADDR is refused"
        );
        let any: SocketAddr = ([127, 0, 0, 1], 0).into();
        let ephemeral: Vec<std::net::TcpListener> =
            (0..200).map(|_| std::net::TcpListener::bind(any).unwrap()).collect();
        assert!(
            ephemeral
                .iter()
                .all(|l| l.local_addr().unwrap().port() != reserved.port()),
            "no ephemeral bind is given the reserved port"
        );
        let envoy_like = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        envoy_like.set_reuse_address(true).unwrap();
        envoy_like.bind(&addr.into()).unwrap();
        envoy_like.listen(16).unwrap();
        let _client = std::net::TcpStream::connect(addr).unwrap();
        assert!(envoy_like.accept().is_ok(), "the listener gets the connections");
    }
}
