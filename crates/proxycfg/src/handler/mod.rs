//! Kind handlers: what a proxy of each kind watches and how updates fold into its snapshot.
//!
//! A handler is driven by its proxy's State: `initialize` starts the watches the kind always
//! needs, then `handle_update` is called once per current update and may start or cancel
//! chained watches. Handlers never block and never see errors (the State keeps the last good
//! data and logs).

mod api_gateway;
mod connect_proxy;
mod ingress_gateway;
mod mesh_gateway;
mod terminating_gateway;
mod transparent;
mod upstreams;

pub use api_gateway::{ApiGatewayHandler, backend_id as api_gateway_backend_id};
pub use connect_proxy::ConnectProxyHandler;
pub use ingress_gateway::{
    INGRESS_DOMAIN, IngressGatewayHandler, dns_sans as ingress_dns_sans, service_hosts as ingress_service_hosts,
    upstream_id as ingress_upstream_id,
};
pub use mesh_gateway::MeshGatewayHandler;
pub use terminating_gateway::TerminatingGatewayHandler;
pub use transparent::{implicit_id, intention_upstreams};

use crate::data_sources::{DataSources, UpdatePayload};
use crate::registration::ProxyRegistration;
use crate::snapshot::{ConfigSnapshot, KindSnapshot};
use crate::{CorrelationId, Watches};
use structs::ServiceKind;

/// Per-kind snapshot logic.
pub trait KindHandler: Send + 'static {
    /// Starts the kind's initial watches and returns its empty snapshot part.
    fn initialize(&mut self, watches: &mut Watches) -> KindSnapshot;

    /// Folds one update into `snapshot`, starting or cancelling chained watches as needed.
    fn handle_update(
        &mut self,
        id: CorrelationId,
        payload: UpdatePayload,
        snapshot: &mut ConfigSnapshot,
        watches: &mut Watches,
    ) -> Result<(), HandlerError>;
}

/// An update a handler could not use; logged by the State, which carries on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerError {
    /// The payload is not the type this watch delivers (a data source bug).
    #[error("watch {id} delivered a {got} payload")]
    UnexpectedPayload {
        /// The watch.
        id: String,
        /// What arrived.
        got: &'static str,
    },
    /// No watch of this kind uses that correlation id.
    #[error("no watch {0} belongs to this proxy kind")]
    UnknownWatch(String),
    /// The snapshot is of another kind than the handler's (a State bug).
    #[error("the snapshot is not of this handler's kind")]
    WrongKind,
}

/// The proxy's kind has no handler (yet).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("proxy kind {} is not supported", .0.as_str())]
pub struct UnsupportedKind(pub ServiceKind);

/// Starts the watches every kind has: the CA roots, the `mesh` entry and `proxy-defaults`.
fn watch_roots_and_mesh(sources: &DataSources, datacenter: &str, watches: &mut Watches) {
    watches.start(
        &sources.ca_roots,
        CorrelationId::Roots,
        crate::data_sources::CaRootsRequest {
            datacenter: datacenter.to_owned(),
        },
    );
    watches.start(
        &sources.config_entry,
        CorrelationId::MeshConfig,
        crate::data_sources::ConfigEntryRequest {
            kind: structs::ConfigEntryKind::Mesh,
            name: "mesh".into(),
        },
    );
    watches.start(
        &sources.config_entry,
        CorrelationId::ProxyDefaults,
        crate::data_sources::ConfigEntryRequest {
            kind: structs::ConfigEntryKind::ProxyDefaults,
            name: "global".into(),
        },
    );
}

/// Starts the watches every gateway has: roots, the `mesh` entry, and the services it fronts.
fn watch_gateway(sources: &DataSources, datacenter: &str, gateway: &str, watches: &mut Watches) {
    watch_roots_and_mesh(sources, datacenter, watches);
    watches.start(
        &sources.gateway_services,
        CorrelationId::GatewayServices,
        crate::data_sources::GatewayServicesRequest {
            datacenter: datacenter.to_owned(),
            gateway: gateway.to_owned(),
        },
    );
}

/// The handler for a registration's kind.
pub fn handler_for(
    registration: &ProxyRegistration,
    datacenter: &str,
    sources: &DataSources,
) -> Result<Box<dyn KindHandler>, UnsupportedKind> {
    match registration.service.kind {
        ServiceKind::ConnectProxy => Ok(Box::new(ConnectProxyHandler::new(
            registration,
            datacenter,
            sources.clone(),
        ))),
        ServiceKind::IngressGateway => Ok(Box::new(IngressGatewayHandler::new(
            registration,
            datacenter,
            sources.clone(),
        ))),
        ServiceKind::TerminatingGateway => Ok(Box::new(TerminatingGatewayHandler::new(
            registration,
            datacenter,
            sources.clone(),
        ))),
        ServiceKind::MeshGateway => Ok(Box::new(MeshGatewayHandler::new(
            registration,
            datacenter,
            sources.clone(),
        ))),
        ServiceKind::ApiGateway => Ok(Box::new(ApiGatewayHandler::new(
            registration,
            datacenter,
            sources.clone(),
        ))),
        other => Err(UnsupportedKind(other)),
    }
}

impl UpdatePayload {
    /// The payload's variant name, for errors.
    pub fn type_name(&self) -> &'static str {
        match self {
            UpdatePayload::CaRoots(_) => "CaRoots",
            UpdatePayload::Leaf(_) => "Leaf",
            UpdatePayload::Intentions(_) => "Intentions",
            UpdatePayload::Health(_) => "Health",
            UpdatePayload::DiscoveryChain(_) => "DiscoveryChain",
            UpdatePayload::ConfigEntry(_) => "ConfigEntry",
            UpdatePayload::ConfigEntryList(_) => "ConfigEntryList",
            UpdatePayload::ResolvedServiceConfig(_) => "ResolvedServiceConfig",
            UpdatePayload::ServiceList(_) => "ServiceList",
            UpdatePayload::Datacenters(_) => "Datacenters",
            UpdatePayload::MeshGateways(_) => "MeshGateways",
            UpdatePayload::GatewayServices(_) => "GatewayServices",
            UpdatePayload::HttpChecks(_) => "HttpChecks",
            UpdatePayload::PeeredUpstream(_) => "PeeredUpstream",
            UpdatePayload::PeerTrustBundles(_) => "PeerTrustBundles",
            UpdatePayload::PeeringServers(_) => "PeeringServers",
        }
    }
}
