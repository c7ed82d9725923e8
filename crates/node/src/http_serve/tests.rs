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
