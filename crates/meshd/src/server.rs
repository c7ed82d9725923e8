//! `meshd server`: opens the store, serves the HTTP API and xDS, and shuts down cleanly on a
//! signal.

use crate::cli::ServerArgs;
use anyhow::{Context, Result, bail};
use catalog::{Store, StoreConfig};
use http_api::ApiConfig;
use proxycfg::{Manager, ManagerConfig};
use proxycfg_sources::CatalogSource;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span};
use xds::XdsServer;

/// A running server's addresses, for callers that embed it.
pub struct Running {
    /// The bound plain HTTP address (none with `-http-addr off`).
    pub http_addr: Option<SocketAddr>,
    /// The bound plain xDS address (none with `-grpc-addr off`).
    pub grpc_addr: Option<SocketAddr>,
    /// The bound HTTPS address (`-https-addr`).
    pub https_addr: Option<SocketAddr>,
    /// The bound xDS over TLS address (`-grpc-tls-addr`).
    pub grpc_tls_addr: Option<SocketAddr>,
}

/// Runs a server until `shutdown` completes: xDS streams end, in-flight HTTP requests finish,
/// the store closes. `on_ready` is called once both listeners are bound.
pub async fn run(
    args: ServerArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce(&Running),
) -> Result<()> {
    let tls = crate::tls::TlsSettings::load(&args.tls)?;
    check_listeners(&args, tls.server.is_some())?;
    let (listener, http_addr) = bind_optional(args.http_addr.0, "").await?;
    let (grpc_listener, grpc_addr) = bind_optional(args.grpc_addr.0, "xDS ").await?;
    let (https_listener, https_bound) = bind_optional(args.tls.https_addr, "HTTPS ").await?;
    let (grpc_tls_listener, grpc_tls_bound) = bind_optional(args.tls.grpc_tls_addr, "xDS TLS ").await?;
    // What this server is known by: its plain listeners, else its TLS ones.
    let (api_addr, xds_addr) = (
        http_addr.or(https_bound).unwrap_or_else(unspecified),
        grpc_addr.or(grpc_tls_bound).unwrap_or_else(unspecified),
    );
    let store = open_store(&args, api_addr, xds_addr).await?;
    let acl = Arc::new(catalog::acl::Resolver::new(catalog::acl::AclSettings {
        enabled: args.acl_enabled,
        default_allow: args.acl_default_policy == "allow",
        datacenter: args.datacenter.clone(),
    }));
    if args.acl_enabled {
        init_acls(&store, args.acl_initial_management_token_file.as_deref()).await?;
    }
    let engine = Engine::start(
        store.clone(),
        &args.datacenter,
        crate::engine::admission(args.xds_max_streams, args.xds_setup_rate),
        &acl,
    );
    let liveness = Arc::new(catalog::liveness::Liveness::new(
        store.clone(),
        catalog::liveness::LivenessConfig {
            timeout: args.node_liveness_timeout,
            reap_after: args.node_reap_after,
            ..Default::default()
        },
    ));
    let mut api = engine.api_config(&store, &args, api_addr);
    api.liveness = Some(Arc::clone(&liveness));
    api.acl = Arc::clone(&acl);
    let status_acl: crate::engine::TokenAcl = {
        let (store, acl) = (store.clone(), Arc::clone(&acl));
        Arc::new(move |token: Option<String>| {
            let verdict = acl
                .resolve(&store.read(), token.as_deref())
                .map(|r| r.authz)
                .map_err(|e| e.to_string());
            Box::pin(std::future::ready(verdict))
        })
    };
    crate::engine::guard_csds(&engine.xds, std::sync::Arc::clone(&status_acl));
    engine.xds.set_server_name(&args.node);
    engine.xds.set_status_tracking(args.xds_status_tracking);
    let max_body = api.max_body;
    let app = http_api::router(store.clone(), api)
        .merge(crate::engine::status_router(
            engine.manager.clone(),
            engine.xds.clone(),
            std::sync::Arc::new(|_: &str| None),
            status_acl,
        ))
        .layer(axum::middleware::from_fn_with_state(
            crate::forward::Forwarder::new(store.clone(), max_body),
            crate::forward::forward_writes,
        ))
        .layer(axum::middleware::from_fn(crate::header_cap::cap));
    let stop = CancellationToken::new();
    let http_conn_limit = args.http_max_conns_per_client;
    let (https_addr, https) = match (https_listener, &tls.server) {
        (Some(listener), Some(server)) => {
            let (addr, task) = crate::tls::listener::serve_https(
                listener,
                std::sync::Arc::clone(&server.http),
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
                crate::engine::serve_xds_tls(listener, std::sync::Arc::clone(&server.grpc), &engine.xds, stop.clone())
                    .context("starting xDS over TLS")?;
            (Some(addr), Some(task))
        }
        _ => (None, None),
    };
    info!(?http_addr, ?grpc_addr, ?https_addr, ?grpc_tls_addr, datacenter = %args.datacenter, data_dir = ?args.data_dir, store = %args.store, "meshd server ready");
    on_ready(&Running {
        http_addr,
        grpc_addr,
        https_addr,
        grpc_tls_addr,
    });

    let http = listener.map(|listener| {
        tokio::spawn(
            crate::http_serve::serve_plain(listener, http_conn_limit, app, stop.clone())
                .instrument(info_span!("http_api", http_addr = %api_addr)),
        )
    });
    let grpc = grpc_listener.map(|listener| crate::engine::serve_xds(listener, xds_addr, &engine.xds, stop.clone()));

    let balance_task = tokio::spawn(
        crate::balance::run(store.clone(), engine.xds.clone(), args.etcd_lease_ttl * 2, stop.clone())
            .instrument(info_span!("xds_balance")),
    );
    let liveness_stop = stop.clone();
    let liveness_task = tokio::spawn(
        async move { liveness.run(liveness_stop.cancelled()).await }.instrument(info_span!("node_liveness")),
    );
    // Leader work (every server runs it; it acts only while leading): removing CA roots
    // rotated out once no leaf they signed can still be valid. Ends with `stop`.
    let pruner = catalog::ca_pruning::RootPruner::new(store.clone());
    let pruner_stop = stop.clone();
    let pruner_task = tokio::spawn(
        async move { pruner.run(pruner_stop.cancelled()).await }.instrument(info_span!("ca_root_pruning")),
    );

    shutdown.await;
    info!("shutting down");
    // Parked blocking queries answer now (they would hold the HTTP shutdown for their whole
    // wait), streams end (they never end on their own), then the listeners, then the engine.
    store.release_waiters();
    engine.xds.shutdown().await;
    stop.cancel();
    let served = match http {
        Some(task) => Some(task.await.context("HTTP server task")?),
        None => None,
    };
    let grpc_served = match grpc {
        Some(task) => Some(task.await.context("xDS server task")?),
        None => None,
    };
    let https_served = match https {
        Some(task) => Some(task.await.context("HTTPS server task")?),
        None => None,
    };
    let grpc_tls_served = match grpc_tls {
        Some(task) => Some(task.await.context("xDS TLS server task")?),
        None => None,
    };
    liveness_task.await.context("node liveness task")?;
    pruner_task.await.context("CA root pruning task")?;
    balance_task.await.context("xDS balance task")?;
    engine.shutdown().await;
    store.close().await;
    info!("meshd server stopped");
    served.transpose().context("serving HTTP")?;
    grpc_served.transpose().context("serving xDS")?;
    https_served.transpose().context("serving HTTPS")?;
    grpc_tls_served.transpose().context("serving xDS over TLS")?;
    Ok(())
}

/// The store the flags ask for: durable in `-data-dir`, in memory with `-dev`, or in etcd
/// with `-store etcd` (registered there under `http_addr`).
#[cfg_attr(not(feature = "etcd"), allow(unused_variables, unused_mut))]
async fn open_store(args: &ServerArgs, http_addr: SocketAddr, grpc_addr: SocketAddr) -> Result<Store> {
    let mut config = StoreConfig {
        datacenter: args.datacenter.clone(),
        data_dir: args.data_dir.clone(),
        ..StoreConfig::default()
    };
    #[cfg(feature = "etcd")]
    if args.store == "etcd" {
        if args.etcd_endpoints.is_empty() {
            bail!("-store etcd needs -etcd-endpoints URL[,URL...]");
        }
        if args.data_dir.is_some() || args.dev {
            bail!("-store etcd keeps the catalog in etcd: it excludes -data-dir and -dev");
        }
        let mut etcd = catalog::etcd::EtcdConfig::new(args.etcd_endpoints.clone());
        etcd.prefix = args.etcd_prefix.clone();
        etcd.server_name = args.node.clone();
        etcd.advertise = http_addr.to_string();
        etcd.xds_address = grpc_addr.to_string();
        etcd.lease_ttl = args.etcd_lease_ttl;
        etcd.request_timeout = args.etcd_request_timeout;
        etcd.max_txn_ops = args.etcd_max_txn_ops as usize;
        config.etcd = Some(etcd);
        return Store::open(config)
            .await
            .with_context(|| format!("cannot use etcd at {}", args.etcd_endpoints.join(",")));
    }
    if !args.etcd_endpoints.is_empty() {
        bail!("-etcd-endpoints is for -store etcd");
    }
    if args.data_dir.is_none() && !args.dev {
        bail!("one of -data-dir, -dev or -store etcd is required");
    }
    if args.data_dir.is_some() && args.dev {
        bail!("-data-dir and -dev exclude each other: -dev keeps state in memory");
    }
    Store::open(config).await.with_context(|| match &args.data_dir {
        Some(dir) => format!("cannot use data dir {}", dir.display()),
        None => "cannot open the in-memory store".to_owned(),
    })
}

/// Creates what ACLs need (the built-in policy, the anonymous token) and the initial
/// management token if a file names one.
async fn init_acls(store: &Store, initial_management: Option<&std::path::Path>) -> Result<()> {
    store.write(catalog::Op::AclInit).await.context("initialising ACLs")?;
    let Some(path) = initial_management else {
        return Ok(());
    };
    let secret = std::fs::read_to_string(path)
        .with_context(|| format!("-acl-initial-management-token-file: cannot read {}", path.display()))?
        .trim()
        .to_owned();
    if store.read().acl_token_by_secret(&secret).is_some() {
        return Ok(());
    }
    let token = structs::acl::AclToken {
        accessor_id: catalog::ca::new_uuid().context("generating an accessor id")?,
        secret_id: secret,
        description: "Initial Management Token".into(),
        policies: vec![structs::acl::Link {
            id: structs::acl::GLOBAL_MANAGEMENT_ID.into(),
            name: String::new(),
        }],
        ..Default::default()
    };
    store
        .write(catalog::Op::AclTokenSet {
            token: Box::new(token),
            create: true,
            ttl: None,
        })
        .await
        .map_err(|e| anyhow::anyhow!("-acl-initial-management-token-file: {e}"))?;
    info!("initial management token created");
    Ok(())
}

/// Authorizes xDS streams against the store's ACLs: `service:write` on the proxy's service,
/// re-checked on every ACL change.
struct StoreStreamAuthorizer {
    store: Store,
    acl: Arc<catalog::acl::Resolver>,
    /// Bumped by one follower of the store's ACL index: every stream waits on a receiver of
    /// it (a few bytes) rather than on a blocking wait of its own.
    changes: tokio::sync::watch::Sender<u64>,
}

impl StoreStreamAuthorizer {
    /// The authorizer, and its follower of the ACL index (on `tasks`; it ends when the store
    /// releases its waiters at shutdown).
    fn start(store: Store, acl: Arc<catalog::acl::Resolver>, tasks: &tokio_util::task::TaskTracker) -> Self {
        let changes = tokio::sync::watch::Sender::new(0u64);
        let (follow, tx) = (store.clone(), changes.clone());
        tasks.spawn(async move {
            let key = catalog::IndexKey::Acl;
            let mut at = follow.read().index_of(&key);
            loop {
                let state = follow.wait(&key, at, std::time::Duration::from_secs(600)).await;
                if follow.is_closed() {
                    return;
                }
                let now = state.index_of(&key);
                if now != at {
                    at = now;
                    tx.send_modify(|n| *n += 1);
                }
            }
        });
        Self { store, acl, changes }
    }
}

impl xds::StreamAuthorizer for StoreStreamAuthorizer {
    fn authorize(
        &self,
        token: &str,
        service: &str,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<xds::Authorization, String>> + Send>> {
        let verdict = self
            .acl
            .resolve(&self.store.read(), Some(token))
            .map_err(|e| e.to_string())
            .and_then(|resolved| {
                if resolved.authz.service_write(service) {
                    Ok(xds::Authorization {
                        expires: resolved.expires,
                    })
                } else {
                    Err(acl::denied(&resolved.accessor, "service:write", service))
                }
            });
        Box::pin(std::future::ready(verdict))
    }

    fn changed(&self) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
        let mut rx = self.changes.subscribe();
        Box::pin(async move {
            if rx.changed().await.is_err() {
                // No more changes can come (the server is going): nothing to re-check.
                std::future::pending::<()>().await;
            }
        })
    }
}

/// A bound listener and its address (`127.0.0.1:0` picks a free port).
/// Binds `addr` when there is one.
async fn bind_optional(addr: Option<SocketAddr>, what: &str) -> Result<(Option<TcpListener>, Option<SocketAddr>)> {
    match addr {
        Some(addr) => {
            let (listener, bound) = bind(addr, what).await?;
            Ok((Some(listener), Some(bound)))
        }
        None => Ok((None, None)),
    }
}

/// `0.0.0.0:0`: an address for nothing.
fn unspecified() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 0))
}

/// A plain listener may be off only where its TLS twin serves instead; servers forward
/// writes to the leader over plain HTTP, so several servers over etcd keep it.
fn check_listeners(args: &ServerArgs, tls: bool) -> Result<()> {
    if args.http_addr.0.is_none() {
        if args.tls.https_addr.is_none() || !tls {
            bail!("-http-addr off needs -https-addr (with -tls-cert-file and -tls-key-file) to serve the API");
        }
        if args.store == "etcd" {
            bail!(
                "-http-addr off is not available with -store etcd: servers forward writes to the leader's plain HTTP API"
            );
        }
    }
    if args.grpc_addr.0.is_none() && (args.tls.grpc_tls_addr.is_none() || !tls) {
        bail!("-grpc-addr off needs -grpc-tls-addr (with -tls-cert-file and -tls-key-file) to serve xDS");
    }
    Ok(())
}

async fn bind(addr: SocketAddr, what: &str) -> Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener
        .local_addr()
        .with_context(|| format!("reading the bound {what}address"))?;
    Ok((listener, bound))
}

/// The proxy config engine over the store: the Manager with the server's data sources, the
/// catalog source that registers proxies when streams ask for them, and the xDS server.
struct Engine {
    followers: tokio_util::task::TaskTracker,
    manager: Manager,
    source: CatalogSource,
    xds: XdsServer,
}

impl Engine {
    fn start(store: Store, datacenter: &str, admission: xds::Admission, acl: &Arc<catalog::acl::Resolver>) -> Self {
        let followers = tokio_util::task::TaskTracker::new();
        let manager = Manager::new(
            ManagerConfig {
                datacenter: datacenter.to_owned(),
                intention_default_allow: acl.intention_default_allow(),
                ..ManagerConfig::default()
            },
            proxycfg_glue::server_data_sources_tracked(store.clone(), &followers),
        );
        let source = CatalogSource::new(store.clone(), manager.clone());
        let xds = if acl.enabled() {
            let authorizer = StoreStreamAuthorizer::start(store, Arc::clone(acl), &followers);
            XdsServer::with_authorizer(Arc::new(source.clone()), admission, Arc::new(authorizer))
        } else {
            XdsServer::with_admission(Arc::new(source.clone()), admission)
        };
        Self {
            followers,
            manager,
            source,
            xds,
        }
    }

    /// The HTTP API's settings, with the engine's metrics (xDS, then proxycfg) added to the
    /// API's own.
    fn api_config(&self, store: &Store, args: &ServerArgs, http_addr: SocketAddr) -> ApiConfig {
        let registry = crate::engine::engine_registry(&self.xds, &self.manager);
        ApiConfig {
            node_name: args.node.clone(),
            node_id: store.read().ca().map(|ca| ca.cluster_id.clone()).unwrap_or_default(),
            server_addr: http_addr.to_string(),
            extra_metrics: Some(Arc::new(registry)),
            ..ApiConfig::default()
        }
    }

    /// Stops the syncs, the proxies' States and then the shared followers they used.
    async fn shutdown(self) {
        self.source.shutdown().await;
        self.manager.shutdown().await;
        // With every proxy gone, the shared followers end with their last watch.
        self.followers.close();
        self.followers.wait().await;
    }
}
