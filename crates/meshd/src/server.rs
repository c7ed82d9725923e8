//! `meshd server`: opens the store, serves the HTTP API and xDS, and shuts down cleanly on a
//! signal.

use crate::cli::ServerArgs;
use anyhow::{Context, Result, bail};
use catalog::{Store, StoreConfig};
use http_api::ApiConfig;
use proxycfg::{Manager, ManagerConfig, ProxyId, Watcher};
use proxycfg_sources::CatalogSource;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info};
use xds::{SnapshotSource, XdsServer};

/// A running server's addresses, for callers that embed it.
pub struct Running {
    /// The bound HTTP address.
    pub http_addr: SocketAddr,
    /// The bound xDS address.
    pub grpc_addr: SocketAddr,
}

/// Streams name their proxy by service id (Envoy's node id) and, in the bootstrap's
/// metadata, the catalog node; without a node the server looks the id up.
struct CatalogSnapshots {
    store: Store,
    source: CatalogSource,
}

impl SnapshotSource for CatalogSnapshots {
    fn watch(&self, node: &xds::Node, token: &str) -> Result<(Watcher, Box<dyn Send + Sync>), tonic::Status> {
        if node.id.is_empty() {
            return Err(tonic::Status::invalid_argument(
                "node.id must be the proxy's service id",
            ));
        }
        let named = node
            .metadata
            .as_ref()
            .and_then(|m| m.fields.get("node_name"))
            .and_then(|v| match &v.kind {
                Some(xds::ValueKind::StringValue(s)) if !s.is_empty() => Some(s.clone()),
                _ => None,
            });
        let node_name = match named {
            Some(n) => n,
            None => {
                let state = self.store.read();
                let mut found = state
                    .all_services()
                    .filter(|(_, s)| s.id == node.id && s.kind.is_proxy())
                    .map(|(n, _)| n.to_owned());
                match (found.next(), found.next()) {
                    (Some(n), None) => n,
                    (Some(_), Some(_)) => {
                        return Err(tonic::Status::failed_precondition(format!(
                            "proxy {:?} is registered on several nodes: set node_name in the bootstrap metadata",
                            node.id
                        )));
                    }
                    (None, _) => {
                        return Err(tonic::Status::not_found(format!(
                            "no proxy {:?} is registered",
                            node.id
                        )));
                    }
                }
            }
        };
        let (watcher, lease) = self
            .source
            .watch(ProxyId::new(node_name, node.id.clone()), token.to_owned());
        Ok((watcher, Box::new(lease)))
    }
}

/// Runs a server until `shutdown` completes: xDS streams end, in-flight HTTP requests finish,
/// the store closes. `on_ready` is called once both listeners are bound.
pub async fn run(
    args: ServerArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce(&Running),
) -> Result<()> {
    if args.data_dir.is_none() && !args.dev {
        bail!("one of -data-dir or -dev is required");
    }
    if args.data_dir.is_some() && args.dev {
        bail!("-data-dir and -dev exclude each other: -dev keeps state in memory");
    }
    let config = StoreConfig {
        datacenter: args.datacenter.clone(),
        data_dir: args.data_dir.clone(),
        ..StoreConfig::default()
    };
    let store = Store::open(config).await.with_context(|| match &args.data_dir {
        Some(dir) => format!("cannot use data dir {}", dir.display()),
        None => "cannot open the in-memory store".to_owned(),
    })?;
    let listener = TcpListener::bind(args.http_addr)
        .await
        .with_context(|| format!("cannot listen on {}", args.http_addr))?;
    let http_addr = listener.local_addr().context("reading the bound address")?;
    let grpc_listener = TcpListener::bind(args.grpc_addr)
        .await
        .with_context(|| format!("cannot listen on {}", args.grpc_addr))?;
    let grpc_addr = grpc_listener.local_addr().context("reading the bound xDS address")?;

    let manager = Manager::new(
        ManagerConfig {
            datacenter: args.datacenter.clone(),
            ..ManagerConfig::default()
        },
        proxycfg_glue::server_data_sources(store.clone()),
    );
    let source = CatalogSource::new(store.clone(), manager.clone());
    let xds = XdsServer::new(Arc::new(CatalogSnapshots {
        store: store.clone(),
        source: source.clone(),
    }));

    let liveness = Arc::new(catalog::liveness::Liveness::new(
        store.clone(),
        catalog::liveness::LivenessConfig {
            timeout: args.node_liveness_timeout,
            reap_after: args.node_reap_after,
            ..Default::default()
        },
    ));
    let xds_metrics = xds.metrics();
    let engine = manager.clone();
    let api = ApiConfig {
        node_name: args.node.clone(),
        node_id: store.read().ca().map(|ca| ca.cluster_id.clone()).unwrap_or_default(),
        server_addr: http_addr.to_string(),
        extra_metrics: Some(Arc::new(move |out: &mut String| {
            xds_metrics.render(out);
            let m = engine.metrics();
            out.push_str(&format!(
                "# HELP meshd_proxycfg_snapshots_total Proxy snapshots built.\n# TYPE meshd_proxycfg_snapshots_total counter\nmeshd_proxycfg_snapshots_total {}\n",
                m.snapshots_built
            ));
            out.push_str(&format!(
                "# HELP meshd_proxycfg_watches Live proxycfg watches.\n# TYPE meshd_proxycfg_watches gauge\nmeshd_proxycfg_watches {}\n",
                m.live_watches
            ));
        })),
        liveness: Some(Arc::clone(&liveness)),
        ..ApiConfig::default()
    };
    let app = http_api::router(store.clone(), api);
    info!(%http_addr, %grpc_addr, datacenter = %args.datacenter, data_dir = ?args.data_dir, "meshd server ready");
    on_ready(&Running { http_addr, grpc_addr });

    let stop = CancellationToken::new();
    let http_stop = stop.clone();
    let http = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { http_stop.cancelled().await })
            .await
    });
    let grpc_stop = stop.clone();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(grpc_listener);
    let grpc_service = xds.service();
    let grpc = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(grpc_service)
            .serve_with_incoming_shutdown(incoming, async move { grpc_stop.cancelled().await })
            .await
    });

    let liveness_stop = stop.clone();
    let liveness_task = tokio::spawn(
        async move { liveness.run(liveness_stop.cancelled()).await }.instrument(tracing::info_span!("node_liveness")),
    );

    shutdown.await;
    info!("shutting down");
    // Streams first (they never end on their own), then the listeners, then the engine.
    xds.shutdown().await;
    stop.cancel();
    let served = http.await.context("HTTP server task")?;
    let grpc_served = grpc.await.context("xDS server task")?;
    liveness_task.await.context("node liveness task")?;
    source.shutdown().await;
    manager.shutdown().await;
    store.close().await;
    info!("meshd server stopped");
    served.context("serving HTTP")?;
    grpc_served.context("serving xDS")?;
    Ok(())
}
