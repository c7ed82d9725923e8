//! A deadline on a connection's first bytes: until [`FIRST_BYTES`] bytes have been read, a
//! read that is still waiting when the deadline passes fails with `TimedOut`, and the
//! connection is closed. It covers what hyper's own HTTP/1.1 head timeout cannot: the bytes
//! read to tell HTTP/1.1 from the HTTP/2 preface, before either protocol has started.

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes the deadline covers: the length of the HTTP/2 connection preface.
pub const FIRST_BYTES: usize = 24;

/// `inner`, whose first [`FIRST_BYTES`] bytes must arrive within the deadline.
pub struct FirstBytesDeadline<T> {
    inner: T,
    /// Bytes still to arrive under the deadline, and the deadline; `None` once they have.
    pending: Option<(usize, Pin<Box<tokio::time::Sleep>>)>,
}

impl<T> FirstBytesDeadline<T> {
    /// Arms the deadline `within` from now.
    pub fn new(inner: T, within: Duration) -> Self {
        Self {
            inner,
            pending: Some((FIRST_BYTES, Box::pin(tokio::time::sleep(within)))),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for FirstBytesDeadline<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                let read = buf.filled().len() - before;
                if let Some((left, _)) = &mut this.pending {
                    *left = left.saturating_sub(read);
                    if *left == 0 || read == 0 {
                        this.pending = None;
                    }
                }
                Poll::Ready(result)
            }
            Poll::Pending => {
                let expired = this
                    .pending
                    .as_mut()
                    .is_some_and(|(_, deadline)| deadline.as_mut().poll(cx).is_ready());
                if expired {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client sent no request in time",
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FirstBytesDeadline<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
