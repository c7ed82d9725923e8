//! The [`Token`] newtype: an ACL token's secret, never empty (absence is `Option::None`,
//! never `""`), never printed (its `Debug` says `Token(<hidden>)`).
//!
//! On the wire a token is its plain secret. Consul's JSON writes "no token" as `""` (or
//! leaves the key out): [`opt`] reads both, and `null`, as `None` for an `Option<Token>`
//! field, and writes `None` as `""`; add `skip_serializing_if = "Option::is_none"` where the
//! key was left out when empty.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::sync::Arc;

/// A token's secret. Never empty (absence is `Option::None`), never printed: its `Debug`
/// says `Token(<hidden>)`. Ordered by secret, so it can key a `BTreeMap`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(Arc<str>);

impl Token {
    /// The token for `secret`, or none for an empty one.
    pub fn new(secret: &str) -> Option<Self> {
        (!secret.is_empty()).then(|| Self(Arc::from(secret)))
    }

    /// The secret, to send or to look up.
    pub fn secret(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<hidden>)")
    }
}

impl Serialize for Token {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.secret())
    }
}

impl<'de> Deserialize<'de> for Token {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let secret = String::deserialize(deserializer)?;
        Self::new(&secret).ok_or_else(|| serde::de::Error::custom("a token cannot be empty"))
    }
}

/// Serde for an `Option<Token>` field in Consul's convention: `""`, `null` and a missing key
/// (with `#[serde(default)]`) read as `None`; `None` is written as `""`. Use it as
/// `#[serde(default, with = "structs::token::opt")]`.
pub mod opt {
    use super::Token;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes the secret, or `""` for none.
    pub fn serialize<S: Serializer>(token: &Option<Token>, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(token.as_ref().map_or("", Token::secret))
    }

    /// Reads a string (`""`: none) or `null` (none).
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Token>, D::Error> {
        let secret = Option::<String>::deserialize(deserializer)?;
        Ok(secret.as_deref().and_then(Token::new))
    }
}

#[cfg(test)]
mod tests {
    use super::Token;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
    struct Body {
        #[serde(rename = "Token", default, with = "super::opt")]
        token: Option<Token>,
        #[serde(
            rename = "Other",
            default,
            with = "super::opt",
            skip_serializing_if = "Option::is_none"
        )]
        other: Option<Token>,
    }

    #[test]
    fn empty_is_none() {
        assert_eq!(Token::new(""), None);
        assert_eq!(
            Token::new("s3cr3t").map(|t| t.secret().to_owned()),
            Some("s3cr3t".to_owned())
        );
    }

    #[test]
    fn debug_hides_the_secret() {
        let token = Token::new("s3cr3t").unwrap();
        assert_eq!(format!("{token:?}"), "Token(<hidden>)");
        assert_eq!(format!("{:?}", Some(&token)), "Some(Token(<hidden>))");
        let body = Body {
            token: Some(token.clone()),
            other: Some(token),
        };
        assert!(!format!("{body:?} {body:#?}").contains("s3cr3t"));
    }

    #[test]
    fn a_token_is_its_plain_secret() {
        let token = Token::new("s3cr3t").unwrap();
        assert_eq!(serde_json::to_string(&token).unwrap(), r#""s3cr3t""#);
        assert_eq!(serde_json::from_str::<Token>(r#""s3cr3t""#).unwrap(), token);
        assert!(serde_json::from_str::<Token>(r#""""#).is_err());
        assert!(serde_json::from_str::<Token>("null").is_err());
        assert!(serde_json::from_str::<Token>("12").is_err());
    }

    #[test]
    fn an_optional_token_is_empty_when_none() {
        let none = Body::default();
        assert_eq!(serde_json::to_string(&none).unwrap(), r#"{"Token":""}"#);
        let some = Body {
            token: Token::new("a"),
            other: Token::new("b"),
        };
        assert_eq!(serde_json::to_string(&some).unwrap(), r#"{"Token":"a","Other":"b"}"#);
        for text in [r#"{"Token":""}"#, r#"{"Token":null,"Other":""}"#, "{}"] {
            assert_eq!(serde_json::from_str::<Body>(text).unwrap(), none, "{text}");
        }
        assert_eq!(
            serde_json::from_str::<Body>(r#"{"Token":"a","Other":"b"}"#).unwrap(),
            some
        );
        assert_eq!(
            crate::json::from_slice::<Body>(br#"{"token":"a","other":"b"}"#).unwrap(),
            some
        );
        assert_eq!(
            crate::json::from_slice::<Body>(br#"{"token":"","other":null}"#).unwrap(),
            none
        );
        assert!(serde_json::from_str::<Body>(r#"{"Token":1}"#).is_err());
    }
}
