//! Service registrations: checked (the definition, and for an API caller what it may write,
//! see [`super::guard`]), expanded, persisted, then applied, under the registration lock.

use super::{Agent, AgentError, MAINTENANCE_PREFIX, guard};
use crate::acl::Resolved;
use crate::local::{LocalCheck, LocalService, Source};
use crate::persist::{PersistedCheck, PersistedService};
use crate::sidecar::{self, Expanded, NewCheck};
use std::collections::BTreeMap;
use structs::NodeService;
use structs::agent::ServiceDefinition;
use tracing::info;

impl Agent {
    /// Registers (or replaces) a service with its checks and its sidecar, as the operator
    /// (config files; nothing is asked of a token). With `replace_existing_checks`, checks of
    /// the service not in `def` are removed; otherwise they stay. A check that already
    /// existed keeps its status unless `def` sets one.
    pub async fn register_service(
        &self,
        def: ServiceDefinition,
        source: Source,
        replace_existing_checks: bool,
    ) -> Result<(), AgentError> {
        self.register(def, source, replace_existing_checks, None).await
    }

    /// The same for an API caller: `who` must be allowed to write everything the
    /// registration adds and everything it replaces or drops ([`AgentError::Denied`]
    /// otherwise, with nothing changed).
    pub async fn register_service_as(
        &self,
        def: ServiceDefinition,
        replace_existing_checks: bool,
        who: &Resolved,
    ) -> Result<(), AgentError> {
        self.register(def, Source::Api, replace_existing_checks, Some(who))
            .await
    }

    async fn register(
        &self,
        def: ServiceDefinition,
        source: Source,
        replace_existing_checks: bool,
        who: Option<&Resolved>,
    ) -> Result<(), AgentError> {
        if let Some(who) = who {
            guard::definition_names(who, &def)?;
        }
        self.refuse_api_command(&def, source)?;
        let _write = self.0.writes.lock().await;
        // Only a sidecar needs the node's ports; a bulk load of plain services stays linear.
        let ports = if def.connect.sidecar_service.is_some() || def.connect.proxy.is_some() {
            self.0.state.ports()
        } else {
            BTreeMap::new()
        };
        let mut expanded = sidecar::expand(&def, &ports, &self.0.config.sidecar_ports)?;
        self.refuse_server_owned(&expanded)?;
        let parent_id = expanded.service.id.clone();
        let mut keep_ids: Vec<String> = vec![parent_id.clone()];
        keep_ids.extend(expanded.sidecar.as_ref().map(|(proxy, _)| proxy.id.clone()));
        // A sidecar dropped from the definition goes with its registration.
        let old_sidecars: Vec<String> = self
            .0
            .state
            .sidecars_of(&parent_id)
            .into_iter()
            .filter(|id| !keep_ids.contains(id))
            .collect();
        if let Some(who) = who {
            self.may_register(who, &expanded)?;
            let sidecar_at = if def.connect.sidecar_service.is_some() {
                "Connect.SidecarService"
            } else {
                "Connect.Proxy"
            };
            Self::reserved_ids(&expanded, sidecar_at)?;
            self.may_target(who, &expanded, sidecar_at)?;
        }
        // After the checks' targets were judged as registered: the agent's own rewrite to the
        // proxy's exposed listener is not the caller's.
        if let Some((proxy, _)) = &mut expanded.sidecar {
            let taken = self.0.state.exposed_ports(&proxy.id);
            let skipped =
                crate::expose::expose_checks(proxy, &mut expanded.checks, &taken, &self.0.config.expose_ports)?;
            for (check, why) in skipped {
                tracing::warn!(service = %expanded.service.id, %check, why, "Expose.Checks: check not exposed");
            }
        }
        let Expanded {
            service,
            checks: mut new_checks,
            sidecar,
            managed,
        } = expanded;
        let mut services = vec![LocalService::new(service, None, source).with_token(def.token.clone())];
        if let Some((proxy, checks)) = sidecar {
            services.push(self.proxy_service(&def, proxy, managed, &parent_id, source)?);
            new_checks.extend(checks);
        }
        let current_checks = self.0.state.checks_of(&keep_ids);
        let checks = keep_statuses(new_checks, &current_checks, source);
        let removed_checks = if replace_existing_checks {
            replaced_checks(&current_checks, &keep_ids, &checks, source)
        } else {
            Vec::new()
        };
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

    /// A managed proxy's command comes from the HTTP API only when the agent allows it.
    /// On a server: its own service's id is not for registrations, and it runs no managed
    /// proxies (Consul 1.4's `Connect.Proxy`).
    fn refuse_server_owned(&self, expanded: &sidecar::Expanded) -> Result<(), AgentError> {
        if !self.0.config.in_server {
            return Ok(());
        }
        let invalid = |field: &str, why: String| {
            Err(AgentError::Invalid(structs::ValidationError::new(
                field,
                structs::Problem::Invalid(why),
            )))
        };
        let ids = std::iter::once(&expanded.service.id).chain(expanded.sidecar.as_ref().map(|(p, _)| &p.id));
        for id in ids {
            if id == crate::runtime::SERVER_SERVICE_ID {
                return invalid(
                    "ID",
                    format!("{id:?} is this server's own service (as on Consul's servers); register under another id"),
                );
            }
        }
        if expanded.managed.is_some() {
            return invalid(
                "Connect.Proxy",
                "a server runs no managed proxies: register a sidecar (Connect.SidecarService) and run its proxy \
                 with `meshd connect envoy`"
                    .into(),
            );
        }
        Ok(())
    }

    fn refuse_api_command(&self, def: &ServiceDefinition, source: Source) -> Result<(), AgentError> {
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
        Ok(())
    }

    /// The sidecar (or Consul 1.4 managed proxy) instance of `def`, with its token and, when
    /// the agent runs it, how.
    fn proxy_service(
        &self,
        def: &ServiceDefinition,
        proxy: NodeService,
        managed: Option<Vec<String>>,
        parent_id: &str,
        source: Source,
    ) -> Result<LocalService, AgentError> {
        // Consul 1.4's `Connect.Proxy` is always run by the agent; a sidecar is when the
        // agent manages sidecars (`-managed-sidecars`).
        // The proxy's token: the sidecar's own, else the registration's.
        let token = def
            .connect
            .sidecar_service
            .as_ref()
            .and_then(|sc| sc.token.clone())
            .or_else(|| def.token.clone());
        let runs = managed.is_some() || self.0.config.managed_sidecars;
        // A proxy keeps its local token across re-registrations (no restart for it).
        let local_token = match self
            .0
            .state
            .service(&proxy.id)
            .and_then(|s| s.managed)
            .and_then(|m| m.local_token)
        {
            Some(t) => Some(t),
            None if runs => Some(crate::acl::AgentAcl::new_local_token().map_err(|e| {
                AgentError::Invalid(structs::ValidationError::new(
                    "Connect",
                    structs::Problem::Invalid(format!("cannot make the proxy's local token: {e}")),
                ))
            })?),
            None => None,
        };
        let managed = runs.then(|| crate::local::Managed {
            command: managed.unwrap_or_default(),
            token: token.clone(),
            local_token,
        });
        Ok(LocalService::new(proxy, Some(parent_id.to_owned()), source)
            .with_managed(managed)
            .with_token(token))
    }

    pub(super) async fn persist_add(
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

    pub(super) async fn persist_remove(&self, services: Vec<String>, checks: Vec<String>) -> Result<(), AgentError> {
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

    /// Removes a service, its checks and its sidecar, as the operator.
    pub async fn deregister_service(&self, id: &str) -> Result<(), AgentError> {
        self.remove_service(id, None).await
    }

    /// The same for an API caller, who must be allowed to write the service (its own
    /// sidecars go with it).
    pub async fn deregister_service_as(&self, id: &str, who: &Resolved) -> Result<(), AgentError> {
        self.remove_service(id, Some(who)).await
    }

    async fn remove_service(&self, id: &str, who: Option<&Resolved>) -> Result<(), AgentError> {
        let _write = self.0.writes.lock().await;
        if let Some(who) = who {
            self.may_remove_service(who, id)?;
        }
        if self.0.state.service(id).is_none() {
            return Err(AgentError::NotFound(format!(
                "Unknown service ID {id:?}. Ensure that the service ID is passed, not the service name."
            )));
        }
        for sc in &self.0.state.sidecars_of(id) {
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
}

/// The new checks, each keeping the status and output of the check it replaces unless its
/// definition sets a status.
fn keep_statuses(new: Vec<NewCheck>, current: &BTreeMap<String, LocalCheck>, source: Source) -> Vec<LocalCheck> {
    new.into_iter()
        .map(|n| {
            let mut check = n.check;
            if n.definition.status.is_none()
                && let Some(old) = current.get(&check.check_id)
            {
                check.status = old.check.status;
                check.output.clone_from(&old.check.output);
            }
            LocalCheck::new(check, Some(n.definition), Some(n.kind), source)
        })
        .collect()
}

/// With `replace-existing-checks`: the checks of the registered instances the new definition
/// no longer names (never a maintenance check; a config reload only replaces the files'
/// checks, not those added through the API to a service the files define).
fn replaced_checks(
    current: &BTreeMap<String, LocalCheck>,
    keep_ids: &[String],
    checks: &[LocalCheck],
    source: Source,
) -> Vec<String> {
    current
        .values()
        .filter(|c| {
            keep_ids.contains(&c.check.service_id)
                && !c.check.check_id.starts_with(MAINTENANCE_PREFIX)
                && (source == Source::Api || c.source == Source::Config)
                && !checks.iter().any(|n| n.check.check_id == c.check.check_id)
        })
        .map(|c| c.check.check_id.clone())
        .collect()
}
