//! Following several catalog topics at once: the latest value of each, and a wake-up when
//! any of them changes. A subscription that falls behind is renewed (its fresh snapshot is
//! just another change).

use catalog::{Payload, Store, Subscription, SubscriptionError, Topic};
use futures_util::future::select_all;

/// The store closed: the watch should end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Closed;

pub(crate) struct Follower {
    store: Store,
    topics: Vec<Topic>,
    subs: Vec<Subscription>,
    latest: Vec<Option<(u64, Payload)>>,
}

impl Follower {
    pub(crate) fn new(store: &Store, topics: Vec<Topic>) -> Self {
        let subs = topics.iter().map(|t| store.subscribe(t.clone())).collect();
        let latest = vec![None; topics.len()];
        Self {
            store: store.clone(),
            topics,
            subs,
            latest,
        }
    }

    /// Waits for the next value of any topic; returns once every topic has a value.
    pub(crate) async fn changed(&mut self) -> Result<(), Closed> {
        loop {
            let (result, i, _) = select_all(self.subs.iter_mut().map(|s| Box::pin(s.next()))).await;
            match result {
                Ok(event) => {
                    self.latest[i] = Some((event.index.0, event.payload));
                    if self.latest.iter().all(Option::is_some) {
                        return Ok(());
                    }
                }
                Err(SubscriptionError::Lagged(missed)) => {
                    tracing::debug!(topic = ?self.topics[i], missed, "subscription fell behind; renewing");
                    self.subs[i] = self.store.subscribe(self.topics[i].clone());
                }
                Err(SubscriptionError::Closed) => return Err(Closed),
            }
        }
    }

    /// The latest value of topic `i` (after [`Follower::changed`] returned).
    pub(crate) fn get(&self, i: usize) -> Option<&Payload> {
        self.latest.get(i).and_then(Option::as_ref).map(|(_, p)| p)
    }

    /// The index each topic's latest value was produced at: identifies the inputs.
    pub(crate) fn versions(&self) -> Vec<u64> {
        self.latest.iter().map(|l| l.as_ref().map_or(0, |(i, _)| *i)).collect()
    }
}
