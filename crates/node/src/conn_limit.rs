//! The HTTP listeners' per-client connection limit (Consul's `http_max_conns_per_client`): a
//! client address with `max` connections open gets a 429 on its next one, which is then
//! closed, so one client (or a slow one holding connections) cannot take every socket and
//! the memory behind them.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tracing::warn;

/// Open connections by client address.
type Counts = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// The per-client counts and the limit, shared by a listener's accept loop (the plain
/// listener below, and the HTTPS one, which counts connections before their handshake).
#[derive(Debug, Clone)]
pub struct ClientCounts {
    max: usize,
    open: Counts,
    last_warned: Arc<Mutex<Option<Instant>>>,
}

impl ClientCounts {
    /// At most `max` open connections per client address (0: no limit).
    pub fn new(max: u32) -> Self {
        Self {
            max: usize::try_from(max).unwrap_or(usize::MAX),
            open: Arc::default(),
            last_warned: Arc::default(),
        }
    }

    /// `stream` from `ip`, counted until it is dropped; or given back when `ip` is at its
    /// limit, for the caller to refuse (a warning is logged at most every 10 s).
    pub fn admit(&self, stream: TcpStream, ip: IpAddr) -> Result<Counted, TcpStream> {
        let admitted = {
            let mut open = self.open.lock();
            let n = open.entry(ip).or_insert(0);
            if self.max == 0 || *n < self.max {
                *n += 1;
                true
            } else {
                false
            }
        };
        if admitted {
            return Ok(Counted {
                stream,
                ip,
                open: Arc::clone(&self.open),
            });
        }
        let mut last = self.last_warned.lock();
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            *last = Some(Instant::now());
            warn!(client = %ip, limit = self.max, "client has too many HTTP connections open; refusing more, -http-max-conns-per-client");
        }
        Err(stream)
    }

    /// Connections open now from `ip`.
    pub fn open_from(&self, ip: IpAddr) -> usize {
        self.open.lock().get(&ip).copied().unwrap_or(0)
    }
}

/// A listener that admits at most `max` open connections per client address (0: no limit).
#[derive(Debug)]
pub struct PerClientLimit {
    inner: TcpListener,
    counts: ClientCounts,
}

impl PerClientLimit {
    /// `inner` with the limit.
    pub fn new(inner: TcpListener, max: u32) -> Self {
        Self {
            inner,
            counts: ClientCounts::new(max),
        }
    }

    /// Connections open now from `ip`.
    pub fn open_from(&self, ip: IpAddr) -> usize {
        self.counts.open_from(ip)
    }
}

/// An admitted connection; its client's count goes down when it closes.
#[derive(Debug)]
pub struct Counted {
    stream: TcpStream,
    ip: IpAddr,
    open: Counts,
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut open = self.open.lock();
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// The body of the answer to a connection past the limit.
const TOO_MANY_BODY: &str = "too many HTTP connections open from this address: close some, then retry\n";

/// The answer to a connection past the limit (written if the socket takes it at once).
fn too_many() -> Vec<u8> {
    format!(
        "HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{TOO_MANY_BODY}",
        TOO_MANY_BODY.len()
    )
    .into_bytes()
}

impl axum::serve::Listener for PerClientLimit {
    type Io = Counted;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Counted, SocketAddr) {
        loop {
            let (stream, addr) = axum::serve::Listener::accept(&mut self.inner).await;
            match self.counts.admit(stream, addr.ip()) {
                Ok(counted) => return (counted, addr),
                // Best effort: a 429 saying why, then the connection closes (never waiting on
                // a client that does not read).
                Err(refused) => {
                    let _ = refused.try_write(&too_many());
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

impl Counted {
    /// Reads the first bytes the client sent without consuming them (see
    /// [`TcpStream::peek`]).
    pub async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.peek(buf).await
    }

    /// The client's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.stream.peer_addr()
    }

    /// The address the connection was accepted on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.stream.local_addr()
    }
}

impl AsyncRead for Counted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::serve::Listener;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn a_client_past_its_limit_gets_a_429_and_its_count_goes_down_as_connections_close() {
        let inner = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = inner.local_addr().unwrap();
        let mut limit = PerClientLimit::new(inner, 2);
        let ip: IpAddr = "127.0.0.1".parse().unwrap();

        let c1 = TcpStream::connect(addr).await.unwrap();
        let (a1, _) = limit.accept().await;
        let _c2 = TcpStream::connect(addr).await.unwrap();
        let (a2, _) = limit.accept().await;
        assert_eq!(limit.open_from(ip), 2);

        // The third is refused with a 429 while accept goes on waiting for an admitted one.
        let mut c3 = TcpStream::connect(addr).await.unwrap();
        let mut answer = String::new();
        {
            let accept = limit.accept();
            tokio::pin!(accept);
            tokio::select! {
                _ = &mut accept => panic!("admitted past the limit"),
                read = c3.read_to_string(&mut answer) => read.unwrap(),
            };
            assert!(answer.starts_with("HTTP/1.1 429 Too Many Requests"), "{answer:?}");
            assert!(answer.ends_with(TOO_MANY_BODY), "{answer:?}");
            // One closes: the next is admitted.
            drop(a1);
            drop(c1);
            let _c4 = TcpStream::connect(addr).await.unwrap();
            let (a4, _) = tokio::time::timeout(Duration::from_secs(10), accept).await.unwrap();
            assert_eq!(a4.ip, ip);
            drop(a4);
        }
        assert_eq!(limit.open_from(ip), 1, "c2");
        drop(a2);
        assert_eq!(limit.open_from(ip), 0);
    }
}
