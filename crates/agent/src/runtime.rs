//! The agent: registrations (checked, expanded, persisted, then applied), the check runner,
//! anti-entropy, the liveness heartbeat and the critical-service reaper, all owned by one
//! [`Agent`] and stopped by [`Agent::shutdown`].

use crate::checks::{CheckRunner, Thresholds};
use crate::local::{LocalCheck, LocalService, LocalState, Source};
use crate::persist::{PersistedCheck, PersistedService, Persistence};
use crate::servers::Servers;
use crate::sidecar::{self, NewCheck};
use crate::sync::{NodeInfo, Syncer};
use std::collections::BTreeMap;
use std::sync::Arc;
use structs::agent::{CheckKind, CheckType, ServiceDefinition};
use structs::{HealthCheck, HealthStatus, Problem, ValidationError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, info_span, warn};

/// Id prefix of a service's maintenance check.
pub const MAINTENANCE_PREFIX: &str = "_service_maintenance:";

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
        let state = Arc::new(LocalState::new(config.node.clone()));
        let cancel = CancellationToken::new();
        let servers = Arc::new(match &config.servers_ca_pem {
            Some(pem) => Servers::with_ca(&config.servers, pem)?,
            None => Servers::new(&config.servers),
        });
        let acl = Arc::new(crate::acl::AgentAcl::new(config.acl.clone(), Arc::clone(&servers)));
        let syncer = Arc::new(Syncer::new(
            Arc::clone(&state),
            Arc::clone(&servers),
            NodeInfo {
                node: config.node.clone(),
                address: config.advertise.clone(),
                datacenter: config.datacenter.clone(),
                meta: config.node_meta.clone(),
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
        let node = agent.0.config.node.clone();
        let a = agent.clone();
        let stop = agent.0.cancel.clone();
        agent
            .0
            .tracker
            .spawn(async move { a.0.syncer.run(stop).await }.instrument(info_span!("anti_entropy", node = %node)));
        let a = agent.clone();
        let stop = agent.0.cancel.clone();
        agent
            .0
            .tracker
            .spawn(async move { a.heartbeat(stop).await }.instrument(info_span!("heartbeat", node = %node)));
        let acl = Arc::clone(&agent.0.acl);
        let stop = agent.0.cancel.clone();
        agent
            .0
            .tracker
            .spawn(acl.follow(stop).instrument(info_span!("acl_follow", node = %node)));
        let a = agent.clone();
        let stop = agent.0.cancel.clone();
        agent
            .0
            .tracker
            .spawn(async move { a.reap_critical(stop).await }.instrument(info_span!("critical_reaper")));
        Ok(agent)
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
            loaded.push(LocalCheck::new(check, p.definition, kind, Source::Api));
        }
        info!(
            services = services.len(),
            checks = loaded.len(),
            "loaded persisted registrations"
        );
        self.apply(services, loaded, Vec::new());
        Ok(())
    }

    /// Applies to the state and (re)starts the runners of the added checks.
    fn apply(&self, services: Vec<LocalService>, checks: Vec<LocalCheck>, removed_checks: Vec<String>) {
        for id in &removed_checks {
            self.0.checks.stop(id);
        }
        let runners: Vec<(String, CheckKind, Thresholds)> = checks
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
                ))
            })
            .collect();
        self.0.state.apply(services, checks, &removed_checks);
        for (id, kind, thresholds) in runners {
            self.0.checks.start(&id, &kind, thresholds);
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

    /// Registers (or replaces) a service with its checks and its sidecar. With
    /// `replace_existing_checks`, checks of the service not in `def` are removed; otherwise
    /// they stay. A check that already existed keeps its status unless `def` sets one.
    pub async fn register_service(
        &self,
        def: ServiceDefinition,
        source: Source,
        replace_existing_checks: bool,
    ) -> Result<(), AgentError> {
        if source == Source::Api
            && !self.0.config.allow_managed_api_registration
            && def.connect.proxy.as_ref().is_some_and(|p| !p.command.is_empty())
        {
            return Err(AgentError::Invalid(structs::ValidationError::new(
                "Connect.Proxy.Command",
                structs::Problem::Invalid(
                    "a command for a managed proxy is accepted from the HTTP API only when the agent \
                     allows it (-allow-managed-api-registration); config files may set one"
                        .into(),
                ),
            )));
        }
        let _write = self.0.writes.lock().await;
        // Only a sidecar needs the node's ports; a bulk load of plain services stays linear.
        let ports = if def.connect.sidecar_service.is_some() || def.connect.proxy.is_some() {
            self.0.state.ports()
        } else {
            BTreeMap::new()
        };
        let expanded = sidecar::expand(&def, &ports, &self.0.config.sidecar_ports)?;
        let parent_id = expanded.service.id.clone();
        let mut services = vec![LocalService::new(expanded.service, None, source).with_token(def.token.clone())];
        let mut new_checks: Vec<NewCheck> = expanded.checks;
        let mut keep_ids: Vec<String> = vec![parent_id.clone()];
        if let Some((proxy, checks)) = expanded.sidecar {
            keep_ids.push(proxy.id.clone());
            // Consul 1.4's `Connect.Proxy` is always run by the agent; a sidecar is when the
            // agent manages sidecars (`-managed-sidecars`).
            // The proxy's token: the sidecar's own, else the registration's.
            let token = def
                .connect
                .sidecar_service
                .as_ref()
                .map(|sc| sc.token.clone())
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| def.token.clone());
            // A proxy keeps its local token across re-registrations (no restart for it).
            let local_token = match self
                .0
                .state
                .service(&proxy.id)
                .and_then(|s| s.managed)
                .map(|m| m.local_token)
                .filter(|t| !t.is_empty())
            {
                Some(t) => t,
                None if expanded.managed.is_some() || self.0.config.managed_sidecars => {
                    crate::acl::AgentAcl::new_local_token().map_err(|e| {
                        AgentError::Invalid(structs::ValidationError::new(
                            "Connect",
                            structs::Problem::Invalid(format!("cannot make the proxy's local token: {e}")),
                        ))
                    })?
                }
                None => String::new(),
            };
            let managed = match expanded.managed {
                Some(command) => Some(crate::local::Managed {
                    command,
                    token: token.clone(),
                    local_token,
                }),
                None if self.0.config.managed_sidecars => Some(crate::local::Managed {
                    command: Vec::new(),
                    token: token.clone(),
                    local_token,
                }),
                None => None,
            };
            services.push(
                LocalService::new(proxy, Some(parent_id.clone()), source)
                    .with_managed(managed)
                    .with_token(token),
            );
            new_checks.extend(checks);
        }
        // A sidecar dropped from the definition goes with its registration.
        let old_sidecars: Vec<String> = self
            .0
            .state
            .sidecars_of(&parent_id)
            .into_iter()
            .filter(|id| !keep_ids.contains(id))
            .collect();
        let current_checks = self.0.state.checks_of(&keep_ids);
        let checks: Vec<LocalCheck> = new_checks
            .into_iter()
            .map(|n| {
                let mut check = n.check;
                if n.definition.status.is_none()
                    && let Some(old) = current_checks.get(&check.check_id)
                {
                    check.status = old.check.status;
                    check.output.clone_from(&old.check.output);
                }
                LocalCheck::new(check, Some(n.definition), Some(n.kind), source)
            })
            .collect();
        let mut removed_checks: Vec<String> = Vec::new();
        if replace_existing_checks {
            removed_checks = current_checks
                .values()
                .filter(|c| {
                    keep_ids.contains(&c.check.service_id)
                        && !c.check.check_id.starts_with(MAINTENANCE_PREFIX)
                        // A config reload replaces the files' checks, not those added through
                        // the API to a service the files define.
                        && (source == Source::Api || c.source == Source::Config)
                        && !checks.iter().any(|n| n.check.check_id == c.check.check_id)
                })
                .map(|c| c.check.check_id.clone())
                .collect();
        }
        if source == Source::Api {
            self.persist_add(&services, &checks, &removed_checks).await?;
        }
        for id in &old_sidecars {
            self.remove_service_locked(id).await?;
        }
        info!(service = %parent_id, checks = checks.len(), sidecar = services.len() > 1, "service registered");
        self.apply(services, checks, removed_checks);
        Ok(())
    }

    async fn persist_add(
        &self,
        services: &[LocalService],
        checks: &[LocalCheck],
        removed_checks: &[String],
    ) -> Result<(), AgentError> {
        let Some(persist) = self.0.persist.clone() else {
            return Ok(());
        };
        let services: Vec<PersistedService> = services
            .iter()
            .map(|s| PersistedService {
                service: s.service.clone(),
                sidecar_of: s.sidecar_of.clone(),
                managed: s.managed.clone(),
                token: s.token.clone(),
            })
            .collect();
        let checks: Vec<PersistedCheck> = checks
            .iter()
            .map(|c| PersistedCheck {
                check: c.check.clone(),
                definition: c.definition.clone(),
            })
            .collect();
        let removed = removed_checks.to_vec();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            for s in &services {
                persist.save_service(s)?;
            }
            for c in &checks {
                persist.save_check(c)?;
            }
            for id in &removed {
                persist.remove_check(id)?;
            }
            Ok(())
        })
        .await
        .map_err(std::io::Error::other)??;
        Ok(())
    }

    async fn persist_remove(&self, services: Vec<String>, checks: Vec<String>) -> Result<(), AgentError> {
        let Some(persist) = self.0.persist.clone() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            for id in &checks {
                persist.remove_check(id)?;
            }
            for id in &services {
                persist.remove_service(id)?;
            }
            Ok(())
        })
        .await
        .map_err(std::io::Error::other)??;
        Ok(())
    }

    /// Removes a service, its checks and its sidecar.
    pub async fn deregister_service(&self, id: &str) -> Result<(), AgentError> {
        let _write = self.0.writes.lock().await;
        if self.0.state.service(id).is_none() {
            return Err(AgentError::NotFound(format!(
                "Unknown service ID {id:?}. Ensure that the service ID is passed, not the service name."
            )));
        }
        let sidecars: Vec<String> = self
            .0
            .state
            .services()
            .into_values()
            .filter(|s| s.sidecar_of.as_deref() == Some(id))
            .map(|s| s.service.id)
            .collect();
        for sc in &sidecars {
            self.remove_service_locked(sc).await?;
        }
        self.remove_service_locked(id).await?;
        info!(service = %id, "service deregistered");
        Ok(())
    }

    async fn remove_service_locked(&self, id: &str) -> Result<(), AgentError> {
        let checks: Vec<String> = self
            .0
            .state
            .checks()
            .into_values()
            .filter(|c| c.check.service_id == id)
            .map(|c| c.check.check_id)
            .collect();
        self.persist_remove(vec![id.to_owned()], checks.clone()).await?;
        for c in &checks {
            self.0.checks.stop(c);
        }
        self.0.state.remove_service(id);
        Ok(())
    }

    /// Registers (or replaces) a check (`/v1/agent/check/register`): its id is `ID`, else its
    /// name; a `ServiceID` must name a local service.
    pub async fn register_check(&self, def: CheckType, source: Source) -> Result<(), AgentError> {
        let _write = self.0.writes.lock().await;
        if def.name.is_empty() {
            return Err(ValidationError::new("Name", Problem::Required("")).into());
        }
        let kind = def.kind()?;
        let id = if def.given_id().is_empty() {
            def.name.clone()
        } else {
            def.given_id().to_owned()
        };
        let mut check = sidecar::health_check(id, def.name.clone(), &def, &kind);
        if !def.service_id.is_empty() {
            let Some(svc) = self.0.state.service(&def.service_id) else {
                return Err(ValidationError::new(
                    "ServiceID",
                    Problem::Invalid(format!("{:?} is not registered on this agent", def.service_id)),
                )
                .into());
            };
            check.service_id.clone_from(&svc.service.id);
            check.service_name.clone_from(&svc.service.service);
            check.service_tags.clone_from(&svc.service.tags);
        }
        if def.status.is_none()
            && let Some(old) = self.0.state.check(&check.check_id)
        {
            check.status = old.check.status;
            check.output = old.check.output;
        }
        let local = LocalCheck::new(check, Some(def), Some(kind), source);
        if source == Source::Api {
            self.persist_add(&[], std::slice::from_ref(&local), &[]).await?;
        }
        info!(check = %local.check.check_id, "check registered");
        self.apply(Vec::new(), vec![local], Vec::new());
        Ok(())
    }

    /// Removes a check.
    pub async fn deregister_check(&self, id: &str) -> Result<(), AgentError> {
        let _write = self.0.writes.lock().await;
        if self.0.state.check(id).is_none() {
            return Err(AgentError::NotFound(format!("Unknown check ID {id:?}")));
        }
        self.persist_remove(Vec::new(), vec![id.to_owned()]).await?;
        self.0.checks.stop(id);
        self.0.state.remove_check(id);
        info!(check = %id, "check deregistered");
        Ok(())
    }

    /// A TTL check's report.
    pub fn ttl_update(&self, id: &str, status: HealthStatus, output: String) -> Result<(), AgentError> {
        Ok(self.0.checks.ttl_update(id, status, output)?)
    }

    /// Puts a service into maintenance (a critical check `_service_maintenance:<id>`) or takes
    /// it out.
    pub async fn set_maintenance(&self, service_id: &str, enable: bool, reason: &str) -> Result<(), AgentError> {
        let _write = self.0.writes.lock().await;
        let Some(svc) = self.0.state.service(service_id) else {
            return Err(AgentError::NotFound(format!(
                "No service registered with ID {service_id:?}"
            )));
        };
        let id = format!("{MAINTENANCE_PREFIX}{service_id}");
        if !enable {
            if self.0.state.check(&id).is_some() {
                self.persist_remove(Vec::new(), vec![id.clone()]).await?;
                self.0.state.remove_check(&id);
                info!(service = %service_id, "maintenance mode off");
            }
            return Ok(());
        }
        let notes = if reason.is_empty() {
            "Maintenance mode is enabled for this service, but no reason was provided. This is a default message."
                .to_owned()
        } else {
            reason.to_owned()
        };
        let check = HealthCheck {
            check_id: id,
            name: "Service Maintenance Mode".into(),
            status: HealthStatus::Critical,
            notes,
            service_id: svc.service.id.clone(),
            service_name: svc.service.service.clone(),
            service_tags: svc.service.tags.clone(),
            check_type: "maintenance".into(),
            ..HealthCheck::default()
        };
        let local = LocalCheck::new(check, None, None, svc.source);
        if svc.source == Source::Api {
            self.persist_add(&[], std::slice::from_ref(&local), &[]).await?;
        }
        info!(service = %service_id, "maintenance mode on");
        self.apply(Vec::new(), vec![local], Vec::new());
        Ok(())
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

    /// Waits for the first successful full sync.
    pub async fn wait_first_sync(&self) {
        self.0.syncer.wait_first_sync().await;
    }
}

mod config;
mod node;
mod reload;

pub use config::{AgentConfig, AgentError};

#[cfg(test)]
mod tests;
