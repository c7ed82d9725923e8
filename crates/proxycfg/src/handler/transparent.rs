//! Transparent mode: a sidecar whose application dials services by name (their virtual IP,
//! or an instance's address) rather than a local bind port. Its upstreams are, beside those
//! it declares, every service its intentions let it reach (the service graph): computed
//! from two watches every transparent proxy shares (the services with a typical instance,
//! and every `service-intentions` entry) and kept current as either changes.

use super::HandlerError;
use super::connect_proxy::ConnectProxyHandler;
use crate::data_sources::{
    ConfigEntryListRequest, DiscoveryChainRequest, HealthRequest, ServiceListRequest, UpdatePayload,
};
use crate::snapshot::{ConnectProxySnapshot, DestinationUpstream, UpstreamSnapshot};
use crate::{CorrelationId, Watches};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Weak};
use structs::config_entry::IntentionAction;
use structs::intention::WILDCARD;
use structs::{ConfigEntry, ConfigEntryKind, DestinationType, ServiceKind, UpstreamId};
use tracing::debug;

/// The services among `candidates` that `source` may reach: the intention that applies
/// first in evaluation order decides — one on the service itself before one on `*`, and on
/// each, one from `source` by name before one from `*` (Consul's precedence) — an L7
/// intention counting as allowing (the destination's proxy judges each request); with none,
/// `default_allow`. `source` itself is never its own upstream.
///
/// Every transparent proxy runs this on every intention write: one pass over the entries
/// (no intention is copied) and one over the candidates.
pub fn intention_upstreams(
    source: &str,
    candidates: &[String],
    entries: &[Arc<ConfigEntry>],
    default_allow: bool,
) -> Vec<String> {
    allowed_for(Some(source), candidates, entries, default_allow)
}

/// [`intention_upstreams`] of `source`; of a source no intention names when `None`.
fn allowed_for(
    source: Option<&str>,
    candidates: &[String],
    entries: &[Arc<ConfigEntry>],
    default_allow: bool,
) -> Vec<String> {
    if candidates.is_empty() {
        return Vec::new();
    }
    /// What the intentions from `source` (by name, and from `*`) on one destination say.
    #[derive(Default, Clone, Copy)]
    struct Said {
        by_name: Option<bool>,
        wildcard: Option<bool>,
    }
    impl Said {
        fn decision(self) -> Option<bool> {
            self.by_name.or(self.wildcard)
        }
    }
    let mut said: HashMap<&str, Said> = HashMap::new();
    for entry in entries {
        let ConfigEntry::ServiceIntentions(si) = entry.as_ref() else {
            continue;
        };
        for src in &si.sources {
            if src.source_type == "external-uri" || (Some(src.name.as_str()) != source && src.name != WILDCARD) {
                continue;
            }
            let allows = src.action == Some(IntentionAction::Allow) || !src.permissions.is_empty();
            let slot = said.entry(si.name.as_str()).or_default();
            if src.name == WILDCARD {
                slot.wildcard = Some(allows);
            } else {
                slot.by_name = Some(allows);
            }
        }
    }
    let fallback = said.get(WILDCARD).and_then(|s| s.decision()).unwrap_or(default_allow);
    candidates
        .iter()
        .filter(|name| Some(name.as_str()) != source)
        .filter(|name| said.get(name.as_str()).and_then(|s| s.decision()).unwrap_or(fallback))
        .cloned()
        .collect()
}

/// The answers of [`intention_upstreams`] for the latest inputs, by source service: after an
/// intention write every transparent proxy asks, and those of one service ask the same
/// question of the very same lists (the shared watches hand each proxy the same `Arc`s).
struct GraphMemo {
    /// The inputs the answers are for, by identity. Held weakly, which keeps their
    /// allocations from being reused: a pointer equal to one of these is the same list.
    services: Weak<Vec<String>>,
    entries: Weak<Vec<Arc<ConfigEntry>>>,
    default_allow: bool,
    /// The sources some intention names (not `*`): each has an answer of its own.
    named: HashSet<String>,
    /// The answer for a source no intention names (the wildcard sources' alone), before the
    /// source itself is taken out: shared by every such source that is not among it.
    anonymous: Arc<Vec<String>>,
    /// Answers of the other sources.
    by_source: HashMap<String, Arc<Vec<String>>>,
}

/// The memos of the latest few input pairs, newest last: proxies fold successive writes at
/// different times (one may still answer for the lists before the last write while others
/// answer for the new ones), which a single memo would make each undo the other's.
static GRAPH_MEMO: parking_lot::Mutex<Vec<GraphMemo>> = parking_lot::Mutex::new(Vec::new());

/// How many input pairs [`GRAPH_MEMO`] keeps answers for.
const GRAPH_MEMOS: usize = 4;

/// The sources that intentions among `entries` name (not `*`, not external URIs).
fn named_sources(entries: &[Arc<ConfigEntry>]) -> HashSet<String> {
    entries
        .iter()
        .filter_map(|e| match e.as_ref() {
            ConfigEntry::ServiceIntentions(si) => Some(si.sources.iter()),
            _ => None,
        })
        .flatten()
        .filter(|src| src.source_type != "external-uri" && src.name != WILDCARD)
        .map(|src| src.name.clone())
        .collect()
}

/// [`intention_upstreams`] of the candidates `services`, computed once for the same inputs
/// (a new `services` or `entries` list starts the memo afresh): once for every source no
/// intention names (the same answer for all of them, but for the source itself), once per
/// source otherwise.
fn reachable(
    memo: &parking_lot::Mutex<Vec<GraphMemo>>,
    source: &str,
    services: &Arc<Vec<String>>,
    entries: &Arc<Vec<Arc<ConfigEntry>>>,
    default_allow: bool,
) -> Arc<Vec<String>> {
    let mut memos = memo.lock();
    let found = memos.iter().position(|m| {
        std::ptr::eq(m.services.as_ptr(), Arc::as_ptr(services))
            && std::ptr::eq(m.entries.as_ptr(), Arc::as_ptr(entries))
            && m.default_allow == default_allow
    });
    let at = match found {
        Some(at) => at,
        None => {
            if memos.len() == GRAPH_MEMOS {
                memos.remove(0);
            }
            memos.push(GraphMemo {
                services: Arc::downgrade(services),
                entries: Arc::downgrade(entries),
                default_allow,
                named: named_sources(entries),
                anonymous: Arc::new(allowed_for(None, services, entries, default_allow)),
                by_source: HashMap::new(),
            });
            memos.len() - 1
        }
    };
    let memo = &mut memos[at];
    if !memo.named.contains(source) && !memo.anonymous.iter().any(|s| s == source) {
        return Arc::clone(&memo.anonymous);
    }
    let by_source = &mut memo.by_source;
    if let Some(answer) = by_source.get(source) {
        return Arc::clone(answer);
    }
    let answer = Arc::new(intention_upstreams(source, services, entries, default_allow));
    by_source.insert(source.to_owned(), Arc::clone(&answer));
    answer
}

impl ConnectProxyHandler {
    /// Starts the two watches implicit upstreams are computed from.
    pub(super) fn watch_service_graph(&self, watches: &mut Watches) {
        watches.start(
            &self.sources.service_list,
            CorrelationId::ServiceList,
            ServiceListRequest {
                datacenter: self.datacenter.clone(),
                typical_only: true,
            },
        );
        watches.start(
            &self.sources.config_entry_list,
            CorrelationId::ConfigEntryList(ConfigEntryKind::ServiceIntentions),
            ConfigEntryListRequest::shared(ConfigEntryKind::ServiceIntentions),
        );
        watches.start(
            &self.sources.config_entry_list,
            CorrelationId::ConfigEntryList(ConfigEntryKind::ServiceDefaults),
            ConfigEntryListRequest::shared(ConfigEntryKind::ServiceDefaults),
        );
    }

    /// Recomputes the destinations (services outside the mesh) the proxy may reach once
    /// the service-defaults and intentions are known: while there is one, watches the
    /// terminating-gateway entries (which gateways link each) and the instances of every
    /// gateway linking one; stops each watch no longer needed. The snapshot's maps are
    /// replaced only when their content changes.
    pub(super) fn update_destinations(
        &mut self,
        cp: &mut ConnectProxySnapshot,
        default_allow: bool,
        watches: &mut Watches,
    ) {
        let (Some(defaults), Some(entries)) = (&self.graph_destinations, &self.graph_intentions) else {
            return;
        };
        let candidates: Vec<String> = defaults.iter().map(|e| e.name().to_owned()).collect();
        let source = &self.service.proxy.destination_service_name;
        let allowed = intention_upstreams(source, &candidates, entries, default_allow);
        let gateway_list = CorrelationId::ConfigEntryList(ConfigEntryKind::TerminatingGateway);
        if allowed.is_empty() {
            if watches.cancel(&gateway_list) {
                self.graph_gateways = None;
            }
        } else {
            watches.ensure(
                &self.sources.config_entry_list,
                gateway_list,
                ConfigEntryListRequest::shared(ConfigEntryKind::TerminatingGateway),
            );
        }
        let mut destinations = BTreeMap::new();
        for entry in defaults.iter() {
            let ConfigEntry::ServiceDefaults(d) = entry.as_ref() else {
                continue;
            };
            let Some(destination) = &d.destination else { continue };
            if !allowed.contains(&d.name) {
                continue;
            }
            let gateways = linking_gateways(self.graph_gateways.as_deref().map_or(&[], |v| v), &d.name);
            let upstream = DestinationUpstream {
                destination: destination.clone(),
                protocol: d.protocol.parse().unwrap_or_default(),
                gateways,
            };
            let upstream = match cp.destinations.get(&d.name) {
                Some(same) if **same == upstream => Arc::clone(same),
                _ => Arc::new(upstream),
            };
            destinations.insert(d.name.clone(), upstream);
        }
        let needed: BTreeSet<&str> = destinations
            .values()
            .flat_map(|d| d.gateways.iter().map(String::as_str))
            .collect();
        watches.cancel_where(|w| matches!(w, CorrelationId::DestinationGateway(g) if !needed.contains(g.as_str())));
        if cp.destination_gateways.keys().any(|g| !needed.contains(g.as_str())) {
            Arc::make_mut(&mut cp.destination_gateways).retain(|g, _| needed.contains(g.as_str()));
        }
        for gateway in &needed {
            watches.ensure(
                &self.sources.health,
                CorrelationId::DestinationGateway((*gateway).to_owned()),
                HealthRequest {
                    datacenter: self.datacenter.clone(),
                    service: (*gateway).to_owned(),
                    connect: false,
                    passing_only: false,
                    healthy_only: true,
                    filter: String::new(),
                    kind: Some(ServiceKind::TerminatingGateway),
                    token: self.token.clone(),
                },
            );
        }
        let same = destinations.len() == cp.destinations.len()
            && destinations
                .iter()
                .zip(cp.destinations.iter())
                .all(|((a, x), (b, y))| a == b && Arc::ptr_eq(x, y));
        if !same {
            debug!(proxy = %self.service.id, destinations = destinations.len(), "destinations updated");
            cp.destinations = Arc::new(destinations);
        }
    }

    /// Folds in an update of the service graph's inputs (services, intentions,
    /// service-defaults, terminating-gateway entries) or of a destination's gateway.
    pub(super) fn on_graph_update(
        &mut self,
        id: CorrelationId,
        payload: UpdatePayload,
        cp: &mut ConnectProxySnapshot,
        default_allow: bool,
        watches: &mut Watches,
    ) -> Result<(), HandlerError> {
        match (id, payload) {
            (CorrelationId::ServiceList, UpdatePayload::ServiceList(names)) => {
                self.graph_services = Some(names);
                self.update_service_graph(cp, default_allow, watches);
            }
            (CorrelationId::ConfigEntryList(kind), UpdatePayload::ConfigEntryList(list)) => match kind {
                ConfigEntryKind::ServiceIntentions => {
                    self.graph_intentions = Some(list);
                    self.update_service_graph(cp, default_allow, watches);
                    self.update_destinations(cp, default_allow, watches);
                }
                ConfigEntryKind::ServiceDefaults => {
                    // Kept: the destinations alone, which every intention write looks at again.
                    let destinations = list
                        .iter()
                        .filter(|e| matches!(e.as_ref(), ConfigEntry::ServiceDefaults(d) if d.destination.is_some()));
                    self.graph_destinations = Some(destinations.cloned().collect());
                    self.update_destinations(cp, default_allow, watches);
                }
                ConfigEntryKind::TerminatingGateway => {
                    self.graph_gateways = Some(list);
                    self.update_destinations(cp, default_allow, watches);
                }
                other => {
                    return Err(HandlerError::UnknownWatch(
                        CorrelationId::ConfigEntryList(other).to_string(),
                    ));
                }
            },
            (CorrelationId::DestinationGateway(gateway), UpdatePayload::Health(nodes)) => {
                Arc::make_mut(&mut cp.destination_gateways).insert(gateway, nodes);
            }
            (id, payload) => return Err(super::connect_proxy::unexpected(&id, &payload)),
        }
        Ok(())
    }

    /// Recomputes the implicit upstreams once both inputs are known: a service newly
    /// allowed gets an upstream (its chain watched as any upstream's), one no longer allowed
    /// loses it with every watch it had. Declared upstreams are left as they are.
    pub(super) fn update_service_graph(
        &self,
        cp: &mut ConnectProxySnapshot,
        default_allow: bool,
        watches: &mut Watches,
    ) {
        let (Some(candidates), Some(entries)) = (&self.graph_services, &self.graph_intentions) else {
            return;
        };
        let source = &self.service.proxy.destination_service_name;
        let allowed = reachable(&GRAPH_MEMO, source, candidates, entries, default_allow);
        if cp
            .intention_upstreams
            .as_ref()
            .is_some_and(|known| Arc::ptr_eq(known, &allowed) || *known == allowed)
        {
            return;
        }
        let (wanted, gone) = implicit_changes(cp, &allowed);
        let upstreams = Arc::make_mut(&mut cp.upstreams);
        for id in &gone {
            upstreams.remove(id);
            watches.cancel_where(|w| w.upstream() == Some(&**id));
        }
        let mut added = 0;
        for id in wanted {
            if upstreams.contains_key(&id) {
                continue;
            }
            let req = DiscoveryChainRequest {
                datacenter: self.datacenter.clone(),
                name: id.name.clone(),
                namespace: id.namespace.clone(),
                override_protocol: None,
                override_connect_timeout_ms: 0,
                override_mesh_gateway: self.service.proxy.mesh_gateway.mode,
            };
            watches.start(
                &self.sources.discovery_chain,
                CorrelationId::DiscoveryChain(Arc::clone(&id)),
                req,
            );
            upstreams.insert(id, Arc::new(UpstreamSnapshot::new(UpstreamSnapshot::IMPLICIT)));
            added += 1;
        }
        debug!(
            proxy = %self.service.id,
            added,
            removed = gone.len(),
            reachable = allowed.len(),
            "implicit upstreams updated"
        );
        cp.intention_upstreams = Some(allowed);
    }
}

/// The implicit upstreams `allowed` (the new answer) may add, and those it removes. Against
/// the last answer only the names it gained or lost are looked at (every implicit upstream
/// came from an answer); the first answer is compared with the upstreams themselves.
fn implicit_changes(cp: &ConnectProxySnapshot, allowed: &[String]) -> (Vec<Arc<UpstreamId>>, Vec<Arc<UpstreamId>>) {
    let implicit = |id: &UpstreamId| {
        cp.upstreams
            .get_key_value(id)
            .filter(|(_, u)| ConnectProxySnapshot::is_implicit(u))
            .map(|(k, _)| Arc::clone(k))
    };
    match cp.intention_upstreams.as_deref() {
        Some(before) => {
            let now: HashSet<&str> = allowed.iter().map(String::as_str).collect();
            let was: HashSet<&str> = before.iter().map(String::as_str).collect();
            let wanted = allowed
                .iter()
                .filter(|name| !was.contains(name.as_str()))
                .map(|name| Arc::new(implicit_id(name)))
                .collect();
            let gone = before
                .iter()
                .filter(|name| !now.contains(name.as_str()))
                .filter_map(|name| implicit(&implicit_id(name)))
                .collect();
            (wanted, gone)
        }
        None => {
            let wanted: BTreeSet<Arc<UpstreamId>> = allowed.iter().map(|name| Arc::new(implicit_id(name))).collect();
            let gone = cp
                .upstreams
                .iter()
                .filter(|(id, u)| ConnectProxySnapshot::is_implicit(u) && !wanted.contains(*id))
                .map(|(id, _)| Arc::clone(id))
                .collect();
            (wanted.into_iter().collect(), gone)
        }
    }
}

/// The terminating gateways whose entry among `entries` links `service` (by name or `*`).
fn linking_gateways(entries: &[Arc<ConfigEntry>], service: &str) -> Vec<String> {
    entries
        .iter()
        .filter_map(|e| match e.as_ref() {
            ConfigEntry::TerminatingGateway(g)
                if g.services.iter().any(|s| s.name == service || s.name == WILDCARD) =>
            {
                Some(g.name.clone())
            }
            _ => None,
        })
        .collect()
}

/// The id of the implicit upstream to `name`: the same as a declared upstream's to it, so a
/// service declared and allowed is one upstream (the declared one).
pub fn implicit_id(name: &str) -> UpstreamId {
    UpstreamId {
        destination_type: DestinationType::Service,
        namespace: "default".to_owned(),
        name: name.to_owned(),
        datacenter: String::new(),
        peer: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intentions(json: serde_json::Value) -> Arc<ConfigEntry> {
        #[allow(clippy::unwrap_used)]
        Arc::new(serde_json::from_value(json).unwrap())
    }

    /// Proxies of one service asking of the same lists share one answer; another service,
    /// or a new list, gets its own.
    #[test]
    fn the_service_graph_is_answered_once_per_source_for_the_same_lists() {
        let memo = parking_lot::Mutex::new(Vec::new());
        let services = Arc::new(vec!["api".to_owned(), "db".to_owned(), "web".to_owned()]);
        let entries = Arc::new(vec![intentions(serde_json::json!({
            "Kind": "service-intentions", "Name": "db",
            "Sources": [{"Name": "web", "Action": "deny"}]
        }))]);
        let first = reachable(&memo, "web", &services, &entries, true);
        assert_eq!(*first, vec!["api".to_owned()]);
        assert!(Arc::ptr_eq(&first, &reachable(&memo, "web", &services, &entries, true)));
        let api = reachable(&memo, "api", &services, &entries, true);
        assert_eq!(*api, vec!["db".to_owned(), "web".to_owned()]);
        // The same content in a new list: computed again (and the same answer).
        let copy = Arc::new((*entries).clone());
        let again = reachable(&memo, "web", &services, &copy, true);
        assert!(!Arc::ptr_eq(&first, &again));
        assert_eq!(first, again);
        // Sources no intention names share one answer (db's: `*` is not denied db).
        let cache = reachable(&memo, "cache", &services, &entries, true);
        assert_eq!(*cache, vec!["api".to_owned(), "db".to_owned(), "web".to_owned()]);
        assert!(Arc::ptr_eq(
            &cache,
            &reachable(&memo, "other", &services, &entries, true)
        ));
        // Default deny: nothing without an allow intention.
        assert!(reachable(&memo, "web", &services, &copy, false).is_empty());
        // The first lists' answers are still known beside the new ones.
        assert!(Arc::ptr_eq(&first, &reachable(&memo, "web", &services, &entries, true)));
    }
}
