//! Checks registered on their own (`/v1/agent/check/register`), their removal and TTL
//! reports, and maintenance mode of a service or of the node. The `_as` forms are the API's:
//! the caller must be allowed to write what it changes (see [`super::guard`]).

use super::{Agent, AgentError, MAINTENANCE_PREFIX, NODE_MAINTENANCE};
use crate::acl::Resolved;
use crate::local::{LocalCheck, Source};
use crate::sidecar;
use structs::agent::CheckType;
use structs::{HealthCheck, HealthStatus, Problem, ValidationError};
use tracing::info;

impl Agent {
    /// Registers (or replaces) a check as the operator (config files): its id is `ID`, else
    /// its name; a `ServiceID` must name a local service.
    pub async fn register_check(&self, def: CheckType, source: Source) -> Result<(), AgentError> {
        self.add_check(def, source, None).await
    }

    /// The same for an API caller: it must be allowed to write the check's service (the node
    /// for a node check) and, when the id is taken, the owner of the check already there.
    pub async fn register_check_as(&self, def: CheckType, who: &Resolved) -> Result<(), AgentError> {
        self.add_check(def, Source::Api, Some(who)).await
    }

    async fn add_check(&self, def: CheckType, source: Source, who: Option<&Resolved>) -> Result<(), AgentError> {
        let _write = self.0.writes.lock().await;
        let id = if def.given_id().is_empty() {
            def.name.clone()
        } else {
            def.given_id().to_owned()
        };
        if let Some(who) = who {
            self.may_add_check(who, &def.service_id)?;
            self.may_change_check(who, &id)?;
        }
        if def.name.is_empty() {
            return Err(ValidationError::new("Name", Problem::Required("")).into());
        }
        if who.is_some() {
            let field = if def.check_id.is_empty() { "ID" } else { "CheckID" };
            super::guard::reserved_check_id(&id, &def.service_id, field)?;
        }
        let kind = def.kind()?;
        let mut check = sidecar::health_check(id, def.name.clone(), &def, &kind);
        let svc = match def.service_id.as_str() {
            "" => None,
            service_id => Some(self.0.state.service(service_id).ok_or_else(|| {
                ValidationError::new(
                    "ServiceID",
                    Problem::Invalid(format!("{service_id:?} is not registered on this agent")),
                )
            })?),
        };
        if let Some(who) = who {
            self.may_target_check(who, &kind, svc.as_ref().map(|s| &s.service))?;
        }
        if let Some(svc) = svc {
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

    /// Removes a check, as the operator.
    pub async fn deregister_check(&self, id: &str) -> Result<(), AgentError> {
        self.remove_check(id, None).await
    }

    /// The same for an API caller, who must be allowed to write the check's owner.
    pub async fn deregister_check_as(&self, id: &str, who: &Resolved) -> Result<(), AgentError> {
        self.remove_check(id, Some(who)).await
    }

    async fn remove_check(&self, id: &str, who: Option<&Resolved>) -> Result<(), AgentError> {
        let _write = self.0.writes.lock().await;
        if let Some(who) = who {
            self.may_change_check(who, id)?;
        }
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

    /// A TTL check's report from an API caller, who must be allowed to write the check's
    /// owner. (Reports do not take the registration lock: they are frequent, and change only
    /// a status.)
    pub fn ttl_update_as(
        &self,
        id: &str,
        status: HealthStatus,
        output: String,
        who: &Resolved,
    ) -> Result<(), AgentError> {
        self.may_change_check(who, id)?;
        self.ttl_update(id, status, output)
    }

    /// Puts a service into maintenance (a critical check `_service_maintenance:<id>`) or takes
    /// it out, as the operator.
    pub async fn set_maintenance(&self, service_id: &str, enable: bool, reason: &str) -> Result<(), AgentError> {
        self.service_maintenance(service_id, enable, reason, None).await
    }

    /// The same for an API caller, who must be allowed to write the service.
    pub async fn set_maintenance_as(
        &self,
        service_id: &str,
        enable: bool,
        reason: &str,
        who: &Resolved,
    ) -> Result<(), AgentError> {
        self.service_maintenance(service_id, enable, reason, Some(who)).await
    }

    async fn service_maintenance(
        &self,
        service_id: &str,
        enable: bool,
        reason: &str,
        who: Option<&Resolved>,
    ) -> Result<(), AgentError> {
        let _write = self.0.writes.lock().await;
        let Some(svc) = self.0.state.service(service_id) else {
            return Err(AgentError::NotFound(format!(
                "No service registered with ID {service_id:?}"
            )));
        };
        if let Some(who) = who {
            super::guard::may_write_service(who, &svc)?;
        }
        let check = enable.then(|| HealthCheck {
            check_id: format!("{MAINTENANCE_PREFIX}{service_id}"),
            name: "Service Maintenance Mode".into(),
            status: HealthStatus::Critical,
            notes: maintenance_notes(reason, "service"),
            service_id: svc.service.id.clone(),
            service_name: svc.service.service.clone(),
            service_tags: svc.service.tags.clone(),
            check_type: "maintenance".into(),
            ..HealthCheck::default()
        });
        self.maintenance_check(&format!("{MAINTENANCE_PREFIX}{service_id}"), check, svc.source)
            .await
    }

    /// Puts the whole node into maintenance (a critical node check `_node_maintenance`, which
    /// makes every instance of the node critical) or takes it out. An API caller (`who`)
    /// must hold `node:write` on the agent's node.
    pub async fn set_node_maintenance(
        &self,
        enable: bool,
        reason: &str,
        who: Option<&Resolved>,
    ) -> Result<(), AgentError> {
        let _write = self.0.writes.lock().await;
        if let Some(who) = who {
            super::guard::node_write(who, &self.0.config.node)?;
        }
        let check = enable.then(|| HealthCheck {
            check_id: NODE_MAINTENANCE.into(),
            name: "Node Maintenance Mode".into(),
            status: HealthStatus::Critical,
            notes: maintenance_notes(reason, "node"),
            check_type: "maintenance".into(),
            ..HealthCheck::default()
        });
        self.maintenance_check(NODE_MAINTENANCE, check, Source::Api).await
    }

    /// Adds maintenance check `check` (persisted for API registrations), or removes check
    /// `id` when `check` is `None`. Called under the registration lock.
    async fn maintenance_check(&self, id: &str, check: Option<HealthCheck>, source: Source) -> Result<(), AgentError> {
        let Some(check) = check else {
            if self.0.state.check(id).is_some() {
                self.persist_remove(Vec::new(), vec![id.to_owned()]).await?;
                self.0.state.remove_check(id);
                info!(check = %id, "maintenance mode off");
            }
            return Ok(());
        };
        let local = LocalCheck::new(check, None, None, source);
        if source == Source::Api {
            self.persist_add(&[], std::slice::from_ref(&local), &[]).await?;
        }
        info!(check = %id, "maintenance mode on");
        self.apply(Vec::new(), vec![local], Vec::new());
        Ok(())
    }
}

/// Consul's notes of a maintenance check: the reason, else a default message.
fn maintenance_notes(reason: &str, what: &str) -> String {
    if reason.is_empty() {
        format!("Maintenance mode is enabled for this {what}, but no reason was provided. This is a default message.")
    } else {
        reason.to_owned()
    }
}
