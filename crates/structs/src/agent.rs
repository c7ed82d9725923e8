//! What a client hands the local agent: service definitions (`/v1/agent/service/register`,
//! config files) and check definitions (`/v1/agent/check/register`, a service's `Check` and
//! `Checks`), in Consul's shapes, with validation that names the field.
//!
//! A definition is not what the catalog stores: the agent turns a [`ServiceDefinition`] into a
//! [`NodeService`] (plus, for `Connect.SidecarService`, a second `connect-proxy` instance) and
//! each [`CheckType`] into a check it runs.

use crate::service::{ServiceAddress, Weights};
use crate::validate::{Problem, Validate, ValidationError};
use crate::{ConnectProxyConfig, GoDuration, HealthStatus, ServiceKind, Token};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// A service as registered with the agent (Consul's `ServiceDefinition`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServiceDefinition {
    /// What the service is.
    #[serde(rename = "Kind")]
    pub kind: ServiceKind,
    /// Instance id, unique on the node; defaults to the name.
    #[serde(rename = "ID")]
    pub id: String,
    /// Service name.
    #[serde(rename = "Name")]
    pub name: String,
    /// Tags.
    #[serde(rename = "Tags")]
    pub tags: Vec<String>,
    /// Address, if it differs from the node's.
    #[serde(rename = "Address")]
    pub address: String,
    /// Extra addresses by name; keys are the user's.
    #[serde(rename = "TaggedAddresses")]
    pub tagged_addresses: BTreeMap<String, ServiceAddress>,
    /// User metadata; keys are the user's.
    #[serde(rename = "Meta")]
    pub meta: BTreeMap<String, String>,
    /// Port.
    #[serde(rename = "Port")]
    pub port: u16,
    /// Unix socket path, instead of address and port.
    #[serde(rename = "SocketPath", skip_serializing_if = "String::is_empty")]
    pub socket_path: String,
    /// Where the instance runs (Consul's `Locality`).
    #[serde(rename = "Locality", skip_serializing_if = "Option::is_none")]
    pub locality: Option<crate::service::placement::Locality>,
    /// Named ports of a multi-port service (Consul 1.22).
    #[serde(rename = "Ports", skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<crate::service::placement::ServicePort>,
    /// DNS weights.
    #[serde(rename = "Weights")]
    pub weights: Weights,
    /// Let tags changed in the catalog stand.
    #[serde(rename = "EnableTagOverride")]
    pub enable_tag_override: bool,
    /// Proxy settings, for proxies and gateways.
    #[serde(rename = "Proxy")]
    pub proxy: ConnectProxyConfig,
    /// Connect settings, including an inline sidecar.
    #[serde(rename = "Connect")]
    pub connect: ServiceConnect,
    /// One check of the service.
    #[serde(rename = "Check", skip_serializing_if = "Option::is_none")]
    pub check: Option<CheckType>,
    /// More checks of the service.
    #[serde(rename = "Checks")]
    pub checks: Vec<CheckType>,
    /// ACL token of the registration: the service's sync and its proxy use it (none: the
    /// token of the request that registered it).
    #[serde(
        rename = "Token",
        default,
        with = "crate::token::opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub token: Option<Token>,
    /// Consul Enterprise namespace: only `default` (or none) exists here.
    #[serde(rename = "Namespace", skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Consul Enterprise admin partition: only `default` (or none) exists here.
    #[serde(rename = "Partition", skip_serializing_if = "String::is_empty")]
    pub partition: String,
}

impl ServiceDefinition {
    /// The instance id: `ID`, else the name.
    pub fn instance_id(&self) -> &str {
        if self.id.is_empty() { &self.name } else { &self.id }
    }

    /// Every check of the definition (`Check` first, then `Checks`) with the JSON path it was
    /// given at.
    pub fn all_checks(&self) -> impl Iterator<Item = (String, &CheckType)> {
        let single = self.check.iter().map(|c| ("Check".to_owned(), c));
        let many = self.checks.iter().enumerate().map(|(i, c)| (format!("Checks[{i}]"), c));
        single.chain(many)
    }
}

/// Connect settings of an application service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServiceConnect {
    /// The application speaks mTLS itself and needs no sidecar.
    #[serde(rename = "Native", skip_serializing_if = "std::ops::Not::not")]
    pub native: bool,
    /// A sidecar proxy to register along with the service (agent registrations only; the
    /// agent expands it into its own `connect-proxy` instance, see
    /// [`ServiceDefinition`]).
    #[serde(rename = "SidecarService", skip_serializing_if = "Option::is_none")]
    pub sidecar_service: Option<Box<ServiceDefinition>>,
    /// A proxy the agent registers (`<id>-proxy`) and runs itself, in Consul 1.4's shape
    /// (agent registrations only; see [`ManagedProxyDefinition`]).
    #[serde(rename = "Proxy", skip_serializing_if = "Option::is_none")]
    pub proxy: Option<Box<ManagedProxyDefinition>>,
}

/// A check as a client defines it: for a service (inside a [`ServiceDefinition`]) or on its
/// own (`/v1/agent/check/register`, which adds `ServiceID`). Consul calls the first
/// `CheckType` and the second `CheckDefinition`; one type serves both here, with both of
/// their id spellings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CheckType {
    /// Check id (service checks spell it `CheckID`).
    #[serde(rename = "CheckID", skip_serializing_if = "String::is_empty")]
    pub check_id: String,
    /// Check id (standalone checks spell it `ID`).
    #[serde(rename = "ID", skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// Human name.
    #[serde(rename = "Name")]
    pub name: String,
    /// Human notes.
    #[serde(rename = "Notes", skip_serializing_if = "String::is_empty")]
    pub notes: String,
    /// The service the check belongs to (standalone checks only).
    #[serde(rename = "ServiceID", skip_serializing_if = "String::is_empty")]
    pub service_id: String,
    /// Initial state (default critical).
    #[serde(rename = "Status", skip_serializing_if = "Option::is_none")]
    pub status: Option<HealthStatus>,
    /// Time-to-live: the check turns critical unless updated within it.
    #[serde(rename = "TTL", skip_serializing_if = "GoDuration::is_zero")]
    pub ttl: GoDuration,
    /// URL of an HTTP check.
    #[serde(rename = "HTTP", skip_serializing_if = "String::is_empty")]
    pub http: String,
    /// Method of an HTTP check (default GET).
    #[serde(rename = "Method", skip_serializing_if = "String::is_empty")]
    pub method: String,
    /// Headers of an HTTP check; keys are the user's.
    #[serde(rename = "Header", skip_serializing_if = "BTreeMap::is_empty")]
    pub header: BTreeMap<String, Vec<String>>,
    /// Body of an HTTP check.
    #[serde(rename = "Body", skip_serializing_if = "String::is_empty")]
    pub body: String,
    /// Do not verify the TLS certificate of an HTTPS check.
    #[serde(rename = "TLSSkipVerify", skip_serializing_if = "std::ops::Not::not")]
    pub tls_skip_verify: bool,
    /// Address (`host:port`) of a TCP check.
    #[serde(rename = "TCP", skip_serializing_if = "String::is_empty")]
    pub tcp: String,
    /// Node of an alias check (default: this agent's node).
    #[serde(rename = "AliasNode", skip_serializing_if = "String::is_empty")]
    pub alias_node: String,
    /// Service instance of an alias check.
    #[serde(rename = "AliasService", skip_serializing_if = "String::is_empty")]
    pub alias_service: String,
    /// How often an HTTP or TCP check runs.
    #[serde(rename = "Interval", skip_serializing_if = "GoDuration::is_zero")]
    pub interval: GoDuration,
    /// How long one run may take (default 10 s).
    #[serde(rename = "Timeout", skip_serializing_if = "GoDuration::is_zero")]
    pub timeout: GoDuration,
    /// Consecutive successes needed before the check reports passing.
    #[serde(rename = "SuccessBeforePassing", skip_serializing_if = "is_zero")]
    pub success_before_passing: u32,
    /// Consecutive failures needed before the check reports critical.
    #[serde(rename = "FailuresBeforeCritical", skip_serializing_if = "is_zero")]
    pub failures_before_critical: u32,
    /// Remove the check's service once it has been critical this long.
    #[serde(
        rename = "DeregisterCriticalServiceAfter",
        skip_serializing_if = "GoDuration::is_zero"
    )]
    pub deregister_critical_service_after: GoDuration,
    /// Consecutive failures before the check reports warning (0: no warning phase).
    #[serde(rename = "FailuresBeforeWarning", skip_serializing_if = "is_zero")]
    pub failures_before_warning: u32,
    /// Largest output kept, bytes (default and most: 4096).
    #[serde(rename = "OutputMaxSize", skip_serializing_if = "is_zero")]
    pub output_max_size: u32,
    /// TLS server name (SNI, and the name the certificate must carry) for an HTTPS check,
    /// when it differs from the URL's host.
    #[serde(rename = "TLSServerName", skip_serializing_if = "String::is_empty")]
    pub tls_server_name: String,
    /// Script checks: not run by meshd (refused). Consul's config files also call it `args`.
    #[serde(rename = "ScriptArgs", alias = "args", skip_serializing_if = "Vec::is_empty")]
    pub script_args: Vec<String>,
    /// Docker checks: not run by meshd (refused).
    #[serde(rename = "DockerContainerID", skip_serializing_if = "String::is_empty")]
    pub docker_container_id: String,
    /// gRPC checks: not run by meshd yet (refused).
    #[serde(rename = "GRPC", skip_serializing_if = "String::is_empty")]
    pub grpc: String,
    /// HTTP/2 ping checks: not run by meshd (refused).
    #[serde(rename = "H2PING", skip_serializing_if = "String::is_empty")]
    pub h2ping: String,
    /// UDP checks: not run by meshd (refused).
    #[serde(rename = "UDP", skip_serializing_if = "String::is_empty")]
    pub udp: String,
    /// OS service checks: not run by meshd (refused).
    #[serde(rename = "OSService", skip_serializing_if = "String::is_empty")]
    pub os_service: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// An HTTP check's headers: names are HTTP tokens, values one line (a CR or LF would split
/// the request, so it is refused here rather than failing at every run).
fn check_headers(header: &BTreeMap<String, Vec<String>>) -> Result<(), ValidationError> {
    const SEPARATORS: &str = "()<>@,;:\\\"/[]?={} \t";
    for (name, values) in header {
        let field = || format!("Header[{name:?}]");
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_graphic() && !SEPARATORS.contains(c)) {
            return Err(ValidationError::new(
                field(),
                Problem::Invalid("is not a valid header name".into()),
            ));
        }
        if values.iter().any(|v| v.contains(['\r', '\n', '\0'])) {
            return Err(ValidationError::new(
                field(),
                Problem::Invalid("the value contains a CR, LF or NUL character: a header value is one line".into()),
            ));
        }
    }
    Ok(())
}

/// The shortest interval a polled check runs at; shorter ones are raised to it.
pub const MIN_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// A polled check's timeout when none is given.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// How a check is run, decided from which of its fields are set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckKind {
    /// Passive: the application reports; critical when the TTL passes without a report.
    Ttl(Duration),
    /// Poll a URL.
    Http {
        /// The URL.
        url: String,
        /// Method (GET unless given).
        method: String,
        /// Extra headers.
        header: BTreeMap<String, Vec<String>>,
        /// Request body.
        body: String,
        /// Accept any TLS certificate.
        tls_skip_verify: bool,
        /// TLS server name, when not the URL's host.
        tls_server_name: String,
        /// Between runs.
        interval: Duration,
        /// Per run.
        timeout: Duration,
    },
    /// Open a TCP connection.
    Tcp {
        /// `host:port`.
        addr: String,
        /// Between runs.
        interval: Duration,
        /// Per run.
        timeout: Duration,
    },
    /// Mirror the health of another service instance (and its node).
    Alias {
        /// Node of the instance; empty for this agent's node.
        node: String,
        /// The instance id.
        service: String,
    },
}

impl CheckKind {
    /// Consul's `Type` string.
    pub fn type_name(&self) -> &'static str {
        match self {
            CheckKind::Ttl(_) => "ttl",
            CheckKind::Http { .. } => "http",
            CheckKind::Tcp { .. } => "tcp",
            CheckKind::Alias { .. } => "alias",
        }
    }
}

impl CheckType {
    /// The check id as given (`CheckID`, else `ID`); may be empty.
    pub fn given_id(&self) -> &str {
        if self.check_id.is_empty() {
            &self.id
        } else {
            &self.check_id
        }
    }

    /// How the check runs; an error names the field when the definition is unusable (no type,
    /// several types, a type meshd does not run, a missing interval, a bad URL or address).
    pub fn kind(&self) -> Result<CheckKind, ValidationError> {
        self.check_supported()?;
        let set: Vec<&str> = [
            ("TTL", !self.ttl.is_zero()),
            ("HTTP", !self.http.is_empty()),
            ("TCP", !self.tcp.is_empty()),
            (
                "AliasService",
                !self.alias_service.is_empty() || !self.alias_node.is_empty(),
            ),
        ]
        .iter()
        .filter(|(_, on)| *on)
        .map(|(f, _)| *f)
        .collect();
        let timeout = if self.timeout.is_zero() {
            DEFAULT_CHECK_TIMEOUT
        } else {
            self.timeout.0
        };
        match set.as_slice() {
            [] => Err(ValidationError::new(
                "TTL",
                Problem::Required("(or HTTP, TCP or AliasService): the check has no type"),
            )),
            [_, second, ..] => Err(ValidationError::new(
                *second,
                Problem::NotAllowed("together with another check type: a check has one type"),
            )),
            ["TTL"] => Ok(CheckKind::Ttl(self.ttl.0)),
            ["HTTP"] => self.http_kind(timeout),
            ["TCP"] => self.tcp_kind(timeout),
            _ => self.alias_kind(),
        }
    }

    /// Refuses the check types and settings meshd does not run or honour, naming the field.
    fn check_supported(&self) -> Result<(), ValidationError> {
        let unsupported = [
            ("ScriptArgs", !self.script_args.is_empty()),
            ("DockerContainerID", !self.docker_container_id.is_empty()),
            ("GRPC", !self.grpc.is_empty()),
            ("H2PING", !self.h2ping.is_empty()),
            ("UDP", !self.udp.is_empty()),
            ("OSService", !self.os_service.is_empty()),
        ];
        if let Some((field, _)) = unsupported.iter().find(|(_, set)| *set) {
            return Err(ValidationError::new(
                *field,
                Problem::NotAllowed("(this check type is not supported by meshd: use TTL, HTTP, TCP or an alias)"),
            ));
        }
        if !self.tls_server_name.is_empty() && !self.http.starts_with("https://") {
            return Err(ValidationError::new(
                "TLSServerName",
                Problem::NotAllowed("without an https:// HTTP URL"),
            ));
        }
        if self.output_max_size > 4096 {
            return Err(ValidationError::new(
                "OutputMaxSize",
                Problem::OutOfRange { min: 0, max: 4096 },
            ));
        }
        Ok(())
    }

    /// An HTTP check: a URL with a scheme and a host, a method of letters only.
    fn http_kind(&self, timeout: Duration) -> Result<CheckKind, ValidationError> {
        let rest = self
            .http
            .strip_prefix("http://")
            .or_else(|| self.http.strip_prefix("https://"));
        if rest.is_none_or(|r| r.is_empty() || r.starts_with('/')) {
            return Err(ValidationError::new(
                "HTTP",
                Problem::Invalid(format!("{:?} is not an http:// or https:// URL with a host", self.http)),
            ));
        }
        if !self.method.is_empty() && !self.method.chars().all(|c| c.is_ascii_alphabetic()) {
            return Err(ValidationError::new(
                "Method",
                Problem::Invalid(format!("{:?} is not an HTTP method", self.method)),
            ));
        }
        check_headers(&self.header)?;
        Ok(CheckKind::Http {
            url: self.http.clone(),
            method: if self.method.is_empty() {
                "GET".into()
            } else {
                self.method.to_ascii_uppercase()
            },
            header: self.header.clone(),
            body: self.body.clone(),
            tls_skip_verify: self.tls_skip_verify,
            tls_server_name: self.tls_server_name.clone(),
            interval: self.interval()?,
            timeout,
        })
    }

    /// A TCP check of `host:port`.
    fn tcp_kind(&self, timeout: Duration) -> Result<CheckKind, ValidationError> {
        match self.tcp.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => {}
            _ => {
                return Err(ValidationError::new(
                    "TCP",
                    Problem::Invalid(format!("{:?} is not host:port", self.tcp)),
                ));
            }
        }
        Ok(CheckKind::Tcp {
            addr: self.tcp.clone(),
            interval: self.interval()?,
            timeout,
        })
    }

    /// An alias of a service instance (on this node unless `AliasNode` names another).
    fn alias_kind(&self) -> Result<CheckKind, ValidationError> {
        if self.alias_service.is_empty() {
            return Err(ValidationError::new(
                "AliasService",
                Problem::Required("for an alias check (node aliases are not supported)"),
            ));
        }
        Ok(CheckKind::Alias {
            node: self.alias_node.clone(),
            service: self.alias_service.clone(),
        })
    }
    fn interval(&self) -> Result<Duration, ValidationError> {
        if self.interval.is_zero() {
            return Err(ValidationError::new(
                "Interval",
                Problem::Required("for HTTP and TCP checks"),
            ));
        }
        Ok(self.interval.0.max(MIN_CHECK_INTERVAL))
    }
}

mod instance;

#[cfg(test)]
mod tests;

/// A managed proxy in Consul 1.4's shape (`Connect.Proxy` of a service registration): the
/// agent registers a `connect-proxy` instance `<id>-proxy` for the service and runs the proxy
/// process itself (`ExecMode` `daemon`, the only mode meshd runs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ManagedProxyDefinition {
    /// `daemon` (or empty, the default). `script` is refused.
    #[serde(rename = "ExecMode", skip_serializing_if = "String::is_empty")]
    pub exec_mode: String,
    /// The program and its arguments (empty: `meshd connect envoy` against this agent).
    #[serde(rename = "Command", skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Opaque proxy configuration (becomes the proxy instance's `Proxy.Config`).
    #[serde(rename = "Config", skip_serializing_if = "serde_json::Map::is_empty")]
    pub config: crate::proxy::OpaqueConfig,
    /// Upstreams of the proxy.
    #[serde(rename = "Upstreams", skip_serializing_if = "Vec::is_empty")]
    pub upstreams: Vec<crate::Upstream>,
}

impl Validate for ManagedProxyDefinition {
    fn validate(&self) -> Result<(), ValidationError> {
        match self.exec_mode.as_str() {
            "" | "daemon" => {}
            "script" => {
                return Err(ValidationError::new(
                    "ExecMode",
                    Problem::Invalid("\"script\": script proxies are not supported; use \"daemon\"".into()),
                ));
            }
            other => {
                return Err(ValidationError::new(
                    "ExecMode",
                    Problem::Invalid(format!("{other:?}: expected \"daemon\"")),
                ));
            }
        }
        if let Some(i) = self.command.iter().position(|a| a.contains('\0')) {
            return Err(ValidationError::new(
                format!("Command[{i}]"),
                Problem::Invalid("contains a NUL byte".into()),
            ));
        }
        if self.command.first().is_some_and(String::is_empty) {
            return Err(ValidationError::new(
                "Command[0]",
                Problem::Invalid("the program is empty".into()),
            ));
        }
        Ok(())
    }
}
