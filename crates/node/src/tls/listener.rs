//! Accepting TLS connections: a task accepts TCP connections (counted per client, as the
//! plain HTTP listener counts them), refuses plaintext HTTP with a 400 as Go's servers do,
//! and runs each handshake in its own task under a deadline, so a slow or silent client
//! never holds up the others. Handshaken connections come out of a channel, read by
//! `axum::serve` (the HTTPS API) or by tonic (xDS over TLS).

use crate::conn_limit::{ClientCounts, Counted};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_rustls::LazyConfigAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, debug, info_span, warn};

/// How long a client has to complete its handshake (Consul's `https_handshake_timeout`).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The first byte of a TLS handshake record; anything else is not TLS.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The body of the answer to plaintext HTTP on a TLS port (Go's words).
pub const PLAINTEXT_BODY: &str = "Client sent an HTTP request to an HTTPS server.\n";

/// How long the refusal waits for the client to finish sending before closing: closing with
/// unread data would reset the connection and lose the 400 before the client reads it.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// A TLS connection, handshake done: its stream and the client's address.
pub type Accepted = (TlsStream<Counted>, SocketAddr);

/// TLS a mode serves for names of its own (a server's peering name on the gRPC TLS
/// listener), chosen by the name the client asks for (SNI).
pub trait ServerNames: Send + Sync + 'static {
    /// The configuration serving a client that asked for `name`; `None`: not one of the
    /// mode's names.
    fn config_for(&self, name: &str) -> Option<Arc<rustls::ServerConfig>>;
}

/// What a TLS listener serves: the mode's names with their own configurations, every other
/// client with `default` (none: only the mode's names are served; others' handshakes fail).
#[derive(Clone)]
pub struct Certs {
    /// The operator's certificate (`-tls-cert-file`).
    pub default: Option<Arc<rustls::ServerConfig>>,
    /// The mode's names.
    pub names: Option<Arc<dyn ServerNames>>,
}

impl From<Arc<rustls::ServerConfig>> for Certs {
    fn from(config: Arc<rustls::ServerConfig>) -> Self {
        Self {
            default: Some(config),
            names: None,
        }
    }
}

impl Certs {
    /// The configuration for a client that asked for `name`.
    fn choose(&self, name: Option<&str>) -> io::Result<Arc<rustls::ServerConfig>> {
        let own = name.and_then(|n| self.names.as_ref()?.config_for(n));
        own.or_else(|| self.default.clone())
            .ok_or_else(|| io::Error::other(format!("no certificate for the server name {name:?}")))
    }
}

/// The connections a TLS listener accepted, handshakes done (see the module docs). The
/// accept task ends when `stop` fires or when this is dropped; pending handshakes end with it.
#[derive(Debug)]
pub struct TlsIncoming {
    accepted: mpsc::Receiver<Accepted>,
    local_addr: SocketAddr,
    _task: AbortOnDropHandle<()>,
}

impl TlsIncoming {
    /// Starts accepting on `listener` serving `certs`, admitting per `counts`.
    pub fn start(
        listener: TcpListener,
        certs: impl Into<Certs>,
        counts: ClientCounts,
        stop: CancellationToken,
        what: &'static str,
    ) -> io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let (tx, accepted) = mpsc::channel(64);
        let certs = Arc::new(certs.into());
        let task = tokio::spawn(
            accept_loop(listener, certs, counts, tx, stop).instrument(info_span!("tls_accept", what, %local_addr)),
        );
        Ok(Self {
            accepted,
            local_addr,
            _task: AbortOnDropHandle::new(task),
        })
    }

    /// The next handshaken connection; `None` once the accept task ended.
    pub async fn next(&mut self) -> Option<Accepted> {
        self.accepted.recv().await
    }

    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The connections as the stream tonic serves.
    pub fn into_grpc(self) -> GrpcIncoming {
        GrpcIncoming(self)
    }

    /// The connections as two streams tonic serves: those whose client asked for a name
    /// `own` takes (a mode's own names: they are served the mode's services alone), and
    /// the others. Both end when this listener stops or both are dropped.
    pub fn split_grpc(mut self, own: impl Fn(&str) -> bool + Send + 'static) -> (SplitIncoming, SplitIncoming) {
        let (own_tx, own_rx) = mpsc::channel(64);
        let (other_tx, other_rx) = mpsc::channel(64);
        let local_addr = self.local_addr;
        tokio::spawn(async move {
            while let Some((stream, remote)) = self.next().await {
                let named = stream.get_ref().1.server_name().is_some_and(&own);
                let io = GrpcTlsIo {
                    stream,
                    info: tonic::transport::server::TcpConnectInfo {
                        local_addr: Some(local_addr),
                        remote_addr: Some(remote),
                    },
                };
                let tx = if named { &own_tx } else { &other_tx };
                // A dropped receiver: that half stopped serving; the connection closes.
                let _ = tx.send(Ok(io)).await;
                if own_tx.is_closed() && other_tx.is_closed() {
                    return;
                }
            }
        });
        (
            tokio_stream::wrappers::ReceiverStream::new(own_rx),
            tokio_stream::wrappers::ReceiverStream::new(other_rx),
        )
    }
}

/// One half of [`TlsIncoming::split_grpc`].
pub type SplitIncoming = tokio_stream::wrappers::ReceiverStream<io::Result<GrpcTlsIo>>;

/// [`TlsIncoming`] as the stream of connections tonic serves.
#[derive(Debug)]
pub struct GrpcIncoming(TlsIncoming);

impl tokio_stream::Stream for GrpcIncoming {
    type Item = io::Result<GrpcTlsIo>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let local_addr = self.0.local_addr;
        self.0.accepted.poll_recv(cx).map(|accepted| {
            accepted.map(|(stream, remote)| {
                Ok(GrpcTlsIo {
                    stream,
                    info: tonic::transport::server::TcpConnectInfo {
                        local_addr: Some(local_addr),
                        remote_addr: Some(remote),
                    },
                })
            })
        })
    }
}

impl axum::serve::Listener for TlsIncoming {
    type Io = TlsStream<Counted>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> Accepted {
        match self.next().await {
            Some(accepted) => accepted,
            // The accept task ended (stopping): nothing more comes; the server's graceful
            // shutdown ends the serving.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local_addr)
    }
}

async fn accept_loop(
    listener: TcpListener,
    certs: Arc<Certs>,
    counts: ClientCounts,
    tx: mpsc::Sender<Accepted>,
    stop: CancellationToken,
) {
    let mut handshakes = JoinSet::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tx.closed() => return,
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((tcp, remote)) => {
                    let _ = tcp.set_nodelay(true);
                    // Past the limit the connection closes before any handshake: what the
                    // limit bounds is the work a client can make the server do.
                    let Ok(counted) = counts.admit(tcp, remote.ip()) else { continue };
                    handshakes.spawn(
                        serve_handshake(counted, remote, Arc::clone(&certs), tx.clone())
                            .instrument(info_span!("tls_handshake", %remote)),
                    );
                }
                Err(error) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    warn!(%error, "cannot accept a connection");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                }
            },
        }
    }
}

async fn serve_handshake(tcp: Counted, remote: SocketAddr, certs: Arc<Certs>, tx: mpsc::Sender<Accepted>) {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(tcp, &certs)).await {
        Ok(Ok(Some(stream))) => {
            // A dropped receiver means stopping: the connection closes with it.
            let _ = tx.send((stream, remote)).await;
        }
        Ok(Ok(None)) => {}
        Ok(Err(error)) => debug!(%error, "TLS handshake failed"),
        Err(_) => debug!("TLS handshake timed out"),
    }
}

/// The handshaken stream; `None` when the client closed first or sent plaintext (answered).
async fn handshake(tcp: Counted, certs: &Certs) -> io::Result<Option<TlsStream<Counted>>> {
    let mut first = [0u8; 1];
    if tcp.peek(&mut first).await? == 0 {
        return Ok(None);
    }
    if first[0] != TLS_HANDSHAKE_RECORD {
        refuse_plaintext(tcp).await?;
        return Ok(None);
    }
    let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), tcp).await?;
    let config = certs.choose(start.client_hello().server_name())?;
    start.into_stream(config).await.map(Some)
}

/// The answer to plaintext on a TLS port.
pub fn plaintext_refusal() -> String {
    format!(
        "HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{PLAINTEXT_BODY}",
        PLAINTEXT_BODY.len()
    )
}

/// Answers a 400 without reading the request as one (it is never served), then closes once
/// the client stopped sending (or after a short linger).
async fn refuse_plaintext(mut tcp: Counted) -> io::Result<()> {
    debug!("plaintext on a TLS port: answered 400");
    tcp.write_all(plaintext_refusal().as_bytes()).await?;
    tcp.shutdown().await?;
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(REFUSAL_LINGER, async {
        let mut left = 64 * 1024usize;
        while left > 0 {
            match tcp.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
    Ok(())
}

/// A TLS connection as tonic serves it, with its addresses.
#[derive(Debug)]
pub struct GrpcTlsIo {
    stream: TlsStream<Counted>,
    info: tonic::transport::server::TcpConnectInfo,
}

impl tonic::transport::server::Connected for GrpcTlsIo {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for GrpcTlsIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for GrpcTlsIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Serves `app` over TLS on `listener` (the HTTPS API) with `config`, at most
/// `max_conns_per_client` connections per client address (0: no limit), until `stop` fires;
/// in-flight requests finish first. Returns the bound address and the serving task.
pub fn serve_https<A: crate::http_serve::App>(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    max_conns_per_client: u32,
    app: A,
    versions: crate::http_serve::Versions,
    stop: CancellationToken,
) -> io::Result<(SocketAddr, tokio::task::JoinHandle<io::Result<()>>)> {
    let incoming = TlsIncoming::start(
        listener,
        config,
        ClientCounts::new(max_conns_per_client),
        stop.clone(),
        "https",
    )?;
    let https_addr = incoming.local_addr();
    let task = tokio::spawn(
        async move {
            crate::http_serve::serve(incoming, app, versions, crate::http_serve::Deadlines::default(), stop).await
        }
        .instrument(info_span!("https_api", %https_addr)),
    );
    Ok((https_addr, task))
}
