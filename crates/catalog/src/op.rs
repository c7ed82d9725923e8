//! What callers ask the catalog to write ([`Op`]); planning each is in `ops.rs`.

use crate::ca::CaConfig;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};
use structs::KvEntry;
use structs::acl::{AclAuthMethod, AclBindingRule, AclPolicy, AclRole, AclToken};
use structs::config_entry::{IntentionAction, IntentionPermission};
use structs::session::Session;
use structs::{ConfigEntry, ConfigEntryKind, DeregisterRequest, Index, RegisterRequest};

/// A write to the catalog.
#[derive(Debug, Clone)]
pub enum Op {
    /// Register a node, optionally a service and checks (`/v1/catalog/register`).
    Register(Box<RegisterRequest>),
    /// Remove a node, a service or a check (`/v1/catalog/deregister`).
    Deregister(DeregisterRequest),
    /// Create or replace a config entry; with `cas`, only if its ModifyIndex matches
    /// (0: only if it does not exist).
    ConfigSet {
        /// The entry.
        entry: Box<ConfigEntry>,
        /// Check-and-set index.
        cas: Option<Index>,
    },
    /// Delete a config entry; with `cas`, only if its ModifyIndex matches.
    ConfigDelete {
        /// Kind.
        kind: ConfigEntryKind,
        /// Name.
        name: String,
        /// Check-and-set index.
        cas: Option<Index>,
    },
    /// Create or update the intention `source` → `destination` (legacy exact API).
    IntentionUpsert {
        /// Source service or `*`.
        source: String,
        /// Destination service or `*`.
        destination: String,
        /// L4 action (exclusive with permissions).
        action: Option<IntentionAction>,
        /// L7 permissions.
        permissions: Vec<IntentionPermission>,
        /// Description.
        description: String,
        /// Metadata.
        meta: BTreeMap<String, String>,
        /// Only create: refused when the intention exists (the ID API's create), decided
        /// with the write, so two creates of one pair never both succeed.
        create: bool,
    },
    /// Delete the intention `source` → `destination`.
    IntentionDelete {
        /// Source.
        source: String,
        /// Destination.
        destination: String,
    },
    /// Create the CA if there is none (first start).
    CaBootstrap {
        /// Its settings.
        config: CaConfig,
        /// Its cluster id (`None`: a random UUID).
        cluster_id: Option<String>,
    },
    /// Apply a new CA configuration (rotating the root if the key type changes).
    CaConfigure(CaConfig),
    /// A secondary datacenter's CA: the primary's trust domain and roots, and the
    /// intermediate the primary signed for this datacenter (see [`crate::ca`]). Writes
    /// nothing when the CA already is that.
    CaFollowPrimary {
        /// The primary's roots, as its `/v1/connect/ca/roots` answers.
        roots: Box<structs::IndexedCaRoots>,
        /// The intermediate.
        intermediate: crate::ca::Intermediate,
    },
    /// Remove the rotated-out CA roots that no leaf they signed can still need at `now`
    /// (leader work: see [`crate::ca_pruning`]); nothing to remove writes nothing.
    CaPruneRoots {
        /// The time the roots' leaves are judged at.
        now: SystemTime,
    },
    /// Create what ACLs need if missing: the built-in policy and the anonymous token.
    AclInit,
    /// The first management token, with these ids; refused once done.
    AclBootstrap {
        /// Accessor id.
        accessor: String,
        /// Secret.
        secret: String,
    },
    /// Create (`create`) or update an ACL token. `ttl` sets its expiration from now.
    AclTokenSet {
        /// The token, ids filled.
        token: Box<AclToken>,
        /// Create rather than update.
        create: bool,
        /// Lifetime from now (create only).
        ttl: Option<Duration>,
    },
    /// Delete an ACL token.
    AclTokenDelete {
        /// Accessor id.
        accessor: String,
    },
    /// Create or update an ACL policy.
    AclPolicySet {
        /// The policy, id filled.
        policy: Box<AclPolicy>,
        /// Create rather than update.
        create: bool,
    },
    /// Delete an ACL policy.
    AclPolicyDelete {
        /// Id.
        id: String,
    },
    /// Create or update an ACL role.
    AclRoleSet {
        /// The role, id filled.
        role: Box<AclRole>,
        /// Create rather than update.
        create: bool,
    },
    /// Delete an ACL role.
    AclRoleDelete {
        /// Id.
        id: String,
    },
    /// Create or update an auth method (its `Config` checked by the caller, which knows the
    /// type's settings).
    AclAuthMethodSet {
        /// The method.
        method: Box<AclAuthMethod>,
        /// Create rather than update.
        create: bool,
    },
    /// Delete an auth method, its binding rules and the tokens its logins created.
    AclAuthMethodDelete {
        /// Name.
        name: String,
    },
    /// Create or update a binding rule (its `Selector` and `BindName` checked by the
    /// caller against the method's type).
    AclBindingRuleSet {
        /// The rule, id filled.
        rule: Box<AclBindingRule>,
        /// Create rather than update.
        create: bool,
    },
    /// Delete a binding rule.
    AclBindingRuleDelete {
        /// Id.
        id: String,
    },
    /// A secondary datacenter's config entries made the primary's (replication): each entry
    /// that differs written, each one the primary lacks deleted, in one write. Not checked
    /// again: the primary checked each write, and a copy must not refuse what it copies.
    ReplicateConfig(Vec<ConfigEntry>),
    /// A secondary datacenter's ACL policies, roles and global tokens made the primary's
    /// (replication), in one write; its local tokens are kept.
    ReplicateAcl(Box<structs::acl::AclReplica>),
    /// Set a KV key; with `cas`, only if its ModifyIndex matches (0: only if absent).
    KvSet {
        /// The key.
        key: String,
        /// The value (at most [`structs::kv::MAX_VALUE`] bytes).
        value: Vec<u8>,
        /// Opaque flags.
        flags: u64,
        /// Check-and-set index.
        cas: Option<Index>,
    },
    /// Delete a KV key; with `cas`, only if its ModifyIndex matches.
    KvDelete {
        /// The key.
        key: String,
        /// Check-and-set index.
        cas: Option<Index>,
    },
    /// Delete every KV key starting with `prefix`.
    KvDeleteTree {
        /// The prefix ("" for all).
        prefix: String,
    },
    /// Set a KV key and take its lock for `session` (`?acquire=`).
    KvLock {
        /// The key, value and flags.
        entry: Box<KvEntry>,
        /// The session.
        session: String,
        /// Now, in ms since the epoch (lock delays are judged at it).
        now_ms: u64,
    },
    /// Set a KV key and let go of `session`'s lock on it (`?release=`).
    KvUnlock {
        /// The key, value and flags.
        entry: Box<KvEntry>,
        /// The session.
        session: String,
    },
    /// Create a session (id, node and defaults filled; `renewed_at_ms` is now).
    SessionCreate(Box<Session>),
    /// Renew a session's TTL at `now_ms`.
    SessionRenew {
        /// The session.
        id: String,
        /// Now, in ms since the epoch.
        now_ms: u64,
    },
    /// End a session: its locks are released (or keys deleted) with a lock delay.
    SessionDestroy {
        /// The session.
        id: String,
        /// Now, in ms since the epoch.
        now_ms: u64,
    },
    /// Leader work: end every session whose TTL ran out or whose node or checks went or
    /// turned critical, and drop lock delays that are over.
    SessionsInvalidate {
        /// Now, in ms since the epoch.
        now_ms: u64,
    },
    /// A transaction: every operation applies, in order, or none does.
    Txn(Vec<structs::txn::TxnOp>),
    /// Fire a user event (id, name, payload and filters filled; its `LTime` is given when
    /// planned). The oldest kept event goes when [`structs::event::KEPT`] are kept.
    EventFire(Box<structs::event::UserEvent>),
    /// Create (`create`: refused if the id exists) or update a prepared query. Its name must
    /// be unique, among templates too.
    QuerySet {
        /// The query, id filled.
        query: Box<structs::query::PreparedQuery>,
        /// Create rather than update (an update of a missing query is a 404).
        create: bool,
    },
    /// Delete a prepared query.
    QueryDelete {
        /// Its id.
        id: String,
    },
    /// Replace every row with a snapshot's (see [`crate::snapshot`]).
    Restore(std::sync::Arc<crate::snapshot::Snapshot>),
    /// A peering write (see [`crate::PeeringOp`]).
    Peering(crate::PeeringOp),
    /// Nothing but the audit record of the calling task's scope (see [`crate::audit`]):
    /// how a refused write is recorded.
    AuditOnly,
}
