//! Validation of the `ingress-gateway` and `terminating-gateway` entries: what can be checked
//! from the entry alone (the protocols of the services it names are checked against the
//! service graph when the catalog plans the write).

use super::gateways::{GatewayTlsConfig, GatewayTlsSdsConfig, IngressGateway, IngressService, TerminatingGateway};
use super::mesh::check_tls_params;
use super::{ConfigEntryKind, check_entry_name};
use crate::Protocol;
use crate::validate::{Problem, Validate, ValidationError};
use std::collections::BTreeSet;

/// The name that stands for every service.
pub const WILDCARD_SERVICE: &str = "*";

impl Validate for IngressGateway {
    fn validate(&self) -> Result<(), ValidationError> {
        check_entry_name(ConfigEntryKind::IngressGateway, &self.name)?;
        check_gateway_tls("TLS", &self.tls)?;
        let mut ports = BTreeSet::new();
        for (l, listener) in self.listeners.iter().enumerate() {
            let at = format!("Listeners[{l}]");
            if listener.port == 0 {
                return Err(ValidationError::new(format!("{at}.Port"), Problem::Required("")));
            }
            if !ports.insert(listener.port) {
                return Err(ValidationError::new(
                    format!("{at}.Port"),
                    Problem::Duplicate(format!("listener port {}", listener.port)),
                ));
            }
            let protocol: Protocol = listener.protocol().parse().map_err(|_| {
                ValidationError::new(
                    format!("{at}.Protocol"),
                    Problem::Invalid(format!(
                        "unsupported protocol {:?}: expected tcp, http, http2 or grpc",
                        listener.protocol
                    )),
                )
            })?;
            let tls_enabled = self.tls.enabled || listener.tls.as_ref().is_some_and(|t| t.enabled);
            if let Some(tls) = &listener.tls {
                check_gateway_tls(&format!("{at}.TLS"), tls)?;
            }
            if listener.services.is_empty() {
                return Err(ValidationError::new(
                    format!("{at}.Services"),
                    Problem::Required("(at least one service per listener)"),
                ));
            }
            if !protocol.is_http() && listener.services.len() > 1 {
                return Err(ValidationError::new(
                    format!("{at}.Services"),
                    Problem::Invalid(format!(
                        "a {protocol} listener takes exactly one service; several need an http, http2 or grpc listener"
                    )),
                ));
            }
            let mut names = BTreeSet::new();
            let mut hosts = BTreeSet::new();
            for (s, svc) in listener.services.iter().enumerate() {
                let at = format!("{at}.Services[{s}]");
                check_ingress_service(&at, svc, protocol, tls_enabled)?;
                if !names.insert(svc.name.as_str()) {
                    return Err(ValidationError::new(
                        format!("{at}.Name"),
                        Problem::Duplicate(format!("service {:?} on listener port {}", svc.name, listener.port)),
                    ));
                }
                if svc.name == WILDCARD_SERVICE {
                    continue;
                }
                let default_host = [format!("{}.ingress.*", svc.name)];
                let own: &[String] = if svc.hosts.is_empty() {
                    &default_host
                } else {
                    &svc.hosts
                };
                for (h, host) in own.iter().enumerate() {
                    // Compared as the domains Envoy matches (`host` and `host:<port>`), so a
                    // host with the listener's port cannot collide with one without.
                    if !host_domains(host, listener.port).into_iter().all(|d| hosts.insert(d)) {
                        let field = if svc.hosts.is_empty() {
                            format!("{at}.Name")
                        } else {
                            format!("{at}.Hosts[{h}]")
                        };
                        return Err(ValidationError::new(
                            field,
                            Problem::Duplicate(format!("host {host:?} on listener port {}", listener.port)),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// One service of an ingress listener of `protocol`.
fn check_ingress_service(
    at: &str,
    svc: &IngressService,
    protocol: Protocol,
    tls_enabled: bool,
) -> Result<(), ValidationError> {
    if svc.name == WILDCARD_SERVICE {
        if !protocol.is_http() {
            return Err(ValidationError::new(
                format!("{at}.Name"),
                Problem::NotAllowed("on a tcp listener: \"*\" needs an http, http2 or grpc listener"),
            ));
        }
        if !svc.hosts.is_empty() {
            return Err(ValidationError::new(
                format!("{at}.Hosts"),
                Problem::NotAllowed("with service \"*\": each service gets its default host"),
            ));
        }
    } else {
        crate::validate::check_name(&format!("{at}.Name"), &svc.name, "")?;
    }
    check_default_scope(at, "Namespace", &svc.namespace)?;
    check_default_scope(at, "Partition", &svc.partition)?;
    if !svc.hosts.is_empty() && !protocol.is_http() {
        return Err(ValidationError::new(
            format!("{at}.Hosts"),
            Problem::NotAllowed("on a tcp listener: hosts route HTTP requests"),
        ));
    }
    for (h, host) in svc.hosts.iter().enumerate() {
        check_host(&format!("{at}.Hosts[{h}]"), host, tls_enabled)?;
    }
    if let Some(sds) = svc.tls.as_ref().and_then(|t| t.sds.as_ref()) {
        check_sds(&format!("{at}.TLS.SDS"), sds)?;
        // Its certificate is chosen by SNI on its hosts: without hosts nothing selects it.
        if svc.hosts.is_empty() {
            return Err(ValidationError::new(
                format!("{at}.Hosts"),
                Problem::Required("(a service with its own TLS.SDS certificate is selected by SNI on its hosts)"),
            ));
        }
    }
    if let Some(h) = &svc.request_headers {
        h.validate(&format!("{at}.RequestHeaders"))?;
    }
    if let Some(h) = &svc.response_headers {
        h.validate(&format!("{at}.ResponseHeaders"))?;
    }
    Ok(())
}

/// `Namespace` and `Partition` name only the default one (there are no others here).
fn check_default_scope(at: &str, field: &str, value: &str) -> Result<(), ValidationError> {
    if value.is_empty() || value == "default" {
        return Ok(());
    }
    Err(ValidationError::new(
        format!("{at}.{field}"),
        Problem::Invalid(format!("only \"default\" is supported, got {value:?}")),
    ))
}

/// A host without its port (`localhost:9999` -> `localhost`): the name a certificate and
/// SNI carry.
pub fn host_name(host: &str) -> &str {
    split_port(host).0
}

/// `host[:port]` split; a suffix that is not a port number stays part of the name.
fn split_port(host: &str) -> (&str, Option<u16>) {
    match host.rsplit_once(':') {
        Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            (name, Some(port.parse().unwrap_or(0)))
        }
        _ => (host, None),
    }
}

/// The `:authority` values an ingress host matches on a listener of `listener_port`, as Envoy
/// virtual-host domains: a host without a port matches with and without the listener's port
/// (clients may send it); a host with a port matches exactly that (gRPC clients send it).
pub fn host_domains(host: &str, listener_port: u16) -> Vec<String> {
    match split_port(host) {
        (_, Some(_)) => vec![host.to_owned()],
        (name, None) if name == WILDCARD_SERVICE => vec![host.to_owned()],
        (name, None) => vec![format!("{name}:{listener_port}"), name.to_owned()],
    }
}

/// A host an ingress service answers to: a DNS name whose first label may be `*`, or `*`
/// alone (every host, only without TLS: it cannot be a certificate's DNS SAN); either may
/// end in `:<port>` (a name with a port matches requests naming that port, as gRPC clients
/// send it), except `*`.
pub(crate) fn check_host(field: &str, host: &str, tls_enabled: bool) -> Result<(), ValidationError> {
    let invalid = |why: String| Err(ValidationError::new(field, Problem::Invalid(why)));
    let full = host;
    let (host, port) = split_port(host);
    if port == Some(0) {
        return invalid(format!("host {full:?}: the port must be 1 to 65535"));
    }
    if host == WILDCARD_SERVICE && port.is_some() {
        return invalid("host \"*\" cannot name a port: it matches every host and port".into());
    }
    if host == WILDCARD_SERVICE {
        if tls_enabled {
            return invalid(
                "host \"*\" is not allowed with TLS: every host must be a DNS name for the certificate".into(),
            );
        }
        return Ok(());
    }
    if host.len() > 253 {
        return invalid(format!("host {full:?} is longer than 253 characters"));
    }
    let rest = host.strip_prefix("*.").unwrap_or(host);
    for label in rest.split('.') {
        let valid = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !valid {
            let why = if label.contains('*') {
                format!("host {full:?}: a wildcard is only allowed as the whole first label (\"*.example.com\")")
            } else {
                format!("host {full:?} is not a valid DNS name")
            };
            return invalid(why);
        }
    }
    Ok(())
}

/// TLS of the gateway or of one listener.
fn check_gateway_tls(at: &str, tls: &GatewayTlsConfig) -> Result<(), ValidationError> {
    if let Some(sds) = &tls.sds {
        check_sds(&format!("{at}.SDS"), sds)?;
    }
    check_tls_params(at, &tls.tls_min_version, &tls.tls_max_version, &tls.cipher_suites)
}

/// An SDS certificate names both the cluster and the resource.
fn check_sds(at: &str, sds: &GatewayTlsSdsConfig) -> Result<(), ValidationError> {
    if sds.cluster_name.is_empty() {
        return Err(ValidationError::new(
            format!("{at}.ClusterName"),
            Problem::Required("with SDS"),
        ));
    }
    if sds.cert_resource.is_empty() {
        return Err(ValidationError::new(
            format!("{at}.CertResource"),
            Problem::Required("with SDS"),
        ));
    }
    Ok(())
}

impl Validate for TerminatingGateway {
    fn validate(&self) -> Result<(), ValidationError> {
        check_entry_name(ConfigEntryKind::TerminatingGateway, &self.name)?;
        let mut names = BTreeSet::new();
        for (i, svc) in self.services.iter().enumerate() {
            let at = format!("Services[{i}]");
            if svc.name != WILDCARD_SERVICE {
                crate::validate::check_name(&format!("{at}.Name"), &svc.name, "")?;
            }
            if !names.insert(svc.name.as_str()) {
                return Err(ValidationError::new(
                    format!("{at}.Name"),
                    Problem::Duplicate(format!("service {:?}", svc.name)),
                ));
            }
            check_default_scope(&at, "Namespace", &svc.namespace)?;
            check_default_scope(&at, "Partition", &svc.partition)?;
            match (svc.cert_file.is_empty(), svc.key_file.is_empty()) {
                (false, true) => {
                    return Err(ValidationError::new(
                        format!("{at}.KeyFile"),
                        Problem::Required("with CertFile"),
                    ));
                }
                (true, false) => {
                    return Err(ValidationError::new(
                        format!("{at}.CertFile"),
                        Problem::Required("with KeyFile"),
                    ));
                }
                _ => {}
            }
            if svc.ca_file.is_empty() {
                if !svc.cert_file.is_empty() {
                    return Err(ValidationError::new(
                        format!("{at}.CAFile"),
                        Problem::Required("with CertFile and KeyFile (TLS origination verifies the service)"),
                    ));
                }
                if !svc.sni.is_empty() {
                    return Err(ValidationError::new(
                        format!("{at}.CAFile"),
                        Problem::Required("with SNI (SNI is sent only when the gateway originates TLS)"),
                    ));
                }
            }
            // Paths are Envoy's to open: a relative one resolves against the gateway Envoy's
            // working directory, as in Consul. Only what no file name can hold is refused.
            for (field, path) in [
                ("CAFile", &svc.ca_file),
                ("CertFile", &svc.cert_file),
                ("KeyFile", &svc.key_file),
            ] {
                if path.contains(['\0', '\n', '\r']) {
                    return Err(ValidationError::new(
                        format!("{at}.{field}"),
                        Problem::Invalid(format!("{path:?} is not a file name")),
                    ));
                }
            }
        }
        Ok(())
    }
}
