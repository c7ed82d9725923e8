//! Planning session writes, and locks in the KV store: creating a session (its node and
//! checks must exist, its checks must not be critical), renewing it, destroying it (its
//! locks released or their keys deleted, per its behavior, and a lock delay set on each),
//! invalidating the sessions whose TTL ran out or whose node or checks went, and acquiring or
//! releasing a key's lock.

use crate::error::WriteError;
use crate::plan::Plan;
use crate::state::{Change, State};
use std::sync::Arc;
use structs::session::{Behavior, Session};
use structs::{HealthStatus, KvEntry, Problem, ValidationError};

fn invalid(field: &str, why: String) -> WriteError {
    ValidationError::new(field, Problem::Invalid(why)).into()
}

/// A new session: refused naming the field when its node or a check is missing, or a check
/// is critical (as Consul refuses it).
pub(crate) fn plan_create(state: &State, session: &Session) -> Result<Plan, WriteError> {
    if state.node(&session.node).is_none() {
        return Err(invalid("Node", format!("Missing node registration {:?}", session.node)));
    }
    if state.session(&session.id).is_some() {
        return Err(invalid("ID", format!("session {:?} exists", session.id)));
    }
    if let Some(why) = broken_binding(state, session) {
        return Err(invalid("Checks", why));
    }
    Ok(Plan::write(vec![Change::PutSession(session.clone())]))
}

/// Why `session` can no longer hold locks, if it cannot: its node or a check of it is gone,
/// or a check is critical.
fn broken_binding(state: &State, session: &Session) -> Option<String> {
    if state.node(&session.node).is_none() {
        return Some(format!("node {:?} is gone", session.node));
    }
    let service_checks = session.service_checks.iter().map(|c| &c.id);
    for id in session.node_checks.iter().chain(service_checks) {
        match state.check(&session.node, id) {
            None => return Some(format!("Missing check '{id}' registration")),
            Some(c) if c.status == HealthStatus::Critical => {
                return Some(format!("Check '{id}' is in critical state"));
            }
            Some(_) => {}
        }
    }
    None
}

/// A renewal at `now_ms`: the TTL starts again. An unknown session is a 404.
pub(crate) fn plan_renew(state: &State, id: &str, now_ms: u64) -> Result<Plan, WriteError> {
    let Some(existing) = state.session(id) else {
        return Err(WriteError::NotFound(format!("Session id '{id}' not found")));
    };
    let mut renewed = (*existing).clone();
    renewed.renewed_at_ms = now_ms;
    Ok(Plan::write(vec![Change::PutSession(renewed)]))
}

/// The end of a session at `now_ms` (nothing for one already gone).
pub(crate) fn plan_destroy(state: &State, id: &str, now_ms: u64) -> Plan {
    let mut changes = Vec::new();
    if let Some(session) = state.session(id) {
        end(state, &session, now_ms, &mut changes);
    }
    Plan::write(changes)
}

fn end(state: &State, session: &Arc<Session>, now_ms: u64, changes: &mut Vec<Change>) {
    changes.push(Change::DeleteSession(session.id.clone()));
    // Prepared queries bound to the session go with it, as Consul.
    changes.extend(
        state
            .queries()
            .filter(|q| q.session == session.id)
            .map(|q| Change::DeleteQuery(q.id.clone())),
    );
    let delay_ms = u64::try_from(session.lock_delay.0.as_millis()).unwrap_or(u64::MAX);
    for entry in state.kv_held_by(&session.id) {
        match session.behavior {
            Behavior::Release => {
                let mut released = (**entry).clone();
                released.session.clear();
                changes.push(Change::PutKv(released));
            }
            Behavior::Delete => changes.push(Change::DeleteKv(entry.key.clone())),
        }
        if delay_ms > 0 {
            changes.push(Change::PutLockDelay {
                key: entry.key.clone(),
                until_ms: now_ms.saturating_add(delay_ms),
            });
        }
    }
}

/// About how many changes one invalidation write makes at most (etcd's default
/// transaction limit is 128 keys).
const INVALIDATE_CHANGES_PER_WRITE: usize = 100;

/// Leader work at `now_ms`: every session whose TTL ran out, or whose node or checks went
/// or turned critical, ends; lock delays that are over are dropped. Nothing due writes
/// nothing.
pub(crate) fn plan_invalidate(state: &State, now_ms: u64) -> Plan {
    let mut changes = Vec::new();
    for session in state.sessions() {
        // Many sessions ending at once (a node with hundreds of them died) take several
        // writes: over etcd one write must fit one transaction. The reaper goes on at once.
        if changes.len() >= INVALIDATE_CHANGES_PER_WRITE {
            break;
        }
        let expired = session.expires_at_ms().is_some_and(|at| at <= now_ms);
        if expired || broken_binding(state, session).is_some() {
            end(state, session, now_ms, &mut changes);
        }
    }
    for (key, until_ms) in state.lock_delays() {
        if *until_ms <= now_ms {
            changes.push(Change::DeleteLockDelay(key.clone()));
        }
    }
    Plan::write(changes)
}

/// `PUT /v1/kv/:key?acquire=<session>`: `false` (nothing written) when another session holds
/// the key or its lock delay is not over; taking it counts a new lock (`LockIndex`), while
/// the holder writing again keeps it.
pub(crate) fn plan_lock(state: &State, entry: KvEntry, session: &str, now_ms: u64) -> Result<Plan, WriteError> {
    if state.session(session).is_none() {
        return Err(invalid("acquire", format!("invalid session {session:?}")));
    }
    if state.lock_delay(&entry.key).is_some_and(|until| until > now_ms) {
        return Ok(Plan::refused());
    }
    let existing = state.kv_get(&entry.key);
    let mut entry = entry;
    match existing.as_deref() {
        Some(e) if e.session == session => entry.lock_index = e.lock_index,
        Some(e) if !e.session.is_empty() => return Ok(Plan::refused()),
        Some(e) => entry.lock_index = e.lock_index + 1,
        None => entry.lock_index = 1,
    }
    entry.session = session.to_owned();
    Ok(Plan::write(vec![Change::PutKv(entry)]))
}

/// `PUT /v1/kv/:key?release=<session>`: `false` unless that session holds the key; the value
/// is written and the lock let go.
pub(crate) fn plan_unlock(state: &State, entry: KvEntry, session: &str) -> Plan {
    let Some(existing) = state.kv_get(&entry.key) else {
        return Plan::refused();
    };
    if existing.session != session {
        return Plan::refused();
    }
    let mut entry = entry;
    entry.lock_index = existing.lock_index;
    entry.session.clear();
    Plan::write(vec![Change::PutKv(entry)])
}

#[cfg(test)]
mod tests;
