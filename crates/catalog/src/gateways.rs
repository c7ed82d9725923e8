//! Gateways in the catalog: the services each ingress or terminating gateway fronts (derived
//! from its config entry and, for `*`, from the registered services), the index keys that
//! follow them, and the write-time check that an ingress listener's protocol matches the
//! protocol of every service it names.

use crate::keys::IndexKey;
use crate::state::State;
use imbl::OrdSet;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use structs::central_config::{self, CentralConfig};
use structs::config_entry::{IngressGateway, TerminatingGateway, WILDCARD_SERVICE};
use structs::{
    CheckServiceNode, ConfigEntry, ConfigEntryKind, GatewayService, Problem, Protocol, ServiceKind, ValidationError,
};

/// The kinds of entry that define a gateway's services.
const GATEWAY_KINDS: [ConfigEntryKind; 2] = [ConfigEntryKind::IngressGateway, ConfigEntryKind::TerminatingGateway];

/// Whether a service of protocol `service` may sit on a listener of protocol `listener`:
/// a tcp listener takes tcp services, an http, http2 or grpc listener takes services of any
/// of those (Consul's rule).
pub fn listener_accepts(listener: Protocol, service: Protocol) -> bool {
    listener.is_http() == service.is_http()
}

fn has_wildcard(entry: &ConfigEntry) -> bool {
    match entry {
        ConfigEntry::IngressGateway(g) => g
            .listeners
            .iter()
            .any(|l| l.services.iter().any(|s| s.name == WILDCARD_SERVICE)),
        ConfigEntry::TerminatingGateway(g) => g.services.iter().any(|s| s.name == WILDCARD_SERVICE),
        _ => false,
    }
}

impl State {
    /// Adds the gateway keys a write changed to `bumped`: a gateway's own entry, and — when
    /// services, service-defaults or proxy-defaults changed — every gateway with a `*`
    /// service (what `*` expands to depends on them).
    pub(crate) fn touch_gateways(&mut self, bumped: &mut OrdSet<IndexKey>) {
        let mut touched = Vec::new();
        for key in bumped.iter() {
            if let IndexKey::ConfigEntry(kind, name) = key
                && GATEWAY_KINDS.contains(kind)
            {
                touched.push(IndexKey::GatewayServices(name.clone()));
            }
        }
        let wildcards_changed = [
            IndexKey::Services,
            IndexKey::ConfigKind(ConfigEntryKind::ServiceDefaults),
            IndexKey::ConfigKind(ConfigEntryKind::ProxyDefaults),
        ]
        .iter()
        .any(|k| bumped.contains(k));
        if wildcards_changed {
            for kind in GATEWAY_KINDS {
                for entry in self.config_entries(kind) {
                    if has_wildcard(&entry) {
                        touched.push(IndexKey::GatewayServices(entry.name().to_owned()));
                    }
                }
            }
        }
        let ingress_touched = bumped.contains(&IndexKey::ConfigKind(ConfigEntryKind::IngressGateway))
            || touched.iter().any(|k| match k {
                IndexKey::GatewayServices(name) => self.config_entry(ConfigEntryKind::IngressGateway, name).is_some(),
                _ => false,
            });
        if ingress_touched {
            touched.push(IndexKey::IngressGateways);
        }
        // Terminating gateways whose services changed: the connect instances of every
        // service linked or unlinked change (the gateway's instances serve them).
        for key in &touched {
            let IndexKey::GatewayServices(name) = key else { continue };
            let now = self.terminating_link_names(name);
            let before = self.terminating_links.get(name).cloned().unwrap_or_default();
            if now == before {
                continue;
            }
            bumped.extend(
                now.clone()
                    .symmetric_difference(before)
                    .into_iter()
                    .map(IndexKey::ServiceConnect),
            );
            if now.is_empty() {
                self.terminating_links.remove(name);
            } else {
                self.terminating_links.insert(name.clone(), now);
            }
        }
        bumped.extend(touched);
    }

    /// The names of the services terminating gateway `gateway` represents now.
    fn terminating_link_names(&self, gateway: &str) -> OrdSet<String> {
        match self
            .config_entry(ConfigEntryKind::TerminatingGateway, gateway)
            .as_deref()
        {
            Some(ConfigEntry::TerminatingGateway(g)) => {
                self.terminating_services(g).into_iter().map(|s| s.service).collect()
            }
            _ => OrdSet::new(),
        }
    }

    /// Recomputes every terminating gateway's represented services (after loading tables).
    pub(crate) fn rebuild_terminating_links(&mut self) {
        let names: Vec<String> = self
            .config_entries(ConfigEntryKind::TerminatingGateway)
            .iter()
            .map(|e| e.name().to_owned())
            .collect();
        self.terminating_links = names
            .into_iter()
            .map(|n| {
                let links = self.terminating_link_names(&n);
                (n, links)
            })
            .filter(|(_, links)| !links.is_empty())
            .collect();
    }

    /// The terminating gateways representing `service`.
    pub fn terminating_gateways_for(&self, service: &str) -> Vec<String> {
        self.terminating_links
            .iter()
            .filter(|(_, linked)| linked.contains(service))
            .map(|(g, _)| g.clone())
            .collect()
    }

    /// Instances of the ingress gateways that expose `service` (by name or through `*`), with
    /// their nodes and checks, ordered by gateway, node and id.
    pub fn ingress_health(&self, service: &str) -> Vec<CheckServiceNode> {
        self.config_entries(ConfigEntryKind::IngressGateway)
            .iter()
            .map(|e| e.name().to_owned())
            .filter(|g| self.gateway_services(g).iter().any(|s| s.service == service))
            .flat_map(|g| self.health(&g, false))
            .filter(|csn| csn.service.kind == ServiceKind::IngressGateway)
            .collect()
    }

    /// Whether a gateway has an entry of either kind (its key is kept while it does).
    pub(crate) fn has_gateway_entry(&self, name: &str) -> bool {
        GATEWAY_KINDS.iter().any(|k| self.config_entry(*k, name).is_some())
    }

    /// The services gateway `gateway` fronts, from its ingress-gateway and terminating-gateway
    /// entries, `*` expanded over the registered services; sorted by service, then port.
    pub fn gateway_services(&self, gateway: &str) -> Vec<GatewayService> {
        let mut out = Vec::new();
        if let Some(entry) = self.config_entry(ConfigEntryKind::IngressGateway, gateway)
            && let ConfigEntry::IngressGateway(g) = &*entry
        {
            out.extend(self.ingress_services(g));
        }
        if let Some(entry) = self.config_entry(ConfigEntryKind::TerminatingGateway, gateway)
            && let ConfigEntry::TerminatingGateway(g) = &*entry
        {
            out.extend(self.terminating_services(g));
        }
        out.sort_by(|a, b| (&a.service, a.port, &a.gateway_kind).cmp(&(&b.service, b.port, &b.gateway_kind)));
        out
    }

    /// Names of the services `*` may stand for: ordinary services (not proxies or gateways),
    /// never `consul` itself.
    fn wildcard_candidates(&self) -> BTreeSet<String> {
        self.all_services()
            .filter(|(_, s)| s.kind == ServiceKind::Typical && s.service != "consul")
            .map(|(_, s)| s.service.clone())
            .collect()
    }

    fn ingress_services(&self, g: &IngressGateway) -> Vec<GatewayService> {
        let proxy = self.config_entries(ConfigEntryKind::ProxyDefaults);
        let defaults = self.config_entries(ConfigEntryKind::ServiceDefaults);
        let central = CentralConfig::new(central_config::proxy_defaults(proxy.first()), &defaults);
        let mut candidates = None;
        // (service, port) -> link; explicit entries replace wildcard ones.
        let mut links: BTreeMap<(String, u16), GatewayService> = BTreeMap::new();
        for listener in &g.listeners {
            let base = GatewayService {
                gateway: g.name.clone(),
                gateway_kind: ServiceKind::IngressGateway,
                port: listener.port,
                protocol: listener.protocol().to_owned(),
                ..GatewayService::default()
            };
            for svc in &listener.services {
                if svc.name == WILDCARD_SERVICE {
                    let Ok(protocol) = listener.protocol().parse::<Protocol>() else {
                        continue;
                    };
                    let names = candidates.get_or_insert_with(|| self.wildcard_candidates());
                    for name in names.iter() {
                        if !listener_accepts(protocol, central.protocol_of(name)) {
                            continue;
                        }
                        links
                            .entry((name.clone(), listener.port))
                            .or_insert_with(|| GatewayService {
                                service: name.clone(),
                                from_wildcard: true,
                                ..base.clone()
                            });
                    }
                } else {
                    links.insert(
                        (svc.name.clone(), listener.port),
                        GatewayService {
                            service: svc.name.clone(),
                            hosts: svc.hosts.clone(),
                            ..base.clone()
                        },
                    );
                }
            }
        }
        links.into_values().collect()
    }

    fn terminating_services(&self, g: &TerminatingGateway) -> Vec<GatewayService> {
        let mut links: BTreeMap<String, GatewayService> = BTreeMap::new();
        let link = |name: &str, svc: &structs::config_entry::LinkedService, wildcard: bool| GatewayService {
            gateway: g.name.clone(),
            service: name.to_owned(),
            gateway_kind: ServiceKind::TerminatingGateway,
            ca_file: svc.ca_file.clone(),
            cert_file: svc.cert_file.clone(),
            key_file: svc.key_file.clone(),
            sni: svc.sni.clone(),
            from_wildcard: wildcard,
            ..GatewayService::default()
        };
        for svc in &g.services {
            if svc.name != WILDCARD_SERVICE {
                links.insert(svc.name.clone(), link(&svc.name, svc, false));
            }
        }
        if let Some(wild) = g.services.iter().find(|s| s.name == WILDCARD_SERVICE) {
            for name in self.wildcard_candidates() {
                links.entry(name.clone()).or_insert_with(|| link(&name, wild, true));
            }
        }
        links.into_values().collect()
    }
}

/// Refuses a write (`Some(entry)`) or delete (`None`) of `kind`/`name` that would leave an
/// ingress listener naming a service of another protocol family: an ingress-gateway entry
/// naming such a service, or a service-defaults/proxy-defaults change that turns a service an
/// ingress listener names into one. Only what the write changes is checked, so an
/// inconsistency that already exists does not block unrelated writes. Also refuses a gateway
/// entry whose name is already a gateway of the other kind.
pub(crate) fn check_gateways(
    state: &State,
    kind: ConfigEntryKind,
    name: &str,
    entry: Option<&ConfigEntry>,
) -> Result<(), ValidationError> {
    let proxy = state.config_entries(ConfigEntryKind::ProxyDefaults);
    let defaults = state.config_entries(ConfigEntryKind::ServiceDefaults);
    match (kind, entry) {
        (ConfigEntryKind::IngressGateway, Some(ConfigEntry::IngressGateway(g))) => {
            check_clash(state, ConfigEntryKind::TerminatingGateway, kind, name)?;
            let central = CentralConfig::new(central_config::proxy_defaults(proxy.first()), &defaults);
            check_ingress(g, &central, |_| true)
        }
        (ConfigEntryKind::TerminatingGateway, Some(_)) => {
            check_clash(state, ConfigEntryKind::IngressGateway, kind, name)
        }
        (ConfigEntryKind::ServiceDefaults | ConfigEntryKind::ProxyDefaults, _) => {
            let before = CentralConfig::new(central_config::proxy_defaults(proxy.first()), &defaults);
            let replace = |list: &[Arc<ConfigEntry>], k: ConfigEntryKind| {
                let mut list = list.to_vec();
                if k == kind {
                    list.retain(|e| e.name() != name);
                    list.extend(entry.cloned().map(Arc::new));
                }
                list
            };
            let proxy_after = replace(&proxy, ConfigEntryKind::ProxyDefaults);
            let defaults_after = replace(&defaults, ConfigEntryKind::ServiceDefaults);
            let after = CentralConfig::new(central_config::proxy_defaults(proxy_after.first()), &defaults_after);
            for e in state.config_entries(ConfigEntryKind::IngressGateway) {
                if let ConfigEntry::IngressGateway(g) = &*e {
                    check_ingress(g, &after, |svc| before.protocol_of(svc) != after.protocol_of(svc))?;
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// A gateway name belongs to one kind of gateway.
fn check_clash(
    state: &State,
    other: ConfigEntryKind,
    kind: ConfigEntryKind,
    name: &str,
) -> Result<(), ValidationError> {
    if state.config_entry(other, name).is_some() {
        return Err(ValidationError::new(
            format!("{kind} {name:?} Name"),
            Problem::Invalid(format!("{name:?} is already a {other}: a gateway has one kind")),
        ));
    }
    Ok(())
}

/// Every named service (those `changed` selects) of every listener against `central`.
fn check_ingress(
    g: &IngressGateway,
    central: &CentralConfig<'_>,
    changed: impl Fn(&str) -> bool,
) -> Result<(), ValidationError> {
    for (l, listener) in g.listeners.iter().enumerate() {
        let Ok(expected) = listener.protocol().parse::<Protocol>() else {
            continue; // refused by the entry's own validation
        };
        for (s, svc) in listener.services.iter().enumerate() {
            if svc.name == WILDCARD_SERVICE || !changed(&svc.name) {
                continue;
            }
            let got = central.protocol_of(&svc.name);
            if !listener_accepts(expected, got) {
                return Err(ValidationError::new(
                    format!(
                        "{} {:?} Listeners[{l}].Services[{s}].Name",
                        ConfigEntryKind::IngressGateway,
                        g.name
                    ),
                    Problem::Invalid(format!(
                        "service {:?} has protocol {got}, which does not match the listener's protocol {expected} \
                         (set it with a service-defaults entry)",
                        svc.name
                    )),
                ));
            }
        }
    }
    Ok(())
}
