//! Encodings shared between proxies' builds.

use super::{BuildError, ENDPOINT, Resources};
use crate::content::Versioned;
use bounded_maps::SweptMap;
use envoy_types::pb::google::protobuf::Any;
use parking_lot::Mutex;
use std::any::Any as AnyValue;
use std::sync::{Arc, Weak};
use structs::CheckServiceNode;

/// A shared part of builds: its inputs, whether they are still in use, the part, and
/// whether a build took it since the last sweep.
struct PartEntry {
    inputs: Box<dyn AnyValue + Send + Sync>,
    in_use: fn(&(dyn AnyValue + Send + Sync)) -> bool,
    part: Arc<Resources>,
    taken: bool,
}

/// A shared part that followed another through a change: the part before (weak: the entry
/// goes with it), the change, and the part after.
struct Transition {
    from: Weak<Resources>,
    change: Box<dyn AnyValue + Send + Sync>,
    to: Arc<Resources>,
}

/// Load assignment key: the cluster name and the identity of the shared endpoints result.
type ClaKey = (String, usize);

/// A resource by content: its type URL and the SHA-256 of its encoding.
type ContentKey = (&'static str, [u8; 32]);

/// The endpoints a load assignment was built from and the encoding (both weak: the cache
/// keeps nothing alive).
type ClaEntry = (Weak<Vec<CheckServiceNode>>, Weak<Versioned>);

/// Encoded resources shared between proxies, held weakly (the proxies' resource sets keep
/// them alive):
/// - load assignments by cluster name and endpoints: the data sources hand every proxy
///   watching a target the same endpoints `Arc`, so one build and encoding serves them all;
/// - every other resource by type and content hash: the cluster of an upstream, the CA
///   bundle secret, an outbound listener on the same port are byte-for-byte the same for many
///   proxies, and each such resource is then held once however many proxies have it.
#[derive(Default)]
pub struct SharedEncodings {
    load_assignments: Mutex<SweptMap<ClaKey, ClaEntry>>,
    interned: Mutex<SweptMap<ContentKey, Weak<Versioned>>>,
    /// Parts of builds that many proxies make alike (a transparent proxy's outbound part,
    /// the same for every proxy of a service) by their inputs' hash: the inputs, what tells
    /// whether they are still in use, and the part.
    parts: Mutex<SweptMap<u64, PartEntry>>,
    /// Which part followed which through which change (by the hash of both): a proxy whose
    /// previous build took a part, its inputs changed as another proxy's did, takes the
    /// part that one found, without computing its inputs whole.
    transitions: Mutex<SweptMap<u64, Transition>>,
}

impl std::fmt::Debug for SharedEncodings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedEncodings")
            .field("load_assignments", &self.load_assignments.lock().len())
            .finish()
    }
}

impl SharedEncodings {
    /// The encoded load assignment of `cluster` for `endpoints`, built by `make` if needed.
    pub(crate) fn load_assignment(
        &self,
        cluster: &str,
        endpoints: &Arc<Vec<CheckServiceNode>>,
        make: impl FnOnce() -> Any,
    ) -> Arc<Versioned> {
        let key = (cluster.to_owned(), Arc::as_ptr(endpoints) as usize);
        if let Some((weak, v)) = self.load_assignments.lock().get(&key)
            && weak.upgrade().is_some_and(|e| Arc::ptr_eq(&e, endpoints))
            && let Some(v) = v.upgrade()
        {
            return v;
        }
        let versioned = self.intern(ENDPOINT, make());
        self.load_assignments.lock().insert(
            key,
            (Arc::downgrade(endpoints), Arc::downgrade(&versioned)),
            |_, (w, v)| w.strong_count() > 0 && v.strong_count() > 0,
        );
        versioned
    }

    /// The resource of `type_url` encoded as `resource`: the `Arc` another proxy already
    /// holds for the same encoding, else this one's, recorded for the next.
    pub(crate) fn intern(&self, type_url: &'static str, resource: Any) -> Arc<Versioned> {
        let digest = crate::content::digest_of(&resource);
        let key = (type_url, digest);
        if let Some(v) = self.interned.lock().get(&key).and_then(Weak::upgrade) {
            return v;
        }
        let versioned = Arc::new(Versioned::with_digest(resource, &digest));
        self.interned
            .lock()
            .insert(key, Arc::downgrade(&versioned), |_, w| w.strong_count() > 0);
        versioned
    }

    /// `part` with its resources encoded and hashed once, held by content here: the many
    /// proxies taking a shared part then share them as they are (no copy of their bytes, no
    /// hash of them again).
    pub(crate) fn interned(&self, mut part: Resources) -> Resources {
        for (type_url, resources) in std::mem::take(&mut part.by_type) {
            let held = part.shared.entry(type_url).or_default();
            for (name, resource) in resources {
                held.insert(name, self.intern(type_url, resource));
            }
        }
        part
    }

    /// The part of a build made from `inputs` (hashed as `key`): another proxy's with the
    /// same inputs, else `build`'s (recorded for the next; a failed build is not). A sweep
    /// keeps the entries taken since the previous one whose inputs `in_use` finds still in
    /// use: inputs a change left behind go, even while what they name lives on.
    pub(crate) fn part<T: PartialEq + Send + Sync + 'static>(
        &self,
        key: u64,
        inputs: T,
        in_use: fn(&(dyn AnyValue + Send + Sync)) -> bool,
        build: impl FnOnce() -> Result<Resources, BuildError>,
    ) -> Result<Arc<Resources>, BuildError> {
        if let Some(entry) = self.parts.lock().get_mut(&key)
            && entry.inputs.downcast_ref::<T>() == Some(&inputs)
        {
            entry.taken = true;
            return Ok(Arc::clone(&entry.part));
        }
        let part = Arc::new(build()?);
        let entry = PartEntry {
            inputs: Box::new(inputs),
            in_use,
            part: Arc::clone(&part),
            taken: true,
        };
        self.parts.lock().insert(key, entry, |_, e| {
            std::mem::take(&mut e.taken) && (e.in_use)(e.inputs.as_ref())
        });
        Ok(part)
    }

    /// The part that followed `from` through `change` (hashed as `key`, `from`'s address
    /// included), if another build found it.
    pub(crate) fn part_after<T: PartialEq + Send + Sync + 'static>(
        &self,
        from: &Arc<Resources>,
        key: u64,
        change: &T,
    ) -> Option<Arc<Resources>> {
        let transitions = self.transitions.lock();
        let t = transitions.get(&key)?;
        let same_from = t.from.upgrade().is_some_and(|f| Arc::ptr_eq(&f, from));
        (same_from && t.change.downcast_ref::<T>() == Some(change)).then(|| Arc::clone(&t.to))
    }

    /// Records that `to` followed `from` through `change` (see [`Self::part_after`]).
    pub(crate) fn record_after<T: PartialEq + Send + Sync + 'static>(
        &self,
        from: &Arc<Resources>,
        key: u64,
        change: T,
        to: &Arc<Resources>,
    ) {
        let t = Transition {
            from: Arc::downgrade(from),
            change: Box::new(change),
            to: Arc::clone(to),
        };
        self.transitions.lock().insert(key, t, |_, t| t.from.strong_count() > 0);
    }

    /// Drops now every shared part whose inputs no proxy uses any more (inserts do so as the
    /// map grows), and with it the resources only it held.
    pub fn sweep_unused_parts(&self) {
        self.parts.lock().retain(|_, e| (e.in_use)(e.inputs.as_ref()));
        self.transitions.lock().retain(|_, t| t.from.strong_count() > 0);
    }

    /// Distinct resources held by content (not counting load assignments).
    pub fn interned_len(&self) -> usize {
        self.interned.lock().values().filter(|w| w.strong_count() > 0).count()
    }

    /// Load assignments held now.
    pub fn len(&self) -> usize {
        self.load_assignments.lock().len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn always(_: &(dyn AnyValue + Send + Sync)) -> bool {
        true
    }

    /// A part is built once for the same inputs; parts no build took since the last sweep
    /// go at the next one, however alive their inputs say they are.
    #[test]
    fn shared_parts_are_built_once_and_swept_once_nobody_takes_them() {
        let shared = SharedEncodings::default();
        let mut builds = 0;
        let take = |inputs: u64, builds: &mut usize| {
            shared
                .part(inputs, inputs, always, || {
                    *builds += 1;
                    Ok(Resources::default())
                })
                .map(|_| ())
        };
        for i in 0..1024 {
            take(i, &mut builds).unwrap();
        }
        take(7, &mut builds).unwrap();
        assert_eq!(builds, 1024, "the same inputs take the part built before");
        // The next insert sweeps: everything was taken since the start, so all stay.
        take(5000, &mut builds).unwrap();
        assert_eq!(shared.parts.lock().len(), 1025);
        // Of the first ones only part 7 is taken again before the next sweep (due at twice
        // what survived: 2,048 parts).
        take(7, &mut builds).unwrap();
        for i in 0..1100 {
            take(10_000 + i, &mut builds).unwrap();
        }
        assert_eq!(builds, 1024 + 1 + 1100, "part 7 was not built again");
        let parts = shared.parts.lock();
        assert!(parts.contains_key(&7), "taken since the last sweep");
        assert!(!parts.contains_key(&8), "not taken since the last sweep");
        assert_eq!(parts.len(), 2 + 1100, "7, 5000 and the new ones");
    }
}
