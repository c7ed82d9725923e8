//! Encode once: many clients blocking on the same query wake at the same index and must get
//! the same bytes, so the body is computed and encoded by the first and shared by the rest.
//!
//! A body is keyed by the request (path and every query parameter except `index` and `wait`)
//! and valid for exactly one index of the query's key: everything the answer depends on bumps
//! that key, so an equal index means an equal answer.

use axum::body::Bytes;
use bounded_maps::ClearingCache;
use structs::Index;

/// Entries kept at most; the cache is cleared when full (answers are cheap to recompute).
const CAPACITY: usize = 4096;

pub(crate) struct ResponseCache {
    entries: ClearingCache<String, Index, (Bytes, bool)>,
}

impl Default for ResponseCache {
    fn default() -> Self {
        Self {
            entries: ClearingCache::new(CAPACITY),
        }
    }
}

impl ResponseCache {
    /// The cache key of a request: path plus its parameters, minus the blocking ones.
    pub(crate) fn key(path: &str, params: &crate::query::Params) -> String {
        let mut key = path.to_owned();
        for (k, v) in params.iter().filter(|(k, _)| !matches!(k.as_str(), "index" | "wait")) {
            key.push('\u{1f}');
            key.push_str(k);
            key.push('=');
            key.push_str(v);
        }
        key
    }

    /// The body for `key` at `index` (and whether ACLs filtered it), computing and storing
    /// it if it is not there.
    pub(crate) fn get_or_encode<E>(
        &self,
        key: String,
        index: Index,
        encode: impl FnOnce() -> Result<(Bytes, bool), E>,
    ) -> Result<(Bytes, bool), E> {
        self.entries.get_or_try_make(key, index, encode)
    }
}
