//! Registrations that come from `-config-file`: loaded at start and replaced on SIGHUP.

use super::{Agent, AgentError};
use crate::local::Source;
use crate::sidecar;
use std::collections::{BTreeMap, BTreeSet};
use structs::agent::{CheckType, ServiceDefinition};
use structs::{Problem, ValidationError};
use tracing::warn;

impl Agent {
    /// Replaces the registrations that came from config files with `services` and `checks`
    /// (start and SIGHUP). Everything is checked first: one bad definition changes nothing.
    pub async fn load_config(
        &self,
        services: Vec<ServiceDefinition>,
        checks: Vec<CheckType>,
    ) -> Result<(), AgentError> {
        for (i, def) in services.iter().enumerate() {
            sidecar::expand(def, &BTreeMap::new(), &self.0.config.sidecar_ports)
                .map_err(|e| e.within(&format!("services[{i}]")))?;
        }
        for (i, def) in checks.iter().enumerate() {
            let at = format!("checks[{i}]");
            if def.name.is_empty() {
                return Err(ValidationError::new(format!("{at}.Name"), Problem::Required("")).into());
            }
            def.kind().map_err(|e| e.within(&at))?;
        }
        let wanted: BTreeSet<&str> = services.iter().map(|d| d.instance_id()).collect();
        let stale: Vec<String> = self.0.state.service_ids_where(|s| {
            s.source == Source::Config && s.sidecar_of.is_none() && !wanted.contains(s.service.id.as_str())
        });
        for id in stale {
            self.deregister_service(&id).await?;
        }
        for def in services {
            self.register_service(def, Source::Config, true).await?;
        }
        let check_ids: BTreeSet<&str> = checks
            .iter()
            .map(|c| {
                if c.given_id().is_empty() {
                    c.name.as_str()
                } else {
                    c.given_id()
                }
            })
            .collect();
        let stale_checks: Vec<String> = self
            .0
            .state
            .checks_where(|c| {
                c.source == Source::Config
                    && c.check.service_id.is_empty()
                    && !check_ids.contains(c.check.check_id.as_str())
            })
            .into_iter()
            .map(|c| c.check.check_id)
            .collect();
        for id in stale_checks {
            self.deregister_check(&id).await?;
        }
        for def in checks {
            self.register_check(def, Source::Config).await?;
        }
        self.drop_orphan_checks().await?;
        self.drop_refused_checks().await
    }

    /// Removes checks whose service is not registered (persisted checks of a service that a
    /// config file no longer defines), each with a log line.
    pub(super) async fn drop_orphan_checks(&self) -> Result<(), AgentError> {
        let orphans = self.0.state.orphan_checks();
        for c in orphans {
            warn!(check = %c.check.check_id, service = %c.check.service_id, "removing a check whose service is not registered");
            self.deregister_check(&c.check.check_id).await?;
        }
        Ok(())
    }
}
