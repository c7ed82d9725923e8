//! Turning a service definition into what the agent keeps: the instance, its checks, and the
//! sidecar proxy `Connect.SidecarService` stands for, filled in as Consul does (ids and names
//! with `-sidecar-proxy`, a port from the sidecar range, the destination from the parent,
//! and the default checks: the proxy's public port over TCP plus an alias of the parent).

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::time::Duration;
use structs::agent::{CheckKind, CheckType, ServiceDefinition};
use structs::health::HealthCheckDefinition;
use structs::{GoDuration, HealthCheck, HealthStatus, NodeService, Problem, ServiceKind, Validate, ValidationError};

/// Suffix of a sidecar's id and name.
pub const SIDECAR_SUFFIX: &str = "-sidecar-proxy";

/// Suffix of a managed proxy's id and name (Consul 1.4's `Connect.Proxy`).
pub const MANAGED_SUFFIX: &str = "-proxy";

/// Where a sidecar's local service address defaults to.
const LOCAL_ADDRESS: &str = "127.0.0.1";

/// One check ready to register.
#[derive(Debug, Clone)]
pub struct NewCheck {
    /// The check, critical (or its `Status`) until it first runs.
    pub check: HealthCheck,
    /// Its definition, for persistence and `/v1/agent/checks`.
    pub definition: CheckType,
    /// How it runs.
    pub kind: CheckKind,
    /// Where the definition gave it (`Check`, `Checks[1]`); empty for a check the agent made
    /// (a sidecar's defaults).
    pub at: String,
}

/// A definition made concrete.
#[derive(Debug, Clone)]
pub struct Expanded {
    /// The instance.
    pub service: NodeService,
    /// Its checks.
    pub checks: Vec<NewCheck>,
    /// The sidecar with its checks, when the definition asked for one (`Connect.SidecarService`
    /// or Consul 1.4's `Connect.Proxy`).
    pub sidecar: Option<(NodeService, Vec<NewCheck>)>,
    /// For `Connect.Proxy`: the command the agent runs the proxy with (empty: the default).
    pub managed: Option<Vec<String>>,
}

/// Expands `def` against the ports of the services already registered on this node, by id
/// (the sidecar keeps the port it had, else takes the lowest free one of `ports`).
pub fn expand(
    def: &ServiceDefinition,
    existing: &BTreeMap<String, u16>,
    ports: &RangeInclusive<u16>,
) -> Result<Expanded, ValidationError> {
    def.validate()?;
    let service = def.node_service();
    let checks = build_checks(&service, def.all_checks().collect())?;
    let mut managed = None;
    let sidecar = match (&def.connect.sidecar_service, &def.connect.proxy) {
        (Some(sc), _) => {
            Some(expand_sidecar(&service, sc, existing, ports).map_err(|e| e.within("Connect.SidecarService"))?)
        }
        (None, Some(proxy)) => {
            // Consul 1.4: the proxy instance is `<id>-proxy`, named `<name>-proxy`.
            let sc = ServiceDefinition {
                id: format!("{}{MANAGED_SUFFIX}", service.id),
                name: format!("{}{MANAGED_SUFFIX}", service.service),
                proxy: structs::ConnectProxyConfig {
                    config: proxy.config.clone(),
                    upstreams: proxy.upstreams.clone(),
                    ..Default::default()
                },
                ..ServiceDefinition::default()
            };
            managed = Some(proxy.command.clone());
            Some(expand_sidecar(&service, &sc, existing, ports).map_err(|e| e.within("Connect.Proxy"))?)
        }
        (None, None) => None,
    };
    Ok(Expanded {
        service,
        checks,
        sidecar,
        managed,
    })
}

fn expand_sidecar(
    parent: &NodeService,
    sc: &ServiceDefinition,
    existing: &BTreeMap<String, u16>,
    ports: &RangeInclusive<u16>,
) -> Result<(NodeService, Vec<NewCheck>), ValidationError> {
    let mut proxy = sc.node_service();
    proxy.kind = ServiceKind::ConnectProxy;
    if sc.id.is_empty() {
        proxy.id = format!("{}{SIDECAR_SUFFIX}", parent.id);
    }
    if sc.name.is_empty() {
        proxy.service = format!("{}{SIDECAR_SUFFIX}", parent.service);
    }
    if proxy.tags.is_empty() {
        proxy.tags.clone_from(&parent.tags);
    }
    if proxy.meta.is_empty() {
        proxy.meta.clone_from(&parent.meta);
    }
    proxy.proxy.destination_service_name.clone_from(&parent.service);
    proxy.proxy.destination_service_id.clone_from(&parent.id);
    if proxy.proxy.local_service_address.is_empty() && proxy.proxy.local_service_socket_path.is_empty() {
        proxy.proxy.local_service_address = LOCAL_ADDRESS.into();
    }
    if proxy.proxy.local_service_port == 0 {
        proxy.proxy.local_service_port = parent.port;
    }
    assign_port(&mut proxy, parent, existing, ports)?;
    proxy.validate().map_err(|e| {
        if e.field == "Service" {
            ValidationError {
                field: "Name".into(),
                ..e
            }
        } else {
            e
        }
    })?;
    let given: Vec<(String, &CheckType)> = sc.all_checks().collect();
    let defaults = if given.is_empty() {
        default_checks(parent, &proxy)
    } else {
        Vec::new()
    };
    let checks = if given.is_empty() {
        build_checks(&proxy, defaults.iter().map(|c| (String::new(), c)).collect())?
    } else {
        build_checks(&proxy, given)?
    };
    Ok((proxy, checks))
}

/// The sidecar's public listener answers on TCP, and the sidecar is only as healthy as the
/// service it fronts.
fn default_checks(parent: &NodeService, proxy: &NodeService) -> Vec<CheckType> {
    let host = if !proxy.address.is_empty() {
        proxy.address.clone()
    } else if !proxy.proxy.local_service_address.is_empty() {
        proxy.proxy.local_service_address.clone()
    } else {
        LOCAL_ADDRESS.into()
    };
    let host = if host.contains(':') { format!("[{host}]") } else { host };
    let mut checks = Vec::new();
    if proxy.port != 0 {
        checks.push(CheckType {
            name: "Connect Sidecar Listening".into(),
            tcp: format!("{host}:{}", proxy.port),
            interval: GoDuration(Duration::from_secs(10)),
            ..CheckType::default()
        });
    }
    checks.push(CheckType {
        name: format!("Connect Sidecar Aliasing {}", parent.id),
        alias_service: parent.id.clone(),
        ..CheckType::default()
    });
    checks
}

/// The checks of `service` from their definitions: ids `service:<id>` (`:<n>` when there
/// are several) unless given, names `Service '<name>' check` unless given.
pub fn build_checks(service: &NodeService, defs: Vec<(String, &CheckType)>) -> Result<Vec<NewCheck>, ValidationError> {
    let several = defs.len() > 1;
    let mut out = Vec::with_capacity(defs.len());
    for (i, (at, def)) in defs.into_iter().enumerate() {
        let kind = def.kind().map_err(|e| e.within(&at))?;
        let mut id = def.given_id().to_owned();
        if id.is_empty() {
            id = format!("service:{}", service.id);
            if several {
                id.push_str(&format!(":{}", i + 1));
            }
        }
        let name = if def.name.is_empty() {
            format!("Service '{}' check", service.service)
        } else {
            def.name.clone()
        };
        let mut check = health_check(id, name, def, &kind);
        check.service_id.clone_from(&service.id);
        check.service_name.clone_from(&service.service);
        check.service_tags.clone_from(&service.tags);
        out.push(NewCheck {
            check,
            definition: def.clone(),
            kind,
            at,
        });
    }
    Ok(out)
}

/// The catalog's view of a check from its definition (no node or service yet).
pub fn health_check(id: String, name: String, def: &CheckType, kind: &CheckKind) -> HealthCheck {
    HealthCheck {
        check_id: id,
        name,
        status: def.status.unwrap_or(HealthStatus::Critical),
        notes: def.notes.clone(),
        check_type: kind.type_name().into(),
        interval: go_duration_text(def.interval),
        timeout: go_duration_text(def.timeout),
        definition: HealthCheckDefinition {
            http: def.http.clone(),
            method: def.method.clone(),
            header: def.header.clone(),
            tls_skip_verify: def.tls_skip_verify,
            tcp: def.tcp.clone(),
            interval: def.interval,
            timeout: def.timeout,
            deregister_critical_service_after: def.deregister_critical_service_after,
            ..HealthCheckDefinition::default()
        },
        ..HealthCheck::default()
    }
}

/// A duration as Consul's check shows it: Go's text, `""` when unset.
fn go_duration_text(d: structs::GoDuration) -> String {
    if d.is_zero() { String::new() } else { d.to_string() }
}

#[cfg(test)]
mod tests;

/// Checks a given sidecar port against the node's other services, or picks one: the port the
/// sidecar had before when still free, else the lowest free port of `ports`.
fn assign_port(
    proxy: &mut NodeService,
    parent: &NodeService,
    existing: &BTreeMap<String, u16>,
    ports: &RangeInclusive<u16>,
) -> Result<(), ValidationError> {
    let taken = |port: u16| {
        existing
            .iter()
            .any(|(id, p)| *id != proxy.id && *id != parent.id && *p == port)
            || (parent.port == port && parent.id != proxy.id)
    };
    if proxy.port != 0 {
        if taken(proxy.port) {
            return Err(ValidationError::new(
                "Port",
                Problem::Invalid(format!(
                    "{} is already used by another service on this node",
                    proxy.port
                )),
            ));
        }
        return Ok(());
    }
    if !proxy.socket_path.is_empty() {
        return Ok(());
    }
    let kept = existing
        .get(&proxy.id)
        .copied()
        .filter(|p| ports.contains(p) && !taken(*p));
    match kept.or_else(|| ports.clone().find(|p| !taken(*p))) {
        Some(p) => {
            proxy.port = p;
            Ok(())
        }
        None => Err(ValidationError::new(
            "Port",
            Problem::Invalid(format!(
                "no free sidecar port left in {}-{}: give one",
                ports.start(),
                ports.end()
            )),
        )),
    }
}
