//! `PUT /v1/txn`: a list of operations on KV keys, nodes, services and checks, applied all
//! or none, as Consul's API shapes them.

use crate::{HealthCheck, KvEntry, Node, NodeService};
use serde::{Deserialize, Serialize};

/// The most operations one transaction may hold.
pub const MAX_OPS: usize = 128;

/// One operation.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub enum TxnOp {
    /// On a KV key.
    #[serde(rename = "KV")]
    Kv(KvOp),
    /// On a node.
    Node(NodeOp),
    /// On a service instance.
    Service(ServiceOp),
    /// On a check.
    Check(CheckOp),
}

/// A KV operation: `Verb` is one of Consul's (`set`, `cas`, `lock`, `unlock`, `get`,
/// `get-tree`, `check-index`, `check-session`, `check-not-exists`, `delete`, `delete-tree`,
/// `delete-cas`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct KvOp {
    /// What to do.
    pub verb: String,
    /// The key (or prefix, for the tree verbs).
    #[serde(default)]
    pub key: String,
    /// The value (base64 in JSON).
    #[serde(default, deserialize_with = "crate::kv::value_in")]
    pub value: Vec<u8>,
    /// Flags.
    #[serde(default)]
    pub flags: u64,
    /// The index `cas`, `check-index` and `delete-cas` compare with.
    #[serde(default)]
    pub index: u64,
    /// The session `lock`, `unlock` and `check-session` name.
    #[serde(default)]
    pub session: String,
}

/// A node operation (`set`, `cas`, `get`, `delete`, `delete-cas`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NodeOp {
    /// What to do.
    pub verb: String,
    /// The node (`ModifyIndex` for the cas verbs).
    pub node: Node,
}

/// A service operation (`set`, `cas`, `get`, `delete`, `delete-cas`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceOp {
    /// What to do.
    pub verb: String,
    /// The node it runs on.
    pub node: String,
    /// The instance (`ModifyIndex` for the cas verbs).
    pub service: NodeService,
}

/// A check operation (`set`, `cas`, `get`, `delete`, `delete-cas`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CheckOp {
    /// What to do.
    pub verb: String,
    /// The check (its `Node` and `CheckID` name it; `ModifyIndex` for the cas verbs).
    pub check: HealthCheck,
}

/// One operation's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum TxnResult {
    /// A KV entry.
    #[serde(rename = "KV")]
    Kv(KvEntry),
    /// A node.
    Node(Node),
    /// A service instance.
    Service(NodeService),
    /// A check.
    Check(HealthCheck),
}

/// Why a transaction was rolled back: which operation, and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct TxnError {
    /// The operation's position.
    pub op_index: usize,
    /// What went wrong.
    pub what: String,
}

/// The answer to a transaction.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct TxnResponse {
    /// Each operation's result, in order (`null` when rolled back).
    pub results: Option<Vec<TxnResult>>,
    /// Why it was rolled back (`null` when applied).
    pub errors: Option<Vec<TxnError>>,
}

impl TxnOp {
    /// Whether the operation only reads.
    pub fn reads_only(&self) -> bool {
        let verb = match self {
            TxnOp::Kv(op) => op.verb.as_str(),
            TxnOp::Node(op) => op.verb.as_str(),
            TxnOp::Service(op) => op.verb.as_str(),
            TxnOp::Check(op) => op.verb.as_str(),
        };
        matches!(
            verb,
            "get" | "get-tree" | "check-index" | "check-session" | "check-not-exists"
        )
    }
}
