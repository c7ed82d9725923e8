//! Upstreams followed through their discovery chains: what a sidecar does for each of its
//! upstreams and an ingress gateway for each service it exposes.

use super::HandlerError;
use crate::data_sources::{DataSources, HealthRequest};
use crate::snapshot::UpstreamSnapshot;
use crate::{CorrelationId, Watches};
use std::{collections::BTreeMap, sync::Arc};
use structs::{CheckServiceNode, CompiledDiscoveryChain, TargetId, Token, UpstreamId};
use tracing::debug;

/// Upstreams by id.
pub(super) type Upstreams = Arc<BTreeMap<Arc<UpstreamId>, Arc<UpstreamSnapshot>>>;

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

    let watched = |target: &TargetId| {
        chain
            .targets
            .get(target)
            .is_some_and(|t| direct_elsewhere || t.datacenter == datacenter)
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
        .filter(|(_, t)| direct_elsewhere || t.datacenter == datacenter)
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
