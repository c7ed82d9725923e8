//! Planning of ACL writes: tokens, policies, roles, bootstrap. Ids and secrets arrive
//! already chosen (the caller generates the missing ones), so plans stay deterministic.

use crate::error::WriteError;
use crate::plan::Plan;
use crate::state::{Change, State};
use std::time::{Duration, SystemTime};
use structs::Timestamp;
use structs::acl::{
    ANONYMOUS_ACCESSOR, ANONYMOUS_SECRET, AclPolicy, AclRole, AclToken, GLOBAL_MANAGEMENT_ID, GLOBAL_MANAGEMENT_NAME,
    GLOBAL_READ_ONLY_ID, GLOBAL_READ_ONLY_NAME, Link, NodeIdentity, ServiceIdentity,
};
use structs::validate::{Problem, ValidationError};

/// The shortest and longest token lifetimes accepted, as Consul's defaults.
pub(crate) const MIN_TTL: Duration = Duration::from_secs(60);
pub(crate) const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

pub(crate) fn invalid(field: &str, why: impl Into<String>) -> WriteError {
    WriteError::Invalid(ValidationError::new(field, Problem::Invalid(why.into())))
}

pub(crate) fn required(field: &str) -> WriteError {
    WriteError::Invalid(ValidationError::new(field, Problem::Required("")))
}

/// The built-in policy that grants everything.
pub(crate) fn global_management() -> AclPolicy {
    AclPolicy {
        id: GLOBAL_MANAGEMENT_ID.into(),
        name: GLOBAL_MANAGEMENT_NAME.into(),
        description: "Builtin Policy that grants unlimited access".into(),
        rules: acl::GLOBAL_MANAGEMENT_RULES.into(),
        ..AclPolicy::default()
    }
}

/// The built-in policy that reads everything.
pub(crate) fn global_read_only() -> AclPolicy {
    AclPolicy {
        id: GLOBAL_READ_ONLY_ID.into(),
        name: GLOBAL_READ_ONLY_NAME.into(),
        description: "Builtin Policy that grants unlimited read-only access to all components".into(),
        rules: acl::GLOBAL_READ_ONLY_RULES.into(),
        ..AclPolicy::default()
    }
}

/// The built-in policy with this id, if it is one.
fn builtin(id: &str) -> Option<AclPolicy> {
    match id {
        GLOBAL_MANAGEMENT_ID => Some(global_management()),
        GLOBAL_READ_ONLY_ID => Some(global_read_only()),
        _ => None,
    }
}

/// What ACLs need before first use: the built-in policies and the anonymous token (a store
/// made before a built-in policy existed gets it at its next start).
pub(crate) fn plan_init(state: &State, now: SystemTime) -> Plan {
    let mut changes = Vec::new();
    for policy in [global_management(), global_read_only()] {
        if state.acl_policy(&policy.id).is_none() {
            changes.push(Change::PutAclPolicy(policy));
        }
    }
    if state.acl_token(ANONYMOUS_ACCESSOR).is_none() {
        changes.push(Change::PutAclToken(AclToken {
            accessor_id: ANONYMOUS_ACCESSOR.into(),
            secret_id: ANONYMOUS_SECRET.into(),
            description: "Anonymous Token".into(),
            create_time: Timestamp(now),
            ..AclToken::default()
        }));
    }
    Plan::write(changes)
}

/// The first management token; refused once ACLs were bootstrapped.
pub(crate) fn plan_bootstrap(state: &State, accessor: &str, secret: &str, now: SystemTime) -> Result<Plan, WriteError> {
    if let Some(at) = state.acl_bootstrapped() {
        return Err(WriteError::Forbidden(format!(
            "ACL bootstrap no longer allowed (reset index: {at})"
        )));
    }
    check_secret("BootstrapSecret", secret)?;
    if state.acl_token_by_secret(secret).is_some() {
        return Err(invalid("BootstrapSecret", "already used by another token"));
    }
    let mut changes = plan_init(state, now).changes;
    changes.push(Change::PutAclToken(AclToken {
        accessor_id: accessor.into(),
        secret_id: secret.into(),
        description: "Bootstrap Token (Global Management)".into(),
        policies: vec![Link {
            id: GLOBAL_MANAGEMENT_ID.into(),
            name: GLOBAL_MANAGEMENT_NAME.into(),
        }],
        create_time: Timestamp(now),
        ..AclToken::default()
    }));
    changes.push(Change::AclBootstrapped);
    Ok(Plan::write(changes))
}

/// A token's secret: any string a request header can carry (Consul makes UUIDs and accepts
/// others, with a warning): visible ASCII, no spaces, at most 256 characters.
fn check_secret(field: &str, s: &str) -> Result<(), WriteError> {
    if s.is_empty() || s.len() > 256 || !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(
            field,
            "must be 1 to 256 visible ASCII characters without spaces (it travels in a header)",
        ));
    }
    if !is_uuid(s) {
        // Never the secret itself: only that one is not a UUID.
        tracing::warn!(
            field,
            "a token secret that is not a UUID: accepted, but easier to guess than a generated one"
        );
    }
    Ok(())
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

fn check_uuid(field: &str, s: &str) -> Result<(), WriteError> {
    if is_uuid(s) {
        Ok(())
    } else {
        Err(invalid(field, format!("{s:?} is not a UUID")))
    }
}

/// Policy and role names: letters, digits, `-` and `_`, 1 to 128 of them (Consul's rule).
pub(crate) fn check_name(field: &str, name: &str) -> Result<(), WriteError> {
    if name.is_empty() {
        return Err(required(field));
    }
    if name.len() > 128 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(invalid(
            field,
            format!("{name:?} must be 1 to 128 letters, digits, '-' or '_'"),
        ));
    }
    Ok(())
}

/// Service names of identities: lowercase letters, digits, `-` and `_`, starting and
/// ending with a letter or digit (Consul's rule).
fn check_service_identity(field: &str, s: &ServiceIdentity) -> Result<(), WriteError> {
    let n = &s.service_name;
    if n.is_empty() {
        return Err(required(&format!("{field}.ServiceName")));
    }
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let valid = n.len() <= 256
        && n.chars().all(|c| ok_char(c) || c == '-' || c == '_')
        && n.starts_with(ok_char)
        && n.ends_with(ok_char);
    if !valid {
        return Err(invalid(
            &format!("{field}.ServiceName"),
            format!("{n:?} must be lowercase letters, digits, '-' or '_', starting and ending with a letter or digit"),
        ));
    }
    Ok(())
}

fn check_node_identity(field: &str, n: &NodeIdentity) -> Result<(), WriteError> {
    if n.node_name.is_empty() {
        return Err(required(&format!("{field}.NodeName")));
    }
    if n.datacenter.is_empty() {
        return Err(required(&format!("{field}.Datacenter")));
    }
    Ok(())
}

/// Links by id or by name, resolved to both; duplicates dropped.
fn resolve_links(
    field: &str,
    links: &[Link],
    what: &str,
    by_id: impl Fn(&str) -> Option<String>,
    by_name: impl Fn(&str) -> Option<String>,
) -> Result<Vec<Link>, WriteError> {
    let mut out: Vec<Link> = Vec::new();
    for (i, link) in links.iter().enumerate() {
        let f = format!("{field}[{i}]");
        let resolved = if !link.id.is_empty() {
            let name = by_id(&link.id)
                .ok_or_else(|| invalid(&format!("{f}.ID"), format!("no {what} with ID {:?}", link.id)))?;
            Link {
                id: link.id.clone(),
                name,
            }
        } else if !link.name.is_empty() {
            let id = by_name(&link.name)
                .ok_or_else(|| invalid(&format!("{f}.Name"), format!("no {what} named {:?}", link.name)))?;
            Link {
                id,
                name: link.name.clone(),
            }
        } else {
            return Err(invalid(&f, "set ID or Name"));
        };
        if !out.iter().any(|l| l.id == resolved.id) {
            out.push(resolved);
        }
    }
    Ok(out)
}

fn policy_links(state: &State, links: &[Link]) -> Result<Vec<Link>, WriteError> {
    resolve_links(
        "Policies",
        links,
        "policy",
        |id| state.acl_policy(id).map(|p| p.name.clone()),
        |name| state.acl_policy_by_name(name).map(|p| p.id.clone()),
    )
}

fn check_identities(services: &[ServiceIdentity], nodes: &[NodeIdentity]) -> Result<(), WriteError> {
    for (i, s) in services.iter().enumerate() {
        check_service_identity(&format!("ServiceIdentities[{i}]"), s)?;
    }
    for (i, n) in nodes.iter().enumerate() {
        check_node_identity(&format!("NodeIdentities[{i}]"), n)?;
    }
    Ok(())
}

/// A token created (`create`) or updated. `ttl` sets the expiration from now (create only).
pub(crate) fn plan_token_set(
    state: &State,
    token: &AclToken,
    create: bool,
    ttl: Option<Duration>,
    now: SystemTime,
) -> Result<Plan, WriteError> {
    let mut t = token.clone();
    check_uuid("AccessorID", &t.accessor_id)?;
    let existing = state.acl_token(&t.accessor_id);
    match (&existing, create) {
        (Some(_), true) => return Err(invalid("AccessorID", "a token with this accessor already exists")),
        (None, false) => {
            return Err(WriteError::NotFound(format!(
                "no token with AccessorID {:?}",
                t.accessor_id
            )));
        }
        _ => {}
    }
    if let Some(old) = &existing {
        if !t.secret_id.is_empty() && t.secret_id != old.secret_id {
            return Err(invalid("SecretID", "a token's secret cannot be changed"));
        }
        if ttl.is_some() || t.expiration_time.is_some_and(|e| Some(e) != old.expiration_time) {
            return Err(invalid("ExpirationTime", "a token's expiration cannot be changed"));
        }
        t.secret_id = old.secret_id.clone();
        t.expiration_time = old.expiration_time;
        t.auth_method = old.auth_method.clone();
        t.create_time = old.create_time;
    } else {
        check_secret("SecretID", &t.secret_id)?;
        if state.acl_token_by_secret(&t.secret_id).is_some() {
            return Err(invalid("SecretID", "already used by another token"));
        }
        if ttl.is_some() && t.expiration_time.is_some() {
            return Err(invalid(
                "ExpirationTTL",
                "set ExpirationTTL or ExpirationTime, not both",
            ));
        }
        if let Some(ttl) = ttl {
            if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
                return Err(invalid("ExpirationTTL", "must be between 1m0s and 24h0m0s"));
            }
            t.expiration_time = Some(Timestamp(now + ttl));
        }
        if let Some(at) = t.expiration_time {
            match at.0.duration_since(now) {
                Ok(left) if (MIN_TTL..=MAX_TTL + Duration::from_secs(1)).contains(&left) => {}
                _ => return Err(invalid("ExpirationTime", "must be between 1m0s and 24h0m0s from now")),
            }
        }
        t.create_time = Timestamp(now);
        if !t.auth_method.is_empty() && state.acl_auth_method(&t.auth_method).is_none() {
            return Err(invalid(
                "AuthMethod",
                format!("no auth method named {:?}", t.auth_method),
            ));
        }
    }
    t.policies = policy_links(state, &t.policies)?;
    t.roles = resolve_links(
        "Roles",
        &t.roles,
        "role",
        |id| state.acl_role(id).map(|r| r.name.clone()),
        |name| state.acl_role_by_name(name).map(|r| r.id.clone()),
    )?;
    check_identities(&t.service_identities, &t.node_identities)?;
    if existing.as_deref().is_some_and(|old| same_token(old, &t)) {
        return Ok(Plan::write(Vec::new()));
    }
    Ok(Plan::write(vec![Change::PutAclToken(t)]))
}

fn same_token(a: &AclToken, b: &AclToken) -> bool {
    let mut b = b.clone();
    b.create_index = a.create_index;
    b.modify_index = a.modify_index;
    *a == b
}

pub(crate) fn plan_token_delete(state: &State, accessor: &str) -> Result<Plan, WriteError> {
    if accessor == ANONYMOUS_ACCESSOR {
        return Err(invalid("AccessorID", "the anonymous token cannot be deleted"));
    }
    Ok(Plan::write(if state.acl_token(accessor).is_some() {
        vec![Change::DeleteAclToken(accessor.to_owned())]
    } else {
        Vec::new()
    }))
}

pub(crate) fn plan_policy_set(state: &State, policy: &AclPolicy, create: bool) -> Result<Plan, WriteError> {
    let mut p = policy.clone();
    if p.id.is_empty() {
        return Err(required("ID"));
    }
    let existing = state.acl_policy(&p.id);
    match (&existing, create) {
        (Some(_), true) => return Err(invalid("ID", "a policy with this ID already exists")),
        (None, false) => return Err(WriteError::NotFound(format!("no policy with ID {:?}", p.id))),
        _ => {}
    }
    let builtin = builtin(&p.id);
    match &builtin {
        // A built-in policy keeps its name (which no user policy could take: it has a '/').
        Some(b) if p.name != b.name => {
            return Err(invalid(
                "Name",
                format!("the built-in {} policy cannot be renamed", b.name),
            ));
        }
        Some(_) => {}
        None => check_name("Name", &p.name)?,
    }
    if state.acl_policy_by_name(&p.name).is_some_and(|o| o.id != p.id) {
        return Err(invalid("Name", format!("a policy named {:?} already exists", p.name)));
    }
    if let Some(b) = &builtin {
        if p.rules != b.rules {
            return Err(invalid(
                "Rules",
                format!("the rules of the built-in {} policy cannot be changed", b.name),
            ));
        }
        if !p.datacenters.is_empty() {
            return Err(invalid(
                "Datacenters",
                format!("the built-in {} policy applies in every datacenter", b.name),
            ));
        }
    }
    acl::Rules::parse(&p.rules).map_err(|e| invalid("Rules", e.to_string()))?;
    for (i, dc) in p.datacenters.iter().enumerate() {
        if dc.is_empty() {
            return Err(required(&format!("Datacenters[{i}]")));
        }
    }
    p.datacenters.dedup();
    if let Some(old) = &existing {
        let mut same = p.clone();
        same.create_index = old.create_index;
        same.modify_index = old.modify_index;
        if **old == same {
            return Ok(Plan::write(Vec::new()));
        }
    }
    Ok(Plan::write(vec![Change::PutAclPolicy(p)]))
}

pub(crate) fn plan_policy_delete(state: &State, id: &str) -> Result<Plan, WriteError> {
    if let Some(b) = builtin(id) {
        return Err(invalid(
            "ID",
            format!("the built-in {} policy cannot be deleted", b.name),
        ));
    }
    Ok(Plan::write(if state.acl_policy(id).is_some() {
        vec![Change::DeleteAclPolicy(id.to_owned())]
    } else {
        Vec::new()
    }))
}

pub(crate) fn plan_role_set(state: &State, role: &AclRole, create: bool) -> Result<Plan, WriteError> {
    let mut r = role.clone();
    if r.id.is_empty() {
        return Err(required("ID"));
    }
    let existing = state.acl_role(&r.id);
    match (&existing, create) {
        (Some(_), true) => return Err(invalid("ID", "a role with this ID already exists")),
        (None, false) => return Err(WriteError::NotFound(format!("no role with ID {:?}", r.id))),
        _ => {}
    }
    check_name("Name", &r.name)?;
    if state.acl_role_by_name(&r.name).is_some_and(|o| o.id != r.id) {
        return Err(invalid("Name", format!("a role named {:?} already exists", r.name)));
    }
    r.policies = policy_links(state, &r.policies)?;
    check_identities(&r.service_identities, &r.node_identities)?;
    Ok(Plan::write(vec![Change::PutAclRole(r)]))
}

pub(crate) fn plan_role_delete(state: &State, id: &str) -> Plan {
    Plan::write(if state.acl_role(id).is_some() {
        vec![Change::DeleteAclRole(id.to_owned())]
    } else {
        Vec::new()
    })
}
