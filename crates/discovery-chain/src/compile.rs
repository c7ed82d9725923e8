//! Compiling one chain.

use crate::{ChainError, Entries};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use structs::config_entry::{
    HttpHeaderModifiers, ServiceResolver, ServiceRoute, ServiceRouteDestination, ServiceRouteHttpMatch,
    ServiceRouteMatch,
};
use structs::discovery_chain::{
    ChainFailover, ChainNode, ChainResolver, ChainRoute, ChainSplit, DEFAULT_CONNECT_TIMEOUT_MS, NodeType,
    TargetSubset, resolver_node_name, target_sni,
};
use structs::{CompiledDiscoveryChain, ConfigEntryKind, DiscoveryTarget, GoDuration, Protocol, TargetId};

/// The only namespace (and partition) meshd serves.
const NAMESPACE: &str = "default";

/// What to compile.
#[derive(Debug, Clone, Copy)]
pub struct CompileRequest<'a> {
    /// The upstream service.
    pub service: &'a str,
    /// The datacenter the chain is compiled for (the only one its targets may be in).
    pub datacenter: &'a str,
    /// The CA's trust domain (target SNIs end in it).
    pub trust_domain: &'a str,
    /// Use this protocol instead of the service's (`OverrideProtocol`).
    pub override_protocol: Option<Protocol>,
    /// Use this connect timeout for every target (`OverrideConnectTimeout`).
    pub override_connect_timeout: Option<Duration>,
}

/// Compiles the chain of `req.service` from `entries`.
pub fn compile(req: &CompileRequest<'_>, entries: &Entries<'_>) -> Result<CompiledDiscoveryChain, ChainError> {
    // The services' own protocol decides what the entries may do (and what they may join);
    // an override only changes what the proxy speaks, and one that is not HTTP makes the
    // chain skip routers and splitters (as Consul: they cannot be followed over TCP).
    let own = entries.protocol_of(req.service);
    let protocol = req.override_protocol.unwrap_or(own);
    let mut c = Compiler {
        req,
        entries,
        own,
        skip_routing: req.override_protocol.is_some() && !protocol.is_http(),
        nodes: BTreeMap::new(),
        targets: BTreeMap::new(),
        splitting: Vec::new(),
    };
    let start = match entries.router(req.service) {
        Some(router) if !c.skip_routing => {
            c.check_l7(ConfigEntryKind::ServiceRouter, &router.name)?;
            c.router_node(req.service)?
        }
        _ => c.splitter_or_resolver(req.service, &Referrer::upstream(req.service))?,
    };
    let default = c.nodes.len() == 1
        && c.nodes.get(&start).and_then(|n| n.resolver.as_ref()).is_some_and(|r| {
            r.default && r.failover.is_none() && c.targets.get(&r.target).is_some_and(|t| t.service == req.service)
        });
    Ok(CompiledDiscoveryChain {
        service_name: req.service.to_owned(),
        namespace: NAMESPACE.to_owned(),
        datacenter: req.datacenter.to_owned(),
        protocol,
        start_node: start,
        nodes: c.nodes,
        targets: c.targets,
        default,
    })
}

/// Who asked for a node: the entry and field named when the node cannot be made.
#[derive(Debug, Clone)]
struct Referrer {
    kind: ConfigEntryKind,
    name: String,
    field: String,
}

impl Referrer {
    fn upstream(service: &str) -> Self {
        Self {
            kind: ConfigEntryKind::ServiceResolver,
            name: service.to_owned(),
            field: "DefaultSubset".into(),
        }
    }

    fn error(&self, problem: impl Into<String>) -> ChainError {
        ChainError::new(self.kind, &self.name, self.field.clone(), problem)
    }
}

struct Compiler<'r, 'e> {
    req: &'r CompileRequest<'r>,
    entries: &'r Entries<'e>,
    /// The chain's service's own protocol (what the services it joins must speak).
    own: Protocol,
    /// Routers and splitters are skipped: an override makes the proxy speak a protocol that
    /// is not HTTP. (Without an override, a service that is not HTTP and has a router or
    /// splitter is an error, which `check_l7` reports.)
    skip_routing: bool,
    nodes: BTreeMap<String, ChainNode>,
    targets: BTreeMap<TargetId, DiscoveryTarget>,
    /// Splitters being flattened (a splitter reaching itself is a loop).
    splitting: Vec<String>,
}

fn service_key(service: &str) -> String {
    format!("{service}.{NAMESPACE}.{NAMESPACE}")
}

impl Compiler<'_, '_> {
    /// Routers and splitters need an HTTP protocol.
    fn check_l7(&self, kind: ConfigEntryKind, name: &str) -> Result<(), ChainError> {
        if self.own.is_http() {
            return Ok(());
        }
        Err(ChainError::new(
            kind,
            name,
            "Name",
            format!(
                "a {kind} needs the service to speak http, http2 or grpc, but the chain of {:?} has protocol {} \
                 (set Protocol in the service-defaults of {name:?})",
                self.req.service, self.own
            ),
        ))
    }

    /// A service a route, leg, redirect or failover leads to must speak the protocol of the
    /// chain's service.
    fn check_same_protocol(&self, service: &str, referrer: &Referrer) -> Result<(), ChainError> {
        if service == self.req.service {
            return Ok(());
        }
        let theirs = self.entries.protocol_of(service);
        if theirs == self.own {
            return Ok(());
        }
        Err(referrer.error(format!(
            "service {service:?} has protocol {theirs}, but the chain of {:?} has protocol {}: \
             a chain only joins services of one protocol",
            self.req.service, self.own
        )))
    }

    fn router_node(&mut self, service: &str) -> Result<String, ChainError> {
        let Some(router) = self.entries.router(service) else {
            return self.splitter_or_resolver(service, &Referrer::upstream(service));
        };
        let name = format!("router:{}", service_key(service));
        let mut routes = Vec::with_capacity(router.routes.len() + 1);
        for (i, route) in router.routes.iter().enumerate() {
            let dest = route.destination.clone().unwrap_or_default();
            let target_service = if dest.service.is_empty() {
                service
            } else {
                &dest.service
            };
            let referrer = Referrer {
                kind: ConfigEntryKind::ServiceRouter,
                name: service.to_owned(),
                field: format!("Routes[{i}].Destination"),
            };
            self.check_same_protocol(target_service, &referrer)?;
            let next = if dest.service_subset.is_empty() {
                self.splitter_or_resolver(target_service, &referrer)?
            } else {
                let referrer = Referrer {
                    field: format!("Routes[{i}].Destination.ServiceSubset"),
                    ..referrer
                };
                self.resolver_node(target_service, &dest.service_subset, &referrer)?
            };
            routes.push(ChainRoute {
                definition: route.clone(),
                next_node: next,
            });
        }
        // Whatever no route matches goes to the service itself.
        let catch_all = ServiceRoute {
            match_: Some(ServiceRouteMatch {
                http: Some(ServiceRouteHttpMatch {
                    path_prefix: "/".into(),
                    ..Default::default()
                }),
            }),
            destination: Some(ServiceRouteDestination {
                service: service.to_owned(),
                ..Default::default()
            }),
        };
        let next = self.splitter_or_resolver(service, &Referrer::upstream(service))?;
        routes.push(ChainRoute {
            definition: catch_all,
            next_node: next,
        });
        self.nodes.insert(
            name.clone(),
            ChainNode {
                node_type: NodeType::Router,
                name: service_key(service),
                routes,
                splits: Vec::new(),
                resolver: None,
                load_balancer: None,
            },
        );
        Ok(name)
    }

    /// The splitter of `service` if it has one, else its resolver.
    fn splitter_or_resolver(&mut self, service: &str, referrer: &Referrer) -> Result<String, ChainError> {
        if self.entries.splitter(service).is_some() && !self.skip_routing {
            self.splitter_node(service)
        } else {
            self.resolver_node(service, "", referrer)
        }
    }

    fn splitter_node(&mut self, service: &str) -> Result<String, ChainError> {
        let name = format!("splitter:{}", service_key(service));
        if self.nodes.contains_key(&name) {
            return Ok(name);
        }
        let Some(splitter) = self.entries.splitter(service) else {
            return self.resolver_node(service, "", &Referrer::upstream(service));
        };
        self.check_l7(ConfigEntryKind::ServiceSplitter, service)?;
        let legs = self.flatten(service, 100.0)?;
        debug_assert!(!splitter.splits.is_empty());
        self.nodes.insert(
            name.clone(),
            ChainNode {
                node_type: NodeType::Splitter,
                name: service_key(service),
                routes: Vec::new(),
                splits: legs,
                resolver: None,
                load_balancer: None,
            },
        );
        Ok(name)
    }

    /// The legs of `service`'s splitter scaled to `share` percent, nested splitters
    /// replaced by their own legs.
    fn flatten(&mut self, service: &str, share: f64) -> Result<Vec<ChainSplit>, ChainError> {
        let Some(splitter) = self.entries.splitter(service) else {
            return Ok(Vec::new());
        };
        if self.splitting.iter().any(|s| s == service) {
            let mut path = self.splitting.clone();
            path.push(service.to_owned());
            return Err(ChainError::new(
                ConfigEntryKind::ServiceSplitter,
                service,
                "Splits",
                format!("splitters form a loop: {}", path.join(" -> ")),
            ));
        }
        self.splitting.push(service.to_owned());
        let mut legs = Vec::new();
        for (i, split) in splitter.splits.iter().enumerate() {
            let weight = share * f64::from(split.weight) / 100.0;
            let leg_service = if split.service.is_empty() {
                service
            } else {
                &split.service
            };
            let referrer = Referrer {
                kind: ConfigEntryKind::ServiceSplitter,
                name: service.to_owned(),
                field: if split.service_subset.is_empty() {
                    format!("Splits[{i}].Service")
                } else {
                    format!("Splits[{i}].ServiceSubset")
                },
            };
            self.check_same_protocol(leg_service, &referrer)?;
            if split.service_subset.is_empty() && leg_service != service && self.entries.splitter(leg_service).is_some()
            {
                // A leg to a service with its own splitter: that splitter's legs, scaled.
                // Header changes: the outer leg's, then the inner leg's on top.
                for mut inner in self.flatten(leg_service, weight)? {
                    inner.definition.request_headers =
                        merge_headers(split.request_headers.as_ref(), inner.definition.request_headers.take());
                    inner.definition.response_headers = merge_headers(
                        split.response_headers.as_ref(),
                        inner.definition.response_headers.take(),
                    );
                    legs.push(inner);
                }
                continue;
            }
            let next = self.resolver_node(leg_service, &split.service_subset, &referrer)?;
            legs.push(ChainSplit {
                weight: round2(weight),
                next_node: next,
                definition: split.clone(),
            });
        }
        self.splitting.pop();
        Ok(legs)
    }

    /// The resolver node of `subset` of `service` (following redirects).
    fn resolver_node(&mut self, service: &str, subset: &str, referrer: &Referrer) -> Result<String, ChainError> {
        let (service, subset, dc, redirected_by) = self.follow_redirects(service, subset, self.req.datacenter)?;
        if let (Some(peer), Some(by)) = (dc.strip_prefix(PEER_MARK), &redirected_by) {
            return Ok(self.peer_resolver_node(&service, peer, by));
        }
        let resolver = self.entries.resolver(&service);
        // After a redirect, the redirect asked for the subset.
        let redirect_referrer = redirected_by.map(|by| Referrer {
            kind: ConfigEntryKind::ServiceResolver,
            name: by,
            field: "Redirect.ServiceSubset".into(),
        });
        let subset = self.check_subset(
            &service,
            &subset,
            resolver,
            redirect_referrer.as_ref().unwrap_or(referrer),
        )?;
        let target = self.target(&service, &subset, &dc)?;
        let name = resolver_node_name(&target);
        if self.nodes.contains_key(&name) {
            return Ok(name);
        }
        let failover = match resolver {
            Some(r) => self.failover(&service, &subset, r, &target)?,
            None => None,
        };
        let node = ChainNode::resolver(
            target.to_string(),
            ChainResolver {
                default: resolver.is_none(),
                connect_timeout: GoDuration(self.connect_timeout(resolver)),
                request_timeout: resolver.map(|r| r.request_timeout).unwrap_or_default(),
                target,
                failover,
            },
            resolver.and_then(|r| r.load_balancer.clone()),
        );
        self.nodes.insert(name.clone(), node);
        Ok(name)
    }

    /// The resolver node of `service` as `peer` exports it, reached by the redirect of
    /// `by`'s resolver (whose timeout it takes): no subsets, no failover.
    fn peer_resolver_node(&mut self, service: &str, peer: &str, by: &str) -> String {
        let resolver = self.entries.resolver(by).cloned().unwrap_or_default();
        let target = self.peer_target(service, peer, &resolver);
        let name = resolver_node_name(&target);
        if !self.nodes.contains_key(&name) {
            let node = ChainNode::resolver(
                target.to_string(),
                ChainResolver {
                    default: false,
                    connect_timeout: GoDuration(self.connect_timeout(Some(&resolver))),
                    request_timeout: resolver.request_timeout,
                    target,
                    failover: None,
                },
                resolver.load_balancer.clone(),
            );
            self.nodes.insert(name.clone(), node);
        }
        name
    }

    fn connect_timeout(&self, resolver: Option<&ServiceResolver>) -> Duration {
        self.req
            .override_connect_timeout
            .filter(|d| !d.is_zero())
            .or_else(|| resolver.map(|r| r.connect_timeout.0).filter(|d| !d.is_zero()))
            .unwrap_or(Duration::from_millis(u64::from(DEFAULT_CONNECT_TIMEOUT_MS)))
    }

    /// Where redirects starting at `service` (in `dc`) lead: service, subset and datacenter,
    /// and the service whose redirect led there last (`None`: no redirect). A redirect to
    /// another datacenter ends there (that datacenter's own resolvers are not read here, as
    /// Consul's compiler reads only the local ones).
    fn follow_redirects(&self, service: &str, subset: &str, dc: &str) -> Result<Redirected, ChainError> {
        let mut at = (service.to_owned(), subset.to_owned());
        let mut seen = vec![service.to_owned()];
        let mut by = None;
        while let Some(redirect) = self.entries.resolver(&at.0).and_then(|r| r.redirect.as_ref()) {
            let next_service = if redirect.service.is_empty() {
                at.0.clone()
            } else {
                redirect.service.clone()
            };
            let next_subset = if !redirect.service_subset.is_empty() {
                redirect.service_subset.clone()
            } else if next_service == at.0 {
                at.1.clone()
            } else {
                String::new()
            };
            if !redirect.peer.is_empty() {
                // The service as the peer exports it (the peer's resolvers are its own).
                return Ok((
                    next_service,
                    String::new(),
                    format!("{PEER_MARK}{}", redirect.peer),
                    Some(at.0),
                ));
            }
            if !redirect.datacenter.is_empty() && redirect.datacenter != dc {
                // The service there, as that datacenter serves it.
                return Ok((next_service, next_subset, redirect.datacenter.clone(), Some(at.0)));
            }
            if next_service == at.0 {
                // A redirect within the service only picks the subset.
                return Ok((next_service, next_subset, dc.to_owned(), Some(at.0)));
            }
            self.check_same_protocol(
                &next_service,
                &Referrer {
                    kind: ConfigEntryKind::ServiceResolver,
                    name: at.0.clone(),
                    field: "Redirect.Service".into(),
                },
            )?;
            if seen.contains(&next_service) {
                seen.push(next_service);
                return Err(ChainError::new(
                    ConfigEntryKind::ServiceResolver,
                    &at.0,
                    "Redirect.Service",
                    format!("redirects form a loop: {}", seen.join(" -> ")),
                ));
            }
            seen.push(next_service.clone());
            by = Some(at.0.clone());
            at = (next_service, next_subset);
        }
        Ok((at.0, at.1, dc.to_owned(), by))
    }

    /// The subset to use (`subset`, else the resolver's default), checked to exist.
    fn check_subset(
        &self,
        service: &str,
        subset: &str,
        resolver: Option<&ServiceResolver>,
        referrer: &Referrer,
    ) -> Result<String, ChainError> {
        let subset = if subset.is_empty() {
            resolver.map(|r| r.default_subset.clone()).unwrap_or_default()
        } else {
            subset.to_owned()
        };
        if subset.is_empty() || resolver.is_some_and(|r| r.subsets.contains_key(&subset)) {
            return Ok(subset);
        }
        Err(referrer.error(match resolver {
            Some(_) => format!("service-resolver {service:?} defines no subset {subset:?}"),
            None => format!("subset {subset:?} of {service:?} is not defined: {service:?} has no service-resolver"),
        }))
    }

    /// Records the target of `service` as `peer` exports it and returns its id. Its SNI and
    /// identities are the exporter's, known to the proxy once the peer's export is: until
    /// then the target is named by its id and has no instances.
    fn peer_target(&mut self, service: &str, peer: &str, resolver: &ServiceResolver) -> TargetId {
        let id = TargetId(format!("{service}.default.default.external.{peer}").into());
        if self.targets.contains_key(&id) {
            return id;
        }
        let timeout = self.connect_timeout(Some(resolver));
        self.targets.insert(
            id.clone(),
            DiscoveryTarget {
                id: id.clone(),
                service: service.to_owned(),
                service_subset: String::new(),
                namespace: NAMESPACE.to_owned(),
                partition: NAMESPACE.to_owned(),
                datacenter: self.req.datacenter.to_owned(),
                subset: TargetSubset::default(),
                sni: id.to_string(),
                name: id.to_string(),
                connect_timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
                load_balancer: None,
                peer: peer.to_owned(),
                spiffe_ids: Vec::new(),
            },
        );
        id
    }

    /// Records the target for `subset` of `service` in datacenter `dc` and returns its id.
    fn target(&mut self, service: &str, subset: &str, dc: &str) -> Result<TargetId, ChainError> {
        let id = TargetId::new(subset, service, NAMESPACE, dc);
        if self.targets.contains_key(&id) {
            return Ok(id);
        }
        let resolver = self.entries.resolver(service);
        let selection = resolver
            .and_then(|r| r.subsets.get(subset))
            .map(|s| TargetSubset {
                filter: s.filter.clone(),
                only_passing: s.only_passing,
            })
            .unwrap_or_default();
        let timeout = self.connect_timeout(resolver);
        self.targets.insert(
            id.clone(),
            DiscoveryTarget {
                id: id.clone(),
                service: service.to_owned(),
                service_subset: subset.to_owned(),
                namespace: NAMESPACE.to_owned(),
                partition: NAMESPACE.to_owned(),
                datacenter: dc.to_owned(),
                subset: selection,
                sni: target_sni(subset, service, NAMESPACE, dc, self.req.trust_domain),
                name: target_sni(subset, service, NAMESPACE, dc, self.req.trust_domain),
                connect_timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
                load_balancer: resolver.and_then(|r| r.load_balancer.clone()),
                peer: String::new(),
                spiffe_ids: Vec::new(),
            },
        );
        Ok(id)
    }

    /// The failover targets of `subset` of `service`, in order, without the primary.
    fn failover(
        &mut self,
        service: &str,
        subset: &str,
        resolver: &ServiceResolver,
        primary: &TargetId,
    ) -> Result<Option<ChainFailover>, ChainError> {
        let (key, failover) = match resolver.failover.get(subset) {
            Some(f) => (subset, f),
            None => match resolver.failover.get("*") {
                Some(f) => ("*", f),
                None => return Ok(None),
            },
        };
        let wanted = wanted_failover(service, subset, key, failover);
        let mut targets = Vec::new();
        let mut seen = BTreeSet::from([primary.clone()]);
        for (svc, sub, dc, field) in wanted {
            // A peer's target (`dc` is `peer:<name>`): the service as the peer exports it.
            if let Some(peer) = dc.strip_prefix(PEER_MARK) {
                let id = self.peer_target(&svc, peer, resolver);
                if seen.insert(id.clone()) {
                    targets.push(id);
                }
                continue;
            }
            let dc = if dc.is_empty() {
                self.req.datacenter.to_owned()
            } else {
                dc
            };
            let referrer = Referrer {
                kind: ConfigEntryKind::ServiceResolver,
                name: service.to_owned(),
                field,
            };
            self.check_same_protocol(&svc, &referrer)?;
            // A failover target's own redirect is followed (not its failover).
            let (svc, sub, dc, redirected_by) = self.follow_redirects(&svc, &sub, &dc)?;
            if let (Some(peer), Some(by)) = (dc.strip_prefix(PEER_MARK), &redirected_by) {
                let theirs = self.entries.resolver(by).cloned().unwrap_or_default();
                let id = self.peer_target(&svc, peer, &theirs);
                if seen.insert(id.clone()) {
                    targets.push(id);
                }
                continue;
            }
            let redirect_referrer = redirected_by.map(|by| Referrer {
                kind: ConfigEntryKind::ServiceResolver,
                name: by,
                field: "Redirect.ServiceSubset".into(),
            });
            let their_resolver = self.entries.resolver(&svc);
            let sub = self.check_subset(
                &svc,
                &sub,
                their_resolver,
                redirect_referrer.as_ref().unwrap_or(&referrer),
            )?;
            let id = self.target(&svc, &sub, &dc)?;
            if seen.insert(id.clone()) {
                targets.push(id);
            }
        }
        Ok((!targets.is_empty()).then_some(ChainFailover { targets }))
    }
}

/// How a wanted failover target names a peer in place of a datacenter (no datacenter name
/// has a colon).
const PEER_MARK: &str = "peer:";

/// Where redirects lead: service, subset, datacenter, and the service whose redirect led
/// there last.
type Redirected = (String, String, String, Option<String>);

/// The `(service, subset, datacenter, field)` of each target of the failover `failover`
/// (under key `key`) of `subset` of `service`, in order; a service or subset left empty is
/// the primary's.
fn wanted_failover(
    service: &str,
    subset: &str,
    key: &str,
    failover: &structs::config_entry::ServiceResolverFailover,
) -> Vec<(String, String, String, String)> {
    let at = format!("Failover[{key:?}]");
    let mut wanted: Vec<(String, String, String, String)> = Vec::new();
    let or_own = |s: &str| if s.is_empty() { service.to_owned() } else { s.to_owned() };
    // A target naming neither service nor subset (a datacenter only) keeps the primary's
    // subset, as Consul does.
    let subset_of = |svc: &str, sub: &str| {
        if svc.is_empty() && sub.is_empty() {
            subset.to_owned()
        } else {
            sub.to_owned()
        }
    };
    if !failover.targets.is_empty() {
        for (i, t) in failover.targets.iter().enumerate() {
            let place = if t.peer.is_empty() {
                t.datacenter.clone()
            } else {
                format!("{PEER_MARK}{}", t.peer)
            };
            wanted.push((
                or_own(&t.service),
                subset_of(&t.service, &t.service_subset),
                place,
                format!("{at}.Targets[{i}]"),
            ));
        }
    } else if !failover.datacenters.is_empty() {
        for (i, dc) in failover.datacenters.iter().enumerate() {
            wanted.push((
                or_own(&failover.service),
                subset_of(&failover.service, &failover.service_subset),
                dc.clone(),
                format!("{at}.Datacenters[{i}]"),
            ));
        }
    } else {
        let field = if failover.service_subset.is_empty() {
            format!("{at}.Service")
        } else {
            format!("{at}.ServiceSubset")
        };
        wanted.push((
            or_own(&failover.service),
            failover.service_subset.clone(),
            String::new(),
            field,
        ));
    }
    wanted
}

/// `outer`'s header changes with `inner`'s applied on top (the inner leg is the more
/// specific): its values win for the same header, removals add up.
fn merge_headers(
    outer: Option<&HttpHeaderModifiers>,
    inner: Option<HttpHeaderModifiers>,
) -> Option<HttpHeaderModifiers> {
    let Some(outer) = outer else { return inner };
    let mut merged = outer.clone();
    if let Some(inner) = inner {
        merged.add.extend(inner.add);
        merged.set.extend(inner.set);
        for r in inner.remove {
            if !merged.remove.contains(&r) {
                merged.remove.push(r);
            }
        }
    }
    Some(merged)
}

/// Weights keep two decimals.
fn round2(w: f64) -> f32 {
    ((w * 100.0).round() / 100.0) as f32
}
