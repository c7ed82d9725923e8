//! Planning of auth method and binding rule writes. What a method's `Config` and a rule's
//! `Selector` and `BindName` mean depends on the method's type, which the `auth-method`
//! crate knows: the HTTP API checks those before it writes; here the catalog keeps names,
//! types and links consistent.

use crate::acl_ops::{MAX_TTL, MIN_TTL, check_name, invalid, required};
use crate::error::WriteError;
use crate::plan::Plan;
use crate::state::{Change, State};
use structs::acl::{AclAuthMethod, AclBindingRule};

/// The auth method types meshd verifies logins of.
pub const AUTH_METHOD_TYPES: &[&str] = &["jwt", "kubernetes"];
/// What a binding rule may bind.
pub const BIND_TYPES: &[&str] = &["service", "node", "role", "policy"];

pub(crate) fn plan_method_set(state: &State, method: &AclAuthMethod, create: bool) -> Result<Plan, WriteError> {
    check_name("Name", &method.name)?;
    let existing = state.acl_auth_method(&method.name);
    match (&existing, create) {
        (Some(_), true) => {
            return Err(invalid(
                "Name",
                format!("an auth method named {:?} already exists", method.name),
            ));
        }
        (None, false) => {
            return Err(WriteError::NotFound(format!("no auth method named {:?}", method.name)));
        }
        _ => {}
    }
    if method.kind.is_empty() {
        return Err(required("Type"));
    }
    if !AUTH_METHOD_TYPES.contains(&method.kind.as_str()) {
        return Err(invalid(
            "Type",
            format!(
                "{:?} is not supported (one of: {})",
                method.kind,
                AUTH_METHOD_TYPES.join(", ")
            ),
        ));
    }
    if let Some(old) = &existing
        && old.kind != method.kind
    {
        return Err(invalid("Type", "an auth method's type cannot be changed"));
    }
    if !matches!(method.token_locality.as_str(), "" | "local" | "global") {
        return Err(invalid(
            "TokenLocality",
            format!("{:?} must be \"local\" or \"global\"", method.token_locality),
        ));
    }
    if let Some(ttl) = method.max_token_ttl.filter(|d| !d.0.is_zero())
        && !(MIN_TTL..=MAX_TTL).contains(&ttl.0)
    {
        return Err(invalid("MaxTokenTTL", "must be between 1m0s and 24h0m0s"));
    }
    Ok(Plan::write(vec![Change::PutAclAuthMethod(method.clone())]))
}

/// The method, its binding rules and the tokens its logins created, in one write.
pub(crate) fn plan_method_delete(state: &State, name: &str) -> Plan {
    if state.acl_auth_method(name).is_none() {
        return Plan::write(Vec::new());
    }
    let mut changes: Vec<Change> = state
        .acl_binding_rules()
        .filter(|r| r.auth_method == name)
        .map(|r| Change::DeleteAclBindingRule(r.id.clone()))
        .collect();
    changes.extend(
        state
            .acl_tokens()
            .filter(|t| t.auth_method == name)
            .map(|t| Change::DeleteAclToken(t.accessor_id.clone())),
    );
    changes.push(Change::DeleteAclAuthMethod(name.to_owned()));
    Plan::write(changes)
}

pub(crate) fn plan_rule_set(state: &State, rule: &AclBindingRule, create: bool) -> Result<Plan, WriteError> {
    if rule.id.is_empty() {
        return Err(required("ID"));
    }
    let existing = state.acl_binding_rule(&rule.id);
    match (&existing, create) {
        (Some(_), true) => return Err(invalid("ID", "a binding rule with this ID already exists")),
        (None, false) => return Err(WriteError::NotFound(format!("no binding rule with ID {:?}", rule.id))),
        _ => {}
    }
    if rule.auth_method.is_empty() {
        return Err(required("AuthMethod"));
    }
    if state.acl_auth_method(&rule.auth_method).is_none() {
        return Err(invalid(
            "AuthMethod",
            format!("no auth method named {:?}", rule.auth_method),
        ));
    }
    if let Some(old) = &existing
        && old.auth_method != rule.auth_method
    {
        return Err(invalid("AuthMethod", "a binding rule's auth method cannot be changed"));
    }
    if rule.bind_type.is_empty() {
        return Err(required("BindType"));
    }
    if !BIND_TYPES.contains(&rule.bind_type.as_str()) {
        return Err(invalid(
            "BindType",
            format!(
                "{:?} is not supported (one of: {})",
                rule.bind_type,
                BIND_TYPES.join(", ")
            ),
        ));
    }
    if rule.bind_name.is_empty() {
        return Err(required("BindName"));
    }
    Ok(Plan::write(vec![Change::PutAclBindingRule(rule.clone())]))
}

pub(crate) fn plan_rule_delete(state: &State, id: &str) -> Plan {
    Plan::write(if state.acl_binding_rule(id).is_some() {
        vec![Change::DeleteAclBindingRule(id.to_owned())]
    } else {
        Vec::new()
    })
}
