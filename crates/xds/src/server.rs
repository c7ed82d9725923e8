//! The ADS server: one task per stream, owned by the server, driving the protocol state
//! machines from the proxy's requests and its snapshots.

use crate::delta::{Ack, DeltaState};
use crate::metrics::XdsMetrics;
use crate::sotw::SotwState;
use crate::versioned::VersionedResources;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use parking_lot::Mutex;
use proxycfg::{ConfigSnapshot, WatchEvent, Watcher};
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};
use tracing::{Instrument, debug, info_span, trace, warn};

/// Where streams get snapshots: resolves the proxy a stream's node names and keeps it
/// followed while the returned guard lives.
pub trait SnapshotSource: Send + Sync + 'static {
    /// Follows the proxy `node` names (its id is the proxy's service id), with `token`.
    fn watch(&self, node: &Node, token: &str) -> Result<(Watcher, Box<dyn Send + Sync>), Status>;
}

/// Resources built for one snapshot (both held weakly: the cache never keeps either alive).
type Built = (Weak<ConfigSnapshot>, Weak<VersionedResources>);

struct Inner {
    source: Arc<dyn SnapshotSource>,
    metrics: Arc<XdsMetrics>,
    /// Resources built per snapshot, shared by every stream of that proxy.
    built: Mutex<HashMap<usize, Built>>,
    /// Size of `built` at which it is next swept of dead entries.
    built_sweep_at: Mutex<usize>,
    /// Resources shared between proxies (load assignments of shared endpoints).
    shared: crate::resources::SharedEncodings,
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

/// The ADS service. Cheap to clone.
#[derive(Clone)]
pub struct XdsServer {
    inner: Arc<Inner>,
}

impl XdsServer {
    /// A server over `source`.
    pub fn new(source: Arc<dyn SnapshotSource>) -> Self {
        Self {
            inner: Arc::new(Inner {
                source,
                metrics: Arc::new(XdsMetrics::default()),
                built: Mutex::new(HashMap::new()),
                built_sweep_at: Mutex::new(1024),
                shared: crate::resources::SharedEncodings::default(),
                tasks: TaskTracker::new(),
                shutdown: CancellationToken::new(),
            }),
        }
    }

    /// The tonic service to add to a server.
    pub fn service(&self) -> AggregatedDiscoveryServiceServer<XdsServer> {
        AggregatedDiscoveryServiceServer::new(self.clone())
    }

    /// The server's counters.
    pub fn metrics(&self) -> Arc<XdsMetrics> {
        Arc::clone(&self.inner.metrics)
    }

    /// Ends every stream and waits for their tasks.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }
}

impl Inner {
    /// The resources of `snap`: from the cache when another stream of the proxy built them,
    /// else built reusing what `previous` (this stream's last resources) can lend.
    fn resources_for(
        &self,
        snap: &Arc<ConfigSnapshot>,
        previous: Option<&Arc<VersionedResources>>,
    ) -> Result<Arc<VersionedResources>, crate::resources::BuildError> {
        let key = Arc::as_ptr(snap) as usize;
        {
            let built = self.built.lock();
            if let Some((s, r)) = built.get(&key)
                && s.upgrade().is_some_and(|s| Arc::ptr_eq(&s, snap))
                && let Some(r) = r.upgrade()
            {
                return Ok(r);
            }
        }
        let resources = Arc::new(VersionedResources::build_after(
            snap,
            Some(&self.shared),
            previous.map(|p| &**p),
        )?);
        let mut built = self.built.lock();
        // Sweep dead entries when the map has doubled since the last sweep, not every build.
        let mut sweep_at = self.built_sweep_at.lock();
        if built.len() >= *sweep_at {
            built.retain(|_, (s, r)| s.strong_count() > 0 && r.strong_count() > 0);
            *sweep_at = (built.len() * 2).max(1024);
        }
        built.insert(key, (Arc::downgrade(snap), Arc::downgrade(&resources)));
        Ok(resources)
    }

    fn record(&self, ack: &Ack, since: Instant) {
        match ack {
            Ack::Accepted { .. } => self.metrics.acked_after(since.elapsed()),
            Ack::Rejected { type_url, message } => {
                self.metrics.nack(type_url);
                warn!(%type_url, %message, "proxy rejected configuration; keeping its last good version");
            }
            Ack::None | Ack::Stale => {}
        }
    }
}

fn token<T>(req: &Request<T>) -> String {
    req.metadata()
        .get("x-consul-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// Counts a stream while its task runs.
struct OpenStream(Arc<XdsMetrics>);

impl OpenStream {
    fn new(m: &Arc<XdsMetrics>) -> Self {
        m.stream_opened();
        Self(Arc::clone(m))
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.stream_closed();
    }
}

/// What the stream driver needs from a protocol variant (delta or state of the world).
trait Protocol: Default + Send + 'static {
    type Request: Send + 'static;
    type Response: Send + 'static;
    fn node(req: &Self::Request) -> Option<&Node>;
    fn on_request(&mut self, req: &Self::Request) -> Ack;
    fn responses(&mut self, resources: &VersionedResources) -> Vec<Self::Response>;
    fn type_url(resp: &Self::Response) -> &str;
}

impl Protocol for DeltaState {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;
    fn node(req: &Self::Request) -> Option<&Node> {
        req.node.as_ref()
    }
    fn on_request(&mut self, req: &Self::Request) -> Ack {
        DeltaState::on_request(self, req)
    }
    fn responses(&mut self, resources: &VersionedResources) -> Vec<Self::Response> {
        DeltaState::responses(self, resources)
    }
    fn type_url(resp: &Self::Response) -> &str {
        &resp.type_url
    }
}

impl Protocol for SotwState {
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;
    fn node(req: &Self::Request) -> Option<&Node> {
        req.node.as_ref()
    }
    fn on_request(&mut self, req: &Self::Request) -> Ack {
        SotwState::on_request(self, req)
    }
    fn responses(&mut self, resources: &VersionedResources) -> Vec<Self::Response> {
        SotwState::responses(self, resources)
    }
    fn type_url(resp: &Self::Response) -> &str {
        &resp.type_url
    }
}

/// One stream: the node from the first request names the proxy; then every request and
/// every new snapshot advance the protocol state, and whatever it says to send is sent.
async fn run_stream<P: Protocol>(
    inner: Arc<Inner>,
    mut requests: Streaming<P::Request>,
    tx: mpsc::Sender<Result<P::Response, Status>>,
    token: String,
) where
    P::Request: prost::Message + Default,
{
    let _open = OpenStream::new(&inner.metrics);
    let first = match requests.message().await {
        Ok(Some(r)) => r,
        _ => return,
    };
    let Some(node) = P::node(&first).cloned() else {
        let _ = tx
            .send(Err(Status::invalid_argument("the first request must carry the node")))
            .await;
        return;
    };
    let (mut watcher, _guard) = match inner.source.watch(&node, &token) {
        Ok(w) => w,
        Err(status) => {
            let _ = tx.send(Err(status)).await;
            return;
        }
    };
    debug!(node = %node.id, "stream opened");
    let mut state = P::default();
    let mut current: Option<Arc<VersionedResources>> = None;
    let mut changed_at = Instant::now();
    state.on_request(&first);
    loop {
        if let Some(res) = &current {
            for resp in state.responses(res) {
                inner.metrics.response(P::type_url(&resp));
                trace!(node = %node.id, type_url = P::type_url(&resp), "response");
                if tx.send(Ok(resp)).await.is_err() {
                    return;
                }
            }
        }
        tokio::select! {
            biased;
            () = inner.shutdown.cancelled() => return,
            req = requests.message() => match req {
                Ok(Some(r)) => {
                    let ack = state.on_request(&r);
                    trace!(node = %node.id, ?ack, "request");
                    inner.record(&ack, changed_at);
                }
                _ => return,
            },
            ev = watcher.next() => match ev {
                Some(WatchEvent::Snapshot(snap)) => {
                    trace!(node = %node.id, version = snap.version, "snapshot");
                    match inner.resources_for(&snap, current.as_ref()) {
                        Ok(r) => {
                            current = Some(r);
                            changed_at = Instant::now();
                        }
                        Err(e) => warn!(error = %e, "cannot build resources; keeping the previous ones"),
                    }
                }
                Some(WatchEvent::Deregistered) => debug!("proxy deregistered; keeping its last configuration"),
                None => return,
            },
        }
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for XdsServer {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let token = token(&request);
        let (tx, rx) = mpsc::channel(16);
        let span = info_span!("xds_stream", kind = "sotw");
        self.inner
            .tasks
            .spawn(run_stream::<SotwState>(Arc::clone(&self.inner), request.into_inner(), tx, token).instrument(span));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let token = token(&request);
        let (tx, rx) = mpsc::channel(16);
        let span = info_span!("xds_stream", kind = "delta");
        self.inner
            .tasks
            .spawn(run_stream::<DeltaState>(Arc::clone(&self.inner), request.into_inner(), tx, token).instrument(span));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
