//! The local state's maps behind its lock, with the indexes kept beside them (each parent's
//! sidecars, each service's checks), so lookups by service never scan every entry.

use super::entries::{LocalCheck, LocalService};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Default)]
pub(super) struct Inner {
    /// Boxed: a B-tree node holds eleven values inline whether used or not, and these are
    /// large (10,000 services: about 8 MB of empty slots unboxed).
    pub(super) services: BTreeMap<String, Box<LocalService>>,
    /// The ids of each parent's sidecars (`LocalService::sidecar_of`), kept with `services`:
    /// looked up at every registration, which must not scan every service.
    pub(super) sidecars: BTreeMap<String, BTreeSet<String>>,
    /// The ids of each service's checks (`""`: the node's), kept with `checks`: a
    /// registration reads its service's checks, which must not scan every check.
    pub(super) checks_by_service: BTreeMap<String, BTreeSet<String>>,
    pub(super) checks: BTreeMap<String, Box<LocalCheck>>,
    pub(super) deleted_services: BTreeSet<String>,
    pub(super) deleted_checks: BTreeSet<String>,
    pub(super) generation: u64,
    /// Whether a full sync has compared with the catalog yet (checks adopt the catalog's
    /// status in that first one only).
    pub(super) reconciled: bool,
}

impl Inner {
    pub(super) fn next(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }

    pub(super) fn insert_service(&mut self, id: String, svc: LocalService) {
        if let Some(parent) = &svc.sidecar_of {
            self.sidecars.entry(parent.clone()).or_default().insert(id.clone());
        }
        if let Some(old) = self.services.insert(id.clone(), Box::new(svc)) {
            self.unlink_sidecar(&id, &old, true);
        }
    }

    pub(super) fn insert_check(&mut self, id: String, check: LocalCheck) {
        self.checks_by_service
            .entry(check.check.service_id.clone())
            .or_default()
            .insert(id.clone());
        if let Some(old) = self.checks.insert(id.clone(), Box::new(check)) {
            let moved = self
                .checks
                .get(&id)
                .is_some_and(|c| c.check.service_id != old.check.service_id);
            if moved {
                self.unindex_check(&id, &old.check.service_id);
            }
        }
    }

    pub(super) fn remove_check(&mut self, id: &str) -> Option<LocalCheck> {
        let old = self.checks.remove(id)?;
        self.unindex_check(id, &old.check.service_id);
        Some(*old)
    }

    pub(super) fn unindex_check(&mut self, id: &str, service: &str) {
        if let Some(ids) = self.checks_by_service.get_mut(service) {
            ids.remove(id);
            if ids.is_empty() {
                self.checks_by_service.remove(service);
            }
        }
    }

    /// The checks of `service` (`""`: the node's).
    pub(super) fn checks_of_service<'a>(&'a self, service: &str) -> impl Iterator<Item = &'a LocalCheck> + 'a {
        self.checks_by_service
            .get(service)
            .into_iter()
            .flatten()
            .filter_map(|id| self.checks.get(id).map(|c| &**c))
    }

    pub(super) fn remove_service(&mut self, id: &str) -> Option<LocalService> {
        let old = self.services.remove(id)?;
        self.unlink_sidecar(id, &old, false);
        Some(*old)
    }

    /// Drops `id` from the sidecar index under `old`'s parent (unless the service that
    /// replaced it, `replaced`, has the same parent).
    pub(super) fn unlink_sidecar(&mut self, id: &str, old: &LocalService, replaced: bool) {
        let Some(parent) = &old.sidecar_of else { return };
        if replaced && self.services.get(id).and_then(|s| s.sidecar_of.as_ref()) == Some(parent) {
            return;
        }
        if let Some(ids) = self.sidecars.get_mut(parent) {
            ids.remove(id);
            if ids.is_empty() {
                self.sidecars.remove(parent);
            }
        }
    }
}
