//! Traffic redirection for transparent proxies: the NAT rules that send a network
//! namespace's TCP traffic through its sidecar, installed as one nftables table (`ip
//! meshd`) over netlink — no `iptables` or `nft` binary, no C library.
//!
//! - **Inbound** (`prerouting`): TCP arriving for any port but the excluded ones is
//!   redirected to the proxy's public listener (`inbound_port`), which applies mTLS and
//!   intentions before the application sees it.
//! - **Outbound** (`output`): TCP the application opens is redirected to the proxy's
//!   outbound listener (`outbound_port`, 15001 by default), whose `original_dst` filter
//!   recovers the address dialed. Left alone: the proxy's own traffic (`proxy_uid`) and the
//!   excluded users', loopback `127.0.0.1`, the excluded ports and CIDRs.
//! - **DNS** (optional): UDP and TCP to port 53 go to meshd's DNS interface instead.
//!
//! The whole table is replaced in one netlink transaction, so applying is idempotent and a
//! namespace never holds half a rule set; [`remove`] deletes it. Applying needs
//! `CAP_NET_ADMIN` in the namespace.

mod netlink;

use netlink::*;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};

/// The nftables table meshd owns (family `ip`).
pub const TABLE: &str = "meshd";

/// The outbound listener's port when none is given (Envoy's `outbound_listener`).
pub const DEFAULT_OUTBOUND_PORT: u16 = 15001;

const PREROUTING: &str = "prerouting";
const OUTPUT: &str = "output";
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;

/// An IPv4 network: an address and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Cidr {
    /// The network's address (host bits are ignored).
    pub addr: Ipv4Addr,
    /// The prefix length, 0 to 32.
    pub prefix: u8,
}

impl std::str::FromStr for Ipv4Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, p.parse::<u8>().map_err(|_| format!("{s:?}: bad prefix length"))?),
            None => (s, 32),
        };
        let addr = addr
            .parse::<Ipv4Addr>()
            .map_err(|_| format!("{s:?} is not an IPv4 address or CIDR (IPv6 is not redirected)"))?;
        if prefix > 32 {
            return Err(format!("{s:?}: the prefix length is at most 32"));
        }
        Ok(Self { addr, prefix })
    }
}

impl Ipv4Cidr {
    fn mask(&self) -> [u8; 4] {
        let bits = if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.prefix))
        };
        bits.to_be_bytes()
    }

    fn network(&self) -> [u8; 4] {
        let m = self.mask();
        let a = self.addr.octets();
        [a[0] & m[0], a[1] & m[1], a[2] & m[2], a[3] & m[3]]
    }
}

/// What to redirect, and what to leave alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// The user the proxy (Envoy) runs as: its own connections are never redirected.
    pub proxy_uid: u32,
    /// The proxy's public listener port: inbound TCP goes there.
    pub inbound_port: u16,
    /// The proxy's outbound listener port: outbound TCP goes there.
    pub outbound_port: u16,
    /// Inbound ports left alone (the proxy's own admin or metrics ports, say).
    pub exclude_inbound_ports: Vec<u16>,
    /// Outbound destination ports left alone.
    pub exclude_outbound_ports: Vec<u16>,
    /// Outbound destination networks left alone.
    pub exclude_outbound_cidrs: Vec<Ipv4Cidr>,
    /// Users whose connections are left alone (beside the proxy's).
    pub exclude_uids: Vec<u32>,
    /// Where DNS queries (port 53, UDP and TCP) go instead, when given: meshd's DNS.
    pub dns: Option<SocketAddrV4>,
}

/// Why rules could not be applied, removed or read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The network namespace could not be entered.
    #[error("network namespace {path}: {source}")]
    Netns {
        /// The namespace's path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The netlink socket failed.
    #[error("netlink: {0}")]
    Io(#[from] std::io::Error),
    /// The kernel refused the change.
    #[error("the kernel refused {what}: {source}{hint}")]
    Refused {
        /// What was asked.
        what: &'static str,
        /// The kernel's errno.
        source: std::io::Error,
        /// What usually causes it.
        hint: &'static str,
    },
}

fn refused(what: &'static str, errno: i32) -> Error {
    let hint = match errno {
        1 => " (needs CAP_NET_ADMIN in the network namespace: run as root)",
        2 | 93 | 95 => " (the kernel lacks nftables NAT: nf_tables, nft_nat, nft_redir)",
        _ => "",
    };
    Error::Refused {
        what,
        source: std::io::Error::from_raw_os_error(errno),
        hint,
    }
}

/// Runs `f` in the network namespace at `netns` (a `/proc/PID/ns/net` or `ip netns` path),
/// or in this one: on a thread of its own, which alone enters the namespace.
fn in_netns<T: Send>(netns: Option<&Path>, f: impl FnOnce() -> Result<T, Error> + Send) -> Result<T, Error> {
    let Some(path) = netns else { return f() };
    std::thread::scope(|s| {
        s.spawn(|| {
            let enter = || -> std::io::Result<()> {
                let fd = rustix::fs::open(
                    path,
                    rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )?;
                rustix::thread::move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&fd),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )?;
                Ok(())
            };
            enter().map_err(|source| Error::Netns {
                path: path.to_owned(),
                source,
            })?;
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(Error::Io(std::io::Error::other("the namespace thread panicked"))))
    })
}

/// Installs `rules`, replacing any earlier set in the namespace, in one transaction.
pub fn apply(rules: &Rules, netns: Option<&Path>) -> Result<(), Error> {
    in_netns(netns, || {
        let socket = Socket::open()?;
        let batch = ruleset(rules);
        let acks = batch.acked;
        let answer = socket.request(&batch.end(), acks)?;
        match answer.error {
            Some((errno, _)) => Err(refused("the redirection rules", errno)),
            None => Ok(()),
        }
    })
}

/// Removes the rules; `false` when there were none.
pub fn remove(netns: Option<&Path>) -> Result<bool, Error> {
    in_netns(netns, || {
        let socket = Socket::open()?;
        if !table_exists(&socket)? {
            return Ok(false);
        }
        let mut batch = Batch::new();
        let at = batch.message(NFT_MSG_DELTABLE, 0, NFPROTO_IPV4);
        batch.str(NFTA_TABLE_NAME, TABLE);
        batch.finish(at);
        let acks = batch.acked;
        match socket.request(&batch.end(), acks)?.error {
            Some((2, _)) => Ok(false),
            Some((errno, _)) => Err(refused("removing the redirection rules", errno)),
            None => Ok(true),
        }
    })
}

/// The number of rules installed in the namespace, `None` when meshd's table is absent.
pub fn installed(netns: Option<&Path>) -> Result<Option<usize>, Error> {
    in_netns(netns, || {
        let socket = Socket::open()?;
        if !table_exists(&socket)? {
            return Ok(None);
        }
        let (mut q, at) = Batch::query(NFT_MSG_GETRULE, NLM_F_DUMP, NFPROTO_IPV4);
        q.str(NFTA_RULE_TABLE, TABLE);
        q.finish(at);
        let answer = socket.request(&q.bytes(), 0)?;
        if let Some((errno, _)) = answer.error {
            return Err(refused("listing the rules", errno));
        }
        Ok(Some(answer.messages.iter().filter(|t| **t == NFT_MSG_NEWRULE).count()))
    })
}

fn table_exists(socket: &Socket) -> Result<bool, Error> {
    let (mut q, at) = Batch::query(NFT_MSG_GETTABLE, NLM_F_ACK, NFPROTO_IPV4);
    q.str(NFTA_TABLE_NAME, TABLE);
    q.finish(at);
    let answer = socket.request(&q.bytes(), 1)?;
    match answer.error {
        None => Ok(true),
        Some((2, _)) => Ok(false),
        Some((errno, _)) => Err(refused("reading the nftables tables", errno)),
    }
}

/// The transaction that replaces the table with `rules`.
fn ruleset(rules: &Rules) -> Batch {
    let mut b = Batch::new();
    // Create (if absent), delete, create: the old set goes whatever it held.
    for ty in [NFT_MSG_NEWTABLE, NFT_MSG_DELTABLE, NFT_MSG_NEWTABLE] {
        let flags = if ty == NFT_MSG_NEWTABLE { NLM_F_CREATE } else { 0 };
        let at = b.message(ty, flags, NFPROTO_IPV4);
        b.str(NFTA_TABLE_NAME, TABLE);
        b.finish(at);
    }
    for (name, hook) in [(PREROUTING, HOOK_PREROUTING), (OUTPUT, HOOK_OUTPUT)] {
        let at = b.message(NFT_MSG_NEWCHAIN, NLM_F_CREATE | NLM_F_EXCL, NFPROTO_IPV4);
        b.str(NFTA_CHAIN_TABLE, TABLE);
        b.str(NFTA_CHAIN_NAME, name);
        let h = b.nest(NFTA_CHAIN_HOOK);
        b.u32(NFTA_HOOK_HOOKNUM, hook);
        b.u32(NFTA_HOOK_PRIORITY, PRIORITY_DSTNAT as u32);
        b.finish_nested(h);
        b.str(NFTA_CHAIN_TYPE, "nat");
        b.finish(at);
    }
    inbound(&mut b, rules);
    outbound(&mut b, rules);
    b
}

/// Appends one rule to `chain`, its expressions written by `exprs`.
fn rule(b: &mut Batch, chain: &str, exprs: impl FnOnce(&mut Batch)) {
    let at = b.message(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, NFPROTO_IPV4);
    b.str(NFTA_RULE_TABLE, TABLE);
    b.str(NFTA_RULE_CHAIN, chain);
    let e = b.nest(NFTA_RULE_EXPRESSIONS);
    exprs(b);
    b.finish_nested(e);
    b.finish(at);
}

/// `meta l4proto <proto>`.
fn l4proto(b: &mut Batch, proto: u8) {
    b.meta(META_L4PROTO, REG_1);
    b.cmp(REG_1, CMP_EQ, &[proto]);
}

/// `<proto> dport <port>`.
fn dport(b: &mut Batch, proto: u8, port: u16) {
    l4proto(b, proto);
    b.payload(PAYLOAD_TRANSPORT, 2, 2, REG_1);
    b.cmp(REG_1, CMP_EQ, &port.to_be_bytes());
}

/// `tcp flags & (syn | ack) == syn`: the first packet of a connection. Connections already
/// open when the rules arrive are left alone: the kernel only starts tracking a namespace's
/// connections once NAT rules exist, so it would take a later packet of such a connection
/// for a new one, and redirecting it would reset the connection (an agent's link to its
/// servers, say).
fn opening(b: &mut Batch) {
    b.payload(PAYLOAD_TRANSPORT, 13, 1, REG_1);
    b.mask(REG_1, &[TCP_SYN | TCP_ACK]);
    b.cmp(REG_1, CMP_EQ, &[TCP_SYN]);
}

/// `meta l4proto tcp` on a connection's first packet: `redirect to :<port>`.
fn redirect_tcp(b: &mut Batch, port: u16) {
    l4proto(b, IPPROTO_TCP);
    opening(b);
    b.immediate(REG_1, &port.to_be_bytes());
    b.redirect(REG_1);
}

fn inbound(b: &mut Batch, rules: &Rules) {
    for port in &rules.exclude_inbound_ports {
        rule(b, PREROUTING, |b| {
            dport(b, IPPROTO_TCP, *port);
            b.verdict(VERDICT_RETURN);
        });
    }
    rule(b, PREROUTING, |b| redirect_tcp(b, rules.inbound_port));
}

fn outbound(b: &mut Batch, rules: &Rules) {
    for uid in std::iter::once(&rules.proxy_uid).chain(&rules.exclude_uids) {
        rule(b, OUTPUT, |b| {
            b.meta(META_SKUID, REG_1);
            // Meta values are in host byte order.
            b.cmp(REG_1, CMP_EQ, &uid.to_ne_bytes());
            b.verdict(VERDICT_RETURN);
        });
    }
    if let Some(dns) = rules.dns {
        for proto in [IPPROTO_UDP, IPPROTO_TCP] {
            rule(b, OUTPUT, |b| {
                dport(b, proto, 53);
                if proto == IPPROTO_TCP {
                    opening(b);
                }
                b.immediate(REG_1, &dns.ip().octets());
                b.immediate(REG_2, &dns.port().to_be_bytes());
                b.dnat(REG_1, REG_2);
            });
        }
    }
    rule(b, OUTPUT, |b| {
        b.payload(PAYLOAD_NETWORK, 16, 4, REG_1);
        b.cmp(REG_1, CMP_EQ, &Ipv4Addr::LOCALHOST.octets());
        b.verdict(VERDICT_RETURN);
    });
    for port in &rules.exclude_outbound_ports {
        rule(b, OUTPUT, |b| {
            dport(b, IPPROTO_TCP, *port);
            b.verdict(VERDICT_RETURN);
        });
    }
    for cidr in &rules.exclude_outbound_cidrs {
        rule(b, OUTPUT, |b| {
            b.payload(PAYLOAD_NETWORK, 16, 4, REG_1);
            b.mask(REG_1, &cidr.mask());
            b.cmp(REG_1, CMP_EQ, &cidr.network());
            b.verdict(VERDICT_RETURN);
        });
    }
    rule(b, OUTPUT, |b| redirect_tcp(b, rules.outbound_port));
}

/// How many rules `rules` installs (for checks against [`installed`]).
pub fn rule_count(rules: &Rules) -> usize {
    let dns = if rules.dns.is_some() { 2 } else { 0 };
    rules.exclude_inbound_ports.len()
        + 1
        + 1
        + rules.exclude_uids.len()
        + dns
        + 1
        + rules.exclude_outbound_ports.len()
        + rules.exclude_outbound_cidrs.len()
        + 1
}
