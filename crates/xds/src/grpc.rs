//! The ADS gRPC service, written against tonic's server API instead of the generated one so
//! that a long-lived, mostly idle stream holds no codec buffer it does not need.
//!
//! tonic's generated service gives every stream an 8 KiB encode buffer and an 8 KiB decode
//! buffer for its whole life, and each keeps the capacity of the largest message it ever
//! carried. ADS streams are long-lived and mostly idle (an ACK is a few hundred bytes), so at
//! thousands of proxies those buffers were a large share of the server's memory per proxy:
//!
//! - requests are decoded here ([`Requests`]) from a buffer that holds only what has arrived
//!   and is released once drained: Envoy's first request carries its node (about 60 KB with
//!   Envoy 1.40's list of extensions), and tonic's decoder kept that much for the stream's
//!   life;
//! - responses are encoded here, each into a buffer of exactly its size that goes to HTTP/2
//!   and is freed once sent ([`ResponseBody`]): a stream keeps nothing between responses
//!   (tonic's encoder kept the capacity of the stream's largest response, a proxy's first
//!   cluster set, for as long as the stream lived).

use crate::delta::DeltaState;
use crate::server::{Protocol, XdsServer};
use crate::sotw::SotwState;
use bytes::{Buf, Bytes, BytesMut};
use http_body::Frame;
use http_body_util::BodyExt;
use std::convert::Infallible;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio_stream::{Stream, StreamExt};
use tonic::codegen::{Body, BoxFuture, Service, StdError, http};
use tonic::server::NamedService;
use tonic::{Request, Status};

/// A request buffer grown past this is released once drained.
pub const BUFFER_BYTES: usize = 1024;

/// The largest request accepted (gRPC's default receive limit).
const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// gRPC's length-prefixed message header: a compression flag and a big-endian length.
const HEADER_BYTES: usize = 5;

/// Why no request could be had.
#[derive(Debug)]
pub(crate) enum RequestError {
    /// The client sent a request this server refuses (compressed, oversized, undecodable,
    /// cut short): the stream ends with this status, which says why.
    Refused(Status),
    /// The transport failed (the client reset the stream or the connection dropped).
    Transport(Status),
}

/// A stream's requests, decoded from its HTTP/2 body.
pub(crate) struct Requests<T> {
    body: Pin<Box<dyn Body<Data = Bytes, Error = Status> + Send>>,
    /// What has arrived and is not decoded yet.
    buf: BytesMut,
    ended: bool,
    _message: PhantomData<fn() -> T>,
}

impl<T: prost::Message + Default> Requests<T> {
    pub(crate) fn new<B>(body: B) -> Self
    where
        B: Body + Send + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
        let body = body
            .map_frame(|frame| frame.map_data(|mut data| data.copy_to_bytes(data.remaining())))
            .map_err(|e| Status::from_error(e.into()));
        Self {
            body: Box::pin(body),
            buf: BytesMut::new(),
            ended: false,
            _message: PhantomData,
        }
    }

    /// The next request; `None` once the client closed its side.
    pub(crate) async fn message(&mut self) -> Result<Option<T>, RequestError> {
        std::future::poll_fn(|cx| self.poll_message(cx)).await
    }

    fn poll_message(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<T>, RequestError>> {
        loop {
            if let Some(message) = self.take_message().map_err(RequestError::Refused)? {
                return Poll::Ready(Ok(Some(message)));
            }
            if self.ended {
                return Poll::Ready(if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(RequestError::Refused(Status::invalid_argument(
                        "the request stream ended inside a message",
                    )))
                });
            }
            match ready!(self.body.as_mut().poll_frame(cx)) {
                None => self.ended = true,
                Some(Err(status)) => return Poll::Ready(Err(RequestError::Transport(status))),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    /// Decodes the message at the head of the buffer, if it has all arrived.
    fn take_message(&mut self) -> Result<Option<T>, Status> {
        let Some(header) = self.buf.get(..HEADER_BYTES) else {
            return Ok(None);
        };
        if header[0] != 0 {
            return Err(Status::unimplemented(
                "compressed requests are not supported: send uncompressed messages",
            ));
        }
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if len > MAX_REQUEST_BYTES {
            return Err(Status::resource_exhausted(format!(
                "a request of {len} bytes is over the limit of {MAX_REQUEST_BYTES}"
            )));
        }
        if self.buf.len() < HEADER_BYTES + len {
            self.buf.reserve(HEADER_BYTES + len - self.buf.len());
            return Ok(None);
        }
        self.buf.advance(HEADER_BYTES);
        let message =
            T::decode(&self.buf[..len]).map_err(|e| Status::invalid_argument(format!("decoding a request: {e}")))?;
        self.buf.advance(len);
        if self.buf.is_empty() && self.buf.capacity() > BUFFER_BYTES {
            self.buf = BytesMut::new();
        }
        Ok(Some(message))
    }
}

const SOTW_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// The refusal of a call whose messages are compressed: none is accepted (none is
/// advertised), as tonic says.
pub(crate) fn refuse_compressed(headers: &http::HeaderMap) -> Option<Status> {
    let enc = headers.get("grpc-encoding")?;
    (enc.as_bytes() != b"identity").then(|| {
        Status::unimplemented(format!(
            "grpc-encoding {:?} is not supported: send uncompressed messages",
            String::from_utf8_lossy(enc.as_bytes())
        ))
    })
}

/// Serves one ADS call of protocol `P`: opens the stream on the server over its
/// [`Requests`], and encodes its responses with [`ResponseBody`].
fn serve<P, B>(server: &XdsServer, req: http::Request<B>) -> http::Response<tonic::body::Body>
where
    P: Protocol,
    P::Request: prost::Message + Default + Send + 'static,
    P::Response: prost::Message + Send + 'static,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    if let Some(status) = refuse_compressed(req.headers()) {
        return status.into_http();
    }
    let request = Request::from_http(req.map(Requests::new));
    match server.open::<P>(request) {
        Err(status) => status.into_http(),
        Ok(response) => {
            let (metadata, stream, extensions) = response.into_parts();
            let mut http = ResponseBody::grpc(stream.map(|r| r.and_then(|m| encode(&m))));
            let mut headers = metadata.into_headers();
            headers.extend(http.headers_mut().drain());
            *http.headers_mut() = headers;
            *http.extensions_mut() = extensions;
            http
        }
    }
}

/// `message` as gRPC's length-prefixed message, in a buffer of exactly its size.
fn encode<R: prost::Message>(message: &R) -> Result<Bytes, Status> {
    let len = message.encoded_len();
    let prefix = u32::try_from(len)
        .map_err(|_| Status::resource_exhausted(format!("a response of {len} bytes is too large to send")))?;
    let mut buf = Vec::with_capacity(HEADER_BYTES + len);
    buf.push(0);
    buf.extend_from_slice(&prefix.to_be_bytes());
    message
        .encode(&mut buf)
        .map_err(|e| Status::internal(format!("encoding a response: {e}")))?;
    Ok(Bytes::from(buf))
}

/// A stream of messages, each already encoded with its gRPC header, as gRPC's HTTP/2 body:
/// each message a frame that is freed once sent, then the status in trailers — `OK` when the
/// stream ends, or the error that ended it.
pub(crate) struct ResponseBody<S> {
    stream: Option<S>,
}

impl<S> ResponseBody<S>
where
    S: Stream<Item = Result<Bytes, Status>> + Unpin + Send + 'static,
{
    /// A gRPC response (`application/grpc`) whose body is `stream`.
    pub(crate) fn grpc(stream: S) -> http::Response<tonic::body::Body> {
        let mut http = http::Response::new(tonic::body::Body::new(ResponseBody { stream: Some(stream) }));
        http.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        http
    }
}

impl<S> ResponseBody<S> {
    fn trailers(status: &Status) -> Frame<Bytes> {
        let mut trailers = http::HeaderMap::new();
        if status.add_header(&mut trailers).is_err() {
            // The message could not be put in a header: the code alone still is.
            trailers.insert("grpc-status", http::HeaderValue::from(status.code() as i32));
        }
        Frame::trailers(trailers)
    }
}

impl<S> http_body::Body for ResponseBody<S>
where
    S: Stream<Item = Result<Bytes, Status>> + Unpin,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let Some(stream) = self.stream.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = match Pin::new(stream).poll_next(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Ok(bytes))) => return Poll::Ready(Some(Ok(Frame::data(bytes)))),
            Poll::Ready(Some(Err(status))) => Self::trailers(&status),
            Poll::Ready(None) => Self::trailers(&Status::ok("")),
        };
        // Trailers end the body: the stream (and what it holds) goes now.
        self.stream = None;
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.stream.is_none()
    }
}

/// `envoy.service.discovery.v3.AggregatedDiscoveryService`: both ADS variants. Cheap to
/// clone; add it to a `tonic::transport::Server`.
#[derive(Clone)]
pub struct AdsService {
    server: XdsServer,
}

impl std::fmt::Debug for AdsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdsService").finish_non_exhaustive()
    }
}

impl AdsService {
    pub(crate) fn new(server: XdsServer) -> Self {
        Self { server }
    }
}

impl NamedService for AdsService {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

impl<B> Service<http::Request<B>> for AdsService
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let server = self.server.clone();
        match req.uri().path() {
            SOTW_PATH => Box::pin(async move { Ok(serve::<SotwState, B>(&server, req)) }),
            DELTA_PATH => Box::pin(async move { Ok(serve::<DeltaState, B>(&server, req)) }),
            _ => Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

impl XdsServer {
    /// The gRPC service (`envoy.service.discovery.v3.AggregatedDiscoveryService`) to add to
    /// a tonic server.
    pub fn service(&self) -> AdsService {
        AdsService::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
    use http_body_util::StreamBody;
    use prost::Message as _;

    fn framed(m: &DeltaDiscoveryRequest) -> Vec<u8> {
        let mut out = vec![0];
        out.extend_from_slice(&(m.encoded_len() as u32).to_be_bytes());
        m.encode(&mut out).unwrap();
        out
    }

    /// Requests over a body that delivers `chunks` as its data frames.
    fn requests(chunks: Vec<Vec<u8>>) -> Requests<DeltaDiscoveryRequest> {
        let frames = chunks
            .into_iter()
            .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from(c))));
        Requests::new(StreamBody::new(futures_util::stream::iter(frames)))
    }

    fn request(type_url: &str, node_bytes: usize) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: type_url.into(),
            node: (node_bytes > 0).then(|| Node {
                id: "x".repeat(node_bytes),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn messages_split_across_frames_or_sharing_one_are_all_decoded() {
        let (a, b, c) = (request("a", 0), request("b", 10), request("c", 0));
        let mut bytes = framed(&a);
        bytes.extend(framed(&b));
        let third = framed(&c);
        // a and b in one frame; c cut into three frames, one of them inside its header.
        let mut r = requests(vec![
            bytes,
            third[..2].to_vec(),
            third[2..7].to_vec(),
            third[7..].to_vec(),
        ]);
        assert_eq!(r.message().await.unwrap(), Some(a));
        assert_eq!(r.message().await.unwrap(), Some(b));
        assert_eq!(r.message().await.unwrap(), Some(c));
        assert_eq!(r.message().await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_large_request_leaves_no_large_buffer_behind() {
        // Envoy's first request carries its node (some 60 KB); the ACKs after it are small.
        let big = framed(&request("a", 64 * 1024));
        let mut r = requests(vec![
            big[..30_000].to_vec(),
            big[30_000..].to_vec(),
            framed(&request("b", 0)),
        ]);
        assert_eq!(r.message().await.unwrap().unwrap().type_url, "a");
        assert_eq!(r.buf.capacity(), 0, "the buffer that held the node is kept");
        assert_eq!(r.message().await.unwrap().unwrap().type_url, "b");
        assert!(r.buf.capacity() <= BUFFER_BYTES);
    }

    /// The refusal a request got (panics on anything else).
    async fn refusal(mut r: Requests<DeltaDiscoveryRequest>) -> Status {
        match r.message().await {
            Err(RequestError::Refused(status)) => status,
            other => panic!("not refused: {other:?}"),
        }
    }

    /// Serves no proxy: these streams end before one would be looked up.
    struct NoProxies;

    impl proxycfg::SnapshotSource for NoProxies {
        fn watch(
            &self,
            _: &proxycfg::ProxyRequest<'_>,
        ) -> Result<(proxycfg::Watcher, proxycfg::SourceLease), proxycfg::SourceError> {
            Err(proxycfg::SourceError::NotFound("none".to_owned()))
        }
    }

    #[tokio::test]
    async fn a_refused_request_ends_the_stream_with_its_reason_not_ok() {
        use crate::delta::DeltaState;
        use tokio_stream::StreamExt as _;
        let server = XdsServer::new(std::sync::Arc::new(NoProxies));
        let mut garbage = vec![0, 0, 0, 0, 3];
        garbage.extend_from_slice(&[0xff, 0xff, 0xff]);
        let request = Request::new(requests(vec![garbage]));
        let mut responses = server.open::<DeltaState>(request).unwrap().into_inner();
        let ended = responses
            .next()
            .await
            .expect("the stream says why it ends")
            .unwrap_err();
        assert_eq!(ended.code(), tonic::Code::InvalidArgument);
        assert!(ended.message().starts_with("decoding a request"), "{}", ended.message());
        assert!(responses.next().await.is_none());
        // A client that hangs up before its first request: the stream just ends.
        let mut responses = server
            .open::<DeltaState>(Request::new(requests(vec![])))
            .unwrap()
            .into_inner();
        assert!(responses.next().await.is_none());
    }

    #[tokio::test]
    async fn bad_requests_end_the_stream_with_a_status_that_says_why() {
        let mut compressed = framed(&request("a", 0));
        compressed[0] = 1;
        let e = refusal(requests(vec![compressed])).await;
        assert_eq!(e.code(), tonic::Code::Unimplemented);

        let mut huge = vec![0];
        huge.extend_from_slice(&(MAX_REQUEST_BYTES as u32 + 1).to_be_bytes());
        let e = refusal(requests(vec![huge])).await;
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("over the limit"), "{}", e.message());

        let whole = framed(&request("a", 10));
        let e = refusal(requests(vec![whole[..whole.len() - 1].to_vec()])).await;
        assert_eq!(e.code(), tonic::Code::InvalidArgument);

        let mut garbage = vec![0, 0, 0, 0, 3];
        garbage.extend_from_slice(&[0xff, 0xff, 0xff]);
        let e = refusal(requests(vec![garbage])).await;
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().starts_with("decoding a request"), "{}", e.message());
    }
}
