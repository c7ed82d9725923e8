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
            if let Some(head) = message_head(&buf) {
                let len = header_value(head, "content-length")
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                let body = &buf[head.len() + 4..];
                if body.len() >= len {
                    let head = String::from_utf8_lossy(head).into_owned();
                    let status = head
                        .split_whitespace()
                        .nth(1)
                        .and_then(|c| c.parse().ok())
                        .ok_or(format!("bad response {head:?}"))?;
                    let body = String::from_utf8_lossy(&body[..len]).into_owned();
                    return Ok(Response { status, head, body });
                }
            }
            match s.read(&mut chunk).await {
                Ok(0) => {
                    let text = String::from_utf8_lossy(&buf);
                    return Err(format!("connection closed after {} bytes: {text:?}", buf.len()));
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(format!("read: {e}")),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), io)
        .await
        .unwrap_or_else(|_| Err("timed out".into()))
}

/// The head of an HTTP message (up to its blank line), once it has all arrived.
pub fn message_head(got: &[u8]) -> Option<&[u8]> {
    got.windows(4).position(|w| w == b"\r\n\r\n").map(|end| &got[..end])
}

/// The value of the header `name` (matched without regard to case) in a response head.
pub fn header_value<'a>(head: &'a [u8], name: &str) -> Option<&'a str> {
    head.split(|&b| b == b'\n').find_map(|line| {
        let (found, rest) = line.split_at_checked(name.len())?;
        let value = rest.strip_prefix(b":")?;
        if !found.eq_ignore_ascii_case(name.as_bytes()) {
            return None;
        }
        std::str::from_utf8(value).ok().map(str::trim)
    })
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
            // Byte searches, no allocation: with thousands of answers arriving at once, the
            // generator's own work per answer delays the ones behind it.
            let whole = |got: &[u8]| {
                let head = message_head(got)?;
                let length: usize = header_value(head, "content-length")?.parse().ok()?;
                Some(head.len() + 4 + length)
            };
            while whole(&buf[..n]).is_none_or(|len| n < len) && n < buf.len() {
                match conn.read(&mut buf[n..]).await {
                    Ok(0) | Err(_) => break,
                    Ok(more) => n += more,
                }
            }
            let last = std::time::Instant::now();
            let index = message_head(&buf[..n])
                .and_then(|head| header_value(head, "x-consul-index"))
                .and_then(|v| v.parse::<u64>().ok());
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

/// The floor of a blocking-query wake-up on this machine: a minimal HTTP/1.1 server, one
/// task in a process of its own, that parks each connection once its request head has
/// arrived and, when told, writes one pre-encoded answer to all of them in one pass (split
/// over the cores it may run on, a thread each). It is
/// what a server could do at best (no task woken per connection, no request routed, no
/// answer encoded or framed per connection); the benchmarks time it with [`park_waiters`]
/// beside meshd's own wake-up, the answer meshd gave replayed. A process of its own, as
/// meshd's server is: both ends of thousands of connections in one process would need twice
/// the open files, and it can be pinned to a core.
pub struct WakeFloor {
    /// Where it listens.
    pub addr: SocketAddr,
    child: std::process::Child,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

/// The variable that makes a benchmark binary serve as a [`WakeFloor`] (see
/// [`serve_wake_floor_if_asked`]); its value is how many connections it waits for.
pub const WAKE_FLOOR_VAR: &str = "MESHD_BENCH_WAKE_FLOOR";

impl WakeFloor {
    /// Starts the floor server: this executable again, with [`WAKE_FLOOR_VAR`] set (its
    /// `main` calls [`serve_wake_floor_if_asked`] first), waiting for `waiters` connections.
    pub fn start(waiters: usize) -> WakeFloor {
        use std::io::BufRead as _;
        let exe = std::env::current_exe().expect("this benchmark's executable");
        let mut child = std::process::Command::new(exe)
            .env(WAKE_FLOOR_VAR, waiters.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("starting the floor server");
        let stdout = child.stdout.take().expect("the floor server's stdout");
        let mut lines = std::io::BufReader::new(stdout).lines();
        let addr = lines
            .next()
            .and_then(Result::ok)
            .and_then(|l| l.strip_prefix("floor listening on ")?.parse().ok())
            .expect("the floor server's address");
        WakeFloor { addr, child, lines }
    }

    /// Its process id (to pin it, and to read its CPU time).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Blocks until every connection has sent its request head and waits; false if the
    /// server ended first.
    pub fn wait_parked(&mut self) -> bool {
        self.lines.next().is_some_and(|l| l.is_ok_and(|l| l == "floor parked"))
    }

    /// Writes `answer` to every parked connection (once).
    pub fn wake(&mut self, answer: &[u8]) {
        use std::io::Write as _;
        if let Some(stdin) = self.child.stdin.as_mut() {
            let _ = stdin.write_all(&(answer.len() as u64).to_le_bytes());
            let _ = stdin.write_all(answer);
            let _ = stdin.flush();
        }
    }
}

impl Drop for WakeFloor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// In a benchmark's `main`, first: serves as a [`WakeFloor`] when [`WAKE_FLOOR_VAR`] asks
/// (and returns true once its parent is gone), else returns false at once.
pub fn serve_wake_floor_if_asked() -> bool {
    let Some(waiters) = std::env::var(WAKE_FLOOR_VAR).ok().and_then(|v| v.parse::<usize>().ok()) else {
        return false;
    };
    // A backlog for thousands of connections arriving at once (std's is 128).
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .expect("a socket for the floor server");
    let bound = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    socket.bind(&bound.into()).expect("binding the floor server");
    socket.listen(16_384).expect("listening");
    socket.set_nonblocking(true).expect("a non-blocking listener");
    let listener: std::net::TcpListener = socket.into();
    let addr = listener.local_addr().expect("the floor server's address");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("the floor server's runtime");
    let (answer_tx, answer_rx) = tokio::sync::oneshot::channel();
    // The parent's orders on stdin: the answer (length, then bytes); its end, the parent's.
    let (eof_tx, eof_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        use std::io::Read as _;
        let mut stdin = std::io::stdin().lock();
        let mut len = [0u8; 8];
        if stdin.read_exact(&mut len).is_ok() {
            let mut answer = vec![0u8; u64::from_le_bytes(len) as usize];
            if stdin.read_exact(&mut answer).is_ok() {
                let _ = answer_tx.send(answer);
            }
        }
        let _ = std::io::copy(&mut stdin, &mut std::io::sink());
        let _ = eof_tx.send(());
    });
    say(&format!("floor listening on {addr}"));
    rt.block_on(floor_serve(listener, waiters, answer_rx, eof_rx));
    true
}

/// One line to the parent, at once.
fn say(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The floor server's one task (with a reader per connection until its head is in).
async fn floor_serve(
    listener: std::net::TcpListener,
    waiters: usize,
    mut answer: tokio::sync::oneshot::Receiver<Vec<u8>>,
    stop: tokio::sync::oneshot::Receiver<()>,
) {
    let Ok(listener) = TcpListener::from_std(listener) else {
        return;
    };
    let (tx, mut heads_in) = tokio::sync::mpsc::unbounded_channel::<TcpStream>();
    let mut conns = Vec::new();
    let answer = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((mut conn, _)) = accepted else { continue };
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::with_capacity(512);
                    let mut chunk = [0u8; 512];
                    while message_head(&buf).is_none() {
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let _ = tx.send(conn);
                });
            }
            Some(conn) = heads_in.recv() => {
                conns.push(conn);
                if conns.len() == waiters {
                    say("floor parked");
                }
            }
            answer = &mut answer => match answer {
                Ok(answer) => break answer,
                Err(_) => return,
            },
        }
    };
    // One pass, split over the cores this process may run on (one thread each): a loopback
    // socket with nothing in flight takes a small answer whole.
    let shards = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per_shard = conns.len().div_ceil(shards).max(1);
    let rest: Vec<(usize, usize)> = std::thread::scope(|scope| {
        let answer = &answer;
        let handles: Vec<_> = conns
            .chunks(per_shard)
            .enumerate()
            .map(|(shard, part)| {
                scope.spawn(move || {
                    let mut rest = Vec::new();
                    for (i, conn) in part.iter().enumerate() {
                        match conn.try_write(answer) {
                            Ok(n) if n == answer.len() => {}
                            Ok(n) => rest.push((shard * per_shard + i, n)),
                            Err(_) => rest.push((shard * per_shard + i, 0)),
                        }
                    }
                    rest
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    });
    for (i, written) in rest {
        let _ = conns[i].write_all(&answer[written..]).await;
    }
    let _ = stop.await;
}

#[cfg(test)]
mod tests {
    use super::{header_value, message_head};

    #[test]
    fn a_head_is_found_once_whole_and_its_headers_by_any_case() {
        let partial = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n";
        assert_eq!(message_head(partial), None);
        let whole = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nX-Consul-Index: 42\r\n\r\n[{\"a\": 1}]\n";
        let head = message_head(whole).unwrap();
        assert!(head.ends_with(b"X-Consul-Index: 42"));
        assert_eq!(header_value(head, "content-length"), Some("12"));
        assert_eq!(header_value(head, "x-consul-index"), Some("42"));
        // A name that only starts another header's is not that header.
        assert_eq!(header_value(head, "x-consul"), None);
        assert_eq!(header_value(head, "etag"), None);
    }
}
