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
    /// The bound HTTP address.
    pub http_addr: SocketAddr,
    /// The bound xDS address.
    pub grpc_addr: SocketAddr,
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

    let followers = tokio_util::task::TaskTracker::new();
    let manager = Manager::new(
        ManagerConfig {
            datacenter: args.datacenter.clone(),
            ..ManagerConfig::default()
        },
        proxycfg_glue::server_data_sources_tracked(store.clone(), &followers),
    );
    let source = CatalogSource::new(store.clone(), manager.clone());
    let xds = XdsServer::new(Arc::new(source.clone()));

    // One registry for what the server adds to the API's own metrics: xDS, then proxycfg.
    let mut registry = prometheus_client::registry::Registry::default();
    xds.metrics().register(&mut registry);
    manager.register_metrics(&mut registry);
    let api = ApiConfig {
        node_name: args.node.clone(),
        node_id: store.read().ca().map(|ca| ca.cluster_id.clone()).unwrap_or_default(),
        server_addr: http_addr.to_string(),
        extra_metrics: Some(Arc::new(registry)),
        ..ApiConfig::default()
    };
    let app = http_api::router(store.clone(), api);
    info!(%http_addr, %grpc_addr, datacenter = %args.datacenter, data_dir = ?args.data_dir, "meshd server ready");
    on_ready(&Running { http_addr, grpc_addr });

    let stop = CancellationToken::new();
    let http_stop = stop.clone();
    let http = tokio::spawn(
        async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { http_stop.cancelled().await })
                .await
        }
        .instrument(info_span!("http_api", %http_addr)),
    );
    let grpc_stop = stop.clone();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(grpc_listener);
    let grpc_service = xds.service();
    let grpc = tokio::spawn(
        async move {
            tonic::transport::Server::builder()
                .add_service(grpc_service)
                .serve_with_incoming_shutdown(incoming, async move { grpc_stop.cancelled().await })
                .await
        }
        .instrument(info_span!("xds_server", %grpc_addr)),
    );

    shutdown.await;
    info!("shutting down");
    // Parked blocking queries answer now (they would hold the HTTP shutdown for their whole
    // wait), streams end (they never end on their own), then the listeners, then the engine.
    store.release_waiters();
    xds.shutdown().await;
    stop.cancel();
    let served = http.await.context("HTTP server task")?;
    let grpc_served = grpc.await.context("xDS server task")?;
    source.shutdown().await;
    manager.shutdown().await;
    // With every proxy gone, the shared followers end with their last watch.
    followers.close();
    followers.wait().await;
    store.close().await;
    info!("meshd server stopped");
    served.context("serving HTTP")?;
    grpc_served.context("serving xDS")?;
    Ok(())
}
