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
    extra: &tonic::service::Routes,
    stop: CancellationToken,
) -> JoinHandle<Result<(), tonic::transport::Error>> {
    if let Err(error) = Keepalive::default().apply(&listener) {
        tracing::warn!(%error, "cannot set TCP keepalive on the xDS listener: vanished peers are noticed only when a push goes unacknowledged");
    }
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let served = serve_xds_on(incoming, xds, extra, stop);
    tokio::spawn(served.instrument(info_span!("xds_server", grpc_addr = %addr)))
}

/// Liveness of xDS connections, left to the kernel (TCP keepalive and `TCP_USER_TIMEOUT`,
/// set on the listening socket, which every accepted connection inherits): after `idle`
/// without traffic the kernel probes the peer every `interval`, and a connection whose
/// probes, or whose data, go unacknowledged for `idle + interval × probes` is closed, and with
/// it its streams and what the server held for them. A peer that vanished without closing
/// therefore holds nothing for long, and a quiet connection costs the server no wake-up at
/// all: HTTP/2 PINGs, which this replaced, woke the server once per connection per interval
/// (1.2 % of a core for 50,000 idle streams on 7,000 connections; with one connection per
/// proxy, as Envoy connects, about 10 %).
///
/// A peer whose host still answers but whose process stopped reading keeps its connection;
/// what it is sent stays unacknowledged at the xDS level, and the stream ends on the
/// acknowledgement deadline (`docs/reliability.md`).
#[derive(Debug, Clone, Copy)]
pub struct Keepalive {
    /// How long a connection may be quiet before the kernel probes it.
    pub idle: std::time::Duration,
    /// Between probes.
    pub interval: std::time::Duration,
    /// How many unanswered probes close the connection.
    pub probes: u32,
}

impl Default for Keepalive {
    fn default() -> Self {
        Self {
            idle: std::time::Duration::from_secs(30),
            interval: std::time::Duration::from_secs(10),
            probes: 2,
        }
    }
}

impl Keepalive {
    /// How long a peer may leave probes or data unacknowledged before its connection closes.
    pub fn deadline(&self) -> std::time::Duration {
        self.idle + self.interval * self.probes
    }

    /// Sets these options on `listener`; the connections it accepts inherit them.
    pub fn apply(&self, listener: &TcpListener) -> std::io::Result<()> {
        use rustix::net::sockopt;
        sockopt::set_socket_keepalive(listener, true)?;
        sockopt::set_tcp_keepidle(listener, self.idle)?;
        sockopt::set_tcp_keepintvl(listener, self.interval)?;
        sockopt::set_tcp_keepcnt(listener, self.probes)?;
        let deadline_ms = u32::try_from(self.deadline().as_millis()).unwrap_or(u32::MAX);
        sockopt::set_tcp_user_timeout(listener, deadline_ms)?;
        Ok(())
    }
}

/// Serves `xds` over TLS on `listener` until `stop` fires: the same service (and so the
/// same stream admission) as [`serve_xds`], over connections the TLS listener handshook.
pub fn serve_xds_tls(
    listener: TcpListener,
    certs: crate::tls::Certs,
    xds: &XdsServer,
    extra: &tonic::service::Routes,
    stop: CancellationToken,
) -> std::io::Result<(SocketAddr, JoinHandle<Result<(), tonic::transport::Error>>)> {
    Keepalive::default().apply(&listener)?;
    let names = certs.names.clone();
    // No per-client limit on xDS (the plain port has none either): admission bounds streams.
    let incoming = crate::tls::TlsIncoming::start(
        listener,
        certs,
        crate::conn_limit::ClientCounts::new(0),
        stop.clone(),
        "xds",
    )?;
    let addr = incoming.local_addr();
    let span = info_span!("xds_tls_server", grpc_tls_addr = %addr);
    let Some(names) = names else {
        let task = tokio::spawn(serve_xds_on(incoming.into_grpc(), xds, extra, stop).instrument(span));
        return Ok((addr, task));
    };
    // A connection made for one of the mode's names (a peer's server dialing the peering
    // name) reaches the mode's services only, never xDS: that name is served to other
    // clusters, xDS to this one's proxies.
    let (own, other) = incoming.split_grpc(move |name| names.config_for(name).is_some());
    let routes = extra.clone();
    let own_stop = stop.clone();
    let own = async move {
        tonic::transport::Server::builder()
            .add_routes(routes)
            .serve_with_incoming_shutdown(own, async move { own_stop.cancelled().await })
            .await
    };
    let other = serve_xds_on(other, xds, extra, stop);
    let task = tokio::spawn(
        async move {
            let (own, other) = tokio::join!(own, other);
            own.and(other)
        }
        .instrument(span),
    );
    Ok((addr, task))
}

/// The xDS server (and the mode's `extra` gRPC services) over `incoming` until `stop`
/// fires, not yet spawned.
fn serve_xds_on<S, IO>(
    incoming: S,
    xds: &XdsServer,
    extra: &tonic::service::Routes,
    stop: CancellationToken,
) -> impl std::future::Future<Output = Result<(), tonic::transport::Error>> + Send + 'static
where
    S: tokio_stream::Stream<Item = std::io::Result<IO>> + Send + 'static,
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + tonic::transport::server::Connected + Unpin + Send + 'static,
{
    let service = xds.service();
    let csds = xds.csds_service();
    let extra = extra.clone();
    async move {
        tonic::transport::Server::builder()
            .add_routes(extra)
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

    /// The kernel's timer column (`tr:tm->when`) of the TCP socket from `local` to `remote`
    /// in `/proc/net/tcp`: which timer runs (2 is the keepalive timer) and in how many
    /// hundredths of a second it fires.
    fn kernel_timer(local: SocketAddr, remote: SocketAddr) -> Option<(u32, u64)> {
        let hex = |addr: SocketAddr| match addr.ip() {
            std::net::IpAddr::V4(ip) => format!("{:08X}:{:04X}", u32::from_le_bytes(ip.octets()), addr.port()),
            std::net::IpAddr::V6(_) => unreachable!("the test listens on IPv4"),
        };
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        table.lines().skip(1).find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields[1] != hex(local) || fields[2] != hex(remote) {
                return None;
            }
            let (timer, when) = fields[5].split_once(':')?;
            Some((timer.parse().ok()?, u64::from_str_radix(when, 16).ok()?))
        })
    }

    #[tokio::test]
    async fn the_kernel_watches_every_accepted_xds_connection() {
        let xds = XdsServer::new(std::sync::Arc::new(NoProxies));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let server = serve_xds(listener, addr, &xds, &tonic::service::Routes::default(), stop.clone());

        // An HTTP/2 client that says hello and then goes quiet.
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .await
            .unwrap();
        let mut settings = [0u8; 9];
        conn.read_exact(&mut settings).await.unwrap();
        assert_eq!(settings[3], 4, "the server answers with its SETTINGS");

        // The server's end of the connection (local = the listener, remote = this client)
        // has the keepalive timer running, due within the idle time.
        let (timer, when) = kernel_timer(addr, conn.local_addr().unwrap()).expect("the server's socket is listed");
        assert_eq!(timer, 2, "no keepalive timer on the accepted connection");
        let idle_ticks = u64::try_from(Keepalive::default().idle.as_millis() / 10).unwrap();
        assert!(
            when <= idle_ticks,
            "the keepalive fires in {when} ticks, past the idle time"
        );
        // This client's end was not asked for keepalive: the column tells the two apart.
        assert_eq!(kernel_timer(conn.local_addr().unwrap(), addr).map(|t| t.0), Some(0));

        stop.cancel();
        drop(conn);
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn keepalive_options_are_set_as_configured() {
        use rustix::net::sockopt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let keepalive = Keepalive {
            idle: Duration::from_secs(7),
            interval: Duration::from_secs(3),
            probes: 4,
        };
        keepalive.apply(&listener).unwrap();
        assert!(sockopt::socket_keepalive(&listener).unwrap());
        assert_eq!(sockopt::tcp_keepidle(&listener).unwrap(), Duration::from_secs(7));
        assert_eq!(sockopt::tcp_keepintvl(&listener).unwrap(), Duration::from_secs(3));
        assert_eq!(sockopt::tcp_keepcnt(&listener).unwrap(), 4);
        assert_eq!(sockopt::tcp_user_timeout(&listener).unwrap(), 19_000);

        // An accepted connection inherits them (what the xDS server relies on).
        let addr = listener.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        assert!(sockopt::socket_keepalive(&accepted).unwrap());
        assert_eq!(sockopt::tcp_keepidle(&accepted).unwrap(), Duration::from_secs(7));
        assert_eq!(sockopt::tcp_user_timeout(&accepted).unwrap(), 19_000);
    }
}
