//! An agent's settings and the errors of its operations.

use crate::checks::TtlError;
use crate::sync::SyncConfig;
use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;
use structs::{Problem, ValidationError};

/// Settings of an agent.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Node name.
    pub node: String,
    /// Datacenter.
    pub datacenter: String,
    /// Address of the node in the catalog.
    pub advertise: String,
    /// Node metadata in the catalog (the agent adds `consul-version` and
    /// `consul-network-segment`, as Consul's agents do; keys starting `consul-` are theirs).
    pub node_meta: BTreeMap<String, String>,
    /// The node's id in the catalog, a UUID (`-node-id`). `None`: the one kept in the data dir
    /// (`node-id`, made at the first start), or a new one at each start without a data dir.
    pub node_id: Option<String>,
    /// Where registrations are persisted; `None` keeps them in memory only (`-dev`).
    pub data_dir: Option<PathBuf>,
    /// Servers' HTTP addresses.
    pub servers: Vec<String>,
    /// Ports sidecars are given when they name none.
    pub sidecar_ports: RangeInclusive<u16>,
    /// Ports exposed check listeners are given (`Expose.Checks`).
    pub expose_ports: RangeInclusive<u16>,
    /// Anti-entropy timing.
    pub sync: SyncConfig,
    /// How often the agent tells a server it is alive.
    pub heartbeat_interval: Duration,
    /// How often critical checks are looked at for `DeregisterCriticalServiceAfter`.
    pub reap_interval: Duration,
    /// Run the sidecars of `Connect.SidecarService` registrations as managed proxies
    /// (Consul 1.4's `Connect.Proxy` registrations always are).
    pub managed_sidecars: bool,
    /// Accept a managed proxy's `Command` from the HTTP API (anyone who reaches the API could
    /// otherwise make the agent run a program); config files may always set one.
    pub allow_managed_api_registration: bool,
    /// ACL enforcement and the agent's tokens.
    pub acl: crate::acl::AclConfig,
    /// The CA (PEM) that verifies the servers reached over `https://`; when set, no other
    /// root is trusted (`None`: the public roots).
    pub servers_ca_pem: Option<Vec<u8>>,
    /// The client certificate and key (PEM) presented to servers that verify their clients
    /// (a server's own agent, reaching it over HTTPS only).
    pub servers_identity_pem: Option<Vec<u8>>,
    /// Where HTTP and TCP checks registered through the API may point besides their
    /// service's own address and port (`-check-allowed-targets`; see
    /// [`crate::check_targets`]).
    pub check_allowed_targets: Vec<crate::check_targets::Cidr>,
    /// The agent's own listening addresses (HTTP, HTTPS, xDS): never the target of a check
    /// registered through the API (a token-less request to the HTTP API runs with the
    /// default token).
    pub listeners: Vec<std::net::SocketAddr>,
    /// The ports the agent listens on (`/v1/agent/self`'s `DebugConfig`).
    pub ports: http_kit::Ports,
    /// The agent of a server, as every Consul server is an agent too: the server registers
    /// the node and keeps it alive itself, so this agent sends no heartbeats, anti-entropy
    /// leaves the server's `consul` service alone, and no registration may take its id;
    /// managed proxies are refused (a server runs none).
    pub in_server: bool,
    /// The node's tagged addresses (`None`: `lan`/`wan` at `advertise`, see
    /// [`crate::sync::tagged_addresses`]); a server registers its WAN address apart.
    pub tagged_addresses: Option<BTreeMap<String, String>>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            node: "meshd-agent".into(),
            datacenter: "dc1".into(),
            advertise: "127.0.0.1".into(),
            node_meta: BTreeMap::new(),
            node_id: None,
            data_dir: None,
            servers: Vec::new(),
            sidecar_ports: 21000..=21255,
            expose_ports: crate::expose::EXPOSE_PORTS,
            sync: SyncConfig::default(),
            heartbeat_interval: Duration::from_secs(1),
            reap_interval: Duration::from_secs(5),
            managed_sidecars: false,
            allow_managed_api_registration: false,
            acl: crate::acl::AclConfig::default(),
            servers_ca_pem: None,
            servers_identity_pem: None,
            check_allowed_targets: Vec::new(),
            listeners: Vec::new(),
            ports: http_kit::Ports::default(),
            in_server: false,
            tagged_addresses: None,
        }
    }
}

impl AgentConfig {
    /// Checks what the catalog would refuse later (the node name, the datacenter), naming the
    /// setting.
    pub fn validate(&self) -> Result<(), ValidationError> {
        for (field, value) in [("node", &self.node), ("datacenter", &self.datacenter)] {
            if value.is_empty() {
                return Err(ValidationError::new(field, Problem::Required("")));
            }
            if let Some(c) = value
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
            {
                return Err(ValidationError::new(
                    field,
                    Problem::Invalid(format!(
                        "{value:?} has the character {c:?}: use letters, digits, '-', '_' or '.'"
                    )),
                ));
            }
        }
        if let Some(id) = &self.node_id
            && uuid::Uuid::parse_str(id).is_err()
        {
            return Err(ValidationError::new(
                "node_id",
                Problem::Invalid(format!("{id:?} is not a UUID (as Consul, node ids are UUIDs)")),
            ));
        }
        if let Some(key) = self.node_meta.keys().find(|k| k.starts_with("consul-")) {
            return Err(ValidationError::new(
                "node_meta",
                Problem::Invalid(format!(
                    "the key {key:?} is reserved: keys starting \"consul-\" are set by the agent"
                )),
            ));
        }
        if self.advertise.is_empty() {
            return Err(ValidationError::new("advertise", Problem::Required("")));
        }
        for (field, range) in [
            ("sidecar_ports", &self.sidecar_ports),
            ("expose_ports", &self.expose_ports),
        ] {
            if range.is_empty() {
                return Err(ValidationError::new(
                    field,
                    Problem::Invalid("the range is empty".into()),
                ));
            }
        }
        Ok(())
    }
}

/// Why an agent operation failed. Nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Bad input; names the field.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The named service or check is not registered here.
    #[error("{0}")]
    NotFound(String),
    /// The caller's token may not make this change (Consul's `Permission denied` text).
    #[error("{0}")]
    Denied(String),
    /// A registration could not be persisted.
    #[error("cannot persist the registration: {0}")]
    Persist(#[from] std::io::Error),
    /// The CA for the servers' HTTPS is unusable.
    #[error(transparent)]
    ServersCa(#[from] crate::servers::ServersCaError),
    /// The data directory is unusable.
    #[error("cannot use data dir {path}: {error}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
}

impl From<TtlError> for AgentError {
    fn from(e: TtlError) -> Self {
        match e {
            TtlError::NotFound(_) => AgentError::NotFound(e.to_string()),
            TtlError::NotTtl(_) => {
                AgentError::Invalid(ValidationError::new("CheckID", Problem::Invalid(e.to_string())))
            }
        }
    }
}
