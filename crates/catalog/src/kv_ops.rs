//! Planning KV writes: set (with check-and-set), delete (with check-and-set) and delete of a
//! whole prefix, with Consul's answers.

use crate::error::WriteError;
use crate::plan::Plan;
use crate::state::{Change, State};
use structs::kv::{KvError, MAX_VALUE};
use structs::{Index, KvEntry};

/// `PUT /v1/kv/:key`: the key gets `value` and `flags`. With `cas`, only if the key's
/// ModifyIndex is `cas` (0: only if it does not exist); otherwise nothing is written and the
/// answer is `false`. A held lock (session, lock index) is kept, as Consul.
pub(crate) fn plan_set(
    state: &State,
    key: &str,
    value: &[u8],
    flags: u64,
    cas: Option<Index>,
) -> Result<Plan, WriteError> {
    if key.is_empty() {
        return Err(KvError::MissingKey.into());
    }
    if value.len() > MAX_VALUE {
        return Err(KvError::TooLarge.into());
    }
    let existing = state.kv_get(key);
    if let Some(cas) = cas
        && existing.as_ref().map_or(Index(0), |e| e.modify_index) != cas
    {
        return Ok(Plan::refused());
    }
    let entry = KvEntry {
        key: key.to_owned(),
        value: value.to_vec(),
        flags,
        lock_index: existing.as_ref().map_or(0, |e| e.lock_index),
        session: existing.as_ref().map(|e| e.session.clone()).unwrap_or_default(),
        ..KvEntry::default()
    };
    Ok(Plan::write(vec![Change::PutKv(entry)]))
}

/// Refuses an empty key or a value over the limit.
pub(crate) fn check_entry(key: &str, value: &[u8]) -> Result<(), WriteError> {
    if key.is_empty() {
        return Err(KvError::MissingKey.into());
    }
    if value.len() > MAX_VALUE {
        return Err(KvError::TooLarge.into());
    }
    Ok(())
}

/// `DELETE /v1/kv/:key`: removes the key (absent is no error). With `cas`, only if the
/// key's ModifyIndex is `cas`; a key already gone matches any `cas`, as Consul.
pub(crate) fn plan_delete(state: &State, key: &str, cas: Option<Index>) -> Result<Plan, WriteError> {
    if key.is_empty() {
        return Err(KvError::MissingKey.into());
    }
    let Some(existing) = state.kv_get(key) else {
        return Ok(Plan::write(Vec::new()));
    };
    if cas.is_some_and(|cas| cas != existing.modify_index) {
        return Ok(Plan::refused());
    }
    Ok(Plan::write(vec![Change::DeleteKv(key.to_owned())]))
}

/// `DELETE /v1/kv/:prefix?recurse`: every key starting with `prefix` (all of them for "").
pub(crate) fn plan_delete_tree(state: &State, prefix: &str) -> Plan {
    Plan::write(
        state
            .kv_range(prefix)
            .map(|e| Change::DeleteKv(e.key.clone()))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(state: &mut State, plan: &Plan) {
        let index = state.index.next();
        state.apply(index, &plan.changes);
    }

    #[test]
    fn check_and_set_and_delete_follow_consul() {
        let mut s = State::default();
        // cas=0 creates only when absent.
        let p = plan_set(&s, "a", b"1", 7, Some(Index(0))).unwrap();
        assert!(p.applied);
        apply(&mut s, &p);
        let a = s.kv_get("a").unwrap();
        assert_eq!((a.flags, a.create_index, a.modify_index), (7, Index(1), Index(1)));
        assert!(!plan_set(&s, "a", b"2", 0, Some(Index(0))).unwrap().applied);
        assert!(!plan_set(&s, "a", b"2", 0, Some(Index(9))).unwrap().applied);
        let p = plan_set(&s, "a", b"2", 0, Some(Index(1))).unwrap();
        apply(&mut s, &p);
        let a = s.kv_get("a").unwrap();
        assert_eq!(
            (a.value.as_slice(), a.create_index, a.modify_index),
            (&b"2"[..], Index(1), Index(2))
        );
        // Delete with a stale cas is refused; a missing key deletes fine.
        assert!(!plan_delete(&s, "a", Some(Index(1))).unwrap().applied);
        assert!(plan_delete(&s, "gone", Some(Index(5))).unwrap().applied);
        let p = plan_delete(&s, "a", Some(Index(2))).unwrap();
        apply(&mut s, &p);
        assert!(s.kv_get("a").is_none());
        assert_eq!(
            plan_set(&s, "", b"", 0, None).unwrap_err().to_string(),
            "Missing key name"
        );
        let big = vec![0; MAX_VALUE + 1];
        assert_eq!(
            plan_set(&s, "b", &big, 0, None).unwrap_err().to_string(),
            "Value exceeds 524288 byte limit"
        );
    }

    #[test]
    fn a_prefix_index_moves_on_deletes_and_never_back() {
        let mut s = State::default();
        for key in ["app/a", "app/b", "other"] {
            let p = plan_set(&s, key, b"v", 0, None).unwrap();
            apply(&mut s, &p);
        }
        assert_eq!(s.kv_prefix_index("app/"), Index(2));
        assert_eq!(s.kv_prefix_index("other"), Index(3));
        // Nothing under a prefix: the table's index.
        assert_eq!(s.kv_prefix_index("none/"), Index(3));
        let p = plan_delete(&s, "app/b", None).unwrap();
        apply(&mut s, &p);
        assert_eq!(s.kv_prefix_index("app/"), Index(4), "the delete moved the prefix on");
        assert_eq!(s.kv_prefix_index("other"), Index(3), "other prefixes did not move");
        let p = plan_delete_tree(&s, "app/");
        apply(&mut s, &p);
        assert_eq!(s.kv_range("app/").count(), 0);
        assert_eq!(s.kv_prefix_index("app/"), Index(5));
        // Recreating keeps the index moving forward; the tombstone goes.
        let p = plan_set(&s, "app/b", b"v", 0, None).unwrap();
        apply(&mut s, &p);
        assert_eq!(s.kv_prefix_index("app/"), Index(6));
    }

    #[test]
    fn tombstones_are_bounded_and_reaping_never_moves_an_index_back() {
        let mut s = State::default();
        let p = plan_set(&s, "keep/x", b"v", 0, None).unwrap();
        apply(&mut s, &p);
        let mut last = Index(0);
        let bound = super::super::state::KV_TOMBSTONES_FOR_TESTS;
        for i in 0..(bound + 10) {
            let key = format!("churn/{i}");
            let p = plan_set(&s, &key, b"v", 0, None).unwrap();
            apply(&mut s, &p);
            let p = plan_delete(&s, &key, None).unwrap();
            apply(&mut s, &p);
            // The prefix's index reads every tombstone under it: read at every step around
            // the bound, where reaping starts, and at every hundredth before it (reading at
            // all ten thousand steps took a minute in a debug build).
            if i % 100 == 0 || i + 10 >= bound {
                let now = s.kv_prefix_index("churn/");
                assert!(now >= last, "the prefix index went from {last} to {now}");
                last = now;
            }
        }
        assert!(s.kv_tombstone_count() <= super::super::state::KV_TOMBSTONES_FOR_TESTS);
        assert_eq!(s.kv_prefix_index("churn/"), s.index);
        // A prefix untouched by the churn answers with the raised floor (its watchers wake
        // once and find nothing changed).
        assert!(s.kv_prefix_index("keep/") > Index(1));
    }
}
