//! What an API caller may change. Every write through the agent's API is checked against
//! what it would add *and* what it would replace: registering over an existing service id
//! needs `service:write` on the service already there (and on its destination when it is a
//! proxy), as does a sidecar id the registration would take over, and every existing check
//! whose id it reuses (`node:write` for a node check). The checks run under the
//! registration lock, before anything is persisted or applied, so a refusal changes nothing
//! and a concurrent registration cannot slip in between check and write.
//!
//! Writing anything of a service (the service itself, its checks, its maintenance mode)
//! needs `service:write` on its name, and for a proxy on its destination too; node checks
//! and node maintenance need `node:write` on the agent's node. A service's own sidecars
//! (registered with it, their destination is the service) go with it on the service's
//! permission, as in Consul: removing or re-registering `web` without its sidecar needs
//! `service:write` on `web` only.

use super::{Agent, AgentError};
use crate::acl::Resolved;
use crate::local::{LocalCheck, LocalService};
use crate::sidecar::{Expanded, MANAGED_SUFFIX, SIDECAR_SUFFIX};
use structs::agent::ServiceDefinition;
use structs::{NodeService, ServiceKind};

/// A refusal in Consul's words.
fn denied(who: &Resolved, permission: &str, target: &str) -> AgentError {
    AgentError::Denied(::acl::denied(&who.accessor, permission, target))
}

/// `service:write` on `name`.
pub(crate) fn service_write(who: &Resolved, name: &str) -> Result<(), AgentError> {
    if who.authz.service_write(name) {
        Ok(())
    } else {
        Err(denied(who, "service:write", name))
    }
}

/// `node:write` on `node`.
pub(crate) fn node_write(who: &Resolved, node: &str) -> Result<(), AgentError> {
    if who.authz.node_write(node) {
        Ok(())
    } else {
        Err(denied(who, "node:write", node))
    }
}

/// Writing an instance: its name, and a proxy's destination.
fn instance_write(who: &Resolved, service: &NodeService) -> Result<(), AgentError> {
    service_write(who, &service.service)?;
    let dest = &service.proxy.destination_service_name;
    if service.kind != ServiceKind::Typical && !dest.is_empty() {
        service_write(who, dest)?;
    }
    Ok(())
}

/// The names a definition asks to write, read from the definition alone (checked before
/// anything else, so a caller without them gets a 403 whatever else is wrong with it).
pub(crate) fn definition_names(who: &Resolved, def: &ServiceDefinition) -> Result<(), AgentError> {
    let name = if def.name.is_empty() { &def.id } else { &def.name };
    service_write(who, name)?;
    if !def.proxy.destination_service_name.is_empty() {
        service_write(who, &def.proxy.destination_service_name)?;
    }
    if let Some(sc) = &def.connect.sidecar_service {
        if sc.name.is_empty() {
            service_write(who, &format!("{name}{SIDECAR_SUFFIX}"))?;
        } else {
            service_write(who, &sc.name)?;
        }
    }
    if def.connect.proxy.is_some() {
        // Consul 1.4's managed proxy is an instance named `<name>-proxy`.
        service_write(who, &format!("{name}{MANAGED_SUFFIX}"))?;
    }
    Ok(())
}

/// Check ids the agent derives from a service id (`service:<id>`, `service:<id>:<n>`,
/// `_service_maintenance:<id>`) belong to that service, and `_node_maintenance` to the node's
/// maintenance: an API registration cannot give them to anything else (a check squatting
/// `service:api` would block `api`'s next registration). `service_id` is the check's own
/// service (empty for a node check); `field` names the id in the error.
pub(crate) fn reserved_check_id(id: &str, service_id: &str, field: &str) -> Result<(), AgentError> {
    let owner = if id == super::NODE_MAINTENANCE {
        Some("")
    } else if let Some(rest) = id.strip_prefix(super::MAINTENANCE_PREFIX) {
        Some(rest)
    } else {
        id.strip_prefix("service:")
            .map(|rest| rest.split(':').next().unwrap_or(rest))
    };
    match owner {
        Some(owner) if owner != service_id || id == super::NODE_MAINTENANCE => {
            Err(AgentError::Invalid(structs::ValidationError::new(
                field,
                structs::Problem::Invalid(format!(
                    "{id:?} is reserved for the agent's own check of {}: choose another id",
                    if owner.is_empty() {
                        "the node's maintenance".to_owned()
                    } else {
                        format!("service {owner:?}")
                    }
                )),
            )))
        }
        _ => Ok(()),
    }
}

/// May `who` change local service `svc` (replace, remove, put into maintenance)?
pub(super) fn may_write_service(who: &Resolved, svc: &LocalService) -> Result<(), AgentError> {
    instance_write(who, &svc.service)
}

impl Agent {
    /// May `who` change existing check `check`? Its service's permission (the service as it
    /// is now; the check's recorded name when the service is gone), `node:write` for a node
    /// check.
    pub(super) fn may_write_check(&self, who: &Resolved, check: &LocalCheck) -> Result<(), AgentError> {
        let service_id = &check.check.service_id;
        if service_id.is_empty() {
            return node_write(who, &self.0.config.node);
        }
        match self.0.state.service(service_id) {
            Some(svc) => may_write_service(who, &svc),
            None => service_write(who, &check.check.service_name),
        }
    }

    /// May `who` add a check to local service `service_id` (`""`: a node check)? An unknown
    /// service passes on its id as a name (the registration answers its 400 next).
    pub(super) fn may_add_check(&self, who: &Resolved, service_id: &str) -> Result<(), AgentError> {
        if service_id.is_empty() {
            return node_write(who, &self.0.config.node);
        }
        match self.0.state.service(service_id) {
            Some(svc) => may_write_service(who, &svc),
            None => service_write(who, service_id),
        }
    }

    /// May `who` apply `expanded`: write every instance it registers, and change everything
    /// it replaces: the services at those ids and the checks whose ids it reuses.
    pub(super) fn may_register(&self, who: &Resolved, expanded: &Expanded) -> Result<(), AgentError> {
        let mut instances = vec![(&expanded.service, &expanded.checks)];
        if let Some((proxy, checks)) = &expanded.sidecar {
            instances.push((proxy, checks));
        }
        for (service, checks) in instances {
            instance_write(who, service)?;
            if let Some(existing) = self.0.state.service(&service.id) {
                may_write_service(who, &existing)?;
            }
            for check in checks {
                if let Some(existing) = self.0.state.check(&check.check.check_id) {
                    self.may_write_check(who, &existing)?;
                }
            }
        }
        Ok(())
    }

    /// The check ids a registration gives, against the ids reserved for other owners.
    pub(super) fn reserved_ids(expanded: &Expanded, sidecar_at: &str) -> Result<(), AgentError> {
        let mut instances = vec![(&expanded.service, &expanded.checks, "")];
        if let Some((proxy, checks)) = &expanded.sidecar {
            instances.push((proxy, checks, sidecar_at));
        }
        for (service, checks, at) in instances {
            for check in checks.iter().filter(|c| !c.at.is_empty()) {
                let field = [at, check.at.as_str(), "CheckID"]
                    .iter()
                    .filter(|p| !p.is_empty())
                    .copied()
                    .collect::<Vec<_>>()
                    .join(".");
                reserved_check_id(&check.check.check_id, &service.id, &field)?;
            }
        }
        Ok(())
    }

    /// May `who` remove service `id` (its own sidecars go with it)? An unknown id passes
    /// (404 next).
    pub(super) fn may_remove_service(&self, who: &Resolved, id: &str) -> Result<(), AgentError> {
        match self.0.state.service(id) {
            Some(svc) => may_write_service(who, &svc),
            None => Ok(()),
        }
    }

    /// May `who` change existing check `id` (deregister, report)? An unknown id passes.
    pub(super) fn may_change_check(&self, who: &Resolved, id: &str) -> Result<(), AgentError> {
        match self.0.state.check(id) {
            Some(check) => self.may_write_check(who, &check),
            None => Ok(()),
        }
    }
}
