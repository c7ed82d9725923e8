//! The per-proxy State: one task that owns a proxy's watches and builds its snapshots.
//!
//! Loop: fold every current update into the working snapshot through the kind handler; the
//! first change after a publish arms the coalescing timer; when it fires and the snapshot is
//! valid, publish it (after the global rate limiter, if any). Updates from cancelled watches
//! are dropped, error results are logged and leave the last good data in place. The task ends
//! when its token is cancelled, and only after every watch task it started has ended.

use crate::data_sources::{DataSources, UpdateEvent};
use crate::handler::{UnsupportedKind, handler_for};
use crate::rate_limit::RateLimiter;
use crate::registration::ProxyRegistration;
use crate::snapshot::ConfigSnapshot;
use crate::watches::WatchErrors;
use crate::{Metrics, Watches};
use std::{sync::Arc, time::Duration};
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, trace, warn};

/// What one proxy's slot holds.
#[derive(Debug, Clone)]
pub(crate) enum Published {
    /// Nothing yet (no valid snapshot), or the proxy was deregistered.
    Nothing,
    /// The latest valid snapshot.
    Snapshot(Arc<ConfigSnapshot>),
    /// The proxy is registered but cannot be served (its kind has no handler): why.
    Refused(Arc<str>),
}

impl Published {
    pub(crate) fn snapshot(&self) -> Option<&Arc<ConfigSnapshot>> {
        match self {
            Published::Snapshot(s) => Some(s),
            _ => None,
        }
    }
}

/// The latest published state of one proxy.
pub(crate) type Slot = watch::Sender<Published>;

/// What one State needs from its Manager.
pub(crate) struct StateParams {
    pub(crate) registration: ProxyRegistration,
    pub(crate) datacenter: Arc<str>,
    pub(crate) sources: DataSources,
    pub(crate) slot: Slot,
    pub(crate) coalesce: Duration,
    pub(crate) limiter: Option<Arc<RateLimiter>>,
    pub(crate) event_buffer: usize,
    pub(crate) intention_default_allow: bool,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) cancel: CancellationToken,
    /// The watches failing now (shared with the Manager, which reports them).
    pub(crate) errors: WatchErrors,
}

/// Starts the State task for a registration; it runs until `params.cancel` fires.
pub(crate) fn spawn(params: StateParams) -> Result<JoinHandle<()>, UnsupportedKind> {
    let handler = handler_for(&params.registration, &params.datacenter, &params.sources)?;
    let span = info_span!("proxy", id = %params.registration.id, kind = %params.registration.service.kind);
    params.metrics.state_started();
    Ok(tokio::spawn(run(params, handler).instrument(span)))
}

/// Completes when `deadline` has passed. A deadline already due completes at once, without
/// a timer (whose 1 ms granularity would add a millisecond), unless updates are still queued:
/// those are folded first.
async fn ready_or_sleep(deadline: Instant, queue_empty: bool) {
    if deadline <= Instant::now() {
        if queue_empty {
            return;
        }
        std::future::pending::<()>().await;
    }
    tokio::time::sleep_until(deadline).await;
}

async fn run(params: StateParams, mut handler: Box<dyn crate::handler::KindHandler>) {
    let StateParams {
        registration,
        datacenter,
        sources: _,
        slot,
        coalesce,
        limiter,
        event_buffer,
        intention_default_allow,
        metrics,
        cancel,
        errors,
    } = params;
    let (tx, mut rx) = mpsc::channel(event_buffer.max(1));
    let mut watches = Watches::new(tx, cancel.child_token(), Arc::clone(&metrics), Arc::clone(&errors));
    let kind = handler.initialize(&mut watches);
    // Versions keep increasing across rebuilds of the same proxy.
    let version = slot.borrow().snapshot().map_or(0, |s| s.version);
    let mut snapshot = ConfigSnapshot {
        proxy_id: Arc::new(registration.id.clone()),
        service: Arc::clone(&registration.service),
        datacenter,
        version,
        roots: None,
        proxy_defaults: None,
        intention_default_allow,
        kind,
    };
    debug!(watches = watches.len(), "proxy state started");

    let far_future = || Instant::now() + Duration::from_secs(86_400 * 365);
    let mut window = Window {
        coalesce,
        deadline: None,
        last_published: None,
        held_since: None,
    };
    // Registered once, not on every turn of the loop.
    let cancelled = cancel.cancelled();
    tokio::pin!(cancelled);
    loop {
        let queue_empty = rx.is_empty();
        tokio::select! {
            biased;
            () = &mut cancelled => break,
            () = ready_or_sleep(window.deadline.unwrap_or_else(far_future), queue_empty), if window.deadline.is_some() => {
                window.deadline = None;
                if !snapshot.is_valid() || window.hold(watches.awaiting()) {
                    continue;
                }
                if let Some(limiter) = &limiter {
                    tokio::select! {
                        biased;
                        () = &mut cancelled => break,
                        () = limiter.acquire() => {}
                    }
                }
                snapshot.version += 1;
                window.last_published = Some(Instant::now());
                window.held_since = None;
                watches.mark();
                slot.send_replace(Published::Snapshot(Arc::new(snapshot.clone())));
                metrics.snapshot_built();
                trace!(version = snapshot.version, "snapshot published");
            }
            Some(event) = rx.recv() => {
                let changed = apply(*event, &mut *handler, &mut snapshot, &mut watches, &metrics, &errors);
                window.folded(changed, watches.awaiting());
            }
            // The watches run here, in the State's task: futures send into `rx`,
            // subscriptions' results come straight back.
            event = std::future::poll_fn(|cx| watches.poll_event(cx)) => {
                let changed = apply(event, &mut *handler, &mut snapshot, &mut watches, &metrics, &errors);
                window.folded(changed, watches.awaiting());
            }
        }
    }
    watches.shutdown();
    metrics.state_stopped();
    debug!("proxy state stopped");
}

/// When the next snapshot goes out.
struct Window {
    coalesce: Duration,
    /// The pending publication, if a change is waiting.
    deadline: Option<Instant>,
    /// When the last snapshot went out: at most one publication per window.
    last_published: Option<Instant>,
    /// Since when a due publication waits for watches started by the changes it holds.
    held_since: Option<Instant>,
}

/// The longest a due publication waits for the first results of watches its changes
/// started: beyond it, what is known goes out.
const MAX_HOLD: Duration = Duration::from_millis(500);

impl Window {
    /// True when a due publication should wait: some watch started by the changes it holds
    /// (an upstream's chain, a chain's targets) has not delivered yet, and it has waited less
    /// than [`MAX_HOLD`]. A snapshot that names an upstream whose chain or endpoints are not
    /// known yet builds nothing more than the last one (or a cluster without endpoints):
    /// waiting makes the up to three snapshots an added upstream can cost (upstream, chain,
    /// endpoints: when the sources answer after a publish, as an agent's cache does) one,
    /// and keeps Envoy from a cluster that has no endpoints yet.
    fn hold(&mut self, awaiting: usize) -> bool {
        if awaiting == 0 {
            return false;
        }
        let now = Instant::now();
        let since = *self.held_since.get_or_insert(now);
        if now >= since + MAX_HOLD {
            return false;
        }
        // Publish when the hold runs out, unless the last awaited result comes first.
        self.deadline = Some(since + MAX_HOLD);
        true
    }

    /// After an update is folded in: schedules a publication for a change, and publishes a
    /// held one as soon as nothing is awaited any more.
    fn folded(&mut self, changed: bool, awaiting: usize) {
        if self.held_since.is_some() && awaiting == 0 {
            self.deadline = Some(Instant::now());
        } else if changed {
            self.changed();
        }
    }

    /// Schedules a publication for a change, unless one is already pending. The first
    /// snapshot waits one window, so that the start-up burst (roots, leaf, chains, then their
    /// endpoints) goes out complete, once. After that, leading edge: a change after a quiet
    /// window goes out on the next turn of the loop (updates already queued folded in);
    /// changes within a window wait for its end, together.
    fn changed(&mut self) {
        if self.deadline.is_some() {
            return;
        }
        let now = Instant::now();
        self.deadline = Some(match self.last_published {
            None => now + self.coalesce,
            Some(at) if at + self.coalesce > now => at + self.coalesce,
            Some(_) => now,
        });
    }
}

/// Folds one update into the snapshot; true when it changed it. Updates of cancelled
/// watches and data-source errors leave the last good data in place.
fn apply(
    event: UpdateEvent,
    handler: &mut dyn crate::handler::KindHandler,
    snapshot: &mut ConfigSnapshot,
    watches: &mut Watches,
    metrics: &Metrics,
    errors: &WatchErrors,
) -> bool {
    if !watches.is_current(&event) {
        metrics.stale_update();
        trace!(id = %event.correlation_id, "dropped update from a cancelled watch");
        return false;
    }
    watches.delivered(&event);
    match event.result {
        Err(err) => {
            metrics.data_source_error();
            let (id, message) = (event.correlation_id.to_string(), err.to_string());
            // One log line per change of a watch's error; the proxy's status shows it.
            if errors.lock().insert(id, message).as_deref() != Some(&err.to_string()) {
                warn!(id = %event.correlation_id, error = %err, "data source error; keeping last good data");
            }
            false
        }
        Ok(payload) => {
            let mut failing = errors.lock();
            if !failing.is_empty() && failing.remove(&event.correlation_id.to_string()).is_some() {
                info!(id = %event.correlation_id, "data source recovered");
            }
            drop(failing);
            apply_payload(event.correlation_id, payload, handler, snapshot, watches, metrics)
        }
    }
}

/// Folds a good result into the snapshot; true when it changed it.
fn apply_payload(
    id: crate::CorrelationId,
    payload: crate::UpdatePayload,
    handler: &mut dyn crate::handler::KindHandler,
    snapshot: &mut ConfigSnapshot,
    watches: &mut Watches,
    metrics: &Metrics,
) -> bool {
    // What every kind shares is kept here, not by each kind's handler.
    if let (crate::CorrelationId::ProxyDefaults, crate::UpdatePayload::ConfigEntry(entry)) = (&id, &payload) {
        snapshot.proxy_defaults = Some(entry.clone());
        metrics.update();
        return true;
    }
    match handler.handle_update(id, payload, snapshot, watches) {
        Ok(()) => {
            metrics.update();
            true
        }
        Err(err) => {
            warn!(error = %err, "update ignored");
            false
        }
    }
}
