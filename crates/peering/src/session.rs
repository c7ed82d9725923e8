//! One peering stream, either side: what this cluster exports to the peer is sent as it
//! changes (only what changed, and on a reconnect only what the peer does not hold
//! already), what the peer exports is written to the catalog, heartbeats both ways, and the
//! end: the peering deleted here (the peer is told), or by the peer.

use crate::exports;
use crate::proto::{Ack, Heartbeat, Known, Payload, ReplicationMessage, Terminated, Update};
use crate::tracker::{StreamHandle, Tracker};
use catalog::{IndexKey, Op, PeeringOp, State, Store};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use structs::peering::{ImportedService, PeeringState};
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt, StreamMap, wrappers::WatchStream};

/// How often each side sends a heartbeat.
pub const HEARTBEAT: Duration = Duration::from_secs(15);
/// How long without anything from the peer before the stream is given up.
pub const SILENCE: Duration = Duration::from_secs(120);
/// How long exports wait after a catalog change for more changes, to send them together.
const SETTLE: Duration = Duration::from_millis(5);

/// What a peering stream needs from its server.
#[derive(Clone)]
pub struct Context {
    /// The catalog.
    pub store: Store,
    /// This cluster's datacenter.
    pub datacenter: String,
    /// The streams on this server.
    pub tracker: Arc<Tracker>,
    /// This cluster's servers' peering (gRPC TLS) addresses, sent to peers that dial.
    pub addresses: Arc<dyn Fn() -> Vec<String> + Send + Sync>,
    /// Changes when [`Context::addresses`] may have (servers joined or left), if it can.
    pub addresses_changed: Option<tokio::sync::watch::Receiver<catalog::cluster::ClusterStatus>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("datacenter", &self.datacenter)
            .finish_non_exhaustive()
    }
}

/// How a stream ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The peer deleted the peering (it is `TERMINATED` here now).
    Terminated,
    /// The peering was deleted here, and the peer told.
    Deleted,
    /// This server stops, or a newer stream of the same peering took over.
    Cancelled,
}

/// What this cluster holds of `name`'s exports: what its side of a stream tells the peer.
pub fn known(state: &State, name: &str) -> Vec<Known> {
    state
        .imported_services(name)
        .map(|s| Known {
            service: s.name.clone(),
            digest: s.digest.clone(),
        })
        .collect()
}

/// What has been sent to the peer on this stream.
#[derive(Default)]
struct Sent {
    /// What is exported to the peer, as last computed.
    exports: exports::Exports,
    services: HashMap<String, String>,
    bundle: Option<(String, Vec<String>)>,
    gateways: Option<Vec<structs::CheckServiceNode>>,
    addresses: Vec<String>,
    nonce: u64,
}

/// Runs one stream of the peering `name` until it ends: `peer_known` is what the peer says
/// it holds of this cluster's exports.
pub async fn run<S>(
    ctx: &Context,
    name: &str,
    dialer: bool,
    peer_known: Vec<Known>,
    tx: mpsc::Sender<ReplicationMessage>,
    mut rx: S,
    handle: &StreamHandle,
) -> Result<Ended, String>
where
    S: Stream<Item = Result<ReplicationMessage, tonic::Status>> + Unpin,
{
    let mut sent = Sent {
        services: peer_known.into_iter().map(|k| (k.service, k.digest)).collect(),
        ..Sent::default()
    };
    let mut changes = watches(&ctx.store);
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut silence = Box::pin(tokio::time::sleep(SILENCE));
    loop {
        tokio::select! {
            () = handle.token.cancelled() => return Ok(Ended::Cancelled),
            message = rx.next() => {
                silence.as_mut().reset(tokio::time::Instant::now() + SILENCE);
                ctx.tracker.update(name, |s| s.last_receive = Some(SystemTime::now()));
                let message = match message {
                    None => return Err("the peer closed the stream".into()),
                    Some(Err(status)) => return Err(format!("the stream failed: {}", status.message())),
                    Some(Ok(message)) => message,
                };
                if let Some(ended) = receive(ctx, name, dialer, message, &tx).await? {
                    return Ok(ended);
                }
            }
            Some(_) = changes.next() => {
                tokio::time::sleep(SETTLE).await;
                // Drain what else changed meanwhile: one export for all of it.
                while let Ok(Some(_)) = tokio::time::timeout(Duration::ZERO, changes.next()).await {}
                if let Some(ended) = export(ctx, name, dialer, &mut sent, &tx).await? {
                    if ended == Ended::Deleted {
                        // Let `Terminated` reach the peer: close this side, then wait for
                        // the peer to end the stream (dropping it at once could cut the
                        // message off).
                        drop(tx);
                        let drained = async { while let Some(Ok(_)) = rx.next().await {} };
                        let _ = tokio::time::timeout(Duration::from_secs(5), drained).await;
                    }
                    return Ok(ended);
                }
            }
            _ = heartbeat.tick() => send(ctx, name, &tx, Payload::Heartbeat(Heartbeat {})).await?,
            () = &mut silence => return Err(format!("nothing from the peer for {}s", SILENCE.as_secs())),
        }
    }
}

/// The catalog keys whose changes may change what is exported.
fn watches(store: &Store) -> StreamMap<usize, WatchStream<structs::Index>> {
    let mut map = StreamMap::new();
    let keys = [
        IndexKey::Services,
        IndexKey::Checks,
        IndexKey::Nodes,
        IndexKey::ConfigEntries,
        IndexKey::Ca,
        IndexKey::Peerings,
    ];
    for (i, key) in keys.iter().enumerate() {
        if let Some(rx) = store.index_receiver(key) {
            map.insert(i, WatchStream::new(rx));
        }
    }
    map
}

async fn send(
    ctx: &Context,
    name: &str,
    tx: &mpsc::Sender<ReplicationMessage>,
    payload: Payload,
) -> Result<(), String> {
    tx.send(ReplicationMessage::of(payload))
        .await
        .map_err(|_| "the stream closed".to_owned())?;
    ctx.tracker.update(name, |s| s.last_send = Some(SystemTime::now()));
    Ok(())
}

/// Sends what changed in the exports since the last update; ends the stream when the
/// peering was deleted here (telling the peer) or terminated by it.
async fn export(
    ctx: &Context,
    name: &str,
    dialer: bool,
    sent: &mut Sent,
    tx: &mpsc::Sender<ReplicationMessage>,
) -> Result<Option<Ended>, String> {
    let state = ctx.store.read();
    match state.peering(name).map(|p| p.peering.state) {
        None | Some(PeeringState::Deleting) => {
            send(ctx, name, tx, Payload::Terminated(Terminated {})).await?;
            return Ok(Some(Ended::Deleted));
        }
        Some(PeeringState::Terminated) => return Ok(Some(Ended::Terminated)),
        Some(_) => {}
    }
    let updates = next_updates(ctx, &state, name, dialer, sent);
    drop(state);
    for update in updates {
        send(ctx, name, tx, Payload::Update(update)).await?;
    }
    Ok(None)
}

/// How many services one update carries at most: a large export (a first sync) goes as
/// several messages, each well under gRPC's message size limit.
const SERVICES_PER_UPDATE: usize = 100;

fn next_updates(ctx: &Context, state: &State, name: &str, dialer: bool, sent: &mut Sent) -> Vec<Update> {
    let mut exported = std::mem::take(&mut sent.exports);
    exported.refresh(state, name, &ctx.datacenter);
    let updates = updates_for(ctx, state, dialer, sent, &exported);
    sent.exports = exported;
    updates
}

/// What to send for `exported` given what was `sent` (which it brings up to date).
fn updates_for(
    ctx: &Context,
    state: &State,
    dialer: bool,
    sent: &mut Sent,
    exported: &exports::Exports,
) -> Vec<Update> {
    let changed: Vec<&ImportedService> = exported
        .services()
        .filter(|s| sent.services.get(&s.name) != Some(&s.digest))
        .collect();
    let removed: Vec<String> = sent
        .services
        .keys()
        .filter(|n| !exported.contains(n))
        .cloned()
        .collect();
    let bundle = exports::trust_bundle(state);
    let new_bundle = sent.bundle.as_ref() != Some(&bundle) && !bundle.1.is_empty();
    let gateways = exports::mesh_gateways(state);
    let new_gateways = sent.gateways.as_ref() != Some(&gateways);
    // Only the acceptor's servers are dialled.
    let addresses = if dialer {
        Vec::new()
    } else {
        crate::routes::advertised(state, &*ctx.addresses)
    };
    let new_addresses = !addresses.is_empty() && addresses != sent.addresses;
    if changed.is_empty() && removed.is_empty() && !new_bundle && !new_addresses && !new_gateways {
        return Vec::new();
    }
    // The first update carries the bundle (before the services it verifies), the addresses
    // and the removals; the changed services follow in chunks.
    let mut updates = Vec::new();
    let mut chunks = changed.chunks(SERVICES_PER_UPDATE);
    let first = chunks.next().unwrap_or_default();
    sent.nonce += 1;
    updates.push(Update {
        nonce: sent.nonce,
        trust_domain: if new_bundle { bundle.0.clone() } else { String::new() },
        root_pems: if new_bundle { bundle.1.clone() } else { Vec::new() },
        services_json: if first.is_empty() {
            Vec::new()
        } else {
            serde_json::to_vec(first).unwrap_or_default()
        },
        removed: removed.clone(),
        server_addresses: if new_addresses { addresses.clone() } else { Vec::new() },
        gateways_json: new_gateways.then(|| serde_json::to_vec(&gateways).unwrap_or_default()),
    });
    for chunk in chunks {
        sent.nonce += 1;
        updates.push(Update {
            nonce: sent.nonce,
            services_json: serde_json::to_vec(chunk).unwrap_or_default(),
            ..Update::default()
        });
    }
    for s in changed {
        sent.services.insert(s.name.clone(), s.digest.clone());
    }
    for r in &removed {
        sent.services.remove(r);
    }
    if new_bundle {
        sent.bundle = Some(bundle);
    }
    if new_addresses {
        sent.addresses = addresses;
    }
    if new_gateways {
        sent.gateways = Some(gateways);
    }
    updates
}

/// Handles one message from the peer.
async fn receive(
    ctx: &Context,
    name: &str,
    dialer: bool,
    message: ReplicationMessage,
    tx: &mpsc::Sender<ReplicationMessage>,
) -> Result<Option<Ended>, String> {
    match message.payload {
        Some(Payload::Update(update)) => {
            let nonce = update.nonce;
            let error = apply(ctx, name, dialer, update).await.err().unwrap_or_default();
            if !error.is_empty() {
                tracing::warn!(peer = name, %error, "cannot apply what the peer sent");
            }
            send(ctx, name, tx, Payload::Ack(Ack { nonce, error })).await?;
        }
        Some(Payload::Ack(ack)) => {
            if !ack.error.is_empty() {
                tracing::warn!(peer = name, error = %ack.error, "the peer could not apply an update");
            }
        }
        Some(Payload::Heartbeat(_)) => ctx.tracker.update(name, |s| s.last_heartbeat = Some(SystemTime::now())),
        Some(Payload::Terminated(_)) => {
            tracing::info!(peer = name, "the peer deleted the peering: it is terminated here");
            write(ctx, PeeringOp::Terminated { name: name.to_owned() }).await?;
            return Ok(Some(Ended::Terminated));
        }
        Some(Payload::Open(_) | Payload::Opened(_)) | None => {
            return Err("the peer sent a message out of place".into());
        }
    }
    Ok(None)
}

async fn write(ctx: &Context, op: PeeringOp) -> Result<(), String> {
    ctx.store
        .write(Op::Peering(op))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Writes what the peer exports here: its trust bundle, the services that changed (each
/// kept only with identities in the peer's trust domain), those it no longer exports, and
/// (on the dialing side) the servers to dial.
async fn apply(ctx: &Context, name: &str, dialer: bool, update: Update) -> Result<(), String> {
    if !update.trust_domain.is_empty() {
        // A peer claiming this cluster's trust domain (or another peer's) would have its CA
        // vouch for identities that are not its own: refused, and nothing of it kept.
        let state = ctx.store.read();
        let ours = state.ca_roots().trust_domain;
        let taken = state.peerings().any(|p| {
            p.peering.name != name && p.peering.state.is_live() && p.peering.peer_trust_domain == update.trust_domain
        });
        drop(state);
        if update.trust_domain == ours || taken {
            return Err(format!(
                "the peer's trust domain {:?} is this cluster's or another peer's: its bundle is refused",
                update.trust_domain
            ));
        }
        write(
            ctx,
            PeeringOp::TrustBundle {
                name: name.to_owned(),
                trust_domain: update.trust_domain.clone(),
                roots: update.root_pems.clone(),
            },
        )
        .await?;
    }
    let mut services: Vec<ImportedService> = if update.services_json.is_empty() {
        Vec::new()
    } else {
        serde_json::from_slice(&update.services_json).map_err(|e| format!("undecodable services: {e}"))?
    };
    let trust_domain = ctx
        .store
        .read()
        .peering(name)
        .map(|p| p.peering.peer_trust_domain.clone())
        .unwrap_or_default();
    let prefix = format!("spiffe://{trust_domain}/");
    let mut by_name = BTreeMap::new();
    for mut service in services.drain(..) {
        structs::validate::check_service_name(&service.name).map_err(|e| e.to_string())?;
        service
            .spiffe_ids
            .retain(|id| !trust_domain.is_empty() && id.starts_with(&prefix));
        by_name.insert(service.name.clone(), service);
    }
    for removed in update.removed {
        by_name.entry(removed.clone()).or_insert_with(|| ImportedService {
            name: removed,
            ..ImportedService::default()
        });
    }
    if !by_name.is_empty() {
        write(
            ctx,
            PeeringOp::Import {
                name: name.to_owned(),
                services: by_name.into_values().collect(),
                complete: false,
            },
        )
        .await?;
    }
    if let Some(json) = &update.gateways_json {
        let gateways: Vec<structs::CheckServiceNode> =
            serde_json::from_slice(json).map_err(|e| format!("undecodable mesh gateways: {e}"))?;
        write(
            ctx,
            PeeringOp::Gateways {
                name: name.to_owned(),
                gateways,
            },
        )
        .await?;
    }
    if dialer && !update.server_addresses.is_empty() {
        for address in &update.server_addresses {
            structs::peering::check_address(address)?;
        }
        write(
            ctx,
            PeeringOp::ServerAddresses {
                name: name.to_owned(),
                addresses: update.server_addresses,
            },
        )
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn a_peer_claiming_this_clusters_trust_domain_is_refused() {
        let store = Store::open(catalog::StoreConfig::default()).await.unwrap();
        store
            .write(Op::Peering(PeeringOp::GenerateToken {
                name: "rogue".into(),
                meta: Default::default(),
                id: "id-1".into(),
                secret: "s".into(),
            }))
            .await
            .unwrap();
        let ctx = Context {
            store: store.clone(),
            datacenter: "dc1".into(),
            tracker: Tracker::new(),
            addresses: Arc::new(Vec::new),
            addresses_changed: None,
        };
        let ours = store.read().ca_roots().trust_domain;
        let claim = Update {
            trust_domain: ours,
            root_pems: vec!["-----BEGIN CERTIFICATE-----\n".into()],
            ..Update::default()
        };
        let err = apply(&ctx, "rogue", false, claim).await.unwrap_err();
        assert!(err.contains("is this cluster's or another peer's"), "{err}");
        assert!(store.read().peering("rogue").unwrap().peering.peer_ca_pems.is_empty());
        let fair = Update {
            trust_domain: "other.consul".into(),
            root_pems: vec!["pem".into()],
            ..Update::default()
        };
        apply(&ctx, "rogue", false, fair).await.unwrap();
        assert_eq!(
            store.read().peering("rogue").unwrap().peering.peer_trust_domain,
            "other.consul"
        );
    }
}
