//! Serves an axum router over HTTP/1.1 and HTTP/2 connections (the version the client speaks:
//! ALPN over TLS, the HTTP/2 preface over plain TCP) from any `axum::serve::Listener` (plain
//! TCP with the per-client limit, or TLS), with deadlines a slow client cannot stretch:
//!
//! - the first bytes of a connection (enough to tell its HTTP version) must arrive within
//!   [`HEADER_READ_TIMEOUT`] of its start, and an HTTP/1.1 request head within as long of the
//!   previous response (hyper's own timeout, which needs a timer: `axum::serve` gives it none,
//!   so a client sending a byte a minute held its connection and read buffer for ever); past
//!   it the connection is closed;
//! - the whole request body must arrive within [`BODY_READ_TIMEOUT`] of the head; past it
//!   reading the body fails, the handler answers 400 naming the timeout, and the
//!   connection closes.
//!
//! HTTP/2 is how agents reach servers: every blocking query an agent parks rides one
//! connection per server instead of one connection each. Only servers speak it
//! ([`Versions`]); an agent's API stays HTTP/1.1. A connection carries at most
//! [`MAX_CONCURRENT_STREAMS`] requests at once, with headers capped as on HTTP/1.1.
//!
//! With the header cap (64 KiB) and the body cap (512 KiB) this bounds what one connection
//! holds and for how long; `-http-max-conns-per-client` bounds how many one client holds.
//! A blocking query is unaffected: its request arrives at once and its wait is the server's.
//!
//! On `stop`, no new connection is accepted, every connection finishes the requests it is
//! serving and closes, and the returned future completes once all have.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long a client has to send a request's head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a client has to send a request's body, once its head arrived.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// What one HTTP/2 request may send before the server reads it: more than the largest body
/// accepted (512 KiB), so a body is never cut into small frames by flow control.
pub const H2_STREAM_WINDOW: u32 = 1 << 20;
/// What all the requests of one HTTP/2 connection may send before the server reads it: room
/// for hundreds of registrations at once (an agent syncing a large node). With smaller
/// windows the client cuts concurrent bodies into many small frames, which h2's flood
/// protection answers by closing the connection (GOAWAY `ENHANCE_YOUR_CALM`), failing every
/// request on it.
pub const H2_CONNECTION_WINDOW: u32 = 8 << 20;
/// Requests one HTTP/2 connection may have in flight (an agent's parked blocking queries
/// share one connection; past this, its further requests wait for a slot).
pub const MAX_CONCURRENT_STREAMS: u32 = 4096;

/// The deadlines of [`serve`]; tests shorten them.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    /// See [`HEADER_READ_TIMEOUT`].
    pub header: Duration,
    /// See [`BODY_READ_TIMEOUT`].
    pub body: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            header: HEADER_READ_TIMEOUT,
            body: BODY_READ_TIMEOUT,
        }
    }
}

/// The HTTP versions a listener speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Versions {
    /// HTTP/1.1 only: an agent's API, whose clients are local tools. One connection then
    /// buffers at most hyper's read buffer, where HTTP/2 may hold its whole window
    /// ([`H2_CONNECTION_WINDOW`]) of unread request data, which a local client could
    /// multiply by `-http-max-conns-per-client`.
    Http1,
    /// HTTP/1.1 and HTTP/2: a server's API, which agents reach over HTTP/2.
    Http1And2,
}

impl Versions {
    /// The ALPN protocols an HTTPS listener offers for these versions.
    pub fn alpn(self) -> Vec<Vec<u8>> {
        match self {
            Versions::Http1 => vec![b"http/1.1".to_vec()],
            Versions::Http1And2 => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        }
    }
}

/// What the listeners serve: an [`axum::Router`], or one inside layers that apply to the whole app
/// at once (a layer added with `Router::layer` wraps every route instead, and costs every
/// request a clone and a boxed future, paid again when a parked blocking query wakes).
pub trait App:
    tower::Service<
        http::Request<axum::body::Body>,
        Response = axum::response::Response,
        Error = std::convert::Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> App for S where
    S: tower::Service<
            http::Request<axum::body::Body>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// Serves `app` on the connections `listener` accepts until `stop` fires and every
/// connection has finished (see the module's docs).
pub async fn serve<L, A: App>(
    mut listener: L,
    app: A,
    versions: Versions,
    deadlines: Deadlines,
    stop: CancellationToken,
) -> std::io::Result<()>
where
    L: axum::serve::Listener<Addr = std::net::SocketAddr>,
{
    let connections = TaskTracker::new();
    loop {
        let (io, peer) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let body_deadline = deadlines.body;
        let app = app.clone();
        // Each request: headers past the cap refused, the body read under its deadline.
        let service = tower::service_fn(move |req: http::Request<Incoming>| {
            use futures_util::future::Either;
            match crate::header_cap::refusal(&req) {
                Some(refused) => Either::Left(std::future::ready(Ok(refused))),
                None => {
                    let mut req = req.map(|b| axum::body::Body::new(DeadlineBody::new(b, body_deadline)));
                    // Who asked (the audit log records it).
                    req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
                    Either::Right(tower::Service::call(&mut app.clone(), req))
                }
            }
        });
        let stop = stop.clone();
        connections.spawn(tracing::Instrument::in_current_span(async move {
            let io = TokioIo::new(crate::first_bytes::FirstBytesDeadline::new(io, deadlines.header));
            let service = TowerToHyperService::new(service);
            match versions {
                Versions::Http1 => {
                    let mut builder = hyper::server::conn::http1::Builder::new();
                    builder.timer(TokioTimer::new()).header_read_timeout(deadlines.header);
                    let conn = builder.serve_connection(io, service).with_upgrades();
                    until_stopped(conn, &stop, |c| c.graceful_shutdown()).await;
                }
                Versions::Http1And2 => {
                    let mut builder = auto::Builder::new(SpannedExecutor);
                    builder
                        .http1()
                        .timer(TokioTimer::new())
                        .header_read_timeout(deadlines.header);
                    builder
                        .http2()
                        .timer(TokioTimer::new())
                        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
                        .max_header_list_size(crate::header_cap::MAX_HEADER_BYTES as u32)
                        .initial_stream_window_size(H2_STREAM_WINDOW)
                        .initial_connection_window_size(H2_CONNECTION_WINDOW);
                    let conn = builder.serve_connection_with_upgrades(io, service);
                    until_stopped(conn, &stop, |c| c.graceful_shutdown()).await;
                }
            }
        }));
    }
    connections.close();
    connections.wait().await;
    Ok(())
}

/// [`serve`] on a plain TCP listener, each client address holding at most `per_client`
/// connections (0: no limit), with the default deadlines.
pub async fn serve_plain<A: App>(
    listener: tokio::net::TcpListener,
    per_client: u32,
    app: A,
    versions: Versions,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let listener = crate::conn_limit::PerClientLimit::new(listener, per_client);
    serve(listener, app, versions, Deadlines::default(), stop).await
}

/// Drives one connection to its end; once `stop` fires, it finishes the requests it is
/// serving (`shutdown` starts that) and closes.
async fn until_stopped<C, E>(conn: C, stop: &CancellationToken, shutdown: impl FnOnce(Pin<&mut C>))
where
    C: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = stop.cancelled() => {
            shutdown(conn.as_mut());
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "HTTP connection ended with an error");
    }
}

/// Runs the tasks of an HTTP/2 connection's requests in the connection's span.
#[derive(Clone, Copy)]
struct SpannedExecutor;

impl<F> hyper::rt::Executor<F> for SpannedExecutor
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        tokio::spawn(tracing::Instrument::in_current_span(fut));
    }
}

/// A request body that fails once its deadline has passed.
struct DeadlineBody {
    inner: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    after: Duration,
}

impl DeadlineBody {
    fn new(inner: Incoming, after: Duration) -> Self {
        Self {
            inner,
            deadline: Box::pin(tokio::time::sleep(after)),
            after,
        }
    }
}

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    #[error("the request body did not arrive within {}", humantime::format_duration(*.0))]
    TooSlow(Duration),
    #[error(transparent)]
    Read(#[from] hyper::Error),
}

impl Body for DeadlineBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(BodyError::from)));
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(BodyError::TooSlow(self.after)))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests;
