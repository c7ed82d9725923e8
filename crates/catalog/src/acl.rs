//! Resolving a token's secret to what it may do.
//!
//! [`Resolver::resolve`] looks the secret up in the state, gathers the rules of its
//! policies, roles and identities that apply in this datacenter, and compiles them over the
//! default policy. Results are cached per secret until anything of the ACL system changes
//! (the [`IndexKey::Acl`] index moves), so a token's update or deletion takes effect on the
//! next request. Unknown secrets are never cached (they cannot grow the cache), and an
//! expired token resolves as unknown.

use crate::keys::IndexKey;
use crate::state::State;
use acl::{Authorizer, Rules, Token};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;
use structs::Index;
use structs::acl::{ANONYMOUS_ACCESSOR, AclToken};

/// How the server enforces ACLs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclSettings {
    /// ACLs are enforced (`-acl-enabled`). Off: every request may do everything.
    pub enabled: bool,
    /// What rules do not decide: allow (`true`) or deny. Deny is the production setting.
    pub default_allow: bool,
    /// This datacenter (policies and identities may be limited to some).
    pub datacenter: String,
}

impl AclSettings {
    /// ACLs off.
    pub fn disabled() -> Self {
        Self {
            enabled: false,
            default_allow: true,
            datacenter: String::new(),
        }
    }
}

pub use acl::{ResolveError, Resolved};

/// Resolves secrets against the state, with a cache (see the module docs).
#[derive(Debug)]
pub struct Resolver {
    settings: AclSettings,
    all: Resolved,
    cache: Mutex<Cache>,
    /// Parsed policy rules by policy id, with the modify index they were parsed at: a token
    /// resolved again after an ACL change does not parse its policies again.
    parsed: Mutex<HashMap<String, (Index, Arc<Rules>)>>,
    /// Tokens of the server process itself, known to it alone (never in the state, never
    /// persisted): its agent's (see [`Resolver::add_internal`]).
    internal: Mutex<HashMap<Token, Resolved>>,
    /// The token requests naming none run with (`PUT /v1/agent/token/default`; none: the
    /// anonymous token). Kept in memory: it lasts until the server stops.
    default_token: Mutex<Option<Token>>,
}

#[derive(Debug, Default)]
struct Cache {
    /// The ACL index the entries were computed at.
    at: Index,
    /// Answers by token (none: the anonymous token).
    entries: HashMap<Option<Token>, Resolved>,
}

impl Resolver {
    /// A resolver with these settings.
    pub fn new(settings: AclSettings) -> Self {
        let management = Rules::parse(acl::GLOBAL_MANAGEMENT_RULES).unwrap_or_default();
        Self {
            settings,
            all: Resolved {
                accessor: Arc::from(""),
                authz: Arc::new(Authorizer::new([&management], true)),
                expires: None,
            },
            cache: Mutex::new(Cache::default()),
            parsed: Mutex::new(HashMap::new()),
            internal: Mutex::new(HashMap::new()),
            default_token: Mutex::new(None),
        }
    }

    /// Whether `token` is one of this process's own ([`Resolver::add_internal`]).
    pub fn is_internal(&self, token: &Token) -> bool {
        self.internal.lock().contains_key(token)
    }

    /// Sets (or, with `None`, clears) the token of requests that name none.
    pub fn set_default_token(&self, token: Option<Token>) {
        *self.default_token.lock() = token;
    }

    /// Accepts `token`, known to this process alone, as `accessor` holding `rules` (HCL or
    /// JSON ACL rules). A server gives one to its own agent, which reaches it over HTTP like
    /// any agent but needs no token made for it: it may write its own node and read the
    /// catalog, nothing more. It lasts while the process runs.
    pub fn add_internal(&self, token: Token, accessor: &str, rules: &str) -> Result<(), acl::RuleError> {
        let rules = Rules::parse(rules)?;
        let resolved = Resolved {
            accessor: Arc::from(accessor),
            authz: Arc::new(Authorizer::new([&rules], false)),
            expires: None,
        };
        self.internal.lock().insert(token, resolved);
        Ok(())
    }

    /// The settings.
    pub fn settings(&self) -> &AclSettings {
        &self.settings
    }

    /// Whether ACLs are enforced.
    pub fn enabled(&self) -> bool {
        self.settings.enabled
    }

    /// What `token` (none: the default token, else the anonymous token) may do now.
    pub fn resolve(&self, state: &State, token: Option<&Token>) -> Result<Resolved, ResolveError> {
        if !self.settings.enabled {
            return Ok(self.all.clone());
        }
        let default = self.default_token.lock().clone();
        let token = token.or(default.as_ref());
        if let Some(hit) = token.and_then(|t| self.internal.lock().get(t).cloned()) {
            return Ok(hit);
        }
        let at = state.index_of(&IndexKey::Acl);
        let key = token.cloned();
        {
            let mut cache = self.cache.lock();
            if cache.at != at {
                cache.at = at;
                cache.entries.clear();
            } else if let Some(hit) = cache.entries.get(&key) {
                if hit.expires.is_some_and(|e| e <= SystemTime::now()) {
                    return Err(ResolveError::NotFound);
                }
                return Ok(hit.clone());
            }
        }
        let token = match token {
            Some(t) => state.acl_token_by_secret(t.secret()).ok_or(ResolveError::NotFound)?,
            None => match state.acl_token(ANONYMOUS_ACCESSOR) {
                Some(t) => t,
                None => {
                    return Ok(Resolved {
                        accessor: Arc::from(ANONYMOUS_ACCESSOR),
                        authz: Arc::new(Authorizer::default_policy(self.settings.default_allow)),
                        expires: None,
                    });
                }
            },
        };
        if token.expired(SystemTime::now()) {
            return Err(ResolveError::NotFound);
        }
        let rules = self.token_rules(state, &token);
        let resolved = Resolved {
            accessor: Arc::from(token.accessor_id.as_str()),
            authz: Arc::new(Authorizer::new(rules.iter().map(|r| &**r), self.settings.default_allow)),
            expires: token.expiration_time.map(|t| t.0),
        };
        let mut cache = self.cache.lock();
        if cache.at == at {
            cache.entries.insert(key, resolved.clone());
        }
        Ok(resolved)
    }
}

impl Resolver {
    /// [`token_rules`], with each policy parsed once per version of it.
    fn token_rules(&self, state: &State, token: &AclToken) -> Vec<Arc<Rules>> {
        let mut parsed = self.parsed.lock();
        if parsed.len() > 4 * state.acl_policies().count() + 64 {
            parsed.clear();
        }
        let mut parse = |policy: &structs::acl::AclPolicy| -> Option<Arc<Rules>> {
            if let Some((at, rules)) = parsed.get(&policy.id)
                && *at == policy.modify_index
            {
                return Some(Arc::clone(rules));
            }
            let rules = Arc::new(Rules::parse(&policy.rules).ok()?);
            parsed.insert(policy.id.clone(), (policy.modify_index, Arc::clone(&rules)));
            Some(rules)
        };
        collect_rules(state, token, &self.settings.datacenter, &mut parse)
    }
}

/// The rules that apply to `token` in `datacenter`: its policies', its roles' (and their
/// policies'), and its identities', in that order. Links to deleted policies or roles, and
/// rules that fail to parse (refused at write time, so never in practice), count for
/// nothing.
pub fn token_rules(state: &State, token: &AclToken, datacenter: &str) -> Vec<Rules> {
    collect_rules(state, token, datacenter, &mut |p| {
        Rules::parse(&p.rules).ok().map(Arc::new)
    })
    .into_iter()
    .map(|r| (*r).clone())
    .collect()
}

fn collect_rules(
    state: &State,
    token: &AclToken,
    datacenter: &str,
    parse: &mut dyn FnMut(&structs::acl::AclPolicy) -> Option<Arc<Rules>>,
) -> Vec<Arc<Rules>> {
    let applies = |dcs: &[String]| dcs.is_empty() || dcs.iter().any(|d| d == datacenter);
    let mut out = Vec::new();
    let mut policy_ids: Vec<&str> = token.policies.iter().map(|l| l.id.as_str()).collect();
    let mut services: Vec<&structs::acl::ServiceIdentity> = token.service_identities.iter().collect();
    let mut nodes: Vec<&structs::acl::NodeIdentity> = token.node_identities.iter().collect();
    let roles: Vec<_> = token.roles.iter().filter_map(|l| state.acl_role(&l.id)).collect();
    for role in &roles {
        policy_ids.extend(role.policies.iter().map(|l| l.id.as_str()));
        services.extend(role.service_identities.iter());
        nodes.extend(role.node_identities.iter());
    }
    policy_ids.sort_unstable();
    policy_ids.dedup();
    for id in policy_ids {
        if let Some(policy) = state.acl_policy(id)
            && applies(&policy.datacenters)
            && let Some(rules) = parse(&policy)
        {
            out.push(rules);
        }
    }
    for s in services {
        if applies(&s.datacenters) {
            out.push(Arc::new(Rules::service_identity(&s.service_name)));
        }
    }
    for n in nodes {
        if n.datacenter == datacenter {
            out.push(Arc::new(Rules::node_identity(&n.node_name)));
        }
    }
    out
}

impl Resolver {
    /// The intentions' default: allow without ACLs, else the ACL default policy (Consul's
    /// rule).
    pub fn intention_default_allow(&self) -> bool {
        !self.settings.enabled || self.settings.default_allow
    }
}
