//! The ADS gRPC service, written against tonic's server API instead of the generated one so
//! that each stream's codec buffers start small.
//!
//! tonic's generated service gives every stream an 8 KiB encode buffer and an 8 KiB decode
//! buffer for its whole life. ADS streams are long-lived and mostly idle (an ACK is a few
//! hundred bytes), so at thousands of proxies those buffers were a tenth of the server's memory
//! per proxy. Here they start at [`BUFFER_BYTES`] and grow only for a large message.

use crate::delta::DeltaState;
use crate::server::{Protocol, ResponseStream, XdsServer};
use crate::sotw::SotwState;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use std::convert::Infallible;
use std::marker::PhantomData;
use std::task::{Context, Poll};
use tonic::codec::{BufferSettings, Codec};
use tonic::codegen::{Body, BoxFuture, Service, StdError, http};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// Initial size of a stream's encode and decode buffers.
pub const BUFFER_BYTES: usize = 1024;

/// tonic's default: how much is encoded before the encoder yields to the runtime.
const YIELD_THRESHOLD: usize = 32 * 1024;

const SOTW_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// Protobuf codec with small initial buffers.
struct SmallCodec<T, U>(PhantomData<fn() -> (T, U)>);

impl<T, U> Default for SmallCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for SmallCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD))
    }
}

/// One ADS method: opens a stream of protocol `P` on the server.
struct Method<P>(XdsServer, PhantomData<fn() -> P>);

impl<P: Protocol> StreamingService<P::Request> for Method<P>
where
    P::Request: prost::Message + Default,
{
    type Response = P::Response;
    type ResponseStream = ResponseStream<P::Response>;
    type Future = std::future::Ready<Result<Response<Self::ResponseStream>, Status>>;

    fn call(&mut self, request: Request<Streaming<P::Request>>) -> Self::Future {
        std::future::ready(self.0.open::<P>(request))
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
            SOTW_PATH => Box::pin(async move {
                let mut grpc = Grpc::new(SmallCodec::<DiscoveryResponse, DiscoveryRequest>::default());
                Ok(grpc.streaming(Method::<SotwState>(server, PhantomData), req).await)
            }),
            DELTA_PATH => Box::pin(async move {
                let mut grpc = Grpc::new(SmallCodec::<DeltaDiscoveryResponse, DeltaDiscoveryRequest>::default());
                Ok(grpc.streaming(Method::<DeltaState>(server, PhantomData), req).await)
            }),
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
