//! Transparent mode's outbound side: one listener (`outbound_listener:127.0.0.1:<port>`,
//! port 15001 unless `TransparentProxy.OutboundListenerPort` says otherwise) that the
//! node's redirection rules send every outbound TCP connection of the application to. Its
//! `original_dst` listener filter restores the address the application dialed, and filter
//! chains matched on that address pick the upstream:
//!
//! - an upstream service's virtual IP (the `consul-virtual` tagged address its instances
//!   carry) selects its chain, as its own listener would (tcp_proxy, or an HTTP connection
//!   manager with the upstream's routes: splits, redirects and failover included);
//! - with `TransparentProxy.DialedDirectly` on an instance (its proxy's registration), that
//!   instance's address selects `passthrough~<sni>`: mTLS to the address dialed, where the
//!   instance's own redirection hands it to its proxy;
//! - anything else takes the default chain to `original-destination` (the address dialed,
//!   in the clear), unless the `mesh` entry's `TransparentProxy.MeshDestinationsOnly`
//!   refuses it: then there is no default chain and Envoy closes the connection.
//!
//! Declared upstreams take part as implicit ones do: dialing their virtual IP works beside
//! their local bind port. Destinations outside the mesh that intentions allow get chains
//! on their addresses and port, through a terminating gateway (`destinations.rs`).

use super::core::{cidr, millis, socket};
use super::listeners::{chain_filter, tcp_proxy};
use super::{BuildError, CLUSTER, LISTENER, ROUTE, Resources, SharedEncodings, tls};
use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter, listener_filter,
};
use envoy_types::pb::envoy::extensions::filters::listener::original_dst::v3::OriginalDst;
use envoy_types::util::pack_any;
use itertools::EitherOrBoth;
use proxycfg::{ConfigSnapshot, ConnectProxySnapshot, UpstreamSnapshot};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use structs::{CompiledDiscoveryChain, ConfigEntry, DestinationType, SpiffeIdService, UpstreamId};

/// The outbound listener's port when the proxy's `TransparentProxy` leaves it unset.
pub(crate) const DEFAULT_OUTBOUND_PORT: u16 = 15001;

/// The cluster to the address the application dialed, outside the mesh.
pub(crate) const PASSTHROUGH_CLUSTER: &str = "original-destination";

/// How long a passthrough connection may take to open.
const PASSTHROUGH_CONNECT_TIMEOUT_MS: u32 = 5_000;

/// The name of the outbound listener of `snap`.
pub(crate) fn outbound_listener_name(snap: &ConfigSnapshot) -> String {
    format!("outbound_listener:127.0.0.1:{}", outbound_port(snap))
}

fn outbound_port(snap: &ConfigSnapshot) -> u16 {
    match snap.service.proxy.transparent_proxy.outbound_listener_port {
        0 => DEFAULT_OUTBOUND_PORT,
        port => port,
    }
}

/// Whether the `mesh` entry keeps transparent proxies to destinations in the mesh.
fn mesh_destinations_only(cp: &ConnectProxySnapshot) -> bool {
    match cp.mesh_config.as_ref().and_then(|m| m.as_deref()) {
        Some(ConfigEntry::Mesh(m)) => m.transparent_proxy.mesh_destinations_only,
        _ => false,
    }
}

/// The addresses that select one upstream: its virtual IPs, and its instances' addresses
/// where they may be dialed directly (with the target they belong to).
#[derive(Default, PartialEq, Eq)]
struct Matches {
    virtual_ips: Vec<IpAddr>,
    direct: Vec<(IpAddr, structs::TargetId)>,
}

/// What selects `upstream` (named `id`): the virtual IP of the chain's own service (its
/// instances carry it; a target of another service, reached by a split or redirect, has
/// its own), and each instance address whose proxy allows dialing it directly.
fn matches(id: &UpstreamId, upstream: &UpstreamSnapshot, chain: &CompiledDiscoveryChain) -> Matches {
    let mut out = Matches::default();
    for (target_id, nodes) in upstream.endpoints.iter() {
        let Some(target) = chain.targets.get(target_id) else {
            continue;
        };
        for node in nodes.iter() {
            if target.service == id.name
                && let Some(vip) = node
                    .service
                    .tagged_addresses
                    .get(structs::service::TAGGED_ADDRESS_VIRTUAL_IP)
                && let Ok(ip) = vip.address.parse::<IpAddr>()
                && !out.virtual_ips.contains(&ip)
            {
                out.virtual_ips.push(ip);
            }
            if node.service.proxy.transparent_proxy.dialed_directly
                && let Ok(ip) = node.address().parse::<IpAddr>()
                && !out.direct.iter().any(|(a, _)| *a == ip)
            {
                out.direct.push((ip, target_id.clone()));
            }
        }
    }
    out.virtual_ips.sort();
    out.direct.sort();
    out
}

impl Matches {
    fn is_empty(&self) -> bool {
        self.virtual_ips.is_empty() && self.direct.is_empty()
    }
}

/// True when the outbound listeners of `a` and `b` match the same addresses to the same
/// upstreams (their endpoints may differ otherwise): a build of `b` may keep `a`'s.
pub(crate) fn same_matches(a: &ConfigSnapshot, b: &ConfigSnapshot) -> bool {
    same_selection(a, b, |_| true, false)
}

/// True when the outbound listeners of `a` and `b` would be the same, their proxy-wide
/// inputs being the same: the same upstreams select the same addresses through the same
/// chains.
pub(crate) fn same_listener(a: &ConfigSnapshot, b: &ConfigSnapshot) -> bool {
    same_selection(a, b, |id| id.destination_type == DestinationType::Service, true)
}

/// Walks the upstreams (with a chain, of those `counts` keeps) of `a` and `b` side by side,
/// in id order: the same where every upstream of both selects the same addresses (and,
/// with `same_chain`, through the very same chain), one selecting nothing being as good as
/// absent. An upstream that is the very same `Arc` in both selects alike without looking;
/// the first difference ends the walk (an upstream added: its addresses alone are looked
/// at).
fn same_selection(a: &ConfigSnapshot, b: &ConfigSnapshot, counts: fn(&UpstreamId) -> bool, same_chain: bool) -> bool {
    type Item<'s> = (
        &'s Arc<UpstreamId>,
        &'s Arc<UpstreamSnapshot>,
        &'s Arc<CompiledDiscoveryChain>,
    );
    fn walk(snap: &ConfigSnapshot, counts: fn(&UpstreamId) -> bool) -> impl Iterator<Item = Item<'_>> {
        snap.connect_proxy()
            .into_iter()
            .flat_map(|cp| cp.upstreams.iter())
            .filter(move |(id, _)| counts(id))
            .filter_map(|(id, u)| Some((id, u, u.chain.as_ref()?)))
    }
    let selects = |(id, u, chain): Item<'_>| -> bool { !matches(id, u, chain).is_empty() };
    let (mut xs, mut ys) = (walk(a, counts).peekable(), walk(b, counts).peekable());
    loop {
        let (x, y) = (xs.peek().copied(), ys.peek().copied());
        match (x, y) {
            (None, None) => return true,
            (Some(x), Some(y)) if x.0 == y.0 => {
                xs.next();
                ys.next();
                if Arc::ptr_eq(x.1, y.1) {
                    continue;
                }
                let (mx, my) = (matches(x.0, x.1, x.2), matches(y.0, y.1, y.2));
                let alike = (mx.is_empty() && my.is_empty()) || (mx == my && (!same_chain || Arc::ptr_eq(x.2, y.2)));
                if !alike {
                    return false;
                }
            }
            (Some(x), y) if y.is_none_or(|y| x.0 < y.0) => {
                xs.next();
                if selects(x) {
                    return false;
                }
            }
            (_, Some(y)) => {
                ys.next();
                if selects(y) {
                    return false;
                }
            }
            (Some(_), None) => unreachable!("matched above"),
        }
    }
}

/// The resources of the outbound part of `snap`'s build (see [`super::OUTBOUND`]): the
/// listener, the passthrough clusters, the routes of the HTTP upstreams it selects.
pub(crate) fn part_names(snap: &ConfigSnapshot, cp: &ConnectProxySnapshot) -> Vec<(&'static str, String)> {
    if !cp.transparent {
        return Vec::new();
    }
    let mut names = vec![
        (LISTENER, outbound_listener_name(snap)),
        (CLUSTER, PASSTHROUGH_CLUSTER.to_owned()),
    ];
    for (id, upstream) in cp.upstreams.iter() {
        let Some(chain) = &upstream.chain else { continue };
        let m = matches(id, upstream, chain);
        if !m.virtual_ips.is_empty() && chain.protocol.is_http() {
            names.push((ROUTE, id.name.clone()));
        }
        for (_, target) in &m.direct {
            if let Some(t) = chain.targets.get(target) {
                names.push((CLUSTER, format!("passthrough~{}", t.sni)));
            }
        }
    }
    names.extend(super::destinations::names(snap, cp));
    names
}

fn chain_on(ips: Vec<IpAddr>, filter: Filter) -> FilterChain {
    FilterChain {
        filter_chain_match: Some(FilterChainMatch {
            prefix_ranges: ips.into_iter().map(cidr).collect(),
            ..Default::default()
        }),
        filters: vec![filter],
        ..Default::default()
    }
}

/// The listener filter that restores the address the application dialed.
fn original_dst() -> ListenerFilter {
    ListenerFilter {
        name: "envoy.filters.listener.original_dst".into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(pack_any(
            OriginalDst::default(),
        ))),
        ..Default::default()
    }
}

/// An `ORIGINAL_DST` cluster: connections go to the address the application dialed.
fn original_dst_cluster(name: &str) -> Cluster {
    Cluster {
        name: name.to_owned(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::OriginalDst as i32,
        )),
        lb_policy: cluster::LbPolicy::ClusterProvided as i32,
        connect_timeout: millis(PASSTHROUGH_CONNECT_TIMEOUT_MS),
        ..Default::default()
    }
}

/// Everything the outbound part of a build reads, for a proxy with no destination: its
/// listener's port, the trust domain, the `mesh` entry (by identity), and per upstream of a
/// service its chain (by identity) and the addresses that select it. Proxies with equal
/// inputs (every transparent proxy of a service, typically) have the very same outbound
/// part: it is built once ([`SharedEncodings::part`]).
struct OutboundInputs {
    port: u16,
    trust_domain: String,
    mesh: Option<Arc<ConfigEntry>>,
    upstreams: Vec<(Arc<UpstreamId>, Arc<CompiledDiscoveryChain>, Matches)>,
}

impl PartialEq for OutboundInputs {
    fn eq(&self, other: &Self) -> bool {
        let same_arc = |a: &Option<Arc<ConfigEntry>>, b: &Option<Arc<ConfigEntry>>| match (a, b) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        self.port == other.port
            && self.trust_domain == other.trust_domain
            && same_arc(&self.mesh, &other.mesh)
            && self.upstreams.len() == other.upstreams.len()
            && self
                .upstreams
                .iter()
                .zip(&other.upstreams)
                // The cheap comparisons first: the chains by address, then the addresses,
                // then the ids (strings; rarely different when the chains are the same).
                .all(|((i, c, m), (j, d, n))| Arc::ptr_eq(c, d) && m == n && (Arc::ptr_eq(i, j) || i == j))
    }
}

impl OutboundInputs {
    /// The inputs of `cp`'s outbound part; `None` when it has destinations (their chains
    /// read more than these) or no roots yet.
    fn of(snap: &ConfigSnapshot, cp: &ConnectProxySnapshot) -> Option<Self> {
        if !cp.destinations.is_empty() || !cp.destination_gateways.is_empty() {
            return None;
        }
        let trust_domain = snap.roots.as_deref()?.trust_domain.clone();
        let mut upstreams = Vec::with_capacity(cp.upstreams.len());
        for (id, u) in cp.upstreams.iter() {
            if let Some(chain) = u
                .chain
                .as_ref()
                .filter(|_| id.destination_type == DestinationType::Service)
            {
                upstreams.push((Arc::clone(id), Arc::clone(chain), matches(id, u, chain)));
            }
        }
        Some(Self {
            port: outbound_port(snap),
            trust_domain,
            mesh: cp.mesh_config.as_ref().and_then(Clone::clone),
            upstreams,
        })
    }

    /// A hash of the inputs (chains and the entry by address).
    fn key(&self) -> u64 {
        use std::hash::{BuildHasher, Hash, Hasher};
        let mut h = foldhash::fast::FixedState::default().build_hasher();
        self.port.hash(&mut h);
        self.trust_domain.hash(&mut h);
        self.mesh.as_ref().map(Arc::as_ptr).hash(&mut h);
        for (id, chain, m) in &self.upstreams {
            id.hash(&mut h);
            Arc::as_ptr(chain).hash(&mut h);
            m.virtual_ips.hash(&mut h);
            m.direct.hash(&mut h);
        }
        h.finish()
    }

    /// True while every chain the inputs name is held by some proxy besides.
    fn still_used(inputs: &(dyn std::any::Any + Send + Sync)) -> bool {
        inputs
            .downcast_ref::<Self>()
            .is_some_and(|i| i.upstreams.iter().all(|(_, chain, _)| Arc::strong_count(chain) > 1))
    }
}

/// How the outbound inputs of a proxy changed from its previous build (whose proxy-wide
/// inputs are the same): each upstream of a service whose snapshot is not the previous
/// one's, with its chain (by identity) and what selects it now, or `None` where it left the
/// inputs. Applied to the inputs of the previous build's part, it gives the new inputs: two
/// proxies that took the same part and changed alike have the same new inputs.
struct InputsChange(Vec<(Arc<UpstreamId>, Option<Selecting>)>);

impl PartialEq for InputsChange {
    /// The same upstreams, chains (by identity) and addresses.
    fn eq(&self, other: &Self) -> bool {
        let same = |a: &Option<Selecting>, b: &Option<Selecting>| match (a, b) {
            (Some((c, m)), Some((d, n))) => Arc::ptr_eq(c, d) && m == n,
            (None, None) => true,
            _ => false,
        };
        self.0.len() == other.0.len() && self.0.iter().zip(&other.0).all(|((i, a), (j, b))| i == j && same(a, b))
    }
}

/// An upstream's chain (by identity) and the addresses that select it.
type Selecting = (Arc<CompiledDiscoveryChain>, Matches);

impl InputsChange {
    /// The change from `prev` to `snap`: a walk of both upstream maps side by side,
    /// comparing snapshots by address; the addresses are computed only for the upstreams
    /// that changed.
    fn between(prev: &ConfigSnapshot, snap: &ConfigSnapshot) -> Option<Self> {
        let (x, y) = (prev.connect_proxy()?, snap.connect_proxy()?);
        let counts = |id: &UpstreamId| id.destination_type == DestinationType::Service;
        let now = |id: &Arc<UpstreamId>, u: &UpstreamSnapshot| {
            let chain = u.chain.as_ref()?;
            Some((Arc::clone(chain), matches(id, u, chain)))
        };
        let mut changes = Vec::new();
        for pair in super::upstreams::side_by_side(&x.upstreams, &y.upstreams) {
            match pair {
                EitherOrBoth::Left((o, _)) if counts(o) => changes.push((Arc::clone(o), None)),
                EitherOrBoth::Both((_, p), (_, u)) if Arc::ptr_eq(p, u) => {}
                EitherOrBoth::Right((id, u)) | EitherOrBoth::Both(_, (id, u)) if counts(id) => {
                    changes.push((Arc::clone(id), now(id, u)));
                }
                _ => {}
            }
        }
        Some(Self(changes))
    }

    /// A hash of the change and of the part it starts from (by address).
    fn key(&self, from: &Arc<Resources>) -> u64 {
        use std::hash::{BuildHasher, Hash, Hasher};
        let mut h = foldhash::fast::FixedState::default().build_hasher();
        Arc::as_ptr(from).hash(&mut h);
        for (id, now) in &self.0 {
            id.hash(&mut h);
            if let Some((chain, m)) = now {
                Arc::as_ptr(chain).hash(&mut h);
                m.virtual_ips.hash(&mut h);
                m.direct.hash(&mut h);
            }
        }
        h.finish()
    }
}

/// Builds the outbound listener of a transparent proxy, the clusters only it uses, and the
/// routes of its implicit HTTP upstreams (once for every proxy with the same inputs, with
/// `shared`). Nothing for a proxy in direct mode. With `from` (the previous build's snapshot
/// and part), a proxy whose inputs changed as another's did from the same part takes the
/// part that one found.
pub(crate) fn build(
    snap: &ConfigSnapshot,
    out: &mut Resources,
    shared: Option<&SharedEncodings>,
    from: Option<(&ConfigSnapshot, &Arc<Resources>)>,
) -> Result<(), BuildError> {
    let Some(cp) = snap.connect_proxy().filter(|cp| cp.transparent) else {
        return Ok(());
    };
    let Some(shared) = shared else {
        return build_outbound(snap, cp, out);
    };
    let change = from.and_then(|(prev, part)| Some((part, InputsChange::between(prev, snap)?)));
    let change = change.map(|(part, change)| (part, change.key(part), change));
    let followed = change
        .as_ref()
        .and_then(|(part, key, change)| shared.part_after(part, *key, change));
    let part = match followed {
        Some(part) => part,
        None => {
            let Some(inputs) = OutboundInputs::of(snap, cp) else {
                return build_outbound(snap, cp, out);
            };
            let part = shared.part(inputs.key(), inputs, OutboundInputs::still_used, || {
                let mut part = Resources::default();
                build_outbound(snap, cp, &mut part).map(|()| shared.interned(part))
            })?;
            if let Some((from, key, change)) = change {
                shared.record_after(from, key, change, &part);
            }
            part
        }
    };
    out.extend_from(&part);
    out.outbound_part = Some(part);
    Ok(())
}

/// [`build`] itself.
fn build_outbound(snap: &ConfigSnapshot, cp: &ConnectProxySnapshot, out: &mut Resources) -> Result<(), BuildError> {
    let roots = snap.roots.as_deref().ok_or(BuildError::Incomplete("CA roots"))?;
    let mesh = cp.mesh_config.as_ref().and_then(|m| m.as_deref());
    let outgoing = tls::mesh_params(snap, mesh, tls::Direction::Outgoing);
    let mut filter_chains = Vec::new();
    // Each address selects one chain: Envoy refuses a listener where two chains match alike.
    let mut claimed: BTreeMap<IpAddr, &UpstreamId> = BTreeMap::new();
    for (id, upstream) in cp.upstreams.iter() {
        if id.destination_type != DestinationType::Service {
            continue;
        }
        let Some(chain) = &upstream.chain else { continue };
        let found = matches(id, upstream, chain);
        let mut claim = |ip: IpAddr, out: &mut Resources| match claimed.get(&ip) {
            Some(owner) => {
                out.problems.insert(
                    format!("{} {id}", super::OUTBOUND),
                    format!("upstream {id}: address {ip} already selects upstream {owner}; not matched again"),
                );
                false
            }
            None => {
                claimed.insert(ip, id);
                true
            }
        };
        let vips: Vec<IpAddr> = found.virtual_ips.into_iter().filter(|ip| claim(*ip, out)).collect();
        if !vips.is_empty() {
            match chain_filter(id, id.name.clone(), chain, out) {
                Ok(filter) => filter_chains.push(chain_on(vips, filter)),
                Err(e) => {
                    out.problems
                        .insert(format!("{} {id}", super::OUTBOUND), format!("upstream {id}: {}", e.0));
                }
            }
        }
        for (ip, target_id) in found.direct {
            let Some(target) = chain.targets.get(&target_id) else {
                continue;
            };
            if !claim(ip, out) {
                continue;
            }
            let name = format!("passthrough~{}", target.sni);
            if !out.by_type.get(CLUSTER).is_some_and(|c| c.contains_key(&name)) {
                let spiffe = SpiffeIdService {
                    trust_domain: roots.trust_domain.clone(),
                    namespace: target.namespace.clone(),
                    datacenter: target.datacenter.clone(),
                    service: target.service.clone(),
                };
                let mut cluster = original_dst_cluster(&name);
                cluster.transport_socket = Some(tls::upstream(&target.sni, &spiffe.to_string(), outgoing.clone()));
                out.insert(CLUSTER, name.clone(), pack_any(cluster));
            }
            filter_chains.push(chain_on(vec![ip], tcp_proxy(&format!("upstream.{id}"), &name)));
        }
    }
    let destinations =
        super::destinations::sidecar_chains(snap, cp, &roots.trust_domain, outgoing.as_ref(), super::OUTBOUND, out);
    let tls_inspector = destinations.tls_inspector();
    filter_chains.extend(destinations.chains);
    let default_filter_chain = if mesh_destinations_only(cp) {
        None
    } else {
        out.insert(
            CLUSTER,
            PASSTHROUGH_CLUSTER.to_owned(),
            pack_any(original_dst_cluster(PASSTHROUGH_CLUSTER)),
        );
        Some(FilterChain {
            name: PASSTHROUGH_CLUSTER.to_owned(),
            filters: vec![tcp_proxy("upstream.original-destination", PASSTHROUGH_CLUSTER)],
            ..Default::default()
        })
    };
    // Destinations by host name are matched on the SNI of the application's TLS.
    let listener_filters = std::iter::once(original_dst()).chain(tls_inspector).collect();
    let name = outbound_listener_name(snap);
    let listener = Listener {
        name: name.clone(),
        address: socket("127.0.0.1", u32::from(outbound_port(snap))),
        filter_chains,
        default_filter_chain,
        listener_filters,
        traffic_direction: TrafficDirection::Outbound as i32,
        ..Default::default()
    };
    out.insert(LISTENER, name, pack_any(listener));
    Ok(())
}
