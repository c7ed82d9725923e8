//! Peerings and what peers export here: their tables and how changes apply.

use super::{Change, State};
use crate::keys::IndexKey;
use imbl::OrdSet;
use std::sync::Arc;
use structs::Index;
use structs::peering::{ImportedService, StoredPeering};

impl State {
    pub(super) fn apply_peering(&mut self, index: Index, change: &Change, bumped: &mut OrdSet<IndexKey>) {
        match change {
            Change::PutPeering(stored) => {
                let mut stored = (**stored).clone();
                let name = stored.peering.name.clone();
                // Only the peer's gateways moved: nothing the API shows nor any trust
                // changed, only what proxies reach the peer's services through.
                let gateways_only = self
                    .peerings
                    .get(&name)
                    .is_some_and(|p| p.peering == stored.peering && p.secrets == stored.secrets);
                if !gateways_only {
                    stored.peering.create_index = self.peerings.get(&name).map_or(index, |p| p.peering.create_index);
                    stored.peering.modify_index = index;
                    bumped.insert(IndexKey::Peerings);
                }
                self.peerings.insert(name.clone(), Arc::new(stored));
                bumped.insert(IndexKey::PeeringRoutes);
                // Its trust bundle goes with each service it exports here.
                for service in self.imported_services(&name) {
                    bumped.insert(IndexKey::PeerService(name.clone(), service.name.clone()));
                }
            }
            Change::DeletePeering(name) if self.peerings.remove(name).is_some() => {
                bumped.insert(IndexKey::Peerings);
                bumped.insert(IndexKey::PeeringRoutes);
                for service in self.imported_services(name) {
                    bumped.insert(IndexKey::PeerService(name.clone(), service.name.clone()));
                }
            }
            Change::PutImported { peer, service } => {
                let new = self
                    .imported
                    .insert((peer.clone(), service.name.clone()), Arc::new((**service).clone()))
                    .is_none();
                if new {
                    // The peering's `ImportedServiceCount` moved.
                    bumped.insert(IndexKey::Peerings);
                }
                bumped.insert(IndexKey::PeerServices(peer.clone()));
                bumped.insert(IndexKey::PeerService(peer.clone(), service.name.clone()));
                bumped.insert(IndexKey::PeeringRoutes);
            }
            Change::PutPeeringServers(addresses) if *self.peering_servers != *addresses => {
                self.peering_servers = Arc::new(addresses.clone());
                bumped.insert(IndexKey::PeeringRoutes);
            }
            Change::DeleteImported { peer, service }
                if self.imported.remove(&(peer.clone(), service.clone())).is_some() =>
            {
                bumped.insert(IndexKey::Peerings);
                bumped.insert(IndexKey::PeerServices(peer.clone()));
                bumped.insert(IndexKey::PeerService(peer.clone(), service.clone()));
                bumped.insert(IndexKey::PeeringRoutes);
            }
            _ => {}
        }
    }

    /// One peering, by the name this cluster gives the peer.
    pub fn peering(&self, name: &str) -> Option<Arc<StoredPeering>> {
        self.peerings.get(name).cloned()
    }

    /// One peering, by this side's id of it.
    pub fn peering_by_id(&self, id: &str) -> Option<Arc<StoredPeering>> {
        self.peerings.values().find(|p| p.peering.id == id).cloned()
    }

    /// This cluster's servers' peering (gRPC TLS) addresses, as the leader last wrote them.
    pub fn peering_servers(&self) -> &[String] {
        &self.peering_servers
    }

    /// Where the peering calls go, for mesh gateways carrying them: this cluster's servers
    /// and the servers (or gateways) of each live peering it dials.
    pub fn peering_servers_view(&self) -> structs::peering::PeeringServers {
        structs::peering::PeeringServers {
            local: (*self.peering_servers).clone(),
            dialed: self
                .peerings
                .values()
                .filter(|p| p.peering.is_dialer() && p.peering.state.is_live())
                .map(|p| structs::peering::DialedServers {
                    peer: p.peering.name.clone(),
                    server_name: p.peering.peer_server_name.clone(),
                    addresses: p.peering.peer_server_addresses.clone(),
                })
                .collect(),
            imported: self
                .peerings
                .values()
                .filter(|p| p.peering.state.is_live())
                .flat_map(|p| {
                    let gateways: Vec<String> = p.gateways.iter().map(|g| g.address_with_port()).collect();
                    self.imported_services(&p.peering.name)
                        .filter(|s| !s.sni.is_empty())
                        .map(move |s| structs::peering::ImportedRoute {
                            peer: p.peering.name.clone(),
                            sni: s.sni.clone(),
                            gateways: gateways.clone(),
                        })
                        .collect::<Vec<_>>()
                })
                .collect(),
        }
    }

    /// Every peering, by name.
    pub fn peerings(&self) -> impl Iterator<Item = &Arc<StoredPeering>> {
        self.peerings.values()
    }

    /// A service `peer` exports here, as last received.
    pub fn imported(&self, peer: &str, service: &str) -> Option<Arc<ImportedService>> {
        self.imported.get(&(peer.to_owned(), service.to_owned())).cloned()
    }

    /// Every service `peer` exports here, by name.
    pub fn imported_services<'a>(&'a self, peer: &'a str) -> impl Iterator<Item = &'a Arc<ImportedService>> + 'a {
        self.imported
            .range((peer.to_owned(), String::new())..)
            .take_while(move |((p, _), _)| p == peer)
            .map(|(_, s)| s)
    }

    /// The instances of a service imported from `peer`, as `/v1/health/service` shows them
    /// (none when the peer does not export it).
    pub fn imported_health(&self, peer: &str, service: &str) -> Vec<structs::CheckServiceNode> {
        self.imported(peer, service)
            .map(|s| s.instances.clone())
            .unwrap_or_default()
    }

    /// What a proxy here needs for an upstream `service` of `peer`: the service as the
    /// peer exports it and the peer's trust bundle, while the peering is live.
    pub fn peered_upstream(&self, peer: &str, service: &str) -> structs::peering::PeeredUpstream {
        let stored = self.peerings.get(peer);
        let bundle = stored.and_then(|p| trust_bundle(p));
        let service = bundle.as_ref().and(self.imported(peer, service)).map(|s| {
            let mut s = (*s).clone();
            s.mesh_gateways = stored.map(|p| p.gateways.clone()).unwrap_or_default();
            s
        });
        structs::peering::PeeredUpstream { service, bundle }
    }

    /// The trust bundles of the live peerings `service` is exported to (the
    /// `exported-services` entry): whose callers its sidecars accept.
    pub fn peer_trust_bundles_for(&self, service: &str) -> Vec<structs::peering::PeerTrustBundle> {
        let Some(entry) = self.config_entry(structs::ConfigEntryKind::ExportedServices, "default") else {
            return Vec::new();
        };
        let structs::ConfigEntry::ExportedServices(entry) = &*entry else {
            return Vec::new();
        };
        let peers = entry.peers_of(service);
        self.peer_trust_bundles()
            .into_iter()
            .filter(|b| peers.contains(&b.peer))
            .collect()
    }

    /// The trust bundles of every peering that carries services (not deleted or
    /// terminated), by peer name.
    pub fn peer_trust_bundles(&self) -> Vec<structs::peering::PeerTrustBundle> {
        self.peerings.values().filter_map(|p| trust_bundle(p)).collect()
    }
}

/// A peering's trust bundle, while it is live and the peer sent it (the roots a token
/// carried come without the trust domain: they only verify the peer's servers).
fn trust_bundle(stored: &StoredPeering) -> Option<structs::peering::PeerTrustBundle> {
    let p = &stored.peering;
    (p.state.is_live() && !p.peer_ca_pems.is_empty() && !p.peer_trust_domain.is_empty()).then(|| {
        structs::peering::PeerTrustBundle {
            peer: p.name.clone(),
            trust_domain: p.peer_trust_domain.clone(),
            datacenter: p.remote.datacenter.clone(),
            root_pems: p.peer_ca_pems.clone(),
        }
    })
}
