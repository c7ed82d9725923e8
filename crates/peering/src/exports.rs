//! What this cluster exports to a peer, computed from the catalog: each exported service's
//! instances, the mesh gateways the peer's proxies connect through (at their WAN addresses),
//! the SNI those gateways route to it, its identities and protocol; and this cluster's
//! trust bundle.

use catalog::State;
use sha2::Digest as _;
use std::collections::BTreeMap;
use structs::config_entry::ExportedServices;
use structs::peering::{ImportedService, peered_service_sni};
use structs::{CheckServiceNode, ConfigEntry, ConfigEntryKind, HealthStatus, ServiceKind, SpiffeIdService};

/// What one stream exports to its peer (by the name this cluster gives it), by name, each
/// with its digest, kept between recomputations: a service is built again only when its
/// instances, the config entries or the CA changed since it was built (a write elsewhere
/// in the catalog costs a lookup per exported service, not a rebuild).
#[derive(Debug, Default)]
pub struct Exports {
    services: BTreeMap<String, (Versions, ImportedService)>,
}

/// The catalog indexes an exported service was built at: its instances', the config
/// entries' (its protocol) and the CA's (its SNI and identities).
type Versions = (structs::Index, structs::Index, structs::Index);

impl Exports {
    /// Brings the exports up to `state`.
    pub fn refresh(&mut self, state: &State, peer: &str, datacenter: &str) {
        let names = exported_names(state, peer);
        let wanted: std::collections::BTreeSet<&str> = names.iter().map(String::as_str).collect();
        self.services.retain(|name, _| wanted.contains(name.as_str()));
        if names.is_empty() {
            return;
        }
        let shared = (
            state.index_of(&catalog::IndexKey::ConfigEntries),
            state.index_of(&catalog::IndexKey::Ca),
        );
        let mut trust_domain = None;
        for name in names {
            let versions = (
                state.index_of(&catalog::IndexKey::Service(name.clone())),
                shared.0,
                shared.1,
            );
            if self.services.get(&name).is_some_and(|(v, _)| *v == versions) {
                continue;
            }
            let trust_domain = trust_domain.get_or_insert_with(|| state.ca_roots().trust_domain);
            let service = exported_service(state, &name, peer, datacenter, trust_domain);
            self.services.insert(name, (versions, service));
        }
    }

    /// The services exported, by name.
    pub fn services(&self) -> impl Iterator<Item = &ImportedService> {
        self.services.values().map(|(_, s)| s)
    }

    /// Whether `name` is exported.
    pub fn contains(&self, name: &str) -> bool {
        self.services.contains_key(name)
    }
}

/// The names of the services exported to `peer` (what the API shows), sorted.
pub fn exported_names(state: &State, peer: &str) -> Vec<String> {
    match state
        .config_entry(ConfigEntryKind::ExportedServices, "default")
        .as_deref()
    {
        Some(ConfigEntry::ExportedServices(entry)) => export_names(state, entry, peer),
        _ => Vec::new(),
    }
}

/// The names exported to `peer`: those listed with it as a consumer, and for `*` every
/// service with a typical instance (never `consul`).
fn export_names(state: &State, entry: &ExportedServices, peer: &str) -> Vec<String> {
    let wildcard = entry
        .services
        .iter()
        .any(|s| s.name == "*" && s.consumers.iter().any(|c| c.peer == peer));
    let registered = if wildcard {
        state.typical_service_names()
    } else {
        Vec::new()
    };
    entry
        .exported_to(peer, registered.iter().map(String::as_str))
        .into_iter()
        .filter(|n| n != "consul")
        .collect()
}

fn exported_service(state: &State, name: &str, peer: &str, datacenter: &str, trust_domain: &str) -> ImportedService {
    let instances = state
        .health(name, false)
        .into_iter()
        .filter(|c| c.service.kind == ServiceKind::Typical)
        .map(scrub)
        .collect();
    let mut service = ImportedService {
        name: name.to_owned(),
        instances,
        // Sent once for every service (`mesh_gateways`): a gateway's change is one small
        // update, not a resend of every exported service.
        mesh_gateways: Vec::new(),
        sni: peered_service_sni(name, peer, trust_domain),
        spiffe_ids: vec![SpiffeIdService::new(trust_domain, datacenter, name).to_string()],
        protocol: protocol(state, name),
        digest: String::new(),
    };
    service.digest = digest(&service);
    service
}

/// An instance as a peer sees it: without what only this cluster uses (indexes, the proxy
/// and connect settings).
fn scrub(mut csn: CheckServiceNode) -> CheckServiceNode {
    csn.node.create_index = Default::default();
    csn.node.modify_index = Default::default();
    csn.service.create_index = Default::default();
    csn.service.modify_index = Default::default();
    csn.service.proxy = Default::default();
    csn.service.connect = Default::default();
    for check in &mut csn.checks {
        check.create_index = Default::default();
        check.modify_index = Default::default();
        check.definition = Default::default();
    }
    csn
}

/// This cluster's healthy mesh gateways, each at the address other clusters reach it at:
/// where a peer's proxies connect to reach any service exported to it.
pub fn mesh_gateways(state: &State) -> Vec<CheckServiceNode> {
    healthy_gateways(state)
        .into_iter()
        .map(|c| scrub(c.reached_from_afar()))
        .collect()
}

/// This cluster's mesh gateway instances neither critical nor in maintenance, as the
/// catalog holds them (their local addresses).
pub fn healthy_gateways(state: &State) -> Vec<CheckServiceNode> {
    let mut names: Vec<&str> = state
        .all_services()
        .filter(|(_, s)| s.kind == ServiceKind::MeshGateway)
        .map(|(_, s)| s.service.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .flat_map(|n| state.health(n, false))
        .filter(|c| c.service.kind == ServiceKind::MeshGateway)
        .filter(|c| !matches!(c.aggregate_status(), HealthStatus::Critical | HealthStatus::Maintenance))
        .collect()
}

/// A service's protocol: its service-defaults', else proxy-defaults', else `tcp`.
fn protocol(state: &State, name: &str) -> String {
    if let Some(entry) = state.config_entry(ConfigEntryKind::ServiceDefaults, name)
        && let ConfigEntry::ServiceDefaults(d) = &*entry
        && !d.protocol.is_empty()
    {
        return d.protocol.clone();
    }
    if let Some(entry) = state.config_entry(ConfigEntryKind::ProxyDefaults, "global")
        && let ConfigEntry::ProxyDefaults(p) = &*entry
        && let Some(protocol) = structs::ProxyOptions::parse(&p.config).protocol
    {
        return protocol.to_string();
    }
    "tcp".to_owned()
}

/// The digest of an exported service (of everything but the digest).
pub fn digest(service: &ImportedService) -> String {
    let mut bare = service.clone();
    bare.digest = String::new();
    let json = serde_json::to_vec(&bare).unwrap_or_default();
    hex::encode(&sha2::Sha256::digest(&json)[..16])
}

/// This cluster's trust bundle: its trust domain and root certificates.
pub fn trust_bundle(state: &State) -> (String, Vec<String>) {
    let roots = state.ca_roots();
    let pems = roots.roots.iter().map(|r| r.root_cert.clone()).collect();
    (roots.trust_domain, pems)
}
