//! ACLs on the agent: its tokens, and what a request's token may do.
//!
//! The servers hold tokens and policies; the agent asks them for a token's rules
//! (`GET /v1/internal/acl/authorizer` with that token) and compiles them with the shared
//! [`acl::Authorizer`]. Answers are cached per token until any ACL changes: one blocking
//! query on the same endpoint follows the servers' ACL index and empties the cache when it
//! moves, so a token's update or deletion takes effect at once here too. While no server
//! answers, cached tokens keep working (Consul's `extend-cache`); unknown ones are refused.
//!
//! Tokens the agent uses itself:
//! - the agent token: anti-entropy of the node and its checks, and the agent's own reads;
//! - the default token: requests that name none (forwarded ones included);
//! - each service's registration token: that service's sync and its proxy;
//! - local proxy tokens: a random secret per managed proxy, kept with its registration,
//!   handed to it as `CONNECT_PROXY_TOKEN`, accepted by this agent's xDS only and only for
//!   that proxy's service (the proxy never holds the registration's token).

use crate::servers::{ApiError, Servers};
use ::acl::{Authorizer, Token};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The agent's ACL settings. Tokens print as `Token(<hidden>)`.
#[derive(Clone, Default, Debug)]
pub struct AclConfig {
    /// Enforce ACLs on the agent's own endpoints and its xDS streams.
    pub enabled: bool,
    /// What no rule decides (must match the servers').
    pub default_allow: bool,
    /// The agent's own token.
    pub agent_token: Option<Token>,
    /// The token of requests that name none.
    pub default_token: Option<Token>,
}

pub use ::acl::{ResolveError as AclError, Resolved};

/// Resolves tokens for the agent (see the module docs).
pub struct AgentAcl {
    config: AclConfig,
    /// The agent and default tokens now: the configured ones until `/v1/agent/token/:type`
    /// changes them.
    tokens: parking_lot::RwLock<(Option<Token>, Option<Token>)>,
    servers: Arc<Servers>,
    /// Answers by token (none: the anonymous token).
    cache: Mutex<HashMap<Option<Token>, Resolved>>,
    /// Bumped whenever cached answers were dropped (an ACL change at the servers).
    generation: watch::Sender<u64>,
    all: Resolved,
}

impl std::fmt::Debug for AgentAcl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentAcl")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Cached tokens at most; past it the cache starts over (answers are re-fetched).
const CACHE_CAPACITY: usize = 10_000;

impl AgentAcl {
    /// ACLs for an agent talking to `servers`.
    pub fn new(config: AclConfig, servers: Arc<Servers>) -> Self {
        let management = ::acl::Rules::parse(::acl::GLOBAL_MANAGEMENT_RULES).unwrap_or_default();
        let token = config.agent_token.as_ref().or(config.default_token.as_ref());
        servers.set_token(token.cloned());
        Self {
            servers,
            tokens: parking_lot::RwLock::new((config.agent_token.clone(), config.default_token.clone())),
            cache: Mutex::new(HashMap::new()),
            generation: watch::channel(0).0,
            all: Resolved {
                accessor: std::sync::Arc::from(""),
                authz: Arc::new(Authorizer::new([&management], true)),
                expires: None,
            },
            config,
        }
    }

    /// Whether ACLs are enforced.
    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    /// The settings the agent started with (its tokens may have changed since: see
    /// [`AgentAcl::default_token`], [`AgentAcl::agent_token`]).
    pub fn config(&self) -> &AclConfig {
        &self.config
    }

    /// The token a request that names none runs with (none: the anonymous token).
    pub fn default_token(&self) -> Option<Token> {
        self.tokens.read().1.clone()
    }

    /// The agent's own token (none: the default token's).
    pub fn agent_token(&self) -> Option<Token> {
        self.tokens.read().0.clone()
    }

    /// Replaces the agent token (`agent`) or the default token (otherwise); `None` clears
    /// it. The agent's own requests to the servers use the new agent token (or, without
    /// one, the default token) from the next request on.
    pub fn set_token(&self, agent: bool, token: Option<Token>) {
        let mut tokens = self.tokens.write();
        if agent {
            tokens.0 = token;
        } else {
            tokens.1 = token;
        }
        self.servers.set_token(tokens.0.clone().or_else(|| tokens.1.clone()));
        info!(
            which = if agent { "agent" } else { "default" },
            set = if agent { tokens.0.is_some() } else { tokens.1.is_some() },
            "agent token changed over the HTTP API"
        );
    }

    /// What intentions decide when none matches: allow without ACLs, else the default
    /// policy.
    pub fn intention_default_allow(&self) -> bool {
        !self.config.enabled || self.config.default_allow
    }

    /// A new local token for a managed proxy (accepted by this agent only, for that proxy).
    pub fn new_local_token() -> Result<Token, getrandom::Error> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)?;
        let uuid = uuid::Builder::from_random_bytes(bytes).into_uuid();
        // A UUID's text is never empty.
        Token::new(&uuid.hyphenated().to_string()).ok_or(getrandom::Error::UNEXPECTED)
    }

    /// What `token` (none: the default token) may do.
    pub async fn resolve(&self, token: Option<&Token>) -> Result<Resolved, AclError> {
        if !self.config.enabled {
            return Ok(self.all.clone());
        }
        let default = self.default_token();
        let token = token.or(default.as_ref());
        if let Some(hit) = self.cache.lock().get(&token.cloned()) {
            if hit.expires.is_some_and(|e| e <= SystemTime::now()) {
                return Err(AclError::NotFound);
            }
            return Ok(hit.clone());
        }
        let generation = *self.generation.borrow();
        let fetched: Result<::acl::TokenRules, ApiError> = self
            .servers
            .get_json_as(token, crate::servers::paths::ACL_AUTHORIZER)
            .await;
        let rules = match fetched {
            Ok(r) => r,
            Err(ApiError::PermissionDenied(_)) => return Err(AclError::NotFound),
            Err(e) => return Err(AclError::Unavailable(e.to_string())),
        };
        let resolved = Resolved {
            accessor: std::sync::Arc::from(rules.accessor_id.as_str()),
            authz: Arc::new(rules.authorizer()),
            expires: rules.expiration_time.map(|t| t.0),
        };
        // An ACL change while the answer was on its way: not cached (it may be older).
        if *self.generation.borrow() == generation {
            let mut cache = self.cache.lock();
            if cache.len() >= CACHE_CAPACITY {
                cache.clear();
            }
            cache.insert(token.cloned(), resolved.clone());
        }
        Ok(resolved)
    }

    /// Completes once cached answers were dropped after an ACL change at the servers.
    pub fn changed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.generation.subscribe();
        async move {
            let _ = rx.changed().await;
        }
    }

    /// Follows the servers' ACL index until `stop`: each move empties the cache.
    pub async fn follow(self: Arc<Self>, stop: CancellationToken) {
        if !self.config.enabled {
            return;
        }
        let mut index = 0u64;
        let mut failures = 0u32;
        loop {
            let asked = self.servers.get_blocking_as(
                None,
                crate::servers::paths::ACL_AUTHORIZER,
                index,
                Duration::from_secs(300),
            );
            let answer = tokio::select! {
                () = stop.cancelled() => return,
                a = asked => a,
            };
            match answer {
                Ok(b) if b.index != index => {
                    if index != 0 {
                        info!("ACLs changed at the servers: cached tokens dropped");
                        self.cache.lock().clear();
                        self.generation.send_modify(|g| *g += 1);
                    }
                    index = b.index;
                    failures = 0;
                }
                Ok(_) => failures = 0,
                Err(e) => {
                    failures += 1;
                    if failures == 1 {
                        warn!(error = %e, "cannot follow the servers' ACLs; cached tokens stay in use");
                    }
                    // The index is kept: once a server answers, a change missed meanwhile
                    // shows as a different index at once.
                    let pause = Duration::from_secs(u64::from(failures.min(6)));
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    }
}

impl ::acl::TokenResolver for AgentAcl {
    fn enabled(&self) -> bool {
        self.config.enabled
    }

    fn resolve(&self, token: Option<&Token>) -> ::acl::BoxFuture<'_, Result<Resolved, AclError>> {
        let token = token.cloned();
        Box::pin(async move { AgentAcl::resolve(self, token.as_ref()).await })
    }

    fn changed(&self) -> ::acl::BoxFuture<'static, ()> {
        Box::pin(AgentAcl::changed(self))
    }
}
