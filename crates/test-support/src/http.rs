//! Tiny HTTP/1.1 peers for end-to-end tests: backends bound on `127.0.0.1:0` (the listener
//! is kept, so the port cannot race) and a client that makes one request per connection.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::Instrument as _;

/// A backend on its own thread answering every request with 200 and the body `name`;
/// returns its port.
pub fn named_backend(name: &'static str) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a backend");
    let port = listener.local_addr().expect("backend address").port();
    let span = tracing::info_span!("named_backend", name, port);
    std::thread::spawn(move || {
        let _entered = span.enter();
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{name}",
                name.len()
            );
        }
    });
    port
}

/// A backend task: `GET /slow` answers after `slow`, anything else at once; every answer is
/// 200 `ok`, then the connection closes.
pub async fn backend(slow: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding a backend");
    let addr = listener.local_addr().expect("backend address");
    tokio::spawn(
        async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(
                    async move {
                        let mut buf = Vec::new();
                        let mut chunk = [0u8; 1024];
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        if buf.starts_with(b"GET /slow") {
                            tokio::time::sleep(slow).await;
                        }
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                            .await;
                    }
                    .in_current_span(),
                );
            }
        }
        .instrument(tracing::info_span!("backend", %addr)),
    );
    addr
}

/// One request on a fresh connection; `Ok(status)` once the whole response is in (headers
/// and content-length, as an HTTP client sees it), or why it failed. Bounded at 10 s.
pub async fn get(addr: SocketAddr, path: &str) -> Result<u16, String> {
    exchange(addr, path, &[]).await.map(|r| r.status)
}

/// A response [`exchange`] read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The status line and headers, as received.
    pub head: String,
    /// The body (as many bytes as `content-length` says; none without it).
    pub body: String,
}

impl Response {
    /// The value of the first header named `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// One `GET path` with `headers` on a fresh connection, the path sent exactly as given (no
/// client library resolving dot segments or escapes first); the response once it is all in,
/// or why it failed. Bounded at 10 s.
pub async fn exchange(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Result<Response, String> {
    let io = async {
        let mut s = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
        let mut req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
        for (name, value) in headers {
            req.push_str(&format!("{name}: {value}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).await.map_err(|e| format!("write: {e}"))?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&buf).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_owned())
                    })
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                if body.len() >= len {
                    let status = head
                        .split_whitespace()
                        .nth(1)
                        .and_then(|c| c.parse().ok())
                        .ok_or(format!("bad response {text:?}"))?;
                    return Ok(Response {
                        status,
                        head: head.to_owned(),
                        body: body.get(..len).unwrap_or(body).to_owned(),
                    });
                }
            }
            match s.read(&mut chunk).await {
                Ok(0) => return Err(format!("connection closed after {} bytes: {text:?}", buf.len())),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(format!("read: {e}")),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), io)
        .await
        .unwrap_or_else(|_| Err("timed out".into()))
}

/// One parked blocking query's answer, as the benchmarks time it: when its first and last
/// bytes arrived, the `X-Consul-Index` it carried, and its connection (kept open until the
/// figures are taken, as a client that blocks again would keep it).
pub struct Woken {
    /// The first response byte.
    pub first: std::time::Instant,
    /// The last (the head's end plus its `Content-Length`).
    pub last: std::time::Instant,
    /// The answer's index.
    pub index: Option<u64>,
    /// The connection.
    pub conn: TcpStream,
}

/// Parks `waiters` blocking `GET {path}` on `host` (a minimal HTTP/1.1 client per waiter,
/// one raw socket and one request each: the load generator shares the cores with the
/// server, so it must cost as little as possible) and sends each answer as it arrives.
pub fn park_waiters(host: &str, path: &str, waiters: usize) -> tokio::sync::mpsc::UnboundedReceiver<Woken> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..waiters {
        let (host, tx) = (host.to_owned(), tx.clone());
        let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n");
        tokio::spawn(async move {
            let Ok(mut conn) = TcpStream::connect(&host).await else {
                return;
            };
            if conn.write_all(request.as_bytes()).await.is_err() {
                return;
            }
            let mut buf = vec![0u8; 16 * 1024];
            let Ok(mut n) = conn.read(&mut buf).await else { return };
            let first = std::time::Instant::now();
            let whole = |got: &[u8]| {
                let text = String::from_utf8_lossy(got).to_ascii_lowercase();
                let (head, _) = text.split_once("\r\n\r\n")?;
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())?;
                Some(head.len() + 4 + length)
            };
            while whole(&buf[..n]).is_none_or(|len| n < len) && n < buf.len() {
                match conn.read(&mut buf[n..]).await {
                    Ok(0) | Err(_) => break,
                    Ok(more) => n += more,
                }
            }
            let last = std::time::Instant::now();
            let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
            let index = head
                .lines()
                .find_map(|l| l.strip_prefix("x-consul-index:"))
                .and_then(|v| v.trim().parse::<u64>().ok());
            let _ = tx.send(Woken {
                first,
                last,
                index,
                conn,
            });
        });
    }
    rx
}
