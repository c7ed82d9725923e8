//! How to reach etcd, and how this server appears among the servers sharing it.

use crate::layout;
use std::time::Duration;

/// How to reach etcd and how this server appears in the cluster.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// Client URLs of the etcd members (`http://host:2379`).
    pub endpoints: Vec<String>,
    /// Every key meshd writes starts with this (`/meshd/`).
    pub prefix: String,
    /// This server's name, unique in the cluster (its node name).
    pub server_name: String,
    /// The address this server reports for itself (`/v1/status/peers`).
    pub advertise: String,
    /// This server's xDS address, for whoever lists servers.
    pub xds_address: String,
    /// This server's gRPC TLS address (empty: none): where peers' servers dial it.
    pub grpc_tls_address: String,
    /// Lease of the server's registration and leadership: a dead server's duties move to
    /// another within this time.
    pub lease_ttl: Duration,
    /// A write not committed by etcd within this time fails (quorum lost, etcd down).
    pub request_timeout: Duration,
    /// Operations one etcd transaction may hold (etcd's `--max-txn-ops`, 128 by default).
    pub max_txn_ops: usize,
}

impl EtcdConfig {
    /// Settings for `endpoints` with the defaults.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            prefix: "/meshd/".into(),
            server_name: "meshd-server".into(),
            advertise: String::new(),
            xds_address: String::new(),
            grpc_tls_address: String::new(),
            lease_ttl: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            max_txn_ops: 128,
        }
    }

    /// Where the catalog's keys start.
    pub(super) fn catalog_prefix(&self) -> String {
        format!("{}{}", self.prefix, layout::CATALOG)
    }

    /// The write guard's key (see [`layout::GUARD`]).
    pub(super) fn guard_key(&self) -> String {
        format!("{}{}", self.catalog_prefix(), layout::GUARD)
    }
}
