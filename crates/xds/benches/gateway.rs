//! Gateway resource builds (prints figures; asserts nothing).
//!
//! An ingress gateway exposing 200 HTTP services on one listener (each with its own host),
//! and a terminating gateway representing 200 services. For each, two changes: the
//! instances of one service change, and one service is added. Printed per change: the time
//! to build the gateway's resources (p50, p99) and what a delta stream receives (resources
//! whose version changed, and their bytes).
//!
//! Run: `cargo xtask bench gateway`. Scale with `ITERS=` (200) and `SERVICES=` (200).
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use proxycfg::{ConfigSnapshot, IngressGatewaySnapshot, KindSnapshot, LinkedServiceSnapshot, ProxyId};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use structs::{CompiledDiscoveryChain, ConfigEntry, GatewayService, ServiceKind};
use test_support::figures::{env_usize, percentile};
use xds::versioned::VersionedResources;

fn svc(i: usize) -> String {
    format!("svc-{i:03}")
}

fn base(ca: &Ca, kind: ServiceKind, name: &str, part: KindSnapshot) -> ConfigSnapshot {
    ConfigSnapshot {
        proxy_id: Arc::new(ProxyId::new("node-1", name)),
        service: Arc::new(structs::NodeService {
            kind,
            id: name.into(),
            service: name.into(),
            address: "10.0.0.100".into(),
            port: 8443,
            ..Default::default()
        }),
        datacenter: Arc::from("dc1"),
        version: 1,
        roots: Some(ca.roots()),
        proxy_defaults: Some(None),
        intention_default_allow: true,
        kind: part,
    }
}

fn instances(service: &str, n: u8) -> Arc<Vec<structs::CheckServiceNode>> {
    Arc::new(
        (1..=n)
            .map(|i| instance(service, &format!("10.1.0.{i}"), 21000))
            .collect(),
    )
}

fn ingress(ca: &Ca, services: usize) -> ConfigSnapshot {
    let trust_domain = ca.roots().trust_domain.clone();
    let names: Vec<String> = (0..services).map(svc).collect();
    let entry = ConfigEntry::from_json(serde_json::json!({
        "Kind": "ingress-gateway", "Name": "ingress",
        "Listeners": [{"Port": 8080, "Protocol": "http",
            "Services": names.iter().map(|n| serde_json::json!({"Name": n, "Hosts": [format!("{n}.example.com")]})).collect::<Vec<_>>()}],
    }))
    .unwrap();
    let links: Vec<GatewayService> = names
        .iter()
        .map(|n| GatewayService {
            gateway: "ingress".into(),
            service: n.clone(),
            gateway_kind: ServiceKind::IngressGateway,
            port: 8080,
            protocol: "http".into(),
            hosts: vec![format!("{n}.example.com")],
            ..Default::default()
        })
        .collect();
    let mut upstreams = BTreeMap::new();
    for n in &names {
        let chain = Arc::new(CompiledDiscoveryChain::default_for(
            n,
            "dc1",
            &trust_domain,
            structs::Protocol::Http,
        ));
        let mut up = proxycfg::UpstreamSnapshot::new(usize::MAX);
        for t in chain.targets.keys() {
            up.endpoints.insert(t.clone(), instances(n, 3));
        }
        up.chain = Some(chain);
        upstreams.insert(Arc::new(proxycfg::handler::ingress_upstream_id(n)), Arc::new(up));
    }
    base(
        ca,
        ServiceKind::IngressGateway,
        "ingress",
        KindSnapshot::IngressGateway(IngressGatewaySnapshot {
            leaf: Some(ca.leaf("ingress")),
            entry: Some(Some(Arc::new(entry))),
            mesh_config: Some(None),
            services: Some(Arc::new(links)),
            upstreams: Arc::new(upstreams),
        }),
    )
}

fn terminating(ca: &Ca, services: usize) -> ConfigSnapshot {
    let mut linked = BTreeMap::new();
    let mut links = Vec::new();
    for n in (0..services).map(svc) {
        let link = GatewayService {
            gateway: "terminating".into(),
            service: n.clone(),
            gateway_kind: ServiceKind::TerminatingGateway,
            ca_file: "/etc/ssl/certs/ca-certificates.crt".into(),
            sni: format!("{n}.example.com"),
            ..Default::default()
        };
        let mut s = LinkedServiceSnapshot::new(link.clone());
        s.leaf = Some(ca.leaf(&n));
        s.intentions = Some(Arc::new(Vec::new()));
        s.config = Some(Arc::new(structs::ResolvedServiceConfig::default()));
        s.endpoints = Some(instances(&n, 2));
        s.resolver = Some(None);
        linked.insert(n, Arc::new(s));
        links.push(link);
    }
    base(
        ca,
        ServiceKind::TerminatingGateway,
        "terminating",
        KindSnapshot::TerminatingGateway(proxycfg::TerminatingGatewaySnapshot {
            mesh_config: Some(None),
            services: Some(Arc::new(links)),
            linked: Arc::new(linked),
        }),
    )
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

/// Builds `next` after `first` `iters` times; prints the build time and the delta.
fn measure(label: &str, first: &Arc<ConfigSnapshot>, next: &Arc<ConfigSnapshot>, iters: usize) {
    let shared = xds::resources::SharedEncodings::default();
    let previous = VersionedResources::build_after(first, Some(&shared), None).unwrap();
    let mut times = Vec::with_capacity(iters);
    let mut built = None;
    for _ in 0..iters {
        let t0 = Instant::now();
        let r = VersionedResources::build_after(next, Some(&shared), Some(&previous)).unwrap();
        times.push(t0.elapsed());
        built = Some(r);
    }
    let built = built.unwrap();
    let (mut changed, mut bytes, mut total, mut total_bytes) = (0usize, 0usize, 0usize, 0usize);
    for type_url in xds::resources::TYPES {
        for (name, v) in built.of(type_url) {
            let size = v.resource.value.len() + name.len() + v.version.len();
            total += 1;
            total_bytes += size;
            if previous.get(type_url, name).is_none_or(|p| p.version != v.version) {
                changed += 1;
                bytes += size;
            }
        }
    }
    times.sort();
    println!(
        "  {label}: build p50 {}  p99 {}; delta {changed} of {total} resources, {:.1} KiB of {:.1} KiB",
        us(percentile(&times, 0.5)),
        us(percentile(&times, 0.99)),
        bytes as f64 / 1024.0,
        total_bytes as f64 / 1024.0
    );
}

fn main() {
    let iters = env_usize("ITERS", 200);
    let services = env_usize("SERVICES", 200);
    let ca = Ca::new();

    println!("Ingress gateway, {services} HTTP services on one listener ({iters} builds per change)");
    let first = Arc::new(ingress(&ca, services));
    let mut endpoints_changed = (*first).clone();
    if let KindSnapshot::IngressGateway(g) = &mut endpoints_changed.kind {
        let up = Arc::make_mut(&mut g.upstreams)
            .get_mut(&proxycfg::handler::ingress_upstream_id(&svc(0)))
            .unwrap();
        let up = Arc::make_mut(up);
        let target = up.endpoints.keys().next().unwrap().clone();
        up.endpoints.insert(target, instances(&svc(0), 4));
    }
    measure(
        "one service's instances change",
        &first,
        &Arc::new(endpoints_changed),
        iters,
    );
    let added = Arc::new(ingress(&ca, services + 1));
    let first_plus = Arc::new(ingress(&ca, services));
    measure("one service added", &first_plus, &added, iters);

    println!("Terminating gateway, {services} linked services ({iters} builds per change)");
    let first = Arc::new(terminating(&ca, services));
    let mut endpoints_changed = (*first).clone();
    if let KindSnapshot::TerminatingGateway(g) = &mut endpoints_changed.kind {
        let s = Arc::make_mut(Arc::make_mut(&mut g.linked).get_mut(&svc(0)).unwrap());
        s.endpoints = Some(instances(&svc(0), 3));
    }
    measure(
        "one service's instances change",
        &first,
        &Arc::new(endpoints_changed),
        iters,
    );
    // One more service linked; the others keep their certificates and everything else.
    let mut added = (*first).clone();
    if let (KindSnapshot::TerminatingGateway(g), KindSnapshot::TerminatingGateway(more)) =
        (&mut added.kind, terminating(&ca, 1).kind)
    {
        let extra = svc(services);
        let mut one = (*more.linked[&svc(0)]).clone();
        one.link.service = extra.clone();
        one.leaf = Some(ca.leaf(&extra));
        let mut links = (**g.services.as_ref().unwrap()).clone();
        links.push(one.link.clone());
        g.services = Some(Arc::new(links));
        Arc::make_mut(&mut g.linked).insert(extra, Arc::new(one));
    }
    measure("one service linked", &first, &Arc::new(added), iters);
}
