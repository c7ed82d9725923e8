//! The state readers see, and who is told when it changes: the per-key index channels of
//! blocking queries and the event publisher. A storage swaps each new state in through
//! [`Current::replace`] (or [`Current::reset`] after a full reload); the store reads it.

use crate::keys::{IndexKey, Topic};
use crate::publisher::{Publisher, Subscription};
use crate::state::State;
use bounded_maps::SweptMap;
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use structs::Index;
use tokio::sync::watch;

/// The current state and its followers: what a storage makes current and the store reads.
pub struct Current {
    state: RwLock<Arc<State>>,
    /// Per-key index channels; keys nobody waits on are swept as the map grows. `None` once
    /// waiters are released (shutdown): every wait then answers at once.
    watches: Mutex<Option<SweptMap<IndexKey, watch::Sender<Index>>>>,
    /// The channels of [`IndexKey::KvPrefix`] keys, by prefix: a write looks up each prefix
    /// of each key it changes here, without allocating. Swept as `watches` is.
    kv_prefixes: Mutex<Option<KvPrefixes>>,
    publisher: Publisher,
}

/// KV prefixes with waiters, and the size at which they are next swept.
#[derive(Default)]
struct KvPrefixes {
    channels: BTreeMap<String, watch::Sender<Index>>,
    sweep_at: usize,
}

impl KvPrefixes {
    /// Wakes the waiters of every prefix of the keys `bumped` names (each at `index`, the
    /// write's: the last change under a prefix that holds a changed key).
    fn wake(&mut self, bumped: &HashSet<IndexKey>, index: Index) {
        if self.channels.is_empty() {
            return;
        }
        for key in bumped {
            let IndexKey::KvKey(key) = key else { continue };
            let ends = key.char_indices().map(|(i, _)| i).chain([key.len()]);
            for end in ends {
                if let Some(tx) = self.channels.get(&key[..end]) {
                    tx.send_replace(index);
                }
            }
        }
    }
}

impl Current {
    /// Starts from `state`, buffering `publish_buffer` events per topic.
    pub fn new(state: State, publish_buffer: usize) -> Arc<Self> {
        Arc::new(Self {
            state: RwLock::new(Arc::new(state)),
            watches: Mutex::new(Some(SweptMap::default())),
            kv_prefixes: Mutex::new(Some(KvPrefixes::default())),
            publisher: Publisher::new(publish_buffer),
        })
    }

    /// The current state.
    pub fn read(&self) -> Arc<State> {
        self.state.read().clone()
    }

    /// Makes `state` current and wakes the waiters and subscribers of the keys it `bumped`.
    pub fn replace(&self, state: Arc<State>, bumped: &HashSet<IndexKey>) {
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
        if let Some(prefixes) = self.kv_prefixes.lock().as_mut() {
            prefixes.wake(bumped, state.index);
        }
        self.publisher.publish(&state, bumped);
    }

    /// Makes `state` current after it was read again wholesale (a reload): every waiter
    /// reads again and every subscribed topic gets its new value. Only etcd's watch, which
    /// can lose its place in the change feed, reloads.
    pub fn reset(&self, state: Arc<State>) {
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
        if let Some(prefixes) = self.kv_prefixes.lock().as_mut() {
            prefixes.channels.retain(|prefix, tx| {
                if tx.receiver_count() == 0 {
                    return false;
                }
                tx.send_replace(state.kv_prefix_index(prefix).max(Index(1)));
                true
            });
        }
        let keys = self.publisher.keys();
        self.publisher.publish(&state, &keys);
    }

    /// The index of `key`, as a channel that changes with it; `None` once waiters are
    /// released.
    pub(crate) fn index_receiver(&self, key: &IndexKey) -> Option<watch::Receiver<Index>> {
        if let IndexKey::KvPrefix(prefix) = key {
            let mut guard = self.kv_prefixes.lock();
            let prefixes = guard.as_mut()?;
            if prefixes.channels.len() >= prefixes.sweep_at {
                prefixes.channels.retain(|_, tx| tx.receiver_count() > 0);
                prefixes.sweep_at = (prefixes.channels.len() * 2).max(64);
            }
            if let Some(tx) = prefixes.channels.get(prefix.as_str()) {
                return Some(tx.subscribe());
            }
            let tx = watch::Sender::new(self.read().index_of(key));
            let rx = tx.subscribe();
            prefixes.channels.insert(prefix.clone(), tx);
            return Some(rx);
        }
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
        self.kv_prefixes.lock().take();
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
