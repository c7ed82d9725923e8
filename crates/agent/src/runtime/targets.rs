//! Where the checks of API registrations may point ([`crate::check_targets`]): checked at
//! registration (a 400 naming the field), and again for persisted checks at start and at
//! every config load (a check registered before the rules, or whose service changed, that
//! they refuse is dropped with a warning).

use super::{Agent, AgentError};
use crate::acl::Resolved;
use crate::check_targets::{Owner, TargetRules};
use crate::local::{LocalCheck, LocalService, Source};
use crate::sidecar::{Expanded, NewCheck};
use std::collections::BTreeMap;
use structs::agent::CheckKind;
use structs::{NodeService, ValidationError};
use tracing::warn;

impl Agent {
    /// This agent's rules.
    fn target_rules(&self) -> TargetRules<'_> {
        TargetRules {
            advertise: &self.0.config.advertise,
            allowed: &self.0.config.check_allowed_targets,
            protected: &self.0.config.listeners,
        }
    }

    /// `service` as the owner of checks registered by `who`: its own address and port, unless
    /// another local service `who` may not write is there too.
    fn owner_for(&self, who: &Resolved, service: &NodeService) -> Owner {
        let rules = self.target_rules();
        let owner = rules.owner(service);
        let other = self
            .0
            .state
            .services()
            .into_values()
            .find(|s| {
                s.service.id != service.id
                    && owner.same_place(&rules.owner(&s.service))
                    && !who.authz.service_write(&s.service.service)
            })
            .map(|s| s.service.service);
        owner.shared_with(other)
    }

    /// The targets of the checks a registration by `who` adds: the service's, then the
    /// sidecar's (given at `sidecar_at`). Checks the agent makes itself (a sidecar's default
    /// ones) are not limited.
    pub(super) fn may_target(&self, who: &Resolved, expanded: &Expanded, sidecar_at: &str) -> Result<(), AgentError> {
        let mut instances: Vec<(&NodeService, &[NewCheck], &str)> = vec![(&expanded.service, &expanded.checks, "")];
        if let Some((proxy, checks)) = &expanded.sidecar {
            instances.push((proxy, checks, sidecar_at));
        }
        for (service, checks, at) in instances {
            let owner = self.owner_for(who, service);
            for check in checks.iter().filter(|c| !c.at.is_empty()) {
                self.target_rules()
                    .check(&check.kind, Some(&owner))
                    .map_err(|e| e.within(&check.at).within(at))?;
            }
        }
        Ok(())
    }

    /// The target of a check registered on its own by `who` for `service` (`None`: a node
    /// check).
    pub(super) fn may_target_check(
        &self,
        who: &Resolved,
        kind: &CheckKind,
        service: Option<&NodeService>,
    ) -> Result<(), AgentError> {
        let owner = service.map(|s| self.owner_for(who, s));
        Ok(self.target_rules().check(kind, owner.as_ref())?)
    }

    /// Whether a persisted API check may keep its target, against the services being loaded
    /// (a check of a service not among them is decided at the config load).
    pub(super) fn persisted_target(
        &self,
        check: &LocalCheck,
        services: &BTreeMap<&str, &LocalService>,
    ) -> Result<(), ValidationError> {
        let Some(kind) = &check.kind else {
            return Ok(());
        };
        let service_id = &check.check.service_id;
        if service_id.is_empty() {
            return self.target_rules().check(kind, None);
        }
        match services.get(service_id.as_str()) {
            Some(s) => self
                .target_rules()
                .check(kind, Some(&self.target_rules().owner(&s.service))),
            None => Ok(()),
        }
    }

    /// Drops the API checks whose targets the rules refuse, each with a warning (at every
    /// config load, so at start too).
    pub(super) async fn drop_refused_checks(&self) -> Result<(), AgentError> {
        let api_checks = self.0.state.checks_where(|c| c.source == Source::Api);
        if api_checks.is_empty() {
            return Ok(());
        }
        let services = self.0.state.services();
        let services: BTreeMap<&str, &LocalService> = services.iter().map(|(id, s)| (id.as_str(), s)).collect();
        let refused: Vec<(String, ValidationError)> = api_checks
            .into_iter()
            .filter_map(|c| {
                let error = self.persisted_target(&c, &services).err()?;
                Some((c.check.check_id, error))
            })
            .collect();
        for (id, error) in refused {
            warn!(check = %id, %error, "removing a check registered through the API whose target is not allowed");
            self.deregister_check(&id).await?;
        }
        Ok(())
    }
}
