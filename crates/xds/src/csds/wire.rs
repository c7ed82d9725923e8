//! The CSDS answer (`envoy.service.status.v3.ClientStatusResponse`) written in protobuf's wire
//! format straight from the streams' status, field by field in field-number order and with
//! proto3's defaults left out, so that the bytes are the ones prost writes for the same
//! message (the tests hold them equal).
//!
//! Each message's length comes before it on the wire: it is counted first by running the
//! same writer over a [`Count`], which copies nothing.

use crate::status::{ResourceRef, ResourceState};
use envoy_types::pb::envoy::admin::v3::ClientResourceStatus;
use envoy_types::pb::envoy::service::status::v3::ConfigStatus;
use envoy_types::pb::google::protobuf::Any;
use prost::encoding::{encode_varint, encoded_len_varint};
use std::time::SystemTime;

/// gRPC's length-prefixed message header: a compression flag and a big-endian length.
const HEADER_BYTES: usize = 5;

/// Protobuf's wire type of a length-delimited field.
const LEN: u64 = 2;
/// Protobuf's wire type of a varint field.
const VARINT: u64 = 0;

/// Where a message is written: bytes, or only their count.
trait Out {
    fn bytes(&mut self, b: &[u8]);
    fn varint(&mut self, v: u64);
}

/// Counts what would be written.
struct Count(usize);

impl Out for Count {
    fn bytes(&mut self, b: &[u8]) {
        self.0 += b.len();
    }
    fn varint(&mut self, v: u64) {
        self.0 += encoded_len_varint(v);
    }
}

impl Out for Vec<u8> {
    fn bytes(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
    fn varint(&mut self, v: u64) {
        encode_varint(v, self);
    }
}

/// A message that writes its own fields.
trait Message {
    fn write<O: Out>(&self, o: &mut O);

    fn len(&self) -> usize {
        let mut c = Count(0);
        self.write(&mut c);
        c.0
    }
}

fn key<O: Out>(o: &mut O, tag: u64, wire_type: u64) {
    o.varint(tag << 3 | wire_type);
}

/// A string or bytes field; empty ones are left out, as proto3 does.
fn bytes<O: Out>(o: &mut O, tag: u64, value: &[u8]) {
    if !value.is_empty() {
        key(o, tag, LEN);
        o.varint(value.len() as u64);
        o.bytes(value);
    }
}

/// A non-negative integer or enum field; zero is left out.
fn number<O: Out>(o: &mut O, tag: u64, value: u64) {
    if value != 0 {
        key(o, tag, VARINT);
        o.varint(value);
    }
}

/// A message field (present, even if empty).
fn message<O: Out, M: Message>(o: &mut O, tag: u64, m: &M) {
    key(o, tag, LEN);
    o.varint(m.len() as u64);
    m.write(o);
}

/// `envoy.config.core.v3.Node` with only its id.
struct Node<'a>(&'a str);

impl Message for Node<'_> {
    fn write<O: Out>(&self, o: &mut O) {
        bytes(o, 1, self.0.as_bytes());
    }
}

/// `google.protobuf.Timestamp`: seconds and nanoseconds since 1970.
#[derive(Clone, Copy)]
struct Timestamp(u64, u32);

impl From<SystemTime> for Timestamp {
    fn from(at: SystemTime) -> Self {
        // Times before 1970 do not occur here; they would read as 1970.
        let since = at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        Self(since.as_secs(), since.subsec_nanos())
    }
}

impl Message for Timestamp {
    fn write<O: Out>(&self, o: &mut O) {
        number(o, 1, self.0);
        number(o, 2, u64::from(self.1));
    }
}

/// `google.protobuf.Any`.
struct AnyRef<'a>(&'a Any);

impl Message for AnyRef<'_> {
    fn write<O: Out>(&self, o: &mut O) {
        bytes(o, 1, self.0.type_url.as_bytes());
        bytes(o, 2, &self.0.value);
    }
}

/// `envoy.admin.v3.UpdateFailureState`: the proxy's detail of its rejection.
struct Failure<'a> {
    details: &'a str,
    version: &'a str,
    at: Option<Timestamp>,
}

impl Message for Failure<'_> {
    fn write<O: Out>(&self, o: &mut O) {
        if let Some(at) = &self.at {
            message(o, 2, at);
        }
        bytes(o, 3, self.details.as_bytes());
        bytes(o, 4, self.version.as_bytes());
    }
}

/// The CSDS statuses of a resource's state: the server's view, and the proxy's.
fn statuses(state: ResourceState) -> (ConfigStatus, ClientResourceStatus) {
    match state {
        ResourceState::Synced => (ConfigStatus::Synced, ClientResourceStatus::Acked),
        ResourceState::NotSent => (ConfigStatus::NotSent, ClientResourceStatus::Unknown),
        ResourceState::Stale => (ConfigStatus::Stale, ClientResourceStatus::Requested),
        ResourceState::Error => (ConfigStatus::Error, ClientResourceStatus::Nacked),
    }
}

/// `envoy.service.status.v3.ClientConfig.GenericXdsConfig`: one resource of one proxy.
impl Message for ResourceRef<'_> {
    fn write<O: Out>(&self, o: &mut O) {
        let (config_status, client_status) = statuses(self.state);
        let updated = self.updated.map(Timestamp::from);
        bytes(o, 1, self.type_url.as_bytes());
        bytes(o, 2, self.name.as_bytes());
        bytes(o, 3, self.version.as_bytes());
        if let Some(value) = self.value {
            message(o, 4, &AnyRef(value));
        }
        if let Some(at) = &updated {
            message(o, 5, at);
        }
        number(o, 6, config_status as u64);
        number(o, 7, client_status as u64);
        if let Some(details) = self.error {
            let failure = Failure {
                details,
                version: self.version,
                at: updated,
            };
            message(o, 8, &failure);
        }
    }
}

/// A `ClientStatusResponse` as a gRPC message, written a client (`ClientConfig`, field 1) at
/// a time.
pub(super) struct Answer {
    buf: Vec<u8>,
    /// The encoded length of each row of the client being written.
    lens: Vec<usize>,
}

impl Answer {
    /// An answer expected to take about `capacity` bytes.
    pub(super) fn with_capacity(capacity: usize) -> Self {
        let mut buf = Vec::with_capacity(capacity.max(HEADER_BYTES));
        buf.resize(HEADER_BYTES, 0);
        Self { buf, lens: Vec::new() }
    }

    /// Adds `node`'s `ClientConfig`: its node (field 1, the id alone) and each of its
    /// resources (field 3, `GenericXdsConfig`).
    pub(super) fn client(&mut self, node: &str, rows: &[ResourceRef<'_>]) {
        self.lens.clear();
        self.lens.extend(rows.iter().map(Message::len));
        let node = Node(node);
        let node_len = node.len();
        let len = 1
            + encoded_len_varint(node_len as u64)
            + node_len
            + self
                .lens
                .iter()
                .map(|&l| 1 + encoded_len_varint(l as u64) + l)
                .sum::<usize>();
        let o = &mut self.buf;
        o.reserve(1 + encoded_len_varint(len as u64) + len);
        key(o, 1, LEN);
        o.varint(len as u64);
        key(o, 1, LEN);
        o.varint(node_len as u64);
        node.write(o);
        for (row, &len) in rows.iter().zip(&self.lens) {
            key(o, 3, LEN);
            o.varint(len as u64);
            row.write(o);
        }
    }

    /// The message with its gRPC header: uncompressed, and its length.
    pub(super) fn finish(mut self) -> bytes::Bytes {
        let len = (self.buf.len() - HEADER_BYTES) as u32;
        self.buf[1..HEADER_BYTES].copy_from_slice(&len.to_be_bytes());
        bytes::Bytes::from(self.buf)
    }
}

#[cfg(test)]
mod tests;
