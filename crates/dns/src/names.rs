//! What a query name asks for.

use crate::{Config, Wanted};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A name under one of the answered domains, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// The domain itself (its SOA and NS).
    Apex,
    /// `<node>.node`.
    Node(String),
    /// `[<tag>.]<svc>.service`, `_<svc>._<tag>.service`, `<svc>.connect`, `<svc>.ingress`.
    Service {
        /// The service.
        service: String,
        /// Only instances with this tag.
        tag: Option<String>,
        /// Which instances.
        wanted: Wanted,
    },
    /// `<name>.query`: a prepared query.
    Query(String),
    /// `<svc>.virtual`: the service's virtual IP.
    Virtual(String),
    /// `<hex>.addr`: an address spelled in hex (the target of SRV answers).
    Addr(IpAddr),
    /// A name in the domain that is none of these, or of another datacenter: it does not
    /// exist.
    Missing,
}

/// A read name: what it asks, and the domain it was asked under (answers name targets in
/// the same domain).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// What it asks.
    pub asked: Asked,
    /// `consul`, or the alternative domain.
    pub domain: String,
}

const KINDS: [&str; 7] = ["service", "node", "connect", "ingress", "query", "addr", "virtual"];

/// Reads `name` (any case, with or without its final dot). `None`: not under an answered
/// domain (the recursors' business).
pub fn parse(name: &str, config: &Config) -> Option<Parsed> {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let domains = std::iter::once(&config.domain).chain(config.alt_domain.as_ref());
    let (rest, domain) = domains.into_iter().find_map(|d| {
        if name == *d {
            Some((String::new(), d.clone()))
        } else {
            name.strip_suffix(d.as_str())
                .and_then(|r| r.strip_suffix('.'))
                .map(|r| (r.to_owned(), d.clone()))
        }
    })?;
    if rest.is_empty() {
        return Some(Parsed {
            asked: Asked::Apex,
            domain,
        });
    }
    let labels: Vec<&str> = rest.split('.').collect();
    Some(Parsed {
        asked: read_labels(&labels, config),
        domain,
    })
}

/// The labels before the domain.
fn read_labels(labels: &[&str], config: &Config) -> Asked {
    let n = labels.len();
    // `<...>.<kind>` or `<...>.<kind>.<dc>`.
    let (kind_at, dc) = if KINDS.contains(&labels[n - 1]) {
        (n - 1, None)
    } else if n >= 2 && KINDS.contains(&labels[n - 2]) {
        (n - 2, Some(labels[n - 1]))
    } else {
        return Asked::Missing;
    };
    if dc.is_some_and(|dc| dc != config.datacenter) {
        return Asked::Missing;
    }
    let before = &labels[..kind_at];
    match (labels[kind_at], before) {
        ("node", [node]) => Asked::Node((*node).to_owned()),
        ("service", [svc]) => service(svc, None, Wanted::Service),
        ("service", [a, b]) => match (a.strip_prefix('_'), b.strip_prefix('_')) {
            // RFC 2782: `_<svc>._<tag>`; `_tcp` (the protocol most clients add) asks no tag.
            (Some(svc), Some(tag)) => service(svc, (tag != "tcp").then_some(tag), Wanted::Service),
            _ => service(b, Some(a), Wanted::Service),
        },
        ("connect", [svc]) => service(svc, None, Wanted::Connect),
        ("ingress", [svc]) => service(svc, None, Wanted::Ingress),
        ("virtual", [svc]) if !svc.is_empty() => Asked::Virtual((*svc).to_owned()),
        ("query", [q]) => Asked::Query((*q).to_owned()),
        ("query", [q, "_tcp"]) if q.len() > 1 && q.starts_with('_') => Asked::Query(q[1..].to_owned()),
        ("addr", [hex]) => addr(hex).map_or(Asked::Missing, Asked::Addr),
        _ => Asked::Missing,
    }
}

fn service(svc: &str, tag: Option<&str>, wanted: Wanted) -> Asked {
    if svc.is_empty() || tag.is_some_and(str::is_empty) {
        return Asked::Missing;
    }
    Asked::Service {
        service: svc.to_owned(),
        tag: tag.map(str::to_owned),
        wanted,
    }
}

/// An address in hex: 8 digits for IPv4, 32 for IPv6.
pub fn addr(hex: &str) -> Option<IpAddr> {
    match hex.len() {
        8 => u32::from_str_radix(hex, 16).ok().map(|v| IpAddr::V4(Ipv4Addr::from(v))),
        32 => u128::from_str_radix(hex, 16)
            .ok()
            .map(|v| IpAddr::V6(Ipv6Addr::from(v))),
        _ => None,
    }
}

/// An address spelled as `<hex>.addr` names it.
pub fn addr_label(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{:08x}", u32::from(v4)),
        IpAddr::V6(v6) => format!("{:032x}", u128::from(v6)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        let mut c = Config::new("dc1");
        c.alt_domain = Some("mesh.example".into());
        c
    }

    fn asked(name: &str) -> Option<Asked> {
        parse(name, &config()).map(|p| p.asked)
    }

    fn svc(service: &str, tag: Option<&str>, wanted: Wanted) -> Option<Asked> {
        Some(Asked::Service {
            service: service.into(),
            tag: tag.map(Into::into),
            wanted,
        })
    }

    #[test]
    fn every_name_form_is_read() {
        assert_eq!(asked("web.service.consul."), svc("web", None, Wanted::Service));
        assert_eq!(asked("WEB.Service.dc1.CONSUL"), svc("web", None, Wanted::Service));
        assert_eq!(asked("v1.web.service.consul"), svc("web", Some("v1"), Wanted::Service));
        assert_eq!(
            asked("_web._v1.service.consul"),
            svc("web", Some("v1"), Wanted::Service)
        );
        assert_eq!(asked("_web._tcp.service.dc1.consul"), svc("web", None, Wanted::Service));
        assert_eq!(asked("web.connect.consul"), svc("web", None, Wanted::Connect));
        assert_eq!(asked("web.ingress.consul"), svc("web", None, Wanted::Ingress));
        assert_eq!(asked("n1.node.consul"), Some(Asked::Node("n1".into())));
        assert_eq!(asked("web.virtual.consul"), Some(Asked::Virtual("web".into())));
        assert_eq!(asked("n1.node.dc1.mesh.example"), Some(Asked::Node("n1".into())));
        assert_eq!(asked("q.query.consul"), Some(Asked::Query("q".into())));
        assert_eq!(asked("_q._tcp.query.consul"), Some(Asked::Query("q".into())));
        assert_eq!(asked("consul."), Some(Asked::Apex));
        assert_eq!(
            asked("7f000001.addr.dc1.consul"),
            Some(Asked::Addr("127.0.0.1".parse().unwrap()))
        );
        assert_eq!(
            parse("web.service.mesh.example", &config()).unwrap().domain,
            "mesh.example"
        );
    }

    #[test]
    fn other_names_are_missing_or_not_ours() {
        assert_eq!(asked("web.service.dc2.consul"), Some(Asked::Missing));
        assert_eq!(asked("a.b.web.service.consul"), Some(Asked::Missing));
        assert_eq!(asked("web.consul"), Some(Asked::Missing));
        assert_eq!(asked("zz.addr.consul"), Some(Asked::Missing));
        assert_eq!(asked("example.com."), None);
        assert_eq!(asked("notconsul."), None);
    }

    #[test]
    fn addresses_round_trip_through_hex() {
        for ip in ["10.1.2.3", "::1", "2001:db8::7"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(addr(&addr_label(ip)), Some(ip));
        }
    }
}
