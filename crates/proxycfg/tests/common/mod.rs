//! Shared fixtures: fake data sources, registrations, chains.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use proxycfg::data_sources::*;
use proxycfg::fake::FakeDataSources;
use proxycfg::*;
use std::{sync::Arc, time::Duration};
use structs::discovery_chain::{ChainNode, ChainResolver, DiscoveryTarget, TargetSubset, target_sni};
use structs::*;

pub const TRUST: &str = "11111111-2222-3333-4444-555555555555.consul";

pub struct Fixture {
    pub fakes: FakeDataSources,
    pub manager: Manager,
}

pub fn fixture() -> Fixture {
    fixture_with(ManagerConfig::default())
}

pub fn fixture_with(config: ManagerConfig) -> Fixture {
    let fakes = FakeDataSources::with_defaults(TRUST);
    let manager = Manager::new(config, fakes.data_sources());
    Fixture { fakes, manager }
}

/// Registers `reg` from the local source and watches it.
pub async fn register_and_watch(f: &Fixture, reg: &ProxyRegistration) -> Watcher {
    f.manager
        .register(reg.clone(), ProxySource::Local, false)
        .await
        .unwrap();
    f.manager.watch(&reg.id)
}

pub fn sidecar(service: &str, port: u16, upstreams: &[(&str, u16)]) -> ProxyRegistration {
    let svc = NodeService {
        kind: ServiceKind::ConnectProxy,
        id: format!("{service}-sidecar-proxy"),
        service: format!("{service}-sidecar-proxy"),
        port,
        proxy: ConnectProxyConfig {
            destination_service_name: service.into(),
            destination_service_id: service.into(),
            local_service_port: 8080,
            upstreams: upstreams
                .iter()
                .map(|(name, port)| Upstream {
                    destination_name: (*name).into(),
                    local_bind_port: *port,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        },
        ..Default::default()
    };
    ProxyRegistration {
        id: ProxyId::new("node-1", svc.id.clone()),
        service: Arc::new(svc),
        token: None,
    }
}

pub fn health_req(service: &str, dc: &str) -> HealthRequest {
    HealthRequest {
        datacenter: dc.into(),
        service: service.into(),
        connect: true,
        passing_only: false,
        healthy_only: true,
        filter: String::new(),
        kind: None,
        token: None,
    }
}

pub fn chain_req(name: &str) -> DiscoveryChainRequest {
    DiscoveryChainRequest {
        datacenter: "dc1".into(),
        name: name.into(),
        namespace: "default".into(),
        override_protocol: None,
        override_connect_timeout_ms: 0,
        override_mesh_gateway: MeshGatewayMode::Default,
    }
}

/// A sidecar instance of `service` at `addr` on the sidecar port.
pub fn instance(service: &str, addr: &str) -> CheckServiceNode {
    test_support::fixtures::sidecar_instance(service, addr, 21000)
}

/// A chain for `service` whose targets are the given (subset, datacenter) pairs.
pub fn chain_with_targets(service: &str, targets: &[(&str, &str)]) -> CompiledDiscoveryChain {
    let mut chain = CompiledDiscoveryChain::default_for(service, "dc1", TRUST, Protocol::Tcp);
    chain.targets.clear();
    chain.nodes.clear();
    for (subset, dc) in targets {
        let id = TargetId::new(subset, service, "default", dc);
        chain.targets.insert(
            id.clone(),
            DiscoveryTarget {
                id: id.clone(),
                service: service.into(),
                service_subset: (*subset).into(),
                namespace: "default".into(),
                datacenter: (*dc).into(),
                subset: TargetSubset {
                    filter: format!("Service.Meta.version == {subset}"),
                    only_passing: true,
                },
                sni: target_sni(subset, service, "default", dc, TRUST),
                name: target_sni(subset, service, "default", dc, TRUST),
                partition: "default".into(),
                connect_timeout_ms: 5000,
                load_balancer: None,
                peer: String::new(),
                spiffe_ids: Vec::new(),
            },
        );
        chain.nodes.insert(
            format!("resolver:{id}"),
            ChainNode::resolver(
                id.to_string(),
                ChainResolver {
                    target: id,
                    ..Default::default()
                },
                None,
            ),
        );
    }
    chain.default = false;
    chain
}

/// Lets every task run and the coalescing window pass (paused time: no real waiting).
pub async fn settle() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}

pub async fn next_snapshot(w: &mut Watcher) -> Arc<ConfigSnapshot> {
    match tokio::time::timeout(Duration::from_secs(5), w.next()).await {
        Ok(Some(WatchEvent::Snapshot(s))) => s,
        other => panic!("expected a snapshot, got {other:?}"),
    }
}

pub fn upstream_id(name: &str) -> UpstreamId {
    Upstream {
        destination_name: name.into(),
        ..Default::default()
    }
    .id()
}
