//! The ADS server: one driver per stream, polled by the transport as it sends, advancing the
//! protocol state machines from the proxy's requests and its snapshots.

use crate::StreamAuthorizer;
use crate::delta::{Ack, DeltaState};
use crate::metrics::XdsMetrics;
use crate::sotw::SotwState;
use crate::versioned::VersionedResources;
use bounded_maps::SweptMap;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use parking_lot::Mutex;
use proxycfg::{ConfigSnapshot, ProxyRequest, SnapshotSource, SourceError, WatchEvent, Watcher};
use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;
use structs::Token;
use tokio::time::Instant;
use tokio_stream::Stream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::{TaskTracker, task_tracker::TaskTrackerToken};
use tonic::{Request, Response, Status};
use tracing::{Instrument, debug, info_span, trace, warn};

/// Resources built for one snapshot (both held weakly: the cache never keeps either alive).
type Built = (Weak<ConfigSnapshot>, Weak<VersionedResources>);

/// Admission control: how many streams may be open at once, and how fast new ones are set
/// up (a reconnect storm is paced, not served all at once).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Admission {
    /// Streams open at once; a stream past it fails with `RESOURCE_EXHAUSTED` (its proxy
    /// retries, or goes to another server).
    pub max_streams: usize,
    /// New streams set up per second, on average.
    pub setup_rate: f64,
    /// New streams set up at once before the rate applies.
    pub setup_burst: u32,
}

impl Default for Admission {
    fn default() -> Self {
        Self {
            max_streams: 20_000,
            setup_rate: 1_000.0,
            setup_burst: 1_000,
        }
    }
}

/// The longest a new stream waits for its setup slot before it is refused.
const MAX_SETUP_WAIT: Duration = Duration::from_secs(30);

/// Paces stream setup (a generic cell rate algorithm: the theoretical arrival time of the next
/// stream advances by one interval per stream; up to `burst` intervals of it may be ahead).
struct Pacer {
    interval: Duration,
    burst: Duration,
    tat: parking_lot::Mutex<Option<Instant>>,
}

impl Pacer {
    fn new(a: &Admission) -> Self {
        let interval = if a.setup_rate > 0.0 {
            Duration::from_secs_f64(1.0 / a.setup_rate)
        } else {
            Duration::ZERO
        };
        Self {
            interval,
            burst: interval * a.setup_burst.max(1),
            tat: parking_lot::Mutex::new(None),
        }
    }

    /// When the next stream may be set up (now, or later under a storm), or `None` when that
    /// is more than `max_wait` away: such a stream is refused and takes no slot, so refusals
    /// never push the streams after them further out.
    fn slot(&self, max_wait: Duration) -> Option<Instant> {
        let now = Instant::now();
        let mut tat = self.tat.lock();
        let current = tat.map_or(now, |t| t.max(now));
        let at = (current + self.interval)
            .checked_sub(self.burst)
            .filter(|at| *at > now)
            .unwrap_or(now);
        if at > now + max_wait {
            return None;
        }
        *tat = Some(current + self.interval);
        Some(at)
    }
}

struct Inner {
    source: Arc<dyn SnapshotSource>,
    /// Checks each stream's token (none: ACLs off, every stream is served).
    authorizer: Option<Arc<dyn StreamAuthorizer>>,
    metrics: Arc<XdsMetrics>,
    admission: Admission,
    pacer: Pacer,
    /// Streams open now (admitted and not yet ended).
    open: Arc<std::sync::atomic::AtomicUsize>,
    /// Resources built per snapshot, shared by every stream of that proxy.
    built: Mutex<SweptMap<usize, Built>>,
    /// Per proxy, its latest resources that have build problems (weak: gone with the
    /// streams that hold them).
    problems: Mutex<SweptMap<proxycfg::ProxyId, Weak<VersionedResources>>>,
    /// Resources shared between proxies (load assignments of shared endpoints).
    shared: crate::resources::SharedEncodings,
    /// Every stream's sync status.
    status: Arc<crate::status::Tracker>,
    /// Whether new streams are tracked (on unless turned off).
    track_status: std::sync::atomic::AtomicBool,
    /// Who may read CSDS (none: anyone who reaches the port).
    csds_authorizer: Mutex<Option<crate::authorize::CsdsAuthorizer>>,
    /// The size of the last CSDS answer of every proxy, with contents and without: the next
    /// one's buffer is sized after it.
    csds_sizes: [std::sync::atomic::AtomicUsize; 2],
    /// One permit per stream asked to end so that its proxy reconnects elsewhere
    /// ([`XdsServer::shed`]).
    shed: tokio::sync::Notify,
    /// Tracks live streams (each holds a token) so shutdown can wait for them.
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

/// The ADS service. Cheap to clone.
#[derive(Clone)]
pub struct XdsServer {
    inner: Arc<Inner>,
}

impl XdsServer {
    /// A server over `source`, with the default admission control.
    pub fn new(source: Arc<dyn SnapshotSource>) -> Self {
        Self::with_admission(source, Admission::default())
    }

    /// A server over `source` admitting streams as `admission` says.
    pub fn with_admission(source: Arc<dyn SnapshotSource>, admission: Admission) -> Self {
        Self::build(source, admission, None)
    }

    /// A server that serves a proxy only to streams whose token `authorizer` accepts.
    pub fn with_authorizer(
        source: Arc<dyn SnapshotSource>,
        admission: Admission,
        authorizer: Arc<dyn StreamAuthorizer>,
    ) -> Self {
        Self::build(source, admission, Some(authorizer))
    }

    fn build(
        source: Arc<dyn SnapshotSource>,
        admission: Admission,
        authorizer: Option<Arc<dyn StreamAuthorizer>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                source,
                authorizer,
                pacer: Pacer::new(&admission),
                admission,
                open: Arc::default(),
                metrics: Arc::new(XdsMetrics::default()),
                built: Mutex::new(SweptMap::default()),
                problems: Mutex::new(SweptMap::default()),
                shared: crate::resources::SharedEncodings::default(),
                shed: tokio::sync::Notify::new(),
                status: Arc::default(),
                track_status: std::sync::atomic::AtomicBool::new(true),
                csds_authorizer: Mutex::new(None),
                csds_sizes: Default::default(),
                tasks: TaskTracker::new(),
                shutdown: CancellationToken::new(),
            }),
        }
    }

    /// Requires CSDS requests to be allowed by `authorizer` (ACLs on).
    pub fn set_csds_authorizer(&self, authorizer: crate::authorize::CsdsAuthorizer) {
        *self.inner.csds_authorizer.lock() = Some(authorizer);
    }

    pub(crate) fn csds_authorizer(&self) -> Option<crate::authorize::CsdsAuthorizer> {
        self.inner.csds_authorizer.lock().clone()
    }

    pub(crate) fn csds_sizes(&self) -> &[std::sync::atomic::AtomicUsize; 2] {
        &self.inner.csds_sizes
    }

    /// Flags a stream stuck once a response has waited `flag` for its answer, and resets it
    /// after `reset` (defaults: 10 s and 30 s).
    pub fn set_stuck_timing(&self, flag: Duration, reset: Duration) {
        self.inner.status.set_timing(flag, reset);
    }

    /// Turns the sync status of new streams (`sync_status`, CSDS, stuck detection) on or
    /// off; on by default. Off only to measure what tracking costs.
    pub fn set_status_tracking(&self, on: bool) {
        self.inner.track_status.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Names this server in the sync status (`Server`).
    pub fn set_server_name(&self, name: &str) {
        self.inner.status.set_server(name);
    }

    /// Every open stream's sync status: what each proxy was sent, acknowledged and
    /// rejected, by type, with its build problems.
    pub fn sync_status(&self) -> Vec<crate::status::StreamStatus> {
        self.inner.status.report()
    }

    /// Each stream of `node` on this server (oldest first) with every resource it holds or
    /// is due: type, name, version as sent, state.
    pub fn resource_states(&self, node: &str) -> Vec<crate::status::StreamResources> {
        self.inner.status.resources_of(node)
    }

    pub(crate) fn status_tracker(&self) -> &crate::status::Tracker {
        &self.inner.status
    }

    /// Streams open now.
    pub fn open_streams(&self) -> usize {
        self.inner.open.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Ends `n` open streams (those waiting longest for something to do first) with
    /// `RESOURCE_EXHAUSTED`, so that their proxies reconnect, to another server when their
    /// bootstrap lists several: how a loaded server hands streams to the others. A stream
    /// is never ended while it has a response to send.
    pub fn shed(&self, n: usize) {
        for _ in 0..n {
            self.inner.shed.notify_one();
        }
    }

    /// The parts of `proxy`'s configuration (by upstream) that cannot be built now, with
    /// the problem: the proxy keeps their last good resources.
    pub fn build_problems(&self, proxy: &proxycfg::ProxyId) -> BTreeMap<String, String> {
        self.inner.problems_of(proxy)
    }

    /// The server's counters.
    pub fn metrics(&self) -> Arc<XdsMetrics> {
        Arc::clone(&self.inner.metrics)
    }

    /// Ends every stream and waits until each is gone.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }
}

impl Inner {
    /// Whether the stream's token may receive the configuration of a proxy for `service`
    /// (always, without an authorizer). A refusal is counted and logged once per stream.
    async fn authorize(
        &self,
        token: Option<&Token>,
        service: &str,
        node: &str,
    ) -> Result<crate::Authorization, Status> {
        let Some(authorizer) = &self.authorizer else {
            return Ok(crate::Authorization { expires: None });
        };
        authorizer.authorize(token, service).await.map_err(|why| {
            self.metrics.stream_denied();
            warn!(%node, %service, reason = %why, "xDS stream refused: the token may not receive this proxy's configuration");
            Status::permission_denied(why)
        })
    }

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
        self.note_problems(snap, previous.map(|p| &**p), &resources);
        let mut built = self.built.lock();
        built.insert(key, (Arc::downgrade(snap), Arc::downgrade(&resources)), |_, (s, r)| {
            s.strong_count() > 0 && r.strong_count() > 0
        });
        Ok(resources)
    }

    /// Counts and logs (once per change) the parts of a proxy's configuration that could not
    /// be built, and remembers them for the proxy's status.
    fn note_problems(
        &self,
        snap: &ConfigSnapshot,
        previous: Option<&VersionedResources>,
        built: &Arc<VersionedResources>,
    ) {
        let before = previous.map(|p| &p.problems);
        let mut new = 0;
        for (part, problem) in &built.problems {
            if before.and_then(|b| b.get(part)) != Some(problem) {
                new += 1;
                warn!(proxy = %snap.proxy_id, %part, %problem, "cannot build this part of the proxy's configuration; it keeps its last good resources");
            }
        }
        if new > 0 {
            self.metrics.build_failed(new);
        }
        for part in before.into_iter().flat_map(|b| b.keys()) {
            if !built.problems.contains_key(part) {
                tracing::info!(proxy = %snap.proxy_id, %part, "configuration builds again");
            }
        }
        let mut problems = self.problems.lock();
        if built.problems.is_empty() {
            problems.remove(&snap.proxy_id);
        } else {
            problems.insert((*snap.proxy_id).clone(), Arc::downgrade(built), |_, w| {
                w.strong_count() > 0
            });
        }
    }

    /// The parts of `proxy`'s configuration that cannot be built now, with the problem.
    fn problems_of(&self, proxy: &proxycfg::ProxyId) -> BTreeMap<String, String> {
        self.problems
            .lock()
            .get(proxy)
            .and_then(Weak::upgrade)
            .map(|r| r.problems.clone())
            .unwrap_or_default()
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

/// The catalog node a proxy names in its node metadata, if any.
fn node_name(node: &Node) -> Option<&str> {
    node_metadata(node, structs::wire::NODE_NAME_METADATA)
}

/// A non-empty string field of a node's metadata.
fn node_metadata<'n>(node: &'n Node, key: &str) -> Option<&'n str> {
    let value = node.metadata.as_ref()?.fields.get(key)?;
    match &value.kind {
        Some(crate::ValueKind::StringValue(s)) if !s.is_empty() => Some(s),
        _ => None,
    }
}

/// The gRPC status a stream fails with when its source cannot serve it.
fn status_of(error: &SourceError) -> Status {
    let message = error.to_string();
    match error {
        SourceError::MissingProxyId => Status::invalid_argument(message),
        SourceError::NotFound(_) => Status::not_found(message),
        SourceError::Ambiguous(_) | SourceError::Refused { .. } => Status::failed_precondition(message),
    }
}

/// The stream's `x-consul-token`, if any.
fn token<T>(req: &Request<T>) -> Option<Token> {
    req.metadata()
        .get(structs::wire::TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(Token::new)
}

/// Counts a stream while it is open (the gauge, and the admission count).
struct OpenStream(Arc<XdsMetrics>, Arc<std::sync::atomic::AtomicUsize>);

impl OpenStream {
    /// Admits one more stream unless `max` are open.
    fn admit(m: &Arc<XdsMetrics>, open: &Arc<std::sync::atomic::AtomicUsize>, max: usize) -> Option<Self> {
        use std::sync::atomic::Ordering;
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .ok()?;
        m.stream_opened();
        Some(Self(Arc::clone(m), Arc::clone(open)))
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.stream_closed();
        self.1.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// What the stream driver needs from a protocol variant (delta or state of the world).
pub(crate) trait Protocol: Default + Send + 'static {
    /// Names the variant in logs.
    const KIND: &'static str;
    type Request: Send + 'static;
    type Response: Send + 'static;
    fn node(req: &Self::Request) -> Option<&Node>;
    fn on_request(&mut self, req: &Self::Request) -> Ack;
    fn responses(&mut self, resources: &VersionedResources) -> Vec<Self::Response>;
    fn type_url(resp: &Self::Response) -> &str;
    /// The listeners asked for by name (a proxyless client's targets).
    fn listener_names(&self) -> Vec<String>;
    /// What a response carries, for the sync status.
    fn describe(resp: &Self::Response) -> crate::status::Sent<'_>;
    /// The response a request answers, if any: type, nonce, and the proxy's error if it
    /// rejected it.
    fn answers(req: &Self::Request) -> (&str, &str, Option<&str>);
}

impl Protocol for DeltaState {
    const KIND: &'static str = "delta";
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
    fn listener_names(&self) -> Vec<String> {
        DeltaState::listener_names(self)
    }
    fn describe(resp: &Self::Response) -> crate::status::Sent<'_> {
        crate::status::Sent {
            type_url: &resp.type_url,
            nonce: &resp.nonce,
            version: &resp.system_version_info,
            resources: resp
                .resources
                .iter()
                .map(|r| (r.name.as_str(), r.version.as_str()))
                .collect(),
            removed: &resp.removed_resources,
            replaces: false,
        }
    }
    fn answers(req: &Self::Request) -> (&str, &str, Option<&str>) {
        (
            &req.type_url,
            &req.response_nonce,
            req.error_detail.as_ref().map(|e| e.message.as_str()),
        )
    }
}

impl Protocol for SotwState {
    const KIND: &'static str = "sotw";
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
    fn listener_names(&self) -> Vec<String> {
        SotwState::listener_names(self)
    }
    fn describe(resp: &Self::Response) -> crate::status::Sent<'_> {
        crate::status::Sent {
            type_url: &resp.type_url,
            nonce: &resp.nonce,
            version: &resp.version_info,
            resources: resp
                .resources
                .iter()
                .map(|r| (crate::status::name_of(&r.value), resp.version_info.as_str()))
                .collect(),
            removed: &[],
            replaces: true,
        }
    }
    fn answers(req: &Self::Request) -> (&str, &str, Option<&str>) {
        (
            &req.type_url,
            &req.response_nonce,
            req.error_detail.as_ref().map(|e| e.message.as_str()),
        )
    }
}

/// What a stream sends: responses produced by its [`Driver`] as the transport asks for them.
pub(crate) type ResponseStream<R> = Pin<Box<dyn Stream<Item = Result<R, Status>> + Send>>;

/// The node a stream's first request named, and the proxy it follows.
struct Following {
    node_id: String,
    /// The catalog node the proxy named, if any.
    node_name: Option<String>,
    /// The listeners last reported to the source as asked for by name.
    asked: Vec<String>,
    watcher: Watcher,
    _guard: Box<dyn Send + Sync>,
    /// The stream's sync status (removed from the tracker when the stream ends); none when
    /// tracking is off.
    status: Option<crate::status::ViewGuard>,
}

impl Following {
    /// Tells the source which listeners the client asks for by name, when that changed.
    fn ask_listeners(&mut self, source: &dyn SnapshotSource, token: Option<&Token>, names: Vec<String>) {
        if names == self.asked {
            return;
        }
        let request = ProxyRequest {
            proxy_id: &self.node_id,
            node_name: self.node_name.as_deref(),
            token,
        };
        source.request_listeners(&request, &names);
        self.asked = names;
    }
}

/// What woke a following stream (see [`Driver::wait`]).
enum Woke {
    /// Handled where it happened: a request, or the stream's end (`finished` says which).
    Handled,
    /// The stream ends with this status.
    End(Status),
    /// The token's authorization is to be checked again (ACLs changed, or it expired).
    Recheck,
    /// The proxy's new snapshot.
    Snapshot(Arc<ConfigSnapshot>),
}

/// One stream, driven by the transport polling its responses (no task or channel of its own):
/// the node from the first request names the proxy; then every request and every new snapshot
/// advance the protocol state, and whatever it says to send is handed out one by one. Dropped
/// with the stream, which drops the proxy's watch.
struct Driver<P: Protocol> {
    inner: Arc<Inner>,
    requests: crate::framing::Requests<P::Request>,
    /// The stream's `x-consul-token` (or the proxyless client's node metadata one).
    token: Option<Token>,
    /// The service the token was last authorized for, and what ends that authorization:
    /// an ACL change (re-checked) or the token's expiry.
    authorized_for: Option<Vec<String>>,
    acl_changed: Option<Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
    expires: Option<Pin<Box<tokio::time::Sleep>>>,
    following: Option<Following>,
    state: P,
    current: Option<Arc<VersionedResources>>,
    changed_at: Instant,
    outbox: std::vec::IntoIter<P::Response>,
    finished: bool,
    /// The server's shutdown, registered once for the stream's life.
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
    span: tracing::Span,
    _open: OpenStream,
    _tracked: TaskTrackerToken,
}

impl<P: Protocol> Driver<P>
where
    P::Request: prost::Message + Default,
{
    /// The next response, or `None` when the stream ends (the proxy hung up, the server shuts
    /// down, or the Manager is gone).
    async fn next(&mut self) -> Option<Result<P::Response, Status>> {
        loop {
            if let Some(resp) = self.outbox.next() {
                return Some(Ok(self.sending(resp)));
            }
            if self.finished {
                return None;
            }
            if self.following.is_none() {
                match self.first().await {
                    Ok(f) => self.following = Some(f),
                    Err(status) => {
                        self.finished = true;
                        return status.map(Err);
                    }
                }
                continue;
            }
            let (recheck, fresh) = match self.wait().await {
                Woke::End(status) => return Some(Err(status)),
                Woke::Handled => (false, None),
                Woke::Recheck => (true, None),
                Woke::Snapshot(snap) => (false, Some(snap)),
            };
            if recheck {
                // The change future has completed: a new one is armed below.
                self.acl_changed = None;
            }
            if let Err(status) = self.check_authorization(fresh.as_deref(), recheck).await {
                return Some(Err(status));
            }
            if let Some(snap) = fresh {
                self.take_snapshot(&snap);
            }
            if !self.finished
                && let Some(res) = &self.current
            {
                self.outbox = self.state.responses(res).into_iter();
            }
        }
    }

    /// Counts and records `resp` as sent, and hands it out.
    fn sending(&self, resp: P::Response) -> P::Response {
        self.inner.metrics.response(P::type_url(&resp));
        if let Some(f) = &self.following {
            trace!(node = %f.node_id, type_url = P::type_url(&resp), "response");
            if let Some(status) = &f.status {
                status.view.sent(P::describe(&resp));
            }
        }
        resp
    }

    /// Waits for what a following stream reacts to: shutdown, a reset for an unanswered
    /// response, shedding, an ACL change or the token's expiry, a request (handled here), or
    /// the proxy's watch.
    async fn wait(&mut self) -> Woke {
        let Some(following) = &mut self.following else {
            return Woke::Handled;
        };
        let acl_changed = &mut self.acl_changed;
        let expires = &mut self.expires;
        tokio::select! {
            biased;
            () = &mut self.shutdown => self.finished = true,
            () = async { match &following.status { Some(s) => s.view.reset.notified().await, None => std::future::pending().await } } => {
                // Counted by the tracker's scan, which decided it.
                self.finished = true;
                warn!(node = %following.node_id, "resetting the xDS stream: a response went unanswered too long");
                return Woke::End(Status::unavailable(
                    "a response went unanswered too long: reconnect to start over",
                ));
            }
            () = self.inner.shed.notified() => {
                self.finished = true;
                self.inner.metrics.stream_shed();
                debug!(node = %following.node_id, "ending the xDS stream: balancing it to another server");
                return Woke::End(Status::resource_exhausted(
                    "this server holds more than its share of the xDS streams: reconnect, to another server if you can",
                ));
            }
            () = async { match acl_changed.as_mut() { Some(f) => f.await, None => std::future::pending().await } } => return Woke::Recheck,
            () = async { match expires.as_mut() { Some(f) => f.await, None => std::future::pending().await } } => return Woke::Recheck,
            req = self.requests.message() => match req {
                Ok(Some(r)) => {
                    let ack = self.state.on_request(&r);
                    let (type_url, nonce, error) = P::answers(&r);
                    if let Some(status) = &following.status {
                        status.view.answered(type_url, nonce, error);
                    }
                    following.ask_listeners(&*self.inner.source, self.token.as_ref(), self.state.listener_names());
                    trace!(node = %following.node_id, ?ack, "request");
                    self.inner.record(&ack, self.changed_at);
                }
                Ok(None) => self.finished = true,
                Err(crate::framing::RequestError::Transport(status)) => {
                    debug!(node = %following.node_id, error = %status.message(), "the xDS stream's requests broke off");
                    self.finished = true;
                }
                Err(crate::framing::RequestError::Refused(status)) => {
                    self.finished = true;
                    warn!(node = %following.node_id, reason = %status.message(), "ending the xDS stream: its request was refused");
                    return Woke::End(status);
                }
            },
            ev = following.watcher.next() => match ev {
                Some(WatchEvent::Snapshot(snap)) => {
                    trace!(node = %following.node_id, version = snap.version, "snapshot");
                    return Woke::Snapshot(snap);
                }
                Some(WatchEvent::Deregistered) => debug!("proxy deregistered; keeping its last configuration"),
                Some(WatchEvent::Refused(why)) => {
                    // Never a stream that stays open and receives nothing.
                    warn!(node = %following.node_id, reason = %why, "ending the xDS stream: the proxy cannot be served");
                    self.finished = true;
                    self.current = None;
                    return Woke::End(Status::failed_precondition(format!(
                        "proxy {:?} cannot be served: {why}",
                        following.node_id
                    )));
                }
                None => self.finished = true,
            },
        }
        Woke::Handled
    }

    /// Checks the token before anything of a `fresh` snapshot is built or sent, and again on
    /// a `recheck` (without an authorizer there is nothing to check). A refusal ends the
    /// stream and drops its resources.
    async fn check_authorization(&mut self, fresh: Option<&ConfigSnapshot>, recheck: bool) -> Result<(), Status> {
        let check = match fresh {
            _ if self.inner.authorizer.is_none() => None,
            Some(snap) => Some(crate::authorize::services_of(snap)),
            None if recheck => self.authorized_for.clone(),
            None => None,
        };
        let Some(services) = check else {
            return Ok(());
        };
        let node = self.following.as_ref().map(|f| f.node_id.clone()).unwrap_or_default();
        // Following ACL changes starts before the check: a change between the two is
        // not missed.
        if self.acl_changed.is_none() || self.authorized_for.as_ref() != Some(&services) {
            self.acl_changed = self.inner.authorizer.as_ref().map(|a| a.changed());
        }
        let mut earliest: Option<crate::Authorization> = None;
        for service in &services {
            match self.inner.authorize(self.token.as_ref(), service, &node).await {
                Err(status) => {
                    self.finished = true;
                    self.current = None;
                    return Err(status);
                }
                Ok(a) => {
                    if earliest
                        .as_ref()
                        .is_none_or(|e| a.expires.is_some() && (e.expires.is_none() || a.expires < e.expires))
                    {
                        earliest = Some(a);
                    }
                }
            }
        }
        if let Some(authorization) = earliest {
            self.arm(services, authorization);
        }
        Ok(())
    }

    /// Builds the resources of a new snapshot; on failure the previous ones stay.
    fn take_snapshot(&mut self, snap: &Arc<ConfigSnapshot>) {
        match self.inner.resources_for(snap, self.current.as_ref()) {
            Ok(r) => {
                if let Some(f) = &self.following
                    && let Some(status) = &f.status
                {
                    status.view.resources(&f.node_id, &r);
                }
                self.current = Some(r);
                self.changed_at = Instant::now();
            }
            Err(e) => warn!(error = %e, "cannot build resources; keeping the previous ones"),
        }
    }

    /// Remembers what the token was authorized for, and arms the re-check at the token's
    /// expiry (the one on the next ACL change was armed before the check).
    fn arm(&mut self, services: Vec<String>, authorization: crate::Authorization) {
        self.authorized_for = Some(services);
        self.expires = authorization.expires.map(|at| {
            let left = at.duration_since(std::time::SystemTime::now()).unwrap_or_default();
            Box::pin(tokio::time::sleep(left))
        });
    }

    /// Reads the first request: its node names the proxy to follow. `Err(None)` when the
    /// proxy hung up first, `Err(Some(status))` when the stream must fail with `status`.
    async fn first(&mut self) -> Result<Following, Option<Status>> {
        // Under a storm of new streams, setup is paced: this one waits for its slot.
        // A queue longer than this is a storm the proxies had better spread out themselves
        // (they retry with back-off): refused rather than held open.
        let Some(slot) = self.inner.pacer.slot(MAX_SETUP_WAIT) else {
            self.inner.metrics.stream_refused();
            return Err(Some(Status::resource_exhausted(format!(
                "xDS stream setup is queued for more than {} s on this server: retry later or another server",
                MAX_SETUP_WAIT.as_secs()
            ))));
        };
        if slot > Instant::now() {
            self.inner.metrics.stream_paced();
            tokio::select! {
                () = &mut self.shutdown => return Err(None),
                () = tokio::time::sleep_until(slot) => {}
            }
        }
        let first = match self.requests.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return Err(None),
            Err(crate::framing::RequestError::Transport(status)) => {
                debug!(error = %status.message(), "an xDS stream's requests broke off before the first one");
                return Err(None);
            }
            Err(crate::framing::RequestError::Refused(status)) => {
                warn!(reason = %status.message(), "ending an xDS stream: its first request was refused");
                return Err(Some(status));
            }
        };
        let Some(node) = P::node(&first) else {
            return Err(Some(Status::invalid_argument("the first request must carry the node")));
        };
        // A proxyless gRPC client cannot send call headers: its token comes in the node
        // metadata (`meshd connect grpc-bootstrap` puts it there).
        if self.token.is_none()
            && let Some(t) = node_metadata(node, structs::wire::TOKEN_HEADER)
        {
            self.token = Token::new(t);
        }
        let request = ProxyRequest {
            proxy_id: &node.id,
            node_name: node_name(node),
            token: self.token.as_ref(),
        };
        let (watcher, guard) = self.inner.source.watch(&request).map_err(|e| Some(status_of(&e)))?;
        debug!(node = %node.id, "stream opened");
        let node_id = node.id.clone();
        self.state.on_request(&first);
        let status = self
            .inner
            .track_status
            .load(std::sync::atomic::Ordering::Relaxed)
            .then(|| {
                self.inner
                    .status
                    .start_scanning(Arc::clone(&self.inner.metrics), self.inner.shutdown.clone());
                self.inner.status.open(P::KIND, &node_id)
            });
        let mut following = Following {
            node_name: node_name(node).map(str::to_owned),
            node_id,
            watcher,
            _guard: guard,
            status,
            asked: Vec::new(),
        };
        following.ask_listeners(&*self.inner.source, self.token.as_ref(), self.state.listener_names());
        Ok(following)
    }
}

impl XdsServer {
    /// A new stream of protocol `P` over `request`.
    pub(crate) fn open<P: Protocol>(
        &self,
        request: Request<crate::framing::Requests<P::Request>>,
    ) -> Result<Response<ResponseStream<P::Response>>, Status>
    where
        P::Request: prost::Message + Default,
    {
        let inner = &self.inner;
        let Some(open) = OpenStream::admit(&inner.metrics, &inner.open, inner.admission.max_streams) else {
            inner.metrics.stream_refused();
            return Err(Status::resource_exhausted(format!(
                "this server holds its limit of {} xDS streams: retry later or another server",
                inner.admission.max_streams
            )));
        };
        let driver = Driver::<P> {
            inner: Arc::clone(inner),
            token: token(&request),
            authorized_for: None,
            acl_changed: None,
            expires: None,
            requests: request.into_inner(),
            following: None,
            state: P::default(),
            current: None,
            changed_at: Instant::now(),
            outbox: Vec::new().into_iter(),
            finished: false,
            shutdown: Box::pin(inner.shutdown.clone().cancelled_owned()),
            span: info_span!("xds_stream", kind = P::KIND),
            _open: open,
            _tracked: inner.tasks.token(),
        };
        let stream = futures_util::stream::unfold(driver, |mut d| async move {
            let span = d.span.clone();
            let item = d.next().instrument(span).await?;
            Some((item, d))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

#[cfg(test)]
mod pacer_tests;
