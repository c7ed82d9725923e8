//! Binding routes to API gateway listeners, and the conditions that say how it went.
//!
//! One function decides both what a gateway's Envoy serves (the proxy's snapshot binds the
//! routes it watches) and what the entries' `Status` says (the HTTP API binds the catalog's
//! entries when they are read), so the two cannot disagree. A route or listener that cannot
//! bind is kept and says why; nothing is dropped silently.
//!
//! Rules (Consul's): a route attaches to the listeners its parents name (one listener by
//! `SectionName`, else every listener of the gateway that fits); an http-route fits an http
//! listener whose hostname intersects its hostnames, a tcp-route a tcp listener, and a tcp
//! listener takes one tcp-route (the first by name; the others say so).

use super::api_gateway::{
    ApiGateway, ApiGatewayListener, Condition, ConfigEntryStatus, HttpRoute, ResourceReference, TcpRoute,
};
use super::{ConfigEntry, ConfigEntryKind};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A route bound to a listener.
#[derive(Debug, Clone)]
pub enum BoundRoute {
    /// An http-route, with the hostnames it answers on this listener (`*`: any).
    Http(Arc<ConfigEntry>, Vec<String>),
    /// A tcp-route.
    Tcp(Arc<ConfigEntry>),
}

impl BoundRoute {
    /// The http-route, if it is one.
    pub fn http(&self) -> Option<(&HttpRoute, &[String])> {
        match self {
            BoundRoute::Http(e, hosts) => match &**e {
                ConfigEntry::HttpRoute(r) => Some((r, hosts)),
                _ => None,
            },
            BoundRoute::Tcp(_) => None,
        }
    }

    /// The tcp-route, if it is one.
    pub fn tcp(&self) -> Option<&TcpRoute> {
        match self {
            BoundRoute::Tcp(e) => match &**e {
                ConfigEntry::TcpRoute(r) => Some(r),
                _ => None,
            },
            BoundRoute::Http(..) => None,
        }
    }
}

/// A gateway listener and what is bound to it.
#[derive(Debug, Clone)]
pub struct BoundListener {
    /// The listener's index in the gateway entry.
    pub index: usize,
    /// The routes bound to it, by name.
    pub routes: Vec<BoundRoute>,
    /// Its certificates that exist; those that do not are in the gateway's conditions.
    pub certificates: Vec<ResourceReference>,
    /// Routes that fit it but could not bind (a tcp listener's second route).
    pub conflicts: Vec<String>,
}

/// How one gateway's listeners and the routes naming it bound.
#[derive(Debug, Clone, Default)]
pub struct Binding {
    /// Per listener, in the entry's order.
    pub listeners: Vec<BoundListener>,
    /// The gateway's conditions.
    pub gateway: Vec<Condition>,
    /// Per route naming the gateway (kind, name): its `Bound` conditions about it.
    pub routes: BTreeMap<(ConfigEntryKind, String), Vec<Condition>>,
}

/// A condition.
pub fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    resource: Option<ResourceReference>,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        resource,
        last_transition_time: None,
    }
}

fn listener_ref(gateway: &str, listener: &str) -> ResourceReference {
    ResourceReference {
        kind: ConfigEntryKind::ApiGateway.as_str().into(),
        name: gateway.into(),
        section_name: listener.into(),
        ..Default::default()
    }
}

/// Whether host patterns `a` and `b` (DNS names whose first label may be `*`) can name the
/// same host.
pub fn hosts_intersect(a: &str, b: &str) -> bool {
    let (a, b) = (a.to_ascii_lowercase(), b.to_ascii_lowercase());
    if a == b {
        return true;
    }
    let under = |wild: &str, name: &str| wild.strip_prefix('*').is_some_and(|suffix| name.ends_with(suffix));
    under(&a, &b) || under(&b, &a)
}

/// The hosts an http-route answers on `listener`, or why it answers none.
fn route_hosts(route: &HttpRoute, listener: &ApiGatewayListener) -> Result<Vec<String>, String> {
    if route.hostnames.is_empty() {
        return Ok(vec![if listener.hostname.is_empty() {
            "*".into()
        } else {
            listener.hostname.clone()
        }]);
    }
    if listener.hostname.is_empty() {
        return Ok(route.hostnames.clone());
    }
    let hosts: Vec<String> = route
        .hostnames
        .iter()
        .filter(|h| hosts_intersect(h, &listener.hostname))
        .map(|h| {
            // The narrower of the two names what is answered.
            if h.starts_with("*.") && !listener.hostname.starts_with("*.") {
                listener.hostname.clone()
            } else {
                h.clone()
            }
        })
        .collect();
    if hosts.is_empty() {
        return Err(format!(
            "none of its hostnames ({}) is served by listener {:?} (hostname {:?})",
            route.hostnames.join(", "),
            listener.name,
            listener.hostname
        ));
    }
    Ok(hosts)
}

/// Binds every route of `routes` (entries of any kind; http-routes and tcp-routes are read)
/// that names `gateway`. `exists` says whether a certificate entry exists.
pub fn bind(
    gateway: &ApiGateway,
    routes: &[Arc<ConfigEntry>],
    exists: impl Fn(ConfigEntryKind, &str) -> bool,
) -> Binding {
    let mut b = Binding {
        listeners: gateway
            .listeners
            .iter()
            .enumerate()
            .map(|(index, _)| BoundListener {
                index,
                routes: Vec::new(),
                certificates: Vec::new(),
                conflicts: Vec::new(),
            })
            .collect(),
        ..Default::default()
    };
    b.gateway
        .push(condition("Accepted", true, "Accepted", "gateway is valid".into(), None));
    bind_certificates(gateway, &exists, &mut b);
    let mut sorted: Vec<&Arc<ConfigEntry>> = routes.iter().collect();
    sorted.sort_by(|x, y| (x.kind(), x.name()).cmp(&(y.kind(), y.name())));
    for entry in sorted {
        let parents = match &**entry {
            ConfigEntry::HttpRoute(r) => &r.parents,
            ConfigEntry::TcpRoute(r) => &r.parents,
            _ => continue,
        };
        for parent in parents.iter().filter(|p| names_gateway(p, &gateway.name)) {
            let c = bind_one(gateway, entry, parent, &mut b);
            b.routes
                .entry((entry.kind(), entry.name().to_owned()))
                .or_default()
                .push(c);
        }
    }
    for (l, listener) in gateway.listeners.iter().enumerate() {
        let at = Some(listener_ref(&gateway.name, &listener.name));
        let conflicts = &b.listeners[l].conflicts;
        b.gateway.push(if conflicts.is_empty() {
            condition(
                "Conflicted",
                false,
                "NoConflict",
                format!("listener {:?} has no conflicting routes", listener.name),
                at,
            )
        } else {
            condition(
                "Conflicted",
                true,
                "RouteConflict",
                format!(
                    "listener {:?} takes one tcp-route; not bound: {}",
                    listener.name,
                    conflicts.join(", ")
                ),
                at,
            )
        });
    }
    b
}

fn names_gateway(parent: &ResourceReference, gateway: &str) -> bool {
    parent.name == gateway && parent.kind_or(ConfigEntryKind::ApiGateway) == Some(ConfigEntryKind::ApiGateway)
}

fn bind_certificates(gateway: &ApiGateway, exists: &impl Fn(ConfigEntryKind, &str) -> bool, b: &mut Binding) {
    for (l, listener) in gateway.listeners.iter().enumerate() {
        let mut missing = Vec::new();
        for cert in &listener.tls.certificates {
            let kind = cert.kind_or(ConfigEntryKind::InlineCertificate);
            match kind {
                Some(k) if exists(k, &cert.name) => b.listeners[l].certificates.push(cert.clone()),
                _ => missing.push(format!(
                    "{}/{}",
                    kind.map_or(cert.kind.as_str(), |k| k.as_str()),
                    cert.name
                )),
            }
        }
        let at = Some(listener_ref(&gateway.name, &listener.name));
        b.gateway.push(if missing.is_empty() {
            condition(
                "ResolvedRefs",
                true,
                "ResolvedRefs",
                format!("listener {:?}: every certificate it names exists", listener.name),
                at,
            )
        } else {
            condition(
                "ResolvedRefs",
                false,
                "InvalidCertificateRef",
                format!(
                    "listener {:?}: certificate {} does not exist, so it is not served",
                    listener.name,
                    missing.join(", ")
                ),
                at,
            )
        });
    }
}

/// Binds `entry` to the listeners `parent` names; returns its `Bound` condition.
fn bind_one(gateway: &ApiGateway, entry: &Arc<ConfigEntry>, parent: &ResourceReference, b: &mut Binding) -> Condition {
    let at = Some(parent.clone());
    let candidates: Vec<usize> = if parent.section_name.is_empty() {
        (0..gateway.listeners.len()).collect()
    } else {
        match gateway.listeners.iter().position(|l| l.name == parent.section_name) {
            Some(i) => vec![i],
            None => {
                return condition(
                    "Bound",
                    false,
                    "NoMatchingParent",
                    format!("gateway {:?} has no listener {:?}", gateway.name, parent.section_name),
                    at,
                );
            }
        }
    };
    let mut bound = Vec::new();
    let mut why = Vec::new();
    let mut reason = "NotAllowedByListeners";
    for i in candidates {
        let listener = &gateway.listeners[i];
        match &**entry {
            ConfigEntry::HttpRoute(r) if listener.is_http() => match route_hosts(r, listener) {
                Ok(hosts) => {
                    b.listeners[i].routes.push(BoundRoute::Http(Arc::clone(entry), hosts));
                    bound.push(listener.name.clone());
                }
                Err(e) => {
                    reason = "NoMatchingListenerHostname";
                    why.push(e);
                }
            },
            ConfigEntry::TcpRoute(_) if !listener.is_http() => {
                if let Some(taken) = b.listeners[i].routes.first() {
                    let other = taken.tcp().map_or(String::new(), |t| t.name.clone());
                    reason = "RouteConflict";
                    b.listeners[i].conflicts.push(entry.name().to_owned());
                    why.push(format!(
                        "tcp listener {:?} already carries tcp-route {other:?} (a tcp listener takes one route)",
                        listener.name
                    ));
                } else {
                    b.listeners[i].routes.push(BoundRoute::Tcp(Arc::clone(entry)));
                    bound.push(listener.name.clone());
                }
            }
            _ => why.push(format!(
                "listener {:?} is {}; a {} binds to {} listeners",
                listener.name,
                listener.protocol,
                entry.kind(),
                if matches!(&**entry, ConfigEntry::HttpRoute(_)) {
                    "http"
                } else {
                    "tcp"
                }
            )),
        }
    }
    if bound.is_empty() {
        let message = if why.is_empty() {
            format!("gateway {:?} has no listener", gateway.name)
        } else {
            why.join("; ")
        };
        condition("Bound", false, reason, message, at)
    } else {
        condition(
            "Bound",
            true,
            "Bound",
            format!("bound to listener {} of gateway {:?}", bound.join(", "), gateway.name),
            at,
        )
    }
}

/// The services an http-route or tcp-route sends to, as written (a service a rule names
/// twice comes twice).
pub fn route_service_names(entry: &ConfigEntry) -> impl Iterator<Item = &str> {
    let (http, tcp) = match entry {
        ConfigEntry::HttpRoute(r) => (Some(r), None),
        ConfigEntry::TcpRoute(r) => (None, Some(r)),
        _ => (None, None),
    };
    let http = http
        .into_iter()
        .flat_map(|r| &r.rules)
        .flat_map(|rule| &rule.services)
        .map(|s| s.name.as_str());
    let tcp = tcp.into_iter().flat_map(|r| &r.services).map(|s| s.name.as_str());
    http.chain(tcp)
}

/// The services an http-route or tcp-route sends to, sorted, once each.
pub fn route_services(entry: &ConfigEntry) -> Vec<&str> {
    let mut names: Vec<&str> = route_service_names(entry).collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// Every status of the API gateway family of `entries` (gateways and routes; other kinds
/// are ignored): what `GET /v1/config` shows. `has_service` says whether a service is
/// registered, `exists` whether an entry exists.
pub fn statuses(
    gateways: &[Arc<ConfigEntry>],
    routes: &[Arc<ConfigEntry>],
    has_service: impl Fn(&str) -> bool,
    exists: impl Fn(ConfigEntryKind, &str) -> bool,
) -> BTreeMap<(ConfigEntryKind, String), ConfigEntryStatus> {
    let mut out: BTreeMap<(ConfigEntryKind, String), ConfigEntryStatus> = BTreeMap::new();
    let mut bound: BTreeMap<(ConfigEntryKind, String), Vec<Condition>> = BTreeMap::new();
    for g in gateways {
        let ConfigEntry::ApiGateway(gateway) = &**g else {
            continue;
        };
        let b = bind(gateway, routes, &exists);
        out.insert(
            (ConfigEntryKind::ApiGateway, gateway.name.clone()),
            ConfigEntryStatus { conditions: b.gateway },
        );
        for (key, conditions) in b.routes {
            bound.entry(key).or_default().extend(conditions);
        }
    }
    for r in routes {
        let parents = match &**r {
            ConfigEntry::HttpRoute(route) => &route.parents,
            ConfigEntry::TcpRoute(route) => &route.parents,
            _ => continue,
        };
        let key = (r.kind(), r.name().to_owned());
        let mut conditions = vec![condition("Accepted", true, "Accepted", "route is valid".into(), None)];
        let missing: Vec<&str> = route_services(r).into_iter().filter(|s| !has_service(s)).collect();
        conditions.push(if missing.is_empty() {
            condition(
                "ResolvedRefs",
                true,
                "ResolvedRefs",
                "every service it sends to is registered".into(),
                None,
            )
        } else {
            condition(
                "ResolvedRefs",
                false,
                "BackendNotFound",
                format!(
                    "service {} is not registered: its requests fail until it is",
                    missing.join(", ")
                ),
                None,
            )
        });
        let mut about_parents = bound.remove(&key).unwrap_or_default();
        for p in parents {
            let known = p.kind_or(ConfigEntryKind::ApiGateway) == Some(ConfigEntryKind::ApiGateway)
                && exists(ConfigEntryKind::ApiGateway, &p.name);
            if !known {
                about_parents.push(condition(
                    "Bound",
                    false,
                    "GatewayNotFound",
                    format!("api-gateway {:?} does not exist", p.name),
                    Some(p.clone()),
                ));
            }
        }
        conditions.extend(about_parents);
        out.insert(key, ConfigEntryStatus { conditions });
    }
    out
}
