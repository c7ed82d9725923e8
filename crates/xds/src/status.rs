//! What each stream was sent and what its proxy acknowledged: the per-proxy sync status
//! behind `/v1/internal/xds-status` and CSDS, and the detection of stuck streams.
//!
//! Every stream has a [`StreamView`] (shared with the [`Tracker`]): the driver records each
//! response it hands out (type, nonce, the resources and their versions) and each request
//! that acknowledges or rejects one. A resource is then
//!
//! - `SYNCED` when the proxy acknowledged the version it was last sent,
//! - `STALE` while that version is sent but not yet acknowledged,
//! - `ERROR` when the proxy rejected it (with the proxy's detail),
//! - `NOT_SENT` when the proxy's current resources hold it but it was never sent (not
//!   subscribed, or a response not yet handed out).
//!
//! A response still unacknowledged after [`STUCK_AFTER`] flags the stream stuck (logged once,
//! counted); after [`RESET_AFTER`] the stream is ended with `UNAVAILABLE` so that the proxy
//! reconnects and starts over (counted too). One task per server checks every 500 ms.
//!
//! Each type's version: SotW's `version_info` as sent; for delta, which has no version per
//! type, a digest of the names and versions of the type's resources the stream has been
//! sent so far, this response applied (see [`SetDigest`]). The version acknowledged is the
//! version of the response the ACK answers.

use crate::metrics::XdsMetrics;
use crate::versioned::VersionedResources;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use std::time::{Duration, SystemTime};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument as _;
use tracing::warn;

/// A response unacknowledged this long flags its stream stuck.
pub const STUCK_AFTER: Duration = Duration::from_secs(10);
/// A response unacknowledged this long resets its stream.
pub const RESET_AFTER: Duration = Duration::from_secs(30);

/// How often streams are checked.
const SCAN_EVERY: Duration = Duration::from_millis(500);

/// The state of one resource as the server sees it (CSDS's `ConfigStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ResourceState {
    /// The proxy acknowledged the version it was last sent.
    Synced,
    /// In the proxy's resources, never sent.
    NotSent,
    /// Sent, not yet acknowledged.
    Stale,
    /// Rejected by the proxy.
    Error,
}

/// One resource of a stream as the server sees it (`XdsServer::resource_states`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ResourceStatus {
    /// Its type URL.
    pub type_url: &'static str,
    /// Its name (a load assignment's: its cluster's).
    pub name: String,
    /// Its version as last sent (or due).
    pub version: String,
    /// Whether the proxy acknowledged it.
    pub state: ResourceState,
}

/// The resources of one stream (`XdsServer::resource_states`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct StreamResources {
    /// `sotw` or `delta`: a SotW proxy versions a type, a delta one each resource.
    pub protocol: &'static str,
    /// When the stream opened.
    pub opened_at: String,
    /// The types with a response the proxy has not answered yet (what it holds of them may
    /// be the previous set).
    pub pending_types: Vec<&'static str>,
    /// Each resource, by type then name.
    pub resources: Vec<ResourceStatus>,
}

/// What a response carried, for the status.
pub(crate) struct Sent<'r> {
    pub(crate) type_url: &'r str,
    pub(crate) nonce: &'r str,
    /// SotW's version of the type (empty for delta).
    pub(crate) version: &'r str,
    /// Each resource sent and its version (borrowed from the response: nothing is copied
    /// for a resource the proxy's resources hold).
    pub(crate) resources: Vec<(&'r str, &'r str)>,
    /// Resources removed (delta).
    pub(crate) removed: &'r [String],
    /// SotW: the response replaces the type's whole set.
    pub(crate) replaces: bool,
}

/// What a stream holds of one resource: the version last sent (shared with the proxy's
/// resources when it is still theirs: no copy per stream), which response carried it, and
/// its state. Kept small: a proxy holds dozens of these.
#[derive(Debug, Clone)]
struct Resource {
    version: Version,
    /// Sequence number of the response that last carried it.
    seq: u32,
    state: ResourceState,
}

/// A version as sent: the proxy's own resource (shared), or a copy when it is not there
/// (rare). Both thin pointers, so that a `Resource` is 24 bytes rather than 32.
#[derive(Debug, Clone)]
enum Version {
    Shared(Arc<crate::content::Versioned>),
    Owned(Arc<String>),
}

impl Version {
    fn as_str(&self) -> &str {
        match self {
            Version::Shared(v) => &v.version,
            Version::Owned(v) => v.as_str(),
        }
    }
}

/// An order-independent digest of a set of (name, version) pairs, kept up to date as pairs
/// come and go: the XOR of a 128-bit hash of each pair. A delta stream's version of a type,
/// so that it costs a hash per resource sent rather than a pass over the whole set.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SetDigest(u128);

impl SetDigest {
    fn pair(name: &str, version: &str) -> u128 {
        use std::hash::{BuildHasher, Hash, Hasher};
        let half = |seed: u64| {
            let mut h = foldhash::quality::FixedState::with_seed(seed).build_hasher();
            name.hash(&mut h);
            version.hash(&mut h);
            h.finish()
        };
        (u128::from(half(1)) << 64) | u128::from(half(2))
    }

    /// Adds a pair, or takes it out again (XOR is its own inverse).
    fn toggle(&mut self, name: &str, version: &str) {
        self.0 ^= Self::pair(name, version);
    }

    fn hex(self) -> String {
        format!("{:032x}", self.0)
    }
}

/// A version as reported: shared by the last response sent, the one in flight and the last
/// one acknowledged (most often the same).
type TypeVersion = Arc<str>;

#[derive(Debug, Default)]
struct TypeView {
    /// Nonce, version, when.
    last_sent: Option<(String, TypeVersion, SystemTime)>,
    /// Nonce, version, when.
    last_acked: Option<(String, TypeVersion, SystemTime)>,
    last_nack: Option<(String, String, SystemTime)>,
    /// By name (the proxy's resources' own names, shared).
    resources: SortedMap<Arc<str>, Resource>,
    /// Responses in flight, oldest first: sequence number, nonce, version, when.
    pending: Vec<(u32, String, TypeVersion, Instant)>,
    next_seq: u32,
    /// Delta: the digest of `resources` (names and versions as sent).
    digest: SetDigest,
}

/// A resource's version, state, error and the time of its type's last change, by name.
type Row<'a> = (&'a str, (&'a str, ResourceState, Option<&'a str>, Option<SystemTime>));

#[derive(Debug, Default)]
struct ViewState {
    node_id: String,
    snapshot_at: Option<SystemTime>,
    current: Option<Arc<VersionedResources>>,
    /// By type URL (meshd's own constants: no copy per stream).
    types: SortedMap<&'static str, TypeView>,
    stuck: bool,
    /// The stream was told to reset (counted once).
    reset: bool,
}

impl ViewState {
    /// The types the stream was sent, then those its resources hold and it was not sent.
    fn type_urls(&self) -> Vec<&'static str> {
        let mut types: Vec<&'static str> = self.types.keys().copied().collect();
        if let Some(current) = &self.current {
            types.extend(current.by_type.keys().copied().filter(|t| !self.types.contains_key(*t)));
        }
        types
    }
}

/// One stream's status, shared by its driver and the tracker.
#[derive(Debug)]
pub(crate) struct StreamView {
    id: u64,
    protocol: &'static str,
    opened: SystemTime,
    state: Mutex<ViewState>,
    /// Responses in flight on every stream (the tracker's count).
    pending_total: Arc<std::sync::atomic::AtomicUsize>,
    /// Notified when the stream must be reset (stuck too long).
    pub(crate) reset: Notify,
}

impl StreamView {
    /// Records a response handed to the transport.
    pub(crate) fn sent(&self, sent: Sent<'_>) {
        let now = SystemTime::now();
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let current = st.current.as_ref().and_then(|c| c.map(sent.type_url)).cloned();
        let Some(kind) = crate::resources::ResourceType::from_url(sent.type_url) else {
            return;
        };
        let type_url = crate::resources::TYPES[kind.index()];
        if !st.types.contains_key(type_url) {
            st.types.insert(type_url, TypeView::default());
            st.types.trim();
        }
        let Some(t) = st.types.get_mut(type_url) else { return };
        t.next_seq = t.next_seq.wrapping_add(1);
        let seq = t.next_seq;
        if sent.replaces {
            let keep: std::collections::HashSet<&str> = sent.resources.iter().map(|(n, _)| *n).collect();
            t.resources.retain(|name, _| keep.contains(&**name));
        }
        let delta = !sent.replaces;
        for name in sent.removed {
            if let Some(gone) = t.resources.remove(name.as_str())
                && delta
            {
                t.digest.toggle(name, gone.version.as_str());
            }
        }
        for (name, version) in sent.resources {
            if delta {
                if let Some(before) = t.resources.get(name) {
                    t.digest.toggle(name, before.version.as_str());
                }
                t.digest.toggle(name, version);
            }
            let shared = current
                .as_ref()
                .and_then(|m| m.get_key_value(name))
                .filter(|(_, v)| v.version == version);
            let (key, version) = match shared {
                Some((key, v)) => (Arc::clone(key), Version::Shared(Arc::clone(v))),
                None => (Arc::from(name), Version::Owned(Arc::new(version.to_owned()))),
            };
            t.resources.insert(
                key,
                Resource {
                    version,
                    seq,
                    state: ResourceState::Stale,
                },
            );
        }
        let version: TypeVersion = if delta {
            Arc::from(t.digest.hex())
        } else {
            Arc::from(sent.version)
        };
        t.last_sent = Some((sent.nonce.to_owned(), Arc::clone(&version), now));
        t.pending.push((seq, sent.nonce.to_owned(), version, Instant::now()));
        t.resources.trim();
        self.pending_total.fetch_add(1, Ordering::Relaxed);
    }

    /// Records a request answering the response `nonce` of `type_url`: acknowledged, or
    /// rejected with `error`.
    pub(crate) fn answered(&self, type_url: &str, nonce: &str, error: Option<&str>) {
        if nonce.is_empty() {
            return;
        }
        let now = SystemTime::now();
        let mut st = self.state.lock();
        let Some(t) = st.types.get_mut(type_url) else { return };
        let Some(at) = t.pending.iter().position(|(_, n, _, _)| n == nonce) else {
            return;
        };
        // This response, and any sent before it, are answered.
        let answered = at + 1;
        let seq = t.pending[at].0;
        let version = Arc::clone(&t.pending[at].2);
        t.pending.drain(..answered);
        self.pending_total.fetch_sub(answered, Ordering::Relaxed);
        let state = if error.is_some() {
            ResourceState::Error
        } else {
            ResourceState::Synced
        };
        for r in t.resources.values_mut().filter(|r| r.seq == seq) {
            r.state = state;
        }
        match error {
            None => t.last_acked = Some((nonce.to_owned(), version, now)),
            Some(e) => t.last_nack = Some((nonce.to_owned(), e.to_owned(), now)),
        }
        if st.types.values().all(|t| t.pending.is_empty()) {
            st.stuck = false;
        }
    }

    /// Records new resources for the proxy (from a new snapshot).
    pub(crate) fn resources(&self, node_id: &str, current: &Arc<VersionedResources>) {
        let mut st = self.state.lock();
        if st.node_id.is_empty() {
            st.node_id = node_id.to_owned();
        }
        st.snapshot_at = Some(SystemTime::now());
        st.current = Some(Arc::clone(current));
    }

    fn oldest_pending(&self) -> Option<Duration> {
        let st = self.state.lock();
        st.types
            .values()
            .filter_map(|t| t.pending.first().map(|(_, _, _, at)| at.elapsed()))
            .max()
    }

    /// The stream's status as reported over HTTP.
    fn report(&self, server: &str) -> StreamStatus {
        let st = self.state.lock();
        let problems = st.current.as_ref().map(|c| c.problems.clone()).unwrap_or_default();
        let cp = st
            .current
            .as_ref()
            .and_then(|c| c.snapshot.as_deref())
            .and_then(|s| s.connect_proxy());
        let implicit_upstreams = cp
            .map(|cp| {
                cp.upstreams
                    .iter()
                    .filter(|(_, u)| proxycfg::ConnectProxySnapshot::is_implicit(u))
                    .map(|(id, _)| id.to_string())
                    .collect()
            })
            .unwrap_or_default();
        let mut types = Vec::new();
        let mut names: Vec<&str> = st.types.keys().copied().collect();
        if let Some(current) = &st.current {
            for t in current.by_type.keys() {
                if !names.contains(t) {
                    names.push(t);
                }
            }
        }
        names.sort_unstable();
        for type_url in names {
            let view = st.types.get(type_url);
            let mut counts: BTreeMap<ResourceState, usize> = BTreeMap::new();
            each_resource_state(view, st.current.as_deref(), type_url, |(_, (_, state, _, _))| {
                *counts.entry(state).or_default() += 1;
            });
            types.push(TypeStatus {
                type_url: type_url.to_owned(),
                last_sent: view
                    .and_then(|v| v.last_sent.as_ref())
                    .map(|(nonce, version, at)| SentResponse {
                        nonce: nonce.clone(),
                        version: version.to_string(),
                        at: rfc3339(*at),
                    }),
                last_acked: view
                    .and_then(|v| v.last_acked.as_ref())
                    .map(|(nonce, version, at)| Acked {
                        nonce: nonce.clone(),
                        version: version.to_string(),
                        at: rfc3339(*at),
                    }),
                last_nack: view.and_then(|v| v.last_nack.as_ref()).map(|(nonce, error, at)| Nack {
                    nonce: nonce.clone(),
                    error: error.clone(),
                    at: rfc3339(*at),
                }),
                pending: view.map_or(0, |v| v.pending.len()),
                oldest_pending_seconds: view
                    .and_then(|v| v.pending.first())
                    .map(|(_, _, _, at)| at.elapsed().as_secs_f64()),
                resources: counts,
            });
        }
        StreamStatus {
            node: st.node_id.clone(),
            protocol: self.protocol,
            server: server.to_owned(),
            opened_at: rfc3339(self.opened),
            snapshot_age_seconds: st.snapshot_at.and_then(|at| at.elapsed().ok()).map(|d| d.as_secs_f64()),
            stuck: st.stuck,
            types,
            build_problems: problems,
            transparent: cp.is_some_and(|cp| cp.transparent),
            implicit_upstreams,
        }
    }
}

impl Drop for StreamView {
    fn drop(&mut self) {
        let pending: usize = self.state.get_mut().types.values().map(|t| t.pending.len()).sum();
        self.pending_total.fetch_sub(pending, Ordering::Relaxed);
    }
}

/// Each resource of `type_url` with its version, state, error and last change, handed to
/// `each`: what was sent (a rejected one carries its type's last rejection), then what the
/// current resources hold that was never sent. Nothing is collected or copied.
fn each_resource_state<'a>(
    view: Option<&'a TypeView>,
    current: Option<&'a VersionedResources>,
    type_url: &str,
    mut each: impl FnMut(Row<'a>),
) {
    if let Some(v) = view {
        let nack = v.last_nack.as_ref();
        let changed = v
            .last_acked
            .as_ref()
            .map(|(_, _, at)| *at)
            .max(nack.map(|(_, _, at)| *at));
        for (name, r) in v.resources.iter() {
            let error = (r.state == ResourceState::Error)
                .then(|| nack.map(|(_, e, _)| e.as_str()))
                .flatten();
            let updated = match r.state {
                ResourceState::Stale => v.last_sent.as_ref().map(|(_, _, at)| *at),
                _ => changed,
            };
            each((&**name, (r.version.as_str(), r.state, error, updated)));
        }
    }
    if let Some(current) = current {
        // Both are in name order: walk the names sent beside the names held, no lookups.
        let mut sent = view.map(|v| v.resources.keys().peekable());
        for (name, res) in current.of(type_url) {
            let was_sent = sent.as_mut().is_some_and(|sent| {
                while sent.next_if(|k| &***k < name).is_some() {}
                sent.peek().is_some_and(|k| &***k == name)
            });
            if !was_sent {
                each((name, (res.version.as_str(), ResourceState::NotSent, None, None)));
            }
        }
    }
}

/// Formats a time as RFC 3339 (seconds).
pub(crate) fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

/// A response handed out.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct SentResponse {
    /// Its nonce.
    pub nonce: String,
    /// Its version: SotW's `version_info`; for delta, the digest of the type's resources
    /// sent so far (names and versions), this response applied.
    pub version: String,
    /// When.
    pub at: String,
}

/// An acknowledgement.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Acked {
    /// The nonce acknowledged.
    pub nonce: String,
    /// The version of the response acknowledged (as `SentResponse::version`).
    pub version: String,
    /// When.
    pub at: String,
}

/// A rejection.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Nack {
    /// The nonce rejected.
    pub nonce: String,
    /// The proxy's detail.
    pub error: String,
    /// When.
    pub at: String,
}

/// One type's sync status on one stream.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct TypeStatus {
    /// The type URL.
    pub type_url: String,
    /// The last response of the type handed out.
    pub last_sent: Option<SentResponse>,
    /// The last acknowledgement.
    pub last_acked: Option<Acked>,
    /// The last rejection, with the proxy's error.
    pub last_nack: Option<Nack>,
    /// Responses not yet answered.
    pub pending: usize,
    /// How long the oldest unanswered response has waited.
    pub oldest_pending_seconds: Option<f64>,
    /// Resources by state.
    pub resources: BTreeMap<ResourceState, usize>,
}

/// One stream's sync status.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct StreamStatus {
    /// The proxy (the node id it sent).
    pub node: String,
    /// `delta` or `sotw`.
    pub protocol: &'static str,
    /// The server holding the stream.
    pub server: String,
    /// When the stream opened.
    pub opened_at: String,
    /// How long ago the proxy's resources last changed.
    pub snapshot_age_seconds: Option<f64>,
    /// A response has waited more than 10 s for its answer.
    pub stuck: bool,
    /// By type.
    pub types: Vec<TypeStatus>,
    /// Parts of the proxy's configuration that cannot be built (by upstream).
    pub build_problems: BTreeMap<String, String>,
    /// The proxy runs in transparent mode.
    pub transparent: bool,
    /// Its implicit upstreams (transparent mode: the services its intentions let it reach
    /// and it does not declare), by id.
    pub implicit_upstreams: Vec<String>,
}

/// Every open stream's view.
#[derive(Debug)]
pub(crate) struct Tracker {
    streams: Mutex<HashMap<u64, Arc<StreamView>>>,
    next: AtomicU64,
    server: Mutex<String>,
    scanning: std::sync::atomic::AtomicBool,
    /// (flag after, reset after).
    timing: Mutex<(Duration, Duration)>,
    /// Responses in flight on every stream: nothing to look at while it is 0.
    pending_total: Arc<std::sync::atomic::AtomicUsize>,
}

impl Default for Tracker {
    fn default() -> Self {
        Self {
            streams: Mutex::default(),
            next: AtomicU64::new(0),
            server: Mutex::default(),
            scanning: std::sync::atomic::AtomicBool::new(false),
            timing: Mutex::new((STUCK_AFTER, RESET_AFTER)),
            pending_total: Arc::default(),
        }
    }
}

/// Removes a stream's view when its driver ends.
#[derive(Debug)]
pub(crate) struct ViewGuard {
    tracker: Arc<Tracker>,
    pub(crate) view: Arc<StreamView>,
}

impl Drop for ViewGuard {
    fn drop(&mut self) {
        self.tracker.streams.lock().remove(&self.view.id);
    }
}

impl Tracker {
    /// Flags streams stuck after `flag` without an answer, and resets them after `reset`.
    pub(crate) fn set_timing(&self, flag: Duration, reset: Duration) {
        *self.timing.lock() = (flag, reset);
    }

    /// Names the server in reports.
    pub(crate) fn set_server(&self, name: &str) {
        *self.server.lock() = name.to_owned();
    }

    /// A view for a new stream of `node_id`.
    pub(crate) fn open(self: &Arc<Self>, protocol: &'static str, node_id: &str) -> ViewGuard {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let view = Arc::new(StreamView {
            id,
            protocol,
            opened: SystemTime::now(),
            state: Mutex::new(ViewState {
                node_id: node_id.to_owned(),
                ..ViewState::default()
            }),
            pending_total: Arc::clone(&self.pending_total),
            reset: Notify::new(),
        });
        self.streams.lock().insert(id, Arc::clone(&view));
        ViewGuard {
            tracker: Arc::clone(self),
            view,
        }
    }

    fn views(&self) -> Vec<Arc<StreamView>> {
        self.streams.lock().values().cloned().collect()
    }

    /// Every stream's status, by node then opening time.
    pub(crate) fn report(&self) -> Vec<StreamStatus> {
        let server = self.server.lock().clone();
        let mut out: Vec<_> = self.views().iter().map(|v| v.report(&server)).collect();
        out.sort_by(|a, b| a.node.cmp(&b.node).then(a.opened_at.cmp(&b.opened_at)));
        out
    }

    /// Visits every stream whose node `node_matches` for CSDS: its node id and each resource it
    /// holds or is due, borrowed from its status (see [`ResourceRef`]) while the stream's lock
    /// is held, so that the caller encodes its answer with no copy in between. `contents` says
    /// for which type URLs a resource's value is lent too.
    pub(crate) fn each_stream(
        &self,
        node_matches: impl Fn(&str) -> bool,
        contents: impl Fn(&str) -> bool,
        mut visit: impl FnMut(&str, &[ResourceRef<'_>]),
    ) {
        for v in self.views() {
            let st = v.state.lock();
            if !node_matches(&st.node_id) {
                continue;
            }
            let types = st.type_urls();
            // At most every resource sent plus every one held.
            let bound = st.types.values().map(|t| t.resources.len()).sum::<usize>()
                + st.current
                    .as_ref()
                    .map_or(0, |c| c.by_type.values().map(|m| m.len()).sum());
            let mut rows = Vec::with_capacity(bound);
            for type_url in types {
                let with_contents = contents(type_url);
                let held = st.current.as_ref().and_then(|c| c.map(type_url));
                each_resource_state(
                    st.types.get(type_url),
                    st.current.as_deref(),
                    type_url,
                    |(name, (version, state, error, updated))| {
                        let value = if with_contents {
                            held.and_then(|m| m.get(name)).map(|r| &r.resource)
                        } else {
                            None
                        };
                        rows.push(ResourceRef {
                            type_url,
                            name,
                            version,
                            state,
                            error,
                            updated,
                            value,
                        });
                    },
                );
            }
            visit(&st.node_id, &rows);
        }
    }

    /// Each stream of `node` (oldest first) with its resources.
    pub(crate) fn resources_of(&self, node: &str) -> Vec<StreamResources> {
        let mut out: Vec<(SystemTime, StreamResources)> = Vec::new();
        for v in self.views() {
            let st = v.state.lock();
            if st.node_id != node {
                continue;
            }
            let mut types = st.type_urls();
            types.sort_unstable();
            let pending_types = types
                .iter()
                .copied()
                .filter(|t| st.types.get(t).is_some_and(|v| !v.pending.is_empty()))
                .collect();
            let mut resources = Vec::new();
            for type_url in types {
                each_resource_state(
                    st.types.get(type_url),
                    st.current.as_deref(),
                    type_url,
                    |(name, (version, state, _, _))| {
                        resources.push(ResourceStatus {
                            type_url,
                            name: name.to_owned(),
                            version: version.to_owned(),
                            state,
                        });
                    },
                );
            }
            out.push((
                v.opened,
                StreamResources {
                    protocol: v.protocol,
                    opened_at: rfc3339(v.opened),
                    pending_types,
                    resources,
                },
            ));
        }
        out.sort_by_key(|(opened, _)| *opened);
        out.into_iter().map(|(_, s)| s).collect()
    }

    /// Starts the check for stuck streams every 500 ms (once per server; ends with `stop`):
    /// flags (and counts) a stream once its oldest unanswered response has waited the flag
    /// time, tells it to reset (and counts that) once it has waited the reset time.
    pub(crate) fn start_scanning(
        self: &Arc<Self>,
        metrics: Arc<XdsMetrics>,
        stop: tokio_util::sync::CancellationToken,
    ) {
        if self.scanning.swap(true, Ordering::AcqRel) {
            return;
        }
        let tracker = Arc::downgrade(self);
        let scan = async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(SCAN_EVERY) => {}
                }
                let Some(tracker) = tracker.upgrade() else { return };
                if tracker.pending_total.load(Ordering::Relaxed) == 0 {
                    continue;
                }
                let (flag, reset) = *tracker.timing.lock();
                for view in tracker.views() {
                    let Some(waited) = view.oldest_pending() else { continue };
                    if waited >= reset {
                        let mut st = view.state.lock();
                        if !st.reset {
                            st.reset = true;
                            metrics.stream_stuck_reset();
                        }
                        drop(st);
                        view.reset.notify_one();
                    } else if waited >= flag {
                        let mut st = view.state.lock();
                        if !st.stuck {
                            st.stuck = true;
                            metrics.stream_stuck();
                            warn!(node = %st.node_id, waited = ?waited, reset_after = ?reset, "xDS stream stuck: a response has no answer; the stream will be reset");
                        }
                    }
                }
            }
        };
        // Ends with `stop`, or once the tracker is gone.
        tokio::spawn(scan.instrument(tracing::info_span!("stuck_stream_scan")));
    }
}

/// One resource of one stream, for CSDS, borrowed from the stream's status.
pub(crate) struct ResourceRef<'a> {
    /// One of meshd's type URL constants.
    pub(crate) type_url: &'static str,
    pub(crate) name: &'a str,
    pub(crate) version: &'a str,
    pub(crate) state: ResourceState,
    pub(crate) error: Option<&'a str>,
    pub(crate) updated: Option<SystemTime>,
    pub(crate) value: Option<&'a envoy_types::pb::google::protobuf::Any>,
}

/// The name of an encoded resource: field 1 of every xDS resource message (a listener's,
/// cluster's, route configuration's or secret's name, a load assignment's cluster name).
pub(crate) fn name_of(value: &[u8]) -> &str {
    let mut at = 0;
    let varint = |bytes: &[u8], at: &mut usize| -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *bytes.get(*at)?;
            *at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    };
    while at < value.len() {
        let Some(key) = varint(value, &mut at) else { break };
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                if varint(value, &mut at).is_none() {
                    break;
                }
            }
            1 => at += 8,
            5 => at += 4,
            2 => {
                let Some(len) = varint(value, &mut at) else { break };
                let end = at.saturating_add(len as usize);
                if field == 1 {
                    return value
                        .get(at..end)
                        .and_then(|b| std::str::from_utf8(b).ok())
                        .unwrap_or_default();
                }
                at = end;
            }
            _ => break,
        }
    }
    ""
}

mod sorted;
#[cfg(test)]
mod tests;

use sorted::SortedMap;

// The per-resource record's size is what the tracking costs per resource of every stream.
const _: () = assert!(std::mem::size_of::<Resource>() == 24);
