//! The nftables netlink protocol, as much of it as the redirection rules use: messages
//! and attributes written into one buffer (a batch the kernel applies atomically), and
//! the kernel's acknowledgements read back.
//!
//! Constants are the kernel's uapi values (`linux/netlink.h`, `linux/netfilter/nfnetlink.h`,
//! `linux/netfilter/nf_tables.h`); integers in nftables attributes are big-endian.

use rustix::fd::OwnedFd;
use rustix::net::netlink::{self, SocketAddrNetlink};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketType, sockopt};
use std::time::Duration;

// Netlink message header.
pub(crate) const NLM_F_REQUEST: u16 = 0x1;
pub(crate) const NLM_F_ACK: u16 = 0x4;
pub(crate) const NLM_F_EXCL: u16 = 0x200;
pub(crate) const NLM_F_CREATE: u16 = 0x400;
pub(crate) const NLM_F_APPEND: u16 = 0x800;
pub(crate) const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLA_F_NESTED: u16 = 0x8000;

// nfnetlink.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;
pub(crate) const NFPROTO_IPV4: u8 = 2;
const NFPROTO_UNSPEC: u8 = 0;

// nf_tables messages.
pub(crate) const NFT_MSG_NEWTABLE: u16 = 0;
pub(crate) const NFT_MSG_GETTABLE: u16 = 1;
pub(crate) const NFT_MSG_DELTABLE: u16 = 2;
pub(crate) const NFT_MSG_NEWCHAIN: u16 = 3;
pub(crate) const NFT_MSG_NEWRULE: u16 = 6;
pub(crate) const NFT_MSG_GETRULE: u16 = 7;

// Attributes.
pub(crate) const NFTA_TABLE_NAME: u16 = 1;
pub(crate) const NFTA_CHAIN_TABLE: u16 = 1;
pub(crate) const NFTA_CHAIN_NAME: u16 = 3;
pub(crate) const NFTA_CHAIN_HOOK: u16 = 4;
pub(crate) const NFTA_CHAIN_TYPE: u16 = 7;
pub(crate) const NFTA_HOOK_HOOKNUM: u16 = 1;
pub(crate) const NFTA_HOOK_PRIORITY: u16 = 2;
pub(crate) const NFTA_RULE_TABLE: u16 = 1;
pub(crate) const NFTA_RULE_CHAIN: u16 = 2;
pub(crate) const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;

/// The first general-purpose register (16 bytes wide); the verdict register is 0.
pub(crate) const REG_1: u32 = 1;
pub(crate) const REG_2: u32 = 2;
const REG_VERDICT: u32 = 0;

/// The `return` verdict (`NFT_RETURN`).
pub(crate) const VERDICT_RETURN: i32 = -5;

/// Meta keys.
pub(crate) const META_SKUID: u32 = 10;
pub(crate) const META_L4PROTO: u32 = 16;

/// Payload bases.
pub(crate) const PAYLOAD_NETWORK: u32 = 1;
pub(crate) const PAYLOAD_TRANSPORT: u32 = 2;

/// `cmp` operators.
pub(crate) const CMP_EQ: u32 = 0;

/// Netfilter hooks.
pub(crate) const HOOK_PREROUTING: u32 = 0;
pub(crate) const HOOK_OUTPUT: u32 = 3;
/// The priority of destination NAT (`dstnat`).
pub(crate) const PRIORITY_DSTNAT: i32 = -100;

/// A batch of nftables messages being written.
pub(crate) struct Batch {
    buf: Vec<u8>,
    seq: u32,
    /// Messages that asked for an acknowledgement.
    pub(crate) acked: u32,
}

impl Batch {
    /// A batch that the kernel applies as one transaction.
    pub(crate) fn new() -> Self {
        let mut b = Self {
            buf: Vec::with_capacity(4096),
            seq: 0,
            acked: 0,
        };
        let at = b.header(
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            NFPROTO_UNSPEC,
            NFNL_SUBSYS_NFTABLES,
        );
        b.finish(at);
        b
    }

    /// A lone request (not in a transaction): a query.
    pub(crate) fn query(ty: u16, flags: u16, family: u8) -> (Self, usize) {
        let mut b = Self {
            buf: Vec::with_capacity(256),
            seq: 0,
            acked: 0,
        };
        let at = b.header(nft(ty), NLM_F_REQUEST | flags, family, 0);
        (b, at)
    }

    fn header(&mut self, ty: u16, flags: u16, family: u8, res_id: u16) -> usize {
        let at = self.buf.len();
        self.seq += 1;
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&self.seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        // nfgenmsg: family, version 0, resource id (big-endian).
        self.buf.push(family);
        self.buf.push(0);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        at
    }

    /// Starts an nftables message of `ty` (acknowledged).
    pub(crate) fn message(&mut self, ty: u16, flags: u16, family: u8) -> usize {
        self.acked += 1;
        self.header(nft(ty), NLM_F_REQUEST | NLM_F_ACK | flags, family, 0)
    }

    /// Ends the message (or nested attribute) started at `at`: writes its length.
    pub(crate) fn finish(&mut self, at: usize) {
        let len = (self.buf.len() - at) as u32;
        self.buf[at..at + 4].copy_from_slice(&len.to_ne_bytes());
    }

    /// Ends the batch and gives its bytes.
    pub(crate) fn end(mut self) -> Vec<u8> {
        let at = self.header(NFNL_MSG_BATCH_END, NLM_F_REQUEST, NFPROTO_UNSPEC, NFNL_SUBSYS_NFTABLES);
        self.finish(at);
        self.buf
    }

    /// The bytes of a query.
    pub(crate) fn bytes(self) -> Vec<u8> {
        self.buf
    }

    /// An attribute with `data` as its payload.
    pub(crate) fn attr(&mut self, ty: u16, data: &[u8]) {
        let len = (4 + data.len()) as u16;
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    /// A string attribute (NUL-terminated).
    pub(crate) fn str(&mut self, ty: u16, s: &str) {
        let mut data = Vec::with_capacity(s.len() + 1);
        data.extend_from_slice(s.as_bytes());
        data.push(0);
        self.attr(ty, &data);
    }

    /// A big-endian 32-bit attribute.
    pub(crate) fn u32(&mut self, ty: u16, v: u32) {
        self.attr(ty, &v.to_be_bytes());
    }

    /// Starts a nested attribute; [`Batch::finish_nested`] ends it.
    pub(crate) fn nest(&mut self, ty: u16) -> usize {
        let at = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        at
    }

    /// Ends the nested attribute started at `at`.
    pub(crate) fn finish_nested(&mut self, at: usize) {
        let len = (self.buf.len() - at) as u16;
        self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    /// One expression of a rule: its name and its attributes.
    fn expr(&mut self, name: &str, data: impl FnOnce(&mut Self)) {
        let elem = self.nest(NFTA_LIST_ELEM);
        self.str(NFTA_EXPR_NAME, name);
        let d = self.nest(NFTA_EXPR_DATA);
        data(self);
        self.finish_nested(d);
        self.finish_nested(elem);
    }

    /// Loads meta `key` into `reg`.
    pub(crate) fn meta(&mut self, key: u32, reg: u32) {
        self.expr("meta", |b| {
            b.u32(2, key); // NFTA_META_KEY
            b.u32(1, reg); // NFTA_META_DREG
        });
    }

    /// Loads `len` bytes at `offset` of header `base` into `reg`.
    pub(crate) fn payload(&mut self, base: u32, offset: u32, len: u32, reg: u32) {
        self.expr("payload", |b| {
            b.u32(1, reg); // NFTA_PAYLOAD_DREG
            b.u32(2, base); // NFTA_PAYLOAD_BASE
            b.u32(3, offset); // NFTA_PAYLOAD_OFFSET
            b.u32(4, len); // NFTA_PAYLOAD_LEN
        });
    }

    /// Compares `reg` with `value` (`op`): the rule goes on only if it holds.
    pub(crate) fn cmp(&mut self, reg: u32, op: u32, value: &[u8]) {
        self.expr("cmp", |b| {
            b.u32(1, reg); // NFTA_CMP_SREG
            b.u32(2, op); // NFTA_CMP_OP
            let d = b.nest(3); // NFTA_CMP_DATA
            b.attr(NFTA_DATA_VALUE, value);
            b.finish_nested(d);
        });
    }

    /// `reg = (reg & mask) ^ 0`.
    pub(crate) fn mask(&mut self, reg: u32, mask: &[u8]) {
        self.expr("bitwise", |b| {
            b.u32(1, reg); // NFTA_BITWISE_SREG
            b.u32(2, reg); // NFTA_BITWISE_DREG
            b.u32(3, mask.len() as u32); // NFTA_BITWISE_LEN
            let m = b.nest(4); // NFTA_BITWISE_MASK
            b.attr(NFTA_DATA_VALUE, mask);
            b.finish_nested(m);
            let x = b.nest(5); // NFTA_BITWISE_XOR
            b.attr(NFTA_DATA_VALUE, &vec![0; mask.len()]);
            b.finish_nested(x);
        });
    }

    /// Loads `value` into `reg`.
    pub(crate) fn immediate(&mut self, reg: u32, value: &[u8]) {
        self.expr("immediate", |b| {
            b.u32(1, reg); // NFTA_IMMEDIATE_DREG
            let d = b.nest(2); // NFTA_IMMEDIATE_DATA
            b.attr(NFTA_DATA_VALUE, value);
            b.finish_nested(d);
        });
    }

    /// Ends the rule with `verdict`.
    pub(crate) fn verdict(&mut self, verdict: i32) {
        self.expr("immediate", |b| {
            b.u32(1, REG_VERDICT);
            let d = b.nest(2);
            let v = b.nest(NFTA_DATA_VERDICT);
            b.u32(NFTA_VERDICT_CODE, verdict as u32);
            b.finish_nested(v);
            b.finish_nested(d);
        });
    }

    /// Redirects to this host, at the port held (big-endian) in `port_reg`.
    pub(crate) fn redirect(&mut self, port_reg: u32) {
        self.expr("redir", |b| {
            b.u32(1, port_reg); // NFTA_REDIR_REG_PROTO_MIN
        });
    }

    /// Destination NAT to the IPv4 address in `addr_reg`, port in `port_reg`.
    pub(crate) fn dnat(&mut self, addr_reg: u32, port_reg: u32) {
        self.expr("nat", |b| {
            b.u32(1, 1); // NFTA_NAT_TYPE: NFT_NAT_DNAT
            b.u32(2, u32::from(NFPROTO_IPV4)); // NFTA_NAT_FAMILY
            b.u32(3, addr_reg); // NFTA_NAT_REG_ADDR_MIN
            b.u32(5, port_reg); // NFTA_NAT_REG_PROTO_MIN
        });
    }
}

fn nft(ty: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | ty
}

/// A netfilter netlink socket in the calling thread's network namespace.
pub(crate) struct Socket(OwnedFd);

/// What the kernel answered a request with.
pub(crate) struct Answer {
    /// The errno of the first refused message (0: none), with its sequence number.
    pub(crate) error: Option<(i32, u32)>,
    /// Messages other than acknowledgements (a dump's entries), by type.
    pub(crate) messages: Vec<u16>,
}

impl Socket {
    pub(crate) fn open() -> std::io::Result<Self> {
        let fd = rustix::net::socket(AddressFamily::NETLINK, SocketType::RAW, Some(netlink::NETFILTER))?;
        rustix::net::bind(&fd, &SocketAddrNetlink::new(0, 0))?;
        sockopt::set_socket_timeout(&fd, sockopt::Timeout::Recv, Some(Duration::from_secs(5)))?;
        Ok(Self(fd))
    }

    /// Sends `bytes` and reads the answers: `acks` acknowledgements (a batch), or a dump up
    /// to its end (`acks == 0`).
    pub(crate) fn request(&self, bytes: &[u8], acks: u32) -> std::io::Result<Answer> {
        rustix::net::sendto(&self.0, bytes, SendFlags::empty(), &SocketAddrNetlink::new(0, 0))?;
        let mut answer = Answer {
            error: None,
            messages: Vec::new(),
        };
        let mut seen = 0;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let (n, _) = rustix::net::recv(&self.0, &mut buf[..], RecvFlags::empty())?;
            let mut at = 0;
            while at + 16 <= n {
                let len = u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap_or_default()) as usize;
                let ty = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
                let seq = u32::from_ne_bytes(buf[at + 8..at + 12].try_into().unwrap_or_default());
                if len < 16 || at + len > n {
                    return Err(std::io::Error::other("a truncated netlink message"));
                }
                match ty {
                    NLMSG_ERROR => {
                        let errno = i32::from_ne_bytes(buf[at + 16..at + 20].try_into().unwrap_or_default());
                        if errno != 0 && answer.error.is_none() {
                            answer.error = Some((-errno, seq));
                        }
                        seen += 1;
                        // A dump refused ends with its error.
                        if acks == 0 {
                            return Ok(answer);
                        }
                    }
                    NLMSG_DONE => return Ok(answer),
                    other => answer.messages.push(other & 0xff),
                }
                at += (len + 3) & !3;
            }
            if acks > 0 && (seen >= acks || answer.error.is_some()) {
                return Ok(answer);
            }
        }
    }
}
