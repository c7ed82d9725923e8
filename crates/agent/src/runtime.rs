//! The agent: registrations (checked, expanded, persisted, then applied), the check runner,
//! anti-entropy, the liveness heartbeat and the critical-service reaper, all owned by one
//! [`Agent`] and stopped by [`Agent::shutdown`].

use crate::checks::{CheckRunner, Thresholds};
use crate::local::{LocalCheck, LocalService, LocalState, Source};
use crate::persist::Persistence;
use crate::servers::Servers;
use crate::sync::{NodeInfo, Syncer};
use std::collections::BTreeMap;
use std::sync::Arc;
use structs::agent::CheckKind;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, info_span, warn};

/// Id prefix of a service's maintenance check.
pub const MAINTENANCE_PREFIX: &str = "_service_maintenance:";

/// The id of a server's own service on its node (Consul's): the server's, never an agent
/// registration's.
pub const SERVER_SERVICE_ID: &str = "consul";

/// Id of the node's maintenance check (Consul's).
pub const NODE_MAINTENANCE: &str = "_node_maintenance";

struct Inner {
    config: AgentConfig,
    state: Arc<LocalState>,
    checks: CheckRunner,
    persist: Option<Persistence>,
    servers: Arc<Servers>,
    /// Token resolution and the agent's tokens.
    acl: Arc<crate::acl::AgentAcl>,
    /// What this agent knows of the servers' state, shared by its proxies and its API.
    caches: agent_cache::AgentCaches,
    /// The proxies it runs itself, once started ([`Agent::start_managed`]).
    managed: std::sync::OnceLock<crate::managed::ManagedProxies>,
    syncer: Arc<Syncer>,
    /// One registration at a time: port allocation and persistence see a stable state.
    writes: tokio::sync::Mutex<()>,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

/// A running agent (cheap to clone).
#[derive(Clone)]
pub struct Agent(Arc<Inner>);

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("node", &self.0.config.node)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// Loads persisted registrations and starts the agent's tasks.
    pub async fn start(config: AgentConfig) -> Result<Agent, AgentError> {
        config.validate()?;
        let persist = match &config.data_dir {
            None => None,
            Some(dir) => Some(Persistence::open(dir).map_err(|error| AgentError::DataDir {
                path: dir.clone(),
                error,
            })?),
        };
        let node_id = match (&config.node_id, &config.data_dir) {
            (Some(id), _) => id.clone(),
            (None, Some(dir)) => crate::persist::node_id(dir).map_err(|error| AgentError::DataDir {
                path: dir.clone(),
                error,
            })?,
            (None, None) => crate::persist::random_uuid()?,
        };
        // Kept in the config: `/v1/agent/self` shows it.
        let config = AgentConfig {
            node_id: Some(node_id.clone()),
            ..config
        };
        let state = Arc::new(LocalState::new(config.node.clone()));
        let cancel = CancellationToken::new();
        let servers = Arc::new(Servers::multiplexed_as(
            &config.servers,
            config.servers_ca_pem.as_deref(),
            config.servers_identity_pem.as_deref(),
        )?);
        let acl = Arc::new(crate::acl::AgentAcl::new(config.acl.clone(), Arc::clone(&servers)));
        let syncer = Arc::new(Syncer::new(
            Arc::clone(&state),
            Arc::clone(&servers),
            NodeInfo {
                node: config.node.clone(),
                id: node_id.clone(),
                address: config.advertise.clone(),
                tagged_addresses: config
                    .tagged_addresses
                    .clone()
                    .unwrap_or_else(|| crate::sync::tagged_addresses(&config.advertise)),
                datacenter: config.datacenter.clone(),
                meta: crate::sync::with_agent_meta(config.node_meta.clone()),
                server_owned_services: if config.in_server {
                    vec![SERVER_SERVICE_ID.to_owned()]
                } else {
                    Vec::new()
                },
            },
            config.sync.clone(),
        ));
        let caches = agent_cache::AgentCaches::new(
            Arc::clone(&servers),
            agent_cache::CachesConfig {
                datacenter: config.datacenter.clone(),
                ..agent_cache::CachesConfig::default()
            },
            cancel.child_token(),
        );
        let agent = Agent(Arc::new(Inner {
            checks: CheckRunner::new(Arc::clone(&state), cancel.child_token()).with_servers(Arc::clone(&servers)),
            config,
            state,
            persist,
            servers,
            acl,
            caches,
            managed: std::sync::OnceLock::new(),
            syncer,
            writes: tokio::sync::Mutex::new(()),
            cancel,
            tracker: TaskTracker::new(),
        }));
        agent.load_persisted().await?;
        agent.spawn_tasks();
        Ok(agent)
    }

    /// Anti-entropy, the heartbeat (not in a server), following the servers' ACLs and the
    /// critical-service reaper, on the agent's tracker.
    fn spawn_tasks(&self) {
        let node = self.0.config.node.clone();
        let a = self.clone();
        let stop = self.0.cancel.clone();
        self.0
            .tracker
            .spawn(async move { a.0.syncer.run(stop).await }.instrument(info_span!("anti_entropy", node = %node)));
        // A server keeps its own node alive.
        if !self.0.config.in_server {
            let a = self.clone();
            let stop = self.0.cancel.clone();
            self.0
                .tracker
                .spawn(async move { a.heartbeat(stop).await }.instrument(info_span!("heartbeat", node = %node)));
        }
        let acl = Arc::clone(&self.0.acl);
        let stop = self.0.cancel.clone();
        self.0
            .tracker
            .spawn(acl.follow(stop).instrument(info_span!("acl_follow", node = %node)));
        let a = self.clone();
        let stop = self.0.cancel.clone();
        self.0
            .tracker
            .spawn(async move { a.reap_critical(stop).await }.instrument(info_span!("critical_reaper")));
    }

    async fn load_persisted(&self) -> Result<(), AgentError> {
        let Some(persist) = self.0.persist.clone() else {
            return Ok(());
        };
        let (services, checks) = tokio::task::spawn_blocking(move || persist.load())
            .await
            .map_err(std::io::Error::other)??;
        let node = self.0.config.node.clone();
        let services: Vec<LocalService> = services
            .into_iter()
            .map(|p| {
                LocalService::new(p.service, p.sidecar_of, Source::Api)
                    .with_managed(p.managed)
                    .with_token(p.token)
            })
            .collect();
        let mut loaded = Vec::new();
        let mut refused = Vec::new();
        let by_id: BTreeMap<&str, &LocalService> = services.iter().map(|s| (s.service.id.as_str(), s)).collect();
        // A check of a service that is not persisted (one from a config file) is kept: the
        // config files load next; `load_config` drops the checks still without a service.
        for p in checks {
            let kind = match p.definition.as_ref().map(|d| d.kind()).transpose() {
                Ok(kind) => kind,
                Err(error) => {
                    warn!(check = %p.check.check_id, %error, "skipping a persisted check with an unusable definition");
                    continue;
                }
            };
            let mut check = p.check;
            check.node.clone_from(&node);
            let check = LocalCheck::new(check, p.definition, kind, Source::Api);
            if let Err(error) = self.persisted_target(&check, &by_id) {
                warn!(check = %check.check.check_id, %error, "dropping a persisted check whose target is not allowed");
                refused.push(check.check.check_id);
                continue;
            }
            loaded.push(check);
        }
        info!(
            services = services.len(),
            checks = loaded.len(),
            "loaded persisted registrations"
        );
        self.persist_remove(Vec::new(), refused).await?;
        self.apply(services, loaded, Vec::new());
        Ok(())
    }

    /// Applies to the state and (re)starts the runners of the added checks.
    fn apply(&self, services: Vec<LocalService>, checks: Vec<LocalCheck>, removed_checks: Vec<String>) {
        for id in &removed_checks {
            self.0.checks.stop(id);
        }
        let runners: Vec<(String, CheckKind, Thresholds, bool)> = checks
            .iter()
            .filter_map(|c| {
                let kind = c.kind.clone()?;
                let d = c.definition.as_ref()?;
                Some((
                    c.check.check_id.clone(),
                    kind,
                    Thresholds::new(
                        d.success_before_passing,
                        d.failures_before_warning,
                        d.failures_before_critical,
                    ),
                    // API checks follow redirects only to the same origin.
                    c.source == Source::Api,
                ))
            })
            .collect();
        self.0.state.apply(services, checks, &removed_checks);
        for (id, kind, thresholds, confined) in runners {
            self.0.checks.start(&id, &kind, thresholds, confined);
        }
    }

    /// The local state.
    pub fn state(&self) -> &LocalState {
        &self.0.state
    }

    /// The settings.
    pub fn config(&self) -> &AgentConfig {
        &self.0.config
    }

    /// Token resolution and the agent's tokens.
    pub fn acl(&self) -> &Arc<crate::acl::AgentAcl> {
        &self.0.acl
    }

    /// The servers.
    pub fn servers(&self) -> &Arc<Servers> {
        &self.0.servers
    }

    /// Starts running the managed proxies of the local state (once the agent's addresses
    /// are known: the default command points the proxies at them). A second call does nothing.
    pub fn start_managed(&self, config: crate::managed::ManagedConfig) -> Result<(), crate::managed::ManagedError> {
        if self.0.managed.get().is_some() {
            return Ok(());
        }
        let managed = crate::managed::ManagedProxies::start(Arc::clone(&self.0.state), config)?;
        if let Err(extra) = self.0.managed.set(managed) {
            // Started twice concurrently: the first one stands.
            drop(extra);
        }
        Ok(())
    }

    /// The managed proxies, once started.
    pub fn managed(&self) -> Option<&crate::managed::ManagedProxies> {
        self.0.managed.get()
    }

    /// The agent cache (stopped by [`Agent::shutdown`]).
    pub fn caches(&self) -> &agent_cache::AgentCaches {
        &self.0.caches
    }

    /// True once the catalog has everything the agent has.
    pub fn in_sync(&self) -> bool {
        self.0.syncer.in_sync()
    }

    /// Stops every task of the agent and waits for them; then records the last reported
    /// status of TTL checks, so that a restart does not flap them back to their registered
    /// status (each gets a full TTL after the restart to be reported again).
    pub async fn shutdown(&self) {
        self.0.cancel.cancel();
        if let Some(managed) = self.0.managed.get() {
            managed.shutdown().await;
        }
        self.0.checks.shutdown().await;
        self.0.caches.shutdown().await;
        self.0.tracker.close();
        self.0.tracker.wait().await;
        if let Err(error) = self.persist_ttl_states().await {
            warn!(%error, "cannot record the TTL checks' last status: they restart from their registered one");
        }
    }

    async fn persist_ttl_states(&self) -> Result<(), AgentError> {
        if self.0.persist.is_none() {
            return Ok(());
        }
        let ttl: Vec<LocalCheck> = self
            .0
            .state
            .checks()
            .into_values()
            .filter(|c| c.source == Source::Api && matches!(c.kind, Some(CheckKind::Ttl(_))))
            .collect();
        self.persist_add(&[], &ttl, &[]).await
    }

    /// Completes once the agent is shutting down (for requests that would otherwise outlive
    /// it, such as forwarded blocking queries).
    pub async fn stopping(&self) {
        self.0.cancel.cancelled().await;
    }

    /// Waits (at most `limit`) until the servers have every local change made so far, as
    /// Consul's agents sync a registration before answering it: a client reads its own
    /// write from any server. Returns at once while the servers cannot be reached (the
    /// change syncs when they can).
    pub async fn sync_changes(&self, limit: std::time::Duration) -> bool {
        let version = self.0.state.version();
        self.0.syncer.wait_synced(version, limit).await
    }

    /// Waits for the first successful full sync.
    pub async fn wait_first_sync(&self) {
        self.0.syncer.wait_first_sync().await;
    }
}

mod check_ops;
mod config;
mod guard;
mod node;
mod register;
mod reload;
mod targets;

pub use config::{AgentConfig, AgentError};

#[cfg(test)]
mod tests;
