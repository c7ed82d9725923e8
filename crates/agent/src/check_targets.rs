//! Where a health check registered through the HTTP API may point. The agent runs HTTP and
//! TCP checks from its own host, so without limits anyone allowed to register a check could
//! make it reach what only the host should (an Envoy admin port's `POST /quitquitquit`,
//! another local service's answers read back through the check's output).
//!
//! - A service's check may probe the service's own port on this host when the service runs
//!   here (no `Address`, a loopback one, or the node's advertise address): on loopback
//!   (`127.0.0.0/8`, `::1`, `localhost`, and the unspecified `0.0.0.0`/`::`, which reach
//!   loopback) or the advertise address. A port is given or the scheme's (80, 443).
//! - A service registered at another address owns that address (an IP address) on its port
//!   only when `-check-allowed-targets` covers it: otherwise a registration could claim any
//!   address (a cloud metadata endpoint, another host's admin port) to probe it.
//! - Anything else only in `-check-allowed-targets` (CIDR blocks; none by default). Host
//!   names other than `localhost` are never resolved to match: use IP addresses.
//! - A node check (no `ServiceID`) may probe only the allowlist.
//! - Methods other than `GET` and `HEAD` only against the service's own address and port,
//!   allowlisted or not.
//! - Never the agent's own listeners (its HTTP API would run a token-less request with the
//!   default token), allowlisted or not.
//!
//! Checks from config files are the operator's and are not limited. Checks registered
//! through the API follow redirects only within the same scheme, host and port.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use structs::agent::CheckKind;
use structs::{NodeService, Problem, ValidationError};

/// An address block of `-check-allowed-targets`: `10.0.0.0/8`, `::1/128`, or one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let net: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not a CIDR block (such as 10.0.0.0/8 or ::1/128)"))?;
        let net = net.to_canonical();
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(p) if p <= max => p,
                _ => return Err(format!("{s:?}: the prefix length must be 0 to {max}")),
            },
        };
        Ok(Self { net, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

impl Cidr {
    /// True when `ip` is in the block.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let bits = |ip: IpAddr| -> u128 {
            match ip {
                IpAddr::V4(v4) => u128::from(u32::from(v4)),
                IpAddr::V6(v6) => u128::from(v6),
            }
        };
        let (net, ip) = (self.net, ip.to_canonical());
        if net.is_ipv4() != ip.is_ipv4() {
            return false;
        }
        let width = if net.is_ipv4() { 32 } else { 128 };
        let shift = width - u32::from(self.prefix);
        shift >= 128 || (bits(net) >> shift) == (bits(ip) >> shift)
    }

    /// Parses a comma-separated list (empty entries are skipped).
    pub fn parse_list(s: &str) -> Result<Vec<Cidr>, String> {
        s.split(',').filter(|p| !p.trim().is_empty()).map(str::parse).collect()
    }
}

/// What a check probes: a host (an address, or a name) and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    host: String,
    ip: Option<IpAddr>,
    port: u16,
}

impl Target {
    fn new(host: &str, port: u16) -> Self {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let ip = host.parse::<IpAddr>().ok().map(|ip| ip.to_canonical());
        Self {
            host: host.to_ascii_lowercase(),
            ip,
            port,
        }
    }

    /// Loopback, or what reaches it: `localhost` and the unspecified address.
    fn is_loopback(&self) -> bool {
        self.host == "localhost" || self.ip.is_some_and(|ip| ip.is_loopback() || ip.is_unspecified())
    }

    /// The address a block is matched against (`localhost` as `127.0.0.1`).
    fn ip(&self) -> Option<IpAddr> {
        if self.host == "localhost" {
            return Some(IpAddr::from([127, 0, 0, 1]));
        }
        self.ip.map(|ip| {
            if ip.is_unspecified() {
                IpAddr::from([127, 0, 0, 1])
            } else {
                ip
            }
        })
    }
}

/// The target of an HTTP or TCP check (`None` for the others).
fn target_of(kind: &CheckKind) -> Result<Option<(&'static str, Target)>, ValidationError> {
    match kind {
        CheckKind::Http { url, .. } => {
            let bad = || ValidationError::new("HTTP", Problem::Invalid(format!("{url:?} is not a URL with a host")));
            let parsed = reqwest::Url::parse(url).map_err(|_| bad())?;
            let host = parsed.host_str().ok_or_else(bad)?;
            let port = parsed.port_or_known_default().ok_or_else(bad)?;
            Ok(Some(("HTTP", Target::new(host, port))))
        }
        CheckKind::Tcp { addr, .. } => {
            let bad = || ValidationError::new("TCP", Problem::Invalid(format!("{addr:?} is not host:port")));
            let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
            let port = port.parse::<u16>().map_err(|_| bad())?;
            Ok(Some(("TCP", Target::new(host, port))))
        }
        CheckKind::Ttl(_) | CheckKind::Alias { .. } => Ok(None),
    }
}

/// The service a check belongs to, as far as its targets go.
#[derive(Debug, Clone)]
pub(crate) struct Owner {
    /// Its address: its own, else the node's.
    address: String,
    /// Its port (0: none, so nothing is its own).
    port: u16,
    /// Whether it runs on this host (loopback and the advertise address are then its own).
    local: bool,
    /// Whether its address may be its own at all: it runs here, or the allowlist covers it.
    reachable: bool,
    /// Another local service the caller may not write that has the same address and port:
    /// then nothing there is this service's own (a registration cannot claim another's port
    /// to probe it).
    shared_with: Option<String>,
}

impl Owner {
    /// True when `t` is this service's own address and port (`this_host`: `t` is this host).
    fn owns(&self, t: &Target, this_host: bool) -> bool {
        if self.port == 0 || self.shared_with.is_some() || !self.reachable || t.port != self.port {
            return false;
        }
        let same_ip = t.ip.is_some() && t.ip == Target::new(&self.address, self.port).ip;
        same_ip || (self.local && this_host)
    }

    /// True when `other` is at the same address and port.
    pub(crate) fn same_place(&self, other: &Owner) -> bool {
        self.port != 0 && self.port == other.port && (self.address == other.address || (self.local && other.local))
    }

    /// The same, sharing its address and port with service `name`.
    pub(crate) fn shared_with(mut self, name: Option<String>) -> Self {
        self.shared_with = name;
        self
    }
}

/// The rules of one agent: its advertise address, its allowlist and its own listeners.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TargetRules<'a> {
    /// The node's address in the catalog.
    pub advertise: &'a str,
    /// `-check-allowed-targets`.
    pub allowed: &'a [Cidr],
    /// The agent's own listeners (HTTP, HTTPS, xDS).
    pub protected: &'a [SocketAddr],
}

impl TargetRules<'_> {
    /// True when `t` is this host: loopback (or what reaches it) or the advertise address.
    fn this_host(&self, t: &Target) -> bool {
        let advertise = Target::new(self.advertise, 0);
        t.is_loopback() || t.host == advertise.host || (t.ip.is_some() && t.ip == advertise.ip)
    }

    /// True when `t` is one of the agent's own listeners.
    fn protected(&self, t: &Target) -> bool {
        self.protected.iter().any(|l| {
            let ip = l.ip().to_canonical();
            l.port() == t.port && (self.this_host(t) || t.ip == Some(ip))
        })
    }

    fn allowed(&self, t: &Target) -> bool {
        t.ip().is_some_and(|ip| self.allowed.iter().any(|c| c.contains(ip)))
    }

    /// The owner view of `service`.
    pub(crate) fn owner(&self, service: &NodeService) -> Owner {
        let address = if service.address.is_empty() {
            self.advertise.to_owned()
        } else {
            service.address.clone()
        };
        let probe = Target::new(&address, service.port);
        let local = service.address.is_empty() || self.this_host(&probe);
        Owner {
            reachable: local || (probe.ip.is_some() && self.allowed(&probe)),
            address,
            port: service.port,
            local,
            shared_with: None,
        }
    }

    /// Checks where check `kind` points, for `owner`'s service (`None`: a node check); the
    /// error names the field (`HTTP`, `TCP`, `Method`).
    pub(crate) fn check(&self, kind: &CheckKind, owner: Option<&Owner>) -> Result<(), ValidationError> {
        let Some((field, target)) = target_of(kind)? else {
            return Ok(());
        };
        if self.protected(&target) {
            return Err(ValidationError::new(
                field,
                Problem::Invalid(format!(
                    "{}:{} is this agent's own listener: never a target of a check registered through the API",
                    target.host, target.port
                )),
            ));
        }
        let own = owner.is_some_and(|o| o.owns(&target, self.this_host(&target)));
        if let CheckKind::Http { method, .. } = kind
            && !own
            && !matches!(method.as_str(), "GET" | "HEAD")
        {
            return Err(ValidationError::new(
                "Method",
                Problem::Invalid(format!(
                    "{method} is allowed only against the service's own address and port \
                     (a check registered through the API uses GET or HEAD anywhere else)"
                )),
            ));
        }
        if own || self.allowed(&target) {
            return Ok(());
        }
        let whose = match owner {
            Some(Owner {
                shared_with: Some(other),
                port,
                ..
            }) => format!(
                "not the service's own: its address and port {port} are also those of service {other:?}, \
                 which this token may not write,"
            ),
            Some(o) if o.local => format!(
                "not the service's own port on this host ({}, or loopback, port {})",
                self.advertise, o.port
            ),
            Some(o) => format!(
                "not the service's own address and port ({}:{}: an address off this host is the service's \
                 own only when -check-allowed-targets covers it)",
                o.address, o.port
            ),
            None => "a node check's target (a node check may only probe -check-allowed-targets)".into(),
        };
        Err(ValidationError::new(
            field,
            Problem::Invalid(format!(
                "{}:{} is {whose}, and not in the agent's -check-allowed-targets ({})",
                target.host,
                target.port,
                self.allowed_list()
            )),
        ))
    }

    fn allowed_list(&self) -> String {
        if self.allowed.is_empty() {
            return "none".into();
        }
        self.allowed
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests;
