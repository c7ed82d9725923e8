//! The mesh-gateway handler: what a gateway routing mTLS connections by SNI needs to know:
//! this datacenter's services and their instances, and the other datacenters' gateways.

use super::connect_proxy::unexpected;
use super::{HandlerError, KindHandler};
use crate::data_sources::*;
use crate::registration::ProxyRegistration;
use crate::snapshot::{ConfigSnapshot, KindSnapshot, MeshGatewaySnapshot};
use crate::{CorrelationId, Watches};
use std::collections::BTreeSet;
use std::sync::Arc;
use structs::{ConfigEntryKind, Token};

/// Watches roots, the mesh config, every service name with a typical instance, every
/// resolver, the other datacenters' mesh gateways; per service, its healthy connect
/// instances (the sidecars its connections go to).
pub struct MeshGatewayHandler {
    sources: DataSources,
    datacenter: String,
    token: Option<Token>,
}

impl MeshGatewayHandler {
    /// A handler for one registration.
    pub fn new(registration: &ProxyRegistration, datacenter: &str, sources: DataSources) -> Self {
        Self {
            sources,
            datacenter: datacenter.to_owned(),
            token: registration.token.clone(),
        }
    }

    /// Follows the connect instances of every service in `services` and of no other; drops
    /// the instances of the services gone.
    fn on_services(&self, services: Arc<Vec<String>>, g: &mut MeshGatewaySnapshot, watches: &mut Watches) {
        let wanted: BTreeSet<&str> = services.iter().map(String::as_str).collect();
        watches.cancel_where(|id| match id {
            CorrelationId::GatewayServiceHealth { service } => !wanted.contains(service.as_str()),
            _ => false,
        });
        if g.groups.keys().any(|s| !wanted.contains(s.as_str())) {
            Arc::make_mut(&mut g.groups).retain(|s, _| wanted.contains(s.as_str()));
        }
        for service in &wanted {
            watches.ensure(
                &self.sources.health,
                CorrelationId::GatewayServiceHealth {
                    service: (*service).to_owned(),
                },
                HealthRequest {
                    datacenter: self.datacenter.clone(),
                    service: (*service).to_owned(),
                    // Where its mTLS connections end: its sidecars (or itself if native).
                    connect: true,
                    passing_only: false,
                    healthy_only: true,
                    filter: String::new(),
                    kind: None,
                    token: self.token.clone(),
                },
            );
        }
        g.services = Some(services);
    }
}

impl KindHandler for MeshGatewayHandler {
    fn initialize(&mut self, watches: &mut Watches) -> KindSnapshot {
        super::watch_roots_and_mesh(&self.sources, &self.datacenter, watches);
        watches.start(
            &self.sources.service_list,
            CorrelationId::ServiceList,
            ServiceListRequest {
                datacenter: self.datacenter.clone(),
                typical_only: true,
            },
        );
        watches.start(
            &self.sources.mesh_gateways,
            CorrelationId::MeshGatewaysByDc,
            MeshGatewaysRequest {
                datacenter: self.datacenter.clone(),
            },
        );
        watches.start(
            &self.sources.config_entry_list,
            CorrelationId::ConfigEntryList(ConfigEntryKind::ServiceResolver),
            ConfigEntryListRequest::shared(ConfigEntryKind::ServiceResolver),
        );
        // Which services are exported to which peers: their peered SNIs are routed too.
        watches.start(
            &self.sources.config_entry_list,
            CorrelationId::ConfigEntryList(ConfigEntryKind::ExportedServices),
            ConfigEntryListRequest::for_proxy(ConfigEntryKind::ExportedServices, self.token.as_ref()),
        );
        // Where the peering calls go, when they cross the gateways.
        watches.start(
            &self.sources.peering_servers,
            CorrelationId::PeeringServers,
            PeeringServersRequest::default(),
        );
        KindSnapshot::MeshGateway(MeshGatewaySnapshot::default())
    }

    fn handle_update(
        &mut self,
        id: CorrelationId,
        payload: UpdatePayload,
        snapshot: &mut ConfigSnapshot,
        watches: &mut Watches,
    ) -> Result<(), HandlerError> {
        let KindSnapshot::MeshGateway(g) = &mut snapshot.kind else {
            return Err(HandlerError::WrongKind);
        };
        match (id, payload) {
            (CorrelationId::Roots, UpdatePayload::CaRoots(roots)) => snapshot.roots = Some(roots),
            (CorrelationId::MeshConfig, UpdatePayload::ConfigEntry(entry)) => g.mesh_config = Some(entry),
            (CorrelationId::ServiceList, UpdatePayload::ServiceList(services)) => {
                self.on_services(services, g, watches);
            }
            (
                CorrelationId::ConfigEntryList(ConfigEntryKind::ServiceResolver),
                UpdatePayload::ConfigEntryList(entries),
            ) => g.resolvers = Some(entries),
            (
                CorrelationId::ConfigEntryList(ConfigEntryKind::ExportedServices),
                UpdatePayload::ConfigEntryList(entries),
            ) => g.exports = entries,
            (CorrelationId::MeshGatewaysByDc, UpdatePayload::MeshGateways(remote)) => g.remote = Some(remote),
            (CorrelationId::PeeringServers, UpdatePayload::PeeringServers(servers)) => {
                g.peering_servers = Some(servers)
            }
            (CorrelationId::GatewayServiceHealth { service }, UpdatePayload::Health(nodes)) => {
                if !g.services.as_ref().is_some_and(|s| s.contains(&service)) {
                    return Err(HandlerError::UnknownWatch(
                        CorrelationId::GatewayServiceHealth { service }.to_string(),
                    ));
                }
                let groups = &mut g.groups;
                match (nodes.is_empty(), groups.get(&service)) {
                    (true, None) => {}
                    (true, Some(_)) => {
                        Arc::make_mut(groups).remove(&service);
                    }
                    (false, _) => {
                        Arc::make_mut(groups).insert(service, nodes);
                    }
                }
            }
            (
                id @ (CorrelationId::Roots
                | CorrelationId::MeshConfig
                | CorrelationId::ServiceList
                | CorrelationId::MeshGatewaysByDc
                | CorrelationId::PeeringServers
                | CorrelationId::ConfigEntryList(
                    ConfigEntryKind::ServiceResolver | ConfigEntryKind::ExportedServices,
                )
                | CorrelationId::GatewayServiceHealth { .. }),
                payload,
            ) => return Err(unexpected(&id, &payload)),
            (id, _) => return Err(HandlerError::UnknownWatch(id.to_string())),
        }
        Ok(())
    }
}
