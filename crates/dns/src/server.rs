//! The listeners: UDP and TCP on one port, and the recursors.

use crate::answer::{self, Outcome, Transport};
use crate::{Catalog, Config};
use simple_dns::RCODE;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Queries answered at once over UDP; a query past them is dropped (its client asks again).
pub const UDP_IN_FLIGHT: usize = 4096;
/// TCP connections served at once; a connection past them takes the slot of one idle
/// between queries, or is closed when none frees up within [`TCP_IDLE`].
pub const TCP_CONNECTIONS: usize = 256;
/// A TCP connection with no query for this long is closed.
pub const TCP_IDLE: Duration = Duration::from_secs(10);

/// The bound sockets, not yet serving.
pub struct Bound {
    udp: UdpSocket,
    tcp: TcpListener,
    /// The port both listen on.
    pub addr: SocketAddr,
}

/// Binds UDP and TCP on `addr`. Port 0: UDP picks a port and TCP takes the same one (tried
/// again with another if TCP's is taken).
pub async fn bind(addr: SocketAddr) -> io::Result<Bound> {
    let mut attempts = 0;
    loop {
        let udp = UdpSocket::bind(addr).await?;
        let local = udp.local_addr()?;
        match TcpListener::bind(local).await {
            Ok(tcp) => return Ok(Bound { udp, tcp, addr: local }),
            Err(e) if addr.port() == 0 && attempts < 16 => {
                attempts += 1;
                tracing::debug!(%local, error = %e, "the DNS TCP port is taken: another port");
            }
            Err(e) => return Err(e),
        }
    }
}

/// Answers queries on `bound` from `catalog` until `stop`; the queries being answered are
/// dropped then.
pub async fn serve(bound: Bound, config: Arc<Config>, catalog: Arc<dyn Catalog>, stop: CancellationToken) {
    let tasks = TaskTracker::new();
    let udp = Arc::new(bound.udp);
    tokio::join!(
        udp_loop(Arc::clone(&udp), &config, &catalog, &tasks, &stop),
        tcp_loop(bound.tcp, &config, &catalog, &tasks, &stop),
    );
    tasks.close();
    tasks.wait().await;
}

async fn udp_loop(
    udp: Arc<UdpSocket>,
    config: &Arc<Config>,
    catalog: &Arc<dyn Catalog>,
    tasks: &TaskTracker,
    stop: &CancellationToken,
) {
    let in_flight = Arc::new(Semaphore::new(UDP_IN_FLIGHT));
    let mut buf = vec![0u8; 65_535];
    loop {
        let (len, peer) = tokio::select! {
            () = stop.cancelled() => return,
            received = udp.recv_from(&mut buf) => match received {
                Ok(r) => r,
                // An ICMP error for an earlier answer, say: the socket goes on.
                Err(e) => {
                    tracing::debug!(error = %e, "DNS UDP receive");
                    continue;
                }
            },
        };
        let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
            continue;
        };
        let query = buf[..len].to_vec();
        let (udp, config, catalog, stop) = (Arc::clone(&udp), Arc::clone(config), Arc::clone(catalog), stop.clone());
        tasks.spawn(async move {
            let _permit = permit;
            tokio::select! {
                () = stop.cancelled() => {}
                reply = respond(&*catalog, &config, &query, Transport::Udp) => {
                    if let Some(reply) = reply {
                        let _ = udp.send_to(&reply, peer).await;
                    }
                }
            }
        });
    }
}

async fn tcp_loop(
    tcp: TcpListener,
    config: &Arc<Config>,
    catalog: &Arc<dyn Catalog>,
    tasks: &TaskTracker,
    stop: &CancellationToken,
) {
    let connections = Arc::new(Semaphore::new(TCP_CONNECTIONS));
    // Signalled when a connection waits for a slot: one connection idle between queries
    // closes to make room, so clients that merely keep connections open (or ask once every
    // few seconds) cannot hold every slot.
    let room = Arc::new(Notify::new());
    loop {
        let stream = tokio::select! {
            () = stop.cancelled() => return,
            accepted = tcp.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::debug!(error = %e, "DNS TCP accept");
                    continue;
                }
            },
        };
        let permit = match Arc::clone(&connections).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                room.notify_one();
                tokio::select! {
                    () = stop.cancelled() => return,
                    permit = tokio::time::timeout(TCP_IDLE, Arc::clone(&connections).acquire_owned()) => match permit {
                        Ok(Ok(p)) => p,
                        // Every slot busy with queries for as long: this one is turned away.
                        Ok(Err(_)) | Err(_) => continue,
                    },
                }
            }
        };
        let (config, catalog, stop, room) = (Arc::clone(config), Arc::clone(catalog), stop.clone(), Arc::clone(&room));
        tasks.spawn(async move {
            let _permit = permit;
            tokio::select! {
                () = stop.cancelled() => {}
                () = connection(stream, &config, &*catalog, &room) => {}
            }
        });
    }
}

/// One TCP connection: length-prefixed queries, answered in order, until the client closes
/// it, stays idle, does not read its answers, or is idle between queries while another
/// connection waits for a slot (`room`).
async fn connection(mut stream: TcpStream, config: &Config, catalog: &dyn Catalog, room: &Notify) {
    loop {
        let mut len = [0u8; 2];
        tokio::select! {
            read = tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut len)) => match read {
                Ok(Ok(_)) => {}
                _ => return,
            },
            () = room.notified() => return,
        }
        let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
        if !matches!(
            tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut query)).await,
            Ok(Ok(_))
        ) {
            return;
        }
        let Some(reply) = respond(catalog, config, &query, Transport::Tcp).await else {
            return;
        };
        let Ok(reply_len) = u16::try_from(reply.len()) else {
            return;
        };
        let mut framed = Vec::with_capacity(reply.len() + 2);
        framed.extend_from_slice(&reply_len.to_be_bytes());
        framed.extend_from_slice(&reply);
        if !matches!(
            tokio::time::timeout(TCP_IDLE, stream.write_all(&framed)).await,
            Ok(Ok(()))
        ) {
            return;
        }
    }
}

/// The reply to one query: answered here, or by the recursors.
async fn respond(catalog: &dyn Catalog, config: &Config, query: &[u8], transport: Transport) -> Option<Vec<u8>> {
    match answer::answer(catalog, config, query, transport).await {
        Outcome::Reply(reply) => Some(reply),
        Outcome::Ignore => None,
        Outcome::Recurse => Some(recurse(config, query, transport).await),
    }
}

/// Asks each recursor in turn; SERVFAIL when none answers.
async fn recurse(config: &Config, query: &[u8], transport: Transport) -> Vec<u8> {
    for recursor in &config.recursors {
        match tokio::time::timeout(config.recursor_timeout, ask(*recursor, query, transport)).await {
            Ok(Ok(reply)) => return reply,
            Ok(Err(e)) => tracing::debug!(%recursor, error = %e, "DNS recursor failed"),
            Err(_) => tracing::debug!(%recursor, "DNS recursor did not answer in time"),
        }
    }
    answer::failure(query, RCODE::ServerFailure).unwrap_or_default()
}

/// One recursor's reply to `query`, over the transport the query came by.
async fn ask(recursor: SocketAddr, query: &[u8], transport: Transport) -> io::Result<Vec<u8>> {
    match transport {
        Transport::Udp => {
            let local: SocketAddr = if recursor.is_ipv4() {
                (Ipv4Addr::UNSPECIFIED, 0).into()
            } else {
                (Ipv6Addr::UNSPECIFIED, 0).into()
            };
            let socket = UdpSocket::bind(local).await?;
            socket.connect(recursor).await?;
            socket.send(query).await?;
            let mut buf = vec![0u8; 65_535];
            loop {
                let len = socket.recv(&mut buf).await?;
                // Only the reply to this query (its ID).
                if len >= 2 && query.len() >= 2 && buf[..2] == query[..2] {
                    buf.truncate(len);
                    return Ok(buf);
                }
            }
        }
        Transport::Tcp => {
            let mut stream = TcpStream::connect(recursor).await?;
            let len = u16::try_from(query.len()).map_err(|_| io::Error::other("query too long"))?;
            stream.write_all(&len.to_be_bytes()).await?;
            stream.write_all(query).await?;
            let mut reply_len = [0u8; 2];
            stream.read_exact(&mut reply_len).await?;
            let mut reply = vec![0u8; usize::from(u16::from_be_bytes(reply_len))];
            stream.read_exact(&mut reply).await?;
            Ok(reply)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use simple_dns::{CLASS, Name, Packet, Question, TYPE};

    struct Empty;

    #[async_trait::async_trait]
    impl Catalog for Empty {
        async fn service_nodes(&self, _: &str, _: crate::Wanted) -> Result<Vec<crate::Instance>, crate::LookupError> {
            Ok(Vec::new())
        }
        async fn node(&self, _: &str) -> Result<Option<structs::Node>, crate::LookupError> {
            Ok(None)
        }
        async fn prepared_query(&self, _: &str) -> Result<Option<Vec<crate::Instance>>, crate::LookupError> {
            Ok(None)
        }
    }

    fn query(name: &str) -> Vec<u8> {
        let mut q = Packet::new_query(42);
        q.questions.push(Question::new(
            Name::new_unchecked(name),
            TYPE::A.into(),
            CLASS::IN.into(),
            false,
        ));
        q.build_bytes_vec().unwrap()
    }

    /// A recursor that answers every query with its ID and RCODE 0 over UDP.
    async fn recursor() -> SocketAddr {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 512];
            while let Ok((len, peer)) = socket.recv_from(&mut buf).await {
                let mut reply = buf[..len].to_vec();
                reply[2] |= 0x80;
                let _ = socket.send_to(&reply, peer).await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn udp_and_tcp_answer_on_one_port_and_other_names_go_to_the_recursor() {
        let bound = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = bound.addr;
        assert_ne!(addr.port(), 0);
        let mut config = Config::new("dc1");
        config.recursors = vec![recursor().await];
        let stop = CancellationToken::new();
        let served = tokio::spawn(serve(bound, Arc::new(config), Arc::new(Empty), stop.clone()));

        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        client.send_to(&query("web.service.consul"), addr).await.unwrap();
        let mut buf = [0u8; 512];
        let len = client.recv(&mut buf).await.unwrap();
        let reply = Packet::parse(&buf[..len]).unwrap();
        assert_eq!((reply.id(), reply.rcode()), (42, RCODE::NameError));

        client.send_to(&query("example.com"), addr).await.unwrap();
        let len = client.recv(&mut buf).await.unwrap();
        assert!(len >= 12);
        assert_eq!(&buf[..2], &[0, 42], "the recursor's reply, relayed");
        assert_eq!(buf[2] & 0x80, 0x80);

        let mut tcp = TcpStream::connect(addr).await.unwrap();
        let q = query("n1.node.consul");
        tcp.write_all(&(q.len() as u16).to_be_bytes()).await.unwrap();
        tcp.write_all(&q).await.unwrap();
        let mut len = [0u8; 2];
        tcp.read_exact(&mut len).await.unwrap();
        let mut reply = vec![0u8; usize::from(u16::from_be_bytes(len))];
        tcp.read_exact(&mut reply).await.unwrap();
        assert_eq!(Packet::parse(&reply).unwrap().rcode(), RCODE::NameError);

        stop.cancel();
        served.await.unwrap();
    }

    /// Asks `name` over an open TCP connection; `None` when the server closed it. The length
    /// and the query in one write, as DNS clients send them (two writes would wait on
    /// Nagle and the delayed ACK, 40 ms a query).
    async fn ask_tcp(tcp: &mut TcpStream, name: &str) -> Option<RCODE> {
        let q = query(name);
        let mut framed = (q.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&q);
        tcp.write_all(&framed).await.ok()?;
        let mut len = [0u8; 2];
        tcp.read_exact(&mut len).await.ok()?;
        let mut reply = vec![0u8; usize::from(u16::from_be_bytes(len))];
        tcp.read_exact(&mut reply).await.ok()?;
        Some(Packet::parse(&reply).ok()?.rcode())
    }

    #[tokio::test]
    async fn a_connection_past_the_limit_takes_the_slot_of_one_idle_between_queries() {
        let bound = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = bound.addr;
        let stop = CancellationToken::new();
        let served = tokio::spawn(serve(
            bound,
            Arc::new(Config::new("dc1")),
            Arc::new(Empty),
            stop.clone(),
        ));
        // Every slot held by a connection that asked once and stays open, idle.
        let mut idle = Vec::new();
        for _ in 0..TCP_CONNECTIONS {
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            assert_eq!(ask_tcp(&mut tcp, "n1.node.consul").await, Some(RCODE::NameError));
            idle.push(tcp);
        }
        // One more is answered (not left waiting for an idle timeout)...
        let mut late = TcpStream::connect(addr).await.unwrap();
        assert_eq!(ask_tcp(&mut late, "n1.node.consul").await, Some(RCODE::NameError));
        // ...because exactly one idle connection made room; the others are still served.
        let mut closed = 0;
        for tcp in &mut idle {
            if ask_tcp(tcp, "n1.node.consul").await.is_none() {
                closed += 1;
            }
        }
        assert_eq!(closed, 1, "one idle connection closes for the one waiting");
        stop.cancel();
        served.await.unwrap();
    }
}
