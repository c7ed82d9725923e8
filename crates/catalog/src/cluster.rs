//! The servers sharing one catalog, as one server sees them: who they are, which one leads,
//! and the heartbeats any of them heard. Only a shared storage has a cluster (etcd: see
//! `etcd/cluster.rs`); the embedded store's single server has none and does the leader's
//! work itself.

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

/// How a server describes itself to the others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServerInfo {
    /// Its name.
    pub name: String,
    /// The address it reports (`/v1/status/leader`, `/v1/status/peers`).
    pub address: String,
    /// Its xDS address.
    #[serde(default)]
    pub xds_address: String,
    /// Its gRPC TLS address (empty: none), where other clusters' servers dial it to peer.
    #[serde(default)]
    pub grpc_tls_address: String,
}

/// The servers as this one last saw them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterStatus {
    /// The leading server, if one leads now.
    pub leader: Option<ServerInfo>,
    /// Every registered server, by name.
    pub servers: Vec<ServerInfo>,
}

/// This server's membership among the servers sharing its storage.
#[async_trait::async_trait]
pub trait Cluster: std::fmt::Debug + Send + Sync {
    /// The servers and the leader, as last seen.
    fn status(&self) -> ClusterStatus;

    /// Follows [`Cluster::status`].
    fn subscribe_status(&self) -> watch::Receiver<ClusterStatus>;

    /// This server's description.
    fn me(&self) -> &ServerInfo;

    /// Whether this server leads now; follow it to start and stop singleton work.
    fn leading(&self) -> watch::Receiver<bool>;

    /// When any server last reported a heartbeat of `node`.
    fn heartbeat_seen(&self, node: &str) -> Option<Instant>;

    /// Tells the other servers (the leader) that these nodes sent this server a heartbeat.
    async fn share_heartbeats(&self, nodes: Vec<String>);
}
