//! Catalog values tests build again and again.

use structs::{CheckServiceNode, Node, NodeService, ServiceKind};

/// A healthy sidecar instance of `service` on node `node-<addr>` at `addr:port` (no checks).
pub fn sidecar_instance(service: &str, addr: &str, port: u16) -> CheckServiceNode {
    CheckServiceNode {
        node: Node {
            node: format!("node-{addr}"),
            address: addr.into(),
            ..Default::default()
        },
        service: NodeService {
            kind: ServiceKind::ConnectProxy,
            id: format!("{service}-sidecar-proxy"),
            service: format!("{service}-sidecar-proxy"),
            port,
            ..Default::default()
        },
        checks: Vec::new(),
    }
}
