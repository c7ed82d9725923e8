//! The running watches of one proxy State: started, cancelled and dropped here only.
//!
//! Each watch is a future in the State's own set, polled by the State's task (a proxy has a
//! few dozen watches, and a task each would cost more memory than the watches themselves): the
//! State owns them. Cancelling one watch aborts its future, which the set then drops; stopping
//! the State fires the State's token, which every watch was given, and drops the whole set.
//! Each start gets a fresh generation number, stamped on the events it sends, so an update
//! still queued from a cancelled start is recognised and dropped. Each watch remembers a hash
//! of its request, so [`Watches::ensure`] restarts a watch only when what it asks for changed.

use crate::data_sources::{DataSource, EventSender, UpdateEvent, WatchRequest};
use crate::{CorrelationId, Metrics};
use futures_util::future::{AbortHandle, Abortable};
use futures_util::stream::{FuturesUnordered, StreamExt};
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
    abort: AbortHandle,
}

fn hash_of<R: Hash>(req: &R) -> u64 {
    let mut h = DefaultHasher::new();
    req.hash(&mut h);
    h.finish()
}

/// The watches of one proxy, keyed by correlation id.
pub struct Watches {
    tasks: FuturesUnordered<Abortable<WatchTask>>,
    running: HashMap<CorrelationId, Running>,
    tx: mpsc::Sender<Box<UpdateEvent>>,
    state_cancel: CancellationToken,
    next_generation: u64,
    metrics: Arc<Metrics>,
    /// The proxy's failing watches: a cancelled watch's error goes with it.
    errors: crate::state::WatchErrors,
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
        errors: crate::state::WatchErrors,
    ) -> Self {
        Self {
            tasks: FuturesUnordered::new(),
            running: HashMap::new(),
            tx,
            state_cancel: cancel,
            next_generation: 1,
            metrics,
            errors,
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
        let sender = EventSender::new(self.tx.clone(), generation);
        let notify = Arc::clone(source).notify(req, id.clone(), sender, self.state_cancel.clone());
        self.metrics.watch_started();
        let task = WatchTask {
            notify,
            span: Span::current(),
            metrics: Arc::clone(&self.metrics),
        };
        let (abort, registration) = AbortHandle::new_pair();
        self.tasks.push(Abortable::new(task, registration));
        debug!(%id, generation, "watch started");
        self.running.insert(
            id,
            Running {
                generation,
                request_hash,
                abort,
            },
        );
    }

    /// Stops the watch under `id`, if there is one.
    pub fn cancel(&mut self, id: &CorrelationId) -> bool {
        match self.running.remove(id) {
            Some(r) => {
                r.abort.abort();
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

    /// True when `event` comes from the current start of a running watch.
    pub(crate) fn is_current(&self, event: &UpdateEvent) -> bool {
        self.running
            .get(&event.correlation_id)
            .is_some_and(|r| r.generation == event.generation)
    }

    /// Runs the watches; never completes (with no watches it just waits). The State polls it
    /// beside its queue: that is what makes the watches progress.
    pub(crate) async fn drive(&mut self) {
        loop {
            if self.tasks.next().await.is_none() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Cancels every watch and drops them all.
    pub(crate) fn shutdown(&mut self) {
        self.state_cancel.cancel();
        self.running.clear();
        self.tasks.clear();
    }
}
