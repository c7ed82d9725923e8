//! Consul-compatible JSON decoding.
//!
//! Consul's HTTP API accepts keys in PascalCase, camelCase, snake_case and plain lowercase,
//! and real clients mix them inside one body. We accept all of them at every nesting level by
//! decoding through [`Lenient`], a deserializer that matches each object key against the
//! field names the target struct declares, ignoring case, `_` and `-`. Keys of maps (`Meta`,
//! `Proxy.Config`, `Upstreams[].Config`, resolver `Subsets`, ...) are never rewritten: they
//! reach the map untouched, as do keys anywhere inside an opaque `serde_json::Value`.
//!
//! It also reads `null` as an empty list or map, since Go clients send `"Tags": null`.
//!
//! Where a struct is expected, anything but an object (an array, a string, a number, `null`)
//! is an error saying "expected a JSON object". Unknown keys are ignored, as Consul's API
//! does; [`from_value_strict`] refuses them instead, naming the key (config files).

use serde::de::{self, DeserializeOwned, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;

/// A JSON body that could not be decoded, with the path of the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", path_prefix(.path))]
pub struct DecodeError {
    /// Dotted path of the field that failed (`Service.Proxy.Upstreams[0].LocalBindPort`);
    /// empty when the document itself is malformed.
    pub path: String,
    /// What was wrong with it.
    pub message: String,
}

fn path_prefix(path: &str) -> String {
    if path.is_empty() || path == "." {
        String::new()
    } else {
        format!("{path}: ")
    }
}

/// Decodes `T` from JSON bytes, accepting any key casing (see the module docs).
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| DecodeError {
        path: String::new(),
        message: format!("invalid JSON: {e}"),
    })?;
    from_value(value)
}

/// Decodes `T` from an already parsed JSON value, accepting any key casing.
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, DecodeError> {
    decode(Lenient(value, false))
}

/// Like [`from_value`], but a key that names no field of its struct is an error naming it
/// (keys of maps, such as `Meta` or `Proxy.Config`, are the user's and stay free).
pub fn from_value_strict<T: DeserializeOwned>(value: Value) -> Result<T, DecodeError> {
    decode(Lenient(value, true))
}

fn decode<T: DeserializeOwned>(de: Lenient) -> Result<T, DecodeError> {
    serde_path_to_error::deserialize(de).map_err(|e| {
        // A key that could not be read ends the path with `?`: the message names it.
        let path = e.path().to_string();
        let path = path
            .strip_suffix(".?")
            .or_else(|| path.strip_suffix('?'))
            .unwrap_or(&path);
        DecodeError {
            path: path.to_owned(),
            message: e.inner().to_string(),
        }
    })
}

/// Folds a key for comparison: lowercase, without `_` and `-`.
fn fold_eq(key: &str, field: &str) -> bool {
    let mut a = key.chars().filter(|c| *c != '_' && *c != '-');
    let mut b = field.chars().filter(|c| *c != '_' && *c != '-');
    loop {
        match (a.next(), b.next()) {
            (None, None) => return true,
            (Some(x), Some(y)) if x.eq_ignore_ascii_case(&y) => {}
            _ => return false,
        }
    }
}

/// The field name `key` stands for among `fields`, or `key` itself when none matches.
fn canonical_key(key: String, fields: &'static [&'static str]) -> String {
    if fields.contains(&key.as_str()) {
        return key;
    }
    match fields.iter().find(|f| fold_eq(&key, f)) {
        Some(f) => (*f).to_owned(),
        None => key,
    }
}

/// A deserializer over a JSON value that matches struct keys leniently (see module docs);
/// with `strict`, unknown struct keys are refused.
pub struct Lenient(pub Value, bool);

impl Lenient {
    /// A lenient deserializer over `value` (unknown struct keys ignored).
    pub fn new(value: Value) -> Self {
        Self(value, false)
    }
}

/// What a value that is not an object is, for "expected a JSON object".
fn not_an_object(value: &Value) -> serde_json::Error {
    let what = match value {
        Value::Null => de::Unexpected::Unit,
        Value::Bool(b) => de::Unexpected::Bool(*b),
        Value::Number(_) => de::Unexpected::Other("number"),
        Value::String(s) => de::Unexpected::Str(s),
        Value::Array(_) => de::Unexpected::Other("array"),
        Value::Object(_) => de::Unexpected::Map,
    };
    de::Error::invalid_type(what, &"a JSON object")
}

macro_rules! forward_to_value {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            self.0.$method(visitor)
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Lenient {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        let strict = self.1;
        match self.0 {
            Value::Object(map) => visitor.visit_map(Entries::raw(map, strict)),
            Value::Array(items) => visitor.visit_seq(Items(items.into_iter(), strict)),
            other => other.deserialize_any(visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Object(map) => visitor.visit_map(Entries::fields(map, fields, self.1)),
            other => Err(not_an_object(&other)),
        }
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        let strict = self.1;
        match self.0 {
            Value::Object(map) => visitor.visit_map(Entries::raw(map, strict)),
            Value::Null => visitor.visit_map(Entries::raw(Map::new(), strict)),
            other => other.deserialize_map(visitor),
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        let strict = self.1;
        match self.0 {
            Value::Array(items) => visitor.visit_seq(Items(items.into_iter(), strict)),
            Value::Null => visitor.visit_seq(Items(Vec::new().into_iter(), strict)),
            other => other.deserialize_seq(visitor),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            other => visitor.visit_some(Lenient(other, self.1)),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_enum(name, variants, visitor)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, Self::Error> {
        self.0.deserialize_unit_struct(name, visitor)
    }

    forward_to_value! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char deserialize_str
        deserialize_string deserialize_bytes deserialize_byte_buf deserialize_unit
        deserialize_identifier deserialize_ignored_any
    }
}

impl<'de> IntoDeserializer<'de, serde_json::Error> for Lenient {
    type Deserializer = Self;
    fn into_deserializer(self) -> Self {
        self
    }
}

/// Object entries; keys are matched against `fields` when decoding a struct (and, when
/// `strict`, a key matching none is an error).
struct Entries {
    iter: serde_json::map::IntoIter,
    fields: Option<&'static [&'static str]>,
    pending: Option<Value>,
    strict: bool,
}

impl Entries {
    fn raw(map: Map<String, Value>, strict: bool) -> Self {
        Self {
            iter: map.into_iter(),
            fields: None,
            pending: None,
            strict,
        }
    }
    fn fields(map: Map<String, Value>, fields: &'static [&'static str], strict: bool) -> Self {
        Self {
            iter: map.into_iter(),
            fields: Some(fields),
            pending: None,
            strict,
        }
    }
}

impl<'de> MapAccess<'de> for Entries {
    type Error = serde_json::Error;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Self::Error> {
        // A struct field given as `null` is absent (Go clients send unset pointers so): its
        // default applies. A map's `null` values are the user's and stay.
        let next = if self.fields.is_some() {
            self.iter.by_ref().find(|(_, v)| !v.is_null())
        } else {
            self.iter.next()
        };
        let Some((key, value)) = next else {
            return Ok(None);
        };
        self.pending = Some(value);
        let key = match self.fields {
            Some(fields) => {
                let key = canonical_key(key, fields);
                if self.strict && !fields.contains(&key.as_str()) {
                    return Err(de::Error::custom(format!("unknown key {key:?}")));
                }
                key
            }
            None => key,
        };
        seed.deserialize(Value::String(key)).map(Some)
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Self::Error> {
        let value = self.pending.take().unwrap_or(Value::Null);
        seed.deserialize(Lenient(value, self.strict))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

struct Items(std::vec::IntoIter<Value>, bool);

impl<'de> SeqAccess<'de> for Items {
    type Error = serde_json::Error;

    fn next_element_seed<T: de::DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Self::Error> {
        match self.0.next() {
            Some(v) => seed.deserialize(Lenient(v, self.1)).map(Some),
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

/// Serde helpers for Consul's conventions on output.
pub mod ser {
    use serde::{Serialize, Serializer};

    /// `skip_serializing_if` predicate for default values (Consul omits empty optionals).
    pub fn is_default<T: Default + PartialEq>(v: &T) -> bool {
        *v == T::default()
    }

    /// An empty map or list as `null`, where Consul writes a nil one (a field without
    /// `omitempty`); read back with [`super::read::null_as_default`].
    pub fn null_if_empty<S: Serializer, T>(value: &T, s: S) -> Result<S::Ok, S::Error>
    where
        T: Serialize + ?Sized,
        for<'a> &'a T: IntoIterator,
    {
        if value.into_iter().next().is_none() {
            s.serialize_none()
        } else {
            value.serialize(s)
        }
    }
}

/// Serde helpers for reading Consul's conventions back.
pub mod read {
    use serde::{Deserialize, Deserializer};

    /// `null` as the empty value (what [`super::ser::null_if_empty`] writes for it).
    pub fn null_as_default<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(d: D) -> Result<T, D::Error> {
        Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
    }
}

impl fmt::Debug for Lenient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Lenient").field(&self.0).finish()
    }
}

#[cfg(test)]
mod tests;
