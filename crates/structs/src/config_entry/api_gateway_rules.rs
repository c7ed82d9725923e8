//! Validation of the API gateway's entries: what can be checked from the entry alone. That a
//! certificate parses and matches its key is checked by the catalog (it has the X.509
//! parser); whether the entries a route or listener names exist is the status's business,
//! not a write's (a route may be written before its gateway).

use super::api_gateway::{
    ApiGateway, FileSystemCertificate, HttpFilters, HttpMatch, HttpRoute, HttpRouteRule, InlineCertificate,
    ResourceReference, TcpRoute,
};
use super::gateway_rules::check_host;
use super::mesh::check_tls_versions;
use super::{ConfigEntryKind, RETRY_ON_CONDITIONS, check_entry_name, check_regex};
use crate::validate::{Problem, Validate, ValidationError};
use std::collections::BTreeSet;

/// The certificate kinds a listener may name.
pub const CERTIFICATE_KINDS: [ConfigEntryKind; 2] = [
    ConfigEntryKind::InlineCertificate,
    ConfigEntryKind::FileSystemCertificate,
];

fn invalid(field: impl Into<String>, why: impl Into<String>) -> ValidationError {
    ValidationError::new(field, Problem::Invalid(why.into()))
}

fn check_scope(at: &str, partition: &str, namespace: &str) -> Result<(), ValidationError> {
    for (field, v) in [("Partition", partition), ("Namespace", namespace)] {
        if !v.is_empty() && v != "default" {
            return Err(invalid(
                format!("{at}.{field}"),
                format!("only \"default\" is supported, got {v:?}"),
            ));
        }
    }
    Ok(())
}

/// A reference of one of `kinds` (an empty kind is the first).
fn check_reference(at: &str, r: &ResourceReference, kinds: &[ConfigEntryKind]) -> Result<(), ValidationError> {
    if !r.kind.is_empty() && !kinds.iter().any(|k| k.as_str().eq_ignore_ascii_case(&r.kind)) {
        let names: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
        return Err(invalid(
            format!("{at}.Kind"),
            format!(
                "{:?} cannot be referenced here: expected {}",
                r.kind,
                names.join(" or ")
            ),
        ));
    }
    crate::validate::check_name(&format!("{at}.Name"), &r.name, "")?;
    check_scope(at, &r.partition, &r.namespace)
}

impl ResourceReference {
    /// The kind it names, `default` when unset.
    pub fn kind_or(&self, default: ConfigEntryKind) -> Option<ConfigEntryKind> {
        if self.kind.is_empty() {
            Some(default)
        } else {
            self.kind.parse().ok()
        }
    }
}

impl Validate for ApiGateway {
    fn validate(&self) -> Result<(), ValidationError> {
        check_entry_name(ConfigEntryKind::ApiGateway, &self.name)?;
        if self.listeners.is_empty() {
            return Err(ValidationError::new(
                "Listeners",
                Problem::Required("(at least one listener)"),
            ));
        }
        let mut names = BTreeSet::new();
        let mut ports = BTreeSet::new();
        for (i, l) in self.listeners.iter().enumerate() {
            let at = format!("Listeners[{i}]");
            crate::validate::check_name(&format!("{at}.Name"), &l.name, "")?;
            if !names.insert(l.name.as_str()) {
                return Err(ValidationError::new(
                    format!("{at}.Name"),
                    Problem::Duplicate(format!("listener name {:?}", l.name)),
                ));
            }
            crate::validate::check_port(&format!("{at}.Port"), l.port, "")?;
            if !ports.insert(l.port) {
                return Err(ValidationError::new(
                    format!("{at}.Port"),
                    Problem::Duplicate(format!("listener port {}", l.port)),
                ));
            }
            if !(l.is_http() || l.protocol.eq_ignore_ascii_case("tcp")) {
                return Err(invalid(
                    format!("{at}.Protocol"),
                    format!("unsupported protocol {:?}: expected http or tcp", l.protocol),
                ));
            }
            if !l.hostname.is_empty() {
                if !l.is_http() {
                    return Err(ValidationError::new(
                        format!("{at}.Hostname"),
                        Problem::NotAllowed("on a tcp listener (a connection names no host)"),
                    ));
                }
                check_host(&format!("{at}.Hostname"), &l.hostname, true)?;
                if l.hostname.contains(':') {
                    return Err(invalid(format!("{at}.Hostname"), "a listener's hostname names no port"));
                }
            }
            let tls = &l.tls;
            for (c, r) in tls.certificates.iter().enumerate() {
                check_reference(&format!("{at}.TLS.Certificates[{c}]"), r, &CERTIFICATE_KINDS)?;
            }
            if tls.certificates.is_empty()
                && (!tls.min_version.is_empty() || !tls.max_version.is_empty() || !tls.cipher_suites.is_empty())
            {
                return Err(ValidationError::new(
                    format!("{at}.TLS.Certificates"),
                    Problem::Required("when TLS versions or cipher suites are set"),
                ));
            }
            check_tls_versions(
                &format!("{at}.TLS"),
                ("MinVersion", &tls.min_version),
                ("MaxVersion", &tls.max_version),
                &tls.cipher_suites,
            )?;
        }
        Ok(())
    }
}

fn check_parents(parents: &[ResourceReference]) -> Result<(), ValidationError> {
    if parents.is_empty() {
        return Err(ValidationError::new(
            "Parents",
            Problem::Required("(the gateway it attaches to)"),
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, p) in parents.iter().enumerate() {
        let at = format!("Parents[{i}]");
        check_reference(&at, p, &[ConfigEntryKind::ApiGateway])?;
        if !seen.insert((p.name.as_str(), p.section_name.as_str())) {
            return Err(ValidationError::new(
                at,
                Problem::Duplicate(format!("parent {:?} section {:?}", p.name, p.section_name)),
            ));
        }
    }
    Ok(())
}

impl Validate for HttpRoute {
    fn validate(&self) -> Result<(), ValidationError> {
        check_entry_name(ConfigEntryKind::HttpRoute, &self.name)?;
        check_parents(&self.parents)?;
        for (i, h) in self.hostnames.iter().enumerate() {
            let at = format!("Hostnames[{i}]");
            check_host(&at, h, true)?;
            if h.contains(':') {
                return Err(invalid(at, "a route's hostname names no port"));
            }
        }
        if self.rules.is_empty() {
            return Err(ValidationError::new("Rules", Problem::Required("(at least one rule)")));
        }
        for (i, rule) in self.rules.iter().enumerate() {
            check_rule(&format!("Rules[{i}]"), rule)?;
        }
        Ok(())
    }
}

fn check_rule(at: &str, rule: &HttpRouteRule) -> Result<(), ValidationError> {
    check_filters(&format!("{at}.Filters"), &rule.filters)?;
    for (h, headers) in rule.response_filters.headers.iter().enumerate() {
        headers.validate(&format!("{at}.ResponseFilters.Headers[{h}]"))?;
    }
    for (m, matched) in rule.matches.iter().enumerate() {
        check_match(&format!("{at}.Matches[{m}]"), matched)?;
    }
    if rule.services.is_empty() {
        return Err(ValidationError::new(
            format!("{at}.Services"),
            Problem::Required("(at least one service)"),
        ));
    }
    let mut names = BTreeSet::new();
    for (s, svc) in rule.services.iter().enumerate() {
        let at = format!("{at}.Services[{s}]");
        crate::validate::check_name(&format!("{at}.Name"), &svc.name, "")?;
        check_scope(&at, &svc.partition, &svc.namespace)?;
        if !names.insert(svc.name.as_str()) {
            return Err(ValidationError::new(
                format!("{at}.Name"),
                Problem::Duplicate(format!("service {:?} in one rule: give it one weight", svc.name)),
            ));
        }
        if svc.weight > 1_000_000 {
            return Err(ValidationError::new(
                format!("{at}.Weight"),
                Problem::OutOfRange { min: 0, max: 1_000_000 },
            ));
        }
        if svc.filters.url_rewrite.is_some()
            || svc.filters.retry_filter.is_some()
            || svc.filters.timeout_filter.is_some()
        {
            return Err(ValidationError::new(
                format!("{at}.Filters"),
                Problem::NotAllowed(
                    "to rewrite, retry or time out per service: only Headers are per service (set the others on the rule)",
                ),
            ));
        }
        check_filters(&format!("{at}.Filters"), &svc.filters)?;
        for (h, headers) in svc.response_filters.headers.iter().enumerate() {
            headers.validate(&format!("{at}.ResponseFilters.Headers[{h}]"))?;
        }
    }
    Ok(())
}

fn check_filters(at: &str, f: &HttpFilters) -> Result<(), ValidationError> {
    for (h, headers) in f.headers.iter().enumerate() {
        headers.validate(&format!("{at}.Headers[{h}]"))?;
    }
    if let Some(rewrite) = &f.url_rewrite
        && !rewrite.path.starts_with('/')
    {
        return Err(invalid(
            format!("{at}.URLRewrite.Path"),
            format!("{:?} must start with '/'", rewrite.path),
        ));
    }
    if let Some(retry) = &f.retry_filter {
        for (j, c) in retry.retry_on.iter().enumerate() {
            if !RETRY_ON_CONDITIONS.contains(&c.as_str()) {
                return Err(invalid(
                    format!("{at}.RetryFilter.RetryOn[{j}]"),
                    format!("{c:?} is not one of {}", RETRY_ON_CONDITIONS.join(", ")),
                ));
            }
        }
        for (j, code) in retry.retry_on_status_codes.iter().enumerate() {
            if !(100..=599).contains(code) {
                return Err(ValidationError::new(
                    format!("{at}.RetryFilter.RetryOnStatusCodes[{j}]"),
                    Problem::OutOfRange { min: 100, max: 599 },
                ));
            }
        }
    }
    Ok(())
}

const METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

fn check_match(at: &str, m: &HttpMatch) -> Result<(), ValidationError> {
    let path = &m.path;
    match path.match_.to_ascii_lowercase().as_str() {
        "" | "prefix" | "exact" => {
            if !path.value.is_empty() && !path.value.starts_with('/') {
                return Err(invalid(
                    format!("{at}.Path.Value"),
                    format!("{:?} must start with '/'", path.value),
                ));
            }
        }
        "regex" => check_regex(&format!("{at}.Path.Value"), &path.value)?,
        other => {
            return Err(invalid(
                format!("{at}.Path.Match"),
                format!("unknown path match {other:?}: expected exact, prefix or regex"),
            ));
        }
    }
    if !m.method.is_empty() && !METHODS.contains(&m.method.to_ascii_uppercase().as_str()) {
        return Err(invalid(
            format!("{at}.Method"),
            format!("unknown method {:?}: expected one of {}", m.method, METHODS.join(", ")),
        ));
    }
    for (h, header) in m.headers.iter().enumerate() {
        let at = format!("{at}.Headers[{h}]");
        if header.name.is_empty() {
            return Err(ValidationError::new(format!("{at}.Name"), Problem::Required("")));
        }
        match header.match_.to_ascii_lowercase().as_str() {
            "" | "exact" | "prefix" | "suffix" => {}
            "present" => continue,
            "regex" => check_regex(&format!("{at}.Value"), &header.value)?,
            other => {
                return Err(invalid(
                    format!("{at}.Match"),
                    format!("unknown header match {other:?}: expected exact, prefix, suffix, present or regex"),
                ));
            }
        }
    }
    for (q, query) in m.query.iter().enumerate() {
        let at = format!("{at}.Query[{q}]");
        if query.name.is_empty() {
            return Err(ValidationError::new(format!("{at}.Name"), Problem::Required("")));
        }
        match query.match_.to_ascii_lowercase().as_str() {
            "" | "exact" | "present" => {}
            "regex" => check_regex(&format!("{at}.Value"), &query.value)?,
            other => {
                return Err(invalid(
                    format!("{at}.Match"),
                    format!("unknown query match {other:?}: expected exact, present or regex"),
                ));
            }
        }
    }
    Ok(())
}

impl Validate for TcpRoute {
    fn validate(&self) -> Result<(), ValidationError> {
        check_entry_name(ConfigEntryKind::TcpRoute, &self.name)?;
        check_parents(&self.parents)?;
        let [service] = self.services.as_slice() else {
            return Err(invalid(
                "Services",
                format!("a tcp-route sends to exactly one service, not {}", self.services.len()),
            ));
        };
        crate::validate::check_name("Services[0].Name", &service.name, "")?;
        check_scope("Services[0]", &service.partition, &service.namespace)
    }
}

fn check_pem(field: &str, text: &str, label: &str) -> Result<(), ValidationError> {
    if text.trim().is_empty() {
        return Err(ValidationError::new(field, Problem::Required("")));
    }
    if !text.contains("-----BEGIN ") || !text.contains(label) {
        return Err(invalid(field, format!("not a PEM {label}")));
    }
    Ok(())
}

impl Validate for InlineCertificate {
    fn validate(&self) -> Result<(), ValidationError> {
        check_entry_name(ConfigEntryKind::InlineCertificate, &self.name)?;
        check_pem("Certificate", &self.certificate, "CERTIFICATE")?;
        check_pem("PrivateKey", &self.private_key, "PRIVATE KEY")
    }
}

impl Validate for FileSystemCertificate {
    fn validate(&self) -> Result<(), ValidationError> {
        check_entry_name(ConfigEntryKind::FileSystemCertificate, &self.name)?;
        for (field, path) in [("Certificate", &self.certificate), ("PrivateKey", &self.private_key)] {
            if path.is_empty() {
                return Err(ValidationError::new(
                    field,
                    Problem::Required("(a file path on the gateway's host)"),
                ));
            }
            if !path.starts_with('/') {
                return Err(invalid(
                    field,
                    format!("{path:?} must be an absolute path (Envoy reads it on the gateway's host)"),
                ));
            }
        }
        Ok(())
    }
}
