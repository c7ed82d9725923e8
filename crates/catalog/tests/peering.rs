//! Peering writes: the lifecycle's rules (names, roles, secrets used once) and imports.
#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use ::catalog::*;
use std::time::SystemTime;
use structs::peering::{ImportedService, Peering, PeeringRemote, PeeringState};
use structs::{CheckServiceNode, Node, NodeService};

fn token(name: &str, id: &str, secret: &str) -> Op {
    Op::Peering(PeeringOp::GenerateToken {
        name: name.into(),
        meta: Default::default(),
        id: id.into(),
        secret: secret.into(),
    })
}

fn exchange(id: &str, establishment: &str, stream: &str) -> Op {
    Op::Peering(PeeringOp::Exchange {
        id: id.into(),
        establishment: establishment.into(),
        stream: stream.into(),
    })
}

fn open(id: &str, secret: &str) -> Op {
    Op::Peering(PeeringOp::Open {
        id: id.into(),
        secret: secret.into(),
        remote: PeeringRemote {
            partition: "default".into(),
            datacenter: "dc2".into(),
        },
    })
}

fn instance(node: &str, address: &str) -> CheckServiceNode {
    CheckServiceNode {
        node: Node {
            node: node.into(),
            address: address.into(),
            ..Node::default()
        },
        service: NodeService {
            id: "api".into(),
            service: "api".into(),
            port: 8080,
            ..NodeService::default()
        },
        checks: vec![],
    }
}

#[tokio::test]
async fn an_establishment_secret_is_used_once_and_a_stream_secret_promoted_on_open() {
    let s = Store::open(StoreConfig::default()).await.unwrap();
    s.write(token("cluster-b", "id-a", "est-1")).await.unwrap();
    let p = s.read().peering("cluster-b").unwrap();
    assert_eq!(p.peering.state, PeeringState::Pending);
    // A second token for the same name keeps the id and replaces the secret.
    s.write(token("cluster-b", "id-other", "est-2")).await.unwrap();
    assert_eq!(s.read().peering("cluster-b").unwrap().peering.id, "id-a");
    assert!(matches!(
        s.write(exchange("id-a", "est-1", "stream-1")).await,
        Err(WriteError::Forbidden(_))
    ));
    s.write(exchange("id-a", "est-2", "stream-1")).await.unwrap();
    assert!(
        matches!(
            s.write(exchange("id-a", "est-2", "stream-2")).await,
            Err(WriteError::Forbidden(_))
        ),
        "used once"
    );
    assert!(matches!(
        s.write(open("id-a", "wrong")).await,
        Err(WriteError::Forbidden(_))
    ));
    s.write(open("id-a", "stream-1")).await.unwrap();
    let p = s.read().peering("cluster-b").unwrap();
    assert_eq!(p.secrets.stream_active.as_deref(), Some("stream-1"));
    assert_eq!(p.secrets.stream_pending, None);
    assert_eq!(p.peering.remote.datacenter, "dc2");
    assert_eq!(p.peering.state, PeeringState::Active, "stored: every server shows it");
    assert!(matches!(
        s.write(open("id-unknown", "stream-1")).await,
        Err(WriteError::NotFound(_))
    ));
}

#[tokio::test]
async fn names_keep_their_role() {
    let s = Store::open(StoreConfig::default()).await.unwrap();
    s.write(token("b", "id-a", "est")).await.unwrap();
    let dialer = Peering {
        name: "b".into(),
        id: "id-x".into(),
        peer_id: "id-peer".into(),
        peer_server_addresses: vec!["127.0.0.1:1".into()],
        ..Peering::default()
    };
    let establish = |p: Peering| {
        Op::Peering(PeeringOp::Establish {
            peering: Box::new(p),
            stream_secret: "s".into(),
        })
    };
    let err = s.write(establish(dialer.clone())).await.unwrap_err().to_string();
    assert!(err.contains("PeerName") && err.contains("token was generated"), "{err}");
    s.write(establish(Peering {
        name: "c".into(),
        ..dialer.clone()
    }))
    .await
    .unwrap();
    assert_eq!(s.read().peering("c").unwrap().peering.state, PeeringState::Establishing);
    let err = s.write(token("c", "id-z", "est")).await.unwrap_err().to_string();
    assert!(err.contains("dials the peer"), "{err}");
    let err = s
        .write(establish(Peering {
            name: "d".into(),
            ..dialer
        }))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("already established here as \"c\""), "{err}");
}

#[tokio::test]
async fn imports_replace_and_go_with_the_peering() {
    let s = Store::open(StoreConfig::default()).await.unwrap();
    s.write(token("b", "id-a", "est")).await.unwrap();
    let api = ImportedService {
        name: "api".into(),
        instances: vec![instance("n1", "10.0.0.1")],
        ..ImportedService::default()
    };
    let web = ImportedService {
        name: "web".into(),
        instances: vec![instance("n2", "10.0.0.2")],
        ..ImportedService::default()
    };
    let import = |services: Vec<ImportedService>, complete| {
        Op::Peering(PeeringOp::Import {
            name: "b".into(),
            services,
            complete,
        })
    };
    s.write(import(vec![api.clone(), web.clone()], true)).await.unwrap();
    let state = s.read();
    let health = state.imported_health("b", "api");
    assert_eq!(health.len(), 1);
    assert_eq!(health[0].node.peer_name, "b");
    assert_eq!(health[0].service.peer_name, "b");
    assert_eq!(state.imported_services("b").count(), 2);
    let before = state.index_of(&IndexKey::PeerService("b".into(), "web".into()));
    // A complete list without web removes it; api unchanged is not rewritten.
    s.write(import(vec![api.clone()], true)).await.unwrap();
    let state = s.read();
    assert!(state.imported("b", "web").is_none());
    assert!(state.index_of(&IndexKey::PeerService("b".into(), "web".into())) > before);
    // A service sent without instances is removed.
    s.write(import(
        vec![ImportedService {
            name: "api".into(),
            ..ImportedService::default()
        }],
        false,
    ))
    .await
    .unwrap();
    assert!(s.read().imported("b", "api").is_none());
    s.write(import(vec![api], false)).await.unwrap();
    s.write(Op::Peering(PeeringOp::Delete {
        name: "b".into(),
        now: SystemTime::now(),
    }))
    .await
    .unwrap();
    let p = s.read().peering("b").unwrap();
    assert_eq!(p.peering.state, PeeringState::Deleting);
    assert!(p.peering.deleted_at.is_some() && p.secrets.establishment.is_none());
    assert!(
        s.write(import(vec![web], false)).await.is_err(),
        "a deleting peering imports nothing"
    );
    s.write(Op::Peering(PeeringOp::Remove { name: "b".into() }))
        .await
        .unwrap();
    assert!(s.read().peering("b").is_none());
    assert_eq!(s.read().imported_services("b").count(), 0);
}

#[tokio::test]
async fn peerings_survive_a_restart_of_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        data_dir: Some(dir.path().to_owned()),
        ..StoreConfig::default()
    };
    {
        let s = Store::open(config.clone()).await.unwrap();
        s.write(token("b", "id-a", "est")).await.unwrap();
        s.write(Op::Peering(PeeringOp::Import {
            name: "b".into(),
            services: vec![ImportedService {
                name: "api".into(),
                instances: vec![instance("n1", "10.0.0.1")],
                ..ImportedService::default()
            }],
            complete: true,
        }))
        .await
        .unwrap();
        let servers = vec!["10.0.0.9:8503".to_owned()];
        let before = s.read().index_of(&catalog::IndexKey::PeeringRoutes);
        s.write(Op::Peering(PeeringOp::LocalServers {
            addresses: servers.clone(),
        }))
        .await
        .unwrap();
        let moved = s.read().index_of(&catalog::IndexKey::PeeringRoutes);
        assert!(moved > before, "the mesh gateways reading them wake");
        // The same again writes nothing.
        s.write(Op::Peering(PeeringOp::LocalServers { addresses: servers }))
            .await
            .unwrap();
        assert_eq!(s.read().index_of(&catalog::IndexKey::PeeringRoutes), moved);
        s.close().await;
    }
    let s = Store::open(config).await.unwrap();
    let state = s.read();
    assert_eq!(
        state.peering("b").unwrap().secrets.establishment.as_deref(),
        Some("est")
    );
    assert_eq!(state.imported_health("b", "api").len(), 1);
    // The servers' peering addresses too; an accepting peering is dialed by the peer, so
    // none is listed as dialed from here.
    let view = state.peering_servers_view();
    assert_eq!(view.local, ["10.0.0.9:8503"]);
    assert!(view.dialed.is_empty());
}
