//! Dry runs (`PUT /v1/config?dry-run`): the snapshot a sidecar would have if the catalog
//! were `after` instead of `before`, computed by the same functions the `Server*` sources
//! derive their values with — discovery chains, their targets' instances, intentions, the
//! resolved service config — without starting a watch. A registration's dry run changes
//! instances; a config write's, chains and what they select.
//!
//! Each part is first derived from `before` and compared with the proxy's snapshot: a part
//! that does not come out the same (the snapshot is behind the catalog, or was built in a way
//! this module does not redo: a prepared-query upstream, a target in another datacenter) is
//! not simulated, and the answer says so, rather than reporting a change that is not the
//! write's. Gateways are not simulated (said too).

use crate::chain::ChainInputs;
use catalog::publisher::{Payload, payload};
use catalog::{State, Topic};
use proxycfg::data_sources::{DiscoveryChainRequest, HealthRequest};
use proxycfg::snapshot::{ConfigSnapshot, KindSnapshot, UpstreamSnapshot};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use structs::config_entry::ConfigEntryKind;
use structs::{CompiledDiscoveryChain, DestinationType, ServiceKind};

/// What a proxy would become.
#[derive(Debug, Default)]
pub struct WhatIf {
    /// The snapshot it would have; `None` when nothing this module simulates changes.
    pub snapshot: Option<ConfigSnapshot>,
    /// What could not be simulated, one line each.
    pub not_simulated: Vec<String>,
}

/// One state's inputs: the entries chains and resolved configs are derived from, read once,
/// and every chain, resolved config and intention list derived, remembered (many proxies ask
/// the same: one compile per distinct request, not one per proxy).
pub struct Inputs<'a> {
    state: &'a State,
    proxy_defaults: Option<Arc<structs::ConfigEntry>>,
    service_defaults: Vec<Arc<structs::ConfigEntry>>,
    resolvers: Vec<Arc<structs::ConfigEntry>>,
    routers: Vec<Arc<structs::ConfigEntry>>,
    splitters: Vec<Arc<structs::ConfigEntry>>,
    trust_domain: String,
    chains: RefCell<HashMap<DiscoveryChainRequest, Option<Arc<CompiledDiscoveryChain>>>>,
    resolved: RefCell<HashMap<String, Arc<structs::ResolvedServiceConfig>>>,
    intentions: RefCell<HashMap<String, Arc<Vec<structs::Intention>>>>,
    nodes: RefCell<HashMap<TargetKey, Arc<Vec<structs::CheckServiceNode>>>>,
}

impl<'a> Inputs<'a> {
    /// The inputs `state` holds.
    pub fn of(state: &'a State) -> Self {
        Self {
            state,
            proxy_defaults: state.config_entry(ConfigEntryKind::ProxyDefaults, "global"),
            service_defaults: state.config_entries(ConfigEntryKind::ServiceDefaults),
            resolvers: state.config_entries(ConfigEntryKind::ServiceResolver),
            routers: state.config_entries(ConfigEntryKind::ServiceRouter),
            splitters: state.config_entries(ConfigEntryKind::ServiceSplitter),
            trust_domain: state.ca_roots().trust_domain,
            chains: RefCell::default(),
            resolved: RefCell::default(),
            intentions: RefCell::default(),
            nodes: RefCell::default(),
        }
    }

    fn chain(&self, req: &DiscoveryChainRequest) -> Option<Arc<CompiledDiscoveryChain>> {
        if let Some(known) = self.chains.borrow().get(req) {
            return known.clone();
        }
        let chain = ChainInputs {
            proxy_defaults: self.proxy_defaults.as_ref(),
            service_defaults: &self.service_defaults,
            trust_domain: &self.trust_domain,
            resolvers: &self.resolvers,
            routers: &self.routers,
            splitters: &self.splitters,
        }
        .compile(req)
        .ok()
        .map(Arc::new);
        self.chains.borrow_mut().insert(req.clone(), chain.clone());
        chain
    }

    fn resolved(&self, service: &str) -> Arc<structs::ResolvedServiceConfig> {
        let mut known = self.resolved.borrow_mut();
        let entry = known.entry(service.to_owned()).or_insert_with(|| {
            Arc::new(crate::resolved_config::resolve_for(
                service,
                self.proxy_defaults.as_ref(),
                &self.service_defaults,
            ))
        });
        Arc::clone(entry)
    }

    fn nodes(&self, key: &TargetKey) -> Result<Arc<Vec<structs::CheckServiceNode>>, String> {
        if let Some(known) = self.nodes.borrow().get(key) {
            return Ok(Arc::clone(known));
        }
        let nodes = Arc::new(target_nodes(self.state, key)?);
        self.nodes.borrow_mut().insert(key.clone(), Arc::clone(&nodes));
        Ok(nodes)
    }

    fn intentions(&self, destination: &str) -> Arc<Vec<structs::Intention>> {
        let mut known = self.intentions.borrow_mut();
        let entry = known.entry(destination.to_owned()).or_insert_with(|| {
            match payload(&Topic::Intentions(destination.to_owned()), self.state) {
                Payload::Intentions(i) => i,
                _ => Arc::default(),
            }
        });
        Arc::clone(entry)
    }
}

/// The states a dry run compares: the catalog now, and the catalog the write would leave.
pub struct Change<'a> {
    before: Inputs<'a>,
    after: Inputs<'a>,
    /// Snapshot values already found equal to what `before` derives, by address (proxies
    /// share their chains' and instances' `Arc`s: each is compared once, not once per proxy).
    verified: RefCell<HashSet<usize>>,
    /// Whether the write changes a target's instances, by selection.
    moved: RefCell<HashMap<TargetKey, bool>>,
    /// Whether the write changes a chain, by request.
    chains_moved: RefCell<HashMap<DiscoveryChainRequest, bool>>,
}

impl<'a> Change<'a> {
    /// The change from `before` to `after`.
    pub fn new(before: &'a State, after: &'a State) -> Self {
        Self {
            before: Inputs::of(before),
            after: Inputs::of(after),
            verified: RefCell::default(),
            moved: RefCell::default(),
            chains_moved: RefCell::default(),
        }
    }

    /// Whether the write changes the chain `req` asks for.
    fn chain_moves(&self, req: &DiscoveryChainRequest) -> bool {
        if let Some(known) = self.chains_moved.borrow().get(req) {
            return *known;
        }
        let moved = self.before.chain(req) != self.after.chain(req);
        self.chains_moved.borrow_mut().insert(req.clone(), moved);
        moved
    }

    /// Whether `current` (a snapshot's value at address `ptr`) is what `derive` makes of
    /// the state now.
    fn matches<T: PartialEq + ?Sized>(&self, ptr: *const T, current: &T, now: Option<&T>) -> bool {
        let addr = ptr.cast::<()>() as usize;
        if self.verified.borrow().contains(&addr) {
            return true;
        }
        let same = now == Some(current);
        if same {
            self.verified.borrow_mut().insert(addr);
        }
        same
    }

    /// Whether the write changes the instances `key` selects.
    fn moves(&self, key: &TargetKey) -> Result<bool, String> {
        if let Some(known) = self.moved.borrow().get(key) {
            return Ok(*known);
        }
        let moved = self.before.nodes(key)? != self.after.nodes(key)?;
        self.moved.borrow_mut().insert(key.clone(), moved);
        Ok(moved)
    }
}

/// What `snapshot` would be after `change`.
pub fn what_if(snapshot: &ConfigSnapshot, change: &Change<'_>) -> WhatIf {
    let mut out = WhatIf::default();
    let KindSnapshot::ConnectProxy(cp) = &snapshot.kind else {
        out.not_simulated
            .push(format!("{:?} proxies are not simulated", snapshot.service_kind()));
        return out;
    };
    let mut next = cp.clone();
    let mut changed = false;
    let dest = destination(snapshot);
    if let Some(current) = &cp.intentions {
        match (change.before.intentions(dest), change.after.intentions(dest)) {
            (b, _) if b != *current => out
                .not_simulated
                .push("intentions: the proxy's snapshot is behind the catalog".into()),
            (b, a) if a != b => {
                next.intentions = Some(a);
                changed = true;
            }
            _ => {}
        }
    }
    if let Some(current) = &cp.resolved_config {
        let (b, a) = (change.before.resolved(dest), change.after.resolved(dest));
        if *b != **current {
            out.not_simulated
                .push("service config: the proxy's snapshot is behind the catalog".into());
        } else if a != b {
            next.resolved_config = Some(a);
            changed = true;
        }
    }
    let mut upstreams = (*cp.upstreams).clone();
    for (id, upstream) in cp.upstreams.iter() {
        match upstream_what_if(snapshot, id, upstream, change) {
            Ok(Some(new)) => {
                upstreams.insert(Arc::clone(id), Arc::new(new));
                changed = true;
            }
            Ok(None) => {}
            Err(why) => out.not_simulated.push(format!("upstream {id}: {why}")),
        }
    }
    if changed {
        next.upstreams = Arc::new(upstreams);
        let mut new = snapshot.clone();
        new.kind = KindSnapshot::ConnectProxy(next);
        out.snapshot = Some(new);
    }
    out
}

/// The service a sidecar's inbound side serves.
fn destination(snapshot: &ConfigSnapshot) -> &str {
    let s = &snapshot.service;
    if s.kind == ServiceKind::ConnectProxy && !s.proxy.destination_service_name.is_empty() {
        &s.proxy.destination_service_name
    } else {
        &s.service
    }
}

/// The upstream as `change` would leave it (`None`: unchanged), or why it is not simulated.
fn upstream_what_if(
    snapshot: &ConfigSnapshot,
    id: &structs::proxy::UpstreamId,
    upstream: &UpstreamSnapshot,
    change: &Change<'_>,
) -> Result<Option<UpstreamSnapshot>, String> {
    let Some(chain) = &upstream.chain else {
        return Ok(None);
    };
    let config = snapshot.upstream_config(upstream);
    if config.is_some_and(|c| c.destination_type.effective() == DestinationType::PreparedQuery) {
        return Err("prepared-query upstreams are not simulated".into());
    }
    let options = config.map(structs::Upstream::options).unwrap_or_default();
    let req = DiscoveryChainRequest {
        datacenter: if id.datacenter.is_empty() {
            snapshot.datacenter.to_string()
        } else {
            id.datacenter.clone()
        },
        name: config.map_or_else(|| chain.service_name.clone(), |c| c.destination_name.clone()),
        namespace: id.namespace.clone(),
        override_protocol: options.protocol,
        override_connect_timeout_ms: options.connect_timeout_ms.unwrap_or(0),
        override_mesh_gateway: snapshot.service.proxy.mesh_gateway.mode,
    };
    if !change.matches(Arc::as_ptr(chain), &**chain, change.before.chain(&req).as_deref()) {
        return Err("its chain as compiled now differs from the proxy's: the snapshot is behind the catalog".into());
    }
    let Some(after) = change.after.chain(&req) else {
        return Err("the chain would not compile".into());
    };
    let mut new = upstream.clone();
    let mut changed = false;
    for (target_id, target) in &after.targets {
        if target.datacenter != *snapshot.datacenter {
            // Another datacenter's instances are not in this catalog.
            continue;
        }
        let key = (
            target.service.clone(),
            target.subset.only_passing,
            target.subset.filter.clone(),
        );
        let same_target = chain.targets.get(target_id) == Some(target);
        match upstream.endpoints.get(target_id) {
            // A write that leaves these instances as they are changes nothing here.
            Some(_) if same_target && !change.moves(&key)? => {}
            Some(current) if same_target => {
                let now = change.before.nodes(&key)?;
                if !change.matches(Arc::as_ptr(current), &**current, Some(&*now)) {
                    return Err(format!(
                        "the instances of {target_id} differ from the proxy's: the snapshot is behind the catalog"
                    ));
                }
                new.endpoints.insert(target_id.clone(), change.after.nodes(&key)?);
                changed = true;
            }
            _ => {
                new.endpoints.insert(target_id.clone(), change.after.nodes(&key)?);
                changed = true;
            }
        }
    }
    let before_len = new.endpoints.keys().count();
    new.endpoints
        .retain(|target_id, _| after.targets.contains_key(target_id));
    changed |= new.endpoints.keys().count() != before_len;
    if change.chain_moves(&req) {
        new.chain = Some(after);
        changed = true;
    }
    Ok(changed.then_some(new))
}

/// What selects a chain target's instances: the service, passing only, the subset's filter.
type TargetKey = (String, bool, String);

/// A chain target's instances in `state`, as its health watch would select them.
fn target_nodes(state: &State, key: &TargetKey) -> Result<Vec<structs::CheckServiceNode>, String> {
    let (service, passing_only, filter) = key;
    let Payload::Health(all) = payload(&Topic::ServiceHealthConnect(service.clone()), state) else {
        return Ok(Vec::new());
    };
    let req = HealthRequest {
        datacenter: String::new(),
        service: service.clone(),
        connect: true,
        passing_only: *passing_only,
        healthy_only: true,
        filter: filter.clone(),
        kind: None,
        token: None,
    };
    let filter = filter
        .parse::<structs::filter::Filter>()
        .map_err(|e| format!("subset filter {filter:?}: {e}"))?;
    Ok(crate::health::filter_health(&all, &req, &filter))
}
