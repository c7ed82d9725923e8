//! The running watches of one proxy State: started, cancelled and dropped here only.
//!
//! A watch is one of two things, both polled by the State's own task (a proxy has a few dozen
//! watches, and a task each would cost more memory than the watches themselves), and both
//! owned by the State:
//! - a subscription ([`DataSource::subscribe`]): the latest value of a follower many proxies
//!   share, polled here directly, its results handed to the State as they are taken — a few
//!   words per watch;
//! - otherwise the data source's future ([`DataSource::notify`]), in the State's set of
//!   futures, sending its results through the State's queue.
//!
//! Cancelling one watch drops its subscription, or aborts its future, which the set then
//! drops; stopping the State fires the State's token, which every future was given, and drops
//! them all.
//! Each start gets a fresh generation number, stamped on the events it sends, so an update
//! still queued from a cancelled start is recognised and dropped. Each watch remembers a hash
//! of its request, so [`Watches::ensure`] restarts a watch only when what it asks for changed.

use crate::data_sources::{DataSource, EventSender, Subscription, UpdateEvent, WatchRequest};
use crate::{CorrelationId, Metrics};
use futures_util::future::{AbortHandle, Abortable};
use futures_util::stream::{FuturesUnordered, StreamExt as _};
use std::{
    collections::HashMap,
    future::Future,
    hash::{DefaultHasher, Hash, Hasher},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Span, debug, warn};

struct Running {
    generation: u64,
    request_hash: u64,
    how: How,
    /// Its first result (or error) has been folded in.
    delivered: bool,
}

/// How a watch runs.
enum How {
    /// Its future, in the State's set.
    Future(AbortHandle),
    /// Its subscription, polled by [`Watches::poll_event`].
    Polled(PolledWatch),
    /// Its subscription ended (the store closed): nothing more comes.
    Ended,
}

/// A subscription. Counted in the live-watch gauge while it is in the map: [`Watches`] counts
/// it out wherever it leaves (cancelled, ended, shut down).
struct PolledWatch {
    sub: Box<dyn Subscription>,
}

fn hash_of<R: Hash>(req: &R) -> u64 {
    let mut h = DefaultHasher::new();
    req.hash(&mut h);
    h.finish()
}

/// The watches of one proxy failing now: the watch (its correlation id) and the error.
pub(crate) type WatchErrors = Arc<parking_lot::Mutex<std::collections::BTreeMap<String, String>>>;

/// The watches of one proxy, keyed by correlation id.
pub struct Watches {
    tasks: FuturesUnordered<Abortable<WatchTask>>,
    running: HashMap<CorrelationId, Running>,
    tx: mpsc::Sender<Box<UpdateEvent>>,
    state_cancel: CancellationToken,
    next_generation: u64,
    /// Results of subscriptions found ready by the last round of them and not returned
    /// yet: one round of every subscription collects each result waiting (a change that
    /// moves several watches at once costs one round, not one per result).
    ready: std::collections::VecDeque<UpdateEvent>,
    metrics: Arc<Metrics>,
    /// The proxy's failing watches: a cancelled watch's error goes with it.
    errors: WatchErrors,
    /// Running watches started since the mark ([`Watches::mark`]) whose first result has not
    /// come yet.
    awaiting: usize,
    /// The first generation started after the last mark.
    mark: u64,
}

type NotifyFuture = crate::WatchFuture<'static>;

/// One watch: the data source's future, run inside the proxy's span, counted in the
/// live-watch gauge until it is dropped however it ends (return, State shutdown or abort).
/// Written out by hand rather than as an `async` block so a watch costs one boxed future plus
/// a few words, not a second copy of its arguments.
struct WatchTask {
    notify: NotifyFuture,
    span: Span,
    metrics: Arc<Metrics>,
}

impl Future for WatchTask {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let _entered = this.span.enter();
        match this.notify.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(())) => Poll::Ready(()),
            Poll::Ready(Err(err)) => {
                warn!(error = %err, "watch could not run");
                Poll::Ready(())
            }
        }
    }
}

impl Drop for WatchTask {
    fn drop(&mut self) {
        self.metrics.watch_stopped();
    }
}

impl Watches {
    pub(crate) fn new(
        tx: mpsc::Sender<Box<UpdateEvent>>,
        cancel: CancellationToken,
        metrics: Arc<Metrics>,
        errors: WatchErrors,
    ) -> Self {
        Self {
            tasks: FuturesUnordered::new(),
            running: HashMap::new(),
            tx,
            state_cancel: cancel,
            next_generation: 1,
            ready: std::collections::VecDeque::new(),
            metrics,
            errors,
            awaiting: 0,
            mark: 0,
        }
    }

    /// Starts a watch of `req` under `id` unless one with an equal request already runs there;
    /// returns true if it (re)started.
    pub fn ensure<R: WatchRequest>(&mut self, source: &Arc<dyn DataSource<R>>, id: CorrelationId, req: R) -> bool {
        if self.running.get(&id).is_some_and(|r| r.request_hash == hash_of(&req)) {
            return false;
        }
        self.start(source, id, req);
        true
    }

    /// Starts a watch of `req` on `source` under `id`, replacing any watch already under `id`.
    pub fn start<R: WatchRequest>(&mut self, source: &Arc<dyn DataSource<R>>, id: CorrelationId, req: R) {
        self.cancel(&id);
        let generation = self.next_generation;
        self.next_generation += 1;
        let request_hash = hash_of(&req);
        self.metrics.watch_started();
        let how = match source.subscribe(&req) {
            Some(sub) => How::Polled(PolledWatch { sub }),
            None => {
                let sender = EventSender::new(self.tx.clone(), generation);
                let notify = Arc::clone(source).notify(req, id.clone(), sender, self.state_cancel.clone());
                let task = WatchTask {
                    notify,
                    span: Span::current(),
                    metrics: Arc::clone(&self.metrics),
                };
                let (abort, registration) = AbortHandle::new_pair();
                self.tasks.push(Abortable::new(task, registration));
                How::Future(abort)
            }
        };
        debug!(%id, generation, "watch started");
        self.awaiting += 1;
        self.running.insert(
            id,
            Running {
                generation,
                request_hash,
                how,
                delivered: false,
            },
        );
    }

    /// Stops the watch under `id`, if there is one.
    pub fn cancel(&mut self, id: &CorrelationId) -> bool {
        match self.running.remove(id) {
            Some(r) => {
                if !r.delivered && r.generation >= self.mark {
                    self.awaiting -= 1;
                }
                match &r.how {
                    How::Future(abort) => abort.abort(),
                    How::Polled(_) => self.metrics.watch_stopped(),
                    How::Ended => {}
                }
                let mut errors = self.errors.lock();
                if !errors.is_empty() {
                    errors.remove(&id.to_string());
                }
                debug!(%id, "watch cancelled");
                true
            }
            None => false,
        }
    }

    /// Stops every watch whose id satisfies `pred`; returns how many.
    pub fn cancel_where(&mut self, pred: impl Fn(&CorrelationId) -> bool) -> usize {
        let ids: Vec<CorrelationId> = self.running.keys().filter(|id| pred(id)).cloned().collect();
        for id in &ids {
            self.cancel(id);
        }
        ids.len()
    }

    /// True while a watch runs under `id`.
    pub fn contains(&self, id: &CorrelationId) -> bool {
        self.running.contains_key(id)
    }

    /// Number of watches started and not cancelled.
    pub fn len(&self) -> usize {
        self.running.len()
    }

    /// True when no watch is running.
    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Records that `event`, from the current start of its watch, is being folded in: the
    /// watch has delivered.
    pub(crate) fn delivered(&mut self, event: &UpdateEvent) {
        if let Some(r) = self.running.get_mut(&event.correlation_id)
            && r.generation == event.generation
            && !r.delivered
        {
            r.delivered = true;
            if r.generation >= self.mark {
                self.awaiting -= 1;
            }
        }
    }

    /// How many watches started since the last [`Watches::mark`] have not delivered their
    /// first result yet.
    pub(crate) fn awaiting(&self) -> usize {
        self.awaiting
    }

    /// Marks a publication: from now on only watches started after it are awaited (one that
    /// never answers holds at most the publication it was started for).
    pub(crate) fn mark(&mut self) {
        self.mark = self.next_generation;
        self.awaiting = 0;
    }

    /// True when `event` comes from the current start of a running watch.
    pub(crate) fn is_current(&self, event: &UpdateEvent) -> bool {
        self.running
            .get(&event.correlation_id)
            .is_some_and(|r| r.generation == event.generation)
    }

    /// Runs the watches until a subscription has a result, and returns it as an update of its
    /// watch; the futures make progress here too (they send into the State's queue). The State
    /// polls this beside its queue: that is what makes the watches progress. Results of
    /// watches cancelled or restarted since they were collected are still returned: the
    /// State drops them by generation ([`Watches::is_current`]).
    pub(crate) fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<UpdateEvent> {
        // Until the set is empty or every future in it is waiting.
        while let Poll::Ready(Some(_)) = self.tasks.poll_next_unpin(cx) {}
        if let Some(event) = self.ready.pop_front() {
            return Poll::Ready(event);
        }
        let mut ended = Vec::new();
        for (id, running) in self.running.iter_mut() {
            let How::Polled(watch) = &mut running.how else {
                continue;
            };
            match watch.sub.poll_next(cx) {
                Poll::Pending => {}
                Poll::Ready(Some(result)) => self.ready.push_back(UpdateEvent {
                    correlation_id: id.clone(),
                    result,
                    generation: running.generation,
                }),
                Poll::Ready(None) => ended.push(id.clone()),
            }
        }
        for id in ended {
            debug!(%id, "watch ended: its source closed");
            if let Some(running) = self.running.get_mut(&id) {
                running.how = How::Ended;
                // Nothing more comes: nothing to wait for.
                if !running.delivered {
                    running.delivered = true;
                    if running.generation >= self.mark {
                        self.awaiting -= 1;
                    }
                }
                self.metrics.watch_stopped();
            }
        }
        match self.ready.pop_front() {
            Some(event) => Poll::Ready(event),
            None => Poll::Pending,
        }
    }

    /// Cancels every watch and drops them all.
    pub(crate) fn shutdown(&mut self) {
        self.state_cancel.cancel();
        self.forget_subscriptions();
        self.running.clear();
        self.ready.clear();
        self.awaiting = 0;
        self.tasks.clear();
    }

    /// Counts every subscription out of the live-watch gauge, and drops it.
    fn forget_subscriptions(&mut self) {
        for running in self.running.values_mut() {
            if let How::Polled(_) = running.how {
                running.how = How::Ended;
                self.metrics.watch_stopped();
            }
        }
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        // However the State ended (a panic included), its subscriptions leave the gauge.
        self.forget_subscriptions();
    }
}
