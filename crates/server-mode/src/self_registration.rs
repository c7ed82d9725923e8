//! A server in its own catalog, as Consul's servers are: its node (a stable id, its
//! addresses tagged `lan`, `lan_ipv4`, `wan`, `wan_ipv4`, and Consul's `consul-version` and
//! `consul-network-segment` meta keys), the `consul` service (the HTTP API's port), and the
//! node's liveness check, kept passing by this server's heartbeats like an agent's (so a
//! server that stops turns critical after `-node-liveness-timeout`, then is reaped).
//! Clients that find servers through the `consul` service, and tools that expect it, work.

use catalog::liveness::Liveness;
use catalog::{Op, Store};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use structs::{NodeService, RegisterRequest};
use tokio_util::sync::CancellationToken;

/// What a server registers of itself.
pub(crate) struct SelfRegistration {
    pub(crate) store: Store,
    pub(crate) liveness: Arc<Liveness>,
    pub(crate) node: String,
    pub(crate) node_id: String,
    /// The HTTP API's address (an unspecified IP is registered as loopback).
    pub(crate) api_addr: SocketAddr,
    /// How other datacenters reach this server (`host:port`).
    pub(crate) wan: String,
    /// The last attempt failed (said once, not at every retry).
    pub(crate) failing: Arc<std::sync::atomic::AtomicBool>,
}

impl SelfRegistration {
    fn request(&self) -> RegisterRequest {
        let ip = if self.api_addr.ip().is_unspecified() {
            std::net::IpAddr::from([127, 0, 0, 1])
        } else {
            self.api_addr.ip()
        };
        let lan = ip.to_string();
        let wan = self
            .wan
            .rsplit_once(':')
            .map_or(self.wan.as_str(), |(host, _)| host)
            .trim_matches(['[', ']'])
            .to_owned();
        let family = |addr: &str| match addr.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(_)) => "ipv6",
            _ => "ipv4",
        };
        let tagged: BTreeMap<String, String> = [
            ("lan".to_owned(), lan.clone()),
            (format!("lan_{}", family(&lan)), lan.clone()),
            ("wan".to_owned(), wan.clone()),
            (format!("wan_{}", family(&wan)), wan),
        ]
        .into();
        let meta: BTreeMap<String, String> = [
            ("consul-version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
            ("consul-network-segment".to_owned(), String::new()),
        ]
        .into();
        RegisterRequest {
            id: self.node_id.clone(),
            node: self.node.clone(),
            address: lan,
            tagged_addresses: tagged,
            node_meta: meta,
            service: Some(NodeService {
                id: "consul".into(),
                service: "consul".into(),
                port: self.api_addr.port(),
                ..NodeService::default()
            }),
            ..RegisterRequest::default()
        }
    }

    /// True when the catalog holds the node and service as `want` describes them.
    fn registered(&self, want: &RegisterRequest) -> bool {
        let state = self.store.read();
        let node_ok = state.node(&want.node).is_some_and(|n| {
            n.id == want.id
                && n.address == want.address
                && n.tagged_addresses == want.tagged_addresses
                && n.meta == want.node_meta
        });
        node_ok
            && state
                .service(&want.node, "consul")
                .is_some_and(|s| s.service == "consul" && Some(s.port) == want.service.as_ref().map(|w| w.port))
    }

    /// Registers (when the catalog lacks or changed the registration) and heartbeats once;
    /// true when both took. The server does it before it serves, so that its first clients
    /// see it in place (and no index moves under them for it).
    pub(crate) async fn once(&self) -> bool {
        use std::sync::atomic::Ordering;
        let want = self.request();
        let mut result = Ok(());
        if !self.registered(&want) {
            result = self.store.write(Op::Register(Box::new(want.clone()))).await.map(|_| ());
        }
        if result.is_ok() {
            result = self.liveness.heartbeat(&self.node, &want.address).await;
        }
        match result {
            Ok(()) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(node = %self.node, "this server is in its catalog again");
                }
                true
            }
            Err(e) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(node = %self.node, error = %e, "registering this server in its catalog failed; retrying");
                }
                false
            }
        }
    }

    /// Then every third of the liveness timeout (registering again whenever the catalog
    /// lost or changed the registration: a restore, a reap, a deregistration by hand) until
    /// `stop`.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let every = (self.liveness.config().timeout / 3).max(Duration::from_millis(100));
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            self.once().await;
        }
    }
}
