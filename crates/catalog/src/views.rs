//! Read views computed from a [`State`]: what queries and topics return.

use crate::keys::IndexKey;
use crate::state::State;
use std::{collections::BTreeMap, time::SystemTime};
use structs::Index;
use structs::query::PreparedQuery;
use structs::{
    CheckServiceNode, ConfigEntry, ConfigEntryKind, HealthCheck, IndexedCaRoots, Intention, Node, NodeService,
    intention,
};

impl State {
    /// The prepared query `asked` names: by id, else by exact name, else the template whose
    /// name is the longest prefix of it; rendered for that name.
    pub fn resolve_query(&self, asked: &str) -> Option<PreparedQuery> {
        if let Some(found) = self.query(asked) {
            return Some(found.render(asked));
        }
        let named = self.queries().find(|pq| !pq.is_template() && pq.name == asked);
        let template = || {
            self.queries()
                .filter(|pq| pq.is_template() && asked.starts_with(pq.name.as_str()))
                .max_by_key(|pq| pq.name.len())
        };
        named.or_else(template).map(|pq| pq.render(asked))
    }

    /// The prepared query `asked` names ([`State::resolve_query`]), the key its result
    /// follows besides [`IndexKey::Queries`] (its service's instances, the connect-capable
    /// ones with `connect` or the query's `Connect.Enabled`; the queries alone while it does
    /// not exist), and the index it answers with: the later of the two.
    pub fn query_watch(&self, asked: &str, connect: bool) -> (Option<PreparedQuery>, IndexKey, Index) {
        let query = self.resolve_query(asked);
        let key = match &query {
            Some(q) if connect || q.service.connect.enabled => IndexKey::ServiceConnect(q.service.service.clone()),
            Some(q) => IndexKey::Service(q.service.service.clone()),
            None => IndexKey::Queries,
        };
        let index = self.index_of(&IndexKey::Queries).max(self.index_of(&key));
        (query, key, index)
    }

    /// The instances a (resolved) prepared query selects: those of its service, or with
    /// `connect` (or the query's own `Connect.Enabled`) the connect-capable ones, whose
    /// checks it admits; ordered by node then id. Who may read them is the caller's to judge.
    pub fn query_nodes(&self, query: &PreparedQuery, connect: bool) -> Vec<CheckServiceNode> {
        self.health(&query.service.service, connect || query.service.connect.enabled)
            .into_iter()
            .filter(|csn| query.admits(csn))
            .collect()
    }

    fn check_service_node(&self, node_name: &str, svc: &NodeService) -> Option<CheckServiceNode> {
        let node: Node = (*self.node(node_name)?).clone();
        let checks: Vec<HealthCheck> = self
            .node_checks(node_name)
            .into_iter()
            .filter(|c| c.service_id.is_empty() || c.service_id == svc.id)
            .map(|c| (*c).clone())
            .collect();
        let mut service = svc.clone();
        crate::virtual_ips::tag(self, &mut service);
        Some(CheckServiceNode { node, service, checks })
    }

    /// Instances of `service` (or, with `connect`, the connect-capable instances for it) with
    /// their nodes and checks, ordered by node then id.
    pub fn health(&self, service: &str, connect: bool) -> Vec<CheckServiceNode> {
        let instances = if connect {
            // Its sidecars (or itself if native), and the instances of the terminating
            // gateways that represent it: callers in the mesh reach it through them.
            let mut all = self.connect_instances(service);
            for gateway in self.terminating_gateways_for(service) {
                all.extend(
                    self.service_instances(&gateway)
                        .into_iter()
                        .filter(|(_, s)| s.kind == structs::ServiceKind::TerminatingGateway),
                );
            }
            all
        } else {
            self.service_instances(service)
        };
        let mut out: Vec<CheckServiceNode> = instances
            .iter()
            .filter_map(|(node, svc)| self.check_service_node(node, svc))
            .collect();
        if connect {
            // A terminating gateway's instances stand for the service: they carry its address.
            for csn in out
                .iter_mut()
                .filter(|c| c.service.kind == structs::ServiceKind::TerminatingGateway)
            {
                crate::virtual_ips::tag_as(self, service, &mut csn.service);
            }
        }
        out.sort_by(|a, b| (&a.node.node, &a.service.id).cmp(&(&b.node.node, &b.service.id)));
        out
    }

    /// Checks of every instance of a service.
    pub fn service_checks(&self, service: &str) -> Vec<HealthCheck> {
        self.service_instances(service)
            .iter()
            .flat_map(|(node, svc)| {
                self.node_checks(node)
                    .into_iter()
                    .filter(|c| c.service_id == svc.id)
                    .map(|c| (*c).clone())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Service names with the union of their instances' tags.
    pub fn service_tags(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
        for (_, svc) in self.all_services() {
            out.entry(svc.service.clone())
                .or_default()
                .extend(svc.tags.iter().cloned());
        }
        out.into_iter().map(|(k, v)| (k, v.into_iter().collect())).collect()
    }

    /// Every intention, flattened from `service-intentions` entries, in evaluation order.
    pub fn intentions(&self) -> Vec<Intention> {
        let mut all: Vec<Intention> = self
            .config_entries(ConfigEntryKind::ServiceIntentions)
            .iter()
            .filter_map(|e| match &**e {
                ConfigEntry::ServiceIntentions(si) => Some(intention::from_config_entry(si)),
                _ => None,
            })
            .flatten()
            .collect();
        all.sort_by(Intention::evaluation_order);
        all
    }

    /// Intentions that apply to `destination` (exact or `*`), in evaluation order.
    pub fn intentions_for_destination(&self, destination: &str) -> Vec<Intention> {
        self.intentions()
            .into_iter()
            .filter(|i| i.matches_destination(destination))
            .collect()
    }

    /// The CA trust bundle as of now (empty before the CA is bootstrapped).
    pub fn ca_roots(&self) -> IndexedCaRoots {
        self.ca().map(|ca| ca.bundle(SystemTime::now())).unwrap_or_default()
    }

    /// Every service name, sorted.
    pub fn service_names(&self) -> Vec<String> {
        self.service_tags().into_keys().collect()
    }

    /// The name of every service with a typical instance (not a proxy or gateway), sorted.
    pub fn typical_service_names(&self) -> Vec<String> {
        let names: std::collections::BTreeSet<&str> = self
            .all_services()
            .filter(|(_, svc)| svc.kind == structs::ServiceKind::Typical)
            .map(|(_, svc)| svc.service.as_str())
            .collect();
        names.into_iter().map(str::to_owned).collect()
    }
}
