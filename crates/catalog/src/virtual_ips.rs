//! Virtual IPs: each service with connect instances (its sidecars, or itself if
//! connect-native), and each service a terminating gateway links, gets a stable address from
//! `240.0.0.0/4`, which transparent proxies match outbound connections on and DNS answers
//! for `<svc>.virtual.consul`. (A destination, a service-defaults `Destination`, gets none:
//! transparent proxies match its own addresses.)
//!
//! Assigned when a write first gives a service a connect instance or links it to a
//! terminating gateway (by name, or by `*`: every service then, and each registered later),
//! as a change of that same write ([`assign`]), so every server and every replay of the log
//! holds the same address, and it is kept across restarts, snapshots and fail-over. It is
//! not released when the instances go: an application that cached it keeps reaching the
//! same service. The lowest free address is taken, from `240.0.0.1`.
//!
//! The instances show it as their `consul-virtual` tagged address ([`tag`]; the instances of
//! a terminating gateway, read as a linked service's connect instances, show that service's:
//! [`tag_as`]), added as they are read rather than stored, so a registration (or an agent's
//! anti-entropy) that does not carry it is not a change.

use crate::state::{Change, State, connect_target};
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::Arc;
use structs::intention::WILDCARD;
use structs::service::ServiceAddress;
use structs::{ConfigEntry, ConfigEntryKind, NodeService, ServiceKind};

pub use structs::service::TAGGED_ADDRESS_VIRTUAL_IP as TAGGED_ADDRESS;

/// The first address handed out (`240.0.0.1`) and the last (`255.255.255.254`).
const FIRST: u32 = 0xF000_0001;
const LAST: u32 = 0xFFFF_FFFE;

/// Appends to `changes` a virtual IP for each service they give a connect instance that has
/// none yet (in `state`, or earlier in `changes`).
pub(crate) fn assign(state: &State, changes: &mut Vec<Change>) {
    let mut assigned: BTreeMap<String, Ipv4Addr> = BTreeMap::new();
    let mut released: BTreeSet<&str> = BTreeSet::new();
    let mut wanted: BTreeSet<String> = BTreeSet::new();
    for change in changes.iter() {
        match change {
            Change::PutVirtualIp { service, ip } => {
                assigned.insert(service.clone(), *ip);
            }
            // A restore without it: the service may need one again.
            Change::DeleteVirtualIp(service) => {
                released.insert(service);
            }
            Change::PutService { service, .. } => {
                if let Some(target) = connect_target(service).filter(|t| !t.is_empty()) {
                    wanted.insert(target.to_owned());
                } else if service.kind == ServiceKind::Typical && linked_by_wildcard(state) {
                    wanted.insert(service.service.clone());
                }
            }
            // Services a terminating gateway links: the mesh reaches them through it, and
            // transparent proxies by their address.
            Change::PutConfig(ConfigEntry::TerminatingGateway(g)) => {
                for linked in &g.services {
                    if linked.name == WILDCARD {
                        wanted.extend(state.typical_service_names());
                    } else if !is_destination(state, &linked.name) {
                        wanted.insert(linked.name.clone());
                    }
                }
            }
            _ => {}
        }
    }
    wanted.retain(|s| (state.virtual_ip(s).is_none() || released.contains(s.as_str())) && !assigned.contains_key(s));
    if wanted.is_empty() {
        return;
    }
    let used: BTreeSet<u32> = state
        .virtual_ips()
        .map(|(_, ip)| u32::from(*ip))
        .chain(assigned.values().map(|ip| u32::from(*ip)))
        .collect();
    let mut free = (FIRST..=LAST).filter(|a| !used.contains(a));
    for service in wanted {
        // 268 million addresses: a catalog does not run out of them.
        let Some(ip) = free.next() else { return };
        changes.push(Change::PutVirtualIp {
            service,
            ip: Ipv4Addr::from(ip),
        });
    }
}

/// Whether `service` is a destination outside the mesh (its service-defaults has a
/// `Destination`).
fn is_destination(state: &State, service: &str) -> bool {
    matches!(
        state.config_entry(ConfigEntryKind::ServiceDefaults, service).as_deref(),
        Some(ConfigEntry::ServiceDefaults(d)) if d.destination.is_some()
    )
}

/// Whether some terminating gateway links every service (`*`).
fn linked_by_wildcard(state: &State) -> bool {
    state.config_entries(ConfigEntryKind::TerminatingGateway).iter().any(
        |e| matches!(e.as_ref(), ConfigEntry::TerminatingGateway(g) if g.services.iter().any(|s| s.name == WILDCARD)),
    )
}

/// Adds the virtual IP of `service` to an instance of a terminating gateway linking it, read
/// as one of `service`'s connect instances.
pub(crate) fn tag_as(state: &State, service: &str, svc: &mut NodeService) {
    if let Some(ip) = state.virtual_ip(service) {
        show(svc, ip);
    }
}

/// `svc` as the catalog's listings show it: a connect instance with its service's virtual
/// IP, an instance of a terminating gateway read as `service`'s connect instance with that
/// service's; any other as it is (not copied).
pub fn as_listed(state: &State, service: &str, svc: Arc<NodeService>) -> Arc<NodeService> {
    let ip = match (connect_target(&svc), svc.kind) {
        (Some(target), _) => state.virtual_ip(target),
        (None, ServiceKind::TerminatingGateway) if svc.service != service => state.virtual_ip(service),
        _ => None,
    };
    let Some(ip) = ip else { return svc };
    let mut svc = Arc::unwrap_or_clone(svc);
    show(&mut svc, ip);
    Arc::new(svc)
}

/// Adds its service's virtual IP to a connect instance read from `state`, as Consul's
/// `consul-virtual` tagged address (the instance's port beside it).
pub(crate) fn tag(state: &State, svc: &mut NodeService) {
    if let Some(ip) = connect_target(svc).and_then(|t| state.virtual_ip(t)) {
        show(svc, ip);
    }
}

/// Sets `ip` as `svc`'s `consul-virtual` tagged address, with the instance's port.
fn show(svc: &mut NodeService, ip: Ipv4Addr) {
    svc.tagged_addresses.insert(
        TAGGED_ADDRESS.to_owned(),
        ServiceAddress {
            address: ip.to_string(),
            port: svc.port,
        },
    );
}
