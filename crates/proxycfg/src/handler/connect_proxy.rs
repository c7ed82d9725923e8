//! The connect-proxy (sidecar) handler.

use super::{HandlerError, KindHandler, upstreams};
use crate::data_sources::*;
use crate::registration::ProxyRegistration;
use crate::snapshot::{ConfigSnapshot, ConnectProxySnapshot, KindSnapshot, UpstreamSnapshot};
use crate::{CorrelationId, Watches};
use std::{collections::BTreeMap, sync::Arc};
use structs::{ConfigEntryKind, DestinationType, MeshGatewayMode, NodeService, TargetId, Token, UpstreamId};

/// Watches roots, leaf, intentions, mesh config, resolved config and (if exposed) HTTP checks;
/// per upstream its discovery chain (or prepared query), then per chain target its healthy
/// connect instances.
pub struct ConnectProxyHandler {
    pub(super) sources: DataSources,
    pub(super) service: Arc<NodeService>,
    pub(super) datacenter: String,
    pub(super) token: Option<Token>,
    /// In transparent mode, the services with a typical instance, once known.
    pub(super) graph_services: Option<Arc<Vec<String>>>,
    /// In transparent mode, every `service-intentions` entry, once known.
    pub(super) graph_intentions: Option<Arc<Vec<Arc<structs::ConfigEntry>>>>,
    /// In transparent mode, the `service-defaults` entries that name a `Destination`, once
    /// the entries are known.
    pub(super) graph_destinations: Option<Vec<Arc<structs::ConfigEntry>>>,
    /// In transparent mode, while some destination is reachable: every
    /// `terminating-gateway` entry (which gateways link it).
    pub(super) graph_gateways: Option<Arc<Vec<Arc<structs::ConfigEntry>>>>,
    /// The datacenters' mesh gateways are followed (some chain has a target elsewhere).
    pub(super) following_gateways: bool,
}

impl ConnectProxyHandler {
    /// A handler for one registration.
    pub fn new(registration: &ProxyRegistration, datacenter: &str, sources: DataSources) -> Self {
        Self {
            sources,
            service: Arc::clone(&registration.service),
            datacenter: datacenter.to_owned(),
            token: registration.token.clone(),
            graph_services: None,
            graph_intentions: None,
            graph_destinations: None,
            graph_gateways: None,
            following_gateways: false,
        }
    }

    fn transparent(&self) -> bool {
        self.service.proxy.mode == structs::ProxyMode::Transparent
    }

    fn upstream_datacenter<'a>(&'a self, id: &'a UpstreamId) -> &'a str {
        if id.datacenter.is_empty() {
            &self.datacenter
        } else {
            &id.datacenter
        }
    }
}

pub(super) fn unexpected(id: &CorrelationId, payload: &UpdatePayload) -> HandlerError {
    HandlerError::UnexpectedPayload {
        id: id.to_string(),
        got: payload.type_name(),
    }
}

impl ConnectProxyHandler {
    /// The watches of the proxy's own service: roots, its leaf, intentions to it, the mesh
    /// config, its resolved central config, and its HTTP checks when they are exposed.
    fn watch_service(&self, watches: &mut Watches) {
        let s = &self.sources;
        let dc = self.datacenter.clone();
        let proxy = &self.service.proxy;
        let dest = proxy.destination_service_name.clone();
        super::watch_roots_and_mesh(s, &dc, watches);
        watches.start(
            &s.leaf,
            CorrelationId::Leaf,
            LeafRequest {
                datacenter: dc.clone(),
                service: dest.clone(),
                dns_sans: Vec::new(),
                token: self.token.clone(),
            },
        );
        watches.start(
            &s.intentions,
            CorrelationId::Intentions,
            IntentionsRequest {
                datacenter: dc.clone(),
                destination: dest.clone(),
            },
        );
        watches.start(
            &s.peer_trust_bundles,
            CorrelationId::PeerTrustBundles,
            PeerTrustBundlesRequest {
                service: dest.clone(),
                token: self.token.clone(),
            },
        );
        watches.start(
            &s.resolved_service_config,
            CorrelationId::ResolvedServiceConfig,
            // The service-level settings only: per-upstream settings reach the proxy through
            // its registration (the config source merges them in), and the snapshot's
            // consumers read the service's protocol alone. Every instance of a service then
            // shares one resolved value, and no proxy holds a config map per upstream.
            ResolvedServiceConfigRequest {
                datacenter: dc,
                name: dest,
                upstreams: Vec::new(),
            },
        );
        if proxy.expose.checks {
            let service_id = if proxy.destination_service_id.is_empty() {
                proxy.destination_service_name.clone()
            } else {
                proxy.destination_service_id.clone()
            };
            watches.start(
                &s.http_checks,
                CorrelationId::ServiceHttpChecks,
                HttpChecksRequest { service_id },
            );
        }
    }

    /// The first watch of an upstream: its discovery chain (whose targets then get health
    /// watches), or its prepared query.
    fn watch_upstream(&self, watches: &mut Watches, id: &Arc<UpstreamId>, upstream: &structs::Upstream) {
        let s = &self.sources;
        let datacenter = self.upstream_datacenter(id).to_owned();
        if !upstream.destination_peer.is_empty() {
            let req = PeeredUpstreamRequest {
                peer: upstream.destination_peer.clone(),
                service: upstream.destination_name.clone(),
                token: self.token.clone(),
            };
            watches.start(&s.peered_upstream, CorrelationId::PeeredUpstream(Arc::clone(id)), req);
            return;
        }
        match upstream.destination_type.effective() {
            DestinationType::Service | DestinationType::Unset => {
                let mesh_gateway = upstream.mesh_gateway.mode.or(self.service.proxy.mesh_gateway.mode);
                let options = upstream.options();
                let req = DiscoveryChainRequest {
                    datacenter,
                    name: upstream.destination_name.clone(),
                    namespace: id.namespace.clone(),
                    override_protocol: options.protocol,
                    override_connect_timeout_ms: options.connect_timeout_ms.unwrap_or(0),
                    override_mesh_gateway: mesh_gateway,
                };
                watches.start(&s.discovery_chain, CorrelationId::DiscoveryChain(Arc::clone(id)), req);
            }
            DestinationType::PreparedQuery => {
                let req = PreparedQueryRequest {
                    datacenter,
                    query: upstream.destination_name.clone(),
                };
                watches.start(&s.prepared_query, CorrelationId::PreparedQuery(Arc::clone(id)), req);
            }
        }
    }
}

impl ConnectProxyHandler {
    /// Watches every `jwt-provider` entry while some intention requires a token, and stops
    /// (forgetting them) when none does.
    fn watch_jwt_providers(
        &self,
        intentions: &[structs::Intention],
        cp: &mut ConnectProxySnapshot,
        watches: &mut Watches,
    ) {
        let id = CorrelationId::ConfigEntryList(ConfigEntryKind::JwtProvider);
        if crate::snapshot::requires_jwt(intentions) {
            watches.ensure(
                &self.sources.config_entry_list,
                id,
                ConfigEntryListRequest::for_proxy(ConfigEntryKind::JwtProvider, self.token.as_ref()),
            );
        } else if watches.cancel(&id) {
            cp.jwt_providers = None;
        }
    }
}

/// The one target a prepared-query upstream's instances are kept under.
fn query_target(upstream: &UpstreamId) -> TargetId {
    TargetId(upstream.to_string().into())
}

impl ConnectProxyHandler {
    /// Sets the chain of the prepared-query upstream `id` from its instances (the service
    /// they are) and the trust domain, so that its listener, cluster and endpoints are built
    /// as any upstream's; nothing for another upstream, or until both are known.
    fn query_chain(
        &self,
        upstreams: &mut Arc<BTreeMap<Arc<UpstreamId>, Arc<UpstreamSnapshot>>>,
        id: &Arc<UpstreamId>,
        roots: Option<&structs::IndexedCaRoots>,
    ) {
        let Some(entry) = upstreams.get(id) else { return };
        let Some(config) = self.service.proxy.upstreams.get(entry.index) else {
            return;
        };
        if config.destination_type.effective() != DestinationType::PreparedQuery {
            return;
        }
        let target = query_target(id);
        let (Some(roots), Some(nodes)) = (roots, entry.endpoints.get(&target)) else {
            return;
        };
        // The service the query's instances serve (a sidecar serves its destination); the
        // query's name while it selects none.
        let service = nodes.first().map_or(config.destination_name.as_str(), |n| {
            if n.service.proxy.destination_service_name.is_empty() {
                n.service.service.as_str()
            } else {
                n.service.proxy.destination_service_name.as_str()
            }
        });
        let options = config.options();
        let chain = structs::CompiledDiscoveryChain::for_prepared_query(
            target,
            &config.destination_name,
            service,
            self.upstream_datacenter(id),
            &roots.trust_domain,
            options.protocol.unwrap_or_default(),
            options
                .connect_timeout_ms
                .unwrap_or(structs::discovery_chain::DEFAULT_CONNECT_TIMEOUT_MS),
        );
        if entry.chain.as_deref() != Some(&chain)
            && let Some(entry) = Arc::make_mut(upstreams).get_mut(id)
        {
            Arc::make_mut(entry).chain = Some(Arc::new(chain));
        }
    }
}

impl ConnectProxyHandler {
    /// True when the upstream at `index` reaches other datacenters' instances directly
    /// (`MeshGateway.Mode` none, or unset as Consul's default), not through mesh gateways.
    fn direct_elsewhere(&self, index: usize) -> bool {
        matches!(
            self.service.proxy.upstream_mesh_gateway_mode(index),
            MeshGatewayMode::None | MeshGatewayMode::Default
        )
    }

    /// Follows the datacenters' mesh gateways while some upstream's chain has a target in
    /// another datacenter reached through them, or a target in a peer reached through this
    /// datacenter's (mode `local`), and gives those targets their endpoints; forgets them
    /// when none has.
    fn follow_gateways(&mut self, cp: &mut ConnectProxySnapshot, watches: &mut Watches) {
        let elsewhere = cp.upstreams.values().any(|u| {
            let local = self.service.proxy.upstream_mesh_gateway_mode(u.index) == MeshGatewayMode::Local;
            !self.direct_elsewhere(u.index)
                && u.chain.as_ref().is_some_and(|c| {
                    c.targets.values().any(|t| {
                        if t.peer.is_empty() {
                            t.datacenter != self.datacenter
                        } else {
                            local
                        }
                    })
                })
        });
        if elsewhere {
            let req = MeshGatewaysRequest {
                datacenter: self.datacenter.clone(),
            };
            watches.ensure(&self.sources.mesh_gateways, CorrelationId::MeshGatewaysByDc, req);
            self.following_gateways = true;
            self.gateway_endpoints(cp);
        } else if self.following_gateways {
            // Its error too goes with it (agent mode serves no gateways yet).
            watches.cancel_where(|id| matches!(id, CorrelationId::MeshGatewaysByDc));
            self.following_gateways = false;
            cp.mesh_gateways = None;
        }
    }

    /// The endpoints of each chain target in another datacenter reached through mesh
    /// gateways: this datacenter's (mode `local`), or the target datacenter's at their `wan`
    /// addresses (`remote`), healthy ones. (In mode `none` its instances are watched as a
    /// local target's are.) A target in a peer in mode `local` goes to this datacenter's
    /// gateways too (none until they are known: never to the peer's directly); in the other
    /// modes it keeps the peer's gateways it was given.
    fn gateway_endpoints(&self, cp: &mut ConnectProxySnapshot) {
        let gateways = cp.mesh_gateways.clone();
        let healthy = |dc: &str| {
            gateways
                .as_ref()
                .and_then(|g| g.get(dc))
                .into_iter()
                .flat_map(|g| g.iter())
                .filter(|n| n.aggregate_status() != structs::HealthStatus::Critical)
        };
        let mut changes = Vec::new();
        for (id, upstream) in cp.upstreams.iter() {
            let Some(chain) = &upstream.chain else { continue };
            let mode = self.service.proxy.upstream_mesh_gateway_mode(upstream.index);
            for (target_id, target) in chain.targets.iter() {
                let peered = !target.peer.is_empty();
                let nodes: Vec<structs::CheckServiceNode> = match mode {
                    MeshGatewayMode::Local if peered => healthy(&self.datacenter).cloned().collect(),
                    _ if peered || target.datacenter == self.datacenter || gateways.is_none() => continue,
                    MeshGatewayMode::Local => healthy(&self.datacenter).cloned().collect(),
                    MeshGatewayMode::Remote => healthy(&target.datacenter)
                        .map(structs::CheckServiceNode::reached_from_afar)
                        .collect(),
                    MeshGatewayMode::None | MeshGatewayMode::Default => continue,
                };
                if upstream.endpoints.get(target_id).is_none_or(|e| **e != nodes) {
                    changes.push((Arc::clone(id), target_id.clone(), Arc::new(nodes)));
                }
            }
        }
        if changes.is_empty() {
            return;
        }
        let upstreams = Arc::make_mut(&mut cp.upstreams);
        for (id, target, nodes) in changes {
            if let Some(entry) = upstreams.get_mut(&id) {
                Arc::make_mut(entry).endpoints.insert(target, nodes);
            }
        }
    }
}

impl ConnectProxyHandler {
    /// What a peer exports for the upstream `id`: its chain (one target: the peer's
    /// service, by its SNI) and the endpoints (the peer's mesh gateways); both forgotten
    /// while the peer does not export it, so its connections fail closed.
    fn apply_peered(
        &mut self,
        cp: &mut ConnectProxySnapshot,
        id: Arc<UpstreamId>,
        peered: Arc<structs::peering::PeeredUpstream>,
        watches: &mut Watches,
    ) -> Result<(), HandlerError> {
        self.apply_peered_chain(cp, id, peered)?;
        // In mesh gateway mode local its connections go through this datacenter's gateways.
        self.follow_gateways(cp, watches);
        Ok(())
    }

    /// What a peer exports for a peer target of `upstream`'s chain (a resolver failing over
    /// or redirecting to the peer).
    fn apply_peer_target(
        &mut self,
        cp: &mut ConnectProxySnapshot,
        upstream: Arc<UpstreamId>,
        target: TargetId,
        peered: Arc<structs::peering::PeeredUpstream>,
        watches: &mut Watches,
    ) {
        Arc::make_mut(&mut cp.peer_targets).insert((Arc::clone(&upstream), target), peered);
        patch_peer_targets(cp, &upstream);
        self.follow_gateways(cp, watches);
    }

    /// [`Self::apply_peered`]'s chain and endpoints (the peer's gateways).
    fn apply_peered_chain(
        &self,
        cp: &mut ConnectProxySnapshot,
        id: Arc<UpstreamId>,
        peered: Arc<structs::peering::PeeredUpstream>,
    ) -> Result<(), HandlerError> {
        let Some(index) = cp.upstreams.get(&id).map(|u| u.index) else {
            return Err(HandlerError::UnknownWatch(
                CorrelationId::PeeredUpstream(id).to_string(),
            ));
        };
        // Nothing the chain is built from moved (the exporter's gateways did, or its
        // instances, which proxies here never dial): only the endpoints change, so the
        // proxy's next build is of its load assignments alone. The entry in `peered` stays
        // the one the chain was built from.
        if let Some(old) = cp.peered.get(&id)
            && same_chain_inputs(old, &peered)
            && let Some(entry) = Arc::make_mut(&mut cp.upstreams).get_mut(&id)
            && let Some(target) = entry.chain.as_ref().and_then(|c| c.targets.keys().next().cloned())
            && let Some(service) = &peered.service
        {
            Arc::make_mut(entry)
                .endpoints
                .insert(target, Arc::new(service.mesh_gateways.clone()));
            return Ok(());
        }
        let config = self.service.proxy.upstreams.get(index);
        let options = config.map(structs::Upstream::options).unwrap_or_default();
        let chain = peered
            .service
            .as_ref()
            .filter(|_| peered.bundle.is_some())
            .map(|service| {
                let protocol = options
                    .protocol
                    .or_else(|| service.protocol.parse().ok())
                    .unwrap_or_default();
                let datacenter = peered
                    .bundle
                    .as_ref()
                    .map(|b| b.datacenter.as_str())
                    .unwrap_or_default();
                let chain = structs::CompiledDiscoveryChain::for_peer(
                    service,
                    &id.peer,
                    datacenter,
                    protocol,
                    options
                        .connect_timeout_ms
                        .unwrap_or(structs::discovery_chain::DEFAULT_CONNECT_TIMEOUT_MS),
                );
                (chain, Arc::new(service.mesh_gateways.clone()))
            });
        let upstreams = Arc::make_mut(&mut cp.upstreams);
        if let Some(entry) = upstreams.get_mut(&id) {
            let entry = Arc::make_mut(entry);
            let mut endpoints = crate::snapshot::TargetEndpoints::default();
            match chain {
                Some((chain, gateways)) => {
                    if let Some(target) = chain.targets.keys().next() {
                        endpoints.insert(target.clone(), gateways);
                    }
                    entry.chain = Some(Arc::new(chain));
                }
                None => entry.chain = None,
            }
            entry.endpoints = endpoints;
        }
        Arc::make_mut(&mut cp.peered).insert(id, peered);
        Ok(())
    }
}

/// Whether two values of what a peer exports build the same chain and TLS: the same bundle,
/// and the same service name, SNI, identities and protocol (its instances and the
/// exporter's gateways may differ: they are the endpoints, or not dialed at all).
fn same_chain_inputs(a: &structs::peering::PeeredUpstream, b: &structs::peering::PeeredUpstream) -> bool {
    let same_service = match (&a.service, &b.service) {
        (Some(x), Some(y)) => {
            x.name == y.name && x.sni == y.sni && x.spiffe_ids == y.spiffe_ids && x.protocol == y.protocol
        }
        (None, None) => true,
        _ => false,
    };
    same_service && a.bundle == b.bundle
}

impl ConnectProxyHandler {
    /// The instances a prepared-query upstream's query selects, and its chain from them.
    fn apply_query_results(
        &self,
        cp: &mut ConnectProxySnapshot,
        upstream: Arc<UpstreamId>,
        nodes: Arc<Vec<structs::CheckServiceNode>>,
        roots: Option<&structs::IndexedCaRoots>,
    ) -> Result<(), HandlerError> {
        let target = query_target(&upstream);
        let upstreams = Arc::make_mut(&mut cp.upstreams);
        match upstreams.get_mut(&upstream) {
            Some(entry) => {
                Arc::make_mut(entry).endpoints.insert(target, nodes);
            }
            None => {
                return Err(HandlerError::UnknownWatch(
                    CorrelationId::PreparedQuery(upstream).to_string(),
                ));
            }
        }
        self.query_chain(&mut cp.upstreams, &upstream, roots);
        Ok(())
    }
}

impl ConnectProxyHandler {
    /// Follows what peers export for the peer targets of `upstream`'s chain (a resolver
    /// failing over to a peer), and forgets the targets it no longer names.
    fn follow_peer_targets(&self, cp: &mut ConnectProxySnapshot, upstream: &Arc<UpstreamId>, watches: &mut Watches) {
        let Some(chain) = cp.upstreams.get(upstream).and_then(|u| u.chain.clone()) else {
            return;
        };
        let named = |target: &TargetId| chain.targets.get(target).is_some_and(|t| !t.peer.is_empty());
        watches.cancel_where(
            |id| matches!(id, CorrelationId::PeerTarget { upstream: u, target } if u == upstream && !named(target)),
        );
        // Written only when a target goes: a copy (the last snapshot shares the map) is a
        // new input to every build, and a transparent proxy follows each implicit
        // upstream's chain whenever its list changes.
        if cp.peer_targets.keys().any(|(u, t)| u == upstream && !named(t)) {
            Arc::make_mut(&mut cp.peer_targets).retain(|(u, t), _| u != upstream || named(t));
        }
        for (target_id, target) in chain.targets.iter().filter(|(_, t)| !t.peer.is_empty()) {
            let req = PeeredUpstreamRequest {
                peer: target.peer.clone(),
                service: target.service.clone(),
                token: self.token.clone(),
            };
            let id = CorrelationId::PeerTarget {
                upstream: Arc::clone(upstream),
                target: target_id.clone(),
            };
            watches.ensure(&self.sources.peered_upstream, id, req);
        }
        patch_peer_targets(cp, upstream);
    }
}

/// Gives the peer targets of `upstream`'s chain what their peers export: the exporter's SNI
/// (the cluster's name), identities and datacenter, and its mesh gateways as endpoints; a
/// target the peer does not export (or whose peering is gone) has none.
fn patch_peer_targets(cp: &mut ConnectProxySnapshot, upstream: &Arc<UpstreamId>) {
    let peer_targets = Arc::clone(&cp.peer_targets);
    // The upstreams are copied only for a chain with a peer target (the last snapshot
    // shares them).
    let Some(chain) = cp.upstreams.get(upstream).and_then(|u| u.chain.clone()) else {
        return;
    };
    if chain.targets.values().all(|t| t.peer.is_empty()) {
        return;
    }
    let Some(entry) = Arc::make_mut(&mut cp.upstreams).get_mut(upstream) else {
        return;
    };
    let mut patched = (*chain).clone();
    let mut endpoints = Vec::new();
    for (target_id, target) in patched.targets.iter_mut().filter(|(_, t)| !t.peer.is_empty()) {
        let known = peer_targets.get(&(Arc::clone(upstream), target_id.clone()));
        let exported = known.and_then(|p| p.service.as_ref().zip(p.bundle.as_ref()));
        match exported {
            Some((service, bundle)) => {
                target.sni = service.sni.clone();
                target.name = service.sni.clone();
                target.spiffe_ids = service.spiffe_ids.clone();
                target.datacenter = bundle.datacenter.clone();
                endpoints.push((target_id.clone(), Arc::new(service.mesh_gateways.clone())));
            }
            None => endpoints.push((target_id.clone(), Arc::new(Vec::new()))),
        }
    }
    let entry = Arc::make_mut(entry);
    if patched != *chain {
        entry.chain = Some(Arc::new(patched));
    }
    for (target, nodes) in endpoints {
        if entry.endpoints.get(&target).is_none_or(|e| **e != *nodes) {
            entry.endpoints.insert(target, nodes);
        }
    }
}

impl KindHandler for ConnectProxyHandler {
    fn initialize(&mut self, watches: &mut Watches) -> KindSnapshot {
        self.watch_service(watches);
        let mut upstreams = BTreeMap::new();
        for (index, upstream) in self.service.proxy.upstreams.iter().enumerate() {
            let id = Arc::new(upstream.id());
            self.watch_upstream(watches, &id, upstream);
            upstreams.insert(id, Arc::new(UpstreamSnapshot::new(index)));
        }
        let transparent = self.transparent();
        if transparent {
            self.watch_service_graph(watches);
        }
        KindSnapshot::ConnectProxy(ConnectProxySnapshot {
            upstreams: Arc::new(upstreams),
            transparent,
            ..Default::default()
        })
    }

    fn handle_update(
        &mut self,
        id: CorrelationId,
        payload: UpdatePayload,
        snapshot: &mut ConfigSnapshot,
        watches: &mut Watches,
    ) -> Result<(), HandlerError> {
        let KindSnapshot::ConnectProxy(cp) = &mut snapshot.kind else {
            return Err(HandlerError::WrongKind);
        };
        match (id, payload) {
            (CorrelationId::Roots, UpdatePayload::CaRoots(roots)) => {
                snapshot.roots = Some(roots);
                // A prepared query's chain names the trust domain.
                let ids: Vec<_> = cp.upstreams.keys().cloned().collect();
                for id in ids {
                    self.query_chain(&mut cp.upstreams, &id, snapshot.roots.as_deref());
                }
            }
            (CorrelationId::Leaf, UpdatePayload::Leaf(leaf)) => cp.leaf = Some(leaf),
            (CorrelationId::PeerTrustBundles, UpdatePayload::PeerTrustBundles(bundles)) => {
                cp.peer_bundles = Some(bundles);
            }
            (CorrelationId::PeeredUpstream(upstream), UpdatePayload::PeeredUpstream(peered)) => {
                self.apply_peered(cp, upstream, peered, watches)?;
            }
            (CorrelationId::PeerTarget { upstream, target }, UpdatePayload::PeeredUpstream(peered)) => {
                self.apply_peer_target(cp, upstream, target, peered, watches);
            }
            (CorrelationId::Intentions, UpdatePayload::Intentions(ixns)) => {
                self.watch_jwt_providers(&ixns, cp, watches);
                cp.intentions = Some(ixns);
            }
            (CorrelationId::ConfigEntryList(ConfigEntryKind::JwtProvider), UpdatePayload::ConfigEntryList(list)) => {
                cp.jwt_providers = Some(list);
            }
            (CorrelationId::MeshConfig, UpdatePayload::ConfigEntry(entry)) => cp.mesh_config = Some(entry),
            (CorrelationId::ResolvedServiceConfig, UpdatePayload::ResolvedServiceConfig(c)) => {
                cp.resolved_config = Some(c);
            }
            (CorrelationId::ServiceHttpChecks, UpdatePayload::HttpChecks(checks)) => cp.http_checks = checks,
            (
                id @ (CorrelationId::ServiceList
                | CorrelationId::ConfigEntryList(
                    ConfigEntryKind::ServiceIntentions
                    | ConfigEntryKind::ServiceDefaults
                    | ConfigEntryKind::TerminatingGateway,
                )
                | CorrelationId::DestinationGateway(_)),
                payload,
            ) if self.transparent() => {
                self.on_graph_update(id, payload, cp, snapshot.intention_default_allow, watches)?
            }
            (CorrelationId::DiscoveryChain(upstream), UpdatePayload::DiscoveryChain(chain)) => {
                let index = cp.upstreams.get(&upstream).map(|u| u.index);
                let direct = index.is_some_and(|i| self.direct_elsewhere(i));
                upstreams::apply_chain(
                    &self.sources,
                    &self.datacenter,
                    direct,
                    self.token.as_ref(),
                    &mut cp.upstreams,
                    Arc::clone(&upstream),
                    chain,
                    watches,
                )?;
                self.follow_peer_targets(cp, &upstream, watches);
                self.follow_gateways(cp, watches);
            }
            (CorrelationId::MeshGatewaysByDc, UpdatePayload::MeshGateways(gateways)) => {
                cp.mesh_gateways = Some(gateways);
                self.gateway_endpoints(cp);
            }
            (CorrelationId::UpstreamTarget { upstream, target }, UpdatePayload::Health(nodes)) => {
                upstreams::apply_target_health(&mut cp.upstreams, upstream, target, nodes)?;
            }
            (CorrelationId::PreparedQuery(upstream), UpdatePayload::Health(nodes)) => {
                self.apply_query_results(cp, upstream, nodes, snapshot.roots.as_deref())?;
            }
            (
                id @ (CorrelationId::Roots
                | CorrelationId::Leaf
                | CorrelationId::Intentions
                | CorrelationId::MeshConfig
                | CorrelationId::ResolvedServiceConfig
                | CorrelationId::ServiceHttpChecks
                | CorrelationId::DiscoveryChain(_)
                | CorrelationId::MeshGatewaysByDc
                | CorrelationId::UpstreamTarget { .. }
                | CorrelationId::PreparedQuery(_)
                | CorrelationId::PeeredUpstream(_)
                | CorrelationId::PeerTarget { .. }
                | CorrelationId::PeerTrustBundles
                | CorrelationId::ConfigEntryList(ConfigEntryKind::JwtProvider)),
                payload,
            ) => return Err(unexpected(&id, &payload)),
            (id, _) => return Err(HandlerError::UnknownWatch(id.to_string())),
        }
        Ok(())
    }
}
