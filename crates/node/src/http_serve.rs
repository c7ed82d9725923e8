//! Serves an axum router over HTTP/1.1 connections from any `axum::serve::Listener` (plain
//! TCP with the per-client limit, or TLS), with deadlines a slow client cannot stretch:
//!
//! - the request head (line and headers) must arrive within [`HEADER_READ_TIMEOUT`] of the
//!   connection's start or of the previous response (hyper's own timeout, which needs a
//!   timer: `axum::serve` gives it none, so a client sending a byte a minute held its
//!   connection and read buffer for ever); past it the connection is closed;
//! - the whole request body must arrive within [`BODY_READ_TIMEOUT`] of the head; past it
//!   reading the body fails, the handler answers 400 naming the timeout, and the
//!   connection closes.
//!
//! With the header cap (64 KiB) and the body cap (512 KiB) this bounds what one connection
//! holds and for how long; `-http-max-conns-per-client` bounds how many one client holds.
//! A blocking query is unaffected: its request arrives at once and its wait is the server's.
//!
//! On `stop`, no new connection is accepted, every connection finishes the request it is
//! serving and closes, and the returned future completes once all have.

use axum::Router;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// How long a client has to send a request's head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a client has to send a request's body, once its head arrived.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

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

/// Serves `app` on the connections `listener` accepts until `stop` fires and every
/// connection has finished (see the module's docs).
pub async fn serve<L>(
    mut listener: L,
    app: Router,
    deadlines: Deadlines,
    stop: CancellationToken,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
{
    let connections = TaskTracker::new();
    loop {
        let (io, _) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let body_deadline = deadlines.body;
        let service = app.clone().map_request(move |req: http::Request<Incoming>| {
            req.map(|b| axum::body::Body::new(DeadlineBody::new(b, body_deadline)))
        });
        let stop = stop.clone();
        connections.spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(deadlines.header);
            let conn = builder
                .serve_connection(TokioIo::new(io), TowerToHyperService::new(service))
                .with_upgrades();
            tokio::pin!(conn);
            let result = tokio::select! {
                result = conn.as_mut() => result,
                () = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "HTTP connection ended with an error");
            }
        });
    }
    connections.close();
    connections.wait().await;
    Ok(())
}

/// [`serve`] on a plain TCP listener, each client address holding at most `per_client`
/// connections (0: no limit), with the default deadlines.
pub async fn serve_plain(
    listener: tokio::net::TcpListener,
    per_client: u32,
    app: Router,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let listener = crate::conn_limit::PerClientLimit::new(listener, per_client);
    serve(listener, app, Deadlines::default(), stop).await
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
mod tests {
    use super::*;
    use axum::routing::{get, post};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    const SHORT: Deadlines = Deadlines {
        header: Duration::from_millis(300),
        body: Duration::from_millis(300),
    };
    /// Far longer than any deadline here: only a server that never closes reaches it.
    const NEVER: Duration = Duration::from_secs(20);

    type Started = (
        std::net::SocketAddr,
        CancellationToken,
        tokio::task::JoinHandle<std::io::Result<()>>,
        std::sync::Arc<tokio::sync::Notify>,
    );

    /// A server whose `/slow` takes a second, telling `entered` when it starts.
    async fn start() -> Started {
        let entered = std::sync::Arc::new(tokio::sync::Notify::new());
        let tell = entered.clone();
        let app = Router::new()
            .route("/echo", post(|body: Bytes| async move { body }))
            .route(
                "/slow",
                get(move || async move {
                    tell.notify_one();
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    "done"
                }),
            );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve(listener, app, SHORT, stop.clone()));
        (addr, stop, task, entered)
    }

    /// Everything the server sends until it closes the connection.
    async fn read_to_close(conn: &mut TcpStream) -> String {
        let mut out = Vec::new();
        tokio::time::timeout(NEVER, conn.read_to_end(&mut out))
            .await
            .expect("the server never closed the connection")
            .unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_head_is_disconnected() {
        let (addr, _stop, _task, _) = start().await;
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /slow HTTP/1.1\r\nHost: a\r\nX-Slow: ")
            .await
            .unwrap();
        let answer = read_to_close(&mut conn).await;
        // hyper answers 408 or closes silently; never a response to the request.
        assert!(!answer.contains("done"), "{answer}");
    }

    #[tokio::test]
    async fn a_body_that_does_not_arrive_in_time_is_refused_naming_the_deadline() {
        let (addr, _stop, _task, _) = start().await;
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nonly ten b")
            .await
            .unwrap();
        let answer = read_to_close(&mut conn).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(
            answer.contains("the request body did not arrive within 300ms"),
            "{answer}"
        );
    }

    #[tokio::test]
    async fn whole_requests_are_served_and_a_slow_handler_is_not_cut() {
        let (addr, stop, task, entered) = start().await;
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello")
            .await
            .unwrap();
        // The handler takes longer than both deadlines: they bound the client, not the server.
        conn.write_all(b"GET /slow HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let answer = read_to_close(&mut conn).await;
        assert!(answer.contains("hello"), "{answer}");
        assert!(answer.ends_with("done"), "{answer}");
        entered.notified().await; // that request's notice
        // A request in flight at shutdown is finished first.
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n").await.unwrap();
        let reader = tokio::spawn(async move { read_to_close(&mut conn).await });
        entered.notified().await;
        stop.cancel();
        assert!(reader.await.unwrap().ends_with("done"));
        task.await.unwrap().unwrap();
    }
}
