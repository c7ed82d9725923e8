//! `/v1/acl/auth-method*`, `/v1/acl/binding-rule*`, `/v1/acl/login` and `/v1/acl/logout`,
//! in Consul's shapes.
//!
//! Managing methods and rules needs `acl:read`/`acl:write`. A login needs no token: it
//! presents a bearer token to a method, which verifies it (`auth-method` crate); the
//! method's binding rules decide what the new token grants, and a login that no rule binds
//! is refused. A logout deletes the caller's own token, and only one a login created.

use crate::acl_routes::{enabled, new_id, object_id, read_one, write_prelude, write_token};
use crate::authz::Authz;
use crate::query::{self};
use crate::{Api, ApiError, Routes};
use auth_method::LoginError;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use axum::routing::{post, put};
use catalog::{IndexKey, Op};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use structs::acl::{AclAuthMethod, AclBindingRule, AclToken, Link, NodeIdentity, ServiceIdentity};

pub(crate) fn add(r: &mut Routes) {
    use axum::routing::get;
    r.add("/v1/acl/auth-method", put(method_create));
    r.add(
        "/v1/acl/auth-method/{name}",
        get(method_read).put(method_update).delete(method_delete),
    );
    r.add("/v1/acl/auth-methods", get(method_list));
    r.add("/v1/acl/binding-rule", put(rule_create));
    r.add(
        "/v1/acl/binding-rule/{id}",
        get(rule_read).put(rule_update).delete(rule_delete),
    );
    r.add("/v1/acl/binding-rules", get(rule_list));
    r.add("/v1/acl/login", post(login).put(login));
    r.add("/v1/acl/logout", post(logout).put(logout));
}

const METHOD_FIELDS: &[&str] = &[
    "Name",
    "Type",
    "DisplayName",
    "Description",
    "MaxTokenTTL",
    "TokenLocality",
    "Config",
    "CreateIndex",
    "ModifyIndex",
    "Hash",
];
const RULE_FIELDS: &[&str] = &[
    "ID",
    "Description",
    "AuthMethod",
    "Selector",
    "BindType",
    "BindName",
    "CreateIndex",
    "ModifyIndex",
    "Hash",
];

/// Every top-level field of `body` is one of `known` (any casing), or one of Consul's that
/// meshd cannot honour left at its empty value: never quietly ignored.
fn check_fields(body: &[u8], what: &str, known: &[&str]) -> Result<(), ApiError> {
    let Ok(serde_json::Value::Object(fields)) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Ok(());
    };
    for (key, value) in &fields {
        if known.iter().any(|k| k.eq_ignore_ascii_case(key)) {
            continue;
        }
        let empty = match value {
            serde_json::Value::Null => true,
            serde_json::Value::String(s) => s.is_empty(),
            serde_json::Value::Object(m) => m.is_empty(),
            serde_json::Value::Array(a) => a.is_empty(),
            _ => false,
        };
        let lower = key.to_ascii_lowercase();
        let refusal = match lower.as_str() {
            "namespace" | "partition" if empty || value.as_str() == Some("default") => continue,
            "namespace" | "partition" => "namespaces and admin partitions are Consul Enterprise's: only \"default\"",
            "tokennameformat" | "namespacerules" | "bindvars" if empty => continue,
            "tokennameformat" | "namespacerules" | "bindvars" => "not supported by meshd",
            _ => "unknown field",
        };
        return Err(ApiError::BadRequest(format!("{key}: {refusal} (in {what})")));
    }
    Ok(())
}

/// Settings that are credentials, shown only to callers with `acl:write`.
const SECRET_SETTINGS: &[&str] = &["ServiceAccountJWT"];

/// A method as answered: its credentials hidden unless `show_secrets`.
fn method_out(method: &AclAuthMethod, show_secrets: bool) -> AclAuthMethod {
    let mut m = method.clone();
    if !show_secrets {
        for key in SECRET_SETTINGS {
            if let Some(v) = m.config.get_mut(*key) {
                *v = serde_json::Value::String(structs::acl::HIDDEN_SECRET.into());
            }
        }
    }
    m
}

/// A method as the list answers it: without its settings (Consul's stub).
#[derive(Serialize)]
struct MethodStub<'a> {
    #[serde(rename = "Name")]
    name: &'a str,
    #[serde(rename = "Type")]
    kind: &'a str,
    #[serde(rename = "DisplayName", skip_serializing_if = "str::is_empty")]
    display_name: &'a str,
    #[serde(rename = "Description")]
    description: &'a str,
    #[serde(rename = "MaxTokenTTL", skip_serializing_if = "Option::is_none")]
    max_token_ttl: Option<structs::GoDuration>,
    #[serde(rename = "TokenLocality", skip_serializing_if = "str::is_empty")]
    token_locality: &'a str,
    #[serde(rename = "CreateIndex")]
    create_index: structs::Index,
    #[serde(rename = "ModifyIndex")]
    modify_index: structs::Index,
}

async fn write_method(api: &Api, method: AclAuthMethod, create: bool) -> Result<AclAuthMethod, ApiError> {
    auth_method::check_method(&method).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    // A secondary's global tokens are the primary's, copied here: one made here would be
    // deleted by the next copy.
    let fed = api.store.federation();
    if method.token_locality == "global" && !fed.is_primary() {
        return Err(ApiError::BadRequest(format!(
            "TokenLocality: \"global\": logins here make tokens of this datacenter only; make the method in the primary datacenter ({}) for global tokens",
            fed.primary()
        )));
    }
    let name = method.name.clone();
    api.store
        .write(Op::AclAuthMethodSet {
            method: Box::new(method),
            create,
        })
        .await?;
    let stored = api
        .store
        .read()
        .acl_auth_method(&name)
        .ok_or_else(|| ApiError::Internal("the auth method was not stored".into()))?;
    Ok(method_out(&stored, true))
}

async fn method_create(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = write_prelude(&api, &authz, q.as_deref())?;
    let method: AclAuthMethod = query::decode(&body, "an auth method")?;
    check_fields(&body, "an auth method", METHOD_FIELDS)?;
    let out = write_method(&api, method, true).await?;
    tracing::info!(method = %out.name, kind = %out.kind, "ACL auth method created");
    Ok(query::json(&out, None, params.pretty()))
}

async fn method_update(
    State(api): State<Api>,
    authz: Authz,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = write_prelude(&api, &authz, q.as_deref())?;
    let mut method: AclAuthMethod = query::decode(&body, "an auth method")?;
    check_fields(&body, "an auth method", METHOD_FIELDS)?;
    if !method.name.is_empty() && method.name != name {
        return Err(ApiError::BadRequest(format!(
            "Name: {:?} does not match the path's {name:?}",
            method.name
        )));
    }
    method.name = name;
    // A hidden credential sent back as read keeps the stored one.
    if let Some(old) = api.store.read().acl_auth_method(&method.name) {
        for key in SECRET_SETTINGS {
            if method.config.get(*key).and_then(|v| v.as_str()) == Some(structs::acl::HIDDEN_SECRET)
                && let Some(v) = old.config.get(*key)
            {
                method.config.insert((*key).to_owned(), v.clone());
            }
        }
    }
    let out = write_method(&api, method, false).await?;
    Ok(query::json(&out, None, params.pretty()))
}

async fn method_read(
    State(api): State<Api>,
    authz: Authz,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let show = authz.get()?.acl_write();
    read_one(&api, &authz, q.as_deref(), IndexKey::AclAuthMethods, |s| {
        s.acl_auth_method(&name).map(|m| method_out(&m, show))
    })
    .await
}

async fn method_delete(
    State(api): State<Api>,
    authz: Authz,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = write_prelude(&api, &authz, q.as_deref())?;
    api.store.write(Op::AclAuthMethodDelete { name: name.clone() }).await?;
    tracing::info!(method = %name, "ACL auth method deleted, with its binding rules and login tokens");
    Ok(query::json(&true, None, params.pretty()))
}

async fn method_list(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    read_one(&api, &authz, q.as_deref(), IndexKey::AclAuthMethods, |s| {
        let stubs: Vec<serde_json::Value> = s
            .acl_auth_methods()
            .map(|m| {
                serde_json::to_value(MethodStub {
                    name: &m.name,
                    kind: &m.kind,
                    display_name: &m.display_name,
                    description: &m.description,
                    max_token_ttl: m.max_token_ttl,
                    token_locality: &m.token_locality,
                    create_index: m.create_index,
                    modify_index: m.modify_index,
                })
                .unwrap_or_default()
            })
            .collect();
        Some(stubs)
    })
    .await
}

/// A rule written: checked against its method's type, then stored.
async fn write_rule(api: &Api, rule: AclBindingRule, create: bool) -> Result<AclBindingRule, ApiError> {
    let method = api.store.read().acl_auth_method(&rule.auth_method);
    if let Some(method) = &method {
        auth_method::check_rule(method, &rule).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    }
    let id = rule.id.clone();
    api.store
        .write(Op::AclBindingRuleSet {
            rule: Box::new(rule),
            create,
        })
        .await?;
    api.store
        .read()
        .acl_binding_rule(&id)
        .map(|r| (*r).clone())
        .ok_or_else(|| ApiError::Internal("the binding rule was not stored".into()))
}

async fn rule_create(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = write_prelude(&api, &authz, q.as_deref())?;
    let mut rule: AclBindingRule = query::decode(&body, "a binding rule")?;
    check_fields(&body, "a binding rule", RULE_FIELDS)?;
    rule.id = object_id(&rule.id, None)?;
    let out = write_rule(&api, rule, true).await?;
    Ok(query::json(&out, None, params.pretty()))
}

async fn rule_update(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = write_prelude(&api, &authz, q.as_deref())?;
    let mut rule: AclBindingRule = query::decode(&body, "a binding rule")?;
    check_fields(&body, "a binding rule", RULE_FIELDS)?;
    rule.id = object_id(&rule.id, Some(id))?;
    let out = write_rule(&api, rule, false).await?;
    Ok(query::json(&out, None, params.pretty()))
}

async fn rule_read(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    read_one(&api, &authz, q.as_deref(), IndexKey::AclBindingRules, |s| {
        s.acl_binding_rule(&id)
    })
    .await
}

async fn rule_delete(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = write_prelude(&api, &authz, q.as_deref())?;
    api.store.write(Op::AclBindingRuleDelete { id }).await?;
    Ok(query::json(&true, None, params.pretty()))
}

async fn rule_list(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let params = query::Params::parse(q.as_deref());
    let method = params.get("authmethod").filter(|m| !m.is_empty()).map(str::to_owned);
    read_one(&api, &authz, q.as_deref(), IndexKey::AclBindingRules, |s| {
        let rules: Vec<AclBindingRule> = s
            .acl_binding_rules()
            .filter(|r| method.as_ref().is_none_or(|m| r.auth_method == *m))
            .map(|r| (**r).clone())
            .collect();
        Some(rules)
    })
    .await
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct LoginIn {
    #[serde(rename = "AuthMethod")]
    auth_method: String,
    #[serde(rename = "BearerToken")]
    bearer_token: String,
    #[serde(rename = "Meta")]
    meta: BTreeMap<String, String>,
}

/// `POST /v1/acl/login`: a token for whoever the bearer token says, bound by the method's
/// rules. A refusal says why (the caller holds the bearer token, so the reason tells it
/// nothing it could not learn), and is logged once without the token.
async fn login(State(api): State<Api>, RawQuery(q): RawQuery, body: Bytes) -> Result<Response, ApiError> {
    enabled(&api)?;
    let params = api.write_params(q.as_deref())?;
    let req: LoginIn = query::decode(&body, "a login")?;
    if req.auth_method.is_empty() {
        return Err(ApiError::BadRequest("AuthMethod: required".into()));
    }
    let method = api
        .store
        .read()
        .acl_auth_method(&req.auth_method)
        .ok_or_else(|| ApiError::BadRequest(format!("AuthMethod: no auth method named {:?}", req.auth_method)))?;
    let denied = |why: String| {
        tracing::warn!(method = %method.name, reason = %why, "ACL login refused");
        ApiError::Forbidden(format!("Permission denied: {why}"))
    };
    let identity = match api.verifier.verify(&method, &req.bearer_token).await {
        Ok(identity) => identity,
        Err(LoginError::Denied(why)) => return Err(denied(why)),
        Err(LoginError::Unavailable(why)) => {
            tracing::warn!(method = %method.name, reason = %why, "ACL login could not verify the token");
            return Err(ApiError::Internal(format!("auth method {:?}: {why}", method.name)));
        }
    };
    let state = api.store.read();
    let bound = auth_method::bind(&method, state.acl_binding_rules().map(|r| &**r), &identity)
        .map_err(|e| denied(e.to_string()))?;
    let datacenter = api.store.datacenter().to_owned();
    let token = AclToken {
        accessor_id: new_id()?,
        secret_id: new_id()?,
        description: login_description(&req.meta)?,
        service_identities: bound
            .service_identities
            .iter()
            .map(|name| ServiceIdentity {
                service_name: name.clone(),
                datacenters: Vec::new(),
            })
            .collect(),
        node_identities: bound
            .node_identities
            .iter()
            .map(|name| NodeIdentity {
                node_name: name.clone(),
                datacenter: datacenter.clone(),
            })
            .collect(),
        // Roles and policies that do not exist (any more) are left out, as in Consul.
        roles: bound
            .roles
            .iter()
            .filter(|n| state.acl_role_by_name(n).is_some())
            .map(|n| Link {
                id: String::new(),
                name: n.clone(),
            })
            .collect(),
        policies: bound
            .policies
            .iter()
            .filter(|n| state.acl_policy_by_name(n).is_some())
            .map(|n| Link {
                id: String::new(),
                name: n.clone(),
            })
            .collect(),
        local: method.token_locality != "global",
        auth_method: method.name.clone(),
        ..AclToken::default()
    };
    drop(state);
    if token.service_identities.is_empty()
        && token.node_identities.is_empty()
        && token.roles.is_empty()
        && token.policies.is_empty()
    {
        return Err(denied(
            "no binding rule of the auth method applies to this identity".into(),
        ));
    }
    let ttl = method.max_token_ttl.filter(|d| !d.0.is_zero()).map(|d| d.0);
    let out = write_token(&api, token, true, ttl).await?;
    tracing::info!(method = %method.name, accessor = %out.accessor_id, "ACL login");
    Ok(query::json(&out, None, params.pretty()))
}

/// Consul's description of a login's token, with the login's `Meta`.
fn login_description(meta: &BTreeMap<String, String>) -> Result<String, ApiError> {
    if meta.is_empty() {
        return Ok("token created via login".into());
    }
    let json = serde_json::to_string(meta).map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(format!("token created via login: {json}"))
}

/// `POST /v1/acl/logout`: deletes the caller's own token, if a login made it.
async fn logout(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    enabled(&api)?;
    let params = api.write_params(q.as_deref())?;
    let accessor = authz.accessor()?.to_owned();
    let token = api
        .store
        .read()
        .acl_token(&accessor)
        .ok_or_else(|| ApiError::Forbidden(acl::ACL_NOT_FOUND.into()))?;
    if token.auth_method.is_empty() {
        return Err(ApiError::Forbidden(
            "Permission denied: only a token created by a login can log out".into(),
        ));
    }
    api.store
        .write(Op::AclTokenDelete {
            accessor: accessor.clone(),
        })
        .await?;
    tracing::info!(method = %token.auth_method, accessor = %accessor, "ACL logout");
    Ok(query::json(&true, None, params.pretty()))
}
