//! `meshd server`: opens the store, serves the HTTP API, and shuts down cleanly on a signal.

use crate::cli::ServerArgs;
use anyhow::{Context, Result, bail};
use catalog::{Store, StoreConfig};
use http_api::ApiConfig;
use std::future::Future;
use std::net::SocketAddr;
use tokio::net::TcpListener;
use tracing::info;

/// A running server's handles, for callers that embed it.
pub struct Running {
    /// The bound HTTP address.
    pub http_addr: SocketAddr,
}

/// Runs a server until `shutdown` completes; in-flight requests finish, the store closes.
/// `on_ready` is called once the HTTP listener is bound.
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
    let api = ApiConfig {
        node_name: args.node.clone(),
        node_id: store.read().ca().map(|ca| ca.cluster_id.clone()).unwrap_or_default(),
        server_addr: http_addr.to_string(),
        ..ApiConfig::default()
    };
    let app = http_api::router(store.clone(), api);
    info!(%http_addr, datacenter = %args.datacenter, data_dir = ?args.data_dir, "meshd server ready");
    on_ready(&Running { http_addr });
    let served = axum::serve(listener, app).with_graceful_shutdown(shutdown).await;
    store.close().await;
    info!("meshd server stopped");
    served.context("serving HTTP")
}
