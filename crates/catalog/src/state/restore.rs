//! What a snapshot restore writes: the changes that turn a state into a snapshot's.

use super::{PersistedState, State};
use crate::state::Change;
use std::collections::HashSet;

impl State {
    /// The changes that make this state hold exactly `to`'s rows: every row absent from
    /// `to` deleted (checks and services before their nodes, keys before their sessions),
    /// then every row of `to` put (nodes before their services and checks, sessions before
    /// the keys they lock). Applied as one write, every row is stamped with that write's
    /// index, so no index a client has seen goes backwards.
    ///
    /// The CA and the ACL bootstrap mark are only ever replaced or set: a snapshot without a
    /// CA keeps this state's CA, and one taken before ACLs were bootstrapped leaves them
    /// bootstrapped here. Sessions with a TTL count it again from `now_ms`, as Consul's
    /// servers restart their timers after a restore: a snapshot's age does not end them.
    pub fn restore_changes(&self, to: &PersistedState, now_ms: u64) -> Vec<Change> {
        let mut out = Vec::new();
        self.restore_deletes(to, &mut out);
        out.extend(to.nodes.iter().cloned().map(Change::PutNode));
        out.extend(
            to.services
                .iter()
                .cloned()
                .map(|(node, service)| Change::PutService { node, service }),
        );
        out.extend(to.checks.iter().cloned().map(Change::PutCheck));
        out.extend(to.config.iter().cloned().map(Change::PutConfig));
        out.extend(to.ca.iter().cloned().map(Change::PutCa));
        out.extend(to.acl_policies.iter().cloned().map(Change::PutAclPolicy));
        out.extend(to.acl_roles.iter().cloned().map(Change::PutAclRole));
        out.extend(to.acl_tokens.iter().cloned().map(Change::PutAclToken));
        out.extend(to.acl_auth_methods.iter().cloned().map(Change::PutAclAuthMethod));
        out.extend(to.acl_binding_rules.iter().cloned().map(Change::PutAclBindingRule));
        if to.acl_bootstrapped.is_some() && self.acl.bootstrapped.is_none() {
            out.push(Change::AclBootstrapped);
        }
        out.extend(to.sessions.iter().cloned().map(|mut session| {
            if !session.ttl.is_empty() {
                session.renewed_at_ms = session.renewed_at_ms.max(now_ms);
            }
            Change::PutSession(session)
        }));
        out.extend(to.kv.iter().cloned().map(Change::PutKv));
        out.extend(to.lock_delays.iter().map(|(key, until_ms)| Change::PutLockDelay {
            key: key.clone(),
            until_ms: *until_ms,
        }));
        out.extend(to.events.iter().cloned().map(Change::PutEvent));
        out.extend(to.queries.iter().cloned().map(Change::PutQuery));
        out.extend(to.virtual_ips.iter().map(|(service, ip)| Change::PutVirtualIp {
            service: service.clone(),
            ip: *ip,
        }));
        out.extend(to.peerings.iter().cloned().map(|p| Change::PutPeering(Box::new(p))));
        out.extend(to.imported.iter().cloned().map(|(peer, service)| Change::PutImported {
            peer,
            service: Box::new(service),
        }));
        // The servers' addresses are this cluster's, not the snapshot's: kept as they are.
        out
    }

    fn restore_deletes(&self, to: &PersistedState, out: &mut Vec<Change>) {
        let checks: HashSet<(&str, &str)> = to
            .checks
            .iter()
            .map(|c| (c.node.as_str(), c.check_id.as_str()))
            .collect();
        for (node, id) in self.checks.keys() {
            if !checks.contains(&(node.as_str(), id.as_str())) {
                out.push(Change::DeleteCheck {
                    node: node.clone(),
                    id: id.clone(),
                });
            }
        }
        let services: HashSet<(&str, &str)> = to.services.iter().map(|(n, s)| (n.as_str(), s.id.as_str())).collect();
        for (node, id) in self.services.keys() {
            if !services.contains(&(node.as_str(), id.as_str())) {
                out.push(Change::DeleteService {
                    node: node.clone(),
                    id: id.clone(),
                });
            }
        }
        let nodes: HashSet<&str> = to.nodes.iter().map(|n| n.node.as_str()).collect();
        out.extend(
            self.nodes
                .keys()
                .filter(|n| !nodes.contains(n.as_str()))
                .cloned()
                .map(Change::DeleteNode),
        );
        let config: HashSet<_> = to.config.iter().map(|e| (e.kind(), e.name())).collect();
        for (kind, name) in self.config.keys() {
            if !config.contains(&(*kind, name.as_str())) {
                out.push(Change::DeleteConfig(*kind, name.clone()));
            }
        }
        self.restore_acl_deletes(to, out);
        self.restore_store_deletes(to, out);
    }

    /// The ACL rows `to` lacks.
    fn restore_acl_deletes(&self, to: &PersistedState, out: &mut Vec<Change>) {
        let tokens: HashSet<&str> = to.acl_tokens.iter().map(|t| t.accessor_id.as_str()).collect();
        out.extend(
            self.acl
                .tokens
                .keys()
                .filter(|a| !tokens.contains(a.as_str()))
                .cloned()
                .map(Change::DeleteAclToken),
        );
        let rules: HashSet<&str> = to.acl_binding_rules.iter().map(|r| r.id.as_str()).collect();
        out.extend(
            self.acl
                .binding_rules
                .keys()
                .filter(|r| !rules.contains(r.as_str()))
                .cloned()
                .map(Change::DeleteAclBindingRule),
        );
        let methods: HashSet<&str> = to.acl_auth_methods.iter().map(|m| m.name.as_str()).collect();
        out.extend(
            self.acl
                .auth_methods
                .keys()
                .filter(|m| !methods.contains(m.as_str()))
                .cloned()
                .map(Change::DeleteAclAuthMethod),
        );
        let roles: HashSet<&str> = to.acl_roles.iter().map(|r| r.id.as_str()).collect();
        out.extend(
            self.acl
                .roles
                .keys()
                .filter(|r| !roles.contains(r.as_str()))
                .cloned()
                .map(Change::DeleteAclRole),
        );
        let policies: HashSet<&str> = to.acl_policies.iter().map(|p| p.id.as_str()).collect();
        out.extend(
            self.acl
                .policies
                .keys()
                .filter(|p| !policies.contains(p.as_str()))
                .cloned()
                .map(Change::DeleteAclPolicy),
        );
    }

    /// The KV keys, lock delays, sessions, events and prepared queries `to` lacks.
    fn restore_store_deletes(&self, to: &PersistedState, out: &mut Vec<Change>) {
        let kv: HashSet<&str> = to.kv.iter().map(|e| e.key.as_str()).collect();
        out.extend(
            self.kv
                .entries
                .keys()
                .filter(|k| !kv.contains(k.as_str()))
                .cloned()
                .map(Change::DeleteKv),
        );
        let delays: HashSet<&str> = to.lock_delays.iter().map(|(k, _)| k.as_str()).collect();
        out.extend(
            self.lock_delays
                .keys()
                .filter(|k| !delays.contains(k.as_str()))
                .cloned()
                .map(Change::DeleteLockDelay),
        );
        let sessions: HashSet<&str> = to.sessions.iter().map(|s| s.id.as_str()).collect();
        out.extend(
            self.sessions
                .keys()
                .filter(|s| !sessions.contains(s.as_str()))
                .cloned()
                .map(Change::DeleteSession),
        );
        let events: HashSet<u64> = to.events.iter().map(|e| e.ltime).collect();
        out.extend(
            self.events
                .keys()
                .filter(|l| !events.contains(l))
                .copied()
                .map(Change::DeleteEvent),
        );
        let queries: HashSet<&str> = to.queries.iter().map(|q| q.id.as_str()).collect();
        out.extend(
            self.queries
                .keys()
                .filter(|q| !queries.contains(q.as_str()))
                .cloned()
                .map(Change::DeleteQuery),
        );
        let virtual_ips: HashSet<&str> = to.virtual_ips.iter().map(|(s, _)| s.as_str()).collect();
        out.extend(
            self.virtual_ips
                .keys()
                .filter(|s| !virtual_ips.contains(s.as_str()))
                .cloned()
                .map(Change::DeleteVirtualIp),
        );
        let imported: HashSet<(&str, &str)> = to
            .imported
            .iter()
            .map(|(peer, s)| (peer.as_str(), s.name.as_str()))
            .collect();
        out.extend(
            self.imported
                .keys()
                .filter(|(peer, s)| !imported.contains(&(peer.as_str(), s.as_str())))
                .map(|(peer, service)| Change::DeleteImported {
                    peer: peer.clone(),
                    service: service.clone(),
                }),
        );
        let peerings: HashSet<&str> = to.peerings.iter().map(|p| p.peering.name.as_str()).collect();
        out.extend(
            self.peerings
                .keys()
                .filter(|p| !peerings.contains(p.as_str()))
                .cloned()
                .map(Change::DeletePeering),
        );
    }
}
