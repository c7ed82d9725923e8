//! Catalog indexes: every write gets the next index; rows remember when they were made and changed.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A position in the catalog's single, monotonically increasing write sequence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Index(pub u64);

impl Index {
    /// The index that follows this one.
    pub fn next(self) -> Index {
        Index(self.0 + 1)
    }
}

impl fmt::Display for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<u64> for Index {
    fn from(v: u64) -> Self {
        Index(v)
    }
}
