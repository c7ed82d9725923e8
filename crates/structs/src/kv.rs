//! The KV store's entries, as Consul's API shows them (`DirEntry`), and what makes a key or
//! a value acceptable.

use crate::Index;
use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The largest value a key may hold, as Consul: 512 KiB.
pub const MAX_VALUE: usize = 512 * 1024;

/// One key and its value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct KvEntry {
    /// How many times a session acquired the key's lock.
    #[serde(default)]
    pub lock_index: u64,
    /// The key.
    pub key: String,
    /// Opaque flags the writer chose.
    #[serde(default)]
    pub flags: u64,
    /// The value: base64 in JSON, `null` when empty (as Consul).
    #[serde(default, serialize_with = "value_out", deserialize_with = "value_in")]
    pub value: Vec<u8>,
    /// The session holding the key's lock, if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub session: String,
    /// The write that created the key.
    #[serde(default)]
    pub create_index: Index,
    /// The write that changed it last.
    #[serde(default)]
    pub modify_index: Index,
}

pub(crate) fn value_out<S: Serializer>(value: &[u8], s: S) -> Result<S::Ok, S::Error> {
    if value.is_empty() {
        s.serialize_none()
    } else {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(value))
    }
}

pub(crate) fn value_in<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let text: Option<String> = Option::deserialize(d)?;
    match text {
        None => Ok(Vec::new()),
        Some(t) => base64::engine::general_purpose::STANDARD
            .decode(t)
            .map_err(|e| serde::de::Error::custom(format!("Value: not base64: {e}"))),
    }
}

/// Why a key cannot be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// The key is empty.
    #[error("Missing key name")]
    MissingKey,
    /// The value is over [`MAX_VALUE`].
    #[error("Value exceeds {MAX_VALUE} byte limit")]
    TooLarge,
}

/// The keys under `prefix` as `?keys&separator=` lists them: each key, or, when the rest of
/// it after the prefix holds `separator`, the key up to and with its first separator, each
/// listed once. `keys` must be sorted (so that rolled-up keys are adjacent).
pub fn list_keys<'a>(prefix: &str, separator: &str, keys: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for key in keys {
        let listed = match key.get(prefix.len()..) {
            Some(rest) if !separator.is_empty() => match rest.find(separator) {
                Some(at) => &key[..prefix.len() + at + separator.len()],
                None => key,
            },
            _ => key,
        };
        if out.last().is_none_or(|last| last != listed) {
            out.push(listed.to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_base64_and_empty_is_null() {
        let mut e = KvEntry {
            key: "a/b".into(),
            value: b"hi".to_vec(),
            ..KvEntry::default()
        };
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["Value"], "aGk=");
        assert!(json.get("Session").is_none());
        assert_eq!(serde_json::from_value::<KvEntry>(json).unwrap(), e);
        e.value.clear();
        e.session = "s1".into();
        let json = serde_json::to_value(&e).unwrap();
        assert!(json["Value"].is_null());
        assert_eq!(json["Session"], "s1");
        assert_eq!(serde_json::from_value::<KvEntry>(json).unwrap(), e);
    }

    #[test]
    fn keys_roll_up_at_the_separator() {
        let keys = ["app/a", "app/b/c", "app/b/d", "app/e/", "apple", "b"];
        assert_eq!(
            list_keys("app/", "/", keys[..4].iter().copied()),
            ["app/a", "app/b/", "app/e/"]
        );
        assert_eq!(list_keys("", "/", keys.iter().copied()), ["app/", "apple", "b"]);
        assert_eq!(list_keys("app", "", keys[..5].iter().copied()).len(), 5);
    }
}
