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
    let served = serve_xds_on(incoming, xds, Keepalive::default(), stop);
    tokio::spawn(served.instrument(info_span!("xds_server", grpc_addr = %addr)))
}

/// HTTP/2 keepalive on xDS connections: a PING every `interval`, and the connection closed
/// when one goes unanswered for `timeout`. A peer that vanished without closing, or that
/// stopped reading (its PING acknowledgements cannot come back past what it left unread),
/// loses its connection and its streams, and with them what the server held for it.
#[derive(Debug, Clone, Copy)]
pub struct Keepalive {
    /// How often to check a connection.
    pub interval: std::time::Duration,
    /// How long an unanswered check may wait.
    pub timeout: std::time::Duration,
}

impl Default for Keepalive {
    fn default() -> Self {
        Self {
            interval: std::time::Duration::from_secs(30),
            timeout: std::time::Duration::from_secs(20),
        }
    }
}

/// Serves `xds` over TLS on `listener` until `stop` fires: the same service (and so the
/// same stream admission) as [`serve_xds`], over connections the TLS listener handshook.
pub fn serve_xds_tls(
    listener: TcpListener,
    config: std::sync::Arc<rustls::ServerConfig>,
    xds: &XdsServer,
    stop: CancellationToken,
) -> std::io::Result<(SocketAddr, JoinHandle<Result<(), tonic::transport::Error>>)> {
    // No per-client limit on xDS (the plain port has none either): admission bounds streams.
    let incoming = crate::tls::TlsIncoming::start(
        listener,
        config,
        crate::conn_limit::ClientCounts::new(0),
        stop.clone(),
        "xds",
    )?;
    let addr = incoming.local_addr();
    let span = info_span!("xds_tls_server", grpc_tls_addr = %addr);
    let task = tokio::spawn(serve_xds_on(incoming.into_grpc(), xds, Keepalive::default(), stop).instrument(span));
    Ok((addr, task))
}

/// The xDS server over `incoming` until `stop` fires, not yet spawned.
fn serve_xds_on<S, IO>(
    incoming: S,
    xds: &XdsServer,
    keepalive: Keepalive,
    stop: CancellationToken,
) -> impl std::future::Future<Output = Result<(), tonic::transport::Error>> + Send + 'static
where
    S: tokio_stream::Stream<Item = std::io::Result<IO>> + Send + 'static,
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + tonic::transport::server::Connected + Unpin + Send + 'static,
{
    let service = xds.service();
    let csds = xds.csds_service();
    async move {
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(keepalive.interval))
            .http2_keepalive_timeout(Some(keepalive.timeout))
            .add_service(service)
            .add_service(csds)
            .serve_with_incoming_shutdown(incoming, async move { stop.cancelled().await })
            .await
    }
}

/// The xDS admission control the flags ask for.
pub fn admission(max_streams: u32, setup_rate: u32) -> xds::Admission {
    xds::Admission {
        max_streams: usize::try_from(max_streams).unwrap_or(usize::MAX),
        setup_rate: f64::from(setup_rate),
        setup_burst: setup_rate,
    }
}

/// The engine's metrics: the xDS server's, then the Manager's.
pub fn engine_registry(xds: &XdsServer, manager: &proxycfg::Manager) -> prometheus_client::registry::Registry {
    let mut registry = prometheus_client::registry::Registry::default();
    xds.metrics().register(&mut registry);
    manager.register_metrics(&mut registry);
    registry.register_collector(Box::new(ProcessCollector));
    registry
}

/// The process's own gauges, read at scrape time: live tokio tasks and open file
/// descriptors (what a soak watches for leaks), and the open-files limit.
#[derive(Debug)]
struct ProcessCollector;

impl prometheus_client::collector::Collector for ProcessCollector {
    fn encode(&self, mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::{MetricType, gauge::ConstGauge};
        let tasks = tokio::runtime::Handle::try_current().map_or(0, |h| h.metrics().num_alive_tasks());
        let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
        // No limit reads as the largest value.
        let max_fds = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
        for (name, help, value) in [
            ("meshd_runtime_tasks", "Live tokio tasks of the process.", tasks),
            ("meshd_process_open_fds", "Open file descriptors of the process.", fds),
            (
                "meshd_process_max_fds",
                "The process's open-files limit (each proxy stream, blocking query and connection is one).",
                max_fds,
            ),
        ] {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)).encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Refuses every proxy: the test needs connections, not streams.
    struct NoProxies;

    impl proxycfg::SnapshotSource for NoProxies {
        fn watch(
            &self,
            _: &proxycfg::ProxyRequest<'_>,
        ) -> Result<(proxycfg::Watcher, proxycfg::SourceLease), proxycfg::SourceError> {
            Err(proxycfg::SourceError::NotFound("none here".to_owned()))
        }
    }

    #[tokio::test]
    async fn a_peer_that_stops_answering_loses_its_connection() {
        let xds = XdsServer::new(std::sync::Arc::new(NoProxies));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let keepalive = Keepalive {
            interval: Duration::from_millis(200),
            timeout: Duration::from_millis(200),
        };
        let stop = CancellationToken::new();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let server = tokio::spawn(serve_xds_on(incoming, &xds, keepalive, stop.clone()));

        // An HTTP/2 client that says hello and then never answers anything again (as one
        // whose reads stalled: nothing it is sent is acknowledged).
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .await
            .unwrap();
        let mut received = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut received))
            .await
            .expect("the server kept a connection whose peer never answered its PINGs")
            .ok();
        // What it was sent before the close includes a PING (frame type 6).
        assert!(
            received.windows(4).any(|w| w[3] == 6 && w[0..3] == [0, 0, 8]),
            "{received:?}"
        );
        stop.cancel();
        server.await.unwrap().unwrap();
    }
}
