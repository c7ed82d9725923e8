//! Shared test fixtures: snapshots with real CA material, and the pinned Envoy.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use proxycfg::{ConfigSnapshot, ConnectProxySnapshot, KindSnapshot, ProxyId, UpstreamSnapshot};
use std::{collections::BTreeMap, sync::Arc, time::SystemTime};
use structs::config_entry::IntentionAction;
use structs::*;

pub use test_support::fixtures::sidecar_instance as instance;

pub struct Ca {
    pub state: catalog::ca::CaState,
}

impl Ca {
    pub fn new() -> Self {
        Ca {
            state: catalog::ca::CaState::bootstrap(catalog::ca::CaConfig::default(), None).unwrap(),
        }
    }
    pub fn roots(&self) -> Arc<IndexedCaRoots> {
        Arc::new(self.state.bundle(SystemTime::now()))
    }
    pub fn leaf(&self, service: &str) -> Arc<IssuedCert> {
        Arc::new(catalog::ca::sign_leaf(&self.state, "dc1", service, SystemTime::now()).unwrap())
    }
}

pub struct Scenario {
    pub protocol: &'static str,
    pub upstreams: Vec<(&'static str, u16, &'static str)>,
    pub intentions: Vec<(&'static str, IntentionAction)>,
    pub instances: Vec<CheckServiceNode>,
}

/// A valid connect-proxy snapshot for `web` with the given upstreams (name, bind port, protocol).
pub fn snapshot(ca: &Ca, s: &Scenario) -> ConfigSnapshot {
    let roots = ca.roots();
    let mut proxy = ConnectProxyConfig {
        destination_service_name: "web".into(),
        destination_service_id: "web".into(),
        local_service_port: 8080,
        ..Default::default()
    };
    for (name, port, _) in &s.upstreams {
        proxy.upstreams.push(Upstream {
            destination_name: (*name).into(),
            local_bind_port: *port,
            ..Default::default()
        });
    }
    let service = NodeService {
        kind: ServiceKind::ConnectProxy,
        id: "web-sidecar-proxy".into(),
        service: "web-sidecar-proxy".into(),
        port: 21000,
        proxy,
        ..Default::default()
    };
    let mut upstreams = BTreeMap::new();
    for (index, (name, _, protocol)) in s.upstreams.iter().enumerate() {
        let chain = Arc::new(CompiledDiscoveryChain::default_for(
            name,
            "dc1",
            &roots.trust_domain,
            protocol.parse().unwrap(),
        ));
        let mut up = UpstreamSnapshot::new(index);
        for target in chain.targets.keys() {
            up.endpoints.insert(target.clone(), Arc::new(s.instances.clone()));
        }
        up.chain = Some(chain);
        let id = Upstream {
            destination_name: (*name).into(),
            ..Default::default()
        }
        .id();
        upstreams.insert(Arc::new(id), Arc::new(up));
    }
    let intentions: Vec<Intention> = s
        .intentions
        .iter()
        .map(|(src, action)| {
            let mut i = Intention {
                source_ns: "default".into(),
                source_name: (*src).into(),
                destination_ns: "default".into(),
                destination_name: "web".into(),
                action: Some(*action),
                ..Default::default()
            };
            i.update_precedence();
            i
        })
        .collect();
    let mut resolved = ResolvedServiceConfig::default();
    resolved
        .proxy_config
        .insert("protocol".into(), serde_json_value(s.protocol));
    ConfigSnapshot {
        proxy_id: Arc::new(ProxyId::new("node-1", "web-sidecar-proxy")),
        service: Arc::new(service),
        datacenter: Arc::from("dc1"),
        version: 1,
        roots: Some(roots),
        proxy_defaults: Some(None),
        intention_default_allow: true,
        kind: KindSnapshot::ConnectProxy(ConnectProxySnapshot {
            leaf: Some(ca.leaf("web")),
            intentions: Some(Arc::new(intentions)),
            mesh_config: Some(None),
            resolved_config: Some(Arc::new(resolved)),
            http_checks: Arc::new(vec![]),
            upstreams: Arc::new(upstreams),
            jwt_providers: None,
            transparent: false,
            intention_upstreams: None,
            ..Default::default()
        }),
    }
}

fn serde_json_value(s: &str) -> serde_json::Value {
    serde_json::Value::String(s.to_owned())
}
