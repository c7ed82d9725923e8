//! The agent's local state: the services and checks registered on this node, each with a
//! generation so anti-entropy knows what the catalog has not seen yet, and the ids removed
//! locally that the catalog still has to forget.
//!
//! One exclusive lock guards it; no I/O happens under it. Every change bumps a version on a
//! `watch` channel (alias checks and the sync loop wait on it).

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use structs::agent::CheckType;
use structs::{HealthCheck, HealthStatus, NodeService, Token};
use tokio::sync::watch;
use tokio::time::Instant;

mod entries;
mod inner;
pub use entries::{LocalCheck, LocalService, Managed, Source};
use inner::Inner;

/// Largest check output kept, bytes; longer output is cut at a character boundary.
pub const MAX_OUTPUT: usize = 4 * 1024;

/// What stands for an HTTP check's header value in the check the state keeps: the values
/// (credentials, often) stay in the check's definition, which runs it, and never reach the
/// catalog nor a reader who may not write the check's service.
pub const HIDDEN: &str = "<hidden>";

fn hide_header_values(header: &mut BTreeMap<String, Vec<String>>) {
    for value in header.values_mut().flatten() {
        HIDDEN.clone_into(value);
    }
}

/// A service to push, at the generation it was read at, with its checks and theirs.
pub type PendingService = (NodeService, u64, Vec<(HealthCheck, u64)>);

/// What anti-entropy has to push: copies taken under the lock, with the generation each was
/// read at, so a change made while a push is in flight is pushed again.
#[derive(Debug, Default, Clone)]
pub struct Pending {
    /// Services out of sync, with their checks.
    pub services: Vec<PendingService>,
    /// Node checks and checks whose service is in sync, out of sync themselves.
    pub checks: Vec<(HealthCheck, u64)>,
    /// Services to remove from the catalog.
    pub deleted_services: Vec<String>,
    /// Checks to remove from the catalog.
    pub deleted_checks: Vec<String>,
}

impl Pending {
    /// True when the catalog has everything.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
            && self.checks.is_empty()
            && self.deleted_services.is_empty()
            && self.deleted_checks.is_empty()
    }
}

/// The services and checks of this node (see the module docs).
pub struct LocalState {
    node: String,
    inner: Mutex<Inner>,
    /// Bumped on every change.
    version: watch::Sender<u64>,
    /// Bumped when services are added, replaced or removed (not when only checks change):
    /// what follows the services alone is not woken by every check's report.
    services_version: watch::Sender<u64>,
}

impl std::fmt::Debug for LocalState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalState")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// The output a check keeps: its `OutputMaxSize` when smaller than [`MAX_OUTPUT`].
fn output_limit(definition: Option<&CheckType>) -> usize {
    match definition.map(|d| d.output_max_size as usize) {
        Some(n) if n > 0 => n.min(MAX_OUTPUT),
        _ => MAX_OUTPUT,
    }
}

fn cap_output(mut output: String, limit: usize) -> String {
    if output.len() > limit {
        let mut end = limit;
        while !output.is_char_boundary(end) {
            end -= 1;
        }
        output.truncate(end);
    }
    output
}

impl LocalState {
    /// Empty state for `node`.
    pub fn new(node: impl Into<String>) -> Self {
        Self {
            node: node.into(),
            inner: Mutex::new(Inner::default()),
            version: watch::channel(0).0,
            services_version: watch::channel(0).0,
        }
    }

    /// This agent's node name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Waits for changes: the value is bumped on every change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// The current change count (what [`LocalState::subscribe`] sees).
    pub fn version(&self) -> u64 {
        *self.version.borrow()
    }

    /// Waits for changes of the services only (see [`LocalState::subscribe`]).
    pub fn subscribe_services(&self) -> watch::Receiver<u64> {
        self.services_version.subscribe()
    }

    fn changed(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    fn services_changed(&self) {
        self.services_version.send_modify(|v| *v += 1);
        self.changed();
    }

    /// Adds or replaces services and checks in one step, and removes `remove_checks`.
    pub fn apply(&self, services: Vec<LocalService>, checks: Vec<LocalCheck>, remove_checks: &[String]) {
        let services_changed = !services.is_empty();
        {
            let mut inner = self.inner.lock();
            for id in remove_checks {
                if inner.remove_check(id).is_some() {
                    inner.deleted_checks.insert(id.clone());
                }
            }
            for mut svc in services {
                svc.generation = inner.next();
                svc.synced = 0;
                let id = svc.service.id.clone();
                inner.deleted_services.remove(&id);
                inner.insert_service(id, svc);
            }
            for mut check in checks {
                check.check.node.clone_from(&self.node);
                hide_header_values(&mut check.check.definition.header);
                let limit = output_limit(check.definition.as_ref());
                check.check.output = cap_output(std::mem::take(&mut check.check.output), limit);
                check.generation = inner.next();
                check.synced = 0;
                let id = check.check.check_id.clone();
                inner.deleted_checks.remove(&id);
                inner.insert_check(id, check);
            }
        }
        if services_changed {
            self.services_changed();
        } else {
            self.changed();
        }
    }

    /// Removes a service and every check of it; returns the removed check ids, or `None` when
    /// there was no such service.
    pub fn remove_service(&self, id: &str) -> Option<Vec<String>> {
        let removed = {
            let mut inner = self.inner.lock();
            inner.remove_service(id)?;
            inner.deleted_services.insert(id.to_owned());
            let ids: Vec<String> = inner.checks_of_service(id).map(|c| c.check.check_id.clone()).collect();
            for c in &ids {
                inner.remove_check(c);
                // The catalog drops a service's checks with it.
                inner.deleted_checks.remove(c);
            }
            ids
        };
        self.services_changed();
        Some(removed)
    }

    /// Removes one check; false when there was none.
    pub fn remove_check(&self, id: &str) -> bool {
        let found = {
            let mut inner = self.inner.lock();
            let found = inner.remove_check(id).is_some();
            if found {
                inner.deleted_checks.insert(id.to_owned());
            }
            found
        };
        if found {
            self.changed();
        }
        found
    }

    /// Sets a check's status and output (capped at its `OutputMaxSize`, at most
    /// [`MAX_OUTPUT`]); a no-op when
    /// neither changed. False when the check does not exist.
    ///
    /// A new status is pushed to the catalog at once (partial sync). New output under the same
    /// status is kept locally and reaches the catalog with the next full sync: checks whose
    /// output changes every run (timestamps, counters) would otherwise write to the servers
    /// at every interval.
    pub fn update_check(&self, id: &str, status: HealthStatus, output: String) -> bool {
        let changed = {
            let mut inner = self.inner.lock();
            let generation = inner.generation + 1;
            let Some(c) = inner.checks.get_mut(id) else {
                return false;
            };
            let output = cap_output(output, output_limit(c.definition.as_ref()));
            c.ran = true;
            if c.check.status == status {
                c.check.output = output;
                false
            } else {
                if status == HealthStatus::Critical {
                    c.critical_since.get_or_insert_with(Instant::now);
                } else {
                    c.critical_since = None;
                }
                c.check.status = status;
                c.check.output = output;
                c.generation = generation;
                inner.generation = generation;
                true
            }
        };
        if changed {
            self.changed();
        }
        true
    }

    /// A copy of one service.
    pub fn service(&self, id: &str) -> Option<LocalService> {
        self.inner.lock().services.get(id).map(|s| (**s).clone())
    }

    /// Copies of every service, by id.
    pub fn services(&self) -> BTreeMap<String, LocalService> {
        self.inner
            .lock()
            .services
            .iter()
            .map(|(id, s)| (id.clone(), (**s).clone()))
            .collect()
    }

    /// The ids of the services `keep` selects, in id order.
    pub fn service_ids_where(&self, keep: impl Fn(&LocalService) -> bool) -> Vec<String> {
        self.inner
            .lock()
            .services
            .iter()
            .filter(|(_, s)| keep(s))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Copies of the checks `keep` selects (only those are copied), in id order.
    pub fn checks_where(&self, keep: impl Fn(&LocalCheck) -> bool) -> Vec<LocalCheck> {
        self.inner
            .lock()
            .checks
            .values()
            .filter(|c| keep(c))
            .map(|c| (**c).clone())
            .collect()
    }

    /// Copies of the checks of services that are not registered.
    pub fn orphan_checks(&self) -> Vec<LocalCheck> {
        let inner = self.inner.lock();
        inner
            .checks_by_service
            .iter()
            .filter(|(service, _)| !service.is_empty() && !inner.services.contains_key(*service))
            .flat_map(|(_, ids)| ids.iter().filter_map(|id| inner.checks.get(id)).map(|c| (**c).clone()))
            .collect()
    }

    /// Copies of the services `keep` selects (only those are copied), in id order.
    pub fn services_where(&self, keep: impl Fn(&LocalService) -> bool) -> Vec<LocalService> {
        self.inner
            .lock()
            .services
            .values()
            .filter(|s| keep(s))
            .map(|s| (**s).clone())
            .collect()
    }

    /// The port of every service, by id (for sidecar port allocation).
    pub fn ports(&self) -> BTreeMap<String, u16> {
        self.inner
            .lock()
            .services
            .iter()
            .map(|(id, s)| (id.clone(), s.service.port))
            .collect()
    }

    /// The listener ports of every exposed path of the proxies here but `except`.
    pub fn exposed_ports(&self, except: &str) -> std::collections::BTreeSet<u16> {
        self.inner
            .lock()
            .services
            .iter()
            .filter(|(id, _)| id.as_str() != except)
            .flat_map(|(_, s)| s.service.proxy.expose.paths.iter().map(|p| p.listener_port))
            .collect()
    }

    /// The ids of the sidecars registered for `parent`.
    pub fn sidecars_of(&self, parent: &str) -> Vec<String> {
        self.inner
            .lock()
            .sidecars
            .get(parent)
            .map(|ids| ids.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Copies of the checks of the given services, by id.
    pub fn checks_of(&self, services: &[String]) -> BTreeMap<String, LocalCheck> {
        let inner = self.inner.lock();
        services
            .iter()
            .flat_map(|s| inner.checks_of_service(s))
            .map(|c| (c.check.check_id.clone(), c.clone()))
            .collect()
    }

    /// A copy of one check.
    pub fn check(&self, id: &str) -> Option<LocalCheck> {
        self.inner.lock().checks.get(id).map(|c| (**c).clone())
    }

    /// Copies of every check, by id.
    pub fn checks(&self) -> BTreeMap<String, LocalCheck> {
        self.inner
            .lock()
            .checks
            .iter()
            .map(|(id, c)| (id.clone(), (**c).clone()))
            .collect()
    }

    /// The checks of one service instance.
    pub fn service_checks(&self, service_id: &str) -> Vec<HealthCheck> {
        self.inner
            .lock()
            .checks_of_service(service_id)
            .map(|c| c.check.clone())
            .collect()
    }

    /// Number of services and checks.
    pub fn counts(&self) -> (usize, usize) {
        let inner = self.inner.lock();
        (inner.services.len(), inner.checks.len())
    }

    /// The registration token of service `id` (none: none, or no such service).
    pub fn token_of(&self, id: &str) -> Option<Token> {
        if id.is_empty() {
            return None;
        }
        self.service(id).and_then(|s| s.token)
    }

    /// What anti-entropy still has to push.
    pub fn pending(&self) -> Pending {
        let inner = self.inner.lock();
        let mut out = Pending {
            deleted_services: inner.deleted_services.iter().cloned().collect(),
            deleted_checks: inner.deleted_checks.iter().cloned().collect(),
            ..Pending::default()
        };
        let unsynced = |c: &&LocalCheck| c.generation != c.synced;
        for (id, s) in &inner.services {
            let checks = inner.checks_of_service(id);
            if s.generation != s.synced {
                let checks = checks.map(|c| (c.check.clone(), c.generation)).collect();
                out.services.push((s.service.clone(), s.generation, checks));
            } else {
                out.checks
                    .extend(checks.filter(unsynced).map(|c| (c.check.clone(), c.generation)));
            }
        }
        // Node checks, and checks whose service is gone (the catalog refuses those until the
        // next full sync sorts it out).
        for service in inner.checks_by_service.keys() {
            if !inner.services.contains_key(service) {
                out.checks.extend(
                    inner
                        .checks_of_service(service)
                        .filter(unsynced)
                        .map(|c| (c.check.clone(), c.generation)),
                );
            }
        }
        out
    }

    /// The checks an alias of `service` follows: the instance's own and the node's, except
    /// `exclude` (the alias itself); `None` when the instance is not registered.
    pub fn alias_view(&self, service: &str, exclude: &str) -> Option<Vec<HealthCheck>> {
        let inner = self.inner.lock();
        inner.services.get(service)?;
        let mut view: Vec<HealthCheck> = inner
            .checks_of_service(service)
            .chain(inner.checks_of_service(""))
            .filter(|c| c.check.check_id != exclude)
            .map(|c| c.check.clone())
            .collect();
        view.sort_by(|a, b| a.check_id.cmp(&b.check_id));
        Some(view)
    }

    /// True while an alias of `service` has nothing to say yet: before the first sync, a check
    /// of the service has not run (it may still take the catalog's status). The alias then
    /// keeps its own status rather than pushing one computed from initial statuses.
    pub fn alias_pending(&self, service: &str, exclude: &str) -> bool {
        let inner = self.inner.lock();
        !inner.reconciled
            && inner
                .checks_of_service(service)
                .any(|c| c.check.check_id != exclude && !c.ran && c.kind.is_some())
    }

    /// Records that the catalog has the service as of `generation` (ignored if it changed since).
    pub fn mark_service_synced(&self, id: &str, generation: u64) {
        if let Some(s) = self.inner.lock().services.get_mut(id)
            && s.generation == generation
        {
            s.synced = generation;
        }
    }

    /// Records that the catalog has the check as of `generation`.
    pub fn mark_check_synced(&self, id: &str, generation: u64) {
        if let Some(c) = self.inner.lock().checks.get_mut(id)
            && c.generation == generation
        {
            c.synced = generation;
        }
    }

    /// Records that the catalog no longer has the service (unless it was registered again).
    pub fn mark_service_deleted(&self, id: &str) {
        self.inner.lock().deleted_services.remove(id);
    }

    /// Records that the catalog no longer has the check.
    pub fn mark_check_deleted(&self, id: &str) {
        self.inner.lock().deleted_checks.remove(id);
    }

    /// Full sync: compares the catalog's entries of this node with ours. Entries that differ
    /// are marked out of sync, entries we do not have are queued for removal (except the
    /// checks the server owns, named in `server_owned`).
    pub fn reconcile(&self, remote_services: &[NodeService], remote_checks: &[HealthCheck], server_owned: &[&str]) {
        let mut inner = self.inner.lock();
        let remote_svcs: BTreeMap<&str, &NodeService> = remote_services.iter().map(|s| (s.id.as_str(), s)).collect();
        let remote_chks: BTreeMap<&str, &HealthCheck> =
            remote_checks.iter().map(|c| (c.check_id.as_str(), c)).collect();
        let mut tags_adopted = false;
        for (id, s) in inner.services.iter_mut() {
            match remote_svcs.get(id.as_str()) {
                Some(r) => {
                    if s.service.enable_tag_override && s.service.tags != r.tags {
                        s.service.tags.clone_from(&r.tags);
                        tags_adopted = true;
                    }
                    s.synced = if same_service(&s.service, r) { s.generation } else { 0 };
                }
                None => s.synced = 0,
            }
        }
        // Checks registered before the first sync (loaded from disk or config files at start)
        // that have not run yet keep the status the catalog has for them (the same check),
        // instead of pushing their initial one: a restart does not flap a healthy service.
        let first = !inner.reconciled;
        inner.reconciled = true;
        let mut adopted = false;
        for (id, c) in inner.checks.iter_mut() {
            if let Some(r) = remote_chks.get(id.as_str())
                && first
                && !c.ran
                && c.kind.is_some()
                && c.check.status != r.status
                && same_check(
                    &HealthCheck {
                        status: r.status,
                        output: r.output.clone(),
                        ..c.check.clone()
                    },
                    r,
                )
            {
                c.check.status = r.status;
                c.check.output.clone_from(&r.output);
                c.critical_since = (r.status == HealthStatus::Critical).then(Instant::now);
                adopted = true;
            }
            c.synced = match remote_chks.get(id.as_str()) {
                Some(r) if same_check(&c.check, r) => c.generation,
                _ => 0,
            };
        }
        let gone_services: BTreeSet<String> = remote_svcs
            .keys()
            .filter(|id| !inner.services.contains_key(**id))
            .map(|id| (*id).to_owned())
            .collect();
        let gone_checks: Vec<String> = remote_chks
            .iter()
            .filter(|(id, c)| {
                !inner.checks.contains_key(**id)
                    && !server_owned.contains(id)
                    // A service's checks go with it.
                    && !gone_services.contains(&c.service_id)
            })
            .map(|(id, _)| (*id).to_owned())
            .collect();
        inner.deleted_services.extend(gone_services);
        inner.deleted_checks.extend(gone_checks);
        drop(inner);
        if tags_adopted {
            // EnableTagOverride: the catalog's tags are the service's now.
            self.services_changed();
        } else if adopted || first {
            // Alias checks waited for this first comparison; they follow what they alias.
            self.changed();
        }
    }
}

/// Equal apart from what the catalog stamps.
fn same_service(local: &NodeService, remote: &NodeService) -> bool {
    let mut r = remote.clone();
    r.create_index = local.create_index;
    r.modify_index = local.modify_index;
    r.connect.sidecar_service = None;
    *local == r
}

/// Equal in what the agent decides (the catalog fills in node and service details).
fn same_check(local: &HealthCheck, remote: &HealthCheck) -> bool {
    local.name == remote.name
        && local.status == remote.status
        && local.notes == remote.notes
        && local.output == remote.output
        && local.service_id == remote.service_id
        && local.check_type == remote.check_type
        && local.definition == remote.definition
}

#[cfg(test)]
mod tests;
