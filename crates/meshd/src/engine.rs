//! What both modes serve proxies with: the xDS server on its own listener, and the metrics
//! of the Manager and the xDS server in one registry.

use std::net::SocketAddr;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info_span};
use xds::XdsServer;

/// Serves `xds` (SotW and delta ADS) on `listener` until `stop` fires.
pub fn serve_xds(
    listener: TcpListener,
    addr: SocketAddr,
    xds: &XdsServer,
    stop: CancellationToken,
) -> JoinHandle<Result<(), tonic::transport::Error>> {
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let service = xds.service();
    tokio::spawn(
        async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async move { stop.cancelled().await })
                .await
        }
        .instrument(info_span!("xds_server", grpc_addr = %addr)),
    )
}

/// The engine's metrics: the xDS server's, then the Manager's.
pub fn engine_registry(xds: &XdsServer, manager: &proxycfg::Manager) -> prometheus_client::registry::Registry {
    let mut registry = prometheus_client::registry::Registry::default();
    xds.metrics().register(&mut registry);
    manager.register_metrics(&mut registry);
    registry
}
