//! A map kept as a vector sorted by key. A stream's status holds a few types and a few dozen
//! resources of each, for as long as the stream lives: in a vector they take their own size
//! (and a little slack), where a B-tree's nodes, sized for 11 entries, took several hundred
//! bytes to a few KiB each however few they held.
//!
//! Lookups are binary searches; an insertion shifts what sorts after it, which is nothing
//! when keys come in order (a response's resources do).

use std::borrow::Borrow;

/// Entries sorted by key, each key once.
#[derive(Debug)]
pub(super) struct SortedMap<K, V>(Vec<(K, V)>);

impl<K, V> Default for SortedMap<K, V> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<K: Ord, V> SortedMap<K, V> {
    fn find<Q: Ord + ?Sized>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
    {
        self.0.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    pub(super) fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.find(key).ok().map(|at| &self.0[at].1)
    }

    pub(super) fn get_mut<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        self.find(key).ok().map(|at| &mut self.0[at].1)
    }

    pub(super) fn contains_key<Q: Ord + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.find(key).is_ok()
    }

    /// Sets `key`'s value; the value it had, if any.
    pub(super) fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.find(&key) {
            Ok(at) => Some(std::mem::replace(&mut self.0[at].1, value)),
            Err(at) => {
                self.0.insert(at, (key, value));
                None
            }
        }
    }

    pub(super) fn remove<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        self.find(key).ok().map(|at| self.0.remove(at).1)
    }

    pub(super) fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        self.0.retain_mut(|(k, v)| keep(k, v));
    }

    /// Gives back spare capacity once it is more than a quarter of the size, keeping an
    /// eighth: the next insertions then fit without moving the entries again (shrunk to the
    /// size exactly, each new key made the vector grow, and be shrunk, once more).
    pub(super) fn trim(&mut self) {
        let len = self.0.len();
        if self.0.capacity() > len + len / 4 + 1 {
            self.0.shrink_to(len + len / 8 + 1);
        }
    }
}

impl<K, V> SortedMap<K, V> {
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = &K> {
        self.0.iter().map(|(k, _)| k)
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }

    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.0.iter_mut().map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::SortedMap;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8, u32),
        Remove(u8),
        RetainEven,
        Trim,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (any::<u8>(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k % 40, v)),
            any::<u8>().prop_map(|k| Op::Remove(k % 40)),
            Just(Op::RetainEven),
            Just(Op::Trim),
        ]
    }

    proptest! {
        /// Whatever is done to it, it holds what a B-tree map would, in the same order.
        #[test]
        fn behaves_as_a_btree_map(ops in proptest::collection::vec(op(), 0..200)) {
            let (mut sorted, mut btree) = (SortedMap::default(), BTreeMap::new());
            for op in ops {
                match op {
                    Op::Insert(k, v) => prop_assert_eq!(sorted.insert(k, v), btree.insert(k, v)),
                    Op::Remove(k) => prop_assert_eq!(sorted.remove(&k), btree.remove(&k)),
                    Op::RetainEven => {
                        sorted.retain(|_, v| *v % 2 == 0);
                        btree.retain(|_, v| *v % 2 == 0);
                    }
                    Op::Trim => sorted.trim(),
                }
                prop_assert!(sorted.iter().map(|(k, v)| (*k, *v)).eq(btree.iter().map(|(k, v)| (*k, *v))));
                for k in 0..40u8 {
                    prop_assert_eq!(sorted.get(&k), btree.get(&k));
                    prop_assert_eq!(sorted.contains_key(&k), btree.contains_key(&k));
                }
                prop_assert_eq!(sorted.len(), btree.len());
            }
        }
    }
}
