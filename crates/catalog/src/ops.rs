//! Writes: what callers ask for ([`Op`]) and how each is checked against the current state
//! and turned into deterministic [`Change`]s. Planning may read the clock or generate keys;
//! the resulting changes are what is logged and replayed, so replay never does either.

use crate::acl_ops;
use crate::ca::{CaError, CaState};
use crate::error::WriteError;
use crate::kv_ops;
pub use crate::op::Op;
use crate::plan::{Plan, same_entry};
use crate::session_ops;
use crate::state::{Change, State};
use crate::txn_ops;
use std::{sync::Arc, time::SystemTime};
use structs::config_entry::{ServiceIntentions, SourceIntention};
use structs::{
    ConfigEntry, ConfigEntryKind, DeregisterRequest, HealthCheck, Index, Node, Problem, RegisterRequest, Timestamp,
    Validate, ValidationError,
};

/// A prepared query created or updated; names are unique (a template's name is its prefix).
fn plan_query_set(state: &State, query: &structs::query::PreparedQuery, create: bool) -> Result<Plan, WriteError> {
    query.validate()?;
    let exists = state.query(&query.id).is_some();
    if create && exists {
        return Err(ValidationError::new("ID", Problem::Invalid(format!("query {:?} exists", query.id))).into());
    }
    if !query.session.is_empty() && state.session(&query.session).is_none() {
        return Err(ValidationError::new(
            "Session",
            Problem::Invalid(format!("invalid session {:?}", query.session)),
        )
        .into());
    }
    if !create && !exists {
        return Err(WriteError::NotFound(format!("Query not found: {:?}", query.id)));
    }
    if !query.name.is_empty()
        && let Some(other) = state.queries().find(|q| q.name == query.name && q.id != query.id)
    {
        return Err(ValidationError::new(
            "Name",
            Problem::Invalid(format!("name {:?} is used by query {:?}", query.name, other.id)),
        )
        .into());
    }
    Ok(Plan::write(vec![Change::PutQuery(query.clone())]))
}

/// A user event kept after the ones before it; the oldest goes past the number kept.
fn plan_event(state: &State, event: &structs::event::UserEvent) -> Result<Plan, WriteError> {
    event.validate()?;
    let mut event = event.clone();
    event.ltime = state.events().last().map_or(1, |e| e.ltime + 1);
    let mut changes = vec![Change::PutEvent(event)];
    let kept = state.events().count();
    if kept >= structs::event::KEPT {
        changes.extend(
            state
                .events()
                .take(kept + 1 - structs::event::KEPT)
                .map(|e| Change::DeleteEvent(e.ltime)),
        );
    }
    Ok(Plan::write(changes))
}

fn check_dc(dc: &str, ours: &str) -> Result<(), WriteError> {
    if dc.is_empty() || dc == ours {
        Ok(())
    } else {
        Err(WriteError::UnknownDatacenter(dc.to_owned()))
    }
}

/// A secondary datacenter's CA following the primary's `roots` with `intermediate` (no
/// write when it already does).
fn plan_ca_follow(
    state: &State,
    roots: &structs::IndexedCaRoots,
    intermediate: &crate::ca::Intermediate,
) -> Result<Plan, WriteError> {
    let current = state.ca();
    let next =
        CaState::following(current.as_deref(), roots, intermediate.clone()).ok_or_else(|| CaError::InvalidConfig {
            field: "Roots",
            reason: format!(
                "the primary's roots (trust domain {:?}) have no active root of a built-in CA",
                roots.trust_domain
            ),
        })?;
    if current.as_deref() == Some(&next) {
        return Ok(Plan::write(Vec::new()));
    }
    Ok(Plan::write(vec![Change::PutCa(next)]))
}

pub(crate) fn plan(op: &Op, state: &State, datacenter: &str, now: SystemTime) -> Result<Plan, WriteError> {
    match op {
        Op::Register(req) => plan_register(req, state, datacenter),
        Op::Deregister(req) => plan_deregister(req, state, datacenter),
        Op::ConfigSet { entry, cas } => plan_config_set(entry, *cas, state, datacenter),
        Op::ConfigDelete { kind, name, cas } => plan_config_delete(*kind, name, *cas, state, datacenter),
        Op::IntentionUpsert {
            source,
            destination,
            action,
            permissions,
            description,
            meta,
            create,
        } => plan_intention_upsert(state, datacenter, destination, source, *create, now, |src| {
            src.action = *action;
            src.permissions = permissions.clone();
            src.description = description.clone();
            src.legacy_meta = meta.clone();
        }),
        Op::IntentionDelete { source, destination } => plan_intention_delete(state, destination, source),
        Op::CaBootstrap { config, cluster_id } => {
            if state.ca().is_some() {
                return Ok(Plan::write(Vec::new()));
            }
            Ok(Plan::write(vec![Change::PutCa(CaState::bootstrap(
                config.clone(),
                cluster_id.as_deref(),
            )?)]))
        }
        Op::CaConfigure(config) => {
            let current = state.ca().ok_or(CaError::NoActiveRoot)?;
            if current.config == *config {
                return Ok(Plan::write(Vec::new()));
            }
            Ok(Plan::write(vec![Change::PutCa(
                current.reconfigure(config.clone(), now)?,
            )]))
        }
        Op::CaFollowPrimary { roots, intermediate } => plan_ca_follow(state, roots, intermediate),
        Op::CaPruneRoots { now } => Ok(Plan::write(
            state
                .ca()
                .and_then(|ca| ca.pruned(*now))
                .map(Change::PutCa)
                .into_iter()
                .collect(),
        )),
        Op::ReplicateConfig(entries) => Ok(crate::replication_ops::plan_config(state, entries)),
        Op::ReplicateAcl(replica) => Ok(crate::replication_ops::plan_acl(state, replica)),
        Op::AclInit => Ok(acl_ops::plan_init(state, now)),
        Op::AclBootstrap { accessor, secret } => acl_ops::plan_bootstrap(state, accessor, secret, now),
        Op::AclTokenSet { token, create, ttl } => acl_ops::plan_token_set(state, token, *create, *ttl, now),
        Op::AclTokenDelete { accessor } => acl_ops::plan_token_delete(state, accessor),
        Op::AclPolicySet { policy, create } => acl_ops::plan_policy_set(state, policy, *create),
        Op::AclPolicyDelete { id } => acl_ops::plan_policy_delete(state, id),
        Op::AclRoleSet { role, create } => acl_ops::plan_role_set(state, role, *create),
        Op::AclRoleDelete { id } => Ok(acl_ops::plan_role_delete(state, id)),
        Op::AclAuthMethodSet { method, create } => crate::auth_method_ops::plan_method_set(state, method, *create),
        Op::AclAuthMethodDelete { name } => Ok(crate::auth_method_ops::plan_method_delete(state, name)),
        Op::AclBindingRuleSet { rule, create } => crate::auth_method_ops::plan_rule_set(state, rule, *create),
        Op::AclBindingRuleDelete { id } => Ok(crate::auth_method_ops::plan_rule_delete(state, id)),
        Op::KvSet { key, value, flags, cas } => kv_ops::plan_set(state, key, value, *flags, *cas),
        Op::KvDelete { key, cas } => kv_ops::plan_delete(state, key, *cas),
        Op::KvDeleteTree { prefix } => Ok(kv_ops::plan_delete_tree(state, prefix)),
        Op::KvLock { entry, session, now_ms } => {
            kv_ops::check_entry(&entry.key, &entry.value)?;
            session_ops::plan_lock(state, (**entry).clone(), session, *now_ms)
        }
        Op::KvUnlock { entry, session } => {
            kv_ops::check_entry(&entry.key, &entry.value)?;
            Ok(session_ops::plan_unlock(state, (**entry).clone(), session))
        }
        Op::SessionCreate(session) => session_ops::plan_create(state, session),
        Op::SessionRenew { id, now_ms } => session_ops::plan_renew(state, id, *now_ms),
        Op::SessionDestroy { id, now_ms } => Ok(session_ops::plan_destroy(state, id, *now_ms)),
        Op::SessionsInvalidate { now_ms } => Ok(session_ops::plan_invalidate(state, *now_ms)),
        Op::EventFire(event) => plan_event(state, event),
        Op::QuerySet { query, create } => plan_query_set(state, query, *create),
        Op::QueryDelete { id } => Ok(Plan::write(
            state
                .query(id)
                .map(|_| Change::DeleteQuery(id.clone()))
                .into_iter()
                .collect(),
        )),
        Op::Restore(snapshot) => {
            let now_ms = now
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            Ok(Plan::write(state.restore_changes(&snapshot.state, now_ms)))
        }
        Op::AuditOnly => Ok(Plan::write(Vec::new())),
        Op::Peering(op) => crate::peering_ops::plan(op, state),
        Op::Txn(ops) => txn_ops::plan_txn(ops, state, now, &|op, s| plan(op, s, datacenter, now)),
    }
}

/// A config entry written, unless `cas` names another modify index or nothing changes.
fn plan_config_set(
    entry: &ConfigEntry,
    cas: Option<Index>,
    state: &State,
    datacenter: &str,
) -> Result<Plan, WriteError> {
    entry.validate()?;
    check_graph(state, datacenter, entry.kind(), entry.name(), Some(entry))?;
    crate::gateways::check_gateways(state, entry.kind(), entry.name(), Some(entry))?;
    crate::jwt_refs::check_jwt_refs(state, entry.kind(), entry.name(), Some(entry))?;
    let existing = state.config_entry(entry.kind(), entry.name());
    if let Some(cas) = cas {
        let current = existing.as_ref().map_or(Index(0), |e| e.modify_index());
        if current != cas {
            return Ok(Plan::refused());
        }
    }
    if let ConfigEntry::InlineCertificate(c) = entry {
        crate::api_gateways::check_inline_certificate(c)?;
    }
    let mut entry = entry.clone();
    if let ConfigEntry::ServiceIntentions(si) = &mut entry {
        set_precedence(si);
    }
    // Derived when read, never stored: a status written by a client is not the catalog's.
    if let Some(status) = entry.status_mut() {
        *status = None;
    }
    if existing.as_deref().is_some_and(|e| same_entry(e, &entry)) {
        return Ok(Plan::write(Vec::new()));
    }
    Ok(Plan::write(vec![Change::PutConfig(entry)]))
}

/// A config entry deleted, unless `cas` names another modify index.
fn plan_config_delete(
    kind: ConfigEntryKind,
    name: &str,
    cas: Option<Index>,
    state: &State,
    datacenter: &str,
) -> Result<Plan, WriteError> {
    let existing = state.config_entry(kind, name);
    if let Some(cas) = cas
        && existing.as_ref().map_or(Index(0), |e| e.modify_index()) != cas
    {
        return Ok(Plan::refused());
    }
    if existing.is_none() {
        return Ok(Plan::write(Vec::new()));
    }
    check_graph(state, datacenter, kind, name, None)?;
    crate::gateways::check_gateways(state, kind, name, None)?;
    crate::jwt_refs::check_jwt_refs(state, kind, name, None)?;
    Ok(Plan::write(vec![Change::DeleteConfig(kind, name.to_owned())]))
}

/// A legacy intention written as one source of the destination's service-intentions entry
/// (created, or updated in place with `fill`).
fn plan_intention_upsert(
    state: &State,
    datacenter: &str,
    destination: &str,
    source: &str,
    create: bool,
    now: SystemTime,
    fill: impl FnOnce(&mut SourceIntention),
) -> Result<Plan, WriteError> {
    let mut entry = intentions_entry(state, destination);
    let existing = entry.sources.iter().position(|s| s.name == source);
    if let Some(i) = existing.filter(|_| create) {
        return Err(WriteError::Invalid(ValidationError::new(
            "SourceName",
            Problem::Invalid(format!(
                "duplicate intention found: {source} => {destination} exists (ID {:?})",
                entry.sources[i].legacy_id
            )),
        )));
    }
    let stamp = Timestamp(now);
    let mut src = existing
        .map(|i| entry.sources[i].clone())
        .unwrap_or_else(|| SourceIntention {
            name: source.to_owned(),
            legacy_create_time: Some(stamp),
            ..SourceIntention::default()
        });
    // Every intention written through the legacy API has an id (its `ID`, which the
    // `/v1/connect/intentions/:id` routes take), made when it is created.
    if src.legacy_id.is_empty() {
        src.legacy_id = crate::ca::new_uuid()?;
    }
    fill(&mut src);
    src.legacy_update_time = Some(stamp);
    src.source_type = "consul".into();
    match existing {
        Some(i) => entry.sources[i] = src,
        None => entry.sources.push(src),
    }
    set_precedence(&mut entry);
    let entry = ConfigEntry::ServiceIntentions(entry);
    entry.validate().map_err(legacy_field)?;
    check_graph(state, datacenter, entry.kind(), entry.name(), Some(&entry))?;
    Ok(Plan::write(vec![Change::PutConfig(entry)]))
}

/// A legacy intention removed from the destination's entry (the entry goes with its last).
fn plan_intention_delete(state: &State, destination: &str, source: &str) -> Result<Plan, WriteError> {
    let mut entry = intentions_entry(state, destination);
    let before = entry.sources.len();
    entry.sources.retain(|s| s.name != source);
    if entry.sources.len() == before {
        return Ok(Plan::write(Vec::new()));
    }
    if entry.sources.is_empty() {
        return Ok(Plan::write(vec![Change::DeleteConfig(
            ConfigEntryKind::ServiceIntentions,
            destination.to_owned(),
        )]));
    }
    Ok(Plan::write(vec![Change::PutConfig(ConfigEntry::ServiceIntentions(
        entry,
    ))]))
}

/// The kinds whose entries shape discovery chains or depend on a service's protocol.
const GRAPH_KINDS: [ConfigEntryKind; 6] = [
    ConfigEntryKind::ProxyDefaults,
    ConfigEntryKind::ServiceDefaults,
    ConfigEntryKind::ServiceResolver,
    ConfigEntryKind::ServiceRouter,
    ConfigEntryKind::ServiceSplitter,
    ConfigEntryKind::ServiceIntentions,
];

/// Refuses a write (`Some(entry)`) or delete (`None`) of `kind`/`name` that would break a
/// discovery chain that compiles now (or add one that does not), or leave L7 intentions on a
/// non-HTTP service. The error names the entry and field at fault, which may be another
/// entry than the one written (a service-defaults turning a routed service to tcp names the
/// router). What is already broken does not block unrelated writes.
fn check_graph(
    state: &State,
    datacenter: &str,
    kind: ConfigEntryKind,
    name: &str,
    entry: Option<&ConfigEntry>,
) -> Result<(), ValidationError> {
    if !GRAPH_KINDS.contains(&kind) {
        return Ok(());
    }
    let before = GraphEntries::read(|k| state.config_entries(k));
    let after = GraphEntries::read(|k| {
        let mut all = state.config_entries(k);
        if k == kind {
            all.retain(|e| e.name() != name);
            all.extend(entry.cloned().map(Arc::new));
        }
        all
    });
    let also = if kind == ConfigEntryKind::ProxyDefaults {
        ""
    } else {
        name
    };
    discovery_chain::validate_change(&before.entries(), &after.entries(), datacenter, also).map_err(|e| {
        ValidationError::new(
            format!("{} {:?} {}", e.kind, e.name, e.field),
            Problem::Invalid(e.problem),
        )
    })
}

/// The entries a discovery chain or an L7 intention check reads, by kind.
struct GraphEntries {
    proxy: Vec<Arc<ConfigEntry>>,
    defaults: Vec<Arc<ConfigEntry>>,
    resolvers: Vec<Arc<ConfigEntry>>,
    routers: Vec<Arc<ConfigEntry>>,
    splitters: Vec<Arc<ConfigEntry>>,
    intentions: Vec<Arc<ConfigEntry>>,
}

impl GraphEntries {
    fn read(list: impl Fn(ConfigEntryKind) -> Vec<Arc<ConfigEntry>>) -> Self {
        Self {
            proxy: list(ConfigEntryKind::ProxyDefaults),
            defaults: list(ConfigEntryKind::ServiceDefaults),
            resolvers: list(ConfigEntryKind::ServiceResolver),
            routers: list(ConfigEntryKind::ServiceRouter),
            splitters: list(ConfigEntryKind::ServiceSplitter),
            intentions: list(ConfigEntryKind::ServiceIntentions),
        }
    }

    fn entries(&self) -> discovery_chain::Entries<'_> {
        discovery_chain::Entries {
            proxy_defaults: structs::central_config::proxy_defaults(self.proxy.first()),
            service_defaults: &self.defaults,
            resolvers: &self.resolvers,
            routers: &self.routers,
            splitters: &self.splitters,
            intentions: &self.intentions,
        }
    }
}

/// Entries are equal apart from the indexes the store stamps.
fn set_precedence(si: &mut ServiceIntentions) {
    for src in &mut si.sources {
        src.precedence = structs::intention::precedence("default", &src.name, "default", &si.name);
    }
}

fn intentions_entry(state: &State, destination: &str) -> ServiceIntentions {
    match state
        .config_entry(ConfigEntryKind::ServiceIntentions, destination)
        .as_deref()
    {
        Some(ConfigEntry::ServiceIntentions(si)) => si.clone(),
        _ => ServiceIntentions {
            name: destination.to_owned(),
            ..ServiceIntentions::default()
        },
    }
}

/// Names the legacy API's fields (`SourceName`, `DestinationName`, `Action`, ...) rather
/// than the config entry's (`Sources[0].Name`, `Name`).
fn legacy_field(e: ValidationError) -> ValidationError {
    let field = if e.field == "Name" {
        "DestinationName".to_owned()
    } else if let Some((_, rest)) = e.field.split_once("].") {
        if rest == "Name" {
            "SourceName".to_owned()
        } else {
            rest.to_owned()
        }
    } else {
        e.field
    };
    ValidationError {
        field,
        problem: e.problem,
    }
}

fn plan_register(req: &RegisterRequest, state: &State, datacenter: &str) -> Result<Plan, WriteError> {
    check_dc(&req.datacenter, datacenter)?;
    req.validate()?;
    if req.address.is_empty() && state.node(&req.node).is_none() {
        return Err(WriteError::Invalid(ValidationError::new(
            "Address",
            Problem::Invalid(format!(
                "required: node {:?} is not registered, and SkipNodeUpdate leaves a node as it is",
                req.node
            )),
        )));
    }
    let mut changes = Vec::new();
    if let Some(node) = node_change(req, state, datacenter) {
        changes.push(Change::PutNode(node));
    }
    let registered = req.service.as_ref().map(|svc| {
        let mut svc = svc.clone();
        svc.normalize();
        svc
    });
    if let Some(svc) = &registered {
        let unchanged = state.service(&req.node, &svc.id).is_some_and(|o| {
            let mut cmp = svc.clone();
            cmp.create_index = o.create_index;
            cmp.modify_index = o.modify_index;
            cmp == *o
        });
        if !unchanged {
            changes.push(Change::PutService {
                node: req.node.clone(),
                service: svc.clone(),
            });
        }
    }
    for (i, check) in req.all_checks().enumerate() {
        if let Some(check) = check_change(req, i, check, registered.as_ref(), state)? {
            changes.push(Change::PutCheck(check));
        }
    }
    Ok(Plan::write(changes))
}

/// The node a registration writes, unless it is unchanged (or the request skips it).
fn node_change(req: &RegisterRequest, state: &State, datacenter: &str) -> Option<Node> {
    let node = Node {
        id: req.id.clone(),
        node: req.node.clone(),
        address: req.address.clone(),
        datacenter: datacenter.to_owned(),
        tagged_addresses: req.tagged_addresses.clone(),
        meta: req.node_meta.clone(),
        ..Node::default()
    };
    let changed = match state.node(&req.node) {
        None => true,
        Some(_) if req.skip_node_update => false,
        Some(old) => {
            let mut cmp = node.clone();
            cmp.create_index = old.create_index;
            cmp.modify_index = old.modify_index;
            cmp != *old
        }
    };
    changed.then_some(node)
}

/// Check `i` of a registration, completed (ids, names, its service's name and tags), unless
/// it is unchanged. A check naming a service the node does not have (nor registers with it)
/// is refused. Only the check's own service is looked up, so registering on a node with many
/// services costs no more than on an empty one.
fn check_change(
    req: &RegisterRequest,
    i: usize,
    check: &HealthCheck,
    registered: Option<&structs::NodeService>,
    state: &State,
) -> Result<Option<HealthCheck>, WriteError> {
    let mut check = check.clone();
    check.node = req.node.clone();
    if check.check_id.is_empty() {
        check.check_id = check.name.clone();
    }
    if check.name.is_empty() {
        check.name = check.check_id.clone();
    }
    if !check.service_id.is_empty() {
        let stored;
        let service = match registered.filter(|s| s.id == check.service_id) {
            Some(s) => Some(s),
            None => {
                stored = state.service(&req.node, &check.service_id);
                stored.as_deref()
            }
        };
        let Some(structs::NodeService {
            service: name, tags, ..
        }) = service
        else {
            let at = if req.check.is_some() && i == 0 {
                "Check".to_owned()
            } else {
                format!("Checks[{i}]")
            };
            return Err(ValidationError::new(
                format!("{at}.ServiceID"),
                Problem::Invalid(format!("no service {:?} on node {:?}", check.service_id, req.node)),
            )
            .into());
        };
        check.service_name = name.clone();
        check.service_tags = tags.clone();
    }
    let unchanged = state.check(&req.node, &check.check_id).is_some_and(|o| {
        let mut cmp = check.clone();
        cmp.create_index = o.create_index;
        cmp.modify_index = o.modify_index;
        cmp == *o
    });
    Ok((!unchanged).then_some(check))
}

fn plan_deregister(req: &DeregisterRequest, state: &State, datacenter: &str) -> Result<Plan, WriteError> {
    check_dc(&req.datacenter, datacenter)?;
    req.validate()?;
    if state.node(&req.node).is_none() {
        // Consul treats removing what is not there as success.
        return Ok(Plan::write(Vec::new()));
    }
    let node = req.node.clone();
    let mut changes = Vec::new();
    if !req.service_id.is_empty() {
        if state.service(&node, &req.service_id).is_some() {
            changes.push(Change::DeleteService {
                node: node.clone(),
                id: req.service_id.clone(),
            });
            for c in state
                .node_checks(&node)
                .iter()
                .filter(|c| c.service_id == req.service_id)
            {
                changes.push(Change::DeleteCheck {
                    node: node.clone(),
                    id: c.check_id.clone(),
                });
            }
        }
    } else if !req.check_id.is_empty() {
        if state.check(&node, &req.check_id).is_some() {
            changes.push(Change::DeleteCheck {
                node,
                id: req.check_id.clone(),
            });
        }
    } else {
        for c in state.node_checks(&node) {
            changes.push(Change::DeleteCheck {
                node: node.clone(),
                id: c.check_id.clone(),
            });
        }
        for s in state.node_services(&node) {
            changes.push(Change::DeleteService {
                node: node.clone(),
                id: s.id.clone(),
            });
        }
        changes.push(Change::DeleteNode(node));
    }
    Ok(Plan::write(changes))
}
