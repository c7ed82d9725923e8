//! The entries of the local state: a registered service or check, with the generations
//! anti-entropy compares, and where each came from.

use structs::agent::{CheckKind, CheckType};
use structs::{HealthCheck, HealthStatus, NodeService, Token};
use tokio::time::Instant;

/// Where a registration came from: the HTTP API (persisted) or a config file (re-read on
/// reload, never persisted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Source {
    /// `/v1/agent/...` registrations.
    Api,
    /// `-config-file` definitions.
    Config,
}

/// A registered service instance.
#[derive(Clone)]
pub struct LocalService {
    /// The instance as the catalog gets it.
    pub service: NodeService,
    /// For a sidecar expanded from `Connect.SidecarService`: its parent's id.
    pub sidecar_of: Option<String>,
    /// Where it came from.
    pub source: Source,
    /// For a proxy the agent runs itself: how (see [`crate::managed`]).
    pub managed: Option<Managed>,
    /// The token it was registered with: its sync and (for a proxy) its watches use it.
    /// None: the agent's own.
    pub token: Option<Token>,
    pub(super) generation: u64,
    pub(super) synced: u64,
}

impl std::fmt::Debug for LocalService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalService")
            .field("service", &self.service)
            .field("sidecar_of", &self.sidecar_of)
            .field("source", &self.source)
            .field("managed", &self.managed)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

/// A proxy the agent runs: the command given with the registration, or (empty) the default,
/// `meshd connect envoy` against this agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Managed {
    /// The program and its arguments; empty for the default.
    #[serde(rename = "Command", default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// The proxy's token (the registration's), handed to it as `CONNECT_PROXY_TOKEN`. Kept
    /// with the registration on disk (0600), never printed.
    #[serde(
        rename = "Token",
        default,
        with = "structs::token::opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub token: Option<Token>,
    /// The proxy's local token, handed to it as `CONNECT_PROXY_TOKEN`: accepted by this
    /// agent only, for this proxy only (kept with the registration so a re-adopted proxy
    /// keeps working).
    #[serde(
        rename = "LocalToken",
        default,
        with = "structs::token::opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub local_token: Option<Token>,
}

/// A registered check.
#[derive(Debug, Clone)]
pub struct LocalCheck {
    /// The check as the catalog gets it (status and output included).
    pub check: HealthCheck,
    /// How it was defined; `None` for checks the agent owns (maintenance mode).
    pub definition: Option<CheckType>,
    /// How it runs; `None` when nothing runs it.
    pub kind: Option<CheckKind>,
    /// Where it came from.
    pub source: Source,
    /// Since when it has been critical.
    pub critical_since: Option<Instant>,
    /// Whether its runner has reported a result yet. Until then (an agent just started, the
    /// check loaded from disk or a config file) it takes the catalog's status in the first
    /// sync rather than pushing its initial one: a restart does not flap a healthy service.
    pub(super) ran: bool,
    pub(super) generation: u64,
    pub(super) synced: u64,
}

impl LocalService {
    /// The same, run by the agent when `managed` says how.
    pub fn with_managed(mut self, managed: Option<Managed>) -> Self {
        self.managed = managed;
        self
    }

    /// The same, registered with `token`.
    pub fn with_token(mut self, token: Option<Token>) -> Self {
        self.token = token;
        self
    }

    /// A service not yet seen by the catalog.
    pub fn new(service: NodeService, sidecar_of: Option<String>, source: Source) -> Self {
        Self {
            service,
            sidecar_of,
            source,
            managed: None,
            token: None,
            generation: 0,
            synced: 0,
        }
    }
}

impl LocalCheck {
    /// A check not yet seen by the catalog.
    pub fn new(check: HealthCheck, definition: Option<CheckType>, kind: Option<CheckKind>, source: Source) -> Self {
        let critical_since = (check.status == HealthStatus::Critical).then(Instant::now);
        Self {
            check,
            definition,
            kind,
            source,
            critical_since,
            ran: false,
            generation: 0,
            synced: 0,
        }
    }
}
