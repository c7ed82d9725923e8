//! Resources with content versions: what a stream diffs against what the proxy has.

pub use crate::content::Versioned;

use crate::resources::{self, Resources};
use proxycfg::ConfigSnapshot;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The resources of one type by name.
pub type TypeResources = BTreeMap<Arc<str>, Arc<Versioned>>;

/// Every resource of a snapshot by type URL then name, with versions. Built once per
/// snapshot and shared by every stream of the proxy.
#[derive(Debug, Clone, Default)]
pub struct VersionedResources {
    /// type URL → name → resource. Each type's map is shared (`Arc`): a build that reuses a
    /// type from the previous one shares the very map, which tells a stream's protocol state
    /// that nothing of that type can have changed.
    pub by_type: BTreeMap<&'static str, Arc<TypeResources>>,
    /// The snapshot these were built from (when built from one): the next build of the same
    /// proxy compares its inputs with it to reuse what cannot have changed.
    pub snapshot: Option<Arc<ConfigSnapshot>>,
    /// Parts of the snapshot that could not be built (by upstream): their resources are the
    /// last good ones, or absent if there never were any.
    pub problems: BTreeMap<String, String>,
    /// The resources the failed parts keep from the last good build (part, type, name).
    keep: Vec<(String, &'static str, String)>,
    /// The shared outbound part (a transparent proxy's) among these resources.
    outbound_part: Option<Arc<Resources>>,
    /// How these were built.
    path: BuildPath,
}

/// How a build of a proxy's resources went: what it built, and what it took from the
/// proxy's previous build.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BuildPath {
    /// Every resource built (the first build, or one after a proxy-wide change).
    #[default]
    Whole,
    /// Only load assignments built; the rest is the previous build's.
    Endpoints,
    /// The changed upstreams (and outbound listener) built; the other parts' resources
    /// taken from the previous build by name.
    Parts,
    /// The changed upstreams (and outbound listener) built into the previous build's maps,
    /// which hold everything else already.
    Patched,
}

impl VersionedResources {
    /// Hashes every resource of `resources`; with `shared`, a resource some other proxy
    /// already has (same type and encoding) is that proxy's very `Arc`, stored once.
    pub fn from_resources(resources: Resources, shared: Option<&resources::SharedEncodings>) -> Self {
        let (problems, keep, outbound_part) = (resources.problems, resources.keep, resources.outbound_part);
        let mut by_type: BTreeMap<&'static str, TypeResources> = resources
            .by_type
            .into_iter()
            .map(|(t, m)| {
                (
                    t,
                    m.into_iter()
                        .map(|(name, resource)| {
                            let v = match shared {
                                Some(shared) => shared.intern(t, resource),
                                None => Arc::new(Versioned::new(resource)),
                            };
                            (Arc::<str>::from(name), v)
                        })
                        .collect(),
                )
            })
            .collect();
        for (t, m) in resources.shared {
            by_type
                .entry(t)
                .or_default()
                .extend(m.into_iter().map(|(n, v)| (Arc::<str>::from(n), v)));
        }
        Self {
            by_type: by_type.into_iter().map(|(t, m)| (t, Arc::new(m))).collect(),
            snapshot: None,
            problems,
            keep,
            outbound_part,
            path: BuildPath::Whole,
        }
    }

    /// How these resources were built.
    pub fn path(&self) -> BuildPath {
        self.path
    }

    /// `previous` (built from `prev_snap`) with the resources `changed` built again replaced
    /// by `built`'s: the work is the size of the change, where taking every other part's
    /// resources by name ([`Self::take_parts`]) is the size of the proxy. `Err` gives
    /// `built` back where the result could differ from a full build: a part failed now or
    /// before (failed parts keep resources by name), a datacenter problem is reported (made
    /// afresh by every build), or a resource of a superseded part is not made again (a kept
    /// part may make it too: only the walk by name knows).
    fn patched(
        previous: &VersionedResources,
        prev_snap: &ConfigSnapshot,
        changed: &resources::Changed<'_, '_>,
        built: Resources,
        shared: Option<&resources::SharedEncodings>,
    ) -> Result<Self, Resources> {
        let clean = |p: &BTreeMap<String, String>, k: &[(String, &'static str, String)]| p.is_empty() && k.is_empty();
        if !clean(&previous.problems, &previous.keep) || !clean(&built.problems, &built.keep) {
            return Err(built);
        }
        let made = |type_url: &str, name: &str| {
            built.by_type.get(type_url).is_some_and(|m| m.contains_key(name))
                || built.shared.get(type_url).is_some_and(|m| m.contains_key(name))
        };
        if changed.outbound {
            let Some(part) = &previous.outbound_part else {
                return Err(built);
            };
            if !part.shared.iter().all(|(t, m)| m.keys().all(|n| made(t, n))) {
                return Err(built);
            }
        }
        if !changed.superseded_names(prev_snap).iter().all(|(t, n)| made(t, n)) {
            return Err(built);
        }
        let fresh = Self::from_resources(built, shared);
        let mut by_type = previous.by_type.clone();
        for (type_url, resources) in fresh.by_type {
            let map = by_type.entry(type_url).or_default();
            let new: Vec<(Arc<str>, Arc<Versioned>)> = resources
                .iter()
                .filter(|(n, v)| !map.get(&**n).is_some_and(|old| Arc::ptr_eq(old, v)))
                .map(|(n, v)| (Arc::clone(n), Arc::clone(v)))
                .collect();
            if !new.is_empty() {
                // An existing name keeps its key: the previous build's very name.
                Arc::make_mut(map).extend(new);
            }
        }
        Ok(Self {
            by_type,
            snapshot: None,
            problems: BTreeMap::new(),
            keep: Vec::new(),
            outbound_part: match changed.outbound {
                true => fresh.outbound_part,
                false => previous.outbound_part.clone(),
            },
            path: BuildPath::Patched,
        })
    }

    /// Copies into this build the last good version (from `previous`) of every resource a
    /// failed part keeps.
    fn keep_from(&mut self, previous: Option<&VersionedResources>) {
        let Some(previous) = previous else { return };
        // The clusters the last good listener and route send to stay too (they may not be
        // the ones the new chain names).
        if let Some(prev_snap) = previous.snapshot.as_deref() {
            let failed: Vec<String> = self.problems.keys().cloned().collect();
            for part in failed {
                for (type_url, name) in resources::part_names(prev_snap, &part) {
                    if self.get(type_url, &name).is_none()
                        && !self.keep.iter().any(|(_, t, n)| *t == type_url && *n == name)
                    {
                        self.keep.push((part.clone(), type_url, name));
                    }
                }
            }
        }
        for (_, type_url, name) in &self.keep {
            if let Some(v) = previous.get(type_url, name) {
                Arc::make_mut(self.by_type.entry(type_url).or_default())
                    .insert(Arc::from(name.as_str()), Arc::clone(v));
            }
        }
    }

    /// Takes the load assignments named in `names` from `previous` (with its very names),
    /// where this build has none of its own.
    fn take_endpoints(&mut self, previous: &VersionedResources, names: Vec<&str>) {
        let Some(before) = previous.by_type.get(resources::ENDPOINT).filter(|_| !names.is_empty()) else {
            return;
        };
        let map = Arc::make_mut(self.by_type.entry(resources::ENDPOINT).or_default());
        for name in names {
            if let Some((key, v)) = before.get_key_value(name) {
                map.entry(Arc::clone(key)).or_insert_with(|| Arc::clone(v));
            }
        }
    }

    /// Takes the resources of `parts` from `previous` (a build whose inputs for those parts
    /// are the same), with their problems and kept resources.
    fn take_parts(&mut self, previous: &VersionedResources, prev_snap: &ConfigSnapshot, parts: &[String]) {
        let names = resources::parts_names(prev_snap, parts);
        let kept = previous
            .keep
            .iter()
            .filter(|(p, _, _)| parts.contains(p))
            .map(|(_, t, n)| (*t, n.as_str()));
        for (type_url, name) in names.iter().map(|(t, n)| (*t, n.as_str())).chain(kept) {
            // The previous build's very name, shared: streams comparing names find them
            // equal by pointer.
            if let Some((key, v)) = previous.by_type.get(type_url).and_then(|m| m.get_key_value(name)) {
                Arc::make_mut(self.by_type.entry(type_url).or_default())
                    .entry(Arc::clone(key))
                    .or_insert_with(|| Arc::clone(v));
            }
        }
        for part in parts {
            let kept = previous.keep.iter().filter(|(p, _, _)| p == part);
            if let Some(problem) = previous.problems.get(part) {
                self.problems.insert(part.clone(), problem.clone());
            }
            if part == resources::OUTBOUND {
                // The outbound part's problems are by upstream: `<part> <upstream>`.
                let prefix = format!("{part} ");
                for (key, problem) in previous.problems.iter().filter(|(k, _)| k.starts_with(&prefix)) {
                    self.problems.insert(key.clone(), problem.clone());
                }
            }
            self.keep.extend(kept.cloned());
        }
        // A type whose resources are all the previous build's very ones shares its map, which
        // tells streams that nothing of that type changed.
        for (type_url, map) in self.by_type.iter_mut() {
            if let Some(prev) = previous.by_type.get(type_url)
                && prev.len() == map.len()
                && prev
                    .iter()
                    .zip(map.iter())
                    .all(|((pn, pv), (n, v))| pn == n && Arc::ptr_eq(pv, v))
            {
                *map = Arc::clone(prev);
            }
        }
    }

    /// Builds and hashes the resources of a snapshot; shared resources come from `shared`.
    pub fn build(
        snapshot: &ConfigSnapshot,
        shared: Option<&resources::SharedEncodings>,
    ) -> Result<Self, resources::BuildError> {
        resources::build_shared(snapshot, shared).map(|r| Self::from_resources(r, shared))
    }

    /// Like [`Self::build`], but when `previous` was built from a snapshot of the same proxy
    /// that differs only in endpoints, reuses its clusters, listeners and routes (no build,
    /// encode or hash) and builds only the load assignments. The result equals a full build.
    pub fn build_after(
        snapshot: &Arc<ConfigSnapshot>,
        shared: Option<&resources::SharedEncodings>,
        previous: Option<&VersionedResources>,
    ) -> Result<Self, resources::BuildError> {
        let reusable = previous.filter(|p| {
            p.snapshot
                .as_ref()
                .is_some_and(|prev| resources::same_except_endpoints(prev, snapshot))
        });
        let mut built = match reusable {
            Some(prev) => {
                let mut by_type = prev.by_type.clone();
                // Only the load assignments whose endpoints changed are built; the others are
                // the previous build's (its snapshot has the same chains, so the same names).
                let changed = match prev.snapshot.as_deref() {
                    Some(prev_snap) => resources::build_endpoints_since(snapshot, prev_snap, shared)?,
                    None => resources::build_endpoints(snapshot, shared)?,
                };
                let endpoints = Self::from_resources(changed, shared);
                if let Some(new) = endpoints.by_type.get(resources::ENDPOINT) {
                    let map = Arc::make_mut(by_type.entry(resources::ENDPOINT).or_default());
                    for (name, v) in new.iter() {
                        map.insert(name.clone(), Arc::clone(v));
                    }
                }
                let mut problems = prev.problems.clone();
                resources::refresh_datacenter_problems(snapshot, &mut problems);
                Self {
                    by_type,
                    snapshot: None,
                    problems,
                    keep: prev.keep.clone(),
                    outbound_part: prev.outbound_part.clone(),
                    path: BuildPath::Endpoints,
                }
            }
            None => {
                let changed = previous
                    .and_then(|p| Some((p, p.snapshot.as_deref()?)))
                    .and_then(|(p, prev_snap)| {
                        Some((
                            p,
                            prev_snap,
                            resources::build_changed(snapshot, prev_snap, p.outbound_part.as_ref(), shared)?,
                        ))
                    });
                match changed {
                    // Same proxy-wide inputs: only the upstreams whose chain changed are built.
                    Some((prev, prev_snap, (changed, built))) => {
                        match Self::patched(prev, prev_snap, &changed, built?, shared) {
                            Ok(patched) => patched,
                            Err(built) => {
                                let mut built = Self::from_resources(built, shared);
                                built.take_endpoints(prev, changed.unchanged_endpoints());
                                built.keep_from(previous);
                                built.take_parts(prev, prev_snap, &changed.reused());
                                if !changed.outbound {
                                    built.outbound_part = prev.outbound_part.clone();
                                }
                                built.path = BuildPath::Parts;
                                built
                            }
                        }
                    }
                    None => {
                        let mut built = Self::build(snapshot, shared)?;
                        built.keep_from(previous);
                        built
                    }
                }
            }
        };
        built.snapshot = Some(Arc::clone(snapshot));
        Ok(built)
    }

    /// The shared map of one type's resources.
    pub fn map(&self, type_url: &str) -> Option<&Arc<TypeResources>> {
        self.by_type.get(type_url)
    }

    /// The resources of one type (empty if none).
    pub fn of(&self, type_url: &str) -> impl Iterator<Item = (&str, &Arc<Versioned>)> {
        self.by_type
            .get(type_url)
            .into_iter()
            .flat_map(|m| m.iter().map(|(n, v)| (&**n, v)))
    }

    /// One resource.
    pub fn get(&self, type_url: &str, name: &str) -> Option<&Arc<Versioned>> {
        self.by_type.get(type_url).and_then(|m| m.get(name))
    }
}

/// Test resources from `(type URL, name, encoded body)` triples.
#[cfg(test)]
pub(crate) fn test_resources(items: &[(&'static str, &str, &[u8])]) -> VersionedResources {
    use envoy_types::pb::google::protobuf::Any;
    let mut r = Resources::default();
    for (t, name, body) in items {
        r.by_type.entry(t).or_default().insert(
            (*name).to_owned(),
            Any {
                type_url: (*t).to_owned(),
                value: body.to_vec(),
            },
        );
    }
    VersionedResources::from_resources(r, None)
}
