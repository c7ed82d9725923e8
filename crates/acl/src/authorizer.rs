//! The authorizer: a token's rules merged and indexed, answering permission checks.
//!
//! For a named resource the exact rule wins, else the longest matching prefix rule, else
//! the default policy. Rules for the same name from several policies merge by precedence
//! (`deny` over `write` over `read`). `mesh` and `peering` follow `operator` when unset. ACL management
//! is never granted by the default policy: only by an `acl` rule.

use crate::rules::{Access, Resource, Rules};
use std::collections::HashMap;

/// What one service rule grants: the service, and the intentions whose destination it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ServiceAccess {
    policy: Access,
    intentions: Option<Access>,
}

impl ServiceAccess {
    fn merge(self, other: Self) -> Self {
        Self {
            policy: self.policy.merge(other.policy),
            intentions: match (self.intentions, other.intentions) {
                (Some(a), Some(b)) => Some(a.merge(b)),
                (a, b) => a.or(b),
            },
        }
    }

    /// Intentions access: as written, else `read` with a read or write policy.
    fn intentions(self) -> Access {
        self.intentions.unwrap_or(match self.policy {
            Access::Deny => Access::Deny,
            Access::Read | Access::List | Access::Write => Access::Read,
        })
    }
}

/// Rules on one resource type: exact names, and prefixes longest first.
#[derive(Debug, Clone)]
struct Table<T> {
    exact: HashMap<String, T>,
    prefixes: Vec<(String, T)>,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Self {
            exact: HashMap::new(),
            prefixes: Vec::new(),
        }
    }
}

impl<T: Copy> Table<T> {
    fn add(&mut self, prefix: bool, name: &str, value: T, merge: impl Fn(T, T) -> T) {
        if prefix {
            match self.prefixes.iter_mut().find(|(p, _)| p == name) {
                Some((_, v)) => *v = merge(*v, value),
                None => self.prefixes.push((name.to_owned(), value)),
            }
        } else {
            self.exact
                .entry(name.to_owned())
                .and_modify(|v| *v = merge(*v, value))
                .or_insert(value);
        }
    }

    fn finish(&mut self) {
        self.prefixes.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
    }

    fn get(&self, name: &str) -> Option<T> {
        if let Some(v) = self.exact.get(name) {
            return Some(*v);
        }
        self.prefixes
            .iter()
            .find(|(p, _)| name.starts_with(p.as_str()))
            .map(|(_, v)| *v)
    }
}

/// Answers permission checks for one token (or for the default policy alone).
#[derive(Debug, Clone, Default)]
pub struct Authorizer {
    default_allow: bool,
    acl: Option<Access>,
    operator: Option<Access>,
    mesh: Option<Access>,
    peering: Option<Access>,
    services: Table<ServiceAccess>,
    nodes: Table<Access>,
    agents: Table<Access>,
    keys: Table<Access>,
    sessions: Table<Access>,
    events: Table<Access>,
    queries: Table<Access>,
}

fn merge_opt(slot: &mut Option<Access>, value: Option<Access>) {
    if let Some(v) = value {
        *slot = Some(slot.map_or(v, |s| s.merge(v)));
    }
}

impl Authorizer {
    /// Every rule set merged, over the default policy (`default_allow`: allow).
    pub fn new<'a>(rules: impl IntoIterator<Item = &'a Rules>, default_allow: bool) -> Self {
        let mut a = Self {
            default_allow,
            ..Self::default()
        };
        for r in rules {
            merge_opt(&mut a.acl, r.acl);
            merge_opt(&mut a.operator, r.operator);
            merge_opt(&mut a.mesh, r.mesh);
            merge_opt(&mut a.peering, r.peering);
            for rule in &r.named {
                let prefix = rule.resource.is_prefix();
                match rule.resource {
                    Resource::Service | Resource::ServicePrefix => a.services.add(
                        prefix,
                        &rule.name,
                        ServiceAccess {
                            policy: rule.policy,
                            intentions: rule.intentions,
                        },
                        ServiceAccess::merge,
                    ),
                    Resource::Node | Resource::NodePrefix => {
                        a.nodes.add(prefix, &rule.name, rule.policy, Access::merge)
                    }
                    Resource::Agent | Resource::AgentPrefix => {
                        a.agents.add(prefix, &rule.name, rule.policy, Access::merge)
                    }
                    Resource::Key | Resource::KeyPrefix => a.keys.add(prefix, &rule.name, rule.policy, Access::merge),
                    Resource::Session | Resource::SessionPrefix => {
                        a.sessions.add(prefix, &rule.name, rule.policy, Access::merge)
                    }
                    Resource::Event | Resource::EventPrefix => {
                        a.events.add(prefix, &rule.name, rule.policy, Access::merge)
                    }
                    Resource::Query | Resource::QueryPrefix => {
                        a.queries.add(prefix, &rule.name, rule.policy, Access::merge)
                    }
                }
            }
        }
        a.services.finish();
        a.nodes.finish();
        a.agents.finish();
        a.keys.finish();
        a.sessions.finish();
        a.events.finish();
        a.queries.finish();
        a
    }

    /// The default policy alone: everything but ACL management (`allow`), or nothing.
    pub fn default_policy(default_allow: bool) -> Self {
        Self::new([], default_allow)
    }

    fn decide(&self, access: Option<Access>, need: Access) -> bool {
        access.map_or(self.default_allow, |a| a.grants(need))
    }

    /// Whether the default policy is allow.
    pub fn default_allow(&self) -> bool {
        self.default_allow
    }

    /// `service:read` on `name`.
    pub fn service_read(&self, name: &str) -> bool {
        self.decide(self.services.get(name).map(|s| s.policy), Access::Read)
    }

    /// `service:write` on `name`.
    pub fn service_write(&self, name: &str) -> bool {
        self.decide(self.services.get(name).map(|s| s.policy), Access::Write)
    }

    /// `service:write` on some service (Consul's `ServiceWriteAny`): a rule granting it on
    /// any name or prefix, or the default policy.
    pub fn service_write_any(&self) -> bool {
        let rules = self
            .services
            .exact
            .values()
            .chain(self.services.prefixes.iter().map(|(_, v)| v));
        self.default_allow || rules.into_iter().any(|s| s.policy.grants(Access::Write))
    }

    /// Reading the intentions whose destination is `name`.
    pub fn intention_read(&self, name: &str) -> bool {
        self.decide(self.services.get(name).map(ServiceAccess::intentions), Access::Read)
    }

    /// Writing the intentions whose destination is `name`.
    pub fn intention_write(&self, name: &str) -> bool {
        self.decide(self.services.get(name).map(ServiceAccess::intentions), Access::Write)
    }

    /// `node:read` on `name`.
    pub fn node_read(&self, name: &str) -> bool {
        self.decide(self.nodes.get(name), Access::Read)
    }

    /// `node:write` on `name`.
    pub fn node_write(&self, name: &str) -> bool {
        self.decide(self.nodes.get(name), Access::Write)
    }

    /// `agent:read` on the agent of node `name`.
    pub fn agent_read(&self, name: &str) -> bool {
        self.decide(self.agents.get(name), Access::Read)
    }

    /// `agent:write` on the agent of node `name`.
    pub fn agent_write(&self, name: &str) -> bool {
        self.decide(self.agents.get(name), Access::Write)
    }

    /// `key:read` on the KV key `key`.
    pub fn key_read(&self, key: &str) -> bool {
        self.decide(self.keys.get(key), Access::Read)
    }

    /// `key:write` on the KV key `key`.
    pub fn key_write(&self, key: &str) -> bool {
        self.decide(self.keys.get(key), Access::Write)
    }

    /// `key:write` on every key that starts with `prefix` (a recursive delete): the rule
    /// that governs the prefix grants it, and so does every rule more specific than that
    /// (an exact key or a longer prefix under it), as Consul's `KeyWritePrefix`.
    pub fn key_write_prefix(&self, prefix: &str) -> bool {
        if !self.key_write(prefix) {
            return false;
        }
        let under = |name: &str| name.starts_with(prefix);
        self.keys
            .exact
            .iter()
            .filter(|(name, _)| under(name))
            .chain(
                self.keys
                    .prefixes
                    .iter()
                    .filter(|(name, _)| under(name))
                    .map(|(n, a)| (n, a)),
            )
            .all(|(_, access)| access.grants(Access::Write))
    }

    /// `session:read` on the sessions of node `node`.
    pub fn session_read(&self, node: &str) -> bool {
        self.decide(self.sessions.get(node), Access::Read)
    }

    /// `session:write` on the sessions of node `node`.
    pub fn session_write(&self, node: &str) -> bool {
        self.decide(self.sessions.get(node), Access::Write)
    }

    /// `event:read` on events named `name`.
    pub fn event_read(&self, name: &str) -> bool {
        self.decide(self.events.get(name), Access::Read)
    }

    /// `event:write` (firing) on events named `name`.
    pub fn event_write(&self, name: &str) -> bool {
        self.decide(self.events.get(name), Access::Write)
    }

    /// `query:read` on prepared queries named `name`.
    pub fn query_read(&self, name: &str) -> bool {
        self.decide(self.queries.get(name), Access::Read)
    }

    /// `query:write` on prepared queries named `name`.
    pub fn query_write(&self, name: &str) -> bool {
        self.decide(self.queries.get(name), Access::Write)
    }

    /// `operator:read`.
    pub fn operator_read(&self) -> bool {
        self.decide(self.operator, Access::Read)
    }

    /// `operator:write`.
    pub fn operator_write(&self) -> bool {
        self.decide(self.operator, Access::Write)
    }

    /// `mesh:read` (falls back to `operator`).
    pub fn mesh_read(&self) -> bool {
        self.decide(self.mesh.or(self.operator), Access::Read)
    }

    /// `mesh:write` (falls back to `operator`).
    pub fn mesh_write(&self) -> bool {
        self.decide(self.mesh.or(self.operator), Access::Write)
    }

    /// `peering:read` (falls back to `operator`).
    pub fn peering_read(&self) -> bool {
        self.decide(self.peering.or(self.operator), Access::Read)
    }

    /// `peering:write` (falls back to `operator`).
    pub fn peering_write(&self) -> bool {
        self.decide(self.peering.or(self.operator), Access::Write)
    }

    /// `acl:read`: only an explicit rule grants it.
    pub fn acl_read(&self) -> bool {
        self.acl.is_some_and(|a| a.grants(Access::Read))
    }

    /// `acl:write`: only an explicit rule grants it.
    pub fn acl_write(&self) -> bool {
        self.acl.is_some_and(|a| a.grants(Access::Write))
    }
}
