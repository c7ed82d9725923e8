//! A node's life, written once: [`bind`] its listeners, let the [`Mode`] start its state on
//! the bound addresses, then [`serve`] — the proxy config engine and xDS over the mode's data
//! sources, the HTTP API (the mode's routes, the status views), the mode's background tasks
//! — until the shutdown signal, and drain in order within the grace deadline.
//!
//! The drain: the mode's `draining` (a server releases its parked blocking queries), xDS
//! streams end and the xDS listeners close, the config source and the Manager stop, the
//! mode's `engine_stopped` (an agent leaves), background tasks end, the HTTP listeners
//! close once their requests finish, the mode's `close` (a server closes its store).

use crate::authz::{LocalTokens, StreamTokens, Tokens, with_tokens};
use crate::cli::TlsArgs;
use crate::tls::TlsSettings;
use proxycfg::{ConfigSource, DataSources, Manager, ManagerConfig, SnapshotSource};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, info_span, warn};
use xds::XdsServer;

/// An error of a mode, or of a node's listeners: one line for the command to print.
pub type ModeError = Box<dyn std::error::Error + Send + Sync>;

/// What a node listens on, from its flags.
#[derive(Debug, Clone)]
pub struct Listeners {
    /// The plain HTTP API (none: off).
    pub http: Option<SocketAddr>,
    /// Plain xDS (none: off).
    pub grpc: Option<SocketAddr>,
    /// The TLS listeners and their certificates.
    pub tls: TlsArgs,
    /// Connections one client may hold open on the HTTP APIs (0: no limit).
    pub http_max_conns_per_client: u32,
    /// The HTTP versions the HTTP APIs speak (servers: both; agents: HTTP/1.1).
    pub http_versions: crate::http_serve::Versions,
    /// How many xDS streams, and how fast new ones, are admitted.
    pub admission: xds::Admission,
    /// The DNS interface (none: off) and how it answers.
    pub dns: Option<(SocketAddr, dns::Config)>,
    /// The mode serves names of its own on the gRPC TLS listener ([`Mode::grpc_tls_names`]):
    /// that listener may then run without `-tls-cert-file`, serving only those names.
    pub grpc_tls_own_names: bool,
}

/// The addresses a node's listeners are bound to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bound {
    /// The plain HTTP API.
    pub http_addr: Option<SocketAddr>,
    /// Plain xDS.
    pub grpc_addr: Option<SocketAddr>,
    /// The HTTPS API.
    pub https_addr: Option<SocketAddr>,
    /// xDS over TLS.
    pub grpc_tls_addr: Option<SocketAddr>,
    /// DNS, UDP and TCP.
    pub dns_addr: Option<SocketAddr>,
}

impl Bound {
    /// The ports, as `/v1/agent/self` shows them (`-1`: not listening).
    pub fn ports(&self) -> http_kit::Ports {
        let port = |a: Option<SocketAddr>| a.map_or(-1, |a| i32::from(a.port()));
        http_kit::Ports {
            http: port(self.http_addr),
            https: port(self.https_addr),
            grpc: port(self.grpc_addr),
            grpc_tls: port(self.grpc_tls_addr),
            dns: port(self.dns_addr),
        }
    }

    /// Every bound address.
    pub fn all(&self) -> Vec<SocketAddr> {
        [
            self.http_addr,
            self.grpc_addr,
            self.https_addr,
            self.grpc_tls_addr,
            self.dns_addr,
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// Bound listeners, not yet serving.
pub struct BoundListeners {
    http: Option<TcpListener>,
    grpc: Option<TcpListener>,
    https: Option<TcpListener>,
    grpc_tls: Option<TcpListener>,
    dns: Option<(dns::Bound, dns::Config)>,
    tls: TlsSettings,
    config: Listeners,
    /// Their addresses.
    pub bound: Bound,
}

impl BoundListeners {
    /// The TLS settings loaded from the flags (an agent verifies its servers with its CA).
    pub fn tls(&self) -> &TlsSettings {
        &self.tls
    }
}

/// Loads the TLS flags and binds every listener asked for (`127.0.0.1:0` picks a port).
pub async fn bind(config: Listeners) -> Result<BoundListeners, ModeError> {
    let tls = TlsSettings::load_for(&config.tls, config.grpc_tls_own_names)?;
    let (http, http_addr) = bind_optional(config.http, "").await?;
    let (grpc, grpc_addr) = bind_optional(config.grpc, "xDS ").await?;
    let (https, https_addr) = bind_optional(config.tls.https_addr, "HTTPS ").await?;
    let (grpc_tls, grpc_tls_addr) = bind_optional(config.tls.grpc_tls_addr, "xDS TLS ").await?;
    let dns = match &config.dns {
        Some((addr, dns_config)) => Some((
            dns::bind(*addr)
                .await
                .map_err(|e| format!("cannot listen on {addr} (DNS): {e}"))?,
            dns_config.clone(),
        )),
        None => None,
    };
    let dns_addr = dns.as_ref().map(|(b, _)| b.addr);
    Ok(BoundListeners {
        http,
        grpc,
        https,
        grpc_tls,
        dns,
        tls,
        config,
        bound: Bound {
            http_addr,
            grpc_addr,
            https_addr,
            grpc_tls_addr,
            dns_addr,
        },
    })
}

async fn bind_optional(
    addr: Option<SocketAddr>,
    what: &str,
) -> Result<(Option<TcpListener>, Option<SocketAddr>), ModeError> {
    let Some(addr) = addr else {
        return Ok((None, None));
    };
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        format!(
            "cannot listen on {addr}{}: {e}",
            if what.is_empty() {
                String::new()
            } else {
                format!(" ({})", what.trim())
            }
        )
    })?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("reading the bound {what}address: {e}"))?;
    Ok((Some(listener), Some(bound)))
}

/// The proxy config engine of a node: the Manager over the mode's data sources, the mode's
/// config source, and the xDS server serving them.
#[derive(Clone)]
pub struct Engine {
    /// The proxies' States.
    pub manager: Manager,
    /// The xDS server.
    pub xds: XdsServer,
    /// What registers proxies (the mode's config source).
    pub source: Arc<dyn ConfigSource>,
    /// The mode's own gRPC services, served beside xDS on the gRPC listeners.
    pub grpc: tonic::service::Routes,
    /// The mode's own names on the gRPC TLS listener.
    pub tls_names: Option<Arc<dyn crate::tls::ServerNames>>,
}

/// What a server or an agent plugs into a node (see the module docs). Every method is
/// called once, in the order listed.
#[async_trait::async_trait]
pub trait Mode: Send + Sync + 'static {
    /// `server` or `agent`, in log lines.
    fn name(&self) -> &'static str;

    /// The node's name (the xDS server name Envoy sees).
    fn node_name(&self) -> String;

    /// The Manager's settings: datacenter, what intentions decide when none matches.
    fn manager_config(&self) -> ManagerConfig;

    /// The data sources proxies' States watch.
    fn data_sources(&self) -> DataSources;

    /// Resolves tokens: HTTP callers, CSDS, xDS streams.
    fn tokens(&self) -> Tokens;

    /// Tokens this node issued for its own proxies, checked before [`Mode::tokens`].
    fn local_tokens(&self) -> Option<Arc<dyn LocalTokens>> {
        None
    }

    /// The config source that registers proxies with `manager` (the catalog source, the
    /// local source).
    fn config_source(&self, manager: &Manager) -> Arc<dyn ConfigSource>;

    /// Mode-specific settings of the xDS server.
    fn configure_xds(&self, _xds: &XdsServer) {}

    /// gRPC services of the mode's own, served beside xDS (a server's peering service).
    fn grpc_routes(&self) -> tonic::service::Routes {
        tonic::service::Routes::default()
    }

    /// Names the gRPC TLS listener serves with the mode's own certificates, chosen by the
    /// client's SNI (a server's peering name); other clients get `-tls-cert-file`'s.
    fn grpc_tls_names(&self) -> Option<Arc<dyn crate::tls::ServerNames>> {
        None
    }

    /// What the DNS interface answers from (as the node's default token may read).
    fn dns_catalog(&self) -> Arc<dyn dns::Catalog>;

    /// The mode's HTTP routes. The node adds the status views and `/v1/agent/metrics`.
    fn routes(&self, engine: &Engine) -> axum::Router;

    /// Registers the mode's metrics, served at `/v1/agent/metrics` after the engine's (xDS,
    /// Manager, process).
    fn register_metrics(&self, _registry: &mut prometheus_client::registry::Registry) {}

    /// Starts the mode's background work on `tasks`; it ends when `stop` fires.
    fn spawn(&self, engine: &Engine, tasks: &TaskTracker, stop: CancellationToken);

    /// The drain's first step, before xDS streams end.
    async fn draining(&self) {}

    /// After the proxies' States stopped.
    async fn engine_stopped(&self) {}

    /// Last, after the listeners closed.
    async fn close(&self) {}
}

/// A listener's task, awaited at the end of the drain.
type Served = acl::BoxFuture<'static, Result<(), ModeError>>;

/// Runs the node until `shutdown` completes, then drains (see the module docs) within
/// [`crate::shutdown::GRACE`]. `on_ready` is called once every listener serves.
pub async fn serve<M: Mode>(
    listeners: BoundListeners,
    mode: M,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce(&Bound),
) -> Result<(), ModeError> {
    serve_with_grace(listeners, mode, shutdown, on_ready, crate::shutdown::GRACE).await
}

/// As [`serve`], with another grace deadline.
pub async fn serve_with_grace<M: Mode>(
    listeners: BoundListeners,
    mode: M,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce(&Bound),
    grace: Duration,
) -> Result<(), ModeError> {
    let engine = start_engine(&mode, listeners.config.admission);
    let tokens = mode.tokens();
    let mut registry = crate::engine::engine_registry(&engine.xds, &engine.manager);
    mode.register_metrics(&mut registry);
    let metrics = crate::metrics::router(registry, mode.node_name());
    let waiting = {
        let source = Arc::clone(&engine.source);
        Arc::new(move |id: &str| source.waiting(id))
    };
    let status = crate::status::router(engine.manager.clone(), engine.xds.clone(), waiting);
    // `PUT /v1/agent/leave` ends serving as the first signal would.
    let leave = CancellationToken::new();
    // Open log streams (`/v1/agent/monitor`) end when shutting down starts.
    let streams_stop = CancellationToken::new();
    // The node's own routes; the mode's refuse `?filter=` where they do not filter, so do these.
    let own = status
        .merge(metrics)
        .merge(crate::version::router())
        .merge(crate::host::router(mode.node_name(), leave.clone()))
        .merge(crate::monitor::router(mode.node_name(), streams_stop.clone()))
        .layer(axum::middleware::from_fn(http_kit::refuse_filter));
    // Headers past the cap are refused by `http_serve` before the router.
    let app = with_tokens(mode.routes(&engine).merge(own), tokens);
    let (xds_stop, http_stop) = (CancellationToken::new(), CancellationToken::new());
    let running = start_listeners(listeners, &engine, app, mode.dns_catalog(), &xds_stop, &http_stop)?;
    info!(
        http_addr = ?running.bound.http_addr,
        grpc_addr = ?running.bound.grpc_addr,
        https_addr = ?running.bound.https_addr,
        grpc_tls_addr = ?running.bound.grpc_tls_addr,
        dns_addr = ?running.bound.dns_addr,
        node = %mode.node_name(),
        "meshd {} ready",
        mode.name()
    );
    on_ready(&running.bound);
    let tasks = TaskTracker::new();
    let tasks_stop = CancellationToken::new();
    mode.spawn(&engine, &tasks, tasks_stop.clone());

    tokio::select! {
        () = shutdown => {}
        () = leave.cancelled() => {}
    }
    info!("shutting down");
    streams_stop.cancel();
    let second = crate::shutdown::second_signal();
    let drain = tokio::time::timeout(grace, async {
        mode.draining().await;
        // Streams never end on their own: they end first, then the xDS listeners close.
        engine.xds.shutdown().await;
        xds_stop.cancel();
        engine.source.shutdown().await;
        engine.manager.shutdown().await;
        mode.engine_stopped().await;
        tasks_stop.cancel();
        tasks.close();
        tasks.wait().await;
        http_stop.cancel();
        let served = running.wait().await;
        mode.close().await;
        served
    });
    let drained = tokio::select! {
        drained = drain => Some(drained),
        () = second => None,
    };
    // Whatever the drain did not reach stops now: nothing serves past this call.
    for stop in [&xds_stop, &tasks_stop, &http_stop] {
        stop.cancel();
    }
    let Some(drained) = drained else {
        warn!("second signal: exiting without finishing the shutdown");
        return Err("a second signal ended the shutdown before it finished".into());
    };
    match drained {
        Ok(served) => {
            info!("meshd {} stopped", mode.name());
            served
        }
        Err(_) => {
            warn!(
                ?grace,
                "the shutdown did not finish within its grace deadline: exiting now"
            );
            Err(format!("the shutdown did not finish within {grace:?}").into())
        }
    }
}

/// The Manager over the mode's data sources, the mode's config source, and the xDS server
/// (streams authorized by the mode's tokens when ACLs are on).
fn start_engine<M: Mode>(mode: &M, admission: xds::Admission) -> Engine {
    let manager = Manager::new(mode.manager_config(), mode.data_sources());
    let source = mode.config_source(&manager);
    let tokens = mode.tokens();
    let snapshots: Arc<dyn SnapshotSource> = Arc::clone(&source) as Arc<dyn SnapshotSource>;
    let xds = if tokens.enabled() {
        let authorizer = StreamTokens::new(Arc::clone(&tokens), mode.local_tokens());
        XdsServer::with_authorizer(snapshots, admission, Arc::new(authorizer))
    } else {
        XdsServer::with_admission(snapshots, admission)
    };
    crate::authz::guard_csds(&xds, tokens);
    xds.set_server_name(&mode.node_name());
    mode.configure_xds(&xds);
    Engine {
        manager,
        xds,
        source,
        grpc: mode.grpc_routes(),
        tls_names: mode.grpc_tls_names(),
    }
}

/// The listeners being served.
struct Running {
    bound: Bound,
    served: Vec<(&'static str, Served)>,
}

impl Running {
    /// Waits for every listener's task; the first failure is the answer.
    async fn wait(self) -> Result<(), ModeError> {
        let mut first = Ok(());
        for (what, task) in self.served {
            let result = task.await.map_err(|e| format!("serving {what}: {e}").into());
            if first.is_ok() {
                first = result;
            }
        }
        first
    }
}

/// Serves every bound listener: the HTTP API on the plain and HTTPS ones, xDS on the plain
/// and TLS ones. The xDS ones stop with `xds_stop`, the HTTP ones with `http_stop`.
fn start_listeners(
    listeners: BoundListeners,
    engine: &Engine,
    app: impl crate::http_serve::App,
    dns_catalog: Arc<dyn dns::Catalog>,
    xds_stop: &CancellationToken,
    http_stop: &CancellationToken,
) -> Result<Running, ModeError> {
    let BoundListeners {
        http,
        grpc,
        https,
        grpc_tls,
        dns,
        tls,
        config,
        mut bound,
    } = listeners;
    let (per_client, versions) = (config.http_max_conns_per_client, config.http_versions);
    let mut served: Vec<(&'static str, Served)> = Vec::new();
    if let (Some(listener), Some(server)) = (https, &tls.server) {
        let mut https_config = (*server.http).clone();
        https_config.alpn_protocols = versions.alpn();
        let (addr, task) = crate::tls::listener::serve_https(
            listener,
            Arc::new(https_config),
            per_client,
            app.clone(),
            versions,
            http_stop.clone(),
        )
        .map_err(|e| format!("starting the HTTPS API: {e}"))?;
        bound.https_addr = Some(addr);
        served.push(("HTTPS", boxed(task)));
    }
    if let Some(listener) = grpc_tls {
        let certs = crate::tls::Certs {
            default: tls.server.as_ref().map(|s| Arc::clone(&s.grpc)),
            names: engine.tls_names.clone(),
        };
        if certs.default.is_none() && certs.names.is_none() {
            return Err("-grpc-tls-addr needs -tls-cert-file and -tls-key-file".into());
        }
        let (addr, task) = crate::engine::serve_xds_tls(listener, certs, &engine.xds, &engine.grpc, xds_stop.clone())
            .map_err(|e| format!("starting xDS over TLS: {e}"))?;
        bound.grpc_tls_addr = Some(addr);
        served.push(("xDS over TLS", boxed(task)));
    }
    if let (Some(listener), Some(addr)) = (http, bound.http_addr) {
        let task = tokio::spawn(
            crate::http_serve::serve_plain(listener, per_client, app, versions, http_stop.clone())
                .instrument(info_span!("http_api", http_addr = %addr)),
        );
        served.push(("HTTP", boxed(task)));
    }
    if let (Some(listener), Some(addr)) = (grpc, bound.grpc_addr) {
        served.push((
            "xDS",
            boxed(crate::engine::serve_xds(
                listener,
                addr,
                &engine.xds,
                &engine.grpc,
                xds_stop.clone(),
            )),
        ));
    }
    if let Some((listener, dns_config)) = dns {
        let addr = listener.addr;
        // DNS stops with the HTTP API, last: names resolve while proxies drain.
        let task = tokio::spawn(
            dns::serve(listener, Arc::new(dns_config), dns_catalog, http_stop.clone())
                .instrument(info_span!("dns", dns_addr = %addr)),
        );
        served.push((
            "DNS",
            Box::pin(async move { task.await.map_err(|e| Box::new(e) as ModeError) }),
        ));
    }
    Ok(Running { bound, served })
}

/// A listener's task with its error made a [`ModeError`].
fn boxed<E: std::error::Error + Send + Sync + 'static>(task: JoinHandle<Result<(), E>>) -> Served {
    Box::pin(async move {
        match task.await {
            Ok(r) => r.map_err(|e| Box::new(e) as ModeError),
            Err(e) => Err(Box::new(e) as ModeError),
        }
    })
}

#[cfg(test)]
mod tests;
