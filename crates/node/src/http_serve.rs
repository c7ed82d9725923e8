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
        connections.spawn(tracing::Instrument::in_current_span(async move {
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
        }));
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
mod tests;
