//! Proxy identity helpers from Istio's agent: the service node string
//! `TYPE~IP~ID~DOMAIN` and its decoder, address resolution, and waiting for private IPs.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// The role of a proxy in a service node string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeType {
    /// A sidecar next to a workload.
    Sidecar,
    /// A gateway or other standalone proxy.
    Router,
}

impl NodeType {
    fn as_str(self) -> &'static str {
        match self {
            NodeType::Sidecar => "sidecar",
            NodeType::Router => "router",
        }
    }
}

/// A proxy's service node: type, IP, platform id and DNS domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceNode {
    /// The role.
    pub node_type: NodeType,
    /// The proxy's IP address (identifies it and its co-located instances).
    pub ip: IpAddr,
    /// Platform-specific proxy id.
    pub id: String,
    /// DNS domain suffix for short host names.
    pub domain: String,
}

impl fmt::Display for ServiceNode {
    /// `TYPE~IP~ID~DOMAIN`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}~{}~{}~{}", self.node_type.as_str(), self.ip, self.id, self.domain)
    }
}

/// A service node string that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid service node {input:?}: {problem}")]
pub struct NodeError {
    /// The input.
    pub input: String,
    /// What is wrong with it.
    pub problem: String,
}

impl std::str::FromStr for ServiceNode {
    type Err = NodeError;

    fn from_str(s: &str) -> Result<Self, NodeError> {
        let err = |problem: String| NodeError {
            input: s.to_owned(),
            problem,
        };
        let parts: Vec<&str> = s.split('~').collect();
        let [kind, ip, id, domain] = parts.as_slice() else {
            return Err(err(format!(
                "expected 4 parts TYPE~IP~ID~DOMAIN separated by '~', found {}",
                parts.len()
            )));
        };
        let node_type = match *kind {
            "sidecar" => NodeType::Sidecar,
            "router" => NodeType::Router,
            other => return Err(err(format!("type {other:?} is not one of sidecar, router"))),
        };
        let ip = ip.parse().map_err(|_| err(format!("IP {ip:?} is not an IP address")))?;
        if id.is_empty() {
            return Err(err("ID is empty".into()));
        }
        Ok(ServiceNode {
            node_type,
            ip,
            id: (*id).to_owned(),
            domain: (*domain).to_owned(),
        })
    }
}

/// Why an address could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// Nothing to resolve.
    #[error("no address specified")]
    Empty,
    /// Not `host:port` / `[v6]:port`.
    #[error("address {0:?} is not host:port (IPv6 in brackets: [::1]:port)")]
    Malformed(String),
    /// The host name did not resolve.
    #[error("cannot resolve {addr:?}: {source}")]
    Lookup {
        /// The input.
        addr: String,
        /// The resolver's error.
        source: std::io::Error,
    },
}

/// Resolves an authority (`host:port`, `ip:port`, `[ipv6]:port`) to a socket address; of a
/// host name's addresses the first IPv4 one wins, else the first.
pub async fn resolve_addr(addr: &str) -> Result<SocketAddr, ResolveError> {
    if addr.is_empty() {
        return Err(ResolveError::Empty);
    }
    if let Ok(sa) = addr.parse::<SocketAddr>() {
        return Ok(sa);
    }
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| ResolveError::Malformed(addr.to_owned()))?;
    if host.is_empty() || host.contains(':') || port.parse::<u16>().is_err() {
        // An unbracketed IPv6 address, a missing host or a bad port.
        return Err(ResolveError::Malformed(addr.to_owned()));
    }
    let found: Vec<SocketAddr> = tokio::net::lookup_host(addr)
        .await
        .map_err(|source| ResolveError::Lookup {
            addr: addr.to_owned(),
            source,
        })?
        .collect();
    found
        .iter()
        .find(|a| a.is_ipv4())
        .or(found.first())
        .copied()
        .ok_or_else(|| ResolveError::Lookup {
            addr: addr.to_owned(),
            source: std::io::Error::other("no addresses"),
        })
}

/// The host's private (non-loopback, non-link-local, specified) IPs now; `None` while there
/// are none.
pub fn private_ips_now() -> Option<Vec<IpAddr>> {
    let ips = private_only(if_addrs::get_if_addrs().ok()?.into_iter().map(|i| i.ip()));
    (!ips.is_empty()).then_some(ips)
}

fn private_only(ips: impl Iterator<Item = IpAddr>) -> Vec<IpAddr> {
    ips.filter(|ip| !ip.is_loopback() && !ip.is_unspecified() && !is_link_local(ip))
        .collect()
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// Waits until the host has private IPs (polling every 100 ms) or `timeout` passes; returns
/// them, or `None` on timeout.
pub async fn private_ips(timeout: Duration) -> Option<Vec<IpAddr>> {
    let poll = async {
        loop {
            if let Some(ips) = private_ips_now() {
                return ips;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(timeout, poll).await.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_node_round_trips() {
        let n = ServiceNode {
            node_type: NodeType::Sidecar,
            ip: "10.60.1.6".parse().unwrap(),
            id: "web-sidecar-proxy".into(),
            domain: "default.svc.cluster.local".into(),
        };
        let s = n.to_string();
        assert_eq!(s, "sidecar~10.60.1.6~web-sidecar-proxy~default.svc.cluster.local");
        assert_eq!(s.parse::<ServiceNode>().unwrap(), n);
        let v6: ServiceNode = "router~::1~gw~".parse().unwrap();
        assert_eq!(v6.node_type, NodeType::Router);
        assert_eq!(v6.to_string(), "router~::1~gw~");
    }

    #[test]
    fn malformed_service_nodes_name_the_problem() {
        let e = |s: &str| s.parse::<ServiceNode>().unwrap_err().problem;
        assert!(
            e("sidecar~10.0.0.1~web").contains("expected 4 parts"),
            "{}",
            e("sidecar~10.0.0.1~web")
        );
        assert!(e("a~b~c~d~e").contains("found 5"));
        assert!(e("pod~10.0.0.1~web~d").contains("type \"pod\""));
        assert!(e("sidecar~10.0.0.300~web~d").contains("IP \"10.0.0.300\""));
        assert!(e("sidecar~10.0.0.1~~d").contains("ID is empty"));
        assert!(e("").contains("found 1"));
    }

    #[tokio::test]
    async fn resolve_addr_takes_ips_hosts_and_bracketed_v6() {
        assert_eq!(
            resolve_addr("10.1.2.3:80").await.unwrap(),
            "10.1.2.3:80".parse().unwrap()
        );
        assert_eq!(resolve_addr("[::1]:8080").await.unwrap(), "[::1]:8080".parse().unwrap());
        let local = resolve_addr("localhost:9").await.unwrap();
        assert!(local.ip().is_loopback() && local.port() == 9);
        assert!(local.is_ipv4(), "IPv4 preferred, got {local}");
        assert!(matches!(resolve_addr("").await, Err(ResolveError::Empty)));
        assert!(matches!(resolve_addr("::1:80").await, Err(ResolveError::Malformed(_))));
        assert!(matches!(
            resolve_addr("host-without-port").await,
            Err(ResolveError::Malformed(_))
        ));
        assert!(matches!(resolve_addr(":80").await, Err(ResolveError::Malformed(_))));
        assert!(matches!(
            resolve_addr("no-such-host.invalid:80").await,
            Err(ResolveError::Lookup { .. })
        ));
    }

    #[test]
    fn private_ips_exclude_loopback_link_local_and_unspecified() {
        let ips = [
            "127.0.0.1",
            "10.1.2.3",
            "169.254.1.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::5",
            "192.168.0.2",
        ];
        let kept = private_only(ips.iter().map(|s| s.parse().unwrap()));
        let want: Vec<IpAddr> = ["10.1.2.3", "fd00::5", "192.168.0.2"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(kept, want);
    }

    #[tokio::test(start_paused = true)]
    async fn private_ips_are_found_or_timed_out() {
        // The machine either has a private address (returned at once) or the wait times out
        // after exactly the timeout, in paused time.
        let t0 = tokio::time::Instant::now();
        match private_ips(Duration::from_secs(3)).await {
            Some(ips) => assert!(ips.iter().all(|ip| !ip.is_loopback()), "{ips:?}"),
            None => assert_eq!(t0.elapsed(), Duration::from_secs(3)),
        }
    }
}
