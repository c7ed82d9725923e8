//! The API gateway's entries, in Consul's shapes: `api-gateway` (listeners), `http-route`
//! and `tcp-route` (what is routed where, attached to gateway listeners), and the
//! certificates listeners serve, `inline-certificate` (PEM in the entry) and
//! `file-system-certificate` (paths on the gateway's host, read by Envoy).
//!
//! Routes and gateways carry a `Status` of conditions. It is never taken from a write: the
//! catalog derives it from the current entries and services when they are read
//! ([`super::api_gateway_binding`]).

use super::HttpHeaderModifiers;
use crate::{GoDuration, Index};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A reference to another entry (a route's parent gateway, a listener's certificate).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResourceReference {
    /// The entry's kind (`api-gateway`, `inline-certificate`, `file-system-certificate`).
    #[serde(rename = "Kind")]
    pub kind: String,
    /// The entry's name.
    #[serde(rename = "Name")]
    pub name: String,
    /// A part of it: a gateway listener's name (empty: every listener that fits).
    #[serde(rename = "SectionName", skip_serializing_if = "String::is_empty")]
    pub section_name: String,
    /// Only `default` (or empty).
    #[serde(rename = "Partition", skip_serializing_if = "String::is_empty")]
    pub partition: String,
    /// Only `default` (or empty).
    #[serde(rename = "Namespace", skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

/// One condition of an entry's status, as Consul's (and the Kubernetes Gateway API's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Condition {
    /// `Accepted`, `ResolvedRefs`, `Bound` or `Conflicted`.
    #[serde(rename = "Type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[serde(rename = "Status")]
    pub status: String,
    /// A machine-readable reason (`Bound`, `FailedToBind`, `BackendNotFound`, ...).
    #[serde(rename = "Reason")]
    pub reason: String,
    /// What a person reads.
    #[serde(rename = "Message")]
    pub message: String,
    /// The part the condition is about (a parent gateway listener, a certificate).
    #[serde(rename = "Resource", skip_serializing_if = "Option::is_none")]
    pub resource: Option<ResourceReference>,
    /// When the condition last changed (RFC 3339), if known.
    #[serde(rename = "LastTransitionTime", skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// The status of a gateway or route entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConfigEntryStatus {
    /// Its conditions.
    #[serde(rename = "Conditions")]
    pub conditions: Vec<Condition>,
}

/// TLS of an API gateway listener.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiGatewayTlsConfig {
    /// The certificates served, selected by SNI (`inline-certificate` or
    /// `file-system-certificate` entries).
    #[serde(rename = "Certificates", skip_serializing_if = "Vec::is_empty")]
    pub certificates: Vec<ResourceReference>,
    /// `TLSv1_0` .. `TLSv1_3`, or empty for Envoy's default.
    #[serde(rename = "MinVersion", skip_serializing_if = "String::is_empty")]
    pub min_version: String,
    /// `TLSv1_0` .. `TLSv1_3`, or empty for Envoy's default.
    #[serde(rename = "MaxVersion", skip_serializing_if = "String::is_empty")]
    pub max_version: String,
    /// Cipher suites (TLS 1.2 and below).
    #[serde(rename = "CipherSuites", skip_serializing_if = "Vec::is_empty")]
    pub cipher_suites: Vec<String>,
}

/// One listener of an API gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiGatewayListener {
    /// Its name, unique in the gateway (what a route's `SectionName` names).
    #[serde(rename = "Name")]
    pub name: String,
    /// The host name it serves (may start with `*.`); empty: any.
    #[serde(rename = "Hostname", skip_serializing_if = "String::is_empty")]
    pub hostname: String,
    /// The port it listens on.
    #[serde(rename = "Port")]
    pub port: u16,
    /// `http` or `tcp`.
    #[serde(rename = "Protocol")]
    pub protocol: String,
    /// TLS, served when it names certificates.
    #[serde(rename = "TLS")]
    pub tls: ApiGatewayTlsConfig,
}

impl ApiGatewayListener {
    /// True for an http listener.
    pub fn is_http(&self) -> bool {
        self.protocol.eq_ignore_ascii_case("http")
    }
}

/// The `api-gateway` config entry (named after the gateway service).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiGateway {
    /// The gateway service's name.
    #[serde(rename = "Name")]
    pub name: String,
    /// Its listeners.
    #[serde(rename = "Listeners")]
    pub listeners: Vec<ApiGatewayListener>,
    /// Derived conditions (never stored).
    #[serde(rename = "Status", skip_serializing_if = "Option::is_none")]
    pub status: Option<ConfigEntryStatus>,
    /// User metadata; keys untouched.
    #[serde(rename = "Meta", skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

/// Header changes of an http-route (`Add` appends, `Set` replaces, `Remove` removes).
pub type HttpHeaderFilter = HttpHeaderModifiers;

/// A rewrite of the request's path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UrlRewrite {
    /// Replaces the matched path prefix.
    #[serde(rename = "Path")]
    pub path: String,
}

/// Retries of a rule.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryFilter {
    /// How many retries.
    #[serde(rename = "NumRetries")]
    pub num_retries: u32,
    /// Envoy retry conditions.
    #[serde(rename = "RetryOn", skip_serializing_if = "Vec::is_empty")]
    pub retry_on: Vec<String>,
    /// Status codes retried.
    #[serde(rename = "RetryOnStatusCodes", skip_serializing_if = "Vec::is_empty")]
    pub retry_on_status_codes: Vec<u32>,
    /// Retry when the connection fails.
    #[serde(rename = "RetryOnConnectFailure")]
    pub retry_on_connect_failure: bool,
}

/// Timeouts of a rule.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TimeoutFilter {
    /// The whole request's timeout.
    #[serde(rename = "RequestTimeout", skip_serializing_if = "GoDuration::is_zero")]
    pub request_timeout: GoDuration,
    /// Idle timeout of the stream.
    #[serde(rename = "IdleTimeout", skip_serializing_if = "GoDuration::is_zero")]
    pub idle_timeout: GoDuration,
}

/// What a rule (or one of its services) changes on requests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpFilters {
    /// Header changes.
    #[serde(rename = "Headers", skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HttpHeaderFilter>,
    /// A path rewrite.
    #[serde(rename = "URLRewrite", skip_serializing_if = "Option::is_none")]
    pub url_rewrite: Option<UrlRewrite>,
    /// Retries.
    #[serde(rename = "RetryFilter", skip_serializing_if = "Option::is_none")]
    pub retry_filter: Option<RetryFilter>,
    /// Timeouts.
    #[serde(rename = "TimeoutFilter", skip_serializing_if = "Option::is_none")]
    pub timeout_filter: Option<TimeoutFilter>,
}

impl HttpFilters {
    /// True when it changes nothing.
    pub fn is_empty(&self) -> bool {
        self == &HttpFilters::default()
    }
}

/// What a rule (or one of its services) changes on responses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpResponseFilters {
    /// Header changes.
    #[serde(rename = "Headers", skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HttpHeaderFilter>,
}

/// A header condition of an http-route match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpHeaderMatch {
    /// `exact` (default), `prefix`, `suffix`, `present` or `regex`.
    #[serde(rename = "Match", skip_serializing_if = "String::is_empty")]
    pub match_: String,
    /// The header.
    #[serde(rename = "Name")]
    pub name: String,
    /// The value compared.
    #[serde(rename = "Value", skip_serializing_if = "String::is_empty")]
    pub value: String,
}

/// A path condition of an http-route match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpPathMatch {
    /// `exact`, `prefix` (default) or `regex`.
    #[serde(rename = "Match", skip_serializing_if = "String::is_empty")]
    pub match_: String,
    /// The path compared.
    #[serde(rename = "Value", skip_serializing_if = "String::is_empty")]
    pub value: String,
}

/// A query-parameter condition of an http-route match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpQueryMatch {
    /// `exact` (default), `present` or `regex`.
    #[serde(rename = "Match", skip_serializing_if = "String::is_empty")]
    pub match_: String,
    /// The parameter.
    #[serde(rename = "Name")]
    pub name: String,
    /// The value compared.
    #[serde(rename = "Value", skip_serializing_if = "String::is_empty")]
    pub value: String,
}

/// One way a request matches a rule (all its conditions hold).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpMatch {
    /// Header conditions.
    #[serde(rename = "Headers", skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HttpHeaderMatch>,
    /// The method (empty: any).
    #[serde(rename = "Method", skip_serializing_if = "String::is_empty")]
    pub method: String,
    /// The path condition.
    #[serde(rename = "Path")]
    pub path: HttpPathMatch,
    /// Query-parameter conditions.
    #[serde(rename = "Query", skip_serializing_if = "Vec::is_empty")]
    pub query: Vec<HttpQueryMatch>,
}

/// A service a rule sends to, with its share of the rule's requests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpService {
    /// The service.
    #[serde(rename = "Name")]
    pub name: String,
    /// Its weight among the rule's services (0: 1).
    #[serde(rename = "Weight")]
    pub weight: u32,
    /// Request changes for this service only.
    #[serde(rename = "Filters")]
    pub filters: HttpFilters,
    /// Response changes for this service only.
    #[serde(rename = "ResponseFilters")]
    pub response_filters: HttpResponseFilters,
    /// Only `default` (or empty).
    #[serde(rename = "Partition", skip_serializing_if = "String::is_empty")]
    pub partition: String,
    /// Only `default` (or empty).
    #[serde(rename = "Namespace", skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

impl HttpService {
    /// Its weight, 1 when unset (Consul's reading).
    pub fn weight(&self) -> u32 {
        self.weight.max(1)
    }
}

/// One rule of an http-route: requests matching any of `Matches` (all requests without
/// any) go to `Services`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpRouteRule {
    /// Request changes.
    #[serde(rename = "Filters")]
    pub filters: HttpFilters,
    /// Response changes.
    #[serde(rename = "ResponseFilters")]
    pub response_filters: HttpResponseFilters,
    /// When it applies.
    #[serde(rename = "Matches")]
    pub matches: Vec<HttpMatch>,
    /// Where matching requests go.
    #[serde(rename = "Services")]
    pub services: Vec<HttpService>,
}

/// The `http-route` config entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpRoute {
    /// Its name.
    #[serde(rename = "Name")]
    pub name: String,
    /// The gateways (and listeners) it attaches to.
    #[serde(rename = "Parents")]
    pub parents: Vec<ResourceReference>,
    /// Its rules, in order.
    #[serde(rename = "Rules")]
    pub rules: Vec<HttpRouteRule>,
    /// The hosts it answers (empty: the listener's).
    #[serde(rename = "Hostnames")]
    pub hostnames: Vec<String>,
    /// User metadata; keys untouched.
    #[serde(rename = "Meta", skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    /// Derived conditions (never stored).
    #[serde(rename = "Status", skip_serializing_if = "Option::is_none")]
    pub status: Option<ConfigEntryStatus>,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

/// The service of a tcp-route.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TcpService {
    /// The service.
    #[serde(rename = "Name")]
    pub name: String,
    /// Only `default` (or empty).
    #[serde(rename = "Partition", skip_serializing_if = "String::is_empty")]
    pub partition: String,
    /// Only `default` (or empty).
    #[serde(rename = "Namespace", skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

/// The `tcp-route` config entry: a tcp listener's connections go to one service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TcpRoute {
    /// Its name.
    #[serde(rename = "Name")]
    pub name: String,
    /// The gateways (and listeners) it attaches to.
    #[serde(rename = "Parents")]
    pub parents: Vec<ResourceReference>,
    /// The service (exactly one).
    #[serde(rename = "Services")]
    pub services: Vec<TcpService>,
    /// User metadata; keys untouched.
    #[serde(rename = "Meta", skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    /// Derived conditions (never stored).
    #[serde(rename = "Status", skip_serializing_if = "Option::is_none")]
    pub status: Option<ConfigEntryStatus>,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

/// The `inline-certificate` config entry: a PEM certificate chain and its private key.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InlineCertificate {
    /// Its name.
    #[serde(rename = "Name")]
    pub name: String,
    /// The PEM certificate chain, leaf first.
    #[serde(rename = "Certificate")]
    pub certificate: String,
    /// The PEM private key of the leaf.
    #[serde(rename = "PrivateKey")]
    pub private_key: String,
    /// User metadata; keys untouched.
    #[serde(rename = "Meta", skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

impl std::fmt::Debug for InlineCertificate {
    // The private key never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InlineCertificate")
            .field("name", &self.name)
            .field("certificate", &format_args!("{} bytes", self.certificate.len()))
            .field("private_key", &"<redacted>")
            .field("create_index", &self.create_index)
            .field("modify_index", &self.modify_index)
            .finish()
    }
}

/// The `file-system-certificate` config entry: a certificate chain and key Envoy reads
/// from files on the gateway's host, and reads again when they change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileSystemCertificate {
    /// Its name.
    #[serde(rename = "Name")]
    pub name: String,
    /// Path of the PEM certificate chain.
    #[serde(rename = "Certificate")]
    pub certificate: String,
    /// Path of the PEM private key.
    #[serde(rename = "PrivateKey")]
    pub private_key: String,
    /// User metadata; keys untouched.
    #[serde(rename = "Meta", skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}
