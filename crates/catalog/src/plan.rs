//! What planning a write decides (shared by the catalog's and the ACL tables' planners).

use crate::state::Change;

/// What planning decided.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub(crate) changes: Vec<Change>,
    /// False when a check-and-set did not match (nothing to write, the caller gets `false`).
    pub(crate) applied: bool,
}

impl Plan {
    pub(crate) fn write(changes: Vec<Change>) -> Self {
        Self { changes, applied: true }
    }
    pub(crate) fn refused() -> Self {
        Self {
            changes: Vec::new(),
            applied: false,
        }
    }
}

/// True when two config entries differ at most in their indexes.
pub(crate) fn same_entry(a: &structs::ConfigEntry, b: &structs::ConfigEntry) -> bool {
    let mut b = b.clone();
    b.set_indexes(a.create_index(), a.modify_index());
    *a == b
}
