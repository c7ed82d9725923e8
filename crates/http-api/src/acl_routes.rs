//! `/v1/acl/*`: bootstrap, tokens, policies and roles, in Consul's shapes; and
//! `/v1/internal/acl/authorizer`, the rules of the caller's own token (agents enforce ACLs
//! with it).
//!
//! Reading needs `acl:read`, writing `acl:write`. A token's secret is shown only to callers
//! with `acl:write` (and to the token itself on `token/self`); everyone else sees `<hidden>`.

use crate::authz::Authz;
use crate::query::{self, Params};
use crate::{Api, ApiError, Routes};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use axum::routing::{get, put};
use catalog::{IndexKey, Op};
use serde::Deserialize;
use std::sync::Arc;
use structs::Index;
use structs::acl::{AclPolicy, AclRole, AclToken, Link, NodeIdentity, ServiceIdentity, TokenWrite};

pub(crate) fn add(r: &mut Routes) {
    r.add("/v1/acl/bootstrap", put(bootstrap));
    r.add("/v1/acl/token", put(token_create));
    r.add("/v1/acl/token/self", get(token_self));
    r.add(
        "/v1/acl/token/{id}",
        get(token_read).put(token_update).delete(token_delete),
    );
    r.add("/v1/acl/token/{id}/clone", put(token_clone));
    r.add("/v1/acl/tokens", get(token_list));
    r.add("/v1/acl/policy", put(policy_create));
    r.add(
        "/v1/acl/policy/{id}",
        get(policy_read).put(policy_update).delete(policy_delete),
    );
    r.add("/v1/acl/policy/name/{name}", get(policy_read_by_name));
    r.add("/v1/acl/policies", get(policy_list));
    r.add("/v1/acl/role", put(role_create));
    r.add("/v1/acl/role/{id}", get(role_read).put(role_update).delete(role_delete));
    r.add("/v1/acl/role/name/{name}", get(role_read_by_name));
    r.add("/v1/acl/roles", get(role_list));
    r.add("/v1/internal/acl/authorizer", get(authorizer));
    r.add("/v1/acl/replication", get(replication));
}

/// `GET /v1/acl/replication` (no permission needed, as Consul): a secondary datacenter's
/// copy of the primary's ACL system; with ACLs off, Consul's "ACL support disabled".
async fn replication(State(api): State<Api>) -> Result<Response, ApiError> {
    enabled(&api)?;
    Ok(query::json(&crate::replication::acl_status(&api), None, false))
}

pub(crate) fn enabled(api: &Api) -> Result<(), ApiError> {
    if api.config.acl.enabled() {
        Ok(())
    } else {
        Err(ApiError::AclDisabled)
    }
}

pub(crate) fn new_id() -> Result<String, ApiError> {
    catalog::ca::new_uuid().map_err(|e| ApiError::Internal(format!("generating an id: {e}")))
}

fn need_read(authz: &Authz) -> Result<(), ApiError> {
    authz.need(|a| a.acl_read(), "acl:read", "")
}

fn need_write(authz: &Authz) -> Result<(), ApiError> {
    authz.need(|a| a.acl_write(), "acl:write", "")
}

/// What every ACL write does first: ACLs on, the query checked, `acl:write` held. Returns
/// the query.
pub(crate) fn write_prelude(api: &Api, authz: &Authz, q: Option<&str>) -> Result<Params, ApiError> {
    enabled(api)?;
    let params = api.write_params(q)?;
    need_write(authz)?;
    Ok(params)
}

/// The id of a created (`path` none: generated, and the body may not set one) or updated
/// (the body's, if any, must be the path's) policy or role.
pub(crate) fn object_id(given: &str, path: Option<String>) -> Result<String, ApiError> {
    match path {
        None if given.is_empty() => new_id(),
        None => Err(ApiError::BadRequest(
            "ID: cannot be set on create (it is generated)".into(),
        )),
        Some(id) if given.is_empty() || given == id => Ok(id),
        Some(id) => Err(ApiError::BadRequest(format!(
            "ID: {given:?} does not match the path's {id:?}"
        ))),
    }
}

/// Links as they are now: named by the current object, deleted ones left out.
fn current_links<T>(links: &[Link], find: impl Fn(&str) -> Option<T>, link: impl Fn(&T) -> Link) -> Vec<Link> {
    links.iter().filter_map(|l| find(&l.id).map(|o| link(&o))).collect()
}

fn policy_links(state: &catalog::State, links: &[Link]) -> Vec<Link> {
    current_links(
        links,
        |id| state.acl_policy(id),
        |p| Link {
            id: p.id.clone(),
            name: p.name.clone(),
        },
    )
}

/// A token as answered: links named as they are now (deleted ones left out), the secret
/// hidden unless `show_secret`.
fn token_out(state: &catalog::State, token: &AclToken, show_secret: bool) -> AclToken {
    let mut t = token.clone();
    t.policies = policy_links(state, &t.policies);
    t.roles = current_links(
        &t.roles,
        |id| state.acl_role(id),
        |r| Link {
            id: r.id.clone(),
            name: r.name.clone(),
        },
    );
    if show_secret { t } else { t.redacted() }
}

fn role_out(state: &catalog::State, role: &AclRole) -> AclRole {
    let mut r = role.clone();
    r.policies = policy_links(state, &r.policies);
    r
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct BootstrapIn {
    #[serde(rename = "BootstrapSecret")]
    bootstrap_secret: String,
}

async fn bootstrap(State(api): State<Api>, RawQuery(q): RawQuery, body: Bytes) -> Result<Response, ApiError> {
    enabled(&api)?;
    let params = api.write_params(q.as_deref())?;
    let req: BootstrapIn = if body.iter().all(u8::is_ascii_whitespace) {
        BootstrapIn::default()
    } else {
        query::decode(&body, "a bootstrap request")?
    };
    let accessor = new_id()?;
    let secret = if req.bootstrap_secret.is_empty() {
        new_id()?
    } else {
        req.bootstrap_secret
    };
    api.store
        .write(Op::AclBootstrap {
            accessor: accessor.clone(),
            secret,
        })
        .await?;
    let state = api.store.read();
    let token = state
        .acl_token(&accessor)
        .ok_or_else(|| ApiError::Internal("the bootstrap token was not stored".into()))?;
    tracing::info!(accessor = %accessor, "ACLs bootstrapped");
    Ok(query::json(&token_out(&state, &token, true), None, params.pretty()))
}

/// The token a create or update body describes, and its TTL.
fn token_from(req: TokenWrite) -> Result<(AclToken, Option<std::time::Duration>), ApiError> {
    if !req.templated_policies.is_empty() {
        return Err(ApiError::BadRequest(
            "TemplatedPolicies: not supported: use ServiceIdentities and NodeIdentities".into(),
        ));
    }
    let ttl = req.expiration_ttl.filter(|d| !d.is_zero()).map(|d| d.0);
    Ok((
        AclToken {
            accessor_id: req.accessor_id,
            secret_id: req.secret_id,
            description: req.description,
            policies: req.policies,
            roles: req.roles,
            service_identities: req.service_identities,
            node_identities: req.node_identities,
            local: req.local,
            expiration_time: req.expiration_time,
            ..AclToken::default()
        },
        ttl,
    ))
}

pub(crate) async fn write_token(
    api: &Api,
    token: AclToken,
    create: bool,
    ttl: Option<std::time::Duration>,
) -> Result<AclToken, ApiError> {
    let accessor = token.accessor_id.clone();
    api.store
        .write(Op::AclTokenSet {
            token: Box::new(token),
            create,
            ttl,
        })
        .await?;
    let state = api.store.read();
    let stored = state
        .acl_token(&accessor)
        .ok_or_else(|| ApiError::Internal("the token was not stored".into()))?;
    Ok(token_out(&state, &stored, true))
}

async fn token_create(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = write_prelude(&api, &authz, q.as_deref())?;
    let req: TokenWrite = query::decode(&body, "a token")?;
    let (mut token, ttl) = token_from(req)?;
    if token.accessor_id.is_empty() {
        token.accessor_id = new_id()?;
    }
    if token.secret_id.is_empty() {
        token.secret_id = new_id()?;
    }
    let out = write_token(&api, token, true, ttl).await?;
    tracing::info!(accessor = %out.accessor_id, "ACL token created");
    Ok(query::json(&out, None, params.pretty()))
}

async fn token_update(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = write_prelude(&api, &authz, q.as_deref())?;
    let req: TokenWrite = query::decode(&body, "a token")?;
    let (mut token, ttl) = token_from(req)?;
    if !token.accessor_id.is_empty() && token.accessor_id != id {
        return Err(ApiError::BadRequest(format!(
            "AccessorID: {:?} does not match the path's {id:?}",
            token.accessor_id
        )));
    }
    token.accessor_id = id;
    let out = write_token(&api, token, false, ttl).await?;
    Ok(query::json(&out, None, params.pretty()))
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CloneIn {
    #[serde(rename = "Description")]
    description: Option<String>,
}

async fn token_clone(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = write_prelude(&api, &authz, q.as_deref())?;
    let req: CloneIn = if body.iter().all(u8::is_ascii_whitespace) {
        CloneIn::default()
    } else {
        query::decode(&body, "a clone request")?
    };
    let original = api
        .store
        .read()
        .acl_token(&id)
        .ok_or_else(|| ApiError::NotFound(format!("no token with AccessorID {id:?}")))?;
    if original.accessor_id == structs::acl::ANONYMOUS_ACCESSOR {
        return Err(ApiError::BadRequest(
            "AccessorID: the anonymous token cannot be cloned".into(),
        ));
    }
    let token = AclToken {
        accessor_id: new_id()?,
        secret_id: new_id()?,
        description: req.description.unwrap_or_else(|| original.description.clone()),
        policies: original.policies.clone(),
        roles: original.roles.clone(),
        service_identities: original.service_identities.clone(),
        node_identities: original.node_identities.clone(),
        local: original.local,
        expiration_time: original.expiration_time,
        ..AclToken::default()
    };
    let out = write_token(&api, token, true, None).await?;
    Ok(query::json(&out, None, params.pretty()))
}

async fn token_read(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let show = authz.get()?.acl_write();
    read_one(&api, &authz, q.as_deref(), IndexKey::AclTokens, |s| {
        s.acl_token(&id).map(|t| token_out(s, &t, show))
    })
    .await
}

async fn token_self(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    enabled(&api)?;
    let accessor = authz.accessor()?.to_owned();
    let params = Params::parse(q.as_deref());
    let state = api.store.read();
    let token = state
        .acl_token(&accessor)
        .ok_or_else(|| ApiError::Forbidden(acl::ACL_NOT_FOUND.into()))?;
    Ok(query::json(&token_out(&state, &token, true), None, params.pretty()))
}

async fn token_delete(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = write_prelude(&api, &authz, q.as_deref())?;
    if authz.accessor()? == id {
        return Err(ApiError::BadRequest("AccessorID: a token cannot delete itself".into()));
    }
    api.store.write(Op::AclTokenDelete { accessor: id.clone() }).await?;
    tracing::info!(accessor = %id, "ACL token deleted");
    Ok(query::json(&true, None, params.pretty()))
}

async fn token_list(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let show = authz.get()?.acl_write();
    let params = Params::parse(q.as_deref());
    let policy = params.get("policy").filter(|p| !p.is_empty()).map(str::to_owned);
    let role = params.get("role").filter(|r| !r.is_empty()).map(str::to_owned);
    let service = params.get("servicename").filter(|s| !s.is_empty()).map(str::to_owned);
    let method = params.get("authmethod").filter(|m| !m.is_empty()).map(str::to_owned);
    read_one(&api, &authz, q.as_deref(), IndexKey::AclTokens, |s| {
        let tokens: Vec<AclToken> = s
            .acl_tokens()
            .filter(|t| policy.as_ref().is_none_or(|p| t.policies.iter().any(|l| l.id == *p)))
            .filter(|t| role.as_ref().is_none_or(|r| t.roles.iter().any(|l| l.id == *r)))
            .filter(|t| method.as_ref().is_none_or(|m| t.auth_method == *m))
            .filter(|t| {
                service
                    .as_ref()
                    .is_none_or(|n| t.service_identities.iter().any(|i| i.service_name == *n))
            })
            .map(|t| token_out(s, t, show))
            .collect();
        Some(tokens)
    })
    .await
}

/// A blocking-capable read of ACL objects (what `find` picks in the state waited for on
/// `key`); `403 ACL not found` when there is none, as Consul answers.
pub(crate) async fn read_one<T: serde::Serialize>(
    api: &Api,
    authz: &Authz,
    q: Option<&str>,
    key: IndexKey,
    find: impl FnOnce(&catalog::State) -> Option<T>,
) -> Result<Response, ApiError> {
    enabled(api)?;
    need_read(authz)?;
    let params = Params::parse(q);
    let state = api.read(&params, &key).await?;
    let found = find(&state).ok_or_else(|| ApiError::Forbidden(acl::ACL_NOT_FOUND.into()))?;
    Ok(query::json(&found, Some(state.index_of(&key)), params.pretty()))
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PolicyIn {
    #[serde(rename = "ID")]
    id: String,
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "Description")]
    description: String,
    #[serde(rename = "Rules")]
    rules: String,
    #[serde(rename = "Datacenters")]
    datacenters: Vec<String>,
}

/// Rules sent as a JSON string holding the rules (py-consul encodes its `rules` argument
/// with `json.dumps`, so HCL given to it arrives quoted): the text inside is the rules.
fn unquote_rules(rules: String) -> String {
    if rules.trim_start().starts_with('"')
        && let Ok(inner) = serde_json::from_str::<String>(&rules)
    {
        return inner;
    }
    rules
}

async fn write_policy(api: &Api, req: PolicyIn, id: String, create: bool) -> Result<Arc<AclPolicy>, ApiError> {
    let policy = AclPolicy {
        id: id.clone(),
        name: req.name,
        description: req.description,
        rules: unquote_rules(req.rules),
        datacenters: req.datacenters,
        ..AclPolicy::default()
    };
    api.store
        .write(Op::AclPolicySet {
            policy: Box::new(policy),
            create,
        })
        .await?;
    api.store
        .read()
        .acl_policy(&id)
        .ok_or_else(|| ApiError::Internal("the policy was not stored".into()))
}

async fn policy_create(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = write_prelude(&api, &authz, q.as_deref())?;
    let req: PolicyIn = query::decode(&body, "a policy")?;
    let id = object_id(&req.id, None)?;
    let policy = write_policy(&api, req, id, true).await?;
    Ok(query::json(&*policy, None, params.pretty()))
}

async fn policy_update(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = write_prelude(&api, &authz, q.as_deref())?;
    let req: PolicyIn = query::decode(&body, "a policy")?;
    let id = object_id(&req.id, Some(id))?;
    let policy = write_policy(&api, req, id, false).await?;
    Ok(query::json(&*policy, None, params.pretty()))
}

async fn policy_read(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    read_one(&api, &authz, q.as_deref(), IndexKey::AclPolicies, |s| s.acl_policy(&id)).await
}

/// A name from a path, percent-decoded once more when it still holds escapes: Consul's Go
/// client escapes a name (`builtin/global-read-only` -> `builtin%2Fglobal-read-only`) and
/// its URL encoding escapes it again, and Consul's servers decode twice. No policy or role
/// name holds a `%` of its own (they are letters, digits, `-`, `_`, and the built-ins' `/`).
fn unescape_again(name: String) -> String {
    if !name.contains('%') {
        return name;
    }
    let decoded = percent_encoding::percent_decode_str(&name)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .ok();
    decoded.unwrap_or(name)
}

async fn policy_read_by_name(
    State(api): State<Api>,
    authz: Authz,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let name = unescape_again(name);
    read_one(&api, &authz, q.as_deref(), IndexKey::AclPolicies, |s| {
        s.acl_policy_by_name(&name)
    })
    .await
}

async fn policy_delete(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = write_prelude(&api, &authz, q.as_deref())?;
    api.store.write(Op::AclPolicyDelete { id }).await?;
    Ok(query::json(&true, None, params.pretty()))
}

async fn policy_list(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    read_one(&api, &authz, q.as_deref(), IndexKey::AclPolicies, |s| {
        Some(s.acl_policies().cloned().collect::<Vec<Arc<AclPolicy>>>())
    })
    .await
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RoleIn {
    #[serde(rename = "ID")]
    id: String,
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "Description")]
    description: String,
    #[serde(rename = "Policies")]
    policies: Vec<Link>,
    #[serde(rename = "ServiceIdentities")]
    service_identities: Vec<ServiceIdentity>,
    #[serde(rename = "NodeIdentities")]
    node_identities: Vec<NodeIdentity>,
}

async fn write_role(api: &Api, req: RoleIn, id: String, create: bool) -> Result<AclRole, ApiError> {
    let role = AclRole {
        id: id.clone(),
        name: req.name,
        description: req.description,
        policies: req.policies,
        service_identities: req.service_identities,
        node_identities: req.node_identities,
        ..AclRole::default()
    };
    api.store
        .write(Op::AclRoleSet {
            role: Box::new(role),
            create,
        })
        .await?;
    let state = api.store.read();
    let role = state
        .acl_role(&id)
        .ok_or_else(|| ApiError::Internal("the role was not stored".into()))?;
    Ok(role_out(&state, &role))
}

async fn role_create(
    State(api): State<Api>,
    authz: Authz,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = write_prelude(&api, &authz, q.as_deref())?;
    let req: RoleIn = query::decode(&body, "a role")?;
    let id = object_id(&req.id, None)?;
    let role = write_role(&api, req, id, true).await?;
    Ok(query::json(&role, None, params.pretty()))
}

async fn role_update(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    let params = write_prelude(&api, &authz, q.as_deref())?;
    let req: RoleIn = query::decode(&body, "a role")?;
    let id = object_id(&req.id, Some(id))?;
    let role = write_role(&api, req, id, false).await?;
    Ok(query::json(&role, None, params.pretty()))
}

async fn role_read(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    read_one(&api, &authz, q.as_deref(), IndexKey::AclRoles, |s| {
        s.acl_role(&id).map(|r| role_out(s, &r))
    })
    .await
}

async fn role_read_by_name(
    State(api): State<Api>,
    authz: Authz,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let name = unescape_again(name);
    read_one(&api, &authz, q.as_deref(), IndexKey::AclRoles, |s| {
        s.acl_role_by_name(&name).map(|r| role_out(s, &r))
    })
    .await
}

async fn role_delete(
    State(api): State<Api>,
    authz: Authz,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let params = write_prelude(&api, &authz, q.as_deref())?;
    api.store.write(Op::AclRoleDelete { id }).await?;
    Ok(query::json(&true, None, params.pretty()))
}

async fn role_list(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    read_one(&api, &authz, q.as_deref(), IndexKey::AclRoles, |s| {
        Some(s.acl_roles().map(|r| role_out(s, r)).collect::<Vec<AclRole>>())
    })
    .await
}

/// `GET /v1/internal/acl/authorizer`: the caller's own token's rules (any valid token may
/// read its own). Blocking on `?index=` waits for any ACL change.
async fn authorizer(State(api): State<Api>, authz: Authz, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    enabled(&api)?;
    let params = Params::parse(q.as_deref());
    let key = IndexKey::Acl;
    let state = api.read(&params, &key).await?;
    // Looked up again in the state waited for: the answer describes the token at that index
    // (a token deleted while the request blocked answers `ACL not found`).
    let accessor = authz.accessor()?.to_owned();
    let index: Index = state.index_of(&key);
    let Some(token) = state.acl_token(&accessor) else {
        return Err(ApiError::Forbidden(acl::ACL_NOT_FOUND.into()));
    };
    if token.expired(std::time::SystemTime::now()) {
        return Err(ApiError::Forbidden(acl::ACL_NOT_FOUND.into()));
    }
    let settings = api.config.acl.settings();
    let out = acl::TokenRules {
        accessor_id: token.accessor_id.clone(),
        default_policy: if settings.default_allow { "allow" } else { "deny" }.into(),
        rules: catalog::acl::token_rules(&state, &token, &settings.datacenter),
        expiration_time: token.expiration_time,
    };
    Ok(query::json(&out, Some(index), params.pretty()))
}
