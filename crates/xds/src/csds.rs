//! CSDS (`envoy.service.status.v3.ClientStatusDiscoveryService`) on the xDS port: for each
//! connected proxy, every resource it holds or is due, with its type, name, version, status
//! (`SYNCED`, `NOT_SENT`, `STALE`, `ERROR`) and, after a rejection, the proxy's detail. The
//! statuses are the server's view of each stream (see [`crate::status`]).
//!
//! Secrets (leaf certificates with their private keys) are listed with their status and
//! version but never with their contents. With an authorizer (ACLs on), a request's
//! `x-consul-token` must be allowed (meshd asks for `operator:read`).
//!
//! A `FetchClientStatus` answer carries the time the server took to build it in its
//! `server-timing` metadata (`build;dur=MILLISECONDS`, as HTTP's Server-Timing header), so
//! that a client can tell the server's work from encoding, transfer and its own decoding.

use crate::XdsServer;
use crate::status::{ResourceRef, ResourceState};
use envoy_types::pb::envoy::admin::v3::{ClientResourceStatus, UpdateFailureState};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::status::v3::client_config::GenericXdsConfig;
use envoy_types::pb::envoy::service::status::v3::client_status_discovery_service_server::{
    ClientStatusDiscoveryService, ClientStatusDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::status::v3::{
    ClientConfig, ClientStatusRequest, ClientStatusResponse, ConfigStatus,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{NodeMatcher, StringMatcher, string_matcher::MatchPattern};
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

/// Says whether a CSDS request's token (empty: none) may read every proxy's status; the
/// error is the refusal.
pub type CsdsAuthorizer =
    Arc<dyn Fn(String) -> Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// The CSDS service over an xDS server's streams.
#[derive(Clone)]
pub struct Csds {
    xds: XdsServer,
}

const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

impl Csds {
    async fn allow<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let Some(authorizer) = self.xds.csds_authorizer() else {
            return Ok(());
        };
        let token = request
            .metadata()
            .get(structs::wire::TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        authorizer(token).await.map_err(Status::permission_denied)
    }
}

impl XdsServer {
    /// CSDS for this server's streams, to serve beside ADS; only to requests the
    /// authorizer allows, once one is set ([`XdsServer::set_csds_authorizer`]).
    pub fn csds_service(&self) -> ClientStatusDiscoveryServiceServer<Csds> {
        ClientStatusDiscoveryServiceServer::new(Csds { xds: self.clone() })
    }

    /// The CSDS answer for `request`: every connected proxy its node matchers select.
    pub fn client_status(&self, request: &ClientStatusRequest) -> ClientStatusResponse {
        let rows = self.status_tracker().resources(
            |node| request.node_matchers.is_empty() || request.node_matchers.iter().any(|m| matches(m, node)),
            |type_url| !request.exclude_resource_contents && type_url != SECRET,
            generic,
        );
        let config = rows
            .into_iter()
            .map(|(node, generic_xds_configs)| ClientConfig {
                node: Some(Node {
                    id: node,
                    ..Node::default()
                }),
                generic_xds_configs,
                ..ClientConfig::default()
            })
            .collect();
        ClientStatusResponse { config }
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

fn timestamp(at: std::time::SystemTime) -> envoy_types::pb::google::protobuf::Timestamp {
    let since = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    envoy_types::pb::google::protobuf::Timestamp {
        seconds: since.as_secs() as i64,
        nanos: since.subsec_nanos() as i32,
    }
}

fn generic(r: ResourceRef<'_>) -> GenericXdsConfig {
    let (config_status, client_status) = match r.state {
        ResourceState::Synced => (ConfigStatus::Synced, ClientResourceStatus::Acked),
        ResourceState::NotSent => (ConfigStatus::NotSent, ClientResourceStatus::Unknown),
        ResourceState::Stale => (ConfigStatus::Stale, ClientResourceStatus::Requested),
        ResourceState::Error => (ConfigStatus::Error, ClientResourceStatus::Nacked),
    };
    GenericXdsConfig {
        error_state: r.error.map(|details| UpdateFailureState {
            details: details.to_owned(),
            version_info: r.version.to_owned(),
            last_update_attempt: r.updated.map(timestamp),
            ..UpdateFailureState::default()
        }),
        type_url: r.type_url.to_owned(),
        name: r.name.to_owned(),
        version_info: r.version.to_owned(),
        xds_config: r.value.cloned(),
        last_updated: r.updated.map(timestamp),
        config_status: config_status as i32,
        client_status: client_status as i32,
        is_static_resource: false,
    }
}

#[tonic::async_trait]
impl ClientStatusDiscoveryService for Csds {
    type StreamClientStatusStream = Pin<Box<dyn Stream<Item = Result<ClientStatusResponse, Status>> + Send>>;

    async fn stream_client_status(
        &self,
        request: Request<Streaming<ClientStatusRequest>>,
    ) -> Result<Response<Self::StreamClientStatusStream>, Status> {
        self.allow(&request).await?;
        let xds = self.xds.clone();
        let answers = request.into_inner().map(move |req| req.map(|r| xds.client_status(&r)));
        Ok(Response::new(Box::pin(answers)))
    }

    async fn fetch_client_status(
        &self,
        request: Request<ClientStatusRequest>,
    ) -> Result<Response<ClientStatusResponse>, Status> {
        self.allow(&request).await?;
        let started = std::time::Instant::now();
        let answer = self.xds.client_status(request.get_ref());
        let took = started.elapsed();
        let mut response = Response::new(answer);
        if let Ok(value) = format!("build;dur={:.3}", took.as_secs_f64() * 1000.0).parse() {
            response.metadata_mut().insert("server-timing", value);
        }
        Ok(response)
    }
}
