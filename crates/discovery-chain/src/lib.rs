//! The discovery-chain compiler.
//!
//! A chain answers "where does a request for upstream `web` go?". It is compiled from the
//! config entries that shape routing — `service-router`, `service-splitter` and
//! `service-resolver` of `web` and of every service they lead to — plus the protocol from
//! `service-defaults`/`proxy-defaults`, into a small graph in Consul's shape:
//!
//! - a **router** node (HTTP routes, first match wins, with a catch-all appended),
//! - **splitter** nodes (weighted legs; nested splitters are flattened into one),
//! - **resolver** nodes, each naming one target (a subset of a service in a datacenter) and
//!   its failover targets,
//!
//! and the **targets** themselves: which instances each selects, its SNI, connect timeout
//! and load-balancing policy. xDS turns resolvers into clusters, targets into load
//! assignments and the router/splitters into a route configuration.
//!
//! The same compiler runs at write time ([`validate_graph`]): a config entry whose graph
//! cannot be compiled (a router on a tcp service, an unknown subset, a redirect loop, a
//! failover to a datacenter this server does not serve) is refused with an error naming the
//! entry and field, so a chain that reaches a proxy always compiles.

mod compile;
mod entries;
pub mod fixture;

pub use compile::{CompileRequest, compile};
pub use entries::Entries;

use structs::ConfigEntryKind;

/// Why a chain cannot be compiled: the entry and field at fault and the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {name:?}: {field}: {problem}")]
pub struct ChainError {
    /// Kind of the entry at fault.
    pub kind: ConfigEntryKind,
    /// Its name.
    pub name: String,
    /// The field, as in the entry's JSON (`Routes[1].Destination.ServiceSubset`).
    pub field: String,
    /// What is wrong.
    pub problem: String,
}

impl ChainError {
    pub(crate) fn new(kind: ConfigEntryKind, name: &str, field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            kind,
            name: name.to_owned(),
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// Compiles the chain of every service the routing entries name (and `also`), as a write
/// that produced `entries` would leave them: the first failure is the reason to refuse it.
/// Also checks that every service with L7 intention permissions speaks an HTTP protocol.
pub fn validate_graph(entries: &Entries<'_>, datacenter: &str, also: &str) -> Result<(), ChainError> {
    validate_change(&Entries::default(), entries, datacenter, also)
}

/// Like [`validate_graph`], but refuses only what a write from `before` to `after` breaks: a
/// chain that compiled before and does not after, or L7 intentions that were fine (or did
/// not exist) and are not now. A chain already broken (written before these checks existed,
/// or restored) does not block unrelated writes; the write that fixes it is always accepted.
pub fn validate_change(
    before: &Entries<'_>,
    after: &Entries<'_>,
    datacenter: &str,
    also: &str,
) -> Result<(), ChainError> {
    let mut names: Vec<&str> = after.routing_names().chain(before.routing_names()).collect();
    if !also.is_empty() {
        names.push(also);
    }
    names.sort_unstable();
    names.dedup();
    for name in names {
        let req = CompileRequest {
            service: name,
            datacenter,
            trust_domain: "validate.invalid",
            override_protocol: None,
            override_connect_timeout: None,
        };
        if let Err(e) = compile(&req, after)
            && compile(&req, before).is_ok()
        {
            return Err(e);
        }
    }
    after.check_intentions(before)
}

#[cfg(test)]
mod tests;
