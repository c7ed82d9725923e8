//! Consul's DNS interface, over any catalog:
//!
//! - [`names`]: what a query name asks for — `<svc>.service`, `<tag>.<svc>.service`, RFC 2782
//!   `_<svc>._<tag>.service`, `<node>.node`, `<svc>.connect`, `<svc>.ingress`,
//!   `<query>.query`, `<hex>.addr`, each with an optional `.<dc>`, under the configured
//!   domain or its alternative;
//! - [`answer`]: the answer — healthy instances only (passing and warning, or passing alone
//!   with `only_passing`), shuffled; A/AAAA of their addresses (a CNAME for a host name),
//!   SRV with node or address targets and their addresses as additional records, NXDOMAIN
//!   with the zone's SOA for a name that does not exist, and truncation (the TC bit) where a
//!   UDP answer leaves records out;
//! - [`server`]: UDP and TCP listeners on one port, and the recursors that answer every
//!   other name.
//!
//! The catalog is a [`Catalog`]: a server looks in its store, an agent asks its servers. What
//! a lookup returns is already filtered by the ACLs of whoever the catalog asks as.

pub mod answer;
pub mod names;
pub mod server;

use std::net::SocketAddr;
use std::time::Duration;
use structs::service::{TAGGED_ADDRESS_VIRTUAL_IP, Weights};
use structs::{CheckServiceNode, HealthStatus, Node};

pub use server::{Bound, bind, serve};

/// How the DNS interface answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The domain answered, lowercase, without its final dot (`consul`).
    pub domain: String,
    /// A second domain answered alike (none by default).
    pub alt_domain: Option<String>,
    /// This datacenter: names may carry it, and SRV targets do.
    pub datacenter: String,
    /// TTL of node answers, in seconds.
    pub node_ttl: u32,
    /// TTL of service answers, in seconds.
    pub service_ttl: u32,
    /// Records at most in a UDP answer (the rest are left out, with the TC bit set).
    pub udp_answer_limit: usize,
    /// Leave out instances whose checks warn (by default only critical ones are left out).
    pub only_passing: bool,
    /// Where other names are asked, in order.
    pub recursors: Vec<SocketAddr>,
    /// How long one recursor is waited for.
    pub recursor_timeout: Duration,
}

impl Config {
    /// Consul's defaults, for `datacenter`.
    pub fn new(datacenter: &str) -> Self {
        Config {
            domain: "consul".into(),
            alt_domain: None,
            datacenter: datacenter.to_ascii_lowercase(),
            node_ttl: 0,
            service_ttl: 0,
            udp_answer_limit: 3,
            only_passing: false,
            recursors: Vec::new(),
            recursor_timeout: Duration::from_secs(2),
        }
    }

    /// Checks a domain given on the command line: labels of letters, digits and hyphens.
    /// Returns it lowercase, without a final dot.
    pub fn domain_from(value: &str) -> Result<String, String> {
        let d = value.trim_end_matches('.').to_ascii_lowercase();
        let valid = !d.is_empty()
            && d.len() <= 253
            && d.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if valid {
            Ok(d)
        } else {
            Err(format!(
                "{value:?} is not a domain name (labels of letters, digits and hyphens)"
            ))
        }
    }
}

/// Which instances of a service a name asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// The service's own instances (`.service`).
    Service,
    /// What callers in the mesh dial for it: its sidecars, or itself if connect-native
    /// (`.connect`).
    Connect,
    /// The ingress gateways that expose it (`.ingress`).
    Ingress,
}

/// What an answer needs of one service instance (a catalog builds it without copying the
/// rest of the instance, its node and its checks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// Its node's name.
    pub node: String,
    /// Its node's address.
    pub node_address: String,
    /// Its own address (empty: its node's).
    pub address: String,
    /// Its port.
    pub port: u16,
    /// Its tags.
    pub tags: Vec<String>,
    /// The worst status of its checks and its node's.
    pub status: HealthStatus,
    /// Its SRV weights.
    pub weights: Weights,
    /// Its service's virtual IP, on a connect instance (`consul-virtual`).
    pub virtual_ip: Option<String>,
}

impl Instance {
    /// The address to reach it at: its own, else its node's.
    pub fn address(&self) -> &str {
        if self.address.is_empty() {
            &self.node_address
        } else {
            &self.address
        }
    }
}

impl From<&CheckServiceNode> for Instance {
    fn from(n: &CheckServiceNode) -> Self {
        Instance {
            node: n.node.node.clone(),
            node_address: n.node.address.clone(),
            address: n.service.address.clone(),
            port: n.service.port,
            tags: n.service.tags.clone(),
            status: n.aggregate_status(),
            weights: n.service.weights.clone(),
            virtual_ip: n
                .service
                .tagged_addresses
                .get(TAGGED_ADDRESS_VIRTUAL_IP)
                .map(|a| a.address.clone()),
        }
    }
}

/// A lookup that could not be made (the servers unreachable, say): the query is answered
/// SERVFAIL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupError(pub String);

impl std::fmt::Display for LookupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LookupError {}

/// What the DNS interface reads, as whoever it answers for may read it.
#[async_trait::async_trait]
pub trait Catalog: Send + Sync + 'static {
    /// The instances of `service` (with their nodes and checks) that `wanted` names, healthy
    /// or not: the answer leaves out the unhealthy ones itself.
    async fn service_nodes(&self, service: &str, wanted: Wanted) -> Result<Vec<Instance>, LookupError>;

    /// The node named `name`, if there is one.
    async fn node(&self, name: &str) -> Result<Option<Node>, LookupError>;

    /// The instances the prepared query named (or with the ID) `name` selects, already
    /// filtered by its own health rules; none when there is no such query.
    async fn prepared_query(&self, name: &str) -> Result<Option<Vec<Instance>>, LookupError>;
}

#[cfg(test)]
mod tests {
    use super::Config;

    #[test]
    fn domains_are_checked_and_normalised() {
        assert_eq!(Config::domain_from("Consul.").unwrap(), "consul");
        assert_eq!(Config::domain_from("mesh.example").unwrap(), "mesh.example");
        for bad in ["", ".", "a..b", "-a", "a_b", "a b"] {
            assert!(Config::domain_from(bad).is_err(), "{bad:?}");
        }
    }
}
