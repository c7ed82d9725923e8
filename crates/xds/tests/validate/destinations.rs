//! Destinations outside the mesh (service-defaults `Destination`): a transparent sidecar's
//! chains and clusters to the terminating gateway, and the gateway's chains and clusters to
//! the addresses. Goldens, accepted by `envoy --mode validate`.

use super::*;
use envoy_types::pb::envoy::config::listener::v3::FilterChainMatch;
use proxycfg::DestinationUpstream;
use structs::config_entry::DestinationConfig;

fn destination(addresses: &[&str], port: u16, protocol: &str, gateways: &[&str]) -> Arc<DestinationUpstream> {
    Arc::new(DestinationUpstream {
        destination: DestinationConfig {
            addresses: addresses.iter().map(|a| (*a).to_owned()).collect(),
            port,
        },
        protocol: protocol.parse().unwrap(),
        gateways: gateways.iter().map(|g| (*g).to_owned()).collect(),
    })
}

/// `web`'s transparent sidecar may reach three destinations through the gateway `tgw`:
/// `ext-ip` (TCP, an IP), `ext-host` (TCP, a host name: matched on the TLS SNI) and
/// `ext-http` (HTTP, two IPs on port 80: one chain routed by host).
fn sidecar_with_destinations(ca: &Ca, mesh_destinations_only: bool) -> ConfigSnapshot {
    let mut snap = transparent_snapshot(ca, mesh_destinations_only);
    let KindSnapshot::ConnectProxy(cp) = &mut snap.kind else {
        unreachable!()
    };
    cp.destinations = Arc::new(BTreeMap::from([
        (
            "ext-host".to_owned(),
            destination(&["api.example.com"], 443, "tcp", &["tgw"]),
        ),
        (
            "ext-http".to_owned(),
            destination(&["192.0.2.20", "192.0.2.21"], 80, "http", &["tgw"]),
        ),
        ("ext-ip".to_owned(), destination(&["192.0.2.10"], 443, "tcp", &["tgw"])),
    ]));
    let mut gateway = instance("tgw", "10.0.0.9", 8443);
    gateway.service.kind = structs::ServiceKind::TerminatingGateway;
    gateway.service.service = "tgw".into();
    cp.destination_gateways = Arc::new(BTreeMap::from([("tgw".to_owned(), Arc::new(vec![gateway]))]));
    snap
}

/// A cluster's upstream TLS context, printed.
fn tls_of(cluster: &Cluster) -> String {
    let Some(TransportSocket {
        config_type: Some(transport_socket::ConfigType::TypedConfig(cfg)),
        ..
    }) = &cluster.transport_socket
    else {
        return String::new();
    };
    format!("{:?}", unpack::<UpstreamTlsContext>(cfg))
}

fn matches_of(l: &Listener) -> Vec<FilterChainMatch> {
    l.filter_chains
        .iter()
        .map(|c| c.filter_chain_match.clone().unwrap_or_default())
        .collect()
}

#[test]
fn transparent_sidecar_reaches_destinations_through_the_gateway() {
    let ca = Ca::new();
    let roots = ca.roots();
    let r = validate_snapshot("transparent-destinations", &sidecar_with_destinations(&ca, true));
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    let outbound: Listener = unpack(&r.of(LISTENER).unwrap()["outbound_listener:127.0.0.1:15001"]);
    let filters: Vec<&str> = outbound.listener_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        filters,
        [
            "envoy.filters.listener.original_dst",
            "envoy.filters.listener.tls_inspector"
        ]
    );
    let name = |address: &str, service: &str| {
        format!(
            "destination.{address}.{service}.default.dc1.internal.{}",
            roots.trust_domain
        )
    };
    let destination_chains: Vec<(Vec<String>, Vec<String>, u32)> = matches_of(&outbound)
        .into_iter()
        .filter_map(|m| {
            let port = m.destination_port?.value;
            let ips = m.prefix_ranges.iter().map(|p| p.address_prefix.clone()).collect();
            Some((ips, m.server_names, port))
        })
        .collect();
    assert_eq!(
        destination_chains,
        [
            (vec![], vec!["api.example.com".to_owned()], 443),
            (vec!["192.0.2.10".to_owned()], vec![], 443),
            (vec!["192.0.2.20".to_owned(), "192.0.2.21".to_owned()], vec![], 80),
        ]
    );
    let clusters = r.of(CLUSTER).unwrap();
    for (address, service) in [
        ("api-example-com", "ext-host"),
        ("192-0-2-10", "ext-ip"),
        ("192-0-2-20", "ext-http"),
        ("192-0-2-21", "ext-http"),
    ] {
        let cluster: Cluster = unpack(&clusters[&name(address, service)]);
        // mTLS to the gateway, which answers as the destination service.
        let tls = tls_of(&cluster);
        assert!(tls.contains(&format!("/svc/{service}")), "{tls}");
        let endpoints: ClusterLoadAssignment = unpack(&r.of(ENDPOINT).unwrap()[&name(address, service)]);
        assert!(format!("{endpoints:?}").contains("10.0.0.9"), "{endpoints:?}");
    }
}

/// A destination no gateway links, and one whose gateways have no healthy instance: each is
/// named in the proxy's status (its chain still closes connections to it).
#[test]
fn unreachable_destinations_are_reported() {
    let ca = Ca::new();
    let mut snap = sidecar_with_destinations(&ca, false);
    let KindSnapshot::ConnectProxy(cp) = &mut snap.kind else {
        unreachable!()
    };
    let destinations = Arc::make_mut(&mut cp.destinations);
    destinations.insert("lonely".into(), destination(&["192.0.2.99"], 5432, "tcp", &[]));
    destinations.insert("down".into(), destination(&["192.0.2.98"], 5432, "tcp", &["tgw-down"]));
    destinations.insert("twin".into(), destination(&["192.0.2.10"], 443, "tcp", &["tgw"]));
    Arc::make_mut(&mut cp.destination_gateways).insert("tgw-down".into(), Arc::new(vec![]));
    let r = resources::build(&snap).unwrap();
    assert!(
        r.problems[":outbound destination:lonely"].contains("no terminating-gateway config entry links it"),
        "{:?}",
        r.problems
    );
    assert!(
        r.problems[":outbound destination:down"].contains("no healthy instance"),
        "{:?}",
        r.problems
    );
    assert!(
        r.problems[":outbound destination:twin"].contains("already destination \"ext-ip\""),
        "{:?}",
        r.problems
    );
    if let Err(e) = envoy_validate("transparent-destinations-problems", &static_bootstrap(&r)) {
        panic!("envoy rejected the sidecar with unreachable destinations:\n{e}");
    }
}

/// A terminating gateway linking two destinations: `ext-ip` (TCP, an IP: a static cluster)
/// and `ext-web` (HTTP, a host name: resolved by DNS, TLS originated with the link's CA and
/// the host name as SNI), each matched on its destination name and guarded by intentions.
#[test]
fn terminating_gateway_proxies_to_destinations() {
    use structs::ServiceKind::TerminatingGateway as Kind;
    let ca = Ca::new();
    let roots = ca.roots();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ext-ca.pem");
    std::fs::write(&ca_file, &roots.roots[0].root_cert).unwrap();
    let ip = link("tgw", Kind, "ext-ip", 0, "");
    let mut web = link("tgw", Kind, "ext-web", 0, "");
    web.ca_file = ca_file.display().to_string();
    let mut linked = BTreeMap::new();
    for (l, protocol, addresses, port) in [
        (&ip, "tcp", vec!["192.0.2.10"], 443),
        (&web, "http", vec!["web.example.com", "192.0.2.30"], 443),
    ] {
        let mut resolved = structs::ResolvedServiceConfig::default();
        resolved
            .proxy_config
            .insert("protocol".into(), serde_json::Value::String(protocol.into()));
        resolved.destination = Some(DestinationConfig {
            addresses: addresses.into_iter().map(str::to_owned).collect(),
            port,
        });
        let mut s = proxycfg::LinkedServiceSnapshot::new(l.clone());
        s.leaf = Some(ca.leaf(&l.service));
        s.intentions = Some(Arc::new(
            vec![intention("web", Some(IntentionAction::Allow), vec![])]
                .into_iter()
                .map(|mut i| {
                    i.destination_name = l.service.clone();
                    i
                })
                .collect(),
        ));
        s.config = Some(Arc::new(resolved));
        s.endpoints = Some(Arc::new(vec![]));
        s.resolver = Some(None);
        linked.insert(l.service.clone(), Arc::new(s));
    }
    let part = KindSnapshot::TerminatingGateway(proxycfg::TerminatingGatewaySnapshot {
        mesh_config: Some(None),
        services: Some(Arc::new(vec![ip, web])),
        linked: Arc::new(linked),
    });
    let mut snap = gateway_snapshot(&ca, Kind, "tgw", part);
    snap.intention_default_allow = false;
    let r = resources::build(&snap).unwrap();
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    let name = |address: &str, service: &str| {
        format!(
            "destination.{address}.{service}.default.dc1.internal.{}",
            roots.trust_domain
        )
    };
    let listener: Listener = unpack(&r.of(LISTENER).unwrap()["default:127.0.0.1:8443"]);
    let names: Vec<Vec<String>> = matches_of(&listener).into_iter().map(|m| m.server_names).collect();
    assert_eq!(
        names,
        [
            vec![name("192-0-2-10", "ext-ip")],
            vec![name("web-example-com", "ext-web")],
            vec![name("192-0-2-30", "ext-web")],
            vec![],
        ]
    );
    let clusters = r.of(CLUSTER).unwrap();
    let kind_of = |n: &str| unpack::<Cluster>(&clusters[n]).cluster_discovery_type;
    let kind = |k: cluster::DiscoveryType| Some(cluster::ClusterDiscoveryType::Type(k as i32));
    assert_eq!(
        kind_of(&name("192-0-2-10", "ext-ip")),
        kind(cluster::DiscoveryType::Static)
    );
    assert_eq!(
        kind_of(&name("web-example-com", "ext-web")),
        kind(cluster::DiscoveryType::LogicalDns)
    );
    let web_tls = tls_of(&unpack::<Cluster>(&clusters[&name("web-example-com", "ext-web")]));
    assert!(
        web_tls.contains("web.example.com"),
        "SNI and SAN from the host name: {web_tls}"
    );
    let text = golden_text(&r, &roots.trust_domain).replace(&dir.path().display().to_string(), "<dir>");
    insta::assert_snapshot!("gateway-terminating-destinations", text);
    if let Err(e) = envoy_validate("gateway-terminating-destinations", &static_bootstrap(&r)) {
        panic!("envoy rejected the terminating gateway with destinations:\n{e}");
    }
}
