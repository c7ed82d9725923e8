//! The ingress-gateway handler.

use super::connect_proxy::unexpected;
use super::{HandlerError, KindHandler, upstreams};
use crate::data_sources::*;
use crate::registration::ProxyRegistration;
use crate::snapshot::{ConfigSnapshot, IngressGatewaySnapshot, KindSnapshot};
use crate::{CorrelationId, Watches};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use structs::{ConfigEntryKind, GatewayService, Protocol, Token, UpstreamId};

pub use structs::config_entry::INGRESS_DOMAIN;

/// Watches roots, its leaf, its config entry, the mesh config and the services it exposes;
/// per exposed service its discovery chain (compiled with the listener's protocol), then per
/// chain target its healthy connect instances.
pub struct IngressGatewayHandler {
    sources: DataSources,
    name: String,
    datacenter: String,
    token: Option<Token>,
    /// Its services' targets in other datacenters are dialled directly (its
    /// `MeshGateway.Mode` none or unset; through mesh gateways is not built for ingress).
    direct_elsewhere: bool,
}

impl IngressGatewayHandler {
    /// A handler for one registration.
    pub fn new(registration: &ProxyRegistration, datacenter: &str, sources: DataSources) -> Self {
        Self {
            sources,
            name: registration.service.service.clone(),
            datacenter: datacenter.to_owned(),
            token: registration.token.clone(),
            direct_elsewhere: matches!(
                registration.service.proxy.mesh_gateway.mode,
                structs::MeshGatewayMode::None | structs::MeshGatewayMode::Default
            ),
        }
    }

    /// (Re)starts the leaf watch: with the hosts it serves as DNS names when a listener
    /// serves TLS from the mesh CA.
    fn watch_leaf(&self, g: &IngressGatewaySnapshot, watches: &mut Watches) {
        let dns_sans = match (g.config(), g.services.as_deref()) {
            (Some(entry), Some(services)) => dns_sans(entry, services, &self.datacenter),
            _ => Vec::new(),
        };
        watches.ensure(
            &self.sources.leaf,
            CorrelationId::Leaf,
            LeafRequest {
                datacenter: self.datacenter.clone(),
                service: self.name.clone(),
                dns_sans,
                token: self.token.clone(),
            },
        );
    }

    /// Follows exactly the services of `services`: a chain watch per new service, and the
    /// chains (and their target watches) of services no longer exposed cancelled.
    fn on_services(&self, services: Arc<Vec<GatewayService>>, g: &mut IngressGatewaySnapshot, watches: &mut Watches) {
        // One chain per service, compiled with the protocol of the first listener exposing
        // it (the entry's validation keeps a service's listeners to one protocol).
        let mut wanted: BTreeMap<Arc<UpstreamId>, Option<Protocol>> = BTreeMap::new();
        for s in services.iter() {
            let id = Arc::new(upstream_id(&s.service));
            wanted.entry(id).or_insert_with(|| s.protocol.parse().ok());
        }
        upstreams::follow_chains(&self.sources, &self.datacenter, wanted, &mut g.upstreams, watches);
        g.services = Some(services);
    }
}

/// The upstream id an exposed service is followed under.
pub fn upstream_id(service: &str) -> UpstreamId {
    UpstreamId {
        destination_type: structs::DestinationType::Service,
        namespace: "default".into(),
        name: service.to_owned(),
        datacenter: String::new(),
        peer: String::new(),
    }
}

/// The host names a service answers to on an ingress listener: its `Hosts`, else
/// `<service>.ingress.*` (any domain, as Consul).
pub fn service_hosts(service: &GatewayService) -> Vec<String> {
    if service.hosts.is_empty() {
        vec![format!("{}.ingress.*", service.service)]
    } else {
        service.hosts.clone()
    }
}

/// The DNS names the gateway's certificate carries when a listener serves TLS from the mesh
/// CA: each such listener's hosts, with default hosts under `ingress.<domain>` and
/// `ingress.<dc>.<domain>`.
pub fn dns_sans(entry: &structs::config_entry::IngressGateway, services: &[GatewayService], dc: &str) -> Vec<String> {
    let mut sans = BTreeSet::new();
    for listener in &entry.listeners {
        let tls = listener.tls.as_ref().unwrap_or(&entry.tls);
        if !tls.enabled || tls.sds.is_some() {
            continue;
        }
        for s in services.iter().filter(|s| s.port == listener.port) {
            if s.hosts.is_empty() {
                sans.insert(format!("{}.ingress.{INGRESS_DOMAIN}", s.service));
                sans.insert(format!("{}.ingress.{dc}.{INGRESS_DOMAIN}", s.service));
            } else {
                // A certificate names hosts, not ports.
                sans.extend(s.hosts.iter().map(|h| structs::config_entry::host_name(h).to_owned()));
            }
        }
    }
    sans.into_iter().collect()
}

impl KindHandler for IngressGatewayHandler {
    fn initialize(&mut self, watches: &mut Watches) -> KindSnapshot {
        super::watch_gateway(&self.sources, &self.datacenter, &self.name, watches);
        watches.start(
            &self.sources.config_entry,
            CorrelationId::GatewayConfig,
            ConfigEntryRequest {
                kind: ConfigEntryKind::IngressGateway,
                name: self.name.clone(),
            },
        );
        let g = IngressGatewaySnapshot::default();
        self.watch_leaf(&g, watches);
        KindSnapshot::IngressGateway(g)
    }

    fn handle_update(
        &mut self,
        id: CorrelationId,
        payload: UpdatePayload,
        snapshot: &mut ConfigSnapshot,
        watches: &mut Watches,
    ) -> Result<(), HandlerError> {
        let KindSnapshot::IngressGateway(g) = &mut snapshot.kind else {
            return Err(HandlerError::WrongKind);
        };
        match (id, payload) {
            (CorrelationId::Roots, UpdatePayload::CaRoots(roots)) => snapshot.roots = Some(roots),
            (CorrelationId::Leaf, UpdatePayload::Leaf(leaf)) => g.leaf = Some(leaf),
            (CorrelationId::MeshConfig, UpdatePayload::ConfigEntry(entry)) => g.mesh_config = Some(entry),
            (CorrelationId::GatewayConfig, UpdatePayload::ConfigEntry(entry)) => {
                g.entry = Some(entry);
                self.watch_leaf(g, watches);
            }
            (CorrelationId::GatewayServices, UpdatePayload::GatewayServices(services)) => {
                self.on_services(services, g, watches);
                self.watch_leaf(g, watches);
            }
            (CorrelationId::DiscoveryChain(upstream), UpdatePayload::DiscoveryChain(chain)) => {
                upstreams::apply_chain(
                    &self.sources,
                    &self.datacenter,
                    self.direct_elsewhere,
                    self.token.as_ref(),
                    &mut g.upstreams,
                    upstream,
                    chain,
                    watches,
                )?;
            }
            (CorrelationId::UpstreamTarget { upstream, target }, UpdatePayload::Health(nodes)) => {
                upstreams::apply_target_health(&mut g.upstreams, upstream, target, nodes)?;
            }
            (
                id @ (CorrelationId::Roots
                | CorrelationId::Leaf
                | CorrelationId::MeshConfig
                | CorrelationId::GatewayConfig
                | CorrelationId::GatewayServices
                | CorrelationId::DiscoveryChain(_)
                | CorrelationId::UpstreamTarget { .. }),
                payload,
            ) => return Err(unexpected(&id, &payload)),
            (id, _) => return Err(HandlerError::UnknownWatch(id.to_string())),
        }
        Ok(())
    }
}
