//! The config entries a chain is compiled from.

use crate::ChainError;
use std::sync::Arc;
use structs::central_config::CentralConfig;
use structs::config_entry::{ProxyDefaults, ServiceResolver, ServiceRouter, ServiceSplitter};
use structs::{ConfigEntry, ConfigEntryKind, Protocol};

/// The routing entries of a datacenter, as lists by kind (the shape both the catalog's
/// event publisher and the agent cache hold them in). Lookups scan: a chain touches a
/// handful of names.
#[derive(Debug, Clone, Copy, Default)]
pub struct Entries<'a> {
    /// The global proxy-defaults entry.
    pub proxy_defaults: Option<&'a ProxyDefaults>,
    /// Every service-defaults entry.
    pub service_defaults: &'a [Arc<ConfigEntry>],
    /// Every service-resolver entry.
    pub resolvers: &'a [Arc<ConfigEntry>],
    /// Every service-router entry.
    pub routers: &'a [Arc<ConfigEntry>],
    /// Every service-splitter entry.
    pub splitters: &'a [Arc<ConfigEntry>],
    /// Every service-intentions entry (only write-time checks read them).
    pub intentions: &'a [Arc<ConfigEntry>],
}

impl<'a> Entries<'a> {
    /// The protocol of `service`.
    pub fn protocol_of(&self, service: &str) -> Protocol {
        CentralConfig::new(self.proxy_defaults, self.service_defaults).protocol_of(service)
    }

    /// The service-resolver of `service`.
    pub fn resolver(&self, service: &str) -> Option<&'a ServiceResolver> {
        self.resolvers.iter().find_map(|e| match &**e {
            ConfigEntry::ServiceResolver(r) if r.name == service => Some(r),
            _ => None,
        })
    }

    /// The service-router of `service`.
    pub fn router(&self, service: &str) -> Option<&'a ServiceRouter> {
        self.routers.iter().find_map(|e| match &**e {
            ConfigEntry::ServiceRouter(r) if r.name == service => Some(r),
            _ => None,
        })
    }

    /// The service-splitter of `service`.
    pub fn splitter(&self, service: &str) -> Option<&'a ServiceSplitter> {
        self.splitters.iter().find_map(|e| match &**e {
            ConfigEntry::ServiceSplitter(s) if s.name == service => Some(s),
            _ => None,
        })
    }

    /// Names of every service a routing entry (or a service-defaults) is about.
    pub(crate) fn routing_names(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.resolvers
            .iter()
            .chain(self.routers)
            .chain(self.splitters)
            .chain(self.service_defaults)
            .map(|e| e.name())
    }

    /// The L7 problem of service-intentions entry `name`, if any: permissions on a service
    /// that does not speak HTTP.
    fn intention_problem(&self, name: &str) -> Option<(usize, Protocol)> {
        self.intentions.iter().find_map(|entry| match &**entry {
            ConfigEntry::ServiceIntentions(si) if si.name == name => {
                let i = si.sources.iter().position(|s| !s.permissions.is_empty())?;
                let protocol = self.protocol_of(&si.name);
                (!protocol.is_http()).then_some((i, protocol))
            }
            _ => None,
        })
    }

    /// Every service-intentions entry with L7 permissions is for an HTTP service, unless it
    /// already was not in `before`.
    pub(crate) fn check_intentions(&self, before: &Entries<'_>) -> Result<(), ChainError> {
        for entry in self.intentions {
            let ConfigEntry::ServiceIntentions(si) = &**entry else {
                continue;
            };
            let Some((i, protocol)) = self.intention_problem(&si.name) else {
                continue;
            };
            if before.intention_problem(&si.name).is_none() {
                return Err(ChainError::new(
                    ConfigEntryKind::ServiceIntentions,
                    &si.name,
                    format!("Sources[{i}].Permissions"),
                    format!(
                        "L7 permissions need service {:?} to speak http, http2 or grpc, but its protocol is {protocol} \
                         (set Protocol in its service-defaults)",
                        si.name
                    ),
                ));
            }
        }
        Ok(())
    }
}
