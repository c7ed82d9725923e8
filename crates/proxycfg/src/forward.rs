//! The one loop every watch runs: take the next update from a source, hand it to a sink,
//! until the watch is cancelled, the source ends or the sink stops listening. Data sources
//! (catalog followers, shared fan-out values, fakes) differ only in where updates come from
//! and where they go; this module owns the loop between them.

use crate::{CorrelationId, DataSourceError, EventSender, UpdatePayload};
use std::future::Future;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// One step of a source: `None` once it has ended; `Some(None)` when a change produced
/// nothing to deliver yet; `Some(Some(result))` to deliver.
pub type Step<T> = Option<Option<Result<T, DataSourceError>>>;

/// Where updates come from.
pub trait Updates<T>: Send {
    /// Waits for the next step.
    fn next(&mut self) -> impl Future<Output = Step<T>> + Send;
}

/// Where updates go.
pub trait Deliver<T>: Send {
    /// Delivers one result; `false` once nobody listens any more.
    fn deliver(&mut self, result: Result<T, DataSourceError>) -> impl Future<Output = bool> + Send;
}

/// Moves updates from `updates` to `sink` until `cancel` fires, the source ends or the sink
/// stops listening. Cancellation is checked before every wait for the next update. Takes
/// everything by value, so a caller can return this future as its watch future without an
/// async wrapper of its own (which would hold a second copy of the same arguments).
pub async fn forward<T>(cancel: CancellationToken, mut updates: impl Updates<T>, mut sink: impl Deliver<T>) {
    loop {
        // The cancellation future lives only while waiting for an update: while a delivery
        // waits (a busy State) this future's state holds the delivery alone. A watch future
        // lives as long as its watch, so its size is memory per proxy.
        let step = tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            step = updates.next() => step,
        };
        match step {
            None => return,
            Some(None) => {}
            Some(Some(result)) => {
                if !sink.deliver(result).await {
                    return;
                }
            }
        }
    }
}

/// A shared latest value, as published by one follower for many watches: every change (mark
/// the receiver changed first to start with the current value). `None` in the channel means
/// "no value yet".
impl<T: Clone + Send + Sync> Updates<T> for watch::Receiver<Option<Result<T, DataSourceError>>> {
    async fn next(&mut self) -> Step<T> {
        self.changed().await.ok()?;
        Some(self.borrow_and_update().clone())
    }
}

/// Publishes on a shared channel that many watches read (it never blocks).
impl<T: Send + Sync> Deliver<T> for watch::Sender<Option<Result<T, DataSourceError>>> {
    async fn deliver(&mut self, result: Result<T, DataSourceError>) -> bool {
        self.send_replace(Some(result));
        true
    }
}

/// A proxy's State: each result goes out under the watch's correlation id.
pub struct ToState<T> {
    /// The watch's correlation id.
    pub id: CorrelationId,
    /// The State's event channel.
    pub tx: EventSender<T>,
}

impl<T: Into<UpdatePayload> + Send> Deliver<T> for ToState<T> {
    fn deliver(&mut self, result: Result<T, DataSourceError>) -> impl Future<Output = bool> + Send {
        // The send future itself, not an async block around it: this future is part of every
        // watch's state, and its size is memory per proxy.
        futures_util::FutureExt::map(self.tx.send(self.id.clone(), result), |sent| sent.is_ok())
    }
}

/// The watch of a request its data source cannot serve: the error goes to the State (which
/// logs it, counts it and shows it in the proxy's status), then the watch idles until it is
/// cancelled, so the error stays reported rather than the watch silently ending.
pub async fn refuse<T: Into<UpdatePayload> + Send>(
    id: CorrelationId,
    tx: EventSender<T>,
    error: DataSourceError,
    cancel: CancellationToken,
) -> Result<(), DataSourceError> {
    if tx.send(id, Err(error)).await.is_ok() {
        cancel.cancelled().await;
    }
    Ok(())
}
