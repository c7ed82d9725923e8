//! The event publisher: per-topic streams of snapshot-then-updates.
//!
//! A subscriber first receives the topic's current value, then a new value after every
//! committed write that changes it. Buffers are bounded: a subscriber that falls behind is
//! not waited for; its next read reports [`SubscriptionError::Lagged`] and it resubscribes
//! for a fresh snapshot. Values are computed once per write and topic and shared by every
//! subscriber, and only for topics somebody subscribes to.

use crate::keys::{IndexKey, Topic};
use crate::state::State;
use bounded_maps::SweepSchedule;
use parking_lot::Mutex;
use std::{collections::HashMap, collections::HashSet, sync::Arc};
use structs::{CheckServiceNode, ConfigEntry, GatewayService, Index, IndexedCaRoots, Intention};
use tokio::sync::broadcast;

/// The value of a topic.
#[derive(Debug, Clone)]
pub enum Payload {
    /// Service instances with nodes and checks.
    Health(Arc<Vec<CheckServiceNode>>),
    /// A config entry, or `None` if it does not exist.
    ConfigEntry(Option<Arc<ConfigEntry>>),
    /// Every config entry of a kind, by name.
    ConfigEntries(Arc<Vec<Arc<ConfigEntry>>>),
    /// The trust bundle.
    CaRoots(Arc<IndexedCaRoots>),
    /// Intentions in evaluation order.
    Intentions(Arc<Vec<Intention>>),
    /// Service names.
    ServiceList(Arc<Vec<String>>),
    /// The services a gateway fronts.
    GatewayServices(Arc<Vec<GatewayService>>),
    /// A service a peer exports here, with the peer's trust bundle.
    PeeredService(Arc<structs::peering::PeeredUpstream>),
    /// The trust bundles of the live peerings a service is exported to.
    PeerTrustBundles(Arc<Vec<structs::peering::PeerTrustBundle>>),
    /// Where the peering calls go.
    PeeringServers(Arc<structs::peering::PeeringServers>),
}

/// One value of a topic at an index.
#[derive(Debug, Clone)]
pub struct Event {
    /// The index of the write that produced this value (the topic key's index).
    pub index: Index,
    /// The value.
    pub payload: Payload,
}

/// Why a subscription yields nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubscriptionError {
    /// The subscriber fell behind by this many events; subscribe again for a fresh snapshot.
    #[error("subscriber fell behind by {0} events; resubscribe")]
    Lagged(u64),
    /// The store has closed.
    #[error("the store has closed")]
    Closed,
}

/// A topic's stream: the snapshot first, then updates.
#[derive(Debug)]
pub struct Subscription {
    topic: Topic,
    snapshot: Option<Event>,
    rx: broadcast::Receiver<Event>,
}

impl Subscription {
    /// The next value: the snapshot on the first call, then each update.
    pub async fn next(&mut self) -> Result<Event, SubscriptionError> {
        if let Some(snapshot) = self.snapshot.take() {
            return Ok(snapshot);
        }
        match self.rx.recv().await {
            Ok(event) => Ok(event),
            Err(broadcast::error::RecvError::Lagged(n)) => Err(SubscriptionError::Lagged(n)),
            Err(broadcast::error::RecvError::Closed) => Err(SubscriptionError::Closed),
        }
    }

    /// The topic.
    pub fn topic(&self) -> &Topic {
        &self.topic
    }
}

/// Computes a topic's value from a state.
pub fn payload(topic: &Topic, state: &State) -> Payload {
    match topic {
        Topic::ServiceHealth(name) => Payload::Health(Arc::new(state.health(name, false))),
        Topic::ServiceHealthConnect(name) => Payload::Health(Arc::new(state.health(name, true))),
        Topic::ConfigEntry(kind, name) => Payload::ConfigEntry(state.config_entry(*kind, name)),
        Topic::ConfigEntries(kind) => Payload::ConfigEntries(Arc::new(state.config_entries(*kind))),
        Topic::CaRoots => Payload::CaRoots(Arc::new(state.ca_roots())),
        Topic::Intentions(dest) => Payload::Intentions(Arc::new(state.intentions_for_destination(dest))),
        Topic::ServiceList => Payload::ServiceList(Arc::new(state.service_names())),
        Topic::TypicalServices => Payload::ServiceList(Arc::new(state.typical_service_names())),
        Topic::GatewayServices(name) => Payload::GatewayServices(Arc::new(state.gateway_services(name))),
        Topic::PeeredService(peer, service) => Payload::PeeredService(Arc::new(state.peered_upstream(peer, service))),
        Topic::PeerTrustBundles(service) => Payload::PeerTrustBundles(Arc::new(state.peer_trust_bundles_for(service))),
        Topic::PeeringServers => Payload::PeeringServers(Arc::new(state.peering_servers_view())),
    }
}

/// One subscribed topic: its channel and the last value computed for it, handed to new
/// subscribers while it is current, so that the many proxies watching the same topic share
/// one payload (one `Arc`) instead of each computing its own copy.
struct Slot {
    tx: broadcast::Sender<Event>,
    last: Option<Event>,
}

/// Subscribed topics grouped by the index key whose writes change them, so a write visits
/// only the topics it touches (not every topic of every proxy).
#[derive(Default)]
struct Topics {
    by_key: HashMap<IndexKey, HashMap<Topic, Slot>>,
    /// Topics held, and when topics without subscribers are next swept.
    len: usize,
    sweep: SweepSchedule,
}

pub(crate) struct Publisher {
    topics: Mutex<Topics>,
    buffer: usize,
}

impl Publisher {
    pub(crate) fn new(buffer: usize) -> Self {
        Self {
            topics: Mutex::new(Topics::default()),
            buffer: buffer.max(1),
        }
    }

    /// Subscribes to `topic`; `current` is read under the publisher's lock so the snapshot
    /// and the first update cannot miss or repeat a write.
    pub(crate) fn subscribe(&self, topic: Topic, current: impl FnOnce() -> Arc<State>) -> Subscription {
        let mut topics = self.topics.lock();
        let state = current();
        if topics.sweep.due(topics.len) {
            // Topics whose subscribers left and that no write has touched since.
            topics.by_key.retain(|_, group| {
                group.retain(|_, slot| slot.tx.receiver_count() > 0);
                !group.is_empty()
            });
            topics.len = topics.by_key.values().map(HashMap::len).sum();
            let len = topics.len;
            topics.sweep.swept(len);
        }
        let key = topic.index_key();
        let index = state.index_of(&key);
        let group = topics.by_key.entry(key).or_default();
        let mut added = false;
        let slot = group.entry(topic.clone()).or_insert_with(|| {
            added = true;
            Slot {
                tx: broadcast::channel(self.buffer).0,
                last: None,
            }
        });
        let rx = slot.tx.subscribe();
        let snapshot = match &slot.last {
            Some(last) if last.index == index => last.clone(),
            _ => {
                let event = Event {
                    index,
                    payload: payload(&topic, &state),
                };
                slot.last = Some(event.clone());
                event
            }
        };
        if added {
            topics.len += 1;
        }
        Subscription {
            topic,
            snapshot: Some(snapshot),
            rx,
        }
    }

    /// Sends the new value of every subscribed topic `bumped` touches; forgets those topics
    /// if nobody listens to them any more.
    pub(crate) fn publish(&self, state: &State, bumped: &HashSet<IndexKey>) {
        let mut topics = self.topics.lock();
        let mut removed = 0;
        // Every destination's intentions topic filters the same flattened, ordered list:
        // made once per write, not once per destination.
        let mut all_intentions: Option<Vec<structs::Intention>> = None;
        for key in bumped {
            let Some(group) = topics.by_key.get_mut(key) else {
                continue;
            };
            let index = state.index_of(key);
            group.retain(|topic, slot| {
                if slot.tx.receiver_count() == 0 {
                    removed += 1;
                    return false;
                }
                let payload = match topic {
                    Topic::Intentions(dest) => {
                        let all = all_intentions.get_or_insert_with(|| state.intentions());
                        let mine = all.iter().filter(|i| i.matches_destination(dest)).cloned().collect();
                        Payload::Intentions(Arc::new(mine))
                    }
                    topic => payload(topic, state),
                };
                let event = Event { index, payload };
                slot.last = Some(event.clone());
                let _ = slot.tx.send(event);
                true
            });
            if group.is_empty() {
                topics.by_key.remove(key);
            }
        }
        topics.len -= removed;
    }

    /// The index keys of every subscribed topic.
    pub(crate) fn keys(&self) -> HashSet<IndexKey> {
        self.topics.lock().by_key.keys().cloned().collect()
    }

    /// Topics with at least one subscriber.
    pub(crate) fn topic_count(&self) -> usize {
        let topics = self.topics.lock();
        topics
            .by_key
            .values()
            .flat_map(HashMap::values)
            .filter(|slot| slot.tx.receiver_count() > 0)
            .count()
    }
}
