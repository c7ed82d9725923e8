//! `meshd agent`: reads flags and config files, starts the agent, its HTTP API and its xDS
//! server (the proxies on this host, configured from the agent cache), reloads the config
//! files' services and checks on SIGHUP, and on SIGINT/SIGTERM leaves (unless
//! `-leave-on-terminate=false`) and stops.

use crate::cli::AgentArgs;
use ::agent::config_file::FileConfig;
use ::agent::{Agent, AgentConfig};
use agent_cache::AgentCaches;
use anyhow::{Context, Result, anyhow, bail};
use proxycfg::{Manager, ManagerConfig};
use proxycfg_glue::LocalChecks;
use proxycfg_sources::{LocalProxy, LocalServices, LocalSource};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};
use xds::XdsServer;

/// A running agent's addresses, for callers that embed it.
pub struct RunningAgent {
    /// The bound HTTP address.
    pub http_addr: SocketAddr,
    /// The bound xDS address.
    pub grpc_addr: SocketAddr,
    /// The bound HTTPS address (`-https-addr`).
    pub https_addr: Option<SocketAddr>,
    /// The bound xDS over TLS address (`-grpc-tls-addr`).
    pub grpc_tls_addr: Option<SocketAddr>,
}

fn default_advertise() -> String {
    supervisor::node::private_ips_now()
        .and_then(|ips| ips.into_iter().find(std::net::IpAddr::is_ipv4))
        .map_or_else(|| "127.0.0.1".to_owned(), |ip| ip.to_string())
}

/// A token from a file (none: empty). Tokens never come from the command line.
fn read_token(path: Option<&std::path::Path>, flag: &str) -> Result<String> {
    match path {
        None => Ok(String::new()),
        Some(p) => Ok(std::fs::read_to_string(p)
            .with_context(|| format!("{flag}: cannot read {}", p.display()))?
            .trim()
            .to_owned()),
    }
}

/// The servers to join, in order: each `-retry-join` (or config file `retry_join`) value is
/// one address or several, comma-separated.
fn server_list<'a>(values: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    values
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The config files' node metadata with each `-node-meta KEY:VALUE` over it.
fn node_meta(args: &AgentArgs, file: &FileConfig) -> Result<std::collections::BTreeMap<String, String>> {
    let mut node_meta = file.node_meta.clone();
    for kv in &args.node_meta {
        let Some((k, v)) = kv.split_once(':') else {
            bail!("-node-meta {kv:?}: expected KEY:VALUE");
        };
        node_meta.insert(k.to_owned(), v.to_owned());
    }
    Ok(node_meta)
}

/// The ports sidecars and managed proxies registered without one get: `-sidecar-min-port`
/// and `-sidecar-max-port`, else the config files' `ports`, else Consul's 21000-21255.
fn sidecar_ports(args: &AgentArgs, file: &FileConfig) -> Result<std::ops::RangeInclusive<u16>> {
    let min = args.sidecar_min_port.or(file.ports.sidecar_min_port).unwrap_or(21000);
    let max = args.sidecar_max_port.or(file.ports.sidecar_max_port).unwrap_or(21255);
    if min == 0 {
        bail!("-sidecar-min-port (config file ports.sidecar_min_port) must be a port, not 0");
    }
    if min > max {
        bail!(
            "-sidecar-min-port {min} is above -sidecar-max-port {max} (or config file ports.sidecar_min_port/sidecar_max_port): the sidecar port range is empty"
        );
    }
    Ok(min..=max)
}

/// Flags and files merged: a flag wins over a file, a file over the default.
struct Settings {
    agent: AgentConfig,
    http_addr: SocketAddr,
    grpc_addr: SocketAddr,
    leave_on_terminate: bool,
    allow_managed_root: bool,
    envoy_binary: Option<PathBuf>,
    tls: crate::tls::TlsSettings,
    file: FileConfig,
}

fn settings(args: &AgentArgs) -> Result<Settings> {
    let tls = crate::tls::TlsSettings::load(&args.tls)?;
    let file = FileConfig::load(&args.config_file)?;
    let dev = args.dev || file.dev.unwrap_or(false);
    let data_dir: Option<PathBuf> = args.data_dir.clone().or_else(|| file.data_dir.clone());
    match (&data_dir, dev) {
        (None, false) => bail!("one of -data-dir or -dev is required"),
        (Some(_), true) => bail!("-data-dir and -dev exclude each other: -dev keeps state in memory"),
        _ => {}
    }
    let parse_addr =
        |flag: Option<SocketAddr>, from_file: &Option<String>, name: &str, default: &str| match (flag, from_file) {
            (Some(a), _) => Ok(a),
            (None, Some(s)) => s
                .parse()
                .with_context(|| format!("config file {name}: {s:?} is not an address")),
            (None, None) => default.parse().context("default address"),
        };
    let http_addr = parse_addr(args.http_addr, &file.http_addr, "http_addr", "127.0.0.1:8500")?;
    let grpc_addr = parse_addr(args.grpc_addr, &file.grpc_addr, "grpc_addr", "127.0.0.1:8502")?;
    let servers = server_list(args.retry_join.iter().chain(&file.retry_join));
    if servers.is_empty() {
        bail!("no server to join: give -retry-join ADDR (a server's HTTP address)");
    }
    let check_allowed_targets = allowed_targets(args, &file)?;
    let agent = AgentConfig {
        node_meta: node_meta(args, &file)?,
        node: args
            .node
            .clone()
            .or_else(|| file.node.clone())
            .unwrap_or_else(crate::host_name),
        datacenter: args
            .datacenter
            .clone()
            .or_else(|| file.datacenter.clone())
            .unwrap_or_else(|| "dc1".into()),
        advertise: args
            .advertise
            .clone()
            .or_else(|| file.advertise.clone())
            .unwrap_or_else(default_advertise),
        data_dir: if dev { None } else { data_dir },
        servers,
        sync: ::agent::SyncConfig {
            full_interval: args.sync_interval,
            ..::agent::SyncConfig::default()
        },
        managed_sidecars: args.managed_sidecars || file.managed_sidecars.unwrap_or(false),
        allow_managed_api_registration: args.allow_managed_api_registration
            || file.allow_managed_api_registration.unwrap_or(false),
        acl: ::agent::acl::AclConfig {
            enabled: args.acl_enabled,
            default_allow: args.acl_default_policy == "allow",
            agent_token: read_token(args.acl_agent_token_file.as_deref(), "-acl-agent-token-file")?,
            default_token: read_token(args.acl_default_token_file.as_deref(), "-acl-default-token-file")?,
        },
        servers_ca_pem: tls.ca_pem.clone(),
        check_allowed_targets,
        sidecar_ports: sidecar_ports(args, &file)?,
        ..AgentConfig::default()
    };
    if args.sync_interval.is_zero() {
        bail!("-sync-interval must be above zero");
    }
    Ok(Settings {
        agent,
        http_addr,
        grpc_addr,
        leave_on_terminate: args.leave_on_terminate.or(file.leave_on_terminate).unwrap_or(true),
        allow_managed_root: args.allow_managed_root || file.allow_managed_root.unwrap_or(false),
        envoy_binary: args.envoy_binary.clone().or_else(|| file.envoy_binary.clone()),
        tls,
        file,
    })
}

/// `-check-allowed-targets` and the files' `check_allowed_targets`, together.
fn allowed_targets(args: &AgentArgs, file: &FileConfig) -> Result<Vec<::agent::check_targets::Cidr>> {
    let mut out = Vec::new();
    for list in args.check_allowed_targets.iter().chain(&file.check_allowed_targets) {
        out.extend(::agent::check_targets::Cidr::parse_list(list).map_err(|e| anyhow!("-check-allowed-targets: {e}"))?);
    }
    Ok(out)
}

/// Runs an agent until `shutdown` completes. Logging is set up here, once the config files
/// (which may set the log level) are read. `on_ready` is called once the HTTP API listens.
pub async fn run(
    args: AgentArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce(&RunningAgent),
) -> Result<()> {
    let loaded = settings(&args);
    let (level, json) = match &loaded {
        Ok(s) => (
            args.log_level.clone().or_else(|| s.file.log_level.clone()),
            args.log_json || s.file.log_json.unwrap_or(false),
        ),
        Err(_) => (args.log_level.clone(), args.log_json),
    };
    crate::init_logging(level.as_deref().unwrap_or("info"), json);
    let Settings {
        agent: config,
        http_addr,
        grpc_addr,
        leave_on_terminate,
        allow_managed_root,
        envoy_binary,
        tls,
        file,
    } = loaded?;
    let listener = TcpListener::bind(http_addr)
        .await
        .with_context(|| format!("cannot listen on {http_addr}"))?;
    let http_addr = listener.local_addr().context("reading the bound address")?;
    let grpc_listener = TcpListener::bind(grpc_addr)
        .await
        .with_context(|| format!("cannot listen on {grpc_addr} (xDS)"))?;
    let grpc_addr = grpc_listener.local_addr().context("reading the bound xDS address")?;
    let https_listener = match args.tls.https_addr {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (HTTPS)"))?,
        ),
        None => None,
    };
    let grpc_tls_listener = match args.tls.grpc_tls_addr {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (xDS TLS)"))?,
        ),
        None => None,
    };
    let node = config.node.clone();
    let datacenter = config.datacenter.clone();
    // Checks registered through the API never probe the agent's own listeners.
    let mut config = config;
    config.listeners = [&https_listener, &grpc_tls_listener]
        .map(|l| l.as_ref().and_then(|l| l.local_addr().ok()))
        .into_iter()
        .flatten()
        .chain([http_addr, grpc_addr])
        .collect();
    let agent = Agent::start(config).await?;
    if let Err(e) = agent.load_config(file.services, file.checks).await {
        agent.shutdown().await;
        bail!("config files: {e}");
    }
    let engine = AgentEngine::start(
        &agent,
        &datacenter,
        crate::engine::admission(args.xds_max_streams, args.xds_setup_rate),
    );
    let managed = ::agent::managed::ManagedConfig {
        data_dir: agent.config().data_dir.clone(),
        allow_root: allow_managed_root,
        program: std::env::current_exe().context("locating the meshd binary for managed proxies")?,
        http_addr,
        grpc_addr,
        envoy_binary,
        drain_time: std::time::Duration::from_secs(2),
    };
    if let Err(e) = agent.start_managed(managed) {
        agent.shutdown().await;
        bail!("managed proxies: {e}");
    }
    let stop = CancellationToken::new();
    let grpc_stop = CancellationToken::new();
    let token_acl: crate::engine::TokenAcl = {
        let acl = Arc::clone(agent.acl());
        Arc::new(move |token: Option<String>| {
            let acl = Arc::clone(&acl);
            Box::pin(async move {
                let token = token
                    .filter(|t| !t.is_empty())
                    .unwrap_or_else(|| acl.default_token().to_owned());
                acl.resolve(Some(&token))
                    .await
                    .map(|r| r.authz)
                    .map_err(|e| e.to_string())
            })
        })
    };
    crate::engine::guard_csds(&engine.xds, Arc::clone(&token_acl));
    engine.xds.set_server_name(&agent.config().node);
    let app = ::agent::http::router(agent.clone())
        .merge(engine.metrics_router(Arc::clone(&token_acl), agent.config().node.clone()))
        .merge(crate::engine::status_router(
            engine.manager.clone(),
            engine.xds.clone(),
            {
                let source = engine.source.clone();
                Arc::new(move |id: &str| source.waiting(id))
            },
            token_acl,
        ))
        .layer(axum::middleware::from_fn(crate::header_cap::cap));
    let http_conn_limit = args.http_max_conns_per_client;
    let (https_addr, https) = match (https_listener, &tls.server) {
        (Some(listener), Some(server)) => {
            let (addr, task) = crate::tls::listener::serve_https(
                listener,
                Arc::clone(&server.http),
                http_conn_limit,
                app.clone(),
                stop.clone(),
            )
            .context("starting the HTTPS API")?;
            (Some(addr), Some(task))
        }
        _ => (None, None),
    };
    let (grpc_tls_addr, grpc_tls) = match (grpc_tls_listener, &tls.server) {
        (Some(listener), Some(server)) => {
            let (addr, task) =
                crate::engine::serve_xds_tls(listener, Arc::clone(&server.grpc), &engine.xds, grpc_stop.clone())
                    .context("starting xDS over TLS")?;
            (Some(addr), Some(task))
        }
        _ => (None, None),
    };
    // Before the ready line: SIGHUP's default action would end the agent.
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    info!(%http_addr, %grpc_addr, ?https_addr, ?grpc_tls_addr, %node, servers = ?agent.servers().addresses(), "meshd agent ready");
    on_ready(&RunningAgent {
        http_addr,
        grpc_addr,
        https_addr,
        grpc_tls_addr,
    });

    let http = tokio::spawn(
        crate::http_serve::serve_plain(listener, http_conn_limit, app, stop.clone())
            .instrument(info_span!("agent_http")),
    );
    let grpc = crate::engine::serve_xds(grpc_listener, grpc_addr, &engine.xds, grpc_stop.clone());
    let reload_stop = stop.clone();
    let reload_agent = agent.clone();
    let config_files = args.config_file.clone();
    let reload = tokio::spawn(
        async move { reload_on_sighup(reload_agent, config_files, hup, reload_stop).await }
            .instrument(info_span!("reload")),
    );

    shutdown.await;
    info!("shutting down");
    // Streams end first (they never end on their own) and the xDS listener closes, then the
    // proxies and the cache.
    engine.xds.shutdown().await;
    grpc_stop.cancel();
    engine.shutdown().await;
    agent.shutdown().await;
    if leave_on_terminate {
        match agent.leave().await {
            Ok(()) => info!("left: the node is removed from the catalog"),
            Err(error) => warn!(%error, "could not leave: the servers will mark this node critical"),
        }
    }
    stop.cancel();
    reload.await.context("reload task")?;
    grpc.await.context("xDS server task")?.context("serving xDS")?;
    if let Some(task) = grpc_tls {
        task.await
            .context("xDS TLS server task")?
            .context("serving xDS over TLS")?;
    }
    http.await.context("HTTP server task")?.context("serving HTTP")?;
    if let Some(task) = https {
        task.await.context("HTTPS server task")?.context("serving HTTPS")?;
    }
    info!("meshd agent stopped");
    Ok(())
}

/// The agent's proxy config engine: the agent cache, the Manager over the `Cache*` data
/// sources, the local source registering the agent's proxies, and the xDS server.
struct AgentEngine {
    caches: AgentCaches,
    manager: Manager,
    source: LocalSource,
    xds: XdsServer,
}

impl AgentEngine {
    fn start(agent: &Agent, datacenter: &str, admission: xds::Admission) -> Self {
        let caches = agent.caches().clone();
        let local = Arc::new(AgentLocal(agent.clone()));
        let manager = Manager::new(
            ManagerConfig {
                datacenter: datacenter.to_owned(),
                intention_default_allow: agent.acl().intention_default_allow(),
                ..ManagerConfig::default()
            },
            proxycfg_glue::cache_data_sources(caches.clone(), Arc::clone(&local) as Arc<dyn LocalChecks>),
        );
        let source = LocalSource::start(manager.clone(), local, caches.clone());
        let xds = if agent.acl().enabled() {
            let authorizer = AgentStreamAuthorizer(agent.clone());
            XdsServer::with_authorizer(Arc::new(source.clone()), admission, Arc::new(authorizer))
        } else {
            XdsServer::with_admission(Arc::new(source.clone()), admission)
        };
        Self {
            caches,
            manager,
            source,
            xds,
        }
    }

    /// `GET /v1/agent/metrics?format=prometheus`: the cache's, the xDS server's and the
    /// Manager's metrics (the agent's other endpoints are answered by the agent's router).
    /// It needs `agent:read` on this agent's node, as Consul's.
    fn metrics_router(&self, acl: crate::engine::TokenAcl, node: String) -> axum::Router {
        let mut registry = crate::engine::engine_registry(&self.xds, &self.manager);
        self.caches.register_metrics(&mut registry);
        let registry = Arc::new(registry);
        axum::Router::new().route(
            "/v1/agent/metrics",
            axum::routing::get(
                move |axum::extract::RawQuery(q): axum::extract::RawQuery, headers: axum::http::HeaderMap| {
                    let registry = Arc::clone(&registry);
                    let (acl, node) = (Arc::clone(&acl), node.clone());
                    async move {
                        use axum::response::IntoResponse;
                        let token = crate::engine::request_token(&headers, q.as_deref());
                        match acl(token).await {
                            Ok(a) if a.agent_read(&node) => metrics(&registry, q.as_deref()),
                            Ok(_) => (
                                axum::http::StatusCode::FORBIDDEN,
                                format!("{}: this needs 'agent:read' on {node:?}\n", ::acl::PERMISSION_DENIED),
                            )
                                .into_response(),
                            Err(e) => (axum::http::StatusCode::FORBIDDEN, format!("{e}\n")).into_response(),
                        }
                    }
                },
            ),
        )
    }

    /// Stops the local source (deregistering its proxies) and the proxies' States (the cache
    /// is the agent's, stopped with it).
    async fn shutdown(self) {
        self.source.shutdown().await;
        self.manager.shutdown().await;
    }
}

fn metrics(registry: &prometheus_client::registry::Registry, query: Option<&str>) -> axum::response::Response {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    let prometheus = query.is_some_and(|q| q.split('&').any(|kv| kv == "format=prometheus"));
    if !prometheus {
        return (
            StatusCode::BAD_REQUEST,
            "format: this agent serves its metrics as Prometheus text: add ?format=prometheus\n",
        )
            .into_response();
    }
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        return (StatusCode::INTERNAL_SERVER_ERROR, "encoding the metrics failed\n").into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

/// Authorizes the agent's xDS streams: a managed proxy's local token for that proxy's
/// service, else a token with `service:write` on it (asked of the servers, cached).
struct AgentStreamAuthorizer(Agent);

impl xds::StreamAuthorizer for AgentStreamAuthorizer {
    fn authorize(
        &self,
        token: &str,
        service: &str,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<xds::Authorization, String>> + Send>> {
        let agent = self.0.clone();
        let (token, service) = (token.to_owned(), service.to_owned());
        Box::pin(async move {
            if !token.is_empty() {
                let local = agent.state().services().into_values().find(|s| {
                    s.managed
                        .as_ref()
                        .is_some_and(|m| !m.local_token.is_empty() && m.local_token == token)
                });
                if let Some(proxy) = local {
                    let serves = &proxy.service.proxy.destination_service_name;
                    return if *serves == service {
                        Ok(xds::Authorization { expires: None })
                    } else {
                        Err(format!(
                            "{}: the local token of proxy {:?} is for {serves:?}, not {service:?}",
                            ::acl::PERMISSION_DENIED,
                            proxy.service.id
                        ))
                    };
                }
            }
            let token = if token.is_empty() {
                agent.acl().default_token().to_owned()
            } else {
                token
            };
            let who = agent.acl().resolve(Some(&token)).await.map_err(|e| e.to_string())?;
            if who.authz.service_write(&service) {
                Ok(xds::Authorization { expires: who.expires })
            } else {
                Err(::acl::denied(&who.accessor, "service:write", &service))
            }
        })
    }

    fn changed(&self) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(self.0.acl().changed())
    }
}

/// The agent's local state as the proxy config engine reads it.
struct AgentLocal(Agent);

impl LocalServices for AgentLocal {
    fn node(&self) -> String {
        self.0.config().node.clone()
    }

    fn proxies(&self) -> Vec<LocalProxy> {
        self.0
            .state()
            .services()
            .into_values()
            .filter(|s| s.service.kind.is_proxy())
            .map(|s| LocalProxy {
                service: s.service,
                token: s.token,
            })
            .collect()
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.state().subscribe()
    }
}

impl LocalChecks for AgentLocal {
    fn http_checks(&self, service_id: &str) -> Vec<structs::HealthCheck> {
        self.0
            .state()
            .service_checks(service_id)
            .into_iter()
            .filter(|c| c.check_type == "http")
            .collect()
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.state().subscribe()
    }
}

/// Re-reads the config files on every SIGHUP; a file that cannot be used changes nothing and
/// is logged.
async fn reload_on_sighup(
    agent: Agent,
    files: Vec<PathBuf>,
    hup: std::io::Result<tokio::signal::unix::Signal>,
    stop: CancellationToken,
) {
    let Ok(mut hup) = hup else {
        warn!("cannot listen for SIGHUP: config files are read at start only");
        return;
    };
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            got = hup.recv() => if got.is_none() { return },
        }
        info!("SIGHUP: reloading the config files' services and checks");
        let result = match FileConfig::load(&files) {
            Ok(file) => agent
                .load_config(file.services, file.checks)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match result {
            Ok(()) => info!("config reloaded"),
            Err(error) => warn!(%error, "config not reloaded: nothing changed"),
        }
    }
}
