//! Planning peering writes: the lifecycle (token, establish, exchange, open, delete) and
//! what a peer's stream imports.

use crate::error::WriteError;
use crate::plan::Plan;
use crate::state::{Change, State};
use std::collections::BTreeMap;
use std::time::SystemTime;
use structs::peering::{ImportedService, Peering, PeeringRemote, PeeringState, StoredPeering};
use structs::{Problem, Timestamp, ValidationError};

/// A peering write.
#[derive(Debug, Clone)]
pub enum PeeringOp {
    /// The accepting side: a token is generated for `name`. Creates the peering (`PENDING`,
    /// id `id`) or, for one still accepting, replaces its establishment secret (the old
    /// token can no longer be used).
    GenerateToken {
        /// The name this cluster gives the peer.
        name: String,
        /// User metadata.
        meta: BTreeMap<String, String>,
        /// The id of a new peering.
        id: String,
        /// The new establishment secret.
        secret: String,
    },
    /// The dialing side: a token's secret was exchanged; the peering is created or updated
    /// (`ESTABLISHING`), keeping its id if it exists.
    Establish {
        /// What the token said (name, peer id, addresses, server name, roots, remote).
        peering: Box<Peering>,
        /// The stream secret the exchange gave.
        stream_secret: String,
    },
    /// The accepting side: a peer exchanges the token's secret for a stream secret (the
    /// establishment secret is used up).
    Exchange {
        /// This side's id of the peering (the token's `PeerID`).
        id: String,
        /// The token's secret.
        establishment: String,
        /// The new stream secret.
        stream: String,
    },
    /// The accepting side: a peer opens the stream with `secret` (a pending secret becomes
    /// the active one), telling where it is.
    Open {
        /// This side's id of the peering.
        id: String,
        /// The secret presented.
        secret: String,
        /// Where the peer is.
        remote: PeeringRemote,
    },
    /// The dialing side's stream opened: the peering is `ACTIVE` (stored, so every server
    /// of the cluster shows it; a server holding a failing stream shows `FAILING`).
    Active {
        /// The peering's name.
        name: String,
    },
    /// The peer's trust bundle arrived.
    TrustBundle {
        /// The peering's name.
        name: String,
        /// The peer's trust domain.
        trust_domain: String,
        /// Its roots.
        roots: Vec<String>,
    },
    /// The peer's mesh gateways arrived (every service it exports here is reached through
    /// them).
    Gateways {
        /// The peering's name.
        name: String,
        /// The gateways.
        gateways: Vec<structs::CheckServiceNode>,
    },
    /// This cluster's servers' peering addresses changed (the leader writes them).
    LocalServers {
        /// The addresses.
        addresses: Vec<String>,
    },
    /// The peer's servers' addresses arrived (the dialing side dials them from now on).
    ServerAddresses {
        /// The peering's name.
        name: String,
        /// The addresses.
        addresses: Vec<String>,
    },
    /// A delete was asked: the peering goes `DELETING` and its secrets go; the peer is told
    /// and what it exported is removed before the peering itself ([`PeeringOp::Remove`]).
    Delete {
        /// The peering's name.
        name: String,
        /// When.
        now: SystemTime,
    },
    /// The peer deleted the peering: `TERMINATED` here (a delete is left to the user).
    Terminated {
        /// The peering's name.
        name: String,
    },
    /// The peering and everything it imported are removed (after a delete).
    Remove {
        /// The peering's name.
        name: String,
    },
    /// What the peer exports here: each service given is replaced (one without instances
    /// removed); with `complete`, every other service it exported before is removed.
    Import {
        /// The peering's name.
        name: String,
        /// The services.
        services: Vec<ImportedService>,
        /// Whether the list is the whole of what the peer exports.
        complete: bool,
    },
}

fn refused(field: &str, why: String) -> WriteError {
    ValidationError::new(field, Problem::Invalid(why)).into()
}

/// Compares secrets in time independent of where they differ.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn live(state: &State, name: &str) -> Result<std::sync::Arc<StoredPeering>, WriteError> {
    let stored = state
        .peering(name)
        .ok_or_else(|| WriteError::NotFound(format!("Peering not found for {name:?}")))?;
    if stored.peering.state == PeeringState::Deleting {
        return Err(refused(
            "PeerName",
            format!("peering {name:?} is being deleted: it cannot be written"),
        ));
    }
    Ok(stored)
}

fn by_id(state: &State, id: &str) -> Result<std::sync::Arc<StoredPeering>, WriteError> {
    state
        .peering_by_id(id)
        .filter(|p| p.peering.state.is_live())
        .ok_or_else(|| WriteError::NotFound(format!("no live peering has id {id:?}")))
}

fn put(stored: StoredPeering) -> Plan {
    Plan::write(vec![Change::PutPeering(Box::new(stored))])
}

pub(crate) fn plan(op: &PeeringOp, state: &State) -> Result<Plan, WriteError> {
    match op {
        PeeringOp::GenerateToken { name, meta, id, secret } => plan_token(state, name, meta, id, secret),
        PeeringOp::Establish { peering, stream_secret } => plan_establish(state, peering, stream_secret),
        PeeringOp::Exchange {
            id,
            establishment,
            stream,
        } => {
            let stored = by_id(state, id)?;
            let known = stored.secrets.establishment.as_deref();
            if !known.is_some_and(|k| same_secret(k, establishment)) {
                return Err(WriteError::Forbidden(
                    "invalid peering establishment secret: a new peering token must be generated".into(),
                ));
            }
            let mut next = (*stored).clone();
            next.secrets.establishment = None;
            next.secrets.stream_pending = Some(stream.clone());
            Ok(put(next))
        }
        PeeringOp::Open { id, secret, remote } => plan_open(state, id, secret, remote),
        PeeringOp::Active { name } => {
            let stored = live(state, name)?;
            if matches!(stored.peering.state, PeeringState::Active | PeeringState::Terminated) {
                return Ok(Plan::write(Vec::new()));
            }
            let mut next = (*stored).clone();
            next.peering.state = PeeringState::Active;
            Ok(put(next))
        }
        PeeringOp::TrustBundle {
            name,
            trust_domain,
            roots,
        } => {
            let stored = live(state, name)?;
            if stored.peering.peer_trust_domain == *trust_domain && stored.peering.peer_ca_pems == *roots {
                return Ok(Plan::write(Vec::new()));
            }
            let mut next = (*stored).clone();
            next.peering.peer_trust_domain = trust_domain.clone();
            next.peering.peer_ca_pems = roots.clone();
            Ok(put(next))
        }
        PeeringOp::Gateways { name, gateways } => plan_gateways(state, name, gateways),
        PeeringOp::ServerAddresses { name, addresses } => plan_server_addresses(state, name, addresses),
        PeeringOp::LocalServers { addresses } => Ok(Plan::write(if state.peering_servers() == addresses.as_slice() {
            Vec::new()
        } else {
            vec![Change::PutPeeringServers(addresses.clone())]
        })),
        PeeringOp::Delete { name, now } => {
            let Some(stored) = state.peering(name) else {
                return Ok(Plan::write(Vec::new()));
            };
            if stored.peering.state == PeeringState::Deleting {
                return Ok(Plan::write(Vec::new()));
            }
            let mut next = (*stored).clone();
            next.peering.state = PeeringState::Deleting;
            next.peering.deleted_at = Some(Timestamp(*now));
            next.secrets = Default::default();
            next.gateways.clear();
            Ok(put(next))
        }
        PeeringOp::Terminated { name } => {
            let Some(stored) = state.peering(name) else {
                return Ok(Plan::write(Vec::new()));
            };
            if matches!(stored.peering.state, PeeringState::Deleting | PeeringState::Terminated) {
                return Ok(Plan::write(Vec::new()));
            }
            let mut next = (*stored).clone();
            next.peering.state = PeeringState::Terminated;
            next.secrets = Default::default();
            next.gateways.clear();
            let mut changes = vec![Change::PutPeering(Box::new(next))];
            changes.extend(remove_imports(state, name));
            Ok(Plan::write(changes))
        }
        PeeringOp::Remove { name } => {
            let mut changes = remove_imports(state, name);
            if state.peering(name).is_some() {
                changes.push(Change::DeletePeering(name.clone()));
            }
            Ok(Plan::write(changes))
        }
        PeeringOp::Import {
            name,
            services,
            complete,
        } => plan_import(state, name, services, *complete),
    }
}

/// The peer's servers' addresses, on the dialing side (none given: kept as they are).
fn plan_server_addresses(state: &State, name: &str, addresses: &[String]) -> Result<Plan, WriteError> {
    let stored = live(state, name)?;
    if !stored.peering.is_dialer() || stored.peering.peer_server_addresses == addresses || addresses.is_empty() {
        return Ok(Plan::write(Vec::new()));
    }
    let mut next = (*stored).clone();
    next.peering.peer_server_addresses = addresses.to_vec();
    Ok(put(next))
}

fn remove_imports(state: &State, name: &str) -> Vec<Change> {
    state
        .imported_services(name)
        .map(|s| Change::DeleteImported {
            peer: name.to_owned(),
            service: s.name.clone(),
        })
        .collect()
}

fn plan_token(
    state: &State,
    name: &str,
    meta: &BTreeMap<String, String>,
    id: &str,
    secret: &str,
) -> Result<Plan, WriteError> {
    let next = match state.peering(name) {
        Some(existing) => {
            let existing = live(state, name).map(|_| existing)?;
            if existing.peering.is_dialer() {
                return Err(refused(
                    "PeerName",
                    format!(
                        "cannot generate a token for {name:?}: this cluster established that peering with the peer's token (it dials the peer)"
                    ),
                ));
            }
            if existing.peering.state == PeeringState::Terminated {
                return Err(refused(
                    "PeerName",
                    format!("peering {name:?} was terminated by the peer: delete it first"),
                ));
            }
            let mut next = (*existing).clone();
            next.secrets.establishment = Some(secret.to_owned());
            if !meta.is_empty() {
                next.peering.meta = meta.clone();
            }
            next
        }
        None => StoredPeering {
            peering: Peering {
                id: id.to_owned(),
                name: name.to_owned(),
                meta: meta.clone(),
                state: PeeringState::Pending,
                ..Peering::default()
            },
            secrets: structs::peering::PeeringSecrets {
                establishment: Some(secret.to_owned()),
                ..Default::default()
            },
            gateways: Vec::new(),
        },
    };
    Ok(put(next))
}

fn plan_establish(state: &State, peering: &Peering, stream_secret: &str) -> Result<Plan, WriteError> {
    let name = &peering.name;
    // No secret yet (an establish through the mesh gateways stores the peering before its
    // exchange): a peering established before keeps its own until the exchange gives one.
    let secrets = match state.peering(name) {
        Some(existing) if stream_secret.is_empty() => existing.secrets.clone(),
        _ => structs::peering::PeeringSecrets {
            stream_active: (!stream_secret.is_empty()).then(|| stream_secret.to_owned()),
            ..Default::default()
        },
    };
    let mut next = StoredPeering {
        peering: peering.clone(),
        secrets,
        gateways: Vec::new(),
    };
    next.peering.state = PeeringState::Establishing;
    if let Some(existing) = state.peering(name) {
        let existing = live(state, name).map(|_| existing)?;
        if !existing.peering.is_dialer() {
            return Err(refused(
                "PeerName",
                format!(
                    "cannot establish a peering named {name:?}: a token was generated here under that name, and the peer is expected to dial this cluster"
                ),
            ));
        }
        next.peering.id = existing.peering.id.clone();
    }
    if let Some(other) = state
        .peerings()
        .find(|p| p.peering.name != *name && p.peering.peer_id == peering.peer_id && p.peering.state.is_live())
    {
        return Err(refused(
            "PeeringToken",
            format!(
                "this token's peering is already established here as {:?}",
                other.peering.name
            ),
        ));
    }
    Ok(put(next))
}

fn plan_open(state: &State, id: &str, secret: &str, remote: &PeeringRemote) -> Result<Plan, WriteError> {
    let stored = by_id(state, id)?;
    let secrets = &stored.secrets;
    let active = secrets.stream_active.as_deref().is_some_and(|s| same_secret(s, secret));
    let pending = secrets
        .stream_pending
        .as_deref()
        .is_some_and(|s| same_secret(s, secret));
    if !active && !pending {
        return Err(WriteError::Forbidden("invalid peering stream secret".into()));
    }
    if active && stored.peering.remote == *remote && stored.peering.state == PeeringState::Active {
        return Ok(Plan::write(Vec::new()));
    }
    let mut next = (*stored).clone();
    if pending {
        next.secrets.stream_active = next.secrets.stream_pending.take();
    }
    next.peering.remote = remote.clone();
    next.peering.state = PeeringState::Active;
    Ok(put(next))
}

fn plan_gateways(state: &State, name: &str, gateways: &[structs::CheckServiceNode]) -> Result<Plan, WriteError> {
    let stored = live(state, name)?;
    let mut gateways = gateways.to_vec();
    for csn in &mut gateways {
        mark_peer(csn, name);
    }
    if stored.gateways == gateways {
        return Ok(Plan::write(Vec::new()));
    }
    let mut next = (*stored).clone();
    next.gateways = gateways;
    Ok(put(next))
}

/// Marks an instance the peer `name` sent as the peer's.
fn mark_peer(csn: &mut structs::CheckServiceNode, name: &str) {
    csn.node.peer_name = name.to_owned();
    csn.service.peer_name = name.to_owned();
    for check in &mut csn.checks {
        check.peer_name = name.to_owned();
    }
}

fn plan_import(state: &State, name: &str, services: &[ImportedService], complete: bool) -> Result<Plan, WriteError> {
    let stored = live(state, name)?;
    if stored.peering.state == PeeringState::Terminated {
        return Ok(Plan::write(Vec::new()));
    }
    let mut changes = Vec::new();
    for service in services {
        let current = state.imported(name, &service.name);
        // A removal: the name alone (an exported service always carries its digest).
        if service.digest.is_empty() && service.instances.is_empty() {
            if current.is_some() {
                changes.push(Change::DeleteImported {
                    peer: name.to_owned(),
                    service: service.name.clone(),
                });
            }
            continue;
        }
        let mut service = service.clone();
        // The peer's gateways are kept once, with the peering.
        service.mesh_gateways.clear();
        for csn in &mut service.instances {
            mark_peer(csn, name);
        }
        if current.as_deref() != Some(&service) {
            changes.push(Change::PutImported {
                peer: name.to_owned(),
                service: Box::new(service),
            });
        }
    }
    if complete {
        let listed: std::collections::HashSet<&str> = services.iter().map(|s| s.name.as_str()).collect();
        changes.extend(
            state
                .imported_services(name)
                .filter(|s| !listed.contains(s.name.as_str()))
                .map(|s| Change::DeleteImported {
                    peer: name.to_owned(),
                    service: s.name.clone(),
                }),
        );
    }
    Ok(Plan::write(changes))
}
