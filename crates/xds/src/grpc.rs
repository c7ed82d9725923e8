//! The ADS gRPC service, written against tonic's server API instead of the generated one so
//! that a long-lived, mostly idle stream holds no codec buffer it does not need.
//!
//! tonic's generated service gives every stream an 8 KiB encode buffer and an 8 KiB decode
//! buffer for its whole life, and each keeps the capacity of the largest message it ever
//! carried. ADS streams are long-lived and mostly idle (an ACK is a few hundred bytes), so at
//! thousands of proxies those buffers were a large share of the server's memory per proxy:
//!
//! - requests are decoded by tonic with a decode buffer starting at [`BUFFER_BYTES`];
//! - responses are encoded here, each into a buffer of exactly its size that goes to HTTP/2
//!   and is freed once sent ([`ResponseBody`]): a stream keeps nothing between responses
//!   (tonic's encoder kept the capacity of the stream's largest response, a proxy's first
//!   cluster set, for as long as the stream lived).

use crate::delta::DeltaState;
use crate::server::{Protocol, ResponseStream, XdsServer};
use crate::sotw::SotwState;
use bytes::Bytes;
use http_body::Frame;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use tonic::codec::BufferSettings;
use tonic::codegen::{Body, BoxFuture, Service, StdError, http};
use tonic::server::NamedService;
use tonic::{Request, Status, Streaming};
use tonic_prost::ProstCodec;

/// Initial size of a stream's decode buffer.
pub const BUFFER_BYTES: usize = 1024;

/// tonic's default: how much is decoded before the decoder yields to the runtime.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// gRPC's length-prefixed message header: a compression flag and a big-endian length.
const HEADER_BYTES: usize = 5;

const SOTW_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// Serves one ADS call of protocol `P`: decodes the request stream with tonic, opens the
/// stream on the server, and encodes its responses with [`ResponseBody`].
fn serve<P, B>(server: &XdsServer, req: http::Request<B>) -> http::Response<tonic::body::Body>
where
    P: Protocol,
    P::Request: prost::Message + Default + Send + 'static,
    P::Response: prost::Message + Send + 'static,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    // Compressed requests are not accepted (none is advertised): say so, as tonic does.
    if let Some(enc) = req.headers().get("grpc-encoding")
        && enc.as_bytes() != b"identity"
    {
        return Status::unimplemented(format!(
            "grpc-encoding {:?} is not supported: send uncompressed messages",
            String::from_utf8_lossy(enc.as_bytes())
        ))
        .into_http();
    }
    let settings = BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD);
    let decoder = ProstCodec::<P::Response, P::Request>::raw_decoder(settings);
    let request = Request::from_http(req.map(|body| Streaming::new_request(decoder, body, None, None)));
    match server.open::<P>(request) {
        Err(status) => status.into_http(),
        Ok(response) => {
            let (metadata, stream, extensions) = response.into_parts();
            let mut http = http::Response::new(tonic::body::Body::new(ResponseBody { stream: Some(stream) }));
            *http.headers_mut() = metadata.into_headers();
            *http.extensions_mut() = extensions;
            http.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            http
        }
    }
}

/// A response stream as gRPC's HTTP/2 body: each message in a buffer of exactly its size
/// (header included), then the status in trailers — `OK` when the stream ends, or the error
/// that ended it.
struct ResponseBody<R> {
    stream: Option<ResponseStream<R>>,
}

impl<R: prost::Message> ResponseBody<R> {
    fn trailers(status: &Status) -> Frame<Bytes> {
        let mut trailers = http::HeaderMap::new();
        if status.add_header(&mut trailers).is_err() {
            // The message could not be put in a header: the code alone still is.
            trailers.insert("grpc-status", http::HeaderValue::from(status.code() as i32));
        }
        Frame::trailers(trailers)
    }

    fn encode(message: &R) -> Result<Bytes, Status> {
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
}

impl<R: prost::Message> http_body::Body for ResponseBody<R> {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let Some(stream) = self.stream.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = match stream.as_mut().poll_next(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Ok(message))) => match Self::encode(&message) {
                Ok(bytes) => return Poll::Ready(Some(Ok(Frame::data(bytes)))),
                Err(status) => Self::trailers(&status),
            },
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
