//! Proxy configuration carried by proxy registrations, and their upstreams.

use crate::validate::{Problem, Validate, ValidationError, check_name, check_port};
use serde::{Deserialize, Serialize};
use std::{collections::BTreeSet, fmt};

pub use crate::protocol::OpaqueConfig;

macro_rules! string_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $text:literal $(| $alias:literal)*),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name { $($(#[$vm])* $variant),+ }

        impl $name {
            /// Consul's spelling.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s.to_ascii_lowercase().as_str() {
                    $($text $(| $alias)* => Ok($name::$variant),)+
                    _ => Err(format!(
                        "unknown value {s:?}: expected one of {}",
                        [$($text),+].iter().filter(|t| !t.is_empty()).map(|t| format!("{t:?}")).collect::<Vec<_>>().join(", ")
                    )),
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <Option<String> as ::serde::Deserialize>::deserialize(d)?.unwrap_or_default();
                s.parse().map_err(<D::Error as ::serde::de::Error>::custom)
            }
        }
    };
}
pub(crate) use string_enum;

string_enum! {
    /// How outbound traffic reaches the proxy.
    ProxyMode {
        /// Not set: inherits from config entries, else direct.
        #[default]
        Default = "",
        /// Applications dial the upstreams' local bind ports.
        Direct = "direct",
        /// Traffic is redirected to the proxy transparently.
        Transparent = "transparent",
    }
}

string_enum! {
    /// Whether and how cross-datacenter traffic goes through mesh gateways.
    MeshGatewayMode {
        /// Not set: inherits.
        #[default]
        Default = "",
        /// Direct to the remote instances.
        None = "none",
        /// Through a gateway in the local datacenter.
        Local = "local",
        /// Through a gateway in the remote datacenter.
        Remote = "remote",
    }
}

string_enum! {
    /// What an upstream names. Kept as given (an unset one reads back `""`, as Consul's),
    /// and meaning a service when unset.
    DestinationType {
        /// Not given: a service.
        #[default]
        Unset = "",
        /// A service.
        Service = "service",
        /// A prepared query.
        PreparedQuery = "prepared_query",
    }
}

impl MeshGatewayMode {
    /// This mode, or `inherited` when it is not set.
    pub fn or(self, inherited: MeshGatewayMode) -> MeshGatewayMode {
        match self {
            MeshGatewayMode::Default => inherited,
            mode => mode,
        }
    }
}

impl DestinationType {
    /// What it means: unset is a service.
    pub fn effective(self) -> Self {
        match self {
            DestinationType::Unset => DestinationType::Service,
            other => other,
        }
    }
}

/// Mesh gateway settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MeshGatewayConfig {
    /// The mode.
    #[serde(rename = "Mode", skip_serializing_if = "crate::json::ser::is_default")]
    pub mode: MeshGatewayMode,
}

/// Transparent-proxy settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TransparentProxyConfig {
    /// Port the outbound listener binds (default 15001).
    #[serde(
        rename = "OutboundListenerPort",
        skip_serializing_if = "crate::json::ser::is_default"
    )]
    pub outbound_listener_port: u16,
    /// Let clients dial this instance's address directly.
    #[serde(rename = "DialedDirectly", skip_serializing_if = "std::ops::Not::not")]
    pub dialed_directly: bool,
}

/// One path exposed without mTLS (health checks, metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ExposePath {
    /// Port the proxy listens on for it.
    #[serde(rename = "ListenerPort", skip_serializing_if = "crate::json::ser::is_default")]
    pub listener_port: u16,
    /// HTTP path.
    #[serde(rename = "Path", skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// Port of the local service that serves it.
    #[serde(rename = "LocalPathPort", skip_serializing_if = "crate::json::ser::is_default")]
    pub local_path_port: u16,
    /// `http` or `http2`.
    #[serde(rename = "Protocol", skip_serializing_if = "String::is_empty")]
    pub protocol: String,
    /// Added by the agent for one of the service's checks (`Expose.Checks`): only this host
    /// and the node's address may reach it.
    #[serde(rename = "ParsedFromCheck", skip_serializing_if = "std::ops::Not::not")]
    pub parsed_from_check: bool,
}

/// Paths exposed without mTLS.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ExposeConfig {
    /// Expose every HTTP and gRPC check of the service automatically.
    #[serde(rename = "Checks", skip_serializing_if = "std::ops::Not::not")]
    pub checks: bool,
    /// Paths exposed explicitly.
    #[serde(rename = "Paths", skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<ExposePath>,
}

/// A service (or prepared query) the proxied application calls through the proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Upstream {
    /// `service` (default) or `prepared_query`.
    #[serde(rename = "DestinationType")]
    pub destination_type: DestinationType,
    /// Namespace of the destination; empty is `default`.
    #[serde(rename = "DestinationNamespace", skip_serializing_if = "String::is_empty")]
    pub destination_namespace: String,
    /// Name of the destination.
    #[serde(rename = "DestinationName")]
    pub destination_name: String,
    /// Datacenter to resolve it in; empty is the proxy's own.
    #[serde(rename = "Datacenter")]
    pub datacenter: String,
    /// The peer that exports it (cluster peering); empty: this cluster's own.
    #[serde(rename = "DestinationPeer", skip_serializing_if = "String::is_empty")]
    pub destination_peer: String,
    /// Address the outbound listener binds (default 127.0.0.1).
    #[serde(rename = "LocalBindAddress", skip_serializing_if = "String::is_empty")]
    pub local_bind_address: String,
    /// Port the outbound listener binds.
    #[serde(rename = "LocalBindPort", skip_serializing_if = "crate::json::ser::is_default")]
    pub local_bind_port: u16,
    /// Unix socket to bind instead of address and port.
    #[serde(rename = "LocalBindSocketPath", skip_serializing_if = "String::is_empty")]
    pub local_bind_socket_path: String,
    /// Opaque per-upstream config (`protocol`, `connect_timeout_ms`, ...); keys untouched.
    #[serde(rename = "Config", skip_serializing_if = "OpaqueConfig::is_empty")]
    pub config: OpaqueConfig,
    /// Mesh gateway mode for this upstream.
    #[serde(rename = "MeshGateway")]
    pub mesh_gateway: MeshGatewayConfig,
    /// Added by central config (transparent proxy), not by the registration.
    #[serde(rename = "CentrallyConfigured", skip_serializing_if = "std::ops::Not::not")]
    pub centrally_configured: bool,
}

impl Upstream {
    /// The identity of this upstream within one proxy.
    pub fn id(&self) -> UpstreamId {
        UpstreamId {
            destination_type: self.destination_type.effective(),
            namespace: if self.destination_namespace.is_empty() {
                "default".to_owned()
            } else {
                self.destination_namespace.clone()
            },
            name: self.destination_name.clone(),
            datacenter: self.datacenter.clone(),
            peer: self.destination_peer.clone(),
        }
    }

    /// The config keys meshd acts on, typed.
    pub fn options(&self) -> crate::ProxyOptions {
        crate::ProxyOptions::parse(&self.config)
    }

    /// `Config.protocol`, if set to a protocol the mesh knows.
    pub fn protocol(&self) -> Option<crate::Protocol> {
        self.options().protocol
    }
}

/// Identifies one upstream of a proxy: type, namespace, name and datacenter.
///
/// Displayed as Consul does: `name`, `name?dc=dc2`, `prepared_query:name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UpstreamId {
    /// Service or prepared query.
    pub destination_type: DestinationType,
    /// Namespace (`default` when unset).
    pub namespace: String,
    /// Destination name.
    pub name: String,
    /// Datacenter, empty for the proxy's own.
    pub datacenter: String,
    /// The peer exporting it, empty for this cluster's own.
    pub peer: String,
}

impl fmt::Display for UpstreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.destination_type == DestinationType::PreparedQuery {
            f.write_str("prepared_query:")?;
        }
        f.write_str(&self.name)?;
        if self.namespace != "default" {
            write!(f, "?ns={}", self.namespace)?;
        }
        if !self.datacenter.is_empty() {
            let sep = if self.namespace != "default" { '&' } else { '?' };
            write!(f, "{sep}dc={}", self.datacenter)?;
        }
        if !self.peer.is_empty() {
            let sep = if self.namespace != "default" || !self.datacenter.is_empty() {
                '&'
            } else {
                '?'
            };
            write!(f, "{sep}peer={}", self.peer)?;
        }
        Ok(())
    }
}

/// The `Proxy` block of a proxy or gateway registration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConnectProxyConfig {
    /// Name of the service this sidecar fronts.
    #[serde(rename = "DestinationServiceName", skip_serializing_if = "String::is_empty")]
    pub destination_service_name: String,
    /// Instance id of the service this sidecar fronts.
    #[serde(rename = "DestinationServiceID", skip_serializing_if = "String::is_empty")]
    pub destination_service_id: String,
    /// Address of the local application (default 127.0.0.1).
    #[serde(rename = "LocalServiceAddress", skip_serializing_if = "String::is_empty")]
    pub local_service_address: String,
    /// Port of the local application.
    #[serde(rename = "LocalServicePort", skip_serializing_if = "crate::json::ser::is_default")]
    pub local_service_port: u16,
    /// Unix socket of the local application.
    #[serde(rename = "LocalServiceSocketPath", skip_serializing_if = "String::is_empty")]
    pub local_service_socket_path: String,
    /// Direct or transparent.
    #[serde(rename = "Mode")]
    pub mode: ProxyMode,
    /// Opaque proxy config (`protocol`, `bind_address`, `envoy_*` ...); keys untouched.
    #[serde(rename = "Config", skip_serializing_if = "OpaqueConfig::is_empty")]
    pub config: OpaqueConfig,
    /// Upstreams.
    #[serde(rename = "Upstreams", skip_serializing_if = "Vec::is_empty")]
    pub upstreams: Vec<Upstream>,
    /// Mesh gateway mode default for the upstreams.
    #[serde(rename = "MeshGateway")]
    pub mesh_gateway: MeshGatewayConfig,
    /// Paths exposed without mTLS.
    #[serde(rename = "Expose")]
    pub expose: ExposeConfig,
    /// Transparent-proxy settings.
    #[serde(rename = "TransparentProxy", skip_serializing_if = "crate::json::ser::is_default")]
    pub transparent_proxy: TransparentProxyConfig,
}

impl ConnectProxyConfig {
    /// How the upstream at `index` of `upstreams` reaches other datacenters: its own mesh
    /// gateway mode, else the proxy's (an index past them, an implicit upstream, has none
    /// of its own).
    pub fn upstream_mesh_gateway_mode(&self, index: usize) -> MeshGatewayMode {
        self.upstreams
            .get(index)
            .map_or(MeshGatewayMode::Default, |u| u.mesh_gateway.mode)
            .or(self.mesh_gateway.mode)
    }

    /// The config keys meshd acts on, typed.
    pub fn options(&self) -> crate::ProxyOptions {
        crate::ProxyOptions::parse(&self.config)
    }

    /// `Config.protocol`, if set to a protocol the mesh knows.
    pub fn protocol(&self) -> Option<crate::Protocol> {
        self.options().protocol
    }
}

/// Refuses `Expose.Checks` in central config (proxy-defaults, service-defaults): the agent
/// exposes a sidecar's checks when it registers the sidecar, from the sidecar's own
/// `Expose.Checks`, and would not see the entry's.
pub(crate) fn refuse_central_expose_checks(expose: &ExposeConfig) -> Result<(), ValidationError> {
    if expose.checks {
        return Err(ValidationError::new(
            "Expose.Checks",
            Problem::Invalid(
                "is read from each sidecar's registration only (its Proxy.Expose.Checks), where the agent exposes its service's checks; set it there".into(),
            ),
        ));
    }
    Ok(())
}

impl Validate for ConnectProxyConfig {
    fn validate(&self) -> Result<(), ValidationError> {
        crate::ProxyOptions::check_proxy(&self.config)?;
        let mut ids = BTreeSet::new();
        let mut binds = BTreeSet::new();
        for (i, u) in self.upstreams.iter().enumerate() {
            let at = format!("Upstreams[{i}]");
            u.validate().map_err(|e| e.within(&at))?;
            if !ids.insert(u.id()) {
                return Err(ValidationError::new(
                    format!("{at}.DestinationName"),
                    Problem::Duplicate(format!("upstream {}", u.id())),
                ));
            }
            if u.local_bind_port != 0 {
                let addr = if u.local_bind_address.is_empty() {
                    "127.0.0.1"
                } else {
                    &u.local_bind_address
                };
                if !binds.insert((addr.to_owned(), u.local_bind_port)) {
                    return Err(ValidationError::new(
                        format!("{at}.LocalBindPort"),
                        Problem::Duplicate(format!("bind address {addr}:{}", u.local_bind_port)),
                    ));
                }
            }
        }
        for (i, p) in self.expose.paths.iter().enumerate() {
            let at = format!("Expose.Paths[{i}]");
            if !p.path.starts_with('/') {
                return Err(ValidationError::new(
                    format!("{at}.Path"),
                    Problem::Invalid("must begin with '/'".into()),
                ));
            }
            check_port(&format!("{at}.ListenerPort"), p.listener_port, "")?;
            check_port(&format!("{at}.LocalPathPort"), p.local_path_port, "")?;
            if !matches!(p.protocol.as_str(), "" | "http" | "http2") {
                return Err(ValidationError::new(
                    format!("{at}.Protocol"),
                    Problem::Invalid(format!("unsupported protocol {:?}: expected http or http2", p.protocol)),
                ));
            }
        }
        Ok(())
    }
}

impl Validate for Upstream {
    fn validate(&self) -> Result<(), ValidationError> {
        check_name("DestinationName", &self.destination_name, "")?;
        if !self.destination_peer.is_empty() {
            crate::validate::check_peer_name("DestinationPeer", &self.destination_peer)?;
            if !self.datacenter.is_empty() {
                return Err(ValidationError::new(
                    "DestinationPeer",
                    Problem::Invalid("cannot be set with Datacenter".into()),
                ));
            }
            if self.destination_type.effective() == DestinationType::PreparedQuery {
                return Err(ValidationError::new(
                    "DestinationPeer",
                    Problem::Invalid("a prepared query cannot be in a peer".into()),
                ));
            }
        }
        if self.local_bind_socket_path.is_empty() && !self.centrally_configured {
            check_port(
                "LocalBindPort",
                self.local_bind_port,
                "unless LocalBindSocketPath is set",
            )?;
        }
        if !self.local_bind_address.is_empty() && self.local_bind_address.parse::<std::net::IpAddr>().is_err() {
            return Err(ValidationError::new(
                "LocalBindAddress",
                Problem::Invalid(format!("{:?} is not an IP address", self.local_bind_address)),
            ));
        }
        if let Some(v) = self.config.get(crate::protocol::PROTOCOL_KEY)
            && !v.is_string()
        {
            return Err(ValidationError::new(
                "Config.protocol",
                Problem::Invalid("must be a string".into()),
            ));
        }
        crate::ProxyOptions::check_upstream(&self.config)
    }
}
