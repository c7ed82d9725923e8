//! How the catalog's rows are laid out in etcd, and how etcd's keys turn back into rows.
//!
//! Every row is one key under `<prefix>catalog/`, its value the row's JSON:
//!
//! | key (after the prefix)            | row                           |
//! |-----------------------------------|-------------------------------|
//! | `catalog/node/<node>`             | a node                        |
//! | `catalog/service/<node>/<id>`     | a service instance            |
//! | `catalog/check/<node>/<id>`       | a health check                |
//! | `catalog/config/<kind>/<name>`    | a config entry                |
//! | `catalog/ca`                      | the CA (roots and their keys) |
//! | `catalog/acl/token/<accessor>`    | an ACL token                  |
//! | `catalog/acl/policy/<id>`         | an ACL policy                 |
//! | `catalog/acl/role/<id>`           | an ACL role                   |
//! | `catalog/acl/bootstrapped`        | ACLs were bootstrapped        |
//! | `catalog/kv/<key>`                | a KV key                      |
//! | `catalog/session/<id>`            | a session                     |
//! | `catalog/lockdelay/<key>`         | a key's lock delay (ms)       |
//! | `catalog/event/<ltime>`           | a user event                  |
//! | `catalog/query/<id>`              | a prepared query              |
//! | `catalog/audit/<seq>`             | an audit record               |
//! | `catalog/_rev`                    | the write guard (see below)   |
//! | `catalog/_restore`                | a snapshot restore under way  |
//!
//! Names are escaped (`%` → `%25`, `/` → `%2F`) so that each is exactly one path segment.
//! A row's `CreateIndex`/`ModifyIndex` are its key's `create_revision`/`mod_revision`: the
//! values stored in the JSON are not used.
//!
//! Every write transaction also puts `catalog/_rev`, and is guarded by its `mod_revision`
//! not having passed the revision the write was planned at: a write planned on a state
//! another server has since changed is refused by etcd and planned again.

use catalog::IndexKey;
use catalog::backend::PersistedState;
use catalog::ca::CaState;
use catalog::{Change, State};
use structs::{ConfigEntryKind, Index};

/// Where the catalog's rows live under the prefix.
pub(crate) const CATALOG: &str = "catalog/";
/// The write guard, under [`CATALOG`].
pub(crate) const GUARD: &str = "_rev";
/// Present while a snapshot restore writes the catalog (see `restore.rs`), under [`CATALOG`].
pub(crate) const RESTORE: &str = "_restore";

/// A key or value under the catalog prefix that meshd cannot read.
#[derive(Debug, thiserror::Error)]
#[error("etcd key {key}: {why}")]
pub struct LayoutError {
    /// The key (after the prefix).
    pub key: String,
    /// What is wrong with it.
    pub why: String,
}

fn escape(s: &str) -> String {
    s.replace('%', "%25").replace('/', "%2F")
}

fn unescape(s: &str) -> String {
    s.replace("%2F", "/").replace("%2f", "/").replace("%25", "%")
}

/// The key (relative to the catalog prefix) a change writes, and the value it puts (`None`:
/// it deletes the key).
pub(crate) fn encode(change: &Change) -> Result<(String, Option<Vec<u8>>), serde_json::Error> {
    fn json<T: serde::Serialize>(row: &T) -> Result<Option<Vec<u8>>, serde_json::Error> {
        serde_json::to_vec(row).map(Some)
    }
    Ok(match change {
        Change::PutNode(n) => (format!("node/{}", escape(&n.node)), json(n)?),
        Change::DeleteNode(n) => (format!("node/{}", escape(n)), None),
        Change::PutService { node, service } => (
            format!("service/{}/{}", escape(node), escape(&service.id)),
            json(service)?,
        ),
        Change::DeleteService { node, id } => (format!("service/{}/{}", escape(node), escape(id)), None),
        Change::PutCheck(c) => (format!("check/{}/{}", escape(&c.node), escape(&c.check_id)), json(c)?),
        Change::DeleteCheck { node, id } => (format!("check/{}/{}", escape(node), escape(id)), None),
        Change::PutConfig(e) => (format!("config/{}/{}", e.kind().as_str(), escape(e.name())), json(e)?),
        Change::DeleteConfig(kind, name) => (format!("config/{}/{}", kind.as_str(), escape(name)), None),
        Change::PutCa(ca) => ("ca".to_owned(), json(ca)?),
        Change::PutAclToken(t) => (format!("acl/token/{}", escape(&t.accessor_id)), json(t)?),
        Change::DeleteAclToken(a) => (format!("acl/token/{}", escape(a)), None),
        Change::PutAclPolicy(p) => (format!("acl/policy/{}", escape(&p.id)), json(p)?),
        Change::DeleteAclPolicy(id) => (format!("acl/policy/{}", escape(id)), None),
        Change::PutAclRole(r) => (format!("acl/role/{}", escape(&r.id)), json(r)?),
        Change::DeleteAclRole(id) => (format!("acl/role/{}", escape(id)), None),
        Change::PutAclAuthMethod(m) => (format!("acl/auth-method/{}", escape(&m.name)), json(m)?),
        Change::DeleteAclAuthMethod(name) => (format!("acl/auth-method/{}", escape(name)), None),
        Change::PutAclBindingRule(r) => (format!("acl/binding-rule/{}", escape(&r.id)), json(r)?),
        Change::DeleteAclBindingRule(id) => (format!("acl/binding-rule/{}", escape(id)), None),
        Change::AclBootstrapped => ("acl/bootstrapped".to_owned(), Some(b"true".to_vec())),
        Change::PutKv(e) => (format!("kv/{}", escape(&e.key)), json(e)?),
        Change::DeleteKv(key) => (format!("kv/{}", escape(key)), None),
        Change::PutSession(session) => (format!("session/{}", escape(&session.id)), json(session)?),
        Change::DeleteSession(id) => (format!("session/{}", escape(id)), None),
        Change::PutLockDelay { key, until_ms } => (format!("lockdelay/{}", escape(key)), json(until_ms)?),
        Change::DeleteLockDelay(key) => (format!("lockdelay/{}", escape(key)), None),
        Change::PutEvent(e) => (format!("event/{}", e.ltime), json(e)?),
        Change::DeleteEvent(ltime) => (format!("event/{ltime}"), None),
        Change::PutAudit(r) => (format!("audit/{}", r.seq), json(r)?),
        Change::DeleteAudit(seq) => (format!("audit/{seq}"), None),
        Change::PutQuery(q) => (format!("query/{}", escape(&q.id)), json(q)?),
        Change::DeleteQuery(id) => (format!("query/{}", escape(id)), None),
        Change::PutVirtualIp { service, ip } => (format!("vip/{}", escape(service)), json(ip)?),
        Change::DeleteVirtualIp(service) => (format!("vip/{}", escape(service)), None),
        Change::PutPeering(p) => (format!("peering/{}", escape(&p.peering.name)), json(p)?),
        Change::DeletePeering(name) => (format!("peering/{}", escape(name)), None),
        Change::PutImported { peer, service } => (
            format!("imported/{}/{}", escape(peer), escape(&service.name)),
            json(service)?,
        ),
        Change::DeleteImported { peer, service } => (format!("imported/{}/{}", escape(peer), escape(service)), None),
        Change::PutPeeringServers(addresses) => ("peering-servers".to_owned(), json(addresses)?),
    })
}

/// What a key (relative to the catalog prefix) names.
enum Row {
    Node(String),
    Service(String, String),
    Check(String, String),
    Config(ConfigEntryKind, String),
    Ca,
    Token(String),
    Policy(String),
    Role(String),
    AuthMethod(String),
    BindingRule(String),
    Bootstrapped,
    Kv(String),
    Session(String),
    LockDelay(String),
    Event(u64),
    Audit(u64),
    Query(String),
    VirtualIp(String),
    Peering(String),
    Imported(String, String),
    PeeringServers,
    Guard,
}

fn parse_key(key: &str) -> Result<Row, LayoutError> {
    let bad = |why: &str| LayoutError {
        key: format!("{CATALOG}{key}"),
        why: why.to_owned(),
    };
    let parts: Vec<&str> = key.split('/').collect();
    Ok(match parts.as_slice() {
        [GUARD | RESTORE] => Row::Guard,
        ["ca"] => Row::Ca,
        ["node", n] => Row::Node(unescape(n)),
        ["service", n, id] => Row::Service(unescape(n), unescape(id)),
        ["check", n, id] => Row::Check(unescape(n), unescape(id)),
        ["config", kind, name] => Row::Config(
            kind.parse().map_err(|_| bad("unknown config entry kind"))?,
            unescape(name),
        ),
        ["acl", "token", a] => Row::Token(unescape(a)),
        ["acl", "policy", id] => Row::Policy(unescape(id)),
        ["acl", "role", id] => Row::Role(unescape(id)),
        ["acl", "auth-method", name] => Row::AuthMethod(unescape(name)),
        ["acl", "binding-rule", id] => Row::BindingRule(unescape(id)),
        ["acl", "bootstrapped"] => Row::Bootstrapped,
        ["kv", k] => Row::Kv(unescape(k)),
        ["session", id] => Row::Session(unescape(id)),
        ["lockdelay", k] => Row::LockDelay(unescape(k)),
        ["query", id] => Row::Query(unescape(id)),
        ["vip", service] => Row::VirtualIp(unescape(service)),
        ["peering", name] => Row::Peering(unescape(name)),
        ["imported", peer, service] => Row::Imported(unescape(peer), unescape(service)),
        ["peering-servers"] => Row::PeeringServers,
        ["audit", seq] => Row::Audit(seq.parse().map_err(|_| bad("an audit record's Seq is not a number"))?),
        ["event", ltime] => Row::Event(ltime.parse().map_err(|_| bad("an event's LTime is not a number"))?),
        _ => return Err(bad("not a key meshd writes")),
    })
}

fn parse_value<T: serde::de::DeserializeOwned>(key: &str, value: &[u8]) -> Result<T, LayoutError> {
    serde_json::from_slice(value).map_err(|e| LayoutError {
        key: format!("{CATALOG}{key}"),
        why: format!("undecodable value: {e}"),
    })
}

/// The change a watch event makes: a put of `value` at `key` (relative to the catalog
/// prefix), or its delete (`value` is `None`). `None` for the write guard and the restore
/// marker.
pub(crate) fn decode(key: &str, value: Option<&[u8]>) -> Result<Option<Change>, LayoutError> {
    let row = parse_key(key)?;
    let Some(value) = value else {
        return Ok(Some(match row {
            Row::Guard => return Ok(None),
            Row::Node(n) => Change::DeleteNode(n),
            Row::Service(node, id) => Change::DeleteService { node, id },
            Row::Check(node, id) => Change::DeleteCheck { node, id },
            Row::Config(kind, name) => Change::DeleteConfig(kind, name),
            Row::Token(a) => Change::DeleteAclToken(a),
            Row::Policy(id) => Change::DeleteAclPolicy(id),
            Row::Role(id) => Change::DeleteAclRole(id),
            Row::AuthMethod(name) => Change::DeleteAclAuthMethod(name),
            Row::BindingRule(id) => Change::DeleteAclBindingRule(id),
            Row::Kv(k) => Change::DeleteKv(k),
            Row::Session(id) => Change::DeleteSession(id),
            Row::LockDelay(k) => Change::DeleteLockDelay(k),
            Row::Event(ltime) => Change::DeleteEvent(ltime),
            Row::Audit(seq) => Change::DeleteAudit(seq),
            Row::Query(id) => Change::DeleteQuery(id),
            Row::VirtualIp(service) => Change::DeleteVirtualIp(service),
            Row::Peering(name) => Change::DeletePeering(name),
            Row::Imported(peer, service) => Change::DeleteImported { peer, service },
            Row::Ca | Row::Bootstrapped | Row::PeeringServers => {
                return Err(LayoutError {
                    key: format!("{CATALOG}{key}"),
                    why: "deleted, but meshd never deletes it".into(),
                });
            }
        }));
    };
    Ok(Some(match row {
        Row::Guard => return Ok(None),
        Row::Node(_) => Change::PutNode(parse_value(key, value)?),
        Row::Service(node, _) => Change::PutService {
            node,
            service: parse_value(key, value)?,
        },
        Row::Check(..) => Change::PutCheck(parse_value(key, value)?),
        Row::Config(..) => Change::PutConfig(parse_value(key, value)?),
        Row::Ca => Change::PutCa(parse_value(key, value)?),
        Row::Token(_) => Change::PutAclToken(parse_value(key, value)?),
        Row::Policy(_) => Change::PutAclPolicy(parse_value(key, value)?),
        Row::Role(_) => Change::PutAclRole(parse_value(key, value)?),
        Row::AuthMethod(_) => Change::PutAclAuthMethod(parse_value(key, value)?),
        Row::BindingRule(_) => Change::PutAclBindingRule(parse_value(key, value)?),
        Row::Bootstrapped => Change::AclBootstrapped,
        Row::Kv(_) => Change::PutKv(parse_value(key, value)?),
        Row::Session(_) => Change::PutSession(parse_value(key, value)?),
        Row::Event(_) => Change::PutEvent(parse_value(key, value)?),
        Row::Audit(_) => Change::PutAudit(Box::new(parse_value(key, value)?)),
        Row::Query(_) => Change::PutQuery(parse_value(key, value)?),
        Row::VirtualIp(service) => Change::PutVirtualIp {
            service,
            ip: parse_value(key, value)?,
        },
        Row::Peering(_) => Change::PutPeering(Box::new(parse_value(key, value)?)),
        Row::Imported(peer, _) => Change::PutImported {
            peer,
            service: Box::new(parse_value(key, value)?),
        },
        Row::PeeringServers => Change::PutPeeringServers(parse_value(key, value)?),
        Row::LockDelay(k) => Change::PutLockDelay {
            key: k,
            until_ms: parse_value(key, value)?,
        },
    }))
}

/// One key as read from etcd: relative to the catalog prefix, with its value and revisions.
pub(crate) struct Kv<'a> {
    pub(crate) key: &'a str,
    pub(crate) value: &'a [u8],
    pub(crate) create: Index,
    pub(crate) modify: Index,
}

/// The state every key under the catalog prefix makes at `revision` (a full read): rows
/// carry their keys' revisions, and every table answers blocking queries with `revision`
/// (a reset: waiters at older indexes return and read again).
pub(crate) fn load<'a>(kvs: impl IntoIterator<Item = Kv<'a>>, revision: Index) -> Result<State, LayoutError> {
    let mut p = PersistedState {
        index: revision,
        nodes: Vec::new(),
        services: Vec::new(),
        checks: Vec::new(),
        config: Vec::new(),
        ca: None,
        acl_tokens: Vec::new(),
        acl_policies: Vec::new(),
        acl_roles: Vec::new(),
        acl_auth_methods: Vec::new(),
        acl_binding_rules: Vec::new(),
        acl_bootstrapped: None,
        kv: Vec::new(),
        kv_tombstones: Vec::new(),
        // Deletes before this revision left no tombstones here: no prefix answers below it.
        kv_floor: revision,
        sessions: Vec::new(),
        lock_delays: Vec::new(),
        events: Vec::new(),
        audit: Vec::new(),
        queries: Vec::new(),
        virtual_ips: Vec::new(),
        peerings: Vec::new(),
        imported: Vec::new(),
        peering_servers: Vec::new(),
        indexes: Vec::new(),
    };
    for kv in kvs {
        if let Some(change) = decode(kv.key, Some(kv.value))? {
            add_row(&mut p, change, kv.create, kv.modify);
        }
    }
    let mut tables = vec![
        IndexKey::Nodes,
        IndexKey::Services,
        IndexKey::Checks,
        IndexKey::Intentions,
        IndexKey::ConfigEntries,
        IndexKey::IngressGateways,
        IndexKey::Ca,
        IndexKey::AclTokens,
        IndexKey::AclPolicies,
        IndexKey::AclRoles,
        IndexKey::AclAuthMethods,
        IndexKey::AclBindingRules,
        IndexKey::Acl,
        IndexKey::Kvs,
        IndexKey::Sessions,
        IndexKey::Events,
        IndexKey::Audit,
        IndexKey::Queries,
        IndexKey::VirtualIps,
        IndexKey::Peerings,
        IndexKey::PeeringRoutes,
    ];
    tables.extend(ConfigEntryKind::ALL.into_iter().map(IndexKey::ConfigKind));
    p.indexes = tables.into_iter().map(|k| (k, revision)).collect();
    Ok(State::from_persisted(p))
}

/// Adds the row a put `change` read from etcd makes, with its key's revisions.
fn add_row(p: &mut PersistedState, change: Change, create: Index, modify: Index) {
    match change {
        Change::PutNode(mut n) => {
            (n.create_index, n.modify_index) = (create, modify);
            p.nodes.push(n);
        }
        Change::PutService { node, mut service } => {
            (service.create_index, service.modify_index) = (create, modify);
            p.services.push((node, service));
        }
        Change::PutCheck(mut c) => {
            (c.create_index, c.modify_index) = (create, modify);
            p.checks.push(c);
        }
        Change::PutConfig(mut e) => {
            e.set_indexes(create, modify);
            p.config.push(e);
        }
        Change::PutCa(mut ca) => {
            stamp_ca(&mut ca, create, modify);
            p.ca = Some(ca);
        }
        Change::PutAclToken(mut t) => {
            (t.create_index, t.modify_index) = (create, modify);
            p.acl_tokens.push(t);
        }
        Change::PutAclPolicy(mut pol) => {
            (pol.create_index, pol.modify_index) = (create, modify);
            p.acl_policies.push(pol);
        }
        Change::PutAclRole(mut r) => {
            (r.create_index, r.modify_index) = (create, modify);
            p.acl_roles.push(r);
        }
        Change::PutAclAuthMethod(mut m) => {
            (m.create_index, m.modify_index) = (create, modify);
            p.acl_auth_methods.push(m);
        }
        Change::PutAclBindingRule(mut r) => {
            (r.create_index, r.modify_index) = (create, modify);
            p.acl_binding_rules.push(r);
        }
        Change::AclBootstrapped => p.acl_bootstrapped = Some(modify),
        Change::PutKv(mut e) => {
            (e.create_index, e.modify_index) = (create, modify);
            p.kv.push(e);
        }
        Change::PutSession(mut session) => {
            (session.create_index, session.modify_index) = (create, modify);
            p.sessions.push(session);
        }
        Change::PutLockDelay { key, until_ms } => p.lock_delays.push((key, until_ms)),
        Change::PutEvent(e) => p.events.push(e),
        Change::PutAudit(mut r) => {
            r.index = create;
            p.audit.push(*r);
        }
        Change::PutQuery(mut q) => {
            (q.create_index, q.modify_index) = (create, modify);
            p.queries.push(q);
        }
        Change::PutVirtualIp { service, ip } => p.virtual_ips.push((service, ip)),
        Change::PutPeering(mut peering) => {
            (peering.peering.create_index, peering.peering.modify_index) = (create, modify);
            p.peerings.push(*peering);
        }
        Change::PutImported { peer, service } => p.imported.push((peer, *service)),
        Change::PutPeeringServers(addresses) => p.peering_servers = addresses,
        _ => unreachable!("decode of a put yields a put"),
    }
}

fn stamp_ca(ca: &mut CaState, create: Index, modify: Index) {
    (ca.create_index, ca.modify_index) = (create, modify);
    for root in &mut ca.roots {
        if root.root.create_index == Index(0) {
            root.root.create_index = modify;
        }
        if root.root.modify_index == Index(0) {
            root.root.modify_index = modify;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use structs::{Node, NodeService};

    #[test]
    fn every_change_round_trips_through_its_key() {
        let changes = vec![
            Change::PutNode(Node {
                node: "a/b%c".into(),
                ..Node::default()
            }),
            Change::DeleteNode("a/b%c".into()),
            Change::PutService {
                node: "n1".into(),
                service: NodeService {
                    id: "web/1".into(),
                    service: "web".into(),
                    ..NodeService::default()
                },
            },
            Change::DeleteService {
                node: "n1".into(),
                id: "web/1".into(),
            },
            Change::DeleteCheck {
                node: "n1".into(),
                id: "c%2F".into(),
            },
            Change::DeleteConfig(ConfigEntryKind::ServiceResolver, "api".into()),
            Change::DeleteAclToken("t".into()),
            Change::DeleteAclPolicy("p".into()),
            Change::DeleteAclRole("r".into()),
            Change::PutAclAuthMethod(structs::acl::AclAuthMethod {
                name: "idp/x".into(),
                kind: "jwt".into(),
                ..Default::default()
            }),
            Change::DeleteAclAuthMethod("idp/x".into()),
            Change::PutAclBindingRule(structs::acl::AclBindingRule {
                id: "rule-1".into(),
                auth_method: "idp/x".into(),
                bind_type: "service".into(),
                bind_name: "${value.service}".into(),
                ..Default::default()
            }),
            Change::DeleteAclBindingRule("rule-1".into()),
            Change::AclBootstrapped,
            Change::DeletePeering("cluster-b".into()),
            Change::PutPeeringServers(vec!["10.0.0.9:8503".into()]),
            Change::DeleteImported {
                peer: "cluster-b".into(),
                service: "api/x".into(),
            },
            Change::PutKv(structs::KvEntry {
                key: "app/a%2F/b".into(),
                value: b"v".to_vec(),
                flags: 3,
                ..structs::KvEntry::default()
            }),
            Change::DeleteKv("/lead/".into()),
            Change::PutSession(structs::session::Session {
                id: "s/1".into(),
                node: "n1".into(),
                ..Default::default()
            }),
            Change::DeleteSession("s/1".into()),
            Change::PutLockDelay {
                key: "app/lock".into(),
                until_ms: 42,
            },
            Change::DeleteLockDelay("app/lock".into()),
            Change::PutEvent(structs::event::UserEvent {
                id: "e1".into(),
                name: "deploy".into(),
                ltime: 7,
                ..Default::default()
            }),
            Change::DeleteEvent(7),
            Change::PutAudit(Box::new(structs::audit::AuditRecord {
                seq: 12,
                kind: "config".into(),
                body: Some(serde_json::json!({"Kind": "mesh"})),
                ..Default::default()
            })),
            Change::DeleteAudit(12),
            Change::PutQuery(structs::query::PreparedQuery {
                id: "q/1".into(),
                name: "web".into(),
                ..Default::default()
            }),
            Change::DeleteQuery("q/1".into()),
            Change::PutVirtualIp {
                service: "web/v2".into(),
                ip: "240.0.0.7".parse().unwrap(),
            },
            Change::DeleteVirtualIp("web/v2".into()),
        ];
        for change in changes {
            let (key, value) = encode(&change).unwrap();
            let back = decode(&key, value.as_deref()).unwrap().unwrap();
            assert_eq!(back, change, "{key}");
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let e = decode("nodes/x", Some(b"{}")).unwrap_err();
        assert_eq!(e.to_string(), "etcd key catalog/nodes/x: not a key meshd writes");
        let e = decode("node/x", Some(b"not json")).unwrap_err();
        assert!(
            e.to_string().starts_with("etcd key catalog/node/x: undecodable value"),
            "{e}"
        );
        assert!(decode(GUARD, Some(b"x")).unwrap().is_none());
    }
}
