//! Fail-over between servers against tiny real HTTP peers on loopback: one that answers,
//! one whose port is closed, one that hangs up mid-request, one that never answers.

use super::*;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What a peer does with each request it reads.
#[derive(Clone, Copy)]
enum Peer {
    /// Answers 200 with its name as the body, keeping the connection.
    Answers(&'static str),
    /// Answers 200 with the request's token header as the body (`-` for none).
    EchoesToken,
    /// Closes the connection without an answer (a server dying mid-request).
    HangsUp,
    /// Never answers, keeping the connection (a wedged server).
    Hangs,
}

/// Reads one request's head; none when the connection ended first.
async fn read_request(conn: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match conn.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// The value of the token header in a request's head.
fn token_header(head: &str) -> Option<&str> {
    head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case(structs::wire::TOKEN_HEADER)
            .then(|| value.trim())
    })
}

/// Starts `peer` on 127.0.0.1:0; returns its address and how many requests it has read.
async fn start(peer: Peer) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&requests);
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let counted = Arc::clone(&counted);
            tokio::spawn(async move {
                while let Some(head) = read_request(&mut conn).await {
                    counted.fetch_add(1, Ordering::Relaxed);
                    let name = match peer {
                        Peer::Answers(name) => name,
                        Peer::EchoesToken => token_header(&head).unwrap_or("-"),
                        Peer::HangsUp => return,
                        Peer::Hangs => std::future::pending::<&str>().await,
                    };
                    let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{name}", name.len());
                    if conn.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, requests)
}

/// A loopback address nothing listens on (bound, then released).
fn closed() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// One GET of `/` through `servers`, bounded at 1 s: the body, or the error.
async fn ask(servers: &Servers) -> Result<String, ApiError> {
    let resp = servers
        .send(|c, base| c.get(format!("{base}/")).timeout(Duration::from_secs(1)))
        .await?;
    Ok(resp.text().await.unwrap())
}

#[tokio::test]
async fn a_refused_server_is_skipped_and_the_one_that_answered_is_asked_first_after() {
    let (a, a_requests) = start(Peer::Answers("a")).await;
    let (b, b_requests) = start(Peer::Answers("b")).await;
    let servers = Servers::new(&[closed(), a.clone(), b]);
    assert_eq!(ask(&servers).await.unwrap(), "a");
    assert!(!servers.answered(0) && servers.answered(1));
    assert_eq!(servers.current(), Some(format!("http://{a}").as_str()));
    assert_eq!(ask(&servers).await.unwrap(), "a");
    assert_eq!(a_requests.load(Ordering::Relaxed), 2);
    assert_eq!(b_requests.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn a_server_that_fails_mid_request_is_not_asked_again_and_the_next_request_moves_on() {
    for failing in [Peer::HangsUp, Peer::Hangs] {
        let (bad, bad_requests) = start(failing).await;
        let (good, good_requests) = start(Peer::Answers("good")).await;
        let servers = Servers::new(&[bad, good]);
        // The request reached the failing server: it is not sent again elsewhere.
        let err = ask(&servers).await.unwrap_err();
        assert!(matches!(err, ApiError::Unreachable { tried: 1, .. }), "{err}");
        assert_eq!(good_requests.load(Ordering::Relaxed), 0);
        assert!(!servers.answered(0));
        // The next request (a heartbeat, a blocking query's retry) starts with the next server.
        assert_eq!(ask(&servers).await.unwrap(), "good");
        assert_eq!(ask(&servers).await.unwrap(), "good");
        assert_eq!(bad_requests.load(Ordering::Relaxed), 1);
    }
}

#[tokio::test]
async fn with_every_server_refusing_the_error_says_how_many_were_tried() {
    let servers = Servers::new(&[closed(), closed()]);
    let err = ask(&servers).await.unwrap_err();
    assert!(matches!(err, ApiError::Unreachable { tried: 2, .. }), "{err}");
    assert!(err.is_unreachable());
}

#[tokio::test]
async fn requests_carry_the_clients_token_or_the_one_named_and_none_carries_none() {
    let (a, _) = start(Peer::EchoesToken).await;
    let servers = Servers::new(&[a]);
    let get = |token: Option<Token>| {
        let servers = &servers;
        async move {
            let resp = servers
                .send_as(token.as_ref(), |c, base| c.get(format!("{base}/")))
                .await
                .unwrap();
            resp.text().await.unwrap()
        }
    };
    assert_eq!(ask(&servers).await.unwrap(), "-");
    servers.set_token(Token::new("agent"));
    assert_eq!(ask(&servers).await.unwrap(), "agent");
    assert_eq!(get(Token::new("mine")).await, "mine");
    assert_eq!(get(None).await, "-");
    servers.set_token(None);
    assert_eq!(ask(&servers).await.unwrap(), "-");
}
