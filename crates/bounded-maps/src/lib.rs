//! Maps that bound their own size without a background task.
//!
//! - [`SweptMap`]: entries die on their own (a `Weak` whose value was dropped, a channel
//!   nobody listens to); dead ones are swept when the map has doubled since the last sweep,
//!   so the cost of a sweep is spread over as many inserts as it visits.
//! - [`ClearingCache`]: values stamped with the version of their inputs, computed once per
//!   version and shared; when full it starts over (values are cheap to compute again).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::Hash;
use std::ops::{Deref, DerefMut};

/// The smallest size at which a map is swept.
const FIRST_SWEEP: usize = 1024;

/// When to sweep a collection whose entries die on their own: once its size reaches twice
/// what survived the previous sweep (and at least 1,024).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepSchedule {
    next: usize,
}

impl Default for SweepSchedule {
    fn default() -> Self {
        Self { next: FIRST_SWEEP }
    }
}

impl SweepSchedule {
    /// True when a collection of `len` entries is due for a sweep.
    pub fn due(&self, len: usize) -> bool {
        len >= self.next
    }

    /// Records a sweep that left `len` entries.
    pub fn swept(&mut self, len: usize) {
        self.next = (len * 2).max(FIRST_SWEEP);
    }
}

/// A `HashMap` whose dead entries are swept when it has doubled. Reads and writes go through
/// `Deref`; inserts that may grow the map go through [`SweptMap::insert`] or
/// [`SweptMap::sweep_if_due`].
#[derive(Debug)]
pub struct SweptMap<K, V> {
    map: HashMap<K, V>,
    schedule: SweepSchedule,
}

impl<K, V> Default for SweptMap<K, V> {
    fn default() -> Self {
        Self {
            map: HashMap::new(),
            schedule: SweepSchedule::default(),
        }
    }
}

impl<K: Hash + Eq, V> SweptMap<K, V> {
    /// Removes the entries `alive` rejects if the map is due for a sweep.
    pub fn sweep_if_due(&mut self, alive: impl FnMut(&K, &mut V) -> bool) {
        if self.schedule.due(self.map.len()) {
            self.map.retain(alive);
            self.schedule.swept(self.map.len());
        }
    }

    /// Inserts `value` under `key`, sweeping first if due.
    pub fn insert(&mut self, key: K, value: V, alive: impl FnMut(&K, &mut V) -> bool) -> Option<V> {
        self.sweep_if_due(alive);
        self.map.insert(key, value)
    }
}

impl<K, V> Deref for SweptMap<K, V> {
    type Target = HashMap<K, V>;
    fn deref(&self) -> &HashMap<K, V> {
        &self.map
    }
}

impl<K, V> DerefMut for SweptMap<K, V> {
    fn deref_mut(&mut self) -> &mut HashMap<K, V> {
        &mut self.map
    }
}

/// Values computed from versioned inputs, shared while the version holds. At most
/// `capacity` entries; when full the cache is cleared.
pub struct ClearingCache<K, S, V> {
    capacity: usize,
    entries: Mutex<HashMap<K, (S, V)>>,
}

impl<K, S, V> ClearingCache<K, S, V> {
    /// An empty cache of at most `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq, S: PartialEq, V: Clone> ClearingCache<K, S, V> {
    /// The value of `key` at version `stamp`, computed by `make` (outside the lock) unless
    /// the cache holds it for that version.
    pub fn get_or_try_make<E>(&self, key: K, stamp: S, make: impl FnOnce() -> Result<V, E>) -> Result<V, E> {
        if let Some((at, value)) = self.entries.lock().get(&key)
            && *at == stamp
        {
            return Ok(value.clone());
        }
        let value = make()?;
        let mut entries = self.entries.lock();
        if entries.len() >= self.capacity {
            entries.clear();
        }
        entries.insert(key, (stamp, value.clone()));
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::sync::{Arc, Weak};

    #[test]
    fn a_swept_map_sweeps_dead_entries_once_it_doubles() {
        let mut map: SweptMap<usize, Weak<()>> = SweptMap::default();
        let alive = |_: &usize, w: &mut Weak<()>| w.strong_count() > 0;
        let keep: Vec<Arc<()>> = (0..10).map(|_| Arc::new(())).collect();
        for (i, k) in keep.iter().enumerate() {
            map.insert(i, Arc::downgrade(k), alive);
        }
        for i in 10..FIRST_SWEEP {
            map.insert(i, Weak::new(), alive);
        }
        assert_eq!(map.len(), FIRST_SWEEP, "no sweep below the first threshold");
        map.insert(FIRST_SWEEP, Weak::new(), alive);
        assert_eq!(map.len(), 11, "the sweep kept the live entries and the new one");
        // The next sweep waits until the map reaches 1,024 again (twice 11 is less).
        assert!(!map.schedule.due(1023));
        assert!(map.schedule.due(1024));
    }

    #[test]
    fn a_clearing_cache_shares_per_version_and_starts_over_when_full() {
        let cache: ClearingCache<&str, u64, Arc<String>> = ClearingCache::new(2);
        let make = |s: &str| {
            let s = s.to_owned();
            move || Ok::<_, Infallible>(Arc::new(s))
        };
        let a1 = cache.get_or_try_make("a", 1, make("a1")).unwrap_or_default();
        let again = cache.get_or_try_make("a", 1, make("other")).unwrap_or_default();
        assert!(Arc::ptr_eq(&a1, &again), "same version, same value");
        let a2 = cache.get_or_try_make("a", 2, make("a2")).unwrap_or_default();
        assert_eq!(*a2, "a2", "a new version is computed");
        cache.get_or_try_make("b", 1, make("b")).unwrap_or_default();
        cache.get_or_try_make("c", 1, make("c")).unwrap_or_default();
        assert_eq!(cache.entries.lock().len(), 1, "cleared when full, then the new entry");
        let failed: Result<Arc<String>, &str> = cache.get_or_try_make("d", 1, || Err("no"));
        assert_eq!(failed, Err("no"));
    }
}
