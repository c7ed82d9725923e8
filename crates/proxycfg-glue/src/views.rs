//! Shared materialized views: when many proxies watch the same thing, the value derived from
//! the catalog is computed once per change and the same `Arc` is handed to all of them.

use bounded_maps::ClearingCache;
use std::convert::Infallible;
use std::{hash::Hash, sync::Arc};

/// Values keyed by the request they answer, stamped with the versions (topic indexes) of the
/// inputs they were derived from.
pub(crate) struct Views<K, V> {
    entries: ClearingCache<K, Vec<u64>, Arc<V>>,
}

impl<K, V> Default for Views<K, V> {
    fn default() -> Self {
        Self {
            entries: ClearingCache::new(CAPACITY),
        }
    }
}

/// Entries kept at most; when full, the cache starts over (values are cheap to derive again).
const CAPACITY: usize = 65_536;

impl<K: Hash + Eq + Clone, V> Views<K, V> {
    /// The value for `key` at input `versions`, derived by `make` unless already there.
    pub(crate) fn get_or_make(&self, key: &K, versions: &[u64], make: impl FnOnce() -> V) -> Arc<V> {
        let made = self
            .entries
            .get_or_try_make(key.clone(), versions.to_vec(), || Ok::<_, Infallible>(Arc::new(make())));
        match made {
            Ok(value) => value,
            Err(never) => match never {},
        }
    }
}
