//! The api-gateway handler.

use super::connect_proxy::unexpected;
use super::{HandlerError, KindHandler, upstreams};
use crate::data_sources::*;
use crate::registration::ProxyRegistration;
use crate::snapshot::{API_GATEWAY_ROUTE_KINDS, ApiGatewaySnapshot, ConfigSnapshot, KindSnapshot};
use crate::{CorrelationId, Watches};
use std::collections::BTreeMap;
use std::sync::Arc;
use structs::config_entry::CERTIFICATE_KINDS;
use structs::config_entry::api_gateway_binding::BoundRoute;
use structs::{ConfigEntryKind, Protocol, Token, UpstreamId};

/// Watches roots, its leaf, its `api-gateway` entry, the mesh config, every http-route,
/// tcp-route and certificate entry; binds the routes to its listeners, and per service a
/// bound route sends to follows its discovery chain (compiled with the service's own
/// protocol for http-routes, as tcp for tcp-routes), then per chain target its healthy
/// connect instances.
pub struct ApiGatewayHandler {
    sources: DataSources,
    name: String,
    datacenter: String,
    token: Option<Token>,
}

impl ApiGatewayHandler {
    /// A handler for one registration.
    pub fn new(registration: &ProxyRegistration, datacenter: &str, sources: DataSources) -> Self {
        Self {
            sources,
            name: registration.service.service.clone(),
            datacenter: datacenter.to_owned(),
            token: registration.token.clone(),
        }
    }

    /// Follows exactly the services the bound routes send to: a chain watch per new one,
    /// the chains (and target watches) of services no longer sent to cancelled.
    fn follow_backends(&self, g: &mut ApiGatewaySnapshot, watches: &mut Watches) {
        let Some(binding) = g.binding() else { return };
        // http-routes follow a service's chain as its own protocol compiles it (an http2 or
        // grpc service keeps its HTTP/2 cluster; a tcp service is plain TLS, which the
        // router's HTTP/1.1 crosses as well); tcp-routes as tcp (routers and splitters
        // skipped: a connection cannot be routed by request).
        let mut wanted: BTreeMap<Arc<UpstreamId>, Option<Protocol>> = BTreeMap::new();
        for route in binding.listeners.iter().flat_map(|l| &l.routes) {
            match route {
                BoundRoute::Http(..) => {
                    if let Some((r, _)) = route.http() {
                        for s in r.rules.iter().flat_map(|rule| &rule.services) {
                            wanted.insert(Arc::new(backend_id(&s.name)), None);
                        }
                    }
                }
                BoundRoute::Tcp(_) => {
                    for s in route.tcp().map(|r| r.services.as_slice()).unwrap_or_default() {
                        // A service both kinds send to is compiled as its own: its chain's
                        // resolver serves a tcp listener too.
                        wanted
                            .entry(Arc::new(backend_id(&s.name)))
                            .or_insert(Some(Protocol::Tcp));
                    }
                }
            }
        }
        upstreams::follow_chains(&self.sources, &self.datacenter, wanted, &mut g.upstreams, watches);
    }
}

/// The upstream id a backend service is followed under.
pub fn backend_id(service: &str) -> UpstreamId {
    super::ingress_upstream_id(service)
}

impl KindHandler for ApiGatewayHandler {
    fn initialize(&mut self, watches: &mut Watches) -> KindSnapshot {
        super::watch_roots_and_mesh(&self.sources, &self.datacenter, watches);
        watches.start(
            &self.sources.config_entry,
            CorrelationId::GatewayConfig,
            ConfigEntryRequest {
                kind: ConfigEntryKind::ApiGateway,
                name: self.name.clone(),
            },
        );
        for kind in API_GATEWAY_ROUTE_KINDS.into_iter().chain(CERTIFICATE_KINDS) {
            watches.start(
                &self.sources.config_entry_list,
                CorrelationId::ConfigEntryList(kind),
                ConfigEntryListRequest::for_proxy(kind, self.token.as_ref()),
            );
        }
        watches.start(
            &self.sources.leaf,
            CorrelationId::Leaf,
            LeafRequest {
                datacenter: self.datacenter.clone(),
                service: self.name.clone(),
                dns_sans: Vec::new(),
                token: self.token.clone(),
            },
        );
        KindSnapshot::ApiGateway(ApiGatewaySnapshot::default())
    }

    fn handle_update(
        &mut self,
        id: CorrelationId,
        payload: UpdatePayload,
        snapshot: &mut ConfigSnapshot,
        watches: &mut Watches,
    ) -> Result<(), HandlerError> {
        let KindSnapshot::ApiGateway(g) = &mut snapshot.kind else {
            return Err(HandlerError::WrongKind);
        };
        match (id, payload) {
            (CorrelationId::Roots, UpdatePayload::CaRoots(roots)) => snapshot.roots = Some(roots),
            (CorrelationId::Leaf, UpdatePayload::Leaf(leaf)) => g.leaf = Some(leaf),
            (CorrelationId::MeshConfig, UpdatePayload::ConfigEntry(entry)) => g.mesh_config = Some(entry),
            (CorrelationId::GatewayConfig, UpdatePayload::ConfigEntry(entry)) => {
                g.entry = Some(entry);
                self.follow_backends(g, watches);
            }
            (CorrelationId::ConfigEntryList(kind), UpdatePayload::ConfigEntryList(list))
                if API_GATEWAY_ROUTE_KINDS.contains(&kind) =>
            {
                g.routes.insert(kind, list);
                self.follow_backends(g, watches);
            }
            (CorrelationId::ConfigEntryList(kind), UpdatePayload::ConfigEntryList(list))
                if CERTIFICATE_KINDS.contains(&kind) =>
            {
                g.certificates.insert(kind, list);
            }
            (CorrelationId::DiscoveryChain(upstream), UpdatePayload::DiscoveryChain(chain)) => {
                upstreams::apply_chain(
                    &self.sources,
                    &self.datacenter,
                    true,
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
                | CorrelationId::ConfigEntryList(_)
                | CorrelationId::DiscoveryChain(_)
                | CorrelationId::UpstreamTarget { .. }),
                payload,
            ) => return Err(unexpected(&id, &payload)),
            (id, _) => return Err(HandlerError::UnknownWatch(id.to_string())),
        }
        Ok(())
    }
}
