//! A query's answer.

use crate::names::{self, Asked, Parsed};
use crate::{Catalog, Config, Instance, LookupError};
use simple_dns::rdata::{A, AAAA, CNAME, NS, OPT, RData, SOA, SRV, TXT};
use simple_dns::{CLASS, Name, OPCODE, Packet, PacketFlag, QTYPE, RCODE, ResourceRecord, TYPE};
use std::net::IpAddr;

/// The size of a UDP answer when the query says nothing of its own (RFC 1035).
pub const UDP_DEFAULT_SIZE: usize = 512;
/// The largest UDP answer sent, whatever a query's EDNS size.
pub const UDP_MAX_SIZE: usize = 4096;
/// The largest TCP answer (its length prefix is 16 bits).
pub const TCP_MAX_SIZE: usize = 65_535;

/// How the query came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// In a datagram: answers are cut to fit, with the TC bit set.
    Udp,
    /// Over a stream: whole answers.
    Tcp,
}

/// What to do with a query.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Send these bytes back.
    Reply(Vec<u8>),
    /// Not a name of ours: ask the recursors.
    Recurse,
    /// Not a query at all: nothing is sent.
    Ignore,
}

type Record = ResourceRecord<'static>;

/// What a name's lookup found.
#[derive(Default)]
struct Found {
    /// The name exists (NXDOMAIN otherwise).
    exists: bool,
    answers: Vec<Record>,
    additional: Vec<Record>,
    /// Records were left out of a UDP answer.
    truncated: bool,
}

/// Answers `query` from `catalog`.
pub async fn answer(catalog: &dyn Catalog, config: &Config, query: &[u8], transport: Transport) -> Outcome {
    let Ok(request) = Packet::parse(query) else {
        return error_reply(query, RCODE::FormatError).map_or(Outcome::Ignore, Outcome::Reply);
    };
    if request.has_flags(PacketFlag::RESPONSE) {
        return Outcome::Ignore;
    }
    let mut reply = Packet::new_reply(request.id());
    reply.set_flags(PacketFlag::AUTHORITATIVE_ANSWER);
    if request.has_flags(PacketFlag::RECURSION_DESIRED) {
        reply.set_flags(PacketFlag::RECURSION_DESIRED);
    }
    if !config.recursors.is_empty() {
        reply.set_flags(PacketFlag::RECURSION_AVAILABLE);
    }
    let limit = match transport {
        Transport::Tcp => TCP_MAX_SIZE,
        Transport::Udp => request.opt().map_or(UDP_DEFAULT_SIZE, |opt| {
            usize::from(opt.udp_packet_size).clamp(UDP_DEFAULT_SIZE, UDP_MAX_SIZE)
        }),
    };
    if request.opt().is_some() {
        *reply.opt_mut() = Some(OPT {
            opt_codes: Vec::new(),
            udp_packet_size: UDP_MAX_SIZE as u16,
            version: 0,
        });
    }
    let question = match request.questions.as_slice() {
        [q] if request.opcode() == OPCODE::StandardQuery => q.clone().into_owned(),
        _ => {
            *reply.rcode_mut() = if request.opcode() == OPCODE::StandardQuery {
                RCODE::FormatError
            } else {
                RCODE::NotImplemented
            };
            return Outcome::Reply(encode(reply, limit));
        }
    };
    let qname = question.qname.to_string();
    let qtype = question.qtype;
    reply.questions.push(question);
    let Some(parsed) = names::parse(&qname, config) else {
        if config.recursors.is_empty() {
            *reply.rcode_mut() = RCODE::Refused;
            return Outcome::Reply(encode(reply, limit));
        }
        return Outcome::Recurse;
    };
    match find(catalog, config, &parsed, &qname, qtype, transport).await {
        Ok(found) => {
            if found.truncated {
                reply.set_flags(PacketFlag::TRUNCATION);
            }
            if !found.exists {
                *reply.rcode_mut() = RCODE::NameError;
            }
            if found.answers.is_empty() {
                reply.name_servers.push(soa(&parsed.domain));
            }
            reply.answers = found.answers;
            reply.additional_records = found.additional;
        }
        Err(e) => {
            tracing::debug!(name = %qname, error = %e, "DNS lookup failed: SERVFAIL");
            *reply.rcode_mut() = RCODE::ServerFailure;
        }
    }
    Outcome::Reply(encode(reply, limit))
}

async fn find(
    catalog: &dyn Catalog,
    config: &Config,
    parsed: &Parsed,
    qname: &str,
    qtype: QTYPE,
    transport: Transport,
) -> Result<Found, LookupError> {
    let at = Instances {
        config,
        qname,
        qtype,
        domain: &parsed.domain,
        transport,
    };
    Ok(match &parsed.asked {
        Asked::Apex => {
            let mut found = Found {
                exists: true,
                ..Found::default()
            };
            if wants(qtype, TYPE::SOA) {
                found.answers.push(soa(&parsed.domain));
            }
            if wants(qtype, TYPE::NS) {
                let ns = name(&format!("ns.{}", parsed.domain));
                found.answers.push(record(qname, 0, RData::NS(NS(ns))));
            }
            found
        }
        Asked::Missing => Found::default(),
        Asked::Addr(ip) => Found {
            exists: true,
            answers: address(qname, *ip, qtype, config.service_ttl).into_iter().collect(),
            ..Found::default()
        },
        Asked::Node(node) => match catalog.node(node).await? {
            None => Found::default(),
            Some(node) => {
                let mut found = Found {
                    exists: true,
                    answers: host(qname, &node.address, qtype, config.node_ttl).into_iter().collect(),
                    ..Found::default()
                };
                if wants(qtype, TYPE::TXT) && !node.meta.is_empty() {
                    found.answers.push(meta_txt(qname, &node.meta, config.node_ttl));
                }
                found
            }
        },
        Asked::Service { service, tag, wanted } => {
            let mut nodes = catalog.service_nodes(service, *wanted).await?;
            nodes.retain(|n| {
                n.status.admits(config.only_passing)
                    && tag
                        .as_deref()
                        .is_none_or(|t| n.tags.iter().any(|x| x.eq_ignore_ascii_case(t)))
            });
            at.answer(nodes)
        }
        Asked::Query(query) => match catalog.prepared_query(query).await? {
            None => Found::default(),
            Some(nodes) => at.answer(nodes),
        },
        // Its connect instances carry it (`consul-virtual`).
        Asked::Virtual(service) => {
            let nodes = catalog.service_nodes(service, crate::Wanted::Connect).await?;
            let vip = nodes
                .iter()
                .find_map(|n| n.virtual_ip.as_deref().and_then(|a| a.parse::<IpAddr>().ok()));
            match vip {
                None => Found::default(),
                Some(ip) => Found {
                    exists: true,
                    answers: address(qname, ip, qtype, config.service_ttl).into_iter().collect(),
                    ..Found::default()
                },
            }
        }
    })
}

/// Answers naming instances.
struct Instances<'a> {
    config: &'a Config,
    qname: &'a str,
    qtype: QTYPE,
    domain: &'a str,
    transport: Transport,
}

impl Instances<'_> {
    /// Healthy `nodes`, shuffled, as A/AAAA (or SRV) answers; cut to the UDP answer limit.
    fn answer(&self, mut nodes: Vec<Instance>) -> Found {
        let mut found = Found {
            exists: !nodes.is_empty(),
            ..Found::default()
        };
        fastrand::shuffle(&mut nodes);
        if self.transport == Transport::Udp && nodes.len() > self.config.udp_answer_limit {
            nodes.truncate(self.config.udp_answer_limit);
            found.truncated = true;
        }
        let ttl = self.config.service_ttl;
        if self.qtype == QTYPE::TYPE(TYPE::SRV) {
            for n in &nodes {
                self.srv(n, &mut found);
            }
            return found;
        }
        let mut cname = None;
        for n in &nodes {
            match n.address().parse::<IpAddr>() {
                Ok(ip) => found.answers.extend(address(self.qname, ip, self.qtype, ttl)),
                Err(_) => cname = cname.or_else(|| Some(n.address().to_owned())),
            }
        }
        // One name has one CNAME, and nothing beside it.
        if let Some(target) = cname.filter(|_| found.answers.is_empty())
            && (wants(self.qtype, TYPE::A) || wants(self.qtype, TYPE::AAAA) || wants(self.qtype, TYPE::CNAME))
        {
            found
                .answers
                .push(record(self.qname, ttl, RData::CNAME(CNAME(name(&target)))));
        }
        found
    }

    /// One instance's SRV record, its target's address as an additional record.
    fn srv(&self, n: &Instance, found: &mut Found) {
        let ttl = self.config.service_ttl;
        let dc = &self.config.datacenter;
        let own = &n.address;
        let (target, target_address) = if own.is_empty() || *own == n.node_address {
            (format!("{}.node.{dc}.{}", n.node, self.domain), n.node_address.as_str())
        } else if let Ok(ip) = own.parse::<IpAddr>() {
            (
                format!("{}.addr.{dc}.{}", names::addr_label(ip), self.domain),
                own.as_str(),
            )
        } else {
            (own.trim_end_matches('.').to_owned(), "")
        };
        let weight = if n.status == structs::HealthStatus::Warning {
            n.weights.warning
        } else {
            n.weights.passing
        };
        found.answers.push(record(
            self.qname,
            ttl,
            RData::SRV(SRV {
                priority: 1,
                weight: u16::try_from(weight).unwrap_or(u16::MAX),
                port: n.port,
                target: name(&target),
            }),
        ));
        if !target_address.is_empty() {
            found.additional.extend(host(&target, target_address, QTYPE::ANY, ttl));
        }
    }
}

/// Whether a query of type `qtype` wants records of type `t`.
fn wants(qtype: QTYPE, t: TYPE) -> bool {
    qtype == QTYPE::ANY || qtype == QTYPE::TYPE(t)
}

/// An A or AAAA record of `ip`, if the query wants that type.
fn address(owner: &str, ip: IpAddr, qtype: QTYPE, ttl: u32) -> Option<Record> {
    match ip {
        IpAddr::V4(v4) if wants(qtype, TYPE::A) => Some(record(owner, ttl, RData::A(A::from(v4)))),
        IpAddr::V6(v6) if wants(qtype, TYPE::AAAA) => Some(record(owner, ttl, RData::AAAA(AAAA::from(v6)))),
        _ => None,
    }
}

/// The record of an address that may be an IP or a host name (a CNAME).
fn host(owner: &str, address: &str, qtype: QTYPE, ttl: u32) -> Option<Record> {
    match address.parse::<IpAddr>() {
        Ok(ip) => self::address(owner, ip, qtype, ttl),
        Err(_)
            if !address.is_empty()
                && (wants(qtype, TYPE::CNAME) || wants(qtype, TYPE::A) || wants(qtype, TYPE::AAAA)) =>
        {
            Some(record(owner, ttl, RData::CNAME(CNAME(name(address)))))
        }
        Err(_) => None,
    }
}

/// A node's metadata as one TXT record of `key=value` strings.
fn meta_txt(owner: &str, meta: &std::collections::BTreeMap<String, String>, ttl: u32) -> Record {
    let mut txt = TXT::new();
    for (k, v) in meta {
        let pair = format!("{k}={v}");
        // A string longer than 255 bytes cannot be one TXT string: it is left out.
        if let Ok(s) = simple_dns::CharacterString::new(pair.as_bytes()) {
            txt.add_char_string(s.into_owned());
        }
    }
    record(owner, ttl, RData::TXT(txt))
}

/// The zone's SOA, in the authority section of NXDOMAIN and empty answers.
fn soa(domain: &str) -> Record {
    let serial = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as u32);
    record(
        domain,
        0,
        RData::SOA(SOA {
            mname: name(&format!("ns.{domain}")),
            rname: name(&format!("hostmaster.{domain}")),
            serial,
            refresh: 3600,
            retry: 600,
            expire: 86_400,
            minimum: 0,
        }),
    )
}

fn name(s: &str) -> Name<'static> {
    Name::new_unchecked(s.trim_end_matches('.')).into_owned()
}

fn record(owner: &str, ttl: u32, rdata: RData<'_>) -> Record {
    ResourceRecord::new(name(owner), CLASS::IN, ttl, rdata).into_owned()
}

/// `reply` in at most `limit` bytes: additional records go first, then answers, and the TC
/// bit says so.
fn encode(mut reply: Packet<'_>, limit: usize) -> Vec<u8> {
    loop {
        match reply.build_bytes_vec_compressed() {
            Ok(bytes) if bytes.len() <= limit => return bytes,
            Ok(_) => {
                reply.set_flags(PacketFlag::TRUNCATION);
                if reply.additional_records.pop().is_none() && reply.answers.pop().is_none() {
                    reply.name_servers.clear();
                }
            }
            Err(_) => {
                let id = reply.id().to_be_bytes();
                return error_reply(&[id[0], id[1]], RCODE::ServerFailure).unwrap_or_default();
            }
        }
    }
}

/// A reply to `query` with `rcode` and nothing else (a recursion that failed), or nothing
/// when `query` cannot be read.
pub fn failure(query: &[u8], rcode: RCODE) -> Option<Vec<u8>> {
    let request = Packet::parse(query).ok()?;
    let mut reply = Packet::new_reply(request.id());
    if request.has_flags(PacketFlag::RECURSION_DESIRED) {
        reply.set_flags(PacketFlag::RECURSION_DESIRED | PacketFlag::RECURSION_AVAILABLE);
    }
    reply.questions = request.questions.into_iter().map(|q| q.into_owned()).collect();
    *reply.rcode_mut() = rcode;
    Some(encode(reply, UDP_DEFAULT_SIZE))
}

/// A bare reply with `rcode`, for a query whose ID (its first two bytes) is all that can be
/// read.
fn error_reply(query: &[u8], rcode: RCODE) -> Option<Vec<u8>> {
    let id = query.get(..2)?;
    // QR set, opcode 0; RA clear; the rcode; no records.
    Some(vec![id[0], id[1], 0x80, rcode as u8, 0, 0, 0, 0, 0, 0, 0, 0])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Wanted;
    use simple_dns::Question;
    use structs::{CheckServiceNode, HealthCheck, HealthStatus, Node, NodeService};

    /// `web`: instances on n1..=n5 (n5 critical); `n1` a node.
    struct Fake;

    fn instance(i: u8, status: HealthStatus) -> Instance {
        Instance::from(&CheckServiceNode {
            node: Node {
                node: format!("n{i}"),
                address: format!("10.0.0.{i}"),
                ..Node::default()
            },
            service: NodeService {
                id: format!("web-{i}"),
                service: "web".into(),
                port: 8000 + u16::from(i),
                tags: if i == 1 { vec!["v1".into()] } else { Vec::new() },
                ..NodeService::default()
            },
            checks: vec![HealthCheck {
                status,
                ..HealthCheck::default()
            }],
        })
    }

    #[async_trait::async_trait]
    impl Catalog for Fake {
        async fn service_nodes(&self, service: &str, _: Wanted) -> Result<Vec<Instance>, LookupError> {
            Ok(match service {
                "web" => (1..=5)
                    .map(|i| {
                        instance(
                            i,
                            if i == 5 {
                                HealthStatus::Critical
                            } else {
                                HealthStatus::Passing
                            },
                        )
                    })
                    .collect(),
                "broken" => return Err(LookupError("no server answered".into())),
                _ => Vec::new(),
            })
        }
        async fn node(&self, name: &str) -> Result<Option<Node>, LookupError> {
            Ok((name == "n1").then(|| Node {
                node: "n1".into(),
                address: "10.0.0.1".into(),
                ..Node::default()
            }))
        }
        async fn prepared_query(&self, _: &str) -> Result<Option<Vec<Instance>>, LookupError> {
            Ok(None)
        }
    }

    fn query(name: &str, qtype: TYPE) -> Vec<u8> {
        let mut q = Packet::new_query(7);
        q.questions.push(Question::new(
            Name::new_unchecked(name),
            qtype.into(),
            CLASS::IN.into(),
            false,
        ));
        q.build_bytes_vec().unwrap()
    }

    async fn ask(name: &str, qtype: TYPE, transport: Transport) -> Vec<u8> {
        match answer(&Fake, &Config::new("dc1"), &query(name, qtype), transport).await {
            Outcome::Reply(r) => r,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn healthy_instances_are_answered_and_cut_over_udp() {
        let tcp = ask("web.service.consul", TYPE::A, Transport::Tcp).await;
        let reply = Packet::parse(&tcp).unwrap();
        assert_eq!(reply.id(), 7);
        assert!(reply.has_flags(PacketFlag::AUTHORITATIVE_ANSWER));
        assert_eq!(reply.answers.len(), 4, "the critical one is left out");
        assert!(!reply.has_flags(PacketFlag::TRUNCATION));
        let udp = ask("web.service.consul", TYPE::A, Transport::Udp).await;
        let reply = Packet::parse(&udp).unwrap();
        assert_eq!(reply.answers.len(), 3);
        assert!(reply.has_flags(PacketFlag::TRUNCATION));
    }

    #[tokio::test]
    async fn srv_answers_name_nodes_and_add_their_addresses() {
        let bytes = ask("v1.web.service.consul", TYPE::SRV, Transport::Udp).await;
        let reply = Packet::parse(&bytes).unwrap();
        let [srv] = reply.answers.as_slice() else {
            panic!("{:?}", reply.answers)
        };
        let RData::SRV(srv) = &srv.rdata else { panic!("{srv:?}") };
        assert_eq!(
            (srv.port, srv.target.to_string()),
            (8001, "n1.node.dc1.consul".to_owned())
        );
        assert_eq!(reply.additional_records.len(), 1);
    }

    #[tokio::test]
    async fn missing_names_are_nxdomain_with_the_soa_and_failures_servfail() {
        for name in ["api.service.consul", "n9.node.consul", "web.service.dc9.consul"] {
            let reply = ask(name, TYPE::A, Transport::Udp).await;
            let reply = Packet::parse(&reply).unwrap();
            assert_eq!(reply.rcode(), RCODE::NameError, "{name}");
            assert!(matches!(reply.name_servers[0].rdata, RData::SOA(_)), "{name}");
        }
        let reply = ask("broken.service.consul", TYPE::A, Transport::Udp).await;
        assert_eq!(Packet::parse(&reply).unwrap().rcode(), RCODE::ServerFailure);
    }

    #[tokio::test]
    async fn other_names_are_refused_without_recursors_and_garbage_is_a_format_error() {
        let reply = ask("example.com", TYPE::A, Transport::Udp).await;
        assert_eq!(Packet::parse(&reply).unwrap().rcode(), RCODE::Refused);
        let mut with_recursor = Config::new("dc1");
        with_recursor.recursors.push("127.0.0.1:53".parse().unwrap());
        let outcome = answer(&Fake, &with_recursor, &query("example.com", TYPE::A), Transport::Udp).await;
        assert_eq!(outcome, Outcome::Recurse);
        let Outcome::Reply(formerr) = answer(&Fake, &with_recursor, &[0, 9, 1, 0, 0, 1], Transport::Udp).await else {
            panic!("a reply")
        };
        assert_eq!((formerr[1], formerr[3] & 0x0f), (9, RCODE::FormatError as u8));
        assert_eq!(
            answer(&Fake, &with_recursor, &[1], Transport::Udp).await,
            Outcome::Ignore
        );
    }
}
