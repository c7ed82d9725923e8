//! meshd's domain types: nodes, services and proxies, health, config entries, intentions,
//! the CA's roots and leaves, discovery chains and catalog indexes.
//!
//! Everything here is plain data plus validation; nothing does I/O. JSON follows Consul's
//! shapes: [`json::from_slice`] accepts any key casing on input, `serde_json` writes
//! Consul's casing on output, and empty lists are written as `[]`.

pub mod acl;
pub mod agent;
pub mod audit;
pub mod bootstrap;
pub mod central_config;
pub mod config_entry;
pub mod connect;
pub mod discovery_chain;
pub mod duration;
pub mod event;
pub mod federation;
pub mod filter;
pub mod health;
pub mod index;
pub mod intention;
pub mod json;
pub mod kv;
pub mod listing;
pub mod node;
pub mod peering;
pub mod protocol;
pub mod proxy;
pub mod query;
pub mod rate_limits;
pub mod registration;
pub mod resolved;
pub mod service;
pub mod session;
pub mod token;
pub mod txn;
pub mod validate;
pub mod wire;

pub use config_entry::{ConfigEntry, ConfigEntryKind};
pub use connect::{CaRoot, IndexedCaRoots, IssuedCert, SpiffeIdService, Timestamp};
pub use discovery_chain::{CompiledDiscoveryChain, DiscoveryTarget, TargetId};
pub use duration::GoDuration;
pub use filter::{Filter, FilterError};
pub use health::{CheckServiceNode, HealthCheck, HealthStatus};
pub use index::Index;
pub use intention::Intention;
pub use json::DecodeError;
pub use kv::KvEntry;
pub use node::Node;
pub use protocol::{DnsDiscoveryType, InboundOptions, Protocol, ProxyOptions};
pub use proxy::{
    ConnectProxyConfig, DestinationType, ExposeConfig, ExposePath, MeshGatewayConfig, MeshGatewayMode, ProxyMode,
    TransparentProxyConfig, Upstream, UpstreamId,
};
pub use rate_limits::RateLimits;
pub use registration::{DeregisterRequest, RegisterRequest};
pub use resolved::{GatewayService, ResolvedServiceConfig, ResolvedUpstreamConfig};
pub use service::{NodeService, ServiceKind};
pub use token::Token;
pub use validate::{Problem, Validate, ValidationError};
