//! The one way a watched value is made, in either mode: wait until every input has a value,
//! derive the result from them on each change, and (where asked) drop a result equal to the
//! last one sent. An input is a catalog topic (server mode, `server_mode`) or an agent-cache
//! entry (agent mode, `cache_mode`); a derivation written over [`Input`] runs in both.

use proxycfg::forward::{self, Step, ToState, Updates};
use proxycfg::{CorrelationId, DataSourceError, EventSender, UpdatePayload, WatchFuture};
use std::future::Future;
use tokio_util::sync::CancellationToken;

/// What waiting for an input's change gives: `None` once the input has ended (the store
/// closed, the cache shut down); the error when it failed.
pub(crate) type Changed = Option<Result<(), DataSourceError>>;

/// One input of a derived value, or several as a tuple (a change of any is a change).
pub(crate) trait Input: Send {
    /// What it holds.
    type Value: Send;

    /// Waits for its next change. Dropping the future loses nothing (it is raced against
    /// the other inputs and against cancellation).
    fn changed(&mut self) -> impl Future<Output = Changed> + Send;

    /// Its latest value; `None` until every part has one.
    fn latest(&self) -> Option<Self::Value>;

    /// Appends the version (the index it was read at) of each part's latest value: with the
    /// request, they identify a derived value.
    fn versions(&self, into: &mut Vec<u64>);
}

macro_rules! tuple_input {
    ($($part:ident $i:tt),+) => {
        impl<$($part: Input),+> Input for ($($part,)+) {
            type Value = ($($part::Value,)+);

            async fn changed(&mut self) -> Changed {
                tokio::select! { $(changed = self.$i.changed() => changed,)+ }
            }

            fn latest(&self) -> Option<Self::Value> {
                Some(($(self.$i.latest()?,)+))
            }

            fn versions(&self, into: &mut Vec<u64>) {
                $(self.$i.versions(into);)+
            }
        }
    };
}

tuple_input!(A 0, B 1);
tuple_input!(A 0, B 1, C 2);

/// A value that never changes (what a mode knows without asking: a server's datacenter, the
/// HTTP checks no agent runs). Agent mode asks for everything.
#[cfg_attr(not(feature = "server"), allow(dead_code))]
pub(crate) struct Constant<V> {
    value: V,
    given: bool,
}

#[cfg_attr(not(feature = "server"), allow(dead_code))]
impl<V> Constant<V> {
    pub(crate) fn new(value: V) -> Self {
        Self { value, given: false }
    }
}

impl<V: Clone + Send + Sync> Input for Constant<V> {
    type Value = V;

    async fn changed(&mut self) -> Changed {
        if std::mem::replace(&mut self.given, true) {
            // Nothing will change: the watch idles until cancelled.
            std::future::pending().await
        } else {
            Some(Ok(()))
        }
    }

    fn latest(&self) -> Option<V> {
        Some(self.value.clone())
    }

    fn versions(&self, into: &mut Vec<u64>) {
        into.push(0);
    }
}

/// An input whose value carries the versions it was read at (for values cached by them,
/// `views`).
pub(crate) struct Versioned<I>(pub(crate) I);

impl<I: Input> Input for Versioned<I> {
    type Value = (I::Value, Vec<u64>);

    fn changed(&mut self) -> impl Future<Output = Changed> + Send {
        self.0.changed()
    }

    fn latest(&self) -> Option<Self::Value> {
        let value = self.0.latest()?;
        let mut versions = Vec::new();
        self.0.versions(&mut versions);
        Some((value, versions))
    }

    fn versions(&self, into: &mut Vec<u64>) {
        self.0.versions(into);
    }
}

/// Inputs, and the result each of their changes derives: what a watch (or a shared follower)
/// sends. An input's error is sent as it is.
pub(crate) struct Derive<I, F, T> {
    inputs: I,
    derive: F,
    /// Compares a result with the last one sent, when repeats are dropped.
    same: Option<fn(&T, &T) -> bool>,
    /// The result sent last (kept only when repeats are dropped).
    last: Option<T>,
}

impl<I, F, T> Derive<I, F, T>
where
    I: Input,
    F: FnMut(I::Value) -> Result<T, DataSourceError> + Send,
{
    /// Every result `derive` makes of `inputs`.
    pub(crate) fn every(inputs: I, derive: F) -> Self {
        Self {
            inputs,
            derive,
            same: None,
            last: None,
        }
    }

    /// The results `derive` makes of `inputs`, except one equal to the last sent: a change
    /// the proxy cannot see (another service's entry, an instance a filter leaves out) is
    /// not sent, so it builds nothing.
    pub(crate) fn distinct(inputs: I, derive: F) -> Self
    where
        T: PartialEq,
    {
        Self::distinct_if(inputs, derive, true)
    }

    /// [`Derive::distinct`] when `distinct`, else [`Derive::every`] (a derivation that passes
    /// its input through is not worth comparing).
    pub(crate) fn distinct_if(inputs: I, derive: F, distinct: bool) -> Self
    where
        T: PartialEq,
    {
        Self {
            inputs,
            derive,
            same: distinct.then_some(<T as PartialEq>::eq as fn(&T, &T) -> bool),
            last: None,
        }
    }
}

impl<I, F, T> Updates<T> for Derive<I, F, T>
where
    I: Input,
    F: FnMut(I::Value) -> Result<T, DataSourceError> + Send,
    T: Clone + Send,
{
    async fn next(&mut self) -> Step<T> {
        let result = match self.inputs.changed().await? {
            Err(e) => Err(e),
            Ok(()) => match self.inputs.latest() {
                Some(value) => (self.derive)(value),
                // Not every input has a value yet: nothing to derive.
                None => return Some(None),
            },
        };
        let Some(same) = self.same else {
            return Some(Some(result));
        };
        match result {
            Ok(value) if self.last.as_ref().is_some_and(|last| same(last, &value)) => Some(None),
            Ok(value) => {
                self.last = Some(value.clone());
                Some(Some(Ok(value)))
            }
            Err(e) => {
                // What comes after an error is sent even if equal to what came before it.
                self.last = None;
                Some(Some(Err(e)))
            }
        }
    }
}

/// The future of one watch run by a proxy's State (`notify`): `updates` forwarded to it
/// until cancelled, or the error that kept the watch from starting, reported once.
pub(crate) fn watch<'w, T, U>(
    updates: Result<U, DataSourceError>,
    id: CorrelationId,
    tx: EventSender<T>,
    cancel: CancellationToken,
) -> WatchFuture<'w>
where
    T: Into<UpdatePayload> + Send + 'w,
    U: Updates<T> + 'w,
{
    match updates {
        // The forwarding future itself, not an async block around it: it lives as long as
        // the watch, and its size is memory per proxy.
        Ok(updates) => Box::pin(futures_util::FutureExt::map(
            forward::forward(cancel, updates, ToState { id, tx }),
            Ok,
        )),
        Err(e) => Box::pin(forward::refuse(id, tx, e, cancel)),
    }
}

/// Implements `DataSource<$req>` for `$source` as a watch of its own: `|$this, $r| $updates`
/// (with `$this: &$source`, `$r: $req`) gives the watch's `Updates` (usually a [`Derive`]),
/// or the error that keeps it from running.
macro_rules! watched_source {
    ($source:ty, $req:ty, |$this:ident, $r:ident| $updates:expr) => {
        impl proxycfg::DataSource<$req> for $source {
            fn notify<'w>(
                self: std::sync::Arc<Self>,
                $r: $req,
                id: proxycfg::CorrelationId,
                tx: proxycfg::EventSender<<$req as proxycfg::data_sources::WatchRequest>::Response>,
                cancel: tokio_util::sync::CancellationToken,
            ) -> proxycfg::WatchFuture<'w>
            where
                Self: 'w,
            {
                let $this: &$source = &self;
                $crate::derive::watch($updates, id, tx, cancel)
            }
        }
    };
}
pub(crate) use watched_source;

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    /// An input fed by a test: each value sent is a change.
    struct Fed {
        rx: mpsc::UnboundedReceiver<Result<u32, DataSourceError>>,
        latest: Option<u32>,
    }

    impl Input for Fed {
        type Value = u32;

        async fn changed(&mut self) -> Changed {
            match self.rx.recv().await? {
                Ok(v) => {
                    self.latest = Some(v);
                    Some(Ok(()))
                }
                Err(e) => Some(Err(e)),
            }
        }

        fn latest(&self) -> Option<u32> {
            self.latest
        }

        fn versions(&self, into: &mut Vec<u64>) {
            into.push(self.latest.map_or(0, u64::from));
        }
    }

    fn fed() -> (mpsc::UnboundedSender<Result<u32, DataSourceError>>, Fed) {
        let (tx, rx) = mpsc::unbounded_channel();
        (tx, Fed { rx, latest: None })
    }

    #[tokio::test]
    async fn waits_for_every_input_then_drops_repeats_but_not_after_an_error() {
        let ((a_tx, a), (b_tx, b)) = (fed(), fed());
        let mut d = Derive::distinct((a, b), |(a, b)| Ok(a + b));
        a_tx.send(Ok(1)).unwrap();
        assert_eq!(d.next().await, Some(None), "b has no value yet");
        b_tx.send(Ok(2)).unwrap();
        assert_eq!(d.next().await, Some(Some(Ok(3))));
        b_tx.send(Ok(2)).unwrap();
        assert_eq!(d.next().await, Some(None), "3 again: dropped");
        a_tx.send(Ok(2)).unwrap();
        assert_eq!(d.next().await, Some(Some(Ok(4))));
        let down = DataSourceError::Unavailable("down".into());
        a_tx.send(Err(down.clone())).unwrap();
        assert_eq!(d.next().await, Some(Some(Err(down))));
        b_tx.send(Ok(2)).unwrap();
        assert_eq!(d.next().await, Some(Some(Ok(4))), "sent again after the error");
        drop(a_tx);
        assert_eq!(d.next().await, None, "an input ended: so does the watch");
    }

    #[tokio::test]
    async fn every_sends_repeats_and_versions_follow_the_parts() {
        let (tx, input) = fed();
        let mut d = Derive::every(Versioned(input), |(v, versions)| Ok((v, versions)));
        tx.send(Ok(5)).unwrap();
        tx.send(Ok(5)).unwrap();
        assert_eq!(d.next().await, Some(Some(Ok((5, vec![5])))));
        assert_eq!(d.next().await, Some(Some(Ok((5, vec![5])))));
        let mut c = Derive::every(Constant::new(7u32), Ok);
        assert_eq!(c.next().await, Some(Some(Ok(7))));
        let again = tokio::time::timeout(std::time::Duration::from_millis(10), c.next()).await;
        assert!(again.is_err(), "a constant changes once");
    }
}
