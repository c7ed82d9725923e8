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
/// descriptors (what a soak watches for leaks).
#[derive(Debug)]
struct ProcessCollector;

impl prometheus_client::collector::Collector for ProcessCollector {
    fn encode(&self, mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::{MetricType, gauge::ConstGauge};
        let tasks = tokio::runtime::Handle::try_current().map_or(0, |h| h.metrics().num_alive_tasks());
        let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
        for (name, help, value) in [
            ("meshd_runtime_tasks", "Live tokio tasks of the process", tasks),
            ("meshd_process_open_fds", "Open file descriptors of the process", fds),
        ] {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)).encode(metric)?;
        }
        Ok(())
    }
}

/// `GET /v1/internal/proxy-status/{proxy_id}[?node=NODE]`: what the proxy config engine holds
/// for a proxy — who registered it, the version of its last snapshot (`null`: its data is
/// still incomplete), the watches failing now with their errors (`Errors`), and the parts of
/// its configuration that cannot be built into Envoy resources (`BuildErrors`, by upstream;
/// those keep their last good resources).
///
/// `waiting` says why a proxy the engine does not hold is not registered yet, when its source
/// knows (an agent's local proxy waiting for central config).
///
/// It needs `operator:read` (it is a debugging view of the engine): `acl` resolves the
/// request's token.
pub fn status_router(manager: proxycfg::Manager, xds: XdsServer, waiting: Waiting, acl: TokenAcl) -> axum::Router {
    use axum::extract::{Path, RawQuery};
    use axum::response::IntoResponse;
    let sync = {
        let (xds, acl) = (xds.clone(), std::sync::Arc::clone(&acl));
        move |RawQuery(q): RawQuery, headers: axum::http::HeaderMap| {
            let (xds, acl) = (xds.clone(), std::sync::Arc::clone(&acl));
            async move {
                if let Err(refused) = operator_read(&acl, &headers, q.as_deref()).await {
                    return refused;
                }
                let node = form_urlencoded::parse(q.unwrap_or_default().as_bytes())
                    .find(|(k, _)| k == "node")
                    .map(|(_, v)| v.into_owned());
                let streams: Vec<_> = xds
                    .sync_status()
                    .into_iter()
                    .filter(|s| node.as_ref().is_none_or(|n| &s.node == n))
                    .collect();
                axum::Json(streams).into_response()
            }
        }
    };
    axum::Router::new()
        .route("/v1/internal/xds-status", axum::routing::get(sync))
        .route(
            "/v1/internal/proxy-status/{proxy_id}",
            axum::routing::get(
                move |Path(proxy_id): Path<String>, RawQuery(q): RawQuery, headers: axum::http::HeaderMap| {
                    let (manager, xds, waiting) = (manager.clone(), xds.clone(), std::sync::Arc::clone(&waiting));
                    let acl = std::sync::Arc::clone(&acl);
                    async move {
                        if let Err(refused) = operator_read(&acl, &headers, q.as_deref()).await {
                            return refused;
                        }
                        proxy_status(&manager, &xds, &*waiting, &proxy_id, q.as_deref()).await
                    }
                },
            ),
        )
}

/// Makes CSDS on `xds` need `operator:read` of the request's token (as the HTTP status
/// views do): CSDS lists every proxy's configuration.
pub fn guard_csds(xds: &XdsServer, acl: TokenAcl) {
    xds.set_csds_authorizer(std::sync::Arc::new(move |token: String| {
        let acl = std::sync::Arc::clone(&acl);
        Box::pin(async move {
            let token = (!token.is_empty()).then_some(token);
            match acl(token).await {
                Ok(a) if a.operator_read() => Ok(()),
                Ok(_) => Err(format!("{}: CSDS needs 'operator:read'", acl::PERMISSION_DENIED)),
                Err(e) => Err(e),
            }
        })
    }));
}

/// Refuses (403) a request whose token does not hold `operator:read`.
async fn operator_read(
    acl: &TokenAcl,
    headers: &axum::http::HeaderMap,
    query: Option<&str>,
) -> Result<(), axum::response::Response> {
    use axum::response::IntoResponse;
    match acl(request_token(headers, query)).await {
        Ok(a) if a.operator_read() => Ok(()),
        Ok(_) => Err((
            axum::http::StatusCode::FORBIDDEN,
            format!("{}: this view needs 'operator:read'\n", acl::PERMISSION_DENIED),
        )
            .into_response()),
        Err(e) => Err((axum::http::StatusCode::FORBIDDEN, format!("{e}\n")).into_response()),
    }
}

/// Resolves a request's token (none: anonymous, or the agent's default token) to what it may
/// do, or says why not.
pub type TokenAcl = std::sync::Arc<
    dyn Fn(
            Option<String>,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<std::sync::Arc<acl::Authorizer>, String>> + Send>,
        > + Send
        + Sync,
>;

/// The token of an HTTP request: `X-Consul-Token`, `Authorization: Bearer`, or `?token=`.
pub fn request_token(headers: &axum::http::HeaderMap, query: Option<&str>) -> Option<String> {
    if let Some(t) = headers.get(structs::wire::TOKEN_HEADER).and_then(|v| v.to_str().ok()) {
        return Some(t.to_owned());
    }
    if let Some(t) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        return Some(t.trim().to_owned());
    }
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())
}

/// Why a proxy is not registered yet, if its source knows.
pub type Waiting = std::sync::Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

async fn proxy_status(
    manager: &proxycfg::Manager,
    xds: &XdsServer,
    waiting: &(dyn Fn(&str) -> Option<String> + Send + Sync),
    proxy_id: &str,
    query: Option<&str>,
) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let node = query
        .unwrap_or_default()
        .split('&')
        .find_map(|kv| kv.strip_prefix("node="))
        .filter(|n| !n.is_empty());
    let matches: Vec<proxycfg::ProxyId> = manager
        .registered()
        .await
        .into_iter()
        .filter(|id| id.service_id == proxy_id && node.is_none_or(|n| id.node == n))
        .collect();
    let id = match matches.as_slice() {
        [one] => one.clone(),
        [] => {
            if let Some(reason) = waiting(proxy_id) {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("proxy {proxy_id:?}: {reason}\n"),
                )
                    .into_response();
            }
            return (
                StatusCode::NOT_FOUND,
                format!(
                    "proxy {proxy_id:?} is not registered here (an agent holds its local proxies; a server holds the proxies with an open xDS stream)\n"
                ),
            )
                .into_response();
        }
        more => {
            return (
                StatusCode::BAD_REQUEST,
                format!(
                    "proxy {proxy_id:?} is registered on {} nodes: add ?node=NODE\n",
                    more.len()
                ),
            )
                .into_response();
        }
    };
    let Some(status) = manager.status(&id).await else {
        return (
            StatusCode::NOT_FOUND,
            format!("proxy {proxy_id:?} was just deregistered\n"),
        )
            .into_response();
    };
    axum::Json(serde_json::json!({
        "Node": id.node,
        "ProxyID": id.service_id,
        "Source": status.source.to_string(),
        "SnapshotVersion": status.snapshot_version,
        "Errors": status.errors,
        "BuildErrors": xds.build_problems(&id),
    }))
    .into_response()
}

#[cfg(test)]
mod keepalive_tests {
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
