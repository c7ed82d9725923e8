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
use crate::framing::{Requests, ResponseBody, encode, refuse_compressed};
use crate::server::{Protocol, XdsServer};
use crate::sotw::SotwState;
use std::convert::Infallible;
use std::task::{Context, Poll};
use tokio_stream::StreamExt;
use tonic::codegen::{Body, BoxFuture, Service, StdError, http};
use tonic::server::NamedService;
use tonic::{Request, Status};

const SOTW_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

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
