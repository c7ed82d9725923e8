//! Two clusters (two catalogs, each with its peering service on a gRPC port) peer: a token,
//! an establish, the stream, exports both ways, a reconnect that resends nothing unchanged,
//! deletes on either side.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use catalog::{Op, Store, StoreConfig};
use peering::{Context, Peerings, Tracker};
use std::sync::Arc;
use std::time::Duration;
use structs::peering::{EstablishRequest, GenerateTokenRequest, PeeringState};
use structs::{ConfigEntry, HealthCheck, HealthStatus, NodeService, RegisterRequest, ServiceKind};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

struct Cluster {
    store: Store,
    peerings: Arc<Peerings>,
    tracker: Arc<Tracker>,
    stop: CancellationToken,
    address: String,
}

async fn cluster(dc: &str) -> Cluster {
    let store = Store::open(StoreConfig {
        datacenter: dc.into(),
        ..StoreConfig::default()
    })
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let tracker = Tracker::new();
    let stop = CancellationToken::new();
    let advertised = address.clone();
    let ctx = Context {
        store: store.clone(),
        datacenter: dc.into(),
        tracker: Arc::clone(&tracker),
        addresses: Arc::new(move || vec![advertised.clone()]),
        addresses_changed: None,
    };
    let peerings = Peerings::new(ctx, stop.clone());
    let service = peerings.grpc_service();
    let serve_stop = stop.clone();
    let incoming = tls_incoming(listener, Arc::clone(&peerings));
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, serve_stop.cancelled_owned())
            .await
    });
    let (_lead, leading) = watch::channel(true);
    tokio::spawn({
        let peerings = Arc::clone(&peerings);
        async move {
            let _lead = _lead;
            peerings.run(leading).await;
        }
    });
    Cluster {
        store,
        peerings,
        tracker,
        stop,
        address,
    }
}

/// The peering service's TLS, as a server's gRPC TLS listener serves it: the certificate
/// for the name the client asks for (a handshake for any other name fails).
fn tls_incoming(
    listener: tokio::net::TcpListener,
    peerings: Arc<Peerings>,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (tx, peerings) = (tx.clone(), Arc::clone(&peerings));
            tokio::spawn(async move {
                let acceptor = rustls::server::Acceptor::default();
                let Ok(start) = tokio_rustls::LazyConfigAcceptor::new(acceptor, tcp).await else {
                    return;
                };
                let name = start.client_hello().server_name().map(str::to_owned);
                let Some(config) = name.and_then(|n| peerings.tls_config_for(&n)) else {
                    return;
                };
                if let Ok(stream) = start.into_stream(config).await {
                    let _ = tx.send(Ok(stream)).await;
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

async fn register(store: &Store, node: &str, address: &str, service: NodeService, status: HealthStatus) {
    let id = service.id.clone();
    store
        .write(Op::Register(Box::new(RegisterRequest {
            node: node.into(),
            address: address.into(),
            service: Some(service),
            checks: vec![HealthCheck {
                node: node.into(),
                check_id: format!("{id}-check"),
                name: "check".into(),
                status,
                service_id: id,
                ..HealthCheck::default()
            }],
            ..RegisterRequest::default()
        })))
        .await
        .unwrap();
}

fn typical(name: &str, port: u16) -> NodeService {
    NodeService {
        id: name.into(),
        service: name.into(),
        port,
        ..NodeService::default()
    }
}

async fn export(store: &Store, json: serde_json::Value) {
    store
        .write(Op::ConfigSet {
            entry: Box::new(ConfigEntry::from_json(json).unwrap()),
            cas: None,
        })
        .await
        .unwrap();
}

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..400 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn peer(a: &Cluster, b: &Cluster) {
    let token = a
        .peerings
        .generate_token(&GenerateTokenRequest {
            peer_name: "cluster-b".into(),
            ..GenerateTokenRequest::default()
        })
        .await
        .unwrap();
    b.peerings
        .establish(&EstablishRequest {
            peer_name: "cluster-a".into(),
            peering_token: token.clone(),
            ..EstablishRequest::default()
        })
        .await
        .unwrap();
    // The token's secret is spent.
    let err = b
        .peerings
        .establish(&EstablishRequest {
            peer_name: "again".into(),
            peering_token: token,
            ..EstablishRequest::default()
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("already established") || err.contains("refused"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_flow_both_ways_and_deletes_end_them() {
    let a = cluster("dc1").await;
    let b = cluster("dc2").await;
    register(&a.store, "a1", "10.0.1.1", typical("api", 8080), HealthStatus::Passing).await;
    register(
        &a.store,
        "a1",
        "10.0.1.1",
        NodeService {
            kind: ServiceKind::MeshGateway,
            id: "mgw".into(),
            service: "mesh-gateway".into(),
            port: 8443,
            tagged_addresses: [(
                "wan".to_owned(),
                structs::service::ServiceAddress {
                    address: "198.51.100.1".into(),
                    port: 443,
                },
            )]
            .into(),
            ..NodeService::default()
        },
        HealthStatus::Passing,
    )
    .await;
    register(&b.store, "b1", "10.0.2.1", typical("web", 9090), HealthStatus::Passing).await;
    export(
        &a.store,
        serde_json::json!({"Kind": "exported-services", "Name": "default",
        "Services": [{"Name": "api", "Consumers": [{"Peer": "cluster-b"}]}]}),
    )
    .await;
    export(
        &b.store,
        serde_json::json!({"Kind": "exported-services", "Name": "default",
        "Services": [{"Name": "web", "Consumers": [{"Peer": "cluster-a"}]}]}),
    )
    .await;
    peer(&a, &b).await;

    // The gateways come once for every service, kept with the peering; a proxy's view
    // of the service holds them.
    eventually("api imported in B, with A's gateways", || {
        let upstream = b.store.read().peered_upstream("cluster-a", "api");
        upstream.service.is_some_and(|s| !s.mesh_gateways.is_empty())
    })
    .await;
    assert!(
        b.store
            .read()
            .imported("cluster-a", "api")
            .unwrap()
            .mesh_gateways
            .is_empty()
    );
    let api = b.store.read().peered_upstream("cluster-a", "api").service.unwrap();
    assert_eq!(api.mesh_gateways[0].service.peer_name, "cluster-a");
    assert_eq!(api.instances.len(), 1);
    assert_eq!(api.instances[0].service.peer_name, "cluster-a");
    assert_eq!(api.instances[0].node.address, "10.0.1.1");
    assert_eq!(api.mesh_gateways.len(), 1);
    assert_eq!(
        api.mesh_gateways[0].service.address, "198.51.100.1",
        "at its WAN address"
    );
    let a_td = a.store.read().ca_roots().trust_domain;
    assert_eq!(api.sni, format!("api.default.default.cluster-b.external.{a_td}"));
    assert_eq!(api.spiffe_ids, [format!("spiffe://{a_td}/ns/default/dc/dc1/svc/api")]);
    eventually("web imported in A", || {
        a.store.read().imported("cluster-b", "web").is_some()
    })
    .await;
    eventually("trust bundles", || {
        b.store.read().peer_trust_bundles().len() == 1 && a.store.read().peer_trust_bundles().len() == 1
    })
    .await;
    assert_eq!(b.store.read().peer_trust_bundles()[0].trust_domain, a_td);
    let shown = |c: &Cluster, name: &str| {
        let state = c.store.read();
        let p = state.peering(name).unwrap().peering.clone();
        c.peerings.shown(&state, p)
    };
    eventually("both active", || {
        shown(&a, "cluster-b").state == PeeringState::Active && shown(&b, "cluster-a").state == PeeringState::Active
    })
    .await;
    assert_eq!(shown(&b, "cluster-a").stream_status.imported_services, ["api"]);
    assert_eq!(shown(&a, "cluster-b").stream_status.exported_services, ["api"]);

    // A health change in A reaches B.
    register(&a.store, "a1", "10.0.1.1", typical("api", 8080), HealthStatus::Critical).await;
    eventually("api critical in B", || {
        b.store.read().imported_health("cluster-a", "api")[0].checks[0].status == HealthStatus::Critical
    })
    .await;

    // A stops exporting api: B drops it.
    export(
        &a.store,
        serde_json::json!({"Kind": "exported-services", "Name": "default", "Services": []}),
    )
    .await;
    eventually("api gone from B", || {
        b.store.read().imported("cluster-a", "api").is_none()
    })
    .await;

    // A deletes the peering: B is terminated, its imports gone; A's peering is removed.
    a.peerings.delete("cluster-b").await.unwrap();
    eventually("B terminated", || {
        b.store.read().peering("cluster-a").unwrap().peering.state == PeeringState::Terminated
    })
    .await;
    eventually("A removed", || a.store.read().peering("cluster-b").is_none()).await;
    assert_eq!(a.store.read().imported_services("cluster-b").count(), 0);
    assert!(b.store.read().peer_trust_bundles().is_empty());
    assert!(!b.tracker.is_connected("cluster-a"));
    a.stop.cancel();
    b.stop.cancel();
    let _ = (&a.address, &b.address);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_export_arrives_whole_and_a_delete_on_the_dialing_side_reaches_the_acceptor() {
    let a = cluster("dc1").await;
    let b = cluster("dc1").await;
    for i in 0..250 {
        register(
            &a.store,
            &format!("n{}", i % 10),
            "10.0.1.1",
            typical(&format!("svc-{i}"), 8080),
            HealthStatus::Passing,
        )
        .await;
    }
    export(
        &a.store,
        serde_json::json!({"Kind": "exported-services", "Name": "default",
        "Services": [{"Name": "*", "Consumers": [{"Peer": "cluster-b"}]}]}),
    )
    .await;
    peer(&a, &b).await;
    eventually("250 services in B (three updates)", || {
        b.store.read().imported_services("cluster-a").count() == 250
    })
    .await;
    // B (the dialing side) deletes: A hears it and is terminated; B's peering goes.
    b.peerings.delete("cluster-a").await.unwrap();
    eventually("A terminated", || {
        a.store.read().peering("cluster-b").unwrap().peering.state == PeeringState::Terminated
    })
    .await;
    eventually("B removed", || b.store.read().peering("cluster-a").is_none()).await;
    assert_eq!(b.store.read().imported_services("cluster-a").count(), 0);
    a.stop.cancel();
    b.stop.cancel();
}

/// The peering calls run over TLS verified with the token's CA and server name: a token
/// whose CA is not the acceptor's (an impostor on the path presents what it can) is refused
/// before any secret is sent, and the acceptor serves its certificate only for its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peering_calls_verify_the_acceptors_certificate_with_the_tokens_ca() {
    let a = cluster("dc1").await;
    let b = cluster("dc2").await;
    let c = cluster("dc3").await;
    let token = a
        .peerings
        .generate_token(&GenerateTokenRequest {
            peer_name: "cluster-b".into(),
            ..GenerateTokenRequest::default()
        })
        .await
        .unwrap();
    let decoded = structs::peering::PeeringToken::decode(&token).unwrap();
    let a_roots = a.store.read().ca_roots();
    assert_eq!(
        decoded.ca,
        vec![a_roots.roots[0].root_cert.clone()],
        "the token carries A's roots"
    );
    assert_eq!(decoded.server_name, a.peerings.server_name());
    assert!(a.peerings.tls_config_for(&decoded.server_name).is_some());
    assert!(a.peerings.tls_config_for("server.dc9.peering.other.consul").is_none());
    assert!(a.peerings.tls_config_for(&c.peerings.server_name()).is_none());

    // Another CA's roots: A's certificate does not verify; nothing is established.
    let forged = structs::peering::PeeringToken {
        ca: vec![c.store.read().ca_roots().roots[0].root_cert.clone()],
        ..decoded.clone()
    };
    let err = b
        .peerings
        .establish(&EstablishRequest {
            peer_name: "cluster-a".into(),
            peering_token: forged.encode(),
            ..EstablishRequest::default()
        })
        .await
        .expect_err("A's certificate is not signed by C's CA");
    assert!(err.to_string().contains("certificate"), "{err}");
    assert!(b.store.read().peering("cluster-a").is_none());
    // Another name than A's: refused alike.
    let renamed = structs::peering::PeeringToken {
        server_name: c.peerings.server_name(),
        ..decoded.clone()
    };
    let err = b
        .peerings
        .establish(&EstablishRequest {
            peer_name: "cluster-a".into(),
            peering_token: renamed.encode(),
            ..EstablishRequest::default()
        })
        .await
        .expect_err("A serves no certificate for C's name");
    assert!(b.store.read().peering("cluster-a").is_none(), "{err}");
    // The genuine token still works: its secret was never sent.
    b.peerings
        .establish(&EstablishRequest {
            peer_name: "cluster-a".into(),
            peering_token: token,
            ..EstablishRequest::default()
        })
        .await
        .unwrap();
    eventually("B connected to A", || b.tracker.is_connected("cluster-a")).await;
    for cluster in [a, b, c] {
        cluster.stop.cancel();
    }
}
