//! The local source: for agents. Every proxy-kind service in the agent's local state is
//! registered with the Manager (source "local") for as long as it is there, whether or not a
//! proxy is connected, as Consul's agent does. The registration has proxy-defaults and
//! service-defaults (upstream defaults included) merged in, read through the agent cache; it is
//! re-registered when the service or those entries change, and deregistered when the service
//! goes. Local registrations take precedence over the catalog source's.

use agent_cache::AgentCaches;
use agent_cache::cache::CacheWatch;
use agent_cache::types::ConfigEntryKey;
use parking_lot::Mutex;
use proxycfg::{
    Manager, ProxyId, ProxyRegistration, ProxyRequest, ProxySource, SnapshotSource, SourceError, SourceLease, Watcher,
};
use std::collections::HashMap;
use std::sync::Arc;
use structs::central_config::{CentralConfig, proxy_defaults};
use structs::{ConfigEntry, ConfigEntryKind, NodeService, Token};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

/// A proxy registered in the agent's local state.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalProxy {
    /// Its registration as the agent holds it (before central config is merged).
    pub service: NodeService,
    /// The token its watches use (none: the agent's).
    pub token: Option<Token>,
}

/// What the local source reads of the agent.
pub trait LocalServices: Send + Sync + 'static {
    /// The agent's node name.
    fn node(&self) -> String;
    /// Every proxy-kind service registered locally.
    fn proxies(&self) -> Vec<LocalProxy>;
    /// Changes whenever the local services may have changed (ends when the agent stops).
    fn subscribe(&self) -> watch::Receiver<u64>;
}

struct Inner {
    manager: Manager,
    local: Arc<dyn LocalServices>,
    node: String,
    /// What each registered proxy was registered with.
    registered: Mutex<HashMap<String, Arc<NodeService>>>,
    /// Why local proxies are not registered yet (central config not read once), if so.
    waiting: Mutex<Option<String>>,
    /// Local proxies the Manager refused, with why (a kind it does not handle yet).
    refused: Mutex<HashMap<String, String>>,
}

/// Keeps the Manager's local registrations equal to the agent's proxies. Cheap to clone.
#[derive(Clone)]
pub struct LocalSource {
    inner: Arc<Inner>,
    stop: CancellationToken,
    task: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl LocalSource {
    /// Starts syncing `local`'s proxies into `manager`, with central config from `caches`.
    pub fn start(manager: Manager, local: Arc<dyn LocalServices>, caches: AgentCaches) -> Self {
        let inner = Arc::new(Inner {
            manager,
            node: local.node(),
            local,
            registered: Mutex::new(HashMap::new()),
            waiting: Mutex::new(Some(
                "proxy-defaults and service-defaults not read from the servers yet".into(),
            )),
            refused: Mutex::new(HashMap::new()),
        });
        let stop = CancellationToken::new();
        let task = tokio::spawn(
            sync(Arc::clone(&inner), caches, stop.clone()).instrument(info_span!("local_source", node = %inner.node)),
        );
        Self {
            inner,
            stop,
            task: Arc::new(Mutex::new(Some(task))),
        }
    }

    /// Ids of the proxies registered now.
    pub fn registered(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.inner.registered.lock().keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Why `proxy_id`, a local proxy, is not registered with the Manager, if it is local: it
    /// waits for central config from the servers (with the last error), or the Manager
    /// refused it.
    pub fn waiting(&self, proxy_id: &str) -> Option<String> {
        if let Some(reason) = self.inner.refused.lock().get(proxy_id) {
            return Some(format!("refused by the proxy config engine: {reason}"));
        }
        let reason = self.inner.waiting.lock().clone()?;
        self.inner
            .local
            .proxies()
            .iter()
            .any(|p| p.service.id == proxy_id)
            .then_some(reason)
    }

    /// Stops syncing and deregisters every proxy it registered.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        let task = self.task.lock().take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

/// Streams name their proxy by service id; it must be registered with this agent (and, when
/// the proxy names a node, on this agent's node).
impl SnapshotSource for LocalSource {
    fn watch(&self, request: &ProxyRequest<'_>) -> Result<(Watcher, SourceLease), SourceError> {
        if request.proxy_id.is_empty() {
            return Err(SourceError::MissingProxyId);
        }
        if let Some(node) = request.node_name.filter(|n| !n.is_empty())
            && node != self.inner.node
        {
            return Err(SourceError::NotFound(format!(
                "{} (on node {node:?}; this agent is node {:?})",
                request.proxy_id, self.inner.node
            )));
        }
        let known = self
            .inner
            .local
            .proxies()
            .iter()
            .any(|p| p.service.id == request.proxy_id);
        if !known {
            return Err(SourceError::NotFound(request.proxy_id.to_owned()));
        }
        if let Some(reason) = self.inner.refused.lock().get(request.proxy_id) {
            return Err(SourceError::Refused {
                proxy: request.proxy_id.to_owned(),
                reason: reason.clone(),
            });
        }
        let id = ProxyId::new(self.inner.node.clone(), request.proxy_id.to_owned());
        // Registrations live as long as the local service, not the stream: nothing to hold.
        Ok((self.inner.manager.watch(&id), Box::new(())))
    }
}

/// The central config every registration merges: the global proxy-defaults entry and every
/// service-defaults entry, as last read through the cache.
struct Defaults {
    proxy: CacheWatch<Option<Arc<ConfigEntry>>>,
    services: CacheWatch<Entries>,
    /// The last proxy-defaults entry (or its absence) and service-defaults entries read.
    latest: (Option<Option<Arc<ConfigEntry>>>, Option<Entries>),
    /// The last error reading them before both were known.
    error: Option<String>,
}

/// Config entries of one kind.
type Entries = Arc<Vec<Arc<ConfigEntry>>>;

impl Defaults {
    /// Waits for the next change of either entry; `false` once the cache has shut down.
    async fn changed(&mut self) -> bool {
        let next = tokio::select! {
            next = self.proxy.next() => next.map(|r| r.map(|f| self.latest.0 = Some(f.value))),
            next = self.services.next() => next.map(|r| r.map(|f| self.latest.1 = Some(f.value))),
        };
        match next {
            None => false,
            Some(Ok(())) => true,
            Some(Err(e)) => {
                warn!(error = %e, "cannot read proxy-defaults/service-defaults: local proxies wait for them");
                self.error = Some(e.to_string());
                true
            }
        }
    }
}

async fn sync(inner: Arc<Inner>, caches: AgentCaches, stop: CancellationToken) {
    let mut changes = inner.local.subscribe();
    let mut defaults = Defaults {
        proxy: caches.config_entry.watch(&ConfigEntryKey {
            kind: ConfigEntryKind::ProxyDefaults,
            name: "global".into(),
        }),
        services: caches.config_entries.watch(&agent_cache::types::ConfigEntriesKey {
            kind: ConfigEntryKind::ServiceDefaults,
            token: None,
        }),
        latest: (None, None),
        error: None,
    };
    let mut local_open = true;
    loop {
        if let (Some(proxy), Some(services)) = &defaults.latest {
            if inner.waiting.lock().take().is_some() {
                info!("central config read: registering the local proxies");
            }
            apply(&inner, proxy.as_ref(), services).await;
        } else if let Some(error) = &defaults.error {
            *inner.waiting.lock() = Some(format!(
                "waiting for proxy-defaults and service-defaults from the servers: {error}"
            ));
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            changed = changes.changed(), if local_open => local_open = changed.is_ok(),
            open = defaults.changed() => if !open { break },
        }
    }
    let ids: Vec<String> = inner.registered.lock().drain().map(|(id, _)| id).collect();
    for id in ids {
        inner
            .manager
            .deregister(&ProxyId::new(inner.node.clone(), id), ProxySource::Local)
            .await;
    }
    debug!("local source stopped");
}

/// Registers what changed, deregisters what went.
async fn apply(inner: &Inner, proxy: Option<&Arc<ConfigEntry>>, services: &[Arc<ConfigEntry>]) {
    let central = CentralConfig::new(proxy_defaults(proxy), services);
    let wanted: HashMap<String, (Arc<NodeService>, Option<Token>)> = inner
        .local
        .proxies()
        .into_iter()
        .map(|p| {
            let merged = Arc::new(central.merge_into(&p.service));
            (p.service.id.clone(), (merged, p.token))
        })
        .collect();
    let gone: Vec<String> = inner
        .registered
        .lock()
        .keys()
        .filter(|id| !wanted.contains_key(*id))
        .cloned()
        .collect();
    for id in gone {
        inner.registered.lock().remove(&id);
        inner.refused.lock().remove(&id);
        let proxy = ProxyId::new(inner.node.clone(), id);
        if inner.manager.deregister(&proxy, ProxySource::Local).await {
            info!(%proxy, "local proxy deregistered");
        }
    }
    for (id, (service, token)) in wanted {
        if inner.registered.lock().get(&id) == Some(&service) {
            continue;
        }
        let registration = ProxyRegistration {
            id: ProxyId::new(inner.node.clone(), id.clone()),
            service: Arc::clone(&service),
            token,
        };
        // Local registrations win over the catalog source's.
        match inner.manager.register(registration, ProxySource::Local, true).await {
            Ok(_) => {
                inner.refused.lock().remove(&id);
                inner.registered.lock().insert(id, service);
            }
            Err(error) => {
                // Remembered, so the same failure is logged once per change, and streams for
                // the proxy are refused with it rather than left without config.
                warn!(proxy = %id, %error, "cannot manage this local proxy");
                inner.refused.lock().insert(id.clone(), error.to_string());
                inner.registered.lock().insert(id, service);
            }
        }
    }
}

impl proxycfg::ConfigSource for LocalSource {
    fn waiting(&self, id: &str) -> Option<String> {
        LocalSource::waiting(self, id)
    }

    fn shutdown(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(LocalSource::shutdown(self))
    }
}
