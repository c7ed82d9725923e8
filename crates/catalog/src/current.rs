//! The state readers see, and who is told when it changes: the per-key index channels of
//! blocking queries and the event publisher. A storage swaps each new state in through
//! [`Current::replace`] (or [`Current::reset`] after a full reload); the store reads it.

use crate::keys::{IndexKey, Topic};
use crate::publisher::{Publisher, Subscription};
use crate::state::State;
use bounded_maps::SweptMap;
use parking_lot::{Mutex, RwLock};
use std::collections::HashSet;
use std::sync::Arc;
use structs::Index;
use tokio::sync::watch;

/// The current state and its followers.
pub(crate) struct Current {
    state: RwLock<Arc<State>>,
    /// Per-key index channels; keys nobody waits on are swept as the map grows. `None` once
    /// waiters are released (shutdown): every wait then answers at once.
    watches: Mutex<Option<SweptMap<IndexKey, watch::Sender<Index>>>>,
    publisher: Publisher,
}

impl Current {
    /// Starts from `state`, buffering `publish_buffer` events per topic.
    pub(crate) fn new(state: State, publish_buffer: usize) -> Arc<Self> {
        Arc::new(Self {
            state: RwLock::new(Arc::new(state)),
            watches: Mutex::new(Some(SweptMap::default())),
            publisher: Publisher::new(publish_buffer),
        })
    }

    /// The current state.
    pub(crate) fn read(&self) -> Arc<State> {
        self.state.read().clone()
    }

    /// Makes `state` current and wakes the waiters and subscribers of the keys it `bumped`.
    pub(crate) fn replace(&self, state: Arc<State>, bumped: &HashSet<IndexKey>) {
        *self.state.write() = Arc::clone(&state);
        // Only the keys this write touched; keys nobody waits on any more are dropped here or
        // swept when the map has doubled (see `index_receiver`). Nothing to wake once waiters
        // are released.
        if let Some(watches) = self.watches.lock().as_mut() {
            for key in bumped {
                if let Some(tx) = watches.get(key) {
                    if tx.receiver_count() == 0 {
                        watches.remove(key);
                    } else {
                        tx.send_replace(state.index_of(key));
                    }
                }
            }
        }
        self.publisher.publish(&state, bumped);
    }

    /// Makes `state` current after it was read again wholesale (a reload): every waiter
    /// reads again and every subscribed topic gets its new value. Only etcd's watch, which
    /// can lose its place in the change feed, reloads.
    #[cfg(feature = "etcd")]
    pub(crate) fn reset(&self, state: Arc<State>) {
        *self.state.write() = Arc::clone(&state);
        if let Some(watches) = self.watches.lock().as_mut() {
            watches.retain(|key, tx| {
                if tx.receiver_count() == 0 {
                    return false;
                }
                tx.send_replace(state.index_of(key));
                true
            });
        }
        let keys = self.publisher.keys();
        self.publisher.publish(&state, &keys);
    }

    /// The index of `key`, as a channel that changes with it; `None` once waiters are
    /// released.
    pub(crate) fn index_receiver(&self, key: &IndexKey) -> Option<watch::Receiver<Index>> {
        let mut guard = self.watches.lock();
        let watches = guard.as_mut()?;
        watches.sweep_if_due(|_, tx| tx.receiver_count() > 0);
        Some(
            watches
                .entry(key.clone())
                .or_insert_with(|| watch::Sender::new(self.read().index_of(key)))
                .subscribe(),
        )
    }

    /// Ends every wait now and makes later ones answer at once.
    pub(crate) fn release_waiters(&self) {
        // Dropping the senders wakes every receiver.
        self.watches.lock().take();
    }

    /// True once [`Current::release_waiters`] ran.
    pub(crate) fn waiters_released(&self) -> bool {
        self.watches.lock().is_none()
    }

    /// Subscribes to a topic: its current value first, then every change.
    pub(crate) fn subscribe(&self, topic: Topic) -> Subscription {
        self.publisher.subscribe(topic, || self.read())
    }

    /// Topics with subscribers now.
    pub(crate) fn subscribed_topics(&self) -> usize {
        self.publisher.topic_count()
    }
}
