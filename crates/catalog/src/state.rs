//! The catalog's tables at one index: an immutable value readers share.
//!
//! Tables are persistent maps (`imbl`), so a write clones the state in O(1) and changes only
//! the paths it touches; readers keep whatever version they hold for as long as they like.

use crate::ca::CaState;
use crate::keys::IndexKey;
use imbl::{OrdMap, OrdSet};
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::sync::Arc;
use structs::acl::{AclAuthMethod, AclBindingRule, AclPolicy, AclRole, AclToken};
use structs::audit::AuditRecord;
use structs::event::UserEvent;
use structs::query::PreparedQuery;
use structs::session::Session;
use structs::{ConfigEntry, ConfigEntryKind, HealthCheck, Index, KvEntry, Node, NodeService, ServiceKind};

mod audit;
mod peering;
mod restore;

/// One deterministic change to the tables; a committed write is a list of these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Change {
    /// Create or replace a node.
    PutNode(Node),
    /// Remove a node (its services and checks are removed by their own changes).
    DeleteNode(String),
    /// Create or replace a service instance on a node.
    PutService {
        /// Node name.
        node: String,
        /// The instance.
        service: NodeService,
    },
    /// Remove a service instance.
    DeleteService {
        /// Node name.
        node: String,
        /// Instance id.
        id: String,
    },
    /// Create or replace a check.
    PutCheck(HealthCheck),
    /// Remove a check.
    DeleteCheck {
        /// Node name.
        node: String,
        /// Check id.
        id: String,
    },
    /// Create or replace a config entry.
    PutConfig(ConfigEntry),
    /// Remove a config entry.
    DeleteConfig(ConfigEntryKind, String),
    /// Replace the CA state.
    PutCa(CaState),
    /// Create or replace an ACL token (by accessor id).
    PutAclToken(AclToken),
    /// Remove an ACL token.
    DeleteAclToken(String),
    /// Create or replace an ACL policy (by id).
    PutAclPolicy(AclPolicy),
    /// Remove an ACL policy.
    DeleteAclPolicy(String),
    /// Create or replace an ACL role (by id).
    PutAclRole(AclRole),
    /// Remove an ACL role.
    DeleteAclRole(String),
    /// Create or replace an auth method (by name).
    PutAclAuthMethod(AclAuthMethod),
    /// Remove an auth method.
    DeleteAclAuthMethod(String),
    /// Create or replace a binding rule (by id).
    PutAclBindingRule(AclBindingRule),
    /// Remove a binding rule.
    DeleteAclBindingRule(String),
    /// ACLs were bootstrapped (no second bootstrap).
    AclBootstrapped,
    /// Create or replace a KV key (its indexes are stamped when applied).
    PutKv(KvEntry),
    /// Remove a KV key (leaving a tombstone, so that its prefixes' indexes move on).
    DeleteKv(String),
    /// Create or replace a session (its indexes are stamped when applied).
    PutSession(Session),
    /// Remove a session (its locks are released by their own changes).
    DeleteSession(String),
    /// A key whose lock a session lost may not be locked again until `until_ms`.
    PutLockDelay {
        /// The key.
        key: String,
        /// Milliseconds since the epoch.
        until_ms: u64,
    },
    /// A lock delay is over.
    DeleteLockDelay(String),
    /// Keep a fired user event (by its `LTime`).
    PutEvent(UserEvent),
    /// Drop a kept user event (by its `LTime`).
    DeleteEvent(u64),
    /// Keep an audit record (by its `Seq`; its `Index` is stamped when applied).
    PutAudit(Box<AuditRecord>),
    /// Drop an audit record past the retention (by its `Seq`).
    DeleteAudit(u64),
    /// Create or replace a prepared query (by id; indexes stamped when applied).
    PutQuery(PreparedQuery),
    /// Remove a prepared query.
    DeleteQuery(String),
    /// A service's virtual IP (see [`crate::virtual_ips`]).
    PutVirtualIp {
        /// The service.
        service: String,
        /// Its address, in `240.0.0.0/4`.
        ip: Ipv4Addr,
    },
    /// A service's virtual IP is released (a restore that has none for it).
    DeleteVirtualIp(String),
    /// Create or replace a peering (by name; its indexes are stamped when applied).
    PutPeering(Box<structs::peering::StoredPeering>),
    /// Remove a peering (by name).
    DeletePeering(String),
    /// Create or replace a service a peer exports here.
    PutImported {
        /// The peer, by name.
        peer: String,
        /// The service as the peer sent it.
        service: Box<structs::peering::ImportedService>,
    },
    /// A peer no longer exports a service here.
    DeleteImported {
        /// The peer, by name.
        peer: String,
        /// The service.
        service: String,
    },
    /// This cluster's servers' peering addresses (written by the leader as they change).
    PutPeeringServers(Vec<String>),
}

type NodeKey = (String, String);

/// The catalog at one index.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// Index of the last committed write.
    pub index: Index,
    nodes: OrdMap<String, Arc<Node>>,
    services: OrdMap<NodeKey, Arc<NodeService>>,
    /// (service name, node, id): instances by name.
    by_name: OrdSet<(String, String, String)>,
    /// (destination name, node, id): connect-capable instances by the service they serve.
    by_connect: OrdSet<(String, String, String)>,
    checks: OrdMap<NodeKey, Arc<HealthCheck>>,
    pub(crate) config: OrdMap<(ConfigEntryKind, String), Arc<ConfigEntry>>,
    ca: Option<Arc<CaState>>,
    acl: AclTables,
    kv: KvTables,
    sessions: OrdMap<String, Arc<Session>>,
    /// Keys that may not be locked again before a time (ms since the epoch), after the
    /// session holding them ended.
    lock_delays: OrdMap<String, u64>,
    /// The most recent user events, by `LTime`.
    events: OrdMap<u64, Arc<UserEvent>>,
    /// Prepared queries, by id.
    queries: OrdMap<String, Arc<PreparedQuery>>,
    /// The audit log, by `Seq`.
    audit: OrdMap<u64, Arc<AuditRecord>>,
    /// Derived: the `Seq`s of the refused requests' records (bounded apart, see
    /// [`State::audit_changes`]).
    audit_refused: OrdSet<u64>,
    /// Services' virtual IPs, by service name.
    virtual_ips: OrdMap<String, Ipv4Addr>,
    /// Peerings, by the name this cluster gives the peer.
    peerings: OrdMap<String, Arc<structs::peering::StoredPeering>>,
    /// Services peers export here, by (peer, service).
    imported: OrdMap<(String, String), Arc<structs::peering::ImportedService>>,
    /// This cluster's servers' peering (gRPC TLS) addresses.
    peering_servers: Arc<Vec<String>>,
    indexes: OrdMap<IndexKey, Index>,
    /// Derived: the services each terminating gateway represents (its connect instances
    /// serve them), kept to know which services' connect instances a change moves.
    pub(crate) terminating_links: OrdMap<String, OrdSet<String>>,
}

/// The KV store: keys, and where keys were deleted (tombstones: the index of each delete,
/// so that a prefix's index moves on when a key under it goes; see [`State::kv_prefix_index`]).
#[derive(Debug, Clone, Default)]
struct KvTables {
    entries: OrdMap<String, Arc<KvEntry>>,
    /// (session, key): the keys each session holds the lock of (derived from `entries`, so
    /// that ending a session does not scan the whole store).
    held: OrdSet<(String, String)>,
    tombstones: OrdMap<String, Index>,
    /// The least index a prefix with anything under it answers with: raised when the
    /// tables are reloaded (from etcd), so that a prefix's index never goes backwards.
    floor: Index,
}

/// How many KV tombstones are kept; past it the older half is dropped (see
/// [`KvTables::reap_tombstones`]).
const KV_TOMBSTONES: usize = 10_000;
#[cfg(test)]
pub(crate) const KV_TOMBSTONES_FOR_TESTS: usize = KV_TOMBSTONES;

impl KvTables {
    /// Stores an entry, keeping `held` in step.
    fn insert(&mut self, entry: Arc<KvEntry>) {
        self.remove(&entry.key);
        if !entry.session.is_empty() {
            self.held.insert((entry.session.clone(), entry.key.clone()));
        }
        self.entries.insert(entry.key.clone(), entry);
    }

    /// Removes an entry, keeping `held` in step; true if there was one.
    fn remove(&mut self, key: &str) -> bool {
        let Some(old) = self.entries.remove(key) else {
            return false;
        };
        if !old.session.is_empty() {
            self.held.remove(&(old.session.clone(), old.key.clone()));
        }
        true
    }

    /// Drops the older half of the tombstones and raises the floor to the newest dropped,
    /// so that no prefix's index goes backwards: a prefix whose last change was a dropped
    /// delete answers with the floor (its watchers wake once, and find nothing changed).
    /// Done as the tables apply a delete, so every replay and every server does the same.
    fn reap_tombstones(&mut self) {
        let mut indexes: Vec<Index> = self.tombstones.values().copied().collect();
        indexes.sort_unstable();
        let up_to = indexes[indexes.len() / 2];
        self.tombstones = self
            .tombstones
            .iter()
            .filter(|(_, i)| **i > up_to)
            .map(|(k, i)| (k.clone(), *i))
            .collect();
        self.floor = self.floor.max(up_to);
    }
}

/// ACL tokens (by accessor and by secret), policies and roles (by id and by name).
#[derive(Debug, Clone, Default)]
struct AclTables {
    tokens: OrdMap<String, Arc<AclToken>>,
    secrets: OrdMap<String, String>,
    policies: OrdMap<String, Arc<AclPolicy>>,
    policy_names: OrdMap<String, String>,
    roles: OrdMap<String, Arc<AclRole>>,
    role_names: OrdMap<String, String>,
    auth_methods: OrdMap<String, Arc<AclAuthMethod>>,
    binding_rules: OrdMap<String, Arc<AclBindingRule>>,
    /// The index of the bootstrap, once done.
    bootstrapped: Option<Index>,
}

impl AclTables {
    /// Stores a token (replacing its secret's entry), keeping its create index.
    fn put_token(&mut self, index: Index, token: &AclToken) {
        let mut t = token.clone();
        if let Some(old) = self.tokens.get(&t.accessor_id) {
            t.create_index = old.create_index;
            self.secrets.remove(&old.secret_id);
        } else {
            t.create_index = index;
        }
        t.modify_index = index;
        self.secrets.insert(t.secret_id.clone(), t.accessor_id.clone());
        self.tokens.insert(t.accessor_id.clone(), Arc::new(t));
    }

    /// Removes a token; true if there was one.
    fn delete_token(&mut self, accessor: &str) -> bool {
        let Some(old) = self.tokens.remove(accessor) else {
            return false;
        };
        self.secrets.remove(&old.secret_id);
        true
    }

    /// Stores a policy (replacing its name's entry), keeping its create index.
    fn put_policy(&mut self, index: Index, policy: &AclPolicy) {
        let mut p = policy.clone();
        if let Some(old) = self.policies.get(&p.id) {
            p.create_index = old.create_index;
            self.policy_names.remove(&old.name);
        } else {
            p.create_index = index;
        }
        p.modify_index = index;
        self.policy_names.insert(p.name.clone(), p.id.clone());
        self.policies.insert(p.id.clone(), Arc::new(p));
    }

    /// Removes a policy; true if there was one.
    fn delete_policy(&mut self, id: &str) -> bool {
        let Some(old) = self.policies.remove(id) else {
            return false;
        };
        self.policy_names.remove(&old.name);
        true
    }

    /// Stores a role (replacing its name's entry), keeping its create index.
    fn put_role(&mut self, index: Index, role: &AclRole) {
        let mut r = role.clone();
        if let Some(old) = self.roles.get(&r.id) {
            r.create_index = old.create_index;
            self.role_names.remove(&old.name);
        } else {
            r.create_index = index;
        }
        r.modify_index = index;
        self.role_names.insert(r.name.clone(), r.id.clone());
        self.roles.insert(r.id.clone(), Arc::new(r));
    }

    /// Stores an auth method, keeping its create index.
    fn put_auth_method(&mut self, index: Index, method: &AclAuthMethod) {
        let mut m = method.clone();
        m.create_index = self.auth_methods.get(&m.name).map_or(index, |o| o.create_index);
        m.modify_index = index;
        self.auth_methods.insert(m.name.clone(), Arc::new(m));
    }

    /// Stores a binding rule, keeping its create index.
    fn put_binding_rule(&mut self, index: Index, rule: &AclBindingRule) {
        let mut r = rule.clone();
        r.create_index = self.binding_rules.get(&r.id).map_or(index, |o| o.create_index);
        r.modify_index = index;
        self.binding_rules.insert(r.id.clone(), Arc::new(r));
    }

    /// Removes a role; true if there was one.
    fn delete_role(&mut self, id: &str) -> bool {
        let Some(old) = self.roles.remove(id) else {
            return false;
        };
        self.role_names.remove(&old.name);
        true
    }
}

/// The service name an instance is connect-capable for, if any.
pub(crate) fn connect_target(svc: &NodeService) -> Option<&str> {
    match svc.kind {
        ServiceKind::ConnectProxy => Some(svc.proxy.destination_service_name.as_str()),
        ServiceKind::Typical if svc.connect.native => Some(svc.service.as_str()),
        _ => None,
    }
}

fn range_of<V: Clone>(map: &OrdMap<NodeKey, V>, node: &str) -> Vec<(NodeKey, V)> {
    map.range((node.to_owned(), String::new())..)
        .take_while(|((n, _), _)| n == node)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

impl State {
    /// Applies one committed write's changes at `index`, stamping rows and bumping the
    /// index keys they touch. Returns the keys bumped.
    pub fn apply(&mut self, index: Index, changes: &[Change]) -> Vec<IndexKey> {
        let mut bumped = OrdSet::new();
        for change in changes {
            self.apply_one(index, change, &mut bumped);
        }
        self.touch_gateways(&mut bumped);
        self.touch_api_gateways(&mut bumped);
        for key in &bumped {
            if self.gone(key) {
                // The object is gone: its key answers with its table's index, which this
                // write bumped too (so it never goes backwards), and churn of names leaves
                // no entry behind.
                self.indexes.remove(key);
            } else {
                self.indexes.insert(key.clone(), index);
            }
        }
        self.index = index;
        bumped.into_iter().collect()
    }

    /// Whether a per-object key names something that no longer exists (its table's key
    /// answers for it).
    fn gone(&self, key: &IndexKey) -> bool {
        let none_in = |set: &OrdSet<(String, String, String)>, name: &str| {
            set.range((name.to_owned(), String::new(), String::new())..)
                .next()
                .is_none_or(|(n, _, _)| n != name)
        };
        match key {
            IndexKey::Node(n) => !self.nodes.contains_key(n),
            IndexKey::Service(s) => none_in(&self.by_name, s),
            IndexKey::ServiceConnect(s) => none_in(&self.by_connect, s) && self.terminating_gateways_for(s).is_empty(),
            IndexKey::ConfigEntry(k, n) => !self.config.contains_key(&(*k, n.clone())),
            IndexKey::GatewayServices(n) => !self.has_gateway_entry(n),
            IndexKey::KvKey(k) => !self.kv.entries.contains_key(k),
            _ => false,
        }
    }

    fn touch_service(&self, node: &str, svc: &NodeService, bumped: &mut OrdSet<IndexKey>) {
        if svc.kind == ServiceKind::IngressGateway {
            bumped.insert(IndexKey::IngressGateways);
        }
        bumped.insert(IndexKey::Service(svc.service.clone()));
        bumped.insert(IndexKey::Node(node.to_owned()));
        if let Some(dest) = connect_target(svc) {
            bumped.insert(IndexKey::ServiceConnect(dest.to_owned()));
        }
        // A terminating gateway's instances are the connect instances of what it represents.
        if svc.kind == ServiceKind::TerminatingGateway
            && let Some(linked) = self.terminating_links.get(&svc.service)
        {
            bumped.extend(linked.iter().map(|s| IndexKey::ServiceConnect(s.clone())));
        }
    }

    /// Marks every service on `node` as changed (node fields and node checks feed their health).
    fn touch_node_services(&self, node: &str, bumped: &mut OrdSet<IndexKey>) {
        for (_, svc) in range_of(&self.services, node) {
            self.touch_service(node, &svc, bumped);
        }
    }

    fn apply_one(&mut self, index: Index, change: &Change, bumped: &mut OrdSet<IndexKey>) {
        match change {
            Change::PutNode(node) => self.put_node(index, node, bumped),
            Change::DeleteNode(name) => {
                if self.nodes.remove(name).is_some() {
                    bumped.insert(IndexKey::Nodes);
                    bumped.insert(IndexKey::Node(name.clone()));
                }
            }
            Change::PutService { node, service } => self.put_service(index, node, service, bumped),
            Change::DeleteService { node, id } => {
                if let Some(old) = self.services.remove(&(node.clone(), id.clone())) {
                    self.unindex_service(node, &old, bumped);
                    bumped.insert(IndexKey::Services);
                }
            }
            Change::PutCheck(check) => self.put_check(index, check, bumped),
            Change::DeleteCheck { node, id } => {
                if let Some(old) = self.checks.remove(&(node.clone(), id.clone())) {
                    self.touch_check(&old, bumped);
                }
            }
            Change::PutConfig(entry) => {
                let key = (entry.kind(), entry.name().to_owned());
                let mut entry = entry.clone();
                let create = self.config.get(&key).map_or(index, |e| e.create_index());
                entry.set_indexes(create, index);
                touch_config(&key, bumped);
                self.config.insert(key, Arc::new(entry));
            }
            Change::DeleteConfig(kind, name) => {
                let key = (*kind, name.clone());
                if self.config.remove(&key).is_some() {
                    touch_config(&key, bumped);
                }
            }
            Change::PutCa(ca) => self.put_ca(index, ca, bumped),
            Change::PutAclToken(_)
            | Change::DeleteAclToken(_)
            | Change::PutAclPolicy(_)
            | Change::DeleteAclPolicy(_)
            | Change::PutAclRole(_)
            | Change::DeleteAclRole(_)
            | Change::PutAclAuthMethod(_)
            | Change::DeleteAclAuthMethod(_)
            | Change::PutAclBindingRule(_)
            | Change::DeleteAclBindingRule(_)
            | Change::AclBootstrapped => self.apply_acl(index, change, bumped),
            Change::PutKv(_)
            | Change::DeleteKv(_)
            | Change::PutSession(_)
            | Change::DeleteSession(_)
            | Change::PutLockDelay { .. }
            | Change::DeleteLockDelay(_) => self.apply_kv(index, change, bumped),
            Change::PutEvent(_)
            | Change::DeleteEvent(_)
            | Change::PutQuery(_)
            | Change::DeleteQuery(_)
            | Change::PutVirtualIp { .. }
            | Change::DeleteVirtualIp(_) => self.apply_other(index, change, bumped),
            Change::PutAudit(_) | Change::DeleteAudit(_) => self.apply_audit(index, change, bumped),
            Change::PutPeering(_)
            | Change::DeletePeering(_)
            | Change::PutImported { .. }
            | Change::DeleteImported { .. }
            | Change::PutPeeringServers(_) => self.apply_peering(index, change, bumped),
        }
    }

    /// Tokens, policies, roles, auth methods, binding rules and the bootstrap.
    fn apply_acl(&mut self, index: Index, change: &Change, bumped: &mut OrdSet<IndexKey>) {
        match change {
            Change::PutAclToken(t) => {
                self.acl.put_token(index, t);
                bumped.extend([IndexKey::AclTokens, IndexKey::Acl]);
            }
            Change::DeleteAclToken(accessor) if self.acl.delete_token(accessor) => {
                bumped.extend([IndexKey::AclTokens, IndexKey::Acl]);
            }
            Change::PutAclPolicy(p) => {
                self.acl.put_policy(index, p);
                bumped.extend([IndexKey::AclPolicies, IndexKey::Acl]);
            }
            Change::DeleteAclPolicy(id) if self.acl.delete_policy(id) => {
                bumped.extend([IndexKey::AclPolicies, IndexKey::Acl]);
            }
            Change::PutAclRole(r) => {
                self.acl.put_role(index, r);
                bumped.extend([IndexKey::AclRoles, IndexKey::Acl]);
            }
            Change::DeleteAclRole(id) if self.acl.delete_role(id) => {
                bumped.extend([IndexKey::AclRoles, IndexKey::Acl]);
            }
            Change::PutAclAuthMethod(m) => {
                self.acl.put_auth_method(index, m);
                bumped.insert(IndexKey::AclAuthMethods);
            }
            Change::DeleteAclAuthMethod(name) if self.acl.auth_methods.remove(name).is_some() => {
                bumped.insert(IndexKey::AclAuthMethods);
            }
            Change::PutAclBindingRule(r) => {
                self.acl.put_binding_rule(index, r);
                bumped.insert(IndexKey::AclBindingRules);
            }
            Change::DeleteAclBindingRule(id) if self.acl.binding_rules.remove(id).is_some() => {
                bumped.insert(IndexKey::AclBindingRules);
            }
            Change::AclBootstrapped => {
                self.acl.bootstrapped = Some(index);
                bumped.insert(IndexKey::Acl);
            }
            _ => {}
        }
    }

    /// Events, prepared queries and virtual IPs.
    fn apply_other(&mut self, index: Index, change: &Change, bumped: &mut OrdSet<IndexKey>) {
        match change {
            Change::PutEvent(event) => {
                self.events.insert(event.ltime, Arc::new(event.clone()));
                bumped.insert(IndexKey::Events);
            }
            Change::PutQuery(query) => {
                let mut query = query.clone();
                query.create_index = self.queries.get(&query.id).map_or(index, |q| q.create_index);
                query.modify_index = index;
                self.queries.insert(query.id.clone(), Arc::new(query));
                bumped.insert(IndexKey::Queries);
            }
            Change::DeleteQuery(id) if self.queries.remove(id).is_some() => {
                bumped.insert(IndexKey::Queries);
            }
            Change::DeleteEvent(ltime) if self.events.remove(ltime).is_some() => {
                bumped.insert(IndexKey::Events);
            }
            // The connect instances of the service show it (`consul-virtual`), and the list
            // of every virtual IP has it (a service linked to a terminating gateway gets one
            // by a config write, which touches no service key).
            Change::PutVirtualIp { service, ip } => {
                self.virtual_ips.insert(service.clone(), *ip);
                bumped.insert(IndexKey::ServiceConnect(service.clone()));
                bumped.insert(IndexKey::VirtualIps);
            }
            Change::DeleteVirtualIp(service) if self.virtual_ips.remove(service).is_some() => {
                bumped.insert(IndexKey::ServiceConnect(service.clone()));
                bumped.insert(IndexKey::VirtualIps);
            }
            _ => {}
        }
    }

    fn apply_kv(&mut self, index: Index, change: &Change, bumped: &mut OrdSet<IndexKey>) {
        match change {
            Change::PutKv(entry) => {
                let mut entry = entry.clone();
                entry.create_index = self.kv.entries.get(&entry.key).map_or(index, |e| e.create_index);
                entry.modify_index = index;
                self.kv.tombstones.remove(&entry.key);
                bumped.extend([IndexKey::Kvs, IndexKey::KvKey(entry.key.clone())]);
                self.kv.insert(Arc::new(entry));
            }
            Change::DeleteKv(key) if self.kv.remove(key) => {
                self.kv.tombstones.insert(key.clone(), index);
                bumped.extend([IndexKey::Kvs, IndexKey::KvKey(key.clone())]);
                if self.kv.tombstones.len() > KV_TOMBSTONES {
                    self.kv.reap_tombstones();
                }
            }
            Change::PutSession(session) => {
                let mut session = session.clone();
                session.create_index = self.sessions.get(&session.id).map_or(index, |s| s.create_index);
                session.modify_index = index;
                bumped.insert(IndexKey::Sessions);
                self.sessions.insert(session.id.clone(), Arc::new(session));
            }
            Change::DeleteSession(id) if self.sessions.remove(id).is_some() => {
                bumped.insert(IndexKey::Sessions);
            }
            Change::PutLockDelay { key, until_ms } => {
                self.lock_delays.insert(key.clone(), *until_ms);
            }
            Change::DeleteLockDelay(key) => {
                self.lock_delays.remove(key);
            }
            _ => {}
        }
    }

    /// Stores a node, keeping its create index; its services' health changes with it.
    fn put_node(&mut self, index: Index, node: &Node, bumped: &mut OrdSet<IndexKey>) {
        let mut node = node.clone();
        node.create_index = self.nodes.get(&node.node).map_or(index, |n| n.create_index);
        node.modify_index = index;
        bumped.insert(IndexKey::Nodes);
        bumped.insert(IndexKey::Node(node.node.clone()));
        self.touch_node_services(&node.node, bumped);
        self.nodes.insert(node.node.clone(), Arc::new(node));
    }

    /// Stores a check, keeping its create index.
    fn put_check(&mut self, index: Index, check: &HealthCheck, bumped: &mut OrdSet<IndexKey>) {
        let key = (check.node.clone(), check.check_id.clone());
        let mut check = check.clone();
        check.create_index = self.checks.get(&key).map_or(index, |c| c.create_index);
        check.modify_index = index;
        self.touch_check(&check, bumped);
        self.checks.insert(key, Arc::new(check));
    }

    /// Stores a service (indexed by name and by connect destination), keeping its create
    /// index when it replaces one.
    fn put_service(&mut self, index: Index, node: &str, service: &NodeService, bumped: &mut OrdSet<IndexKey>) {
        let key = (node.to_owned(), service.id.clone());
        let mut service = service.clone();
        if let Some(old) = self.services.get(&key).cloned() {
            service.create_index = old.create_index;
            self.unindex_service(node, &old, bumped);
        } else {
            service.create_index = index;
        }
        service.modify_index = index;
        self.by_name
            .insert((service.service.clone(), node.to_owned(), service.id.clone()));
        if let Some(dest) = connect_target(&service) {
            self.by_connect
                .insert((dest.to_owned(), node.to_owned(), service.id.clone()));
        }
        bumped.insert(IndexKey::Services);
        self.touch_service(node, &service, bumped);
        self.services.insert(key, Arc::new(service));
    }

    /// Stores the CA state; roots new in it are stamped with this index.
    fn put_ca(&mut self, index: Index, ca: &CaState, bumped: &mut OrdSet<IndexKey>) {
        let mut ca = ca.clone();
        ca.create_index = self.ca.as_ref().map_or(index, |c| c.create_index);
        ca.modify_index = index;
        for root in &mut ca.roots {
            if root.root.create_index == Index(0) {
                root.root.create_index = index;
            }
            root.root.modify_index = index;
        }
        bumped.insert(IndexKey::Ca);
        self.ca = Some(Arc::new(ca));
    }

    fn unindex_service(&mut self, node: &str, old: &NodeService, bumped: &mut OrdSet<IndexKey>) {
        self.by_name
            .remove(&(old.service.clone(), node.to_owned(), old.id.clone()));
        if let Some(dest) = connect_target(old) {
            self.by_connect
                .remove(&(dest.to_owned(), node.to_owned(), old.id.clone()));
        }
        self.touch_service(node, old, bumped);
    }

    fn touch_check(&self, check: &HealthCheck, bumped: &mut OrdSet<IndexKey>) {
        bumped.insert(IndexKey::Checks);
        bumped.insert(IndexKey::Node(check.node.clone()));
        if check.service_id.is_empty() {
            self.touch_node_services(&check.node, bumped);
        } else if let Some(svc) = self.services.get(&(check.node.clone(), check.service_id.clone())) {
            self.touch_service(&check.node, svc, bumped);
        } else if !check.service_name.is_empty() {
            bumped.insert(IndexKey::Service(check.service_name.clone()));
        }
    }

    // ---- reads ----

    /// One KV key.
    pub fn kv_get(&self, key: &str) -> Option<Arc<KvEntry>> {
        self.kv.entries.get(key).cloned()
    }

    /// The KV keys starting with `prefix`, in key order.
    pub fn kv_range<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a Arc<KvEntry>> + 'a {
        self.kv
            .entries
            .range(prefix.to_owned()..)
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(_, e)| e)
    }

    /// The index a listing of `prefix` answers with, as Consul: the last write to a key
    /// under it, a delete included (tombstones); with nothing under it, the KV table's index.
    pub fn kv_prefix_index(&self, prefix: &str) -> Index {
        let written = self.kv_range(prefix).map(|e| e.modify_index).max();
        let deleted = self
            .kv
            .tombstones
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, i)| *i)
            .max();
        match written.max(deleted) {
            Some(index) => index.max(self.kv.floor),
            None => self.index_of(&IndexKey::Kvs),
        }
    }

    /// The KV keys whose lock `session` holds.
    pub fn kv_held_by<'a>(&'a self, session: &'a str) -> impl Iterator<Item = &'a Arc<KvEntry>> + 'a {
        self.kv
            .held
            .range((session.to_owned(), String::new())..)
            .take_while(move |(s, _)| s == session)
            .filter_map(|(_, key)| self.kv.entries.get(key))
    }

    /// One session.
    pub fn session(&self, id: &str) -> Option<Arc<Session>> {
        self.sessions.get(id).cloned()
    }

    /// Every session, by id.
    pub fn sessions(&self) -> impl Iterator<Item = &Arc<Session>> {
        self.sessions.values()
    }

    /// Until when (ms since the epoch) `key` may not be locked, if a lock delay is set.
    pub fn lock_delay(&self, key: &str) -> Option<u64> {
        self.lock_delays.get(key).copied()
    }

    /// Every lock delay.
    pub fn lock_delays(&self) -> impl Iterator<Item = (&String, &u64)> {
        self.lock_delays.iter()
    }

    /// One prepared query.
    pub fn query(&self, id: &str) -> Option<Arc<PreparedQuery>> {
        self.queries.get(id).cloned()
    }

    /// Every prepared query, by id.
    pub fn queries(&self) -> impl Iterator<Item = &Arc<PreparedQuery>> {
        self.queries.values()
    }

    /// The kept user events, oldest first.
    pub fn events(&self) -> impl Iterator<Item = &Arc<UserEvent>> {
        self.events.values()
    }

    /// How many tombstones the KV store keeps.
    pub fn kv_tombstone_count(&self) -> usize {
        self.kv.tombstones.len()
    }

    /// The index of `key`: the last write that touched it (or its table, if none did), at
    /// least 1.
    pub fn index_of(&self, key: &IndexKey) -> Index {
        // A key never written answers with its table's index, as Consul does.
        if let IndexKey::KvPrefix(prefix) = key {
            return self.kv_prefix_index(prefix).max(Index(1));
        }
        let fallback = || match key {
            IndexKey::Node(_) => self.indexes.get(&IndexKey::Nodes),
            IndexKey::Service(_) => self.indexes.get(&IndexKey::Services),
            // Connect instances also come from terminating gateways: unlinking one (an
            // entry write) must not move the key backwards.
            IndexKey::ServiceConnect(_) => self.indexes.get(&IndexKey::Services).max(
                self.indexes
                    .get(&IndexKey::ConfigKind(ConfigEntryKind::TerminatingGateway)),
            ),
            IndexKey::ConfigEntry(kind, _) => self.indexes.get(&IndexKey::ConfigKind(*kind)),
            // State written before the key had its own index: the latest kind's.
            IndexKey::ConfigEntries => ConfigEntryKind::ALL
                .iter()
                .filter_map(|k| self.indexes.get(&IndexKey::ConfigKind(*k)))
                .max(),
            // A gateway without an entry: the later of the two gateway kinds' tables.
            IndexKey::GatewayServices(_) => self
                .indexes
                .get(&IndexKey::ConfigKind(ConfigEntryKind::IngressGateway))
                .max(
                    self.indexes
                        .get(&IndexKey::ConfigKind(ConfigEntryKind::TerminatingGateway)),
                ),
            IndexKey::KvKey(_) => self.indexes.get(&IndexKey::Kvs),
            // State written before the key had its own index: the services' (which every
            // registration assigning one bumped) never moves it backwards.
            IndexKey::VirtualIps => self.indexes.get(&IndexKey::Services),
            IndexKey::PeeringRoutes => self.indexes.get(&IndexKey::Peerings),
            _ => None,
        };
        self.indexes
            .get(key)
            .or_else(fallback)
            .copied()
            .unwrap_or_default()
            .max(Index(1))
    }

    /// How many keys have an index of their own: bounded by what exists (and the tables),
    /// not by every name ever written.
    pub fn index_key_count(&self) -> usize {
        self.indexes.len()
    }

    /// A node by name.
    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(name).cloned()
    }

    /// Every node, by name.
    pub fn nodes(&self) -> impl Iterator<Item = &Arc<Node>> {
        self.nodes.values()
    }

    /// One service instance.
    pub fn service(&self, node: &str, id: &str) -> Option<Arc<NodeService>> {
        self.services.get(&(node.to_owned(), id.to_owned())).cloned()
    }

    /// The service instances on a node, by id.
    pub fn node_services(&self, node: &str) -> Vec<Arc<NodeService>> {
        range_of(&self.services, node).into_iter().map(|(_, s)| s).collect()
    }

    /// Every service instance with its node name.
    pub fn all_services(&self) -> impl Iterator<Item = (&str, &Arc<NodeService>)> {
        self.services.iter().map(|((node, _), s)| (node.as_str(), s))
    }

    fn instances_in(&self, set: &OrdSet<(String, String, String)>, name: &str) -> Vec<(String, Arc<NodeService>)> {
        set.range((name.to_owned(), String::new(), String::new())..)
            .take_while(|(n, _, _)| n == name)
            .filter_map(|(_, node, id)| self.service(node, id).map(|s| (node.clone(), s)))
            .collect()
    }

    /// Instances of a service name, with their node names.
    pub fn service_instances(&self, name: &str) -> Vec<(String, Arc<NodeService>)> {
        self.instances_in(&self.by_name, name)
    }

    /// Connect-capable instances for a service name: its sidecar proxies and, if the service
    /// is connect-native, its own instances.
    pub fn connect_instances(&self, name: &str) -> Vec<(String, Arc<NodeService>)> {
        self.instances_in(&self.by_connect, name)
    }

    /// Checks on a node (node checks and service checks).
    pub fn node_checks(&self, node: &str) -> Vec<Arc<HealthCheck>> {
        range_of(&self.checks, node).into_iter().map(|(_, c)| c).collect()
    }

    /// One check.
    pub fn check(&self, node: &str, id: &str) -> Option<Arc<HealthCheck>> {
        self.checks.get(&(node.to_owned(), id.to_owned())).cloned()
    }

    /// Every check.
    pub fn all_checks(&self) -> impl Iterator<Item = &Arc<HealthCheck>> {
        self.checks.values()
    }

    /// One config entry.
    pub fn config_entry(&self, kind: ConfigEntryKind, name: &str) -> Option<Arc<ConfigEntry>> {
        self.config.get(&(kind, name.to_owned())).cloned()
    }

    /// Every config entry of a kind, by name.
    pub fn config_entries(&self, kind: ConfigEntryKind) -> Vec<Arc<ConfigEntry>> {
        self.config
            .range((kind, String::new())..)
            .take_while(|((k, _), _)| *k == kind)
            .map(|(_, e)| e.clone())
            .collect()
    }

    /// The CA, once bootstrapped.
    pub fn ca(&self) -> Option<Arc<CaState>> {
        self.ca.clone()
    }

    /// An ACL token by accessor id.
    pub fn acl_token(&self, accessor: &str) -> Option<Arc<AclToken>> {
        self.acl.tokens.get(accessor).cloned()
    }

    /// An ACL token by secret.
    pub fn acl_token_by_secret(&self, secret: &str) -> Option<Arc<AclToken>> {
        self.acl.secrets.get(secret).and_then(|a| self.acl_token(a))
    }

    /// Every ACL token, by accessor id.
    pub fn acl_tokens(&self) -> impl Iterator<Item = &Arc<AclToken>> {
        self.acl.tokens.values()
    }

    /// An ACL policy by id.
    pub fn acl_policy(&self, id: &str) -> Option<Arc<AclPolicy>> {
        self.acl.policies.get(id).cloned()
    }

    /// An ACL policy by name.
    pub fn acl_policy_by_name(&self, name: &str) -> Option<Arc<AclPolicy>> {
        self.acl.policy_names.get(name).and_then(|id| self.acl_policy(id))
    }

    /// Every ACL policy, by id.
    pub fn acl_policies(&self) -> impl Iterator<Item = &Arc<AclPolicy>> {
        self.acl.policies.values()
    }

    /// An ACL role by id.
    pub fn acl_role(&self, id: &str) -> Option<Arc<AclRole>> {
        self.acl.roles.get(id).cloned()
    }

    /// An ACL role by name.
    pub fn acl_role_by_name(&self, name: &str) -> Option<Arc<AclRole>> {
        self.acl.role_names.get(name).and_then(|id| self.acl_role(id))
    }

    /// Every ACL role, by id.
    pub fn acl_roles(&self) -> impl Iterator<Item = &Arc<AclRole>> {
        self.acl.roles.values()
    }

    /// An auth method by name.
    pub fn acl_auth_method(&self, name: &str) -> Option<Arc<AclAuthMethod>> {
        self.acl.auth_methods.get(name).cloned()
    }

    /// Every auth method, by name.
    pub fn acl_auth_methods(&self) -> impl Iterator<Item = &Arc<AclAuthMethod>> {
        self.acl.auth_methods.values()
    }

    /// A binding rule by id.
    pub fn acl_binding_rule(&self, id: &str) -> Option<Arc<AclBindingRule>> {
        self.acl.binding_rules.get(id).cloned()
    }

    /// Every binding rule, by id.
    pub fn acl_binding_rules(&self) -> impl Iterator<Item = &Arc<AclBindingRule>> {
        self.acl.binding_rules.values()
    }

    /// The index ACLs were bootstrapped at, once they were.
    pub fn acl_bootstrapped(&self) -> Option<Index> {
        self.acl.bootstrapped
    }

    /// The virtual IP of `service`, once it has connect instances.
    pub fn virtual_ip(&self, service: &str) -> Option<Ipv4Addr> {
        self.virtual_ips.get(service).copied()
    }

    /// Every service's virtual IP.
    pub fn virtual_ips(&self) -> impl Iterator<Item = (&String, &Ipv4Addr)> {
        self.virtual_ips.iter()
    }

    // ---- persistence ----

    /// Every row, for a snapshot file.
    pub(crate) fn to_persisted(&self) -> PersistedState {
        PersistedState {
            index: self.index,
            nodes: self.nodes.values().map(|n| (**n).clone()).collect(),
            services: self
                .services
                .iter()
                .map(|((node, _), s)| (node.clone(), (**s).clone()))
                .collect(),
            checks: self.checks.values().map(|c| (**c).clone()).collect(),
            config: self.config.values().map(|e| (**e).clone()).collect(),
            ca: self.ca.as_ref().map(|c| (**c).clone()),
            acl_tokens: self.acl.tokens.values().map(|t| (**t).clone()).collect(),
            acl_policies: self.acl.policies.values().map(|p| (**p).clone()).collect(),
            acl_roles: self.acl.roles.values().map(|r| (**r).clone()).collect(),
            acl_auth_methods: self.acl.auth_methods.values().map(|m| (**m).clone()).collect(),
            acl_binding_rules: self.acl.binding_rules.values().map(|r| (**r).clone()).collect(),
            acl_bootstrapped: self.acl.bootstrapped,
            kv: self.kv.entries.values().map(|e| (**e).clone()).collect(),
            kv_tombstones: self.kv.tombstones.iter().map(|(k, i)| (k.clone(), *i)).collect(),
            kv_floor: self.kv.floor,
            sessions: self.sessions.values().map(|s| (**s).clone()).collect(),
            lock_delays: self.lock_delays.iter().map(|(k, u)| (k.clone(), *u)).collect(),
            events: self.events.values().map(|e| (**e).clone()).collect(),
            audit: self.audit.values().map(|r| (**r).clone()).collect(),
            queries: self.queries.values().map(|q| (**q).clone()).collect(),
            virtual_ips: self.virtual_ips.iter().map(|(s, ip)| (s.clone(), *ip)).collect(),
            peerings: self.peerings.values().map(|p| (**p).clone()).collect(),
            imported: self
                .imported
                .iter()
                .map(|((peer, _), s)| (peer.clone(), (**s).clone()))
                .collect(),
            peering_servers: (*self.peering_servers).clone(),
            indexes: self.indexes.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        }
    }

    /// Rebuilds the tables from a snapshot file's rows (indexes kept as stored).
    pub fn from_persisted(p: PersistedState) -> Self {
        let mut s = State {
            index: p.index,
            ..State::default()
        };
        for n in p.nodes {
            s.nodes.insert(n.node.clone(), Arc::new(n));
        }
        for (node, svc) in p.services {
            s.by_name.insert((svc.service.clone(), node.clone(), svc.id.clone()));
            if let Some(dest) = connect_target(&svc) {
                s.by_connect.insert((dest.to_owned(), node.clone(), svc.id.clone()));
            }
            s.services.insert((node, svc.id.clone()), Arc::new(svc));
        }
        for c in p.checks {
            s.checks.insert((c.node.clone(), c.check_id.clone()), Arc::new(c));
        }
        for e in p.config {
            s.config.insert((e.kind(), e.name().to_owned()), Arc::new(e));
        }
        s.rebuild_terminating_links();
        s.ca = p.ca.map(Arc::new);
        for t in p.acl_tokens {
            s.acl.secrets.insert(t.secret_id.clone(), t.accessor_id.clone());
            s.acl.tokens.insert(t.accessor_id.clone(), Arc::new(t));
        }
        for pol in p.acl_policies {
            s.acl.policy_names.insert(pol.name.clone(), pol.id.clone());
            s.acl.policies.insert(pol.id.clone(), Arc::new(pol));
        }
        for r in p.acl_roles {
            s.acl.role_names.insert(r.name.clone(), r.id.clone());
            s.acl.roles.insert(r.id.clone(), Arc::new(r));
        }
        for m in p.acl_auth_methods {
            s.acl.auth_methods.insert(m.name.clone(), Arc::new(m));
        }
        for r in p.acl_binding_rules {
            s.acl.binding_rules.insert(r.id.clone(), Arc::new(r));
        }
        s.acl.bootstrapped = p.acl_bootstrapped;
        for e in p.kv {
            s.kv.insert(Arc::new(e));
        }
        s.kv.tombstones = p.kv_tombstones.into_iter().collect();
        s.kv.floor = p.kv_floor;
        for session in p.sessions {
            s.sessions.insert(session.id.clone(), Arc::new(session));
        }
        s.lock_delays = p.lock_delays.into_iter().collect();
        for e in p.events {
            s.events.insert(e.ltime, Arc::new(e));
        }
        for q in p.queries {
            s.queries.insert(q.id.clone(), Arc::new(q));
        }
        for r in p.audit {
            if !r.accepted {
                s.audit_refused.insert(r.seq);
            }
            s.audit.insert(r.seq, Arc::new(r));
        }
        s.virtual_ips = p.virtual_ips.into_iter().collect();
        for peering in p.peerings {
            s.peerings.insert(peering.peering.name.clone(), Arc::new(peering));
        }
        for (peer, service) in p.imported {
            s.imported.insert((peer, service.name.clone()), Arc::new(service));
        }
        s.peering_servers = Arc::new(p.peering_servers);
        s.indexes = p.indexes.into_iter().collect();
        s
    }
}

fn touch_config(key: &(ConfigEntryKind, String), bumped: &mut OrdSet<IndexKey>) {
    bumped.insert(IndexKey::ConfigKind(key.0));
    bumped.insert(IndexKey::ConfigEntries);
    bumped.insert(IndexKey::ConfigEntry(key.0, key.1.clone()));
    if key.0 == ConfigEntryKind::ServiceIntentions {
        bumped.insert(IndexKey::Intentions);
    }
    // Which peers a service is exported to decides whose roots its sidecars trust.
    if key.0 == ConfigEntryKind::ExportedServices {
        bumped.insert(IndexKey::Peerings);
    }
}

/// The rows of a state, as written to a snapshot file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PersistedState {
    /// The index the rows were read at.
    pub index: Index,
    /// The nodes.
    pub nodes: Vec<Node>,
    /// The services, each with its node's name.
    pub services: Vec<(String, NodeService)>,
    /// The health checks.
    pub checks: Vec<HealthCheck>,
    /// The config entries.
    pub config: Vec<ConfigEntry>,
    /// The built-in CA: its roots and keys.
    pub ca: Option<CaState>,
    /// ACL tokens, with their secrets.
    #[serde(default)]
    pub acl_tokens: Vec<AclToken>,
    /// ACL policies.
    #[serde(default)]
    pub acl_policies: Vec<AclPolicy>,
    /// ACL roles.
    #[serde(default)]
    pub acl_roles: Vec<AclRole>,
    /// ACL auth methods.
    #[serde(default)]
    pub acl_auth_methods: Vec<AclAuthMethod>,
    /// ACL binding rules.
    #[serde(default)]
    pub acl_binding_rules: Vec<AclBindingRule>,
    /// The index ACLs were bootstrapped at, once they were.
    #[serde(default)]
    pub acl_bootstrapped: Option<Index>,
    /// KV entries.
    #[serde(default)]
    pub kv: Vec<KvEntry>,
    /// Deleted KV keys and the indexes they were deleted at.
    #[serde(default)]
    pub kv_tombstones: Vec<(String, Index)>,
    /// No KV prefix answers blocking queries below this index.
    #[serde(default)]
    pub kv_floor: Index,
    /// Sessions.
    #[serde(default)]
    pub sessions: Vec<Session>,
    /// Lock delays by key, until when (Unix milliseconds).
    #[serde(default)]
    pub lock_delays: Vec<(String, u64)>,
    /// User events.
    #[serde(default)]
    pub events: Vec<UserEvent>,
    /// The audit log (kept by the data dir's snapshots; a restore leaves it as it is).
    #[serde(default)]
    pub audit: Vec<AuditRecord>,
    /// Prepared queries.
    #[serde(default)]
    pub queries: Vec<PreparedQuery>,
    /// Virtual IPs by service.
    #[serde(default)]
    pub virtual_ips: Vec<(String, Ipv4Addr)>,
    /// Peerings with their secrets.
    #[serde(default)]
    pub peerings: Vec<structs::peering::StoredPeering>,
    /// What peers export here, by peer.
    #[serde(default)]
    pub imported: Vec<(String, structs::peering::ImportedService)>,
    /// This cluster's servers' peering addresses.
    #[serde(default)]
    pub peering_servers: Vec<String>,
    /// Each table's index.
    pub indexes: Vec<(IndexKey, Index)>,
}
