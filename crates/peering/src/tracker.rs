//! How each peering's stream is doing on this server: what `GET /v1/peering/:name` shows as
//! `ACTIVE` or `FAILING` and in `StreamStatus`.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;
use structs::Timestamp;
use structs::peering::{Peering, PeeringState};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// One peering's stream, as this server sees it.
#[derive(Debug, Clone, Default)]
pub struct StreamState {
    /// A stream is up.
    pub connected: bool,
    /// Why the last stream ended or the last attempt failed (empty: it did not fail).
    pub error: String,
    /// When the peer last sent a heartbeat.
    pub last_heartbeat: Option<SystemTime>,
    /// When anything was last received.
    pub last_receive: Option<SystemTime>,
    /// When anything was last sent.
    pub last_send: Option<SystemTime>,
}

/// Every peering's stream on this server, by peering name.
#[derive(Debug, Default)]
pub struct Tracker {
    streams: Mutex<HashMap<String, Slot>>,
    changed: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct Slot {
    state: StreamState,
    /// The stream up now: its generation and token.
    current: Option<(u64, CancellationToken)>,
    generations: u64,
}

/// One stream's place in the tracker: what ends it, and which it is.
#[derive(Debug, Clone)]
pub struct StreamHandle {
    /// Cancelled when the stream must end (replaced, peering gone, server stopping).
    pub token: CancellationToken,
    generation: u64,
}

impl Tracker {
    /// A new, empty tracker.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A stream for `name` starts; the one it replaces (a peer reconnecting before this
    /// server noticed the old connection die) is cancelled. Returns the new stream's token.
    pub fn connected(&self, name: &str, stop: &CancellationToken) -> StreamHandle {
        let token = stop.child_token();
        let mut streams = self.streams.lock();
        let slot = streams.entry(name.to_owned()).or_default();
        slot.generations += 1;
        let generation = slot.generations;
        if let Some((_, old)) = slot.current.replace((generation, token.clone())) {
            old.cancel();
        }
        slot.state.connected = true;
        slot.state.error.clear();
        drop(streams);
        self.bump();
        StreamHandle { token, generation }
    }

    /// The stream of `name` holding `token` ended (with why, unless it ended cleanly).
    pub fn disconnected(&self, name: &str, handle: &StreamHandle, error: Option<String>) {
        let mut streams = self.streams.lock();
        if let Some(slot) = streams.get_mut(name)
            && slot.current.as_ref().is_some_and(|(g, _)| *g == handle.generation)
        {
            slot.current = None;
            slot.state.connected = false;
            slot.state.error = error.unwrap_or_default();
        }
        drop(streams);
        self.bump();
    }

    /// An attempt to reach the peer failed.
    pub fn failed(&self, name: &str, error: String) {
        let mut streams = self.streams.lock();
        let slot = streams.entry(name.to_owned()).or_default();
        if slot.current.is_none() {
            slot.state.connected = false;
            slot.state.error = error;
        }
        drop(streams);
        self.bump();
    }

    /// Updates what is known of `name`'s stream.
    pub fn update(&self, name: &str, f: impl FnOnce(&mut StreamState)) {
        if let Some(slot) = self.streams.lock().get_mut(name) {
            f(&mut slot.state);
        }
    }

    /// Forgets `name` (the peering is gone), ending its stream if one is up.
    pub fn forget(&self, name: &str) {
        if let Some(Slot {
            current: Some((_, token)),
            ..
        }) = self.streams.lock().remove(name)
        {
            token.cancel();
        }
        self.bump();
    }

    /// What is known of `name`'s stream.
    pub fn get(&self, name: &str) -> Option<StreamState> {
        self.streams.lock().get(name).map(|s| s.state.clone())
    }

    /// Whether a stream of `name` is up on this server.
    pub fn is_connected(&self, name: &str) -> bool {
        self.get(name).is_some_and(|s| s.connected)
    }

    /// Follows changes (streams up or down).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// Shows the live state on `peering`: `ACTIVE` while a stream is up, `FAILING` after it
    /// failed, and the stream's times.
    pub fn overlay(&self, peering: &mut Peering) {
        let Some(stream) = self.get(&peering.name) else {
            return;
        };
        if peering.state.is_live() {
            if stream.connected {
                peering.state = PeeringState::Active;
            } else if !stream.error.is_empty() {
                peering.state = PeeringState::Failing;
                peering.last_error = stream.error.clone();
            }
        }
        let status = &mut peering.stream_status;
        status.last_heartbeat = stream.last_heartbeat.map(Timestamp);
        status.last_receive = stream.last_receive.map(Timestamp);
        status.last_send = stream.last_send.map(Timestamp);
    }
}
