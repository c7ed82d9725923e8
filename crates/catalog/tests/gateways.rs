//! Gateways in the catalog: the protocol check on writes, the services a gateway fronts, and
//! the index key and topic that follow them.
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use ::catalog::*;
use serde_json::{Value, json};
use std::time::Duration;
use structs::*;

async fn store() -> Store {
    Store::open(StoreConfig::default()).await.unwrap()
}

fn set(v: Value) -> Op {
    Op::ConfigSet {
        entry: Box::new(ConfigEntry::from_json(v).unwrap()),
        cas: None,
    }
}

fn delete(kind: ConfigEntryKind, name: &str) -> Op {
    Op::ConfigDelete {
        kind,
        name: name.into(),
        cas: None,
    }
}

fn defaults(name: &str, protocol: &str) -> Op {
    set(json!({"Kind": "service-defaults", "Name": name, "Protocol": protocol}))
}

fn register(name: &str, kind: ServiceKind) -> Op {
    let mut proxy = ConnectProxyConfig::default();
    if kind == ServiceKind::ConnectProxy {
        proxy.destination_service_name = "web".into();
    }
    Op::Register(Box::new(RegisterRequest {
        node: "n1".into(),
        address: "10.0.0.1".into(),
        service: Some(NodeService {
            kind,
            service: name.into(),
            id: name.into(),
            port: 80,
            proxy,
            ..Default::default()
        }),
        ..Default::default()
    }))
}

fn deregister(id: &str) -> Op {
    Op::Deregister(DeregisterRequest {
        node: "n1".into(),
        service_id: id.into(),
        ..Default::default()
    })
}

fn ingress_http(services: Value) -> Op {
    set(json!({"Kind": "ingress-gateway", "Name": "ing",
        "Listeners": [{"Port": 8080, "Protocol": "http", "Services": services}]}))
}

async fn refused(store: &Store, op: Op) -> String {
    match store.write(op).await {
        Err(WriteError::Invalid(e)) => e.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn an_ingress_listener_needs_services_of_its_protocol() {
    let s = store().await;
    let err = refused(&s, ingress_http(json!([{"Name": "web"}]))).await;
    assert_eq!(
        err,
        "ingress-gateway \"ing\" Listeners[0].Services[0].Name: service \"web\" has protocol tcp, which does not \
         match the listener's protocol http (set it with a service-defaults entry)"
    );
    s.write(defaults("web", "http")).await.unwrap();
    s.write(ingress_http(json!([{"Name": "web"}]))).await.unwrap();
    // Any http-family protocol fits an http listener; tcp listeners take tcp services.
    s.write(defaults("rpc", "grpc")).await.unwrap();
    s.write(ingress_http(json!([{"Name": "web"}, {"Name": "rpc"}])))
        .await
        .unwrap();
    let err = refused(
        &s,
        set(json!({"Kind": "ingress-gateway", "Name": "ing",
            "Listeners": [{"Port": 9000, "Protocol": "tcp", "Services": [{"Name": "rpc"}]}]})),
    )
    .await;
    assert!(
        err.starts_with("ingress-gateway \"ing\" Listeners[0].Services[0].Name: service \"rpc\" has protocol grpc")
    );
    // proxy-defaults decides for services without service-defaults.
    s.write(set(
        json!({"Kind": "proxy-defaults", "Name": "global", "Config": {"protocol": "http"}}),
    ))
    .await
    .unwrap();
    s.write(ingress_http(json!([{"Name": "web"}, {"Name": "other"}])))
        .await
        .unwrap();
}

#[tokio::test]
async fn defaults_cannot_break_an_ingress_listener() {
    let s = store().await;
    s.write(defaults("web", "http")).await.unwrap();
    s.write(ingress_http(json!([{"Name": "web"}]))).await.unwrap();
    let expect = "ingress-gateway \"ing\" Listeners[0].Services[0].Name: service \"web\" has protocol tcp";
    assert!(refused(&s, defaults("web", "tcp")).await.starts_with(expect));
    assert!(
        refused(&s, delete(ConfigEntryKind::ServiceDefaults, "web"))
            .await
            .starts_with(expect)
    );
    // Within the http family is fine; unrelated services are not checked.
    s.write(defaults("web", "http2")).await.unwrap();
    s.write(defaults("db", "tcp")).await.unwrap();
    // A proxy-defaults protocol breaking a listener that relies on it is refused too.
    s.write(delete(ConfigEntryKind::IngressGateway, "ing")).await.unwrap();
    s.write(set(
        json!({"Kind": "proxy-defaults", "Name": "global", "Config": {"protocol": "http"}}),
    ))
    .await
    .unwrap();
    s.write(ingress_http(json!([{"Name": "api"}]))).await.unwrap();
    let err = refused(
        &s,
        set(json!({"Kind": "proxy-defaults", "Name": "global", "Config": {}})),
    )
    .await;
    assert!(err.starts_with("ingress-gateway \"ing\" Listeners[0].Services[0].Name: service \"api\" has protocol tcp"));
    assert!(
        refused(&s, delete(ConfigEntryKind::ProxyDefaults, "global"))
            .await
            .contains("\"api\"")
    );
}

#[tokio::test]
async fn a_gateway_name_has_one_kind() {
    let s = store().await;
    s.write(set(
        json!({"Kind": "terminating-gateway", "Name": "gw", "Services": [{"Name": "db"}]}),
    ))
    .await
    .unwrap();
    let err = refused(
        &s,
        set(json!({"Kind": "ingress-gateway", "Name": "gw",
            "Listeners": [{"Port": 1, "Services": [{"Name": "db"}]}]})),
    )
    .await;
    assert_eq!(
        err,
        "ingress-gateway \"gw\" Name: \"gw\" is already a terminating-gateway: a gateway has one kind"
    );
}

fn names(list: &[GatewayService]) -> Vec<(String, u16, bool)> {
    list.iter()
        .map(|g| (g.service.clone(), g.port, g.from_wildcard))
        .collect()
}

#[tokio::test]
async fn ingress_services_expand_wildcards_by_protocol() {
    let s = store().await;
    for name in ["web", "api", "db", "consul"] {
        s.write(register(name, ServiceKind::Typical)).await.unwrap();
    }
    s.write(register("web-sidecar-proxy", ServiceKind::ConnectProxy))
        .await
        .unwrap();
    s.write(register("mgw", ServiceKind::MeshGateway)).await.unwrap();
    for name in ["web", "api", "web-sidecar-proxy", "mgw", "consul"] {
        s.write(defaults(name, "http")).await.unwrap();
    }
    s.write(set(json!({"Kind": "ingress-gateway", "Name": "ing", "Listeners": [
        {"Port": 8080, "Protocol": "http", "Services": [{"Name": "*"}, {"Name": "web", "Hosts": ["web.example"]}]},
        {"Port": 9000, "Protocol": "tcp", "Services": [{"Name": "db"}]},
    ]})))
    .await
    .unwrap();
    let got = s.read().gateway_services("ing");
    assert_eq!(
        names(&got),
        [
            ("api".into(), 8080, true),
            ("db".into(), 9000, false),
            ("web".into(), 8080, false)
        ]
    );
    let web = &got[2];
    assert_eq!(web.hosts, ["web.example"]);
    assert_eq!(web.protocol, "http");
    assert_eq!(web.gateway, "ing");
    assert_eq!(web.gateway_kind, ServiceKind::IngressGateway);
    assert!(got[0].hosts.is_empty(), "an empty Hosts stays empty");
    assert!(s.read().gateway_services("nothing").is_empty());
}

#[tokio::test]
async fn terminating_services_carry_tls_and_expand_wildcards() {
    let s = store().await;
    for name in ["billing", "legacy"] {
        s.write(register(name, ServiceKind::Typical)).await.unwrap();
    }
    s.write(register("tgw", ServiceKind::TerminatingGateway)).await.unwrap();
    s.write(set(json!({"Kind": "terminating-gateway", "Name": "tgw", "Services": [
        {"Name": "billing", "CAFile": "/ca.pem", "CertFile": "/c.pem", "KeyFile": "/k.pem", "SNI": "b.example"},
        {"Name": "*", "CAFile": "/wild.pem"},
        {"Name": "unregistered"},
    ]})))
    .await
    .unwrap();
    let got = s.read().gateway_services("tgw");
    assert_eq!(
        names(&got),
        [
            ("billing".into(), 0, false),
            ("legacy".into(), 0, true),
            ("unregistered".into(), 0, false)
        ]
    );
    assert_eq!(
        (
            got[0].ca_file.as_str(),
            got[0].cert_file.as_str(),
            got[0].key_file.as_str(),
            got[0].sni.as_str()
        ),
        ("/ca.pem", "/c.pem", "/k.pem", "b.example")
    );
    assert_eq!(got[1].ca_file, "/wild.pem");
    assert_eq!(got[1].gateway_kind, ServiceKind::TerminatingGateway);
}

#[tokio::test]
async fn the_key_and_topic_follow_the_entry_and_wildcard_services() {
    let s = store().await;
    let key = IndexKey::GatewayServices("tgw".into());
    s.write(set(
        json!({"Kind": "terminating-gateway", "Name": "tgw", "Services": [{"Name": "*"}]}),
    ))
    .await
    .unwrap();
    let mut sub = s.subscribe(Topic::GatewayServices("tgw".into()));
    let first = sub.next().await.unwrap();
    let Payload::GatewayServices(list) = &first.payload else {
        panic!()
    };
    assert!(list.is_empty());

    // A new service wakes a blocking query and the topic.
    let before = s.read().index_of(&key);
    let waiter = {
        let s = s.clone();
        let key = key.clone();
        tokio::spawn(async move {
            s.wait(&key, before, Duration::from_secs(60))
                .await
                .gateway_services("tgw")
        })
    };
    let wrote = s.write(register("legacy", ServiceKind::Typical)).await.unwrap();
    assert_eq!(names(&waiter.await.unwrap()), [("legacy".into(), 0, true)]);
    assert_eq!(s.read().index_of(&key), wrote.index);
    let next = sub.next().await.unwrap();
    let Payload::GatewayServices(list) = &next.payload else {
        panic!()
    };
    assert_eq!(names(list), [("legacy".into(), 0, true)]);

    // It goes again when the service leaves.
    s.write(deregister("legacy")).await.unwrap();
    let next = sub.next().await.unwrap();
    let Payload::GatewayServices(list) = &next.payload else {
        panic!()
    };
    assert!(list.is_empty());

    // An entry change bumps it; an unrelated entry does not.
    let at = s.read().index_of(&key);
    s.write(defaults("x", "tcp")).await.unwrap();
    s.write(set(
        json!({"Kind": "terminating-gateway", "Name": "other", "Services": [{"Name": "y"}]}),
    ))
    .await
    .unwrap();
    // (service-defaults may change what `*` means for ingress, so it bumps wildcard gateways)
    let after_defaults = s.read().index_of(&key);
    assert!(after_defaults > at);
    s.write(set(
        json!({"Kind": "terminating-gateway", "Name": "other", "Services": [{"Name": "z"}]}),
    ))
    .await
    .unwrap();
    assert_eq!(
        s.read().index_of(&key),
        after_defaults,
        "another gateway's entry leaves it alone"
    );
    let wrote = s
        .write(set(
            json!({"Kind": "terminating-gateway", "Name": "tgw", "Services": [{"Name": "db"}]}),
        ))
        .await
        .unwrap();
    assert_eq!(s.read().index_of(&key), wrote.index);

    // Deleted, its key answers with the gateway tables' index: never backwards.
    let gone = s
        .write(delete(ConfigEntryKind::TerminatingGateway, "tgw"))
        .await
        .unwrap();
    assert_eq!(s.read().index_of(&key), gone.index);
    assert!(s.read().gateway_services("tgw").is_empty());
}

/// The nodes/ids of the connect instances of `service`.
fn connect_ids(s: &Store, service: &str) -> Vec<String> {
    s.read()
        .health(service, true)
        .into_iter()
        .map(|c| c.service.id)
        .collect()
}

#[tokio::test]
async fn a_terminating_gateway_serves_the_connect_instances_of_what_it_represents() {
    let s = store().await;
    s.write(register("ext", ServiceKind::Typical)).await.unwrap();
    // Registered before its entry: nothing is linked yet.
    s.write(register("tgw", ServiceKind::TerminatingGateway)).await.unwrap();
    assert!(connect_ids(&s, "ext").is_empty());
    let key = IndexKey::ServiceConnect("ext".into());
    let mut sub = s.subscribe(Topic::ServiceHealthConnect("ext".into()));
    let _ = sub.next().await.unwrap();

    // Linking ext moves its connect instances (topic and blocking key) to the gateway's.
    let wrote = s
        .write(set(
            json!({"Kind": "terminating-gateway", "Name": "tgw", "Services": [{"Name": "ext"}]}),
        ))
        .await
        .unwrap();
    assert_eq!(connect_ids(&s, "ext"), ["tgw"]);
    assert_eq!(s.read().index_of(&key), wrote.index);
    let Payload::Health(now) = &sub.next().await.unwrap().payload else {
        panic!()
    };
    assert_eq!(now.len(), 1);
    // The gateway's health is the instances' health: its check changes ext's connect view.
    let wrote = s
        .write(Op::Register(Box::new(RegisterRequest {
            node: "n1".into(),
            address: "10.0.0.1".into(),
            check: Some(HealthCheck {
                check_id: "tgw-alive".into(),
                name: "alive".into(),
                service_id: "tgw".into(),
                status: HealthStatus::Critical,
                ..Default::default()
            }),
            skip_node_update: true,
            ..Default::default()
        })))
        .await
        .unwrap();
    assert_eq!(s.read().index_of(&key), wrote.index);
    let Payload::Health(now) = &sub.next().await.unwrap().payload else {
        panic!()
    };
    assert_eq!(now[0].checks.len(), 1);

    // Unlinked (here: the entry names another service), ext has no connect instance again.
    let wrote = s
        .write(set(
            json!({"Kind": "terminating-gateway", "Name": "tgw", "Services": [{"Name": "other"}]}),
        ))
        .await
        .unwrap();
    assert!(connect_ids(&s, "ext").is_empty());
    assert_eq!(s.read().index_of(&key), wrote.index);
    let Payload::Health(now) = &sub.next().await.unwrap().payload else {
        panic!()
    };
    assert!(now.is_empty());
    assert_eq!(connect_ids(&s, "other"), ["tgw"]);
    // A `*` link covers services registered later.
    s.write(set(
        json!({"Kind": "terminating-gateway", "Name": "tgw", "Services": [{"Name": "*"}]}),
    ))
    .await
    .unwrap();
    s.write(register("late", ServiceKind::Typical)).await.unwrap();
    assert_eq!(connect_ids(&s, "late"), ["tgw"]);
}

/// A service a terminating gateway links gets a virtual IP (by name as the entry is written,
/// even before it registers; by `*`, every service then and each registered later), and the
/// gateway's instances, read as the service's connect instances, carry it.
#[tokio::test]
async fn linked_services_get_virtual_ips_on_the_gateway_instances() {
    let s = store().await;
    s.write(register("ext", ServiceKind::Typical)).await.unwrap();
    s.write(register("tgw", ServiceKind::TerminatingGateway)).await.unwrap();
    assert_eq!(s.read().virtual_ip("ext"), None, "not linked: no address");
    let vips_before = s.read().index_of(&IndexKey::VirtualIps);
    s.write(set(json!({"Kind": "service-defaults", "Name": "outside",
        "Destination": {"Addresses": ["192.0.2.10"], "Port": 443}})))
        .await
        .unwrap();
    s.write(set(json!({"Kind": "terminating-gateway", "Name": "tgw",
        "Services": [{"Name": "ext"}, {"Name": "later"}, {"Name": "outside"}]})))
        .await
        .unwrap();
    let state = s.read();
    assert_eq!(
        state.virtual_ip("outside"),
        None,
        "a destination is matched on its own addresses"
    );
    let ext = state.virtual_ip("ext").expect("linked: an address").to_string();
    assert!(
        state.index_of(&IndexKey::VirtualIps) > vips_before,
        "the list of virtual IPs wakes"
    );
    assert!(
        state.virtual_ip("later").is_some(),
        "linked by name before it registers"
    );
    let through = state.health("ext", true);
    assert_eq!(through.len(), 1);
    assert_eq!(through[0].service.kind, ServiceKind::TerminatingGateway);
    assert_eq!(
        through[0].service.tagged_addresses[virtual_ips::TAGGED_ADDRESS].address,
        ext
    );
    // The gateway's own listing is its own: no linked service's address.
    assert!(state.health("tgw", false)[0].service.tagged_addresses.is_empty());
    // The catalog's listings (`/v1/catalog/...`) show it alike.
    let (_, gateway) = state.service_instances("tgw").remove(0);
    let listed = virtual_ips::as_listed(&state, "ext", std::sync::Arc::clone(&gateway));
    assert_eq!(listed.tagged_addresses[virtual_ips::TAGGED_ADDRESS].address, ext);
    assert!(
        virtual_ips::as_listed(&state, "tgw", gateway)
            .tagged_addresses
            .is_empty()
    );

    // By `*`: the services there are now, and one registered afterwards.
    s.write(register("db", ServiceKind::Typical)).await.unwrap();
    assert_eq!(s.read().virtual_ip("db"), None);
    s.write(set(
        json!({"Kind": "terminating-gateway", "Name": "tgw", "Services": [{"Name": "*"}]}),
    ))
    .await
    .unwrap();
    assert!(s.read().virtual_ip("db").is_some());
    s.write(register("cache", ServiceKind::Typical)).await.unwrap();
    assert!(s.read().virtual_ip("cache").is_some());
    assert_eq!(s.read().virtual_ip("ext").unwrap().to_string(), ext, "kept");
}
