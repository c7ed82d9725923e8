//! The peering service over gRPC, written against tonic's building blocks: the server's
//! dispatch of the two methods, and the client calls a dialing server makes.

use crate::proto::{EXCHANGE_PATH, ExchangeSecretRequest, ExchangeSecretResponse, ReplicationMessage, STREAM_PATH};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::Stream;
use tonic::codegen::{Body, BoxFuture, Context, Poll, Service, StdError, http};

/// The outbound half of a stream, as the server answers it.
pub type Outbound = Pin<Box<dyn Stream<Item = Result<ReplicationMessage, tonic::Status>> + Send>>;

/// What answers the two methods.
#[async_trait::async_trait]
pub trait Handler: Send + Sync + 'static {
    /// `ExchangeSecret`.
    async fn exchange(&self, request: ExchangeSecretRequest) -> Result<ExchangeSecretResponse, tonic::Status>;
    /// `StreamResources`.
    async fn stream(&self, inbound: tonic::Streaming<ReplicationMessage>) -> Result<Outbound, tonic::Status>;
}

/// The gRPC service: add it to a tonic server.
pub struct PeerStreamServer {
    handler: Arc<dyn Handler>,
}

impl PeerStreamServer {
    /// The service over `handler`.
    pub fn new(handler: Arc<dyn Handler>) -> Self {
        Self { handler }
    }
}

impl Clone for PeerStreamServer {
    fn clone(&self) -> Self {
        Self {
            handler: Arc::clone(&self.handler),
        }
    }
}

impl tonic::server::NamedService for PeerStreamServer {
    const NAME: &'static str = crate::proto::SERVICE;
}

struct Exchange(Arc<dyn Handler>);

impl tonic::server::UnaryService<ExchangeSecretRequest> for Exchange {
    type Response = ExchangeSecretResponse;
    type Future = BoxFuture<tonic::Response<ExchangeSecretResponse>, tonic::Status>;
    fn call(&mut self, request: tonic::Request<ExchangeSecretRequest>) -> Self::Future {
        let handler = Arc::clone(&self.0);
        Box::pin(async move { handler.exchange(request.into_inner()).await.map(tonic::Response::new) })
    }
}

struct Streams(Arc<dyn Handler>);

impl tonic::server::StreamingService<ReplicationMessage> for Streams {
    type Response = ReplicationMessage;
    type ResponseStream = Outbound;
    type Future = BoxFuture<tonic::Response<Outbound>, tonic::Status>;
    fn call(&mut self, request: tonic::Request<tonic::Streaming<ReplicationMessage>>) -> Self::Future {
        let handler = Arc::clone(&self.0);
        Box::pin(async move { handler.stream(request.into_inner()).await.map(tonic::Response::new) })
    }
}

impl<B> Service<http::Request<B>> for PeerStreamServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let handler = Arc::clone(&self.handler);
        match req.uri().path() {
            EXCHANGE_PATH => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
                Ok(grpc.unary(Exchange(handler), req).await)
            }),
            STREAM_PATH => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
                Ok(grpc.streaming(Streams(handler), req).await)
            }),
            _ => Box::pin(async move { Ok(tonic::Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// How long a dial may take before the next address is tried.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to a peer's server at `address` (`host:port`), over TLS verified with `tls`.
pub async fn connect(
    address: &str,
    tls: &crate::tls::DialTls,
) -> Result<tonic::client::Grpc<tonic::transport::Channel>, String> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("https://{address}"))
        .map_err(|e| format!("{address}: {e}"))?
        .tls_config(tls.client_config()?)
        .map_err(|e| format!("{address}: {}", error_chain(&e)))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_keepalive(Some(Duration::from_secs(30)))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {address}: {}", error_chain(&e)))?;
    Ok(tonic::client::Grpc::new(channel))
}

/// Calls `ExchangeSecret`.
pub async fn exchange(
    grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
    request: ExchangeSecretRequest,
) -> Result<ExchangeSecretResponse, tonic::Status> {
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("not ready: {e}")))?;
    let path = http::uri::PathAndQuery::from_static(EXCHANGE_PATH);
    grpc.unary(tonic::Request::new(request), path, tonic_prost::ProstCodec::default())
        .await
        .map(tonic::Response::into_inner)
}

/// Opens `StreamResources` with `outbound` as what this side sends.
pub async fn open_stream<S>(
    grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
    outbound: S,
) -> Result<tonic::Streaming<ReplicationMessage>, tonic::Status>
where
    S: Stream<Item = ReplicationMessage> + Send + 'static,
{
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("not ready: {e}")))?;
    let path = http::uri::PathAndQuery::from_static(STREAM_PATH);
    grpc.streaming(tonic::Request::new(outbound), path, tonic_prost::ProstCodec::default())
        .await
        .map(tonic::Response::into_inner)
}

/// An error with its causes, on one line.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}
