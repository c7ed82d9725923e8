//! Typed validation errors that name the field and the problem.

use std::fmt;

/// One invalid field: where it is and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ValidationError {
    /// Dotted path of the field as it appears in Consul's JSON (`Proxy.Upstreams[1].LocalBindPort`).
    pub field: String,
    /// What is wrong with it.
    pub problem: Problem,
}

/// What is wrong with a field; callers branch on this, never on message text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The field must be set (the string says when, e.g. "for kind connect-proxy").
    Required(&'static str),
    /// The field must not be set (the string says why).
    NotAllowed(&'static str),
    /// A number outside its allowed range.
    OutOfRange {
        /// Smallest allowed value.
        min: u64,
        /// Largest allowed value.
        max: u64,
    },
    /// A value that is not one of the accepted ones, or malformed.
    Invalid(String),
    /// Two entries that must be unique are not.
    Duplicate(String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Required("") => f.write_str("required"),
            Problem::Required(when) => write!(f, "required {when}"),
            Problem::NotAllowed(why) => write!(f, "not allowed {why}"),
            Problem::OutOfRange { min, max } => write!(f, "must be between {min} and {max}"),
            Problem::Invalid(why) => f.write_str(why),
            Problem::Duplicate(what) => write!(f, "duplicate {what}"),
        }
    }
}

impl ValidationError {
    /// An error for `field` with `problem`.
    pub fn new(field: impl Into<String>, problem: Problem) -> Self {
        Self {
            field: field.into(),
            problem,
        }
    }

    /// The same error seen from a parent: `Proxy` + `Upstreams[0].X` = `Proxy.Upstreams[0].X`.
    pub fn within(mut self, parent: &str) -> Self {
        if !parent.is_empty() {
            self.field = format!("{parent}.{}", self.field);
        }
        self
    }
}

/// Types whose values can be checked before they are stored or used.
pub trait Validate {
    /// Returns the first problem found, naming the field.
    fn validate(&self) -> Result<(), ValidationError>;
}

/// Checks that a service or config-entry name is usable in DNS, SNI and SPIFFE ids.
pub(crate) fn check_name(field: &str, name: &str, required: &'static str) -> Result<(), ValidationError> {
    if name.is_empty() {
        return Err(ValidationError::new(field, Problem::Required(required)));
    }
    if name.len() > 253 {
        return Err(ValidationError::new(
            field,
            Problem::Invalid("longer than 253 characters".into()),
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(ValidationError::new(
            field,
            Problem::Invalid(format!("invalid character {c:?}: use letters, digits, '-', '_' or '.'")),
        ));
    }
    Ok(())
}

/// Checks a service name from outside (a peer's export): set, and made of the characters
/// names may have.
pub fn check_service_name(name: &str) -> Result<(), ValidationError> {
    check_name("Name", name, "")
}

/// Checks a peer name: a DNS label (it is part of SNI names and SPIFFE-like keys), as
/// Consul's.
pub fn check_peer_name(field: &str, name: &str) -> Result<(), ValidationError> {
    if name.is_empty() {
        return Err(ValidationError::new(field, Problem::Required("")));
    }
    let ok = name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !ok {
        return Err(ValidationError::new(
            field,
            Problem::Invalid(format!(
                "{name:?} is not a valid peer name: use a DNS label (lowercase letters, digits and '-', at most 63 characters)"
            )),
        ));
    }
    Ok(())
}

/// Checks a TCP port that must be set.
pub(crate) fn check_port(field: &str, port: u16, when: &'static str) -> Result<(), ValidationError> {
    if port == 0 {
        return Err(ValidationError::new(field, Problem::Required(when)));
    }
    Ok(())
}
