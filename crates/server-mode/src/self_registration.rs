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
    /// The HTTP API's address (a wildcard IP: the advertised one, else loopback, is
    /// registered).
    pub(crate) api_addr: SocketAddr,
    /// How other datacenters reach this server (`host:port`).
    pub(crate) wan: String,
    /// The last attempt failed (said once, not at every retry).
    pub(crate) failing: Arc<std::sync::atomic::AtomicBool>,
}

impl SelfRegistration {
    pub(crate) fn request(&self) -> RegisterRequest {
        let wan_host = self
            .wan
            .rsplit_once(':')
            .map_or(self.wan.as_str(), |(host, _)| host)
            .trim_matches(['[', ']'])
            .to_owned();
        let wan_ip = wan_host.parse::<std::net::IpAddr>().ok();
        // A wildcard listener says nothing of where the server is reached: its advertised
        // address (-advertise-wan) when that is an address, else loopback.
        let lan = match (self.api_addr.ip(), wan_ip) {
            (ip, _) if !ip.is_unspecified() => ip.to_string(),
            (_, Some(ip)) if !ip.is_unspecified() => ip.to_string(),
            _ => "127.0.0.1".to_owned(),
        };
        let wan = if wan_ip.is_some_and(|ip| ip.is_unspecified()) {
            lan.clone()
        } else {
            wan_host
        };
        // `lan`/`wan`, and `_ipv4`/`_ipv6` beside each that is an IP (as agents tag theirs).
        let mut tagged: BTreeMap<String, String> = BTreeMap::new();
        for (tag, addr) in [("lan", &lan), ("wan", &wan)] {
            tagged.insert(tag.to_owned(), addr.clone());
            match addr.parse::<std::net::IpAddr>() {
                Ok(std::net::IpAddr::V4(_)) => tagged.insert(format!("{tag}_ipv4"), addr.clone()),
                Ok(std::net::IpAddr::V6(_)) => tagged.insert(format!("{tag}_ipv6"), addr.clone()),
                Err(_) => None,
            };
        }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    async fn registration(api: &str, wan: &str) -> SelfRegistration {
        let store = Store::open(catalog::StoreConfig::default()).await.unwrap();
        SelfRegistration {
            liveness: Arc::new(Liveness::new(store.clone(), Default::default())),
            store,
            node: "s1".into(),
            node_id: "7e3c0d5a-1b2c-4d3e-8f4a-5b6c7d8e9f00".into(),
            api_addr: api.parse().unwrap(),
            wan: wan.into(),
            failing: Arc::default(),
        }
    }

    #[tokio::test]
    async fn a_wildcard_listener_registers_the_advertised_address_else_loopback() {
        for (api, wan, lan, wan_want) in [
            ("10.0.0.5:8500", "10.0.0.5:8500", "10.0.0.5", "10.0.0.5"),
            ("0.0.0.0:8500", "192.0.2.7:8500", "192.0.2.7", "192.0.2.7"),
            ("0.0.0.0:8500", "0.0.0.0:8500", "127.0.0.1", "127.0.0.1"),
            ("0.0.0.0:8500", "dc1.example.com:8500", "127.0.0.1", "dc1.example.com"),
        ] {
            let r = registration(api, wan).await.request();
            assert_eq!(r.address, lan, "{api} {wan}");
            assert_eq!(r.tagged_addresses["lan_ipv4"], lan);
            assert_eq!(r.tagged_addresses["wan"], wan_want, "{api} {wan}");
            assert_eq!(
                r.tagged_addresses.contains_key("wan_ipv4"),
                wan_want.parse::<std::net::Ipv4Addr>().is_ok(),
                "{api} {wan}"
            );
            assert_eq!(r.service.unwrap().port, 8500);
        }
    }

    #[tokio::test]
    async fn once_registers_the_node_and_the_consul_service_then_writes_nothing_more() {
        let me = registration("10.0.0.5:8500", "10.0.0.5:8500").await;
        assert!(me.once().await);
        let state = me.store.read();
        let node = state.node("s1").unwrap();
        assert_eq!(node.id, me.node_id);
        assert_eq!(node.meta["consul-version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(state.service("s1", "consul").unwrap().port, 8500);
        let index = state.index;
        drop(state);
        assert!(me.once().await);
        assert_eq!(
            me.store.read().index,
            index,
            "nothing written when in place and passing"
        );
    }
}
