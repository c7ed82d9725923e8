//! Config entries: central configuration stored in the catalog by kind and name.

mod api_gateway;
pub mod api_gateway_binding;
mod api_gateway_rules;
mod defaults;
mod exports;
pub mod extensions;
mod gateway_rules;
mod gateways;
mod intentions;
mod jwt_provider;
mod mesh;
mod routing;

pub use api_gateway::{
    ApiGateway, ApiGatewayListener, ApiGatewayTlsConfig, Condition, ConfigEntryStatus, FileSystemCertificate,
    HttpFilters, HttpHeaderFilter, HttpHeaderMatch, HttpMatch, HttpPathMatch, HttpQueryMatch, HttpResponseFilters,
    HttpRoute, HttpRouteRule, HttpService, InlineCertificate, ResourceReference, RetryFilter, TcpRoute, TcpService,
    TimeoutFilter, UrlRewrite,
};
pub use api_gateway_rules::CERTIFICATE_KINDS;
pub use defaults::{
    AccessLogType, AccessLogsConfig, DestinationConfig, ProxyDefaults, ServiceDefaults, UpstreamConfig, UpstreamConfigs,
};
pub use exports::{ExportedService, ExportedServices, ServiceConsumer};
pub use extensions::EnvoyExtension;
pub use gateway_rules::{WILDCARD_SERVICE, host_domains, host_name};
pub use gateways::{
    GatewayServiceTlsConfig, GatewayTlsConfig, GatewayTlsSdsConfig, INGRESS_DOMAIN, IngressGateway, IngressListener,
    IngressService, IngressServiceConfig, LinkedService, TerminatingGateway,
};
pub use intentions::{
    IntentionAction, IntentionHttpHeaderPermission, IntentionHttpPermission, IntentionJwtClaimVerification,
    IntentionJwtProvider, IntentionJwtRequirement, IntentionPermission, ServiceIntentions, SourceIntention,
};
pub use jwt_provider::{
    JsonWebKeySet, JwksBackOff, JwksCluster, JwksRetryPolicy, JwksTlsCertificates, JwksTrustedCa, JwksUrl,
    JwtCacheConfig, JwtForwarding, JwtHeader, JwtLocation, JwtNamed, JwtProvider, LocalJwks, RemoteJwks,
};
pub use mesh::{
    HEADERS_WITH_UNDERSCORES_ACTIONS, MeshConfig, MeshDirectionalHttpConfig, MeshHttpConfig, MeshPeeringConfig,
    MeshTlsConfig, MeshTransparentProxyConfig, PATH_WITH_ESCAPED_SLASHES_ACTIONS, RequestNormalization,
    TlsDirectionConfig, envoy_cipher_name,
};
pub(crate) use routing::check_regex;
pub use routing::{
    CookieConfig, HashPolicy, HttpHeaderModifiers, LB_POLICIES, LeastRequestConfig, LoadBalancer, RETRY_ON_CONDITIONS,
    RingHashConfig, ServiceResolver, ServiceResolverFailover, ServiceResolverFailoverTarget, ServiceResolverRedirect,
    ServiceResolverSubset, ServiceRoute, ServiceRouteDestination, ServiceRouteHttpMatch, ServiceRouteHttpMatchHeader,
    ServiceRouteHttpMatchQueryParam, ServiceRouteMatch, ServiceRouter, ServiceSplit, ServiceSplitter,
};

use crate::Index;
use crate::validate::{Problem, Validate, ValidationError};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de, ser};
use serde_json::{Map, Value};
use std::{fmt, str::FromStr};

/// The kinds of config entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ConfigEntryKind {
    /// `proxy-defaults` (name `global`).
    ProxyDefaults,
    /// `service-defaults`.
    ServiceDefaults,
    /// `service-router`.
    ServiceRouter,
    /// `service-splitter`.
    ServiceSplitter,
    /// `service-resolver`.
    ServiceResolver,
    /// `service-intentions`.
    ServiceIntentions,
    /// `mesh` (name `mesh`).
    Mesh,
    /// `ingress-gateway` (named after the gateway service).
    IngressGateway,
    /// `terminating-gateway` (named after the gateway service).
    TerminatingGateway,
    /// `jwt-provider`.
    JwtProvider,
    /// `api-gateway` (named after the gateway service).
    ApiGateway,
    /// `http-route`.
    HttpRoute,
    /// `tcp-route`.
    TcpRoute,
    /// `inline-certificate`.
    InlineCertificate,
    /// `file-system-certificate`.
    FileSystemCertificate,
    /// `exported-services` (name `default`).
    ExportedServices,
}

impl ConfigEntryKind {
    /// Every kind, in a stable order.
    pub const ALL: [ConfigEntryKind; 16] = [
        ConfigEntryKind::ProxyDefaults,
        ConfigEntryKind::ServiceDefaults,
        ConfigEntryKind::ServiceRouter,
        ConfigEntryKind::ServiceSplitter,
        ConfigEntryKind::ServiceResolver,
        ConfigEntryKind::ServiceIntentions,
        ConfigEntryKind::Mesh,
        ConfigEntryKind::IngressGateway,
        ConfigEntryKind::TerminatingGateway,
        ConfigEntryKind::JwtProvider,
        ConfigEntryKind::ApiGateway,
        ConfigEntryKind::HttpRoute,
        ConfigEntryKind::TcpRoute,
        ConfigEntryKind::InlineCertificate,
        ConfigEntryKind::FileSystemCertificate,
        ConfigEntryKind::ExportedServices,
    ];

    /// Whether reading entries of this kind takes more than `service:read` on their names
    /// (`mesh:read`, or `service:write` on some service): routes, certificates, JWT
    /// providers and exports. A proxy reads these with its own token, not an agent's.
    pub fn read_beyond_services(self) -> bool {
        matches!(
            self,
            Self::HttpRoute
                | Self::TcpRoute
                | Self::InlineCertificate
                | Self::FileSystemCertificate
                | Self::JwtProvider
                | Self::ExportedServices
        )
    }

    /// Consul's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigEntryKind::ProxyDefaults => "proxy-defaults",
            ConfigEntryKind::ServiceDefaults => "service-defaults",
            ConfigEntryKind::ServiceRouter => "service-router",
            ConfigEntryKind::ServiceSplitter => "service-splitter",
            ConfigEntryKind::ServiceResolver => "service-resolver",
            ConfigEntryKind::ServiceIntentions => "service-intentions",
            ConfigEntryKind::Mesh => "mesh",
            ConfigEntryKind::IngressGateway => "ingress-gateway",
            ConfigEntryKind::TerminatingGateway => "terminating-gateway",
            ConfigEntryKind::JwtProvider => "jwt-provider",
            ConfigEntryKind::ApiGateway => "api-gateway",
            ConfigEntryKind::HttpRoute => "http-route",
            ConfigEntryKind::TcpRoute => "tcp-route",
            ConfigEntryKind::InlineCertificate => "inline-certificate",
            ConfigEntryKind::FileSystemCertificate => "file-system-certificate",
            ConfigEntryKind::ExportedServices => "exported-services",
        }
    }

    /// The one name a singleton kind's entry must have.
    pub fn fixed_name(self) -> Option<&'static str> {
        match self {
            ConfigEntryKind::ProxyDefaults => Some("global"),
            ConfigEntryKind::Mesh => Some("mesh"),
            ConfigEntryKind::ExportedServices => Some("default"),
            _ => None,
        }
    }
}

impl fmt::Display for ConfigEntryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown config entry kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown config entry kind {0:?}")]
pub struct UnknownConfigEntryKind(pub String);

impl FromStr for ConfigEntryKind {
    type Err = UnknownConfigEntryKind;
    fn from_str(s: &str) -> Result<Self, UnknownConfigEntryKind> {
        let folded = s.to_ascii_lowercase().replace('_', "-");
        ConfigEntryKind::ALL
            .into_iter()
            .find(|k| k.as_str() == folded)
            .ok_or_else(|| UnknownConfigEntryKind(s.to_owned()))
    }
}

impl Serialize for ConfigEntryKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ConfigEntryKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(de::Error::custom)
    }
}

/// A config entry of any kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigEntry {
    /// Global proxy defaults.
    ProxyDefaults(ProxyDefaults),
    /// Per-service defaults.
    ServiceDefaults(ServiceDefaults),
    /// L7 routes for a service.
    ServiceRouter(ServiceRouter),
    /// Weighted traffic splits for a service.
    ServiceSplitter(ServiceSplitter),
    /// Subsets, redirects and failover for a service.
    ServiceResolver(ServiceResolver),
    /// Who may call a service.
    ServiceIntentions(ServiceIntentions),
    /// Mesh-wide settings.
    Mesh(MeshConfig),
    /// What an ingress gateway exposes.
    IngressGateway(IngressGateway),
    /// What a terminating gateway represents.
    TerminatingGateway(TerminatingGateway),
    /// `jwt-provider`.
    JwtProvider(JwtProvider),
    /// An API gateway's listeners.
    ApiGateway(ApiGateway),
    /// HTTP routes attached to API gateway listeners.
    HttpRoute(HttpRoute),
    /// A TCP route attached to API gateway listeners.
    TcpRoute(TcpRoute),
    /// A certificate and key held in the entry.
    InlineCertificate(InlineCertificate),
    /// A certificate and key in files on the gateway's host.
    FileSystemCertificate(FileSystemCertificate),
    /// The services exported to peers.
    ExportedServices(ExportedServices),
}

macro_rules! each_entry {
    ($self:expr, $e:ident => $body:expr) => {
        match $self {
            ConfigEntry::ProxyDefaults($e) => $body,
            ConfigEntry::ServiceDefaults($e) => $body,
            ConfigEntry::ServiceRouter($e) => $body,
            ConfigEntry::ServiceSplitter($e) => $body,
            ConfigEntry::ServiceResolver($e) => $body,
            ConfigEntry::ServiceIntentions($e) => $body,
            ConfigEntry::Mesh($e) => $body,
            ConfigEntry::IngressGateway($e) => $body,
            ConfigEntry::TerminatingGateway($e) => $body,
            ConfigEntry::JwtProvider($e) => $body,
            ConfigEntry::ApiGateway($e) => $body,
            ConfigEntry::HttpRoute($e) => $body,
            ConfigEntry::TcpRoute($e) => $body,
            ConfigEntry::InlineCertificate($e) => $body,
            ConfigEntry::FileSystemCertificate($e) => $body,
            ConfigEntry::ExportedServices($e) => $body,
        }
    };
}

impl ConfigEntry {
    /// Its kind.
    pub fn kind(&self) -> ConfigEntryKind {
        match self {
            ConfigEntry::ProxyDefaults(_) => ConfigEntryKind::ProxyDefaults,
            ConfigEntry::ServiceDefaults(_) => ConfigEntryKind::ServiceDefaults,
            ConfigEntry::ServiceRouter(_) => ConfigEntryKind::ServiceRouter,
            ConfigEntry::ServiceSplitter(_) => ConfigEntryKind::ServiceSplitter,
            ConfigEntry::ServiceResolver(_) => ConfigEntryKind::ServiceResolver,
            ConfigEntry::ServiceIntentions(_) => ConfigEntryKind::ServiceIntentions,
            ConfigEntry::Mesh(_) => ConfigEntryKind::Mesh,
            ConfigEntry::IngressGateway(_) => ConfigEntryKind::IngressGateway,
            ConfigEntry::TerminatingGateway(_) => ConfigEntryKind::TerminatingGateway,
            ConfigEntry::JwtProvider(_) => ConfigEntryKind::JwtProvider,
            ConfigEntry::ApiGateway(_) => ConfigEntryKind::ApiGateway,
            ConfigEntry::HttpRoute(_) => ConfigEntryKind::HttpRoute,
            ConfigEntry::TcpRoute(_) => ConfigEntryKind::TcpRoute,
            ConfigEntry::InlineCertificate(_) => ConfigEntryKind::InlineCertificate,
            ConfigEntry::FileSystemCertificate(_) => ConfigEntryKind::FileSystemCertificate,
            ConfigEntry::ExportedServices(_) => ConfigEntryKind::ExportedServices,
        }
    }

    /// Its name (for singleton kinds, the fixed name).
    pub fn name(&self) -> &str {
        match self {
            ConfigEntry::ProxyDefaults(_) => "global",
            ConfigEntry::Mesh(_) => "mesh",
            ConfigEntry::ExportedServices(_) => "default",
            ConfigEntry::ServiceDefaults(e) => &e.name,
            ConfigEntry::ServiceRouter(e) => &e.name,
            ConfigEntry::ServiceSplitter(e) => &e.name,
            ConfigEntry::ServiceResolver(e) => &e.name,
            ConfigEntry::ServiceIntentions(e) => &e.name,
            ConfigEntry::IngressGateway(e) => &e.name,
            ConfigEntry::TerminatingGateway(e) => &e.name,
            ConfigEntry::JwtProvider(e) => &e.name,
            ConfigEntry::ApiGateway(e) => &e.name,
            ConfigEntry::HttpRoute(e) => &e.name,
            ConfigEntry::TcpRoute(e) => &e.name,
            ConfigEntry::InlineCertificate(e) => &e.name,
            ConfigEntry::FileSystemCertificate(e) => &e.name,
        }
    }

    /// Index of the write that created it.
    pub fn create_index(&self) -> Index {
        each_entry!(self, e => e.create_index)
    }

    /// Index of the last write that changed it.
    pub fn modify_index(&self) -> Index {
        each_entry!(self, e => e.modify_index)
    }

    /// The entry's derived status, for the kinds that have one.
    pub fn status_mut(&mut self) -> Option<&mut Option<ConfigEntryStatus>> {
        match self {
            ConfigEntry::ApiGateway(e) => Some(&mut e.status),
            ConfigEntry::HttpRoute(e) => Some(&mut e.status),
            ConfigEntry::TcpRoute(e) => Some(&mut e.status),
            _ => None,
        }
    }

    /// The entry's derived status, for the kinds that have one.
    pub fn status(&self) -> Option<&Option<ConfigEntryStatus>> {
        match self {
            ConfigEntry::ApiGateway(e) => Some(&e.status),
            ConfigEntry::HttpRoute(e) => Some(&e.status),
            ConfigEntry::TcpRoute(e) => Some(&e.status),
            _ => None,
        }
    }

    /// Stamps the indexes of a write.
    pub fn set_indexes(&mut self, create: Index, modify: Index) {
        each_entry!(self, e => { e.create_index = create; e.modify_index = modify; })
    }

    /// Decodes an entry from a JSON value of any key casing; `Kind` selects the type.
    pub fn from_json(value: Value) -> Result<Self, crate::DecodeError> {
        let Value::Object(map) = value else {
            return Err(crate::DecodeError {
                path: String::new(),
                message: "a config entry must be a JSON object".into(),
            });
        };
        let kind = map
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("kind"))
            .and_then(|(_, v)| v.as_str())
            .ok_or_else(|| crate::DecodeError {
                path: "Kind".into(),
                message: "required".into(),
            })?;
        let kind: ConfigEntryKind = kind.parse().map_err(|e: UnknownConfigEntryKind| crate::DecodeError {
            path: "Kind".into(),
            message: e.to_string(),
        })?;
        let mut map = map;
        map.retain(|k, _| !k.eq_ignore_ascii_case("kind"));
        for scope in ["Namespace", "Partition"] {
            let keys: Vec<String> = map.keys().filter(|k| k.eq_ignore_ascii_case(scope)).cloned().collect();
            for key in keys {
                match map.remove(&key) {
                    None | Some(Value::Null) => {}
                    Some(Value::String(s)) if s.is_empty() || s == "default" => {}
                    Some(other) => {
                        return Err(crate::DecodeError {
                            path: scope.into(),
                            message: format!("only \"default\" is supported, got {other}"),
                        });
                    }
                }
            }
        }
        let value = Value::Object(map);
        Ok(match kind {
            ConfigEntryKind::ProxyDefaults => ConfigEntry::ProxyDefaults(crate::json::from_value(value)?),
            ConfigEntryKind::ServiceDefaults => ConfigEntry::ServiceDefaults(crate::json::from_value(value)?),
            ConfigEntryKind::ServiceRouter => ConfigEntry::ServiceRouter(crate::json::from_value(value)?),
            ConfigEntryKind::ServiceSplitter => ConfigEntry::ServiceSplitter(crate::json::from_value(value)?),
            ConfigEntryKind::ServiceResolver => ConfigEntry::ServiceResolver(crate::json::from_value(value)?),
            ConfigEntryKind::ServiceIntentions => ConfigEntry::ServiceIntentions(crate::json::from_value(value)?),
            ConfigEntryKind::Mesh => ConfigEntry::Mesh(crate::json::from_value(value)?),
            ConfigEntryKind::IngressGateway => ConfigEntry::IngressGateway(crate::json::from_value(value)?),
            ConfigEntryKind::TerminatingGateway => ConfigEntry::TerminatingGateway(crate::json::from_value(value)?),
            ConfigEntryKind::JwtProvider => ConfigEntry::JwtProvider(crate::json::from_value(value)?),
            ConfigEntryKind::ApiGateway => ConfigEntry::ApiGateway(crate::json::from_value(value)?),
            ConfigEntryKind::HttpRoute => ConfigEntry::HttpRoute(crate::json::from_value(value)?),
            ConfigEntryKind::TcpRoute => ConfigEntry::TcpRoute(crate::json::from_value(value)?),
            ConfigEntryKind::InlineCertificate => ConfigEntry::InlineCertificate(crate::json::from_value(value)?),
            ConfigEntryKind::FileSystemCertificate => {
                ConfigEntry::FileSystemCertificate(crate::json::from_value(value)?)
            }
            ConfigEntryKind::ExportedServices => ConfigEntry::ExportedServices(crate::json::from_value(value)?),
        })
    }
}

impl Validate for ConfigEntry {
    fn validate(&self) -> Result<(), ValidationError> {
        each_entry!(self, e => e.validate())
    }
}

impl Serialize for ConfigEntry {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let body = each_entry!(self, e => serde_json::to_value(e)).map_err(ser::Error::custom)?;
        let mut out = Map::new();
        out.insert("Kind".into(), Value::String(self.kind().as_str().into()));
        if let Value::Object(fields) = body {
            for (k, v) in fields {
                if k != "Kind" {
                    out.insert(k, v);
                }
            }
        }
        out.serialize(s)
    }
}

impl<'de> Deserialize<'de> for ConfigEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        ConfigEntry::from_json(value).map_err(de::Error::custom)
    }
}

/// Checks the `Name` of a named entry and that a singleton entry uses its fixed name.
pub(crate) fn check_entry_name(kind: ConfigEntryKind, name: &str) -> Result<(), ValidationError> {
    match kind.fixed_name() {
        Some(fixed) if !name.is_empty() && name != fixed => Err(ValidationError::new(
            "Name",
            Problem::Invalid(format!("{kind} entries must be named {fixed:?}, not {name:?}")),
        )),
        Some(_) => Ok(()),
        None => crate::validate::check_name("Name", name, ""),
    }
}

#[cfg(test)]
mod api_gateway_tests;
#[cfg(test)]
mod gateway_tests;
#[cfg(test)]
mod tests;

/// A setting Consul defines that meshd implements only at its default: kept as written (a
/// read shows it), accepted when empty or at a value meshd's behaviour already is, refused
/// otherwise with a 400 naming it and why: never quietly ignored.
pub type DefaultOnly = Option<serde_json::Value>;

/// Checks a [`DefaultOnly`] setting at `field`: empty (`null`, `""`, `{}`, `false`) or one of
/// `honoured`, else an error saying `why`.
pub(crate) fn check_default_only(
    field: &str,
    value: &DefaultOnly,
    honoured: &[serde_json::Value],
    why: &str,
) -> Result<(), crate::validate::ValidationError> {
    use serde_json::Value;
    let Some(v) = value else { return Ok(()) };
    let empty = match v {
        Value::Null | Value::Bool(false) => true,
        Value::String(s) => s.is_empty(),
        Value::Object(o) => o.values().all(|x| x.is_null() || x.as_str() == Some("")),
        Value::Array(a) => a.is_empty(),
        _ => false,
    };
    if empty || honoured.contains(v) {
        return Ok(());
    }
    Err(crate::validate::ValidationError::new(
        field,
        crate::validate::Problem::Invalid(format!("{v} is not supported: {why}")),
    ))
}

/// `MutualTLSMode`: meshd's sidecars always require mTLS.
pub(crate) fn check_mutual_tls_mode(value: &DefaultOnly) -> Result<(), crate::validate::ValidationError> {
    check_default_only(
        "MutualTLSMode",
        value,
        &[serde_json::json!("strict")],
        "meshd's sidecars always require mTLS on their public listener (\"strict\")",
    )
}

/// `PrioritizeByLocality`: meshd does not order endpoints by locality.
pub(crate) fn check_prioritize_by_locality(value: &DefaultOnly) -> Result<(), crate::validate::ValidationError> {
    check_default_only(
        "PrioritizeByLocality",
        value,
        &[serde_json::json!({"Mode": "none"})],
        "meshd does not order endpoints by locality (only Mode \"none\")",
    )
}
