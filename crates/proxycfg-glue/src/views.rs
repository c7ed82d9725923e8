//! Shared materialized views: when many proxies watch the same thing, the value derived from
//! the catalog is computed once per change and the same `Arc` is handed to all of them.

use parking_lot::Mutex;
use std::{collections::HashMap, hash::Hash, sync::Arc};

/// A derived value and the input versions (topic indexes) it was derived from.
type Versioned<V> = (Vec<u64>, Arc<V>);

/// Values keyed by what they were derived from: the request and the versions of its inputs.
pub(crate) struct Views<K, V> {
    entries: Mutex<HashMap<K, Versioned<V>>>,
}

impl<K, V> Default for Views<K, V> {
    fn default() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

/// Entries kept at most; when full, the cache starts over (values are cheap to derive again).
const CAPACITY: usize = 65_536;

impl<K: Hash + Eq + Clone, V> Views<K, V> {
    /// The value for `key` at input `versions`, derived by `make` unless already there.
    pub(crate) fn get_or_make(&self, key: &K, versions: &[u64], make: impl FnOnce() -> V) -> Arc<V> {
        if let Some((at, value)) = self.entries.lock().get(key)
            && at.as_slice() == versions
        {
            return Arc::clone(value);
        }
        let value = Arc::new(make());
        let mut entries = self.entries.lock();
        if entries.len() >= CAPACITY {
            entries.clear();
        }
        entries.insert(key.clone(), (versions.to_vec(), Arc::clone(&value)));
        value
    }
}
