//! The terminating-gateway handler.

use super::connect_proxy::unexpected;
use super::{HandlerError, KindHandler};
use crate::data_sources::*;
use crate::registration::ProxyRegistration;
use crate::snapshot::{ConfigSnapshot, KindSnapshot, LinkedServiceSnapshot, TerminatingGatewaySnapshot};
use crate::{CorrelationId, Watches};
use std::collections::BTreeMap;
use std::sync::Arc;
use structs::{GatewayService, Token};

/// Watches roots, the mesh config and the services it represents; per represented service
/// its leaf certificate (the gateway acts as that service to the mesh), the intentions to it
/// (the gateway enforces them), its central config (protocol), its resolver (subsets) and its
/// healthy instances.
pub struct TerminatingGatewayHandler {
    sources: DataSources,
    name: String,
    datacenter: String,
    token: Option<Token>,
}

impl TerminatingGatewayHandler {
    /// A handler for one registration.
    pub fn new(registration: &ProxyRegistration, datacenter: &str, sources: DataSources) -> Self {
        Self {
            sources,
            name: registration.service.service.clone(),
            datacenter: datacenter.to_owned(),
            token: registration.token.clone(),
        }
    }

    fn watch_service(&self, service: &str, watches: &mut Watches) {
        let s = &self.sources;
        let dc = &self.datacenter;
        watches.ensure(
            &s.leaf,
            CorrelationId::GatewayServiceLeaf {
                service: service.to_owned(),
            },
            LeafRequest {
                datacenter: dc.clone(),
                service: service.to_owned(),
                dns_sans: Vec::new(),
                token: self.token.clone(),
            },
        );
        watches.ensure(
            &s.intentions,
            CorrelationId::GatewayServiceIntentions {
                service: service.to_owned(),
            },
            IntentionsRequest {
                datacenter: dc.clone(),
                destination: service.to_owned(),
            },
        );
        watches.ensure(
            &s.resolved_service_config,
            CorrelationId::GatewayServiceConfig {
                service: service.to_owned(),
            },
            ResolvedServiceConfigRequest {
                datacenter: dc.clone(),
                name: service.to_owned(),
                upstreams: Vec::new(),
            },
        );
        watches.ensure(
            &s.config_entry,
            CorrelationId::GatewayServiceResolver {
                service: service.to_owned(),
            },
            ConfigEntryRequest {
                kind: structs::ConfigEntryKind::ServiceResolver,
                name: service.to_owned(),
            },
        );
        watches.ensure(
            &s.health,
            CorrelationId::GatewayServiceHealth {
                service: service.to_owned(),
            },
            HealthRequest {
                datacenter: dc.clone(),
                service: service.to_owned(),
                // The instances themselves: they are outside the mesh.
                connect: false,
                passing_only: false,
                healthy_only: true,
                filter: String::new(),
                kind: None,
                token: self.token.clone(),
            },
        );
    }

    fn on_services(
        &self,
        services: Arc<Vec<GatewayService>>,
        g: &mut TerminatingGatewaySnapshot,
        watches: &mut Watches,
    ) {
        let wanted: BTreeMap<&str, &GatewayService> = services.iter().map(|s| (s.service.as_str(), s)).collect();
        watches.cancel_where(|id| match id {
            CorrelationId::GatewayServiceLeaf { service }
            | CorrelationId::GatewayServiceIntentions { service }
            | CorrelationId::GatewayServiceConfig { service }
            | CorrelationId::GatewayServiceResolver { service }
            | CorrelationId::GatewayServiceHealth { service } => !wanted.contains_key(service.as_str()),
            _ => false,
        });
        let linked = Arc::make_mut(&mut g.linked);
        linked.retain(|name, _| wanted.contains_key(name.as_str()));
        for (name, link) in wanted {
            self.watch_service(name, watches);
            match linked.get_mut(name) {
                Some(existing) if existing.link == *link => {}
                Some(existing) => Arc::make_mut(existing).link = link.clone(),
                None => {
                    linked.insert(name.to_owned(), Arc::new(LinkedServiceSnapshot::new(link.clone())));
                }
            }
        }
        g.services = Some(services);
    }
}

/// The linked service an update is for, or the error naming the watch.
fn linked<'a>(
    g: &'a mut TerminatingGatewaySnapshot,
    service: &str,
    id: impl FnOnce() -> CorrelationId,
) -> Result<&'a mut LinkedServiceSnapshot, HandlerError> {
    match Arc::make_mut(&mut g.linked).get_mut(service) {
        Some(s) => Ok(Arc::make_mut(s)),
        None => Err(HandlerError::UnknownWatch(id().to_string())),
    }
}

impl KindHandler for TerminatingGatewayHandler {
    fn initialize(&mut self, watches: &mut Watches) -> KindSnapshot {
        super::watch_gateway(&self.sources, &self.datacenter, &self.name, watches);
        KindSnapshot::TerminatingGateway(TerminatingGatewaySnapshot::default())
    }

    fn handle_update(
        &mut self,
        id: CorrelationId,
        payload: UpdatePayload,
        snapshot: &mut ConfigSnapshot,
        watches: &mut Watches,
    ) -> Result<(), HandlerError> {
        let KindSnapshot::TerminatingGateway(g) = &mut snapshot.kind else {
            return Err(HandlerError::WrongKind);
        };
        match (id, payload) {
            (CorrelationId::Roots, UpdatePayload::CaRoots(roots)) => snapshot.roots = Some(roots),
            (CorrelationId::MeshConfig, UpdatePayload::ConfigEntry(entry)) => g.mesh_config = Some(entry),
            (CorrelationId::GatewayServices, UpdatePayload::GatewayServices(services)) => {
                self.on_services(services, g, watches);
            }
            (CorrelationId::GatewayServiceLeaf { service }, UpdatePayload::Leaf(leaf)) => {
                linked(g, &service, || CorrelationId::GatewayServiceLeaf {
                    service: service.clone(),
                })?
                .leaf = Some(leaf);
            }
            (CorrelationId::GatewayServiceIntentions { service }, UpdatePayload::Intentions(ixns)) => {
                linked(g, &service, || CorrelationId::GatewayServiceIntentions {
                    service: service.clone(),
                })?
                .intentions = Some(ixns);
            }
            (CorrelationId::GatewayServiceConfig { service }, UpdatePayload::ResolvedServiceConfig(c)) => {
                linked(g, &service, || CorrelationId::GatewayServiceConfig {
                    service: service.clone(),
                })?
                .config = Some(c);
            }
            (CorrelationId::GatewayServiceResolver { service }, UpdatePayload::ConfigEntry(entry)) => {
                linked(g, &service, || CorrelationId::GatewayServiceResolver {
                    service: service.clone(),
                })?
                .resolver = Some(entry);
            }
            (CorrelationId::GatewayServiceHealth { service }, UpdatePayload::Health(nodes)) => {
                linked(g, &service, || CorrelationId::GatewayServiceHealth {
                    service: service.clone(),
                })?
                .endpoints = Some(nodes);
            }
            (
                id @ (CorrelationId::Roots
                | CorrelationId::MeshConfig
                | CorrelationId::GatewayServices
                | CorrelationId::GatewayServiceLeaf { .. }
                | CorrelationId::GatewayServiceIntentions { .. }
                | CorrelationId::GatewayServiceConfig { .. }
                | CorrelationId::GatewayServiceResolver { .. }
                | CorrelationId::GatewayServiceHealth { .. }),
                payload,
            ) => return Err(unexpected(&id, &payload)),
            (id, _) => return Err(HandlerError::UnknownWatch(id.to_string())),
        }
        Ok(())
    }
}
