//! ACL tokens, policies and roles in Consul's JSON shapes (`/v1/acl/...`).
//!
//! A token's `SecretID` is the credential: it is never written by `Debug` (so never logged),
//! and answers redact it unless the caller may manage ACLs.

use crate::{Index, Timestamp};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The accessor id of the anonymous token (the one used when a request names no token).
pub const ANONYMOUS_ACCESSOR: &str = "00000000-0000-0000-0000-000000000002";
/// The secret of the anonymous token.
pub const ANONYMOUS_SECRET: &str = "anonymous";
/// The id of the built-in policy that grants everything.
pub const GLOBAL_MANAGEMENT_ID: &str = "00000000-0000-0000-0000-000000000001";
/// The name of the built-in policy that grants everything.
pub const GLOBAL_MANAGEMENT_NAME: &str = "global-management";
/// The id of the built-in policy that reads everything (Consul's; policies and tokens have
/// separate ids, so it may equal the anonymous token's accessor, as in Consul).
pub const GLOBAL_READ_ONLY_ID: &str = "00000000-0000-0000-0000-000000000002";
/// The name of the built-in policy that reads everything.
pub const GLOBAL_READ_ONLY_NAME: &str = "builtin/global-read-only";
/// What replaces a secret the caller may not see.
pub const HIDDEN_SECRET: &str = "<hidden>";

/// A link from a token or role to a policy or role, by id or by name (either may be given
/// on input; both are filled on output).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Link {
    /// Id.
    #[serde(rename = "ID")]
    pub id: String,
    /// Name.
    #[serde(rename = "Name")]
    pub name: String,
}

/// A synthetic policy: `service:write` on the service and its sidecar, read on every
/// service and node (what a service and its proxy need).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServiceIdentity {
    /// The service.
    #[serde(rename = "ServiceName")]
    pub service_name: String,
    /// Where it applies (empty: every datacenter).
    #[serde(rename = "Datacenters", skip_serializing_if = "Vec::is_empty")]
    pub datacenters: Vec<String>,
}

/// A synthetic policy: `node:write` on the node and read on every service, in one
/// datacenter (what an agent needs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeIdentity {
    /// The node.
    #[serde(rename = "NodeName")]
    pub node_name: String,
    /// The datacenter it applies in.
    #[serde(rename = "Datacenter")]
    pub datacenter: String,
}

/// A token.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AclToken {
    /// Public id.
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    /// The credential.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
    /// Human description.
    #[serde(rename = "Description")]
    pub description: String,
    /// Policies linked.
    #[serde(rename = "Policies")]
    pub policies: Vec<Link>,
    /// Roles linked.
    #[serde(rename = "Roles")]
    pub roles: Vec<Link>,
    /// Service identities.
    #[serde(rename = "ServiceIdentities")]
    pub service_identities: Vec<ServiceIdentity>,
    /// Node identities.
    #[serde(rename = "NodeIdentities")]
    pub node_identities: Vec<NodeIdentity>,
    /// Local to this datacenter (meshd has one datacenter per cluster: always honoured).
    #[serde(rename = "Local")]
    pub local: bool,
    /// The auth method whose login created it (empty: made through the token API). Only
    /// such tokens may log out.
    #[serde(rename = "AuthMethod", skip_serializing_if = "String::is_empty")]
    pub auth_method: String,
    /// When the token stops working (none: never).
    #[serde(rename = "ExpirationTime", skip_serializing_if = "Option::is_none")]
    pub expiration_time: Option<Timestamp>,
    /// Creation time.
    #[serde(rename = "CreateTime")]
    pub create_time: Timestamp,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

impl fmt::Debug for AclToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AclToken")
            .field("accessor_id", &self.accessor_id)
            .field("secret_id", &HIDDEN_SECRET)
            .field("description", &self.description)
            .field("policies", &self.policies)
            .field("roles", &self.roles)
            .field("service_identities", &self.service_identities)
            .field("node_identities", &self.node_identities)
            .field("expiration_time", &self.expiration_time)
            .finish_non_exhaustive()
    }
}

impl AclToken {
    /// True once the token's expiration time has passed.
    pub fn expired(&self, now: std::time::SystemTime) -> bool {
        self.expiration_time.is_some_and(|t| t.0 <= now)
    }

    /// The token as a caller without `acl:write` sees it.
    pub fn redacted(mut self) -> Self {
        self.secret_id = HIDDEN_SECRET.to_owned();
        self
    }
}

/// A token create or update body (`PUT /v1/acl/token[/:accessor]`): the token's writable
/// fields, and `ExpirationTTL` (a lifetime from now, instead of `ExpirationTime`).
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TokenWrite {
    /// Public id (empty: made by the server).
    #[serde(rename = "AccessorID", skip_serializing_if = "String::is_empty")]
    pub accessor_id: String,
    /// The credential (empty: made by the server).
    #[serde(rename = "SecretID", skip_serializing_if = "String::is_empty")]
    pub secret_id: String,
    /// Human description.
    #[serde(rename = "Description")]
    pub description: String,
    /// Policies linked.
    #[serde(rename = "Policies")]
    pub policies: Vec<Link>,
    /// Roles linked.
    #[serde(rename = "Roles")]
    pub roles: Vec<Link>,
    /// Service identities.
    #[serde(rename = "ServiceIdentities")]
    pub service_identities: Vec<ServiceIdentity>,
    /// Node identities.
    #[serde(rename = "NodeIdentities")]
    pub node_identities: Vec<NodeIdentity>,
    /// Consul's templated policies: refused (meshd supports the identities instead).
    #[serde(rename = "TemplatedPolicies", skip_serializing_if = "Vec::is_empty")]
    pub templated_policies: Vec<serde_json::Value>,
    /// Local to this datacenter.
    #[serde(rename = "Local")]
    pub local: bool,
    /// When the token stops working.
    #[serde(rename = "ExpirationTime", skip_serializing_if = "Option::is_none")]
    pub expiration_time: Option<Timestamp>,
    /// How long from now the token works.
    #[serde(rename = "ExpirationTTL", skip_serializing_if = "Option::is_none")]
    pub expiration_ttl: Option<crate::GoDuration>,
}

impl fmt::Debug for TokenWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenWrite")
            .field("accessor_id", &self.accessor_id)
            .field("secret_id", &HIDDEN_SECRET)
            .field("description", &self.description)
            .finish_non_exhaustive()
    }
}

/// A policy: a named set of rules.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AclPolicy {
    /// Id.
    #[serde(rename = "ID")]
    pub id: String,
    /// Unique name.
    #[serde(rename = "Name")]
    pub name: String,
    /// Human description.
    #[serde(rename = "Description")]
    pub description: String,
    /// The rules, in HCL or JSON.
    #[serde(rename = "Rules")]
    pub rules: String,
    /// Where it applies (empty: every datacenter).
    #[serde(rename = "Datacenters", skip_serializing_if = "Vec::is_empty")]
    pub datacenters: Vec<String>,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

/// A role: a named set of policies and identities, linked from tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AclRole {
    /// Id.
    #[serde(rename = "ID")]
    pub id: String,
    /// Unique name.
    #[serde(rename = "Name")]
    pub name: String,
    /// Human description.
    #[serde(rename = "Description")]
    pub description: String,
    /// Policies linked.
    #[serde(rename = "Policies")]
    pub policies: Vec<Link>,
    /// Service identities.
    #[serde(rename = "ServiceIdentities")]
    pub service_identities: Vec<ServiceIdentity>,
    /// Node identities.
    #[serde(rename = "NodeIdentities")]
    pub node_identities: Vec<NodeIdentity>,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

/// An auth method (`/v1/acl/auth-method`): how a login's bearer token is verified. `Config`
/// is the type's own settings, kept as given (the `auth-method` crate reads them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AclAuthMethod {
    /// Unique name.
    #[serde(rename = "Name")]
    pub name: String,
    /// `jwt` or `kubernetes`.
    #[serde(rename = "Type")]
    pub kind: String,
    /// Name shown in UIs.
    #[serde(rename = "DisplayName", skip_serializing_if = "String::is_empty")]
    pub display_name: String,
    /// Human description.
    #[serde(rename = "Description")]
    pub description: String,
    /// The lifetime of the tokens its logins create (none: they do not expire).
    #[serde(rename = "MaxTokenTTL", skip_serializing_if = "Option::is_none")]
    pub max_token_ttl: Option<crate::GoDuration>,
    /// `local` (default) or `global`: where its tokens apply.
    #[serde(rename = "TokenLocality", skip_serializing_if = "String::is_empty")]
    pub token_locality: String,
    /// The type's settings.
    #[serde(rename = "Config")]
    pub config: serde_json::Map<String, serde_json::Value>,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

/// A binding rule (`/v1/acl/binding-rule`): which logins through an auth method get which
/// identity, role or policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AclBindingRule {
    /// Id.
    #[serde(rename = "ID")]
    pub id: String,
    /// Human description.
    #[serde(rename = "Description")]
    pub description: String,
    /// The auth method it applies to.
    #[serde(rename = "AuthMethod")]
    pub auth_method: String,
    /// A filter expression over the verified identity's fields (empty: every login).
    #[serde(rename = "Selector")]
    pub selector: String,
    /// `service`, `node`, `role` or `policy`.
    #[serde(rename = "BindType")]
    pub bind_type: String,
    /// The name bound, with `${field}` interpolations of the identity's fields.
    #[serde(rename = "BindName")]
    pub bind_name: String,
    /// Index of the write that created it.
    #[serde(rename = "CreateIndex")]
    pub create_index: Index,
    /// Index of the last write that changed it.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: Index,
}

/// What a secondary datacenter copies of the primary's ACL system: every policy and role,
/// and every token that is not local to the primary (secrets included: the endpoint that
/// serves it needs `acl:write`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AclReplica {
    /// Every policy.
    #[serde(rename = "Policies")]
    pub policies: Vec<AclPolicy>,
    /// Every role.
    #[serde(rename = "Roles")]
    pub roles: Vec<AclRole>,
    /// Every global token.
    #[serde(rename = "Tokens")]
    pub tokens: Vec<AclToken>,
}
