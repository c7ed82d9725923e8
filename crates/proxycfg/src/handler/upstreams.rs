//! Upstreams followed through their discovery chains: what a sidecar does for each of its
//! upstreams, an ingress gateway for each service it exposes and an API gateway for each
//! service its routes send to.

use super::HandlerError;
use crate::data_sources::{DataSources, DiscoveryChainRequest, HealthRequest};
use crate::snapshot::UpstreamSnapshot;
use crate::{CorrelationId, Watches};
use std::{collections::BTreeMap, sync::Arc};
use structs::{CheckServiceNode, CompiledDiscoveryChain, MeshGatewayMode, Protocol, TargetId, Token, UpstreamId};
use tracing::debug;

/// Upstreams by id.
pub(super) type Upstreams = Arc<BTreeMap<Arc<UpstreamId>, Arc<UpstreamSnapshot>>>;

/// Follows exactly the services of `wanted` (by id, each compiled with its protocol
/// override), as a gateway does: a chain watch per new one, or per one now compiled another
/// way (its old targets' watches and snapshot dropped); the chains and target watches of
/// services no longer wanted cancelled.
pub(super) fn follow_chains(
    sources: &DataSources,
    datacenter: &str,
    wanted: BTreeMap<Arc<UpstreamId>, Option<Protocol>>,
    upstreams: &mut Upstreams,
    watches: &mut Watches,
) {
    watches.cancel_where(|id| match id {
        CorrelationId::DiscoveryChain(u) | CorrelationId::UpstreamTarget { upstream: u, .. } => !wanted.contains_key(u),
        _ => false,
    });
    let map = Arc::make_mut(upstreams);
    map.retain(|id, _| wanted.contains_key(id));
    for (id, protocol) in wanted {
        let req = DiscoveryChainRequest {
            datacenter: datacenter.to_owned(),
            name: id.name.clone(),
            namespace: id.namespace.clone(),
            override_protocol: protocol,
            override_connect_timeout_ms: 0,
            override_mesh_gateway: MeshGatewayMode::Default,
        };
        if watches.ensure(
            &sources.discovery_chain,
            CorrelationId::DiscoveryChain(Arc::clone(&id)),
            req,
        ) {
            watches.cancel_where(|w| matches!(w, CorrelationId::UpstreamTarget { upstream, .. } if *upstream == id));
            map.insert(id, Arc::new(UpstreamSnapshot::new(usize::MAX)));
        }
    }
}

/// Applies a new chain of `upstream_id`: cancels exactly the target watches it no longer
/// names, and starts (or keeps) one health watch per target in `datacenter`, and per target
/// elsewhere too when `direct_elsewhere` (`MeshGateway.Mode` none: its instances are dialled
/// directly; otherwise it is reached through mesh gateways: see the connect-proxy handler).
#[allow(clippy::too_many_arguments)]
pub(super) fn apply_chain(
    sources: &DataSources,
    datacenter: &str,
    direct_elsewhere: bool,
    token: Option<&Token>,
    upstreams: &mut Upstreams,
    upstream_id: Arc<UpstreamId>,
    chain: Arc<CompiledDiscoveryChain>,
    watches: &mut Watches,
) -> Result<(), HandlerError> {
    let upstreams = Arc::make_mut(upstreams);
    let Some(entry) = upstreams.get_mut(&upstream_id) else {
        return Err(HandlerError::UnknownWatch(
            CorrelationId::DiscoveryChain(upstream_id).to_string(),
        ));
    };
    let entry = Arc::make_mut(entry);

    // A peer's target has no health watch: what the peer exports is its instances (see the
    // connect-proxy handler); elsewhere it has none and fails closed.
    let watched = |target: &TargetId| {
        chain
            .targets
            .get(target)
            .is_some_and(|t| t.peer.is_empty() && (direct_elsewhere || t.datacenter == datacenter))
    };
    watches.cancel_where(|id| {
        matches!(id, CorrelationId::UpstreamTarget { upstream, target }
            if *upstream == upstream_id && !watched(target))
    });
    entry.endpoints.retain(|target, _| chain.targets.contains_key(target));

    // One health watch per target; restarted only if what it selects changed.
    for (target_id, target) in chain
        .targets
        .iter()
        .filter(|(_, t)| t.peer.is_empty() && (direct_elsewhere || t.datacenter == datacenter))
    {
        let id = CorrelationId::UpstreamTarget {
            upstream: Arc::clone(&upstream_id),
            target: target_id.clone(),
        };
        let req = HealthRequest {
            datacenter: target.datacenter.clone(),
            service: target.service.clone(),
            connect: true,
            // Critical instances never get traffic; warning ones do unless the subset says
            // OnlyPassing (Consul's rule).
            passing_only: target.subset.only_passing,
            healthy_only: true,
            filter: target.subset.filter.clone(),
            kind: None,
            token: token.cloned(),
        };
        if watches.ensure(&sources.health, id, req) {
            // A restarted target must not keep endpoints selected the old way.
            entry.endpoints.remove(target_id);
        }
    }
    debug!(upstream = %upstream_id, targets = chain.targets.len(), "discovery chain applied");
    entry.chain = Some(chain);
    Ok(())
}

/// Stores the instances of one chain target.
pub(super) fn apply_target_health(
    upstreams: &mut Upstreams,
    upstream: Arc<UpstreamId>,
    target: TargetId,
    nodes: Arc<Vec<CheckServiceNode>>,
) -> Result<(), HandlerError> {
    let map = Arc::make_mut(upstreams);
    let entry = map
        .get_mut(&upstream)
        .filter(|u| u.chain.as_ref().is_some_and(|c| c.targets.contains_key(&target)));
    match entry {
        Some(entry) => {
            Arc::make_mut(entry).endpoints.insert(target, nodes);
            Ok(())
        }
        None => Err(HandlerError::UnknownWatch(
            CorrelationId::UpstreamTarget { upstream, target }.to_string(),
        )),
    }
}
