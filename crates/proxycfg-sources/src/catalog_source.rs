//! The catalog source: for servers serving agentless proxies. A proxy is synced from the
//! catalog into the Manager while at least one xDS stream asks for it: the first stream starts
//! a sync task, later streams share it (reference counted), and when the last stream ends the
//! task stops and deregisters the proxy. The registration handed to the Manager has
//! proxy-defaults and service-defaults merged in, and is re-synced whenever the node, those
//! entries, or the registration change.
//!
//! Proxyless gRPC clients: a connect-native service instance (`Connect.Native`) may open a
//! stream under its own service id, with no sidecar. It is registered as a connect proxy for
//! itself (so it gets its service's identity and certificates) whose upstreams are the
//! listeners the client asks for by name (`xds:///api` asks for `api`), re-registered as
//! that set changes; its `Connect.Native` tells the xDS server to build gRPC's resources
//! (an API listener per target) rather than Envoy's.

use catalog::{IndexKey, State, Store};
use parking_lot::Mutex;
use proxycfg::{
    Manager, ProxyId, ProxyRegistration, ProxyRequest, ProxySource, RegisterError, SnapshotSource, SourceError,
    SourceLease, Watcher,
};
use std::{collections::HashMap, sync::Arc};
use structs::central_config::{CentralConfig, proxy_defaults};
use structs::{ConfigEntryKind, NodeService, ServiceKind, Token, Upstream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span, warn};

struct Entry {
    /// Leases held now.
    refs: usize,
    /// Which start of the sync owns the entry.
    generation: u64,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
    /// Listeners a proxyless client asked for by name (its upstreams).
    requested: tokio::sync::watch::Sender<Vec<String>>,
}

struct Inner {
    store: Store,
    manager: Manager,
    entries: Mutex<HashMap<ProxyId, Entry>>,
    root: CancellationToken,
}

/// Syncs proxies from the catalog into a Manager on demand. Cheap to clone.
#[derive(Clone)]
pub struct CatalogSource {
    inner: Arc<Inner>,
}

/// Keeps a proxy synced while held; dropping the last lease of a proxy stops its sync, which
/// deregisters it.
pub struct Lease {
    inner: Arc<Inner>,
    id: ProxyId,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("id", &self.id).finish()
    }
}

impl CatalogSource {
    /// A source over `store` that registers into `manager`.
    pub fn new(store: Store, manager: Manager) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                manager,
                entries: Mutex::new(HashMap::new()),
                root: CancellationToken::new(),
            }),
        }
    }

    /// Watches `id`'s snapshots, syncing it from the catalog for as long as the lease lives.
    pub fn watch(&self, id: ProxyId, token: Option<Token>) -> (Watcher, Lease) {
        let watcher = self.inner.manager.watch(&id);
        let mut entries = self.inner.entries.lock();
        let entry = entries.entry(id.clone()).or_insert_with(|| Entry {
            refs: 0,
            generation: 0,
            cancel: CancellationToken::new(),
            task: None,
            requested: tokio::sync::watch::Sender::new(Vec::new()),
        });
        entry.refs += 1;
        if entry.refs == 1 {
            // New, or its previous sync is still stopping: the new sync waits for that one to
            // finish deregistering, so a late deregistration never removes this registration.
            let previous = entry.task.take();
            entry.generation += 1;
            entry.cancel = self.inner.root.child_token();
            let span = info_span!("catalog_source", proxy = %id);
            let run = sync(
                Arc::clone(&self.inner),
                id.clone(),
                token,
                entry.cancel.clone(),
                entry.generation,
                previous,
                entry.requested.subscribe(),
            );
            entry.task = Some(tokio::spawn(run.instrument(span)));
        }
        drop(entries);
        (
            watcher,
            Lease {
                inner: Arc::clone(&self.inner),
                id,
            },
        )
    }

    /// The catalog node of the proxy `request` names: the one it says, else the only node
    /// where a proxy with its id is registered.
    fn node_of(&self, request: &ProxyRequest<'_>) -> Result<String, SourceError> {
        if let Some(node) = request.node_name.filter(|n| !n.is_empty()) {
            return Ok(node.to_owned());
        }
        let state = self.inner.store.read();
        let mut found = state
            .all_services()
            .filter(|(_, s)| s.id == request.proxy_id && (s.kind.is_proxy() || s.connect.native))
            .map(|(n, _)| n.to_owned());
        match (found.next(), found.next()) {
            (Some(n), None) => Ok(n),
            (Some(_), Some(_)) => Err(SourceError::Ambiguous(request.proxy_id.to_owned())),
            (None, _) => Err(SourceError::NotFound(request.proxy_id.to_owned())),
        }
    }

    /// Proxies synced now (with at least one lease).
    pub fn active(&self) -> usize {
        self.inner.entries.lock().values().filter(|e| e.refs > 0).count()
    }

    /// Stops every sync and waits until each has deregistered its proxy.
    pub async fn shutdown(&self) {
        self.inner.root.cancel();
        let tasks: Vec<JoinHandle<()>> = self
            .inner
            .entries
            .lock()
            .values_mut()
            .filter_map(|e| e.task.take())
            .collect();
        for task in tasks {
            let _ = task.await;
        }
    }
}

/// Streams name their proxy by service id and, when the proxy says it, the catalog node;
/// without a node the source looks the id up.
impl SnapshotSource for CatalogSource {
    fn watch(&self, request: &ProxyRequest<'_>) -> Result<(Watcher, SourceLease), SourceError> {
        if request.proxy_id.is_empty() {
            return Err(SourceError::MissingProxyId);
        }
        let node = self.node_of(request)?;
        let (watcher, lease) = CatalogSource::watch(
            self,
            ProxyId::new(node, request.proxy_id.to_owned()),
            request.token.cloned(),
        );
        Ok((watcher, Box::new(lease)))
    }

    fn request_listeners(&self, request: &ProxyRequest<'_>, names: &[String]) {
        let Ok(node) = self.node_of(request) else { return };
        let id = ProxyId::new(node, request.proxy_id.to_owned());
        let mut wanted: Vec<String> = names.iter().filter(|n| !n.is_empty()).cloned().collect();
        wanted.sort();
        wanted.dedup();
        if let Some(entry) = self.inner.entries.lock().get(&id) {
            entry.requested.send_if_modified(|now| {
                let changed = *now != wanted;
                *now = wanted;
                changed
            });
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut entries = self.inner.entries.lock();
        if let Some(entry) = entries.get_mut(&self.id) {
            entry.refs -= 1;
            if entry.refs == 0 {
                entry.cancel.cancel();
            }
        }
    }
}

fn registration(state: &State, id: &ProxyId, token: Option<&Token>, requested: &[String]) -> Option<ProxyRegistration> {
    let svc = state.service(&id.node, &id.service_id)?;
    let svc = if svc.kind.is_proxy() {
        svc
    } else if svc.connect.native {
        Arc::new(proxyless(&svc, requested))
    } else {
        return None;
    };
    let proxy_defaults_entry = state.config_entry(ConfigEntryKind::ProxyDefaults, "global");
    let service_defaults = state.config_entries(ConfigEntryKind::ServiceDefaults);
    let merged = CentralConfig::new(proxy_defaults(proxy_defaults_entry.as_ref()), &service_defaults).merge_into(&svc);
    // When central config changes nothing, the proxy shares the catalog's copy rather than
    // holding one of its own for its life.
    let service = if merged == *svc { svc } else { Arc::new(merged) };
    Some(ProxyRegistration {
        id: id.clone(),
        service,
        token: token.cloned(),
    })
}

/// A connect-native instance as the connect proxy of itself, its upstreams the names its
/// proxyless client asked for (see the module docs). `Connect.Native` stays set: it marks the
/// registration as proxyless.
fn proxyless(svc: &NodeService, requested: &[String]) -> NodeService {
    let mut proxy = svc.clone();
    proxy.kind = ServiceKind::ConnectProxy;
    proxy.proxy.destination_service_name = svc.service.clone();
    proxy.proxy.destination_service_id = svc.id.clone();
    proxy.proxy.local_service_address = svc.address.clone();
    proxy.proxy.local_service_port = svc.port;
    proxy.proxy.upstreams = requested
        .iter()
        .map(|name| Upstream {
            destination_name: name.clone(),
            ..Upstream::default()
        })
        .collect();
    proxy
}

#[allow(clippy::too_many_arguments)]
async fn sync(
    inner: Arc<Inner>,
    id: ProxyId,
    token: Option<Token>,
    cancel: CancellationToken,
    generation: u64,
    previous: Option<JoinHandle<()>>,
    mut requested: tokio::sync::watch::Receiver<Vec<String>>,
) {
    if let Some(previous) = previous {
        let _ = previous.await;
    }
    // What the registration depends on: the proxy's node, the proxy and service defaults
    // (merged into it), and the upstreams its clients asked for. The receivers are kept for
    // the sync's life, and the waits have no timer: a sync parks for as long as its proxy
    // lives, and what it holds while parked is memory per proxy.
    let keys = [
        IndexKey::Node(id.node.clone()),
        IndexKey::ConfigKind(ConfigEntryKind::ProxyDefaults),
        IndexKey::ConfigKind(ConfigEntryKind::ServiceDefaults),
    ];
    let receiver = |key| inner.store.index_receiver(key);
    let (Some(mut node), Some(mut proxy_defaults), Some(mut service_defaults)) =
        (receiver(&keys[0]), receiver(&keys[1]), receiver(&keys[2]))
    else {
        debug!("the store is closing; no catalog sync");
        return;
    };
    let mut registered = false;
    while !cancel.is_cancelled() {
        let state = inner.store.read();
        for (rx, key) in [&mut node, &mut proxy_defaults, &mut service_defaults]
            .into_iter()
            .zip(&keys)
        {
            // Seen as of this read: a change past it wakes the wait below (at once if it is
            // already on the channel but not yet in what was read).
            rx.mark_unchanged();
            if *rx.borrow() > state.index_of(key) {
                rx.mark_changed();
            }
        }
        let wanted = requested.borrow_and_update().clone();
        registered = apply(
            &inner,
            &id,
            registration(&state, &id, token.as_ref(), &wanted),
            registered,
        )
        .await;
        // Not held across the wait: a parked proxy must not pin an old catalog version.
        drop(state);
        let closed = tokio::select! {
            biased;
            () = cancel.cancelled() => break,
            changed = node.changed() => changed.is_err(),
            changed = proxy_defaults.changed() => changed.is_err(),
            changed = service_defaults.changed() => changed.is_err(),
            _ = requested.changed() => false,
        };
        if closed {
            // The store is closing: nothing will change any more.
            cancel.cancelled().await;
            break;
        }
    }
    if registered {
        inner.manager.deregister(&id, ProxySource::Catalog).await;
    }
    let mut entries = inner.entries.lock();
    if entries
        .get(&id)
        .is_some_and(|e| e.generation == generation && e.refs == 0)
    {
        entries.remove(&id);
    }
    debug!("catalog sync stopped");
}

/// Registers the proxy as the catalog has it now (`reg`), or deregisters it once the
/// catalog no longer has it; returns whether it is registered.
async fn apply(inner: &Inner, id: &ProxyId, reg: Option<ProxyRegistration>, registered: bool) -> bool {
    match reg {
        // Boxed: the registration's future is large and needed only for a moment, while
        // the sync's lives as long as the proxy.
        Some(reg) => match Box::pin(inner.manager.register(reg, ProxySource::Catalog, false)).await {
            Ok(_) => true,
            Err(RegisterError::SourceConflict { existing, .. }) => {
                debug!(%existing, "proxy registered by another source; leaving it there");
                registered
            }
            Err(e) => {
                warn!(error = %e, "cannot manage this proxy");
                registered
            }
        },
        None if registered => {
            Box::pin(inner.manager.deregister(id, ProxySource::Catalog)).await;
            false
        }
        None => {
            debug!("no such proxy in the catalog yet");
            false
        }
    }
}

impl proxycfg::ConfigSource for CatalogSource {
    fn shutdown(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(CatalogSource::shutdown(self))
    }
}
