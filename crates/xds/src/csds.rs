//! CSDS (`envoy.service.status.v3.ClientStatusDiscoveryService`) on the xDS port: for each
//! connected proxy, every resource it holds or is due, with its type, name, version, status
//! (`SYNCED`, `NOT_SENT`, `STALE`, `ERROR`) and, after a rejection, the proxy's detail. The
//! statuses are the server's view of each stream (see [`crate::status`]).
//!
//! Secrets (leaf certificates with their private keys) are listed with their status and
//! version but never with their contents. With an authorizer (ACLs on), a request's
//! `x-consul-token` must be allowed (meshd asks for `operator:read`).
//!
//! A dump of every proxy is large (34,000 resources and 15 MB with contents at 1,000
//! proxies), so the answer is written straight from each stream's status into the bytes that
//! go to HTTP/2 ([`wire`]), with no message built in between and no copy after: the service
//! is written against tonic's server API for that, as ADS is ([`crate::grpc`]).
//!
//! A `FetchClientStatus` answer carries the time the server took to build and encode it in
//! its `server-timing` metadata (`build;dur=MILLISECONDS`, as HTTP's Server-Timing header),
//! so that a client can tell the server's work from transfer and its own decoding.

mod wire;

use crate::XdsServer;
use crate::framing::{RequestError, Requests, ResponseBody, refuse_compressed};
use bytes::Bytes;
use envoy_types::pb::envoy::service::status::v3::ClientStatusRequest;
use envoy_types::pb::envoy::r#type::matcher::v3::{NodeMatcher, StringMatcher, string_matcher::MatchPattern};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use tonic::Status;
use tonic::codegen::{Body, BoxFuture, Service, StdError, http};
use tonic::server::NamedService;

pub use crate::authorize::CsdsAuthorizer;

const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

const FETCH_PATH: &str = "/envoy.service.status.v3.ClientStatusDiscoveryService/FetchClientStatus";
const STREAM_PATH: &str = "/envoy.service.status.v3.ClientStatusDiscoveryService/StreamClientStatus";

/// The CSDS service over an xDS server's streams: `FetchClientStatus` and
/// `StreamClientStatus`. Cheap to clone; add it to a `tonic::transport::Server` beside ADS.
#[derive(Clone)]
pub struct Csds {
    xds: XdsServer,
}

impl std::fmt::Debug for Csds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Csds").finish_non_exhaustive()
    }
}

impl NamedService for Csds {
    const NAME: &'static str = "envoy.service.status.v3.ClientStatusDiscoveryService";
}

impl Csds {
    /// The refusal of a request whose token the authorizer does not allow.
    async fn refusal(&self, headers: &http::HeaderMap) -> Option<Status> {
        let authorizer = self.xds.csds_authorizer()?;
        let token = headers
            .get(structs::wire::TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(structs::Token::new);
        authorizer(token).await.err().map(Status::permission_denied)
    }

    /// `FetchClientStatus`: one request, one answer.
    async fn fetch<B>(self, req: http::Request<B>) -> http::Response<tonic::body::Body>
    where
        B: Body + Send + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
        let mut requests = Requests::<ClientStatusRequest>::new(req.into_body());
        let request = match requests.message().await {
            Ok(Some(request)) => request,
            Ok(None) => return Status::invalid_argument("FetchClientStatus needs a request").into_http(),
            Err(RequestError::Refused(status) | RequestError::Transport(status)) => return status.into_http(),
        };
        let started = std::time::Instant::now();
        let answer = self.xds.client_status_framed(&request);
        let took = started.elapsed();
        let mut response = ResponseBody::grpc(futures_util::stream::iter([Ok(answer)]));
        if let Ok(value) = format!("build;dur={:.3}", took.as_secs_f64() * 1000.0).parse() {
            response.headers_mut().insert("server-timing", value);
        }
        response
    }

    /// `StreamClientStatus`: an answer to each request, until the client closes its side.
    fn stream<B>(self, req: http::Request<B>) -> http::Response<tonic::body::Body>
    where
        B: Body + Send + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
        let requests = Requests::<ClientStatusRequest>::new(req.into_body());
        let answers = futures_util::stream::unfold(Some((self.xds, requests)), |state| async move {
            let (xds, mut requests) = state?;
            match requests.message().await {
                Ok(Some(request)) => {
                    let answer = xds.client_status_framed(&request);
                    Some((Ok(answer), Some((xds, requests))))
                }
                Ok(None) => None,
                Err(RequestError::Refused(status) | RequestError::Transport(status)) => Some((Err(status), None)),
            }
        });
        ResponseBody::grpc(Box::pin(answers))
    }
}

impl<B> Service<http::Request<B>> for Csds
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
        let csds = self.clone();
        Box::pin(async move {
            if let Some(status) = refuse_compressed(req.headers()) {
                return Ok(status.into_http());
            }
            let streaming = match req.uri().path() {
                FETCH_PATH => false,
                STREAM_PATH => true,
                _ => return Ok(Status::unimplemented("no such method").into_http()),
            };
            if let Some(status) = csds.refusal(req.headers()).await {
                return Ok(status.into_http());
            }
            Ok(if streaming {
                csds.stream(req)
            } else {
                csds.fetch(req).await
            })
        })
    }
}

impl XdsServer {
    /// CSDS for this server's streams, to serve beside ADS; only to requests the
    /// authorizer allows, once one is set ([`XdsServer::set_csds_authorizer`]).
    pub fn csds_service(&self) -> Csds {
        Csds { xds: self.clone() }
    }

    /// The CSDS answer for `request` (every connected proxy its node matchers select),
    /// encoded as a gRPC message (its 5-byte header first).
    fn client_status_framed(&self, request: &ClientStatusRequest) -> Bytes {
        // Sized after the last answer of the same kind, so that a dump of every proxy grows
        // its buffer once or not at all: 5 to 15 MB at 1,000 proxies.
        let everyone = request.node_matchers.is_empty();
        let hint = &self.csds_sizes()[usize::from(request.exclude_resource_contents)];
        let mut out = wire::Answer::with_capacity(if everyone { hint.load(Ordering::Relaxed) } else { 0 });
        self.status_tracker().each_stream(
            |node| everyone || request.node_matchers.iter().any(|m| matches(m, node)),
            |type_url| !request.exclude_resource_contents && type_url != SECRET,
            |node, rows| out.client(node, rows),
        );
        let answer = out.finish();
        if everyone {
            // A little over, so that a slowly growing mesh does not grow the buffer each time.
            hint.store(answer.len() + answer.len() / 16, Ordering::Relaxed);
        }
        answer
    }
}

fn string_matches(m: &StringMatcher, value: &str) -> bool {
    let (value, fold) = if m.ignore_case {
        (value.to_lowercase(), true)
    } else {
        (value.to_owned(), false)
    };
    let norm = |s: &str| if fold { s.to_lowercase() } else { s.to_owned() };
    match &m.match_pattern {
        Some(MatchPattern::Exact(e)) => value == norm(e),
        Some(MatchPattern::Prefix(p)) => value.starts_with(&norm(p)),
        Some(MatchPattern::Suffix(s)) => value.ends_with(&norm(s)),
        Some(MatchPattern::Contains(c)) => value.contains(&norm(c)),
        // Regexes are not supported: they match nothing rather than everything.
        Some(MatchPattern::SafeRegex(_)) | Some(MatchPattern::Custom(_)) => false,
        None => true,
    }
}

fn matches(m: &NodeMatcher, node: &str) -> bool {
    m.node_id.as_ref().is_none_or(|id| string_matches(id, node))
}
