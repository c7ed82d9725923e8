//! Server mode's inputs: catalog topics, followed through the store's event publisher. A
//! subscription that falls behind is renewed (its fresh snapshot is just another change).

use crate::derive::{Changed, Input};
use crate::mode::Mode;
use catalog::{Payload, Store, Subscription, SubscriptionError, Topic};
use std::sync::Arc;
use structs::{ConfigEntry, ConfigEntryKind, IndexedCaRoots};

/// Server mode: the catalog store every server data source reads.
pub(crate) struct Catalog {
    pub(crate) store: Store,
}

/// One catalog topic as an input: its latest value, read out of the topic's payload.
pub(crate) struct TopicInput<V> {
    store: Store,
    topic: Topic,
    sub: Subscription,
    /// The value in a payload of this topic (`None`: a payload of another shape, skipped).
    read: fn(&Payload) -> Option<V>,
    /// The latest value and the index it was written at.
    latest: Option<(u64, V)>,
}

impl<V> TopicInput<V> {
    /// Follows `topic` of `store`, reading each payload with `read`.
    pub(crate) fn new(store: &Store, topic: Topic, read: fn(&Payload) -> Option<V>) -> Self {
        Self {
            sub: store.subscribe(topic.clone()),
            store: store.clone(),
            topic,
            read,
            latest: None,
        }
    }
}

impl<V: Clone + Send + Sync> Input for TopicInput<V> {
    type Value = V;

    async fn changed(&mut self) -> Changed {
        loop {
            match self.sub.next().await {
                Ok(event) => {
                    if let Some(value) = (self.read)(&event.payload) {
                        self.latest = Some((event.index.0, value));
                        return Some(Ok(()));
                    }
                }
                Err(SubscriptionError::Lagged(missed)) => {
                    tracing::debug!(topic = ?self.topic, missed, "subscription fell behind; renewing");
                    self.sub = self.store.subscribe(self.topic.clone());
                }
                // The store closed: the watch ends.
                Err(SubscriptionError::Closed) => return None,
            }
        }
    }

    fn latest(&self) -> Option<V> {
        self.latest.as_ref().map(|(_, v)| v.clone())
    }

    fn versions(&self, into: &mut Vec<u64>) {
        into.push(self.latest.as_ref().map_or(0, |(i, _)| *i));
    }
}

impl Mode for Catalog {
    type Roots = TopicInput<Arc<IndexedCaRoots>>;
    type Entry = TopicInput<Option<Arc<ConfigEntry>>>;
    type Entries = TopicInput<Arc<Vec<Arc<ConfigEntry>>>>;

    fn datacenter(&self) -> &str {
        self.store.datacenter()
    }

    fn roots(&self) -> Self::Roots {
        TopicInput::new(&self.store, Topic::CaRoots, |p| match p {
            Payload::CaRoots(roots) => Some(Arc::clone(roots)),
            _ => None,
        })
    }

    fn config_entry(&self, kind: ConfigEntryKind, name: &str) -> Self::Entry {
        TopicInput::new(&self.store, Topic::ConfigEntry(kind, name.to_owned()), |p| match p {
            Payload::ConfigEntry(entry) => Some(entry.clone()),
            _ => None,
        })
    }

    fn config_entries(&self, kind: ConfigEntryKind) -> Self::Entries {
        TopicInput::new(&self.store, Topic::ConfigEntries(kind), |p| match p {
            Payload::ConfigEntries(entries) => Some(Arc::clone(entries)),
            _ => None,
        })
    }
}
