//! meshd's agent: it runs next to workloads, keeps the services and checks registered on
//! its node, runs the checks, and owns its node's entries in the servers' catalog.
//!
//! - [`local`]: the local state, with what anti-entropy still has to push.
//! - [`sidecar`]: service definitions made concrete (`Connect.SidecarService` expansion).
//! - [`persist`]: registrations on disk under the data dir.
//! - [`checks`]: TTL, HTTP, TCP and alias checks, one task each.
//! - [`check_targets`]: where checks registered through the API may point.
//! - [`managed`]: proxies the agent runs itself (Consul 1.4's managed proxies).
//! - [`sync`]: anti-entropy against the servers' catalog API.
//! - [`runtime`]: the [`Agent`] tying them together (with the liveness heartbeat).
//! - [`config_file`]: `-config-file` JSON.
//! - [`http`]: the agent's Consul-compatible HTTP API and the forwarding of the rest.

pub mod acl;
pub mod backoff;
pub mod check_targets;
pub use agent_cache::cache;
pub use api_client as servers;
pub mod checks;
pub mod config_file;
pub mod expose;
pub mod http;
pub mod local;
pub mod managed;
pub mod persist;
pub mod reload;
pub mod runtime;
pub mod sidecar;
pub mod sync;

pub use local::{LocalState, Source};
pub use runtime::{Agent, AgentConfig, AgentError};
pub use sync::SyncConfig;
