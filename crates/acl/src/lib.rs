//! meshd's ACL model, after Consul's: policy rules in HCL or JSON ([`Rules`]), and the
//! [`Authorizer`] a token's rules compile to.
//!
//! Storage of tokens, policies and roles belongs to the server (the `catalog` crate); this
//! crate holds no state and does no I/O, so agents (which receive a token's rules from a
//! server) share it. Resolving a token is the [`TokenResolver`] trait, which the server and
//! the agent each implement.

mod authorizer;
mod resolver;
mod rules;

pub use authorizer::Authorizer;
pub use resolver::{BoxFuture, ResolveError, Resolved, Token, TokenResolver};
pub use rules::{Access, GLOBAL_MANAGEMENT_RULES, GLOBAL_READ_ONLY_RULES, NamedRule, Resource, RuleError, Rules};

/// What an agent needs to enforce ACLs for one token, as a server answers
/// `GET /v1/internal/acl/authorizer`: the token's rules and the default policy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenRules {
    /// The token's accessor id.
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    /// `allow` or `deny`.
    #[serde(rename = "DefaultPolicy")]
    pub default_policy: String,
    /// The rules that apply in this datacenter, from every policy, role and identity.
    #[serde(rename = "Rules")]
    pub rules: Vec<Rules>,
    /// When the token stops working.
    #[serde(rename = "ExpirationTime", default, skip_serializing_if = "Option::is_none")]
    pub expiration_time: Option<structs::Timestamp>,
}

impl TokenRules {
    /// The authorizer these rules compile to.
    pub fn authorizer(&self) -> Authorizer {
        Authorizer::new(&self.rules, self.default_policy == "allow")
    }
}

/// The refusal every denied check answers, in Consul's words.
pub const PERMISSION_DENIED: &str = "Permission denied";
/// Consul's refusal text: `Permission denied: token with AccessorID '...' lacks permission
/// 'service:write' on "web"` (no `on` part for cluster-wide permissions, `target` empty).
pub fn denied(accessor: &str, permission: &str, target: &str) -> String {
    let on = if target.is_empty() {
        String::new()
    } else {
        format!(" on {target:?}")
    };
    format!("{PERMISSION_DENIED}: token with AccessorID '{accessor}' lacks permission '{permission}'{on}")
}

/// The refusal for a token that does not exist, in Consul's words.
pub const ACL_NOT_FOUND: &str = "ACL not found";

#[cfg(test)]
mod tests;
