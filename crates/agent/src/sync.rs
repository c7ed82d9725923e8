//! Anti-entropy: the agent owns its node's entries in the catalog.
//!
//! - A full sync at start and then every `full_interval` (jittered down by up to a quarter)
//!   reads the node's services and checks from a server, compares them with the local state,
//!   and pushes what differs; entries of the node the agent does not have are removed (except
//!   the liveness check, which the server owns).
//! - A local change triggers a partial sync after `debounce`: only what changed is pushed.
//! - While no server answers, attempts back off (doubling, capped) and each failed step logs
//!   one line; the next attempt after a failure is a full sync, so a server that lost or
//!   rolled back state converges.
//!
//! Everything is pushed through the servers' catalog API (`PUT /v1/catalog/register` and
//! `/deregister`): one request per service (with its checks), lone checks in batches of
//! up to 64 per request, up to `concurrency` requests in flight.

use crate::backoff::{Backoff, jittered};
use crate::local::{LocalState, Pending};
use crate::servers::{ApiError, Servers, paths};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use structs::{DeregisterRequest, HealthCheck, Node, NodeService, RegisterRequest, Token};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, warn};

/// Lone checks pushed per catalog write.
const CHECKS_PER_WRITE: usize = 64;

/// The liveness check the server maintains for every node; anti-entropy leaves it alone.
pub const LIVENESS_CHECK_ID: &str = "serfHealth";

/// Timing of anti-entropy.
#[derive(Debug, Clone)]
pub struct SyncConfig {
    /// Longest time between full syncs (each one is jittered down by up to a quarter).
    pub full_interval: Duration,
    /// Quiet time after a local change before a partial sync.
    pub debounce: Duration,
    /// First retry delay while no server answers.
    pub retry_base: Duration,
    /// Longest retry delay.
    pub retry_max: Duration,
    /// Requests in flight at once (all on the agent's one HTTP/2 connection per server; each
    /// write waits for the server's disk, so this, divided by a group commit's time, bounds
    /// how fast a large node syncs).
    pub concurrency: usize,
}

impl Default for SyncConfig {
    fn default() -> Self {
        Self {
            full_interval: Duration::from_secs(60),
            debounce: Duration::from_millis(50),
            retry_base: Duration::from_secs(1),
            retry_max: Duration::from_secs(30),
            concurrency: 256,
        }
    }
}

/// This node as the catalog should show it.
#[derive(Debug, Clone, Default)]
pub struct NodeInfo {
    /// Node name.
    pub node: String,
    /// Node id (a UUID).
    pub id: String,
    /// The node's addresses by tag (`lan`, `lan_ipv4`, `wan`, `wan_ipv4`).
    pub tagged_addresses: BTreeMap<String, String>,
    /// Address the node is reached at.
    pub address: String,
    /// Datacenter.
    pub datacenter: String,
    /// Node metadata.
    pub meta: BTreeMap<String, String>,
    /// Services on the node that another owner keeps (a server's own `consul` service):
    /// anti-entropy neither removes nor compares them.
    pub server_owned_services: Vec<String>,
}

/// A node's tagged addresses as Consul's agents register them: `lan` and `wan` (this agent
/// has one address for both), and `lan_ipv4`/`wan_ipv4` (or `_ipv6`) when it is an IP.
pub fn tagged_addresses(address: &str) -> BTreeMap<String, String> {
    let family = match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => Some("ipv4"),
        Ok(std::net::IpAddr::V6(_)) => Some("ipv6"),
        Err(_) => None,
    };
    let mut out = BTreeMap::new();
    for tag in ["lan", "wan"] {
        out.insert(tag.to_owned(), address.to_owned());
        if let Some(family) = family {
            out.insert(format!("{tag}_{family}"), address.to_owned());
        }
    }
    out
}

/// The node's metadata with what Consul's agents add: `consul-version` (meshd's) and
/// `consul-network-segment` (empty: the default segment).
pub fn with_agent_meta(mut meta: BTreeMap<String, String>) -> BTreeMap<String, String> {
    meta.insert("consul-version".into(), env!("CARGO_PKG_VERSION").into());
    meta.insert("consul-network-segment".into(), String::new());
    meta
}

/// A write of anti-entropy to the servers' catalog.
#[derive(Debug, Clone, PartialEq)]
pub enum CatalogWrite {
    /// `PUT /v1/catalog/register`.
    Register(Box<RegisterRequest>),
    /// `PUT /v1/catalog/deregister`.
    Deregister(DeregisterRequest),
}

/// The catalog API anti-entropy needs: reads of one node, and writes. [`Servers`] is the real
/// one; tests use an in-memory catalog.
pub trait CatalogApi: Send + Sync + 'static {
    /// `GET path`, JSON-decoded.
    fn get(&self, path: String) -> impl Future<Output = Result<serde_json::Value, ApiError>> + Send;
    /// A catalog write with `token` (none: the agent's).
    fn write(&self, token: Option<&Token>, write: &CatalogWrite) -> impl Future<Output = Result<(), ApiError>> + Send;
    /// The server answering, for logs.
    fn describe(&self) -> String;
}

impl CatalogApi for Servers {
    async fn get(&self, path: String) -> Result<serde_json::Value, ApiError> {
        self.get_json(&path).await
    }
    async fn write(&self, token: Option<&Token>, write: &CatalogWrite) -> Result<(), ApiError> {
        let token = token.cloned().or_else(|| self.token());
        match write {
            CatalogWrite::Register(r) => self.put_json_as(token.as_ref(), paths::CATALOG_REGISTER, r).await,
            CatalogWrite::Deregister(d) => self.put_json_as(token.as_ref(), paths::CATALOG_DEREGISTER, d).await,
        }
    }
    fn describe(&self) -> String {
        self.current().unwrap_or_default().to_owned()
    }
}

/// Pushes local state to the servers; see the module docs.
#[derive(Debug)]
pub struct Syncer<C = Servers> {
    state: Arc<LocalState>,
    servers: Arc<C>,
    node: Arc<NodeInfo>,
    config: SyncConfig,
    synced_once: tokio::sync::watch::Sender<bool>,
    /// The local state's change count the last successful sync pushed everything of (0
    /// before the first); `None` while the last attempt failed (the servers cannot be
    /// reached or refuse).
    synced_through: tokio::sync::watch::Sender<Option<u64>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct NodeServices {
    #[serde(rename = "Node")]
    node: Option<Node>,
    #[serde(rename = "Services")]
    services: BTreeMap<String, NodeService>,
}

impl<C: CatalogApi> Syncer<C> {
    /// A syncer for `state` of `node`.
    pub fn new(state: Arc<LocalState>, servers: Arc<C>, node: NodeInfo, config: SyncConfig) -> Self {
        Self {
            state,
            servers,
            node: Arc::new(node),
            config,
            synced_once: tokio::sync::watch::channel(false).0,
            // Nothing synced yet, and nothing failed: a wait waits for the first sync.
            synced_through: tokio::sync::watch::channel(Some(0)).0,
        }
    }

    /// Waits (at most `limit`) until a sync has pushed every local change up to `version`:
    /// true once it has. False at once while the servers cannot be reached (the change stays
    /// pending and syncs when they can).
    pub async fn wait_synced(&self, version: u64, limit: Duration) -> bool {
        let mut rx = self.synced_through.subscribe();
        let reached = rx.wait_for(|s| s.is_none_or(|through| through >= version));
        match tokio::time::timeout(limit, reached).await {
            Ok(Ok(s)) => s.is_some(),
            _ => false,
        }
    }

    /// True once a sync has left nothing pending (and again after each one that did).
    pub fn in_sync(&self) -> bool {
        *self.synced_once.borrow() && self.state.pending().is_empty()
    }

    /// Waits until the first successful full sync.
    pub async fn wait_first_sync(&self) {
        let mut rx = self.synced_once.subscribe();
        let _ = rx.wait_for(|done| *done).await;
    }

    /// Runs until `stop` fires.
    pub async fn run(&self, stop: CancellationToken) {
        let mut changes = self.state.subscribe();
        let mut backoff = Backoff::new(self.config.retry_base, self.config.retry_max);
        let mut full = true;
        let mut next_full = tokio::time::Instant::now();
        let mut said_denied = false;
        loop {
            let seen = *changes.borrow_and_update();
            let result = if full {
                self.full_sync().await
            } else {
                self.push().await
            };
            match result {
                Ok(()) => {
                    said_denied = false;
                    self.synced_through.send_replace(Some(seen));
                    if backoff.failures() > 0 {
                        info!(
                            server = self.servers.describe(),
                            "anti-entropy: in sync with the servers again"
                        );
                    }
                    backoff.reset();
                    if full {
                        full = false;
                        next_full = tokio::time::Instant::now() + jittered(self.config.full_interval, 0.25);
                        self.synced_once.send_replace(true);
                    }
                }
                Err(error) => {
                    self.synced_through.send_replace(None);
                    let delay = backoff.next_delay();
                    let denied = matches!(error, ApiError::PermissionDenied(_));
                    if denied && !said_denied {
                        // Every retry would fail alike until an operator acts: said once, loudly.
                        error!(
                            %error,
                            node = %self.node.node,
                            "anti-entropy: the servers refuse this agent's token for its own node: the token \
                             (-acl-agent-token-file) needs node:write on this node (a token with a node identity for \
                             it), and -node must name the node the token is for; nothing registered here reaches the \
                             catalog until then"
                        );
                    } else if denied {
                        debug!(%error, retry_in = ?delay, "anti-entropy sync still refused");
                    } else {
                        warn!(%error, retry_in = ?delay, attempt = backoff.failures(), "anti-entropy sync failed");
                    }
                    said_denied |= denied;
                    full = true;
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(delay) => continue,
                    }
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(self.config.debounce) => {}
                    }
                }
                () = tokio::time::sleep_until(next_full) => full = true,
            }
        }
    }

    /// Reads the node's entries from a server, compares, pushes the differences.
    pub async fn full_sync(&self) -> Result<(), ApiError> {
        let node = &self.node.node;
        let decode = |e: structs::DecodeError| ApiError::Decode(e.to_string());
        let remote = self.servers.get(paths::catalog_node(node)).await?;
        let remote: NodeServices = if remote.is_null() {
            NodeServices::default()
        } else {
            structs::json::from_value(remote).map_err(decode)?
        };
        let mut checks: Vec<HealthCheck> =
            structs::json::from_value(self.servers.get(paths::health_node(node)).await?).map_err(decode)?;
        checks.retain(|c| !self.node.server_owned_services.contains(&c.service_id));
        let node_ok = remote.node.as_ref().is_some_and(|n| {
            n.address == self.node.address
                && n.id == self.node.id
                && n.tagged_addresses == self.node.tagged_addresses
                && n.meta == self.node.meta
                && (self.node.datacenter.is_empty() || n.datacenter == self.node.datacenter)
        });
        if !node_ok {
            debug!("registering the node");
            self.servers
                .write(
                    None,
                    // The datacenter is named so that a server of another one refuses (loudly)
                    // rather than adopting this node.
                    &CatalogWrite::Register(Box::new(RegisterRequest {
                        node: node.clone(),
                        id: self.node.id.clone(),
                        address: self.node.address.clone(),
                        tagged_addresses: self.node.tagged_addresses.clone(),
                        datacenter: self.node.datacenter.clone(),
                        node_meta: self.node.meta.clone(),
                        ..RegisterRequest::default()
                    })),
                )
                .await?;
        }
        let services: Vec<NodeService> = remote
            .services
            .into_values()
            .filter(|s| !self.node.server_owned_services.contains(&s.id))
            .collect();
        self.state.reconcile(&services, &checks, &[LIVENESS_CHECK_ID]);
        self.push().await
    }

    /// Pushes what is out of sync: removals first, then services with their checks, then lone
    /// checks. Fails on the first unreachable server; a request the server refuses is logged
    /// and retried at the next sync.
    pub async fn push(&self) -> Result<(), ApiError> {
        let Pending {
            services,
            checks,
            deleted_services,
            deleted_checks,
        } = self.state.pending();
        let mut jobs: Vec<Job> = Vec::new();
        jobs.extend(deleted_services.into_iter().map(Job::DeleteService));
        jobs.extend(deleted_checks.into_iter().map(Job::DeleteCheck));
        let mut writes: Vec<Job> = Vec::new();
        writes.extend(services.into_iter().map(|(s, g, c)| Job::Service(Box::new(s), g, c)));
        // Lone checks travel in batches: one catalog write for many status changes, per
        // token (a service's checks go with its registration token).
        let mut by_token: BTreeMap<Option<Token>, Vec<(HealthCheck, u64)>> = BTreeMap::new();
        for (check, generation) in checks {
            let token = self.state.token_of(&check.service_id);
            by_token.entry(token).or_default().push((check, generation));
        }
        for (token, checks) in by_token {
            let mut checks = checks.into_iter().peekable();
            while checks.peek().is_some() {
                writes.push(Job::Checks(
                    token.clone(),
                    checks.by_ref().take(CHECKS_PER_WRITE).collect(),
                ));
            }
        }
        // Removals complete before writes start: a check moving between ids never has both
        // its old and new self removed by a late deregistration.
        let info = Arc::clone(&self.node);
        for batch in [jobs, writes] {
            let mut set = JoinSet::new();
            let mut first_err = None;
            for job in batch {
                while set.len() >= self.config.concurrency.max(1) {
                    if let Some(Ok(Err(e))) = set.join_next().await {
                        first_err.get_or_insert(e);
                    }
                }
                if first_err.is_some() {
                    break;
                }
                let servers = Arc::clone(&self.servers);
                let state = Arc::clone(&self.state);
                let info = Arc::clone(&info);
                set.spawn(async move { job.run(&*servers, &state, &info).await }.instrument(tracing::Span::current()));
            }
            while let Some(done) = set.join_next().await {
                if let Ok(Err(e)) = done {
                    first_err.get_or_insert(e);
                }
            }
            if let Some(e) = first_err {
                return Err(e);
            }
        }
        Ok(())
    }
}

enum Job {
    DeleteService(String),
    DeleteCheck(String),
    Service(Box<NodeService>, u64, Vec<(HealthCheck, u64)>),
    /// Checks with the token they are written with (none: the agent's).
    Checks(Option<Token>, Vec<(HealthCheck, u64)>),
}

impl Job {
    async fn run<C: CatalogApi>(self, servers: &C, state: &LocalState, info: &NodeInfo) -> Result<(), ApiError> {
        let node = info.node.as_str();
        let result = match &self {
            // Removals run with the agent's token (node:write covers what is on the node).
            Job::DeleteService(id) => {
                servers
                    .write(
                        None,
                        &CatalogWrite::Deregister(DeregisterRequest {
                            node: node.to_owned(),
                            service_id: id.clone(),
                            ..DeregisterRequest::default()
                        }),
                    )
                    .await
            }
            Job::DeleteCheck(id) => {
                servers
                    .write(
                        None,
                        &CatalogWrite::Deregister(DeregisterRequest {
                            node: node.to_owned(),
                            check_id: id.clone(),
                            ..DeregisterRequest::default()
                        }),
                    )
                    .await
            }
            Job::Service(svc, _, checks) => {
                let token = state.token_of(&svc.id);
                let register = RegisterRequest {
                    service: Some((**svc).clone()),
                    checks: checks.iter().map(|(c, _)| c.clone()).collect(),
                    ..on_node(info)
                };
                servers
                    .write(token.as_ref(), &CatalogWrite::Register(Box::new(register)))
                    .await
            }
            Job::Checks(token, checks) => {
                let register = RegisterRequest {
                    checks: checks.iter().map(|(c, _)| c.clone()).collect(),
                    ..on_node(info)
                };
                servers
                    .write(token.as_ref(), &CatalogWrite::Register(Box::new(register)))
                    .await
            }
        };
        match result {
            Ok(()) => {
                match self {
                    Job::DeleteService(id) => state.mark_service_deleted(&id),
                    Job::DeleteCheck(id) => state.mark_check_deleted(&id),
                    Job::Service(svc, generation, checks) => {
                        state.mark_service_synced(&svc.id, generation);
                        for (c, g) in checks {
                            state.mark_check_synced(&c.check_id, g);
                        }
                    }
                    Job::Checks(_, checks) => {
                        for (c, g) in checks {
                            state.mark_check_synced(&c.check_id, g);
                        }
                    }
                }
                Ok(())
            }
            Err(e) if e.is_unreachable() => Err(e),
            Err(error) => {
                warn!(%error, entry = self.describe(), "a server refused an anti-entropy update; retried at the next sync");
                Ok(())
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Job::DeleteService(id) => format!("deregister service {id}"),
            Job::DeleteCheck(id) => format!("deregister check {id}"),
            Job::Service(s, ..) => format!("register service {}", s.id),
            Job::Checks(_, checks) => format!(
                "register checks {}",
                checks
                    .iter()
                    .map(|(c, _)| c.check_id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

#[cfg(test)]
mod tests;

/// A registration on the node that leaves the node's own fields as they are; a node the
/// catalog does not have yet is made with them (its id, addresses and meta).
fn on_node(info: &NodeInfo) -> RegisterRequest {
    RegisterRequest {
        node: info.node.clone(),
        id: info.id.clone(),
        address: info.address.clone(),
        tagged_addresses: info.tagged_addresses.clone(),
        node_meta: info.meta.clone(),
        skip_node_update: true,
        ..RegisterRequest::default()
    }
}
