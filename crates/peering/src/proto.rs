//! The peering stream's messages (protobuf, written here rather than generated: the
//! service is meshd's own, between meshd servers).
//!
//! `ExchangeSecret` (unary) trades a token's establishment secret for a stream secret;
//! `StreamResources` (both ways) opens with the stream secret, then each side sends what it
//! exports to the other (`Update`), acknowledges what it receives (`Ack`), and sends a
//! `Heartbeat` now and then; `Terminated` says the peering was deleted.

/// The gRPC service's full name.
pub const SERVICE: &str = "meshd.peering.PeerStream";
/// `ExchangeSecret`'s path.
pub const EXCHANGE_PATH: &str = "/meshd.peering.PeerStream/ExchangeSecret";
/// `StreamResources`' path.
pub const STREAM_PATH: &str = "/meshd.peering.PeerStream/StreamResources";

/// A token's secret, offered for a stream secret.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExchangeSecretRequest {
    /// The acceptor's id of the peering (the token's `PeerID`).
    #[prost(string, tag = "1")]
    pub peer_id: String,
    /// The token's establishment secret.
    #[prost(string, tag = "2")]
    pub establishment_secret: String,
}

/// The stream secret an exchange gives.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExchangeSecretResponse {
    /// The secret to open streams with.
    #[prost(string, tag = "1")]
    pub stream_secret: String,
}

/// One message of the stream, either way.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ReplicationMessage {
    /// What it is.
    #[prost(oneof = "Payload", tags = "1, 2, 3, 4, 5, 6")]
    pub payload: Option<Payload>,
}

/// What a [`ReplicationMessage`] carries.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Payload {
    /// The dialer's first message.
    #[prost(message, tag = "1")]
    Open(Open),
    /// The acceptor's answer to `Open`.
    #[prost(message, tag = "2")]
    Opened(Opened),
    /// What the sender exports to the receiver, changed since the last update.
    #[prost(message, tag = "3")]
    Update(Update),
    /// An update was applied (or not: `error`).
    #[prost(message, tag = "4")]
    Ack(Ack),
    /// The sender is alive.
    #[prost(message, tag = "5")]
    Heartbeat(Heartbeat),
    /// The sender deleted the peering.
    #[prost(message, tag = "6")]
    Terminated(Terminated),
}

/// The dialer opens the stream.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Open {
    /// The acceptor's id of the peering.
    #[prost(string, tag = "1")]
    pub peer_id: String,
    /// The stream secret.
    #[prost(string, tag = "2")]
    pub stream_secret: String,
    /// The dialer's datacenter.
    #[prost(string, tag = "3")]
    pub datacenter: String,
    /// What the dialer already holds of the acceptor's exports: the acceptor sends only what
    /// differs (a reconnect after a blip resends nothing unchanged).
    #[prost(message, repeated, tag = "4")]
    pub known: Vec<Known>,
}

/// The acceptor takes the stream.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Opened {
    /// The acceptor's datacenter.
    #[prost(string, tag = "1")]
    pub datacenter: String,
    /// What the acceptor already holds of the dialer's exports.
    #[prost(message, repeated, tag = "2")]
    pub known: Vec<Known>,
}

/// One imported service as its importer holds it.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct Known {
    /// The service.
    #[prost(string, tag = "1")]
    pub service: String,
    /// The digest of what was received for it.
    #[prost(string, tag = "2")]
    pub digest: String,
}

/// What the sender exports to the receiver.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Update {
    /// Counts the sender's updates on this stream; the receiver's `Ack` names it.
    #[prost(uint64, tag = "1")]
    pub nonce: u64,
    /// The sender's trust domain (with `root_pems`: its trust bundle; empty: unchanged).
    #[prost(string, tag = "2")]
    pub trust_domain: String,
    /// The sender's CA roots.
    #[prost(string, repeated, tag = "3")]
    pub root_pems: Vec<String>,
    /// Services exported to the receiver that changed: `structs::peering::ImportedService`
    /// values, as a JSON array.
    #[prost(bytes = "vec", tag = "4")]
    pub services_json: Vec<u8>,
    /// Services no longer exported to the receiver.
    #[prost(string, repeated, tag = "5")]
    pub removed: Vec<String>,
    /// The sender's servers' addresses (the dialer dials them from now on; empty:
    /// unchanged).
    #[prost(string, repeated, tag = "6")]
    pub server_addresses: Vec<String>,
    /// The sender's healthy mesh gateways, where the receiver's proxies connect to reach
    /// every service exported to it: `structs::CheckServiceNode` values, as a JSON array
    /// (absent: unchanged).
    #[prost(bytes = "vec", optional, tag = "7")]
    pub gateways_json: Option<Vec<u8>>,
}

/// An update was applied.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Ack {
    /// The update's nonce.
    #[prost(uint64, tag = "1")]
    pub nonce: u64,
    /// Why it could not be applied (empty: it was).
    #[prost(string, tag = "2")]
    pub error: String,
}

/// The sender is alive.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Heartbeat {}

/// The sender deleted the peering.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Terminated {}

impl ReplicationMessage {
    /// A message carrying `payload`.
    pub fn of(payload: Payload) -> Self {
        Self { payload: Some(payload) }
    }
}
