//! Gateway handlers over fake data sources: what each kind watches, how a change of its
//! services starts and cancels watches, and when its snapshot is valid (paused tokio time).
#![allow(clippy::unwrap_used)]

use crate::common::*;
use proxycfg::data_sources::*;
use proxycfg::*;
use std::sync::Arc;
use structs::*;

fn gateway(kind: ServiceKind, name: &str) -> ProxyRegistration {
    ProxyRegistration {
        id: ProxyId::new("node-1", name),
        service: Arc::new(NodeService {
            kind,
            id: name.into(),
            service: name.into(),
            port: 8443,
            ..Default::default()
        }),
        token: None,
    }
}

fn services_req(gateway: &str) -> GatewayServicesRequest {
    GatewayServicesRequest {
        datacenter: "dc1".into(),
        gateway: gateway.into(),
    }
}

fn link(kind: ServiceKind, service: &str, port: u16, protocol: &str) -> GatewayService {
    GatewayService {
        gateway: "gw".into(),
        service: service.into(),
        gateway_kind: kind,
        port,
        protocol: protocol.into(),
        ..Default::default()
    }
}

fn ingress_entry(tls: bool) -> Arc<ConfigEntry> {
    Arc::new(
        ConfigEntry::from_json(serde_json::json!({
            "Kind": "ingress-gateway", "Name": "gw", "TLS": {"Enabled": tls},
            "Listeners": [{"Port": 8080, "Protocol": "http", "Services": [{"Name": "api", "Hosts": ["api.example.com"]}, {"Name": "web"}]}],
        }))
        .unwrap(),
    )
}

#[tokio::test(start_paused = true)]
async fn an_ingress_gateway_follows_its_services_chains_and_certificate_names() {
    let f = fixture();
    let reg = gateway(ServiceKind::IngressGateway, "gw");
    let entry_req = ConfigEntryRequest {
        kind: ConfigEntryKind::IngressGateway,
        name: "gw".into(),
    };
    f.fakes.config_entry.set(&entry_req, Some(ingress_entry(false)));
    let mut api = link(ServiceKind::IngressGateway, "api", 8080, "http");
    api.hosts = vec!["api.example.com".into()];
    let web = link(ServiceKind::IngressGateway, "web", 8080, "http");
    f.fakes
        .gateway_services
        .set(&services_req("gw"), Arc::new(vec![api.clone(), web.clone()]));
    let mut w = register_and_watch(&f, &reg).await;
    let snap = next_snapshot(&mut w).await;
    let g = snap.ingress_gateway().unwrap();
    assert_eq!(g.services.as_ref().unwrap().len(), 2);
    settle().await;
    // Each service's chain is compiled with its listener's protocol.
    let chains = f.fakes.discovery_chain.watched_requests();
    let mut names: Vec<(&str, Option<Protocol>)> =
        chains.iter().map(|r| (r.name.as_str(), r.override_protocol)).collect();
    names.sort();
    assert_eq!(names, [("api", Some(Protocol::Http)), ("web", Some(Protocol::Http))]);
    // Without TLS the leaf carries no extra names.
    assert_eq!(f.fakes.leaf.watched_requests()[0].dns_sans, Vec::<String>::new());

    // TLS on: the leaf is asked again with the hosts it serves.
    f.fakes.config_entry.set(&entry_req, Some(ingress_entry(true)));
    settle().await;
    let leaf = f.fakes.leaf.watched_requests();
    assert_eq!(leaf.len(), 1, "one leaf watch, restarted");
    assert_eq!(
        leaf[0].dns_sans,
        ["api.example.com", "web.ingress.consul", "web.ingress.dc1.consul"]
    );

    // web is no longer exposed: its chain and target watches go, api's stay.
    let api_chain_starts = f.fakes.discovery_chain.started();
    f.fakes.gateway_services.set(&services_req("gw"), Arc::new(vec![api]));
    let snap = loop {
        let s = next_snapshot(&mut w).await;
        if s.ingress_gateway().unwrap().upstreams.len() == 1 {
            break s;
        }
    };
    settle().await;
    let g = snap.ingress_gateway().unwrap();
    assert!(g.upstreams.keys().all(|u| u.name == "api"));
    assert_eq!(f.fakes.discovery_chain.active(), 1);
    assert_eq!(
        f.fakes.discovery_chain.started(),
        api_chain_starts,
        "api's chain was not restarted"
    );
    assert!(f.fakes.health.watched_requests().iter().all(|r| r.service == "api"));

    // Deregistration leaves nothing running.
    assert!(f.manager.deregister(&reg.id, ProxySource::Local).await);
    assert_eq!(f.fakes.active(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_terminating_gateway_acts_for_each_linked_service() {
    let f = fixture();
    let reg = gateway(ServiceKind::TerminatingGateway, "gw");
    let mut ext = link(ServiceKind::TerminatingGateway, "ext", 0, "");
    ext.ca_file = "/etc/ext/ca.pem".into();
    let billing = link(ServiceKind::TerminatingGateway, "billing", 0, "");
    f.fakes
        .gateway_services
        .set(&services_req("gw"), Arc::new(vec![ext.clone(), billing.clone()]));
    let mut w = register_and_watch(&f, &reg).await;
    let snap = loop {
        let s = next_snapshot(&mut w).await;
        let g = s.terminating_gateway().unwrap();
        if g.linked.len() == 2 && g.linked.values().all(|l| l.is_ready()) {
            break s;
        }
    };
    let g = snap.terminating_gateway().unwrap();
    assert_eq!(g.linked["ext"].link.ca_file, "/etc/ext/ca.pem");
    settle().await;
    // Per service: its leaf (the gateway presents it), intentions to it, its config and its
    // own (non-connect) instances.
    let mut leaves: Vec<String> = f.fakes.leaf.watched_requests().into_iter().map(|r| r.service).collect();
    leaves.sort();
    assert_eq!(leaves, ["billing", "ext"]);
    let health = f.fakes.health.watched_requests();
    assert!(health.iter().all(|r| !r.connect), "{health:?}");
    assert_eq!(f.fakes.intentions.active(), 2);
    assert_eq!(f.fakes.resolved_service_config.active(), 2);

    // A changed link (new CA file) is applied without restarting the service's watches.
    let started = f.fakes.leaf.started();
    ext.ca_file = "/etc/ext/other-ca.pem".into();
    f.fakes
        .gateway_services
        .set(&services_req("gw"), Arc::new(vec![ext.clone(), billing]));
    let snap = loop {
        let s = next_snapshot(&mut w).await;
        if s.terminating_gateway().unwrap().linked["ext"]
            .link
            .ca_file
            .ends_with("other-ca.pem")
        {
            break s;
        }
    };
    assert!(snap.terminating_gateway().unwrap().linked["ext"].is_ready());
    assert_eq!(f.fakes.leaf.started(), started);

    // billing unlinked: its four watches go.
    f.fakes.gateway_services.set(&services_req("gw"), Arc::new(vec![ext]));
    loop {
        let s = next_snapshot(&mut w).await;
        if s.terminating_gateway().unwrap().linked.len() == 1 {
            break;
        }
    }
    settle().await;
    assert_eq!(f.fakes.leaf.active(), 1);
    assert_eq!(f.fakes.health.active(), 1);
    assert!(f.manager.deregister(&reg.id, ProxySource::Local).await);
    assert_eq!(f.fakes.active(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_mesh_gateway_follows_the_connect_instances_of_every_service() {
    let f = fixture();
    let reg = gateway(ServiceKind::MeshGateway, "mesh-gateway");
    let list_req = ServiceListRequest {
        datacenter: "dc1".into(),
        typical_only: true,
    };
    let resolvers = ConfigEntryListRequest::shared(ConfigEntryKind::ServiceResolver);
    f.fakes.service_list.set(
        &list_req,
        ServiceNames(Arc::new(vec!["api".into(), "db".into(), "web".into()])),
    );
    f.fakes.config_entry_list.set(&resolvers, Arc::new(Vec::new()));
    f.fakes
        .health
        .set(&health_req("api", "dc1"), Arc::new(vec![instance("api", "10.0.0.1")]));
    f.fakes
        .health
        .set(&health_req("web", "dc1"), Arc::new(vec![instance("web", "10.0.0.2")]));
    let mut w = register_and_watch(&f, &reg).await;
    // db has no connect instance: no group of its own.
    let snap = loop {
        let s = next_snapshot(&mut w).await;
        if s.mesh_gateway().unwrap().groups.len() == 2 {
            break s;
        }
    };
    assert!(snap.is_valid());
    let g = snap.mesh_gateway().unwrap();
    assert_eq!(g.groups.keys().collect::<Vec<_>>(), ["api", "web"]);
    settle().await;
    // Connect instances (sidecars), healthy ones, with the gateway's token; one watch each.
    let health = f.fakes.health.watched_requests();
    assert_eq!(health.len(), 3, "{health:?}");
    assert!(health.iter().all(|r| r.connect && r.healthy_only), "{health:?}");
    // No certificate: the gateway terminates nothing.
    assert_eq!(f.fakes.leaf.active(), 0);

    // web's instances go: its group goes. api leaves the list: its watch goes too.
    f.fakes.health.set(&health_req("web", "dc1"), Arc::new(Vec::new()));
    f.fakes
        .service_list
        .set(&list_req, ServiceNames(Arc::new(vec!["db".into(), "web".into()])));
    loop {
        let s = next_snapshot(&mut w).await;
        if s.mesh_gateway().unwrap().groups.is_empty() {
            break;
        }
    }
    settle().await;
    assert_eq!(f.fakes.health.active(), 2);
    assert!(f.fakes.health.watched_requests().iter().all(|r| r.service != "api"));
    assert!(f.manager.deregister(&reg.id, ProxySource::Local).await);
    assert_eq!(f.fakes.active(), 0);
}
