//! Policy rules in Consul's two syntaxes, HCL and JSON, parsed to one model.
//!
//! ```hcl
//! service "web" { policy = "write" }
//! service_prefix "" { policy = "read" intentions = "read" }
//! node_prefix "" { policy = "read" }
//! operator = "read"
//! ```
//!
//! is the same policy as
//!
//! ```json
//! {"service": {"web": {"policy": "write"}},
//!  "service_prefix": {"": {"policy": "read", "intentions": "read"}},
//!  "node_prefix": {"": {"policy": "read"}}, "operator": "read"}
//! ```
//!
//! Errors name the line and column of what is wrong. Rules on what meshd has no API for
//! (`keyring`) are accepted and kept, so Consul policies load unchanged; they grant nothing
//! here.

use hcl_edit::Span;
use hcl_edit::expr::Expression;
use hcl_edit::structure::{BlockLabel, Structure};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::Range;

/// An access level. Merged rules for the same resource keep the strongest by Consul's
/// precedence: `deny`, then `write`, then `list`, then `read`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Nothing, whatever else grants it.
    Deny,
    /// Read.
    Read,
    /// Read, and list the keys under a prefix (`key` and `key_prefix` rules only). Consul
    /// checks the listing itself only with its `enable_key_list_policy` setting, which meshd
    /// does not have: here, as in Consul by default, it reads as `read` does.
    List,
    /// Read and write.
    Write,
}

impl Access {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "deny" => Some(Self::Deny),
            "read" => Some(Self::Read),
            "list" => Some(Self::List),
            "write" => Some(Self::Write),
            _ => None,
        }
    }

    fn rank(self) -> u8 {
        match self {
            Self::Read => 0,
            Self::List => 1,
            Self::Write => 2,
            Self::Deny => 3,
        }
    }

    /// Of two levels granted for the same resource, the one that holds.
    pub fn merge(self, other: Self) -> Self {
        if other.rank() > self.rank() { other } else { self }
    }

    /// Whether this level grants `need` (`read` or `write`).
    pub fn grants(self, need: Access) -> bool {
        match self {
            Self::Deny => false,
            Self::Read => need == Self::Read,
            Self::List => matches!(need, Self::Read | Self::List),
            Self::Write => need != Self::Deny,
        }
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Deny => "deny",
            Self::Read => "read",
            Self::List => "list",
            Self::Write => "write",
        })
    }
}

/// A resource type that rules name (`service "web" {...}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resource {
    /// A service, by exact name.
    Service,
    /// Services whose name starts with the prefix.
    ServicePrefix,
    /// A node, by exact name.
    Node,
    /// Nodes by prefix.
    NodePrefix,
    /// An agent (by its node name).
    Agent,
    /// Agents by prefix.
    AgentPrefix,
    /// A KV key, by exact name.
    Key,
    /// KV keys by prefix.
    KeyPrefix,
    /// The sessions of a node, by the node's exact name.
    Session,
    /// Sessions by node-name prefix.
    SessionPrefix,
    /// User events, by exact name.
    Event,
    /// User events by name prefix.
    EventPrefix,
    /// Prepared queries, by exact name.
    Query,
    /// Prepared queries by name prefix.
    QueryPrefix,
}

impl Resource {
    const ALL: [(&'static str, Resource); 14] = [
        ("service", Self::Service),
        ("service_prefix", Self::ServicePrefix),
        ("node", Self::Node),
        ("node_prefix", Self::NodePrefix),
        ("agent", Self::Agent),
        ("agent_prefix", Self::AgentPrefix),
        ("key", Self::Key),
        ("key_prefix", Self::KeyPrefix),
        ("session", Self::Session),
        ("session_prefix", Self::SessionPrefix),
        ("event", Self::Event),
        ("event_prefix", Self::EventPrefix),
        ("query", Self::Query),
        ("query_prefix", Self::QueryPrefix),
    ];

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().find(|(n, _)| *n == s).map(|(_, r)| *r)
    }

    /// The name rules use.
    pub fn as_str(self) -> &'static str {
        Self::ALL.iter().find(|(_, r)| *r == self).map_or("", |(n, _)| n)
    }

    /// Whether the rule's name is a prefix.
    pub fn is_prefix(self) -> bool {
        self.as_str().ends_with("_prefix")
    }
}

/// A rule on one named resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedRule {
    /// The resource type.
    pub resource: Resource,
    /// The name, or the prefix.
    pub name: String,
    /// The access granted.
    pub policy: Access,
    /// For services: access to the intentions whose destination it is (unset: `read`
    /// when the policy is `read` or `write`, else `deny`, as Consul).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intentions: Option<Access>,
}

/// One policy's rules.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rules {
    /// ACL management.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acl: Option<Access>,
    /// Cluster operations (CA configuration, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<Access>,
    /// Mesh-wide config entries (unset: follows `operator`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh: Option<Access>,
    /// Keyring (no API in meshd: kept, grants nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyring: Option<Access>,
    /// Peerings (unset: follows `operator`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peering: Option<Access>,
    /// Rules on named resources, in the order written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub named: Vec<NamedRule>,
}

/// A rule that could not be parsed: where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct RuleError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

impl RuleError {
    fn at(text: &str, offset: usize, message: impl Into<String>) -> Self {
        let before = &text[..offset.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        Self {
            line,
            column,
            message: message.into(),
        }
    }
}

impl Rules {
    /// Parses rules in HCL, or in JSON when the text starts with `{`. Empty text is an
    /// empty policy.
    pub fn parse(text: &str) -> Result<Self, RuleError> {
        if text.trim_start().starts_with('{') {
            parse_json(text)
        } else {
            parse_hcl(text)
        }
    }

    /// The rules of a service identity: write on the service and its sidecar, read on
    /// every service and node.
    pub fn service_identity(service: &str) -> Self {
        let write = |resource, name: String| NamedRule {
            resource,
            name,
            policy: Access::Write,
            intentions: None,
        };
        let read = |resource| NamedRule {
            resource,
            name: String::new(),
            policy: Access::Read,
            intentions: None,
        };
        Self {
            named: vec![
                write(Resource::Service, service.to_owned()),
                write(Resource::Service, format!("{service}-sidecar-proxy")),
                read(Resource::ServicePrefix),
                read(Resource::NodePrefix),
            ],
            ..Self::default()
        }
    }

    /// The rules of a node identity: write on the node, read on every service.
    pub fn node_identity(node: &str) -> Self {
        Self {
            named: vec![
                NamedRule {
                    resource: Resource::Node,
                    name: node.to_owned(),
                    policy: Access::Write,
                    intentions: None,
                },
                NamedRule {
                    resource: Resource::ServicePrefix,
                    name: String::new(),
                    policy: Access::Read,
                    intentions: None,
                },
            ],
            ..Self::default()
        }
    }
}

/// The rules text of the built-in `global-management` policy: everything, written.
pub const GLOBAL_MANAGEMENT_RULES: &str = r#"acl = "write"
operator = "write"
mesh = "write"
keyring = "write"
peering = "write"
agent_prefix "" { policy = "write" }
node_prefix "" { policy = "write" }
service_prefix "" {
  policy     = "write"
  intentions = "write"
}
key_prefix "" { policy = "write" }
session_prefix "" { policy = "write" }
event_prefix "" { policy = "write" }
query_prefix "" { policy = "write" }
"#;

/// The rules text of the built-in `builtin/global-read-only` policy: everything, read.
pub const GLOBAL_READ_ONLY_RULES: &str = r#"acl = "read"
operator = "read"
mesh = "read"
keyring = "read"
peering = "read"
agent_prefix "" { policy = "read" }
node_prefix "" { policy = "read" }
service_prefix "" {
  policy     = "read"
  intentions = "read"
}
key_prefix "" { policy = "read" }
session_prefix "" { policy = "read" }
event_prefix "" { policy = "read" }
query_prefix "" { policy = "read" }
"#;

const SCALARS: [&str; 5] = ["acl", "operator", "mesh", "keyring", "peering"];

fn set_scalar(rules: &mut Rules, key: &str, access: Access) {
    let slot = match key {
        "acl" => &mut rules.acl,
        "operator" => &mut rules.operator,
        "mesh" => &mut rules.mesh,
        "keyring" => &mut rules.keyring,
        _ => &mut rules.peering,
    };
    *slot = Some(slot.map_or(access, |a| a.merge(access)));
}

fn unknown_key(key: &str) -> String {
    let named: Vec<&str> = Resource::ALL.iter().map(|(n, _)| *n).collect();
    format!(
        "unknown rule {key:?}: use one of {} (blocks) or {} (levels)",
        named.join(", "),
        SCALARS.join(", ")
    )
}

fn bad_level(what: &str, value: &str) -> String {
    format!("{what}: {value:?} is not an access level: use read, write or deny (or list, for keys)")
}

/// The level `value` names for `what`; `list` only where `list_ok` (a key rule's policy).
fn level(value: &str, what: &str, list_ok: bool) -> Result<Access, String> {
    match Access::parse(value) {
        Some(Access::List) if !list_ok => Err(format!(
            "{what}: \"list\" applies only to the policy of key and key_prefix rules"
        )),
        Some(access) => Ok(access),
        None => Err(bad_level(what, value)),
    }
}

fn lists(resource: Resource, field: &str) -> bool {
    field == "policy" && matches!(resource, Resource::Key | Resource::KeyPrefix)
}

fn start(span: Option<Range<usize>>) -> usize {
    span.map_or(0, |r| r.start)
}

/// Consul's rules are HCL version 1, which needs no line breaks between blocks or
/// attributes (`service "a" { policy = "read" } node "b" { policy = "write" }`) and takes
/// commas between attributes; the parser here reads HCL 2, which does. The same text with a
/// line break after each `{`, around each `}`, for each `,` outside brackets, and between a
/// string and the attribute name after it on one line. Strings and comments are copied as
/// they are.
fn hcl1_layout(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut chars = text.chars().peekable();
    let (mut brackets, mut after_string) = (0usize, false);
    while let Some(c) = chars.next() {
        if after_string && (c.is_ascii_alphabetic() || c == '_') {
            out.push('\n');
        }
        if !c.is_whitespace() || c == '\n' {
            after_string = false;
        }
        match c {
            '"' => {
                out.push(c);
                while let Some(s) = chars.next() {
                    out.push(s);
                    match s {
                        '\\' => out.extend(chars.next()),
                        '"' => break,
                        _ => {}
                    }
                }
                after_string = true;
            }
            '#' => {
                out.push(c);
                while let Some(&s) = chars.peek().filter(|s| **s != '\n') {
                    out.push(s);
                    chars.next();
                }
            }
            '/' if chars.peek() == Some(&'/') => {
                out.push(c);
                while let Some(&s) = chars.peek().filter(|s| **s != '\n') {
                    out.push(s);
                    chars.next();
                }
            }
            '[' => {
                brackets += 1;
                out.push(c);
            }
            ']' => {
                brackets = brackets.saturating_sub(1);
                out.push(c);
            }
            '{' => out.push_str("{\n"),
            '}' => out.push_str("\n}\n"),
            ',' if brackets == 0 => out.push('\n'),
            _ => out.push(c),
        }
    }
    out
}

fn parse_hcl(text: &str) -> Result<Rules, RuleError> {
    let body = match hcl_edit::parser::parse_body(text) {
        Ok(body) => body,
        // Errors name the text as written; positions in the relaid text would not.
        Err(e) => match hcl_edit::parser::parse_body(&hcl1_layout(text)) {
            Ok(_) => return parse_hcl(&hcl1_layout(text)),
            Err(_) => {
                return Err(RuleError {
                    line: e.location().line(),
                    column: e.location().column(),
                    message: e.message().to_owned(),
                });
            }
        },
    };
    let mut rules = Rules::default();
    for structure in body.iter() {
        match structure {
            Structure::Attribute(attr) => {
                let key = attr.key.as_str();
                let at = start(attr.span());
                if !SCALARS.contains(&key) {
                    if Resource::parse(key).is_some() {
                        return Err(RuleError::at(
                            text,
                            at,
                            format!("{key} is a block: write {key} \"NAME\" {{ policy = \"read\" }}"),
                        ));
                    }
                    return Err(RuleError::at(text, at, unknown_key(key)));
                }
                let value = string_value(text, &attr.value, key)?;
                let access = level(&value, key, false).map_err(|e| RuleError::at(text, start(attr.value.span()), e))?;
                set_scalar(&mut rules, key, access);
            }
            Structure::Block(block) => {
                let ident = block.ident.as_str();
                let at = start(block.span());
                let Some(resource) = Resource::parse(ident) else {
                    return Err(RuleError::at(text, at, unknown_key(ident)));
                };
                let name = match block.labels.as_slice() {
                    [BlockLabel::String(s)] => s.as_str().to_owned(),
                    [BlockLabel::Ident(i)] => i.as_str().to_owned(),
                    _ => {
                        return Err(RuleError::at(
                            text,
                            at,
                            format!("{ident} needs exactly one name: {ident} \"NAME\" {{ ... }}"),
                        ));
                    }
                };
                let mut policy = None;
                let mut intentions = None;
                for inner in block.body.iter() {
                    let Structure::Attribute(attr) = inner else {
                        return Err(RuleError::at(
                            text,
                            start(inner.span()),
                            format!("{ident} {name:?}: nested blocks are not allowed"),
                        ));
                    };
                    let key = attr.key.as_str();
                    let what = format!("{ident} {name:?} {key}");
                    let value = string_value(text, &attr.value, &what)?;
                    let access = level(&value, &what, lists(resource, key))
                        .map_err(|e| RuleError::at(text, start(attr.value.span()), e))?;
                    match key {
                        "policy" => policy = Some(access),
                        "intentions" if resource == Resource::Service || resource == Resource::ServicePrefix => {
                            intentions = Some(access)
                        }
                        _ => {
                            return Err(RuleError::at(
                                text,
                                start(attr.span()),
                                format!("{ident} {name:?}: unknown field {key:?}"),
                            ));
                        }
                    }
                }
                let Some(policy) = policy else {
                    return Err(RuleError::at(text, at, format!("{ident} {name:?}: policy is required")));
                };
                rules.named.push(NamedRule {
                    resource,
                    name,
                    policy,
                    intentions,
                });
            }
        }
    }
    Ok(rules)
}

fn string_value(text: &str, expr: &Expression, what: &str) -> Result<String, RuleError> {
    match expr {
        Expression::String(s) => Ok(s.as_str().to_owned()),
        _ => Err(RuleError::at(
            text,
            start(expr.span()),
            format!("{what}: expected a quoted access level (\"read\", \"write\" or \"deny\")"),
        )),
    }
}

/// Where `needle` (a JSON key or value, quoted) first appears at or after `from`: the best
/// position JSON errors can name, since the parsed value keeps no spans.
fn find(text: &str, from: usize, needle: &str) -> usize {
    let quoted = serde_json::to_string(needle).unwrap_or_default();
    text.get(from..)
        .and_then(|t| t.find(&quoted))
        .map_or(from, |i| from + i)
}

fn parse_json(text: &str) -> Result<Rules, RuleError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| RuleError {
        line: e.line(),
        column: e.column(),
        message: format!("invalid JSON: {e}"),
    })?;
    let serde_json::Value::Object(top) = value else {
        return Err(RuleError::at(text, 0, "rules must be an object"));
    };
    let mut rules = Rules::default();
    for (key, value) in &top {
        let at = find(text, 0, key);
        if SCALARS.contains(&key.as_str()) {
            let level = value.as_str().unwrap_or_default();
            let access = self::level(level, key, false).map_err(|e| RuleError::at(text, at, e))?;
            set_scalar(&mut rules, key, access);
            continue;
        }
        let resource = Resource::parse(key).ok_or_else(|| RuleError::at(text, at, unknown_key(key)))?;
        let serde_json::Value::Object(names) = value else {
            return Err(RuleError::at(
                text,
                at,
                format!("{key}: expected an object of names, each with a policy"),
            ));
        };
        for (name, body) in names {
            let name_at = find(text, at, name);
            let serde_json::Value::Object(fields) = body else {
                return Err(RuleError::at(
                    text,
                    name_at,
                    format!("{key} {name:?}: expected an object"),
                ));
            };
            let mut policy = None;
            let mut intentions = None;
            for (field, level) in fields {
                let what = format!("{key} {name:?} {field}");
                let field_at = find(text, name_at, field);
                let level_str = level.as_str().unwrap_or_default();
                let access = self::level(level_str, &what, lists(resource, field))
                    .map_err(|e| RuleError::at(text, field_at, e))?;
                match field.as_str() {
                    "policy" => policy = Some(access),
                    "intentions" if matches!(resource, Resource::Service | Resource::ServicePrefix) => {
                        intentions = Some(access)
                    }
                    _ => {
                        return Err(RuleError::at(
                            text,
                            field_at,
                            format!("{key} {name:?}: unknown field {field:?}"),
                        ));
                    }
                }
            }
            let Some(policy) = policy else {
                return Err(RuleError::at(
                    text,
                    name_at,
                    format!("{key} {name:?}: policy is required"),
                ));
            };
            rules.named.push(NamedRule {
                resource,
                name: name.clone(),
                policy,
                intentions,
            });
        }
    }
    Ok(rules)
}
