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
