//! What a mode supplies to the derivations both modes share: the datacenter it serves, and
//! the inputs several resources read (the CA roots, one config entry, every entry of a kind).
//! Server mode reads them from catalog topics (`server_mode`), agent mode from the agent
//! cache (`cache_mode`); inputs only one resource reads are made in that resource's file.

use crate::derive::Input;
use proxycfg::DataSourceError;
use std::sync::Arc;
use structs::{ConfigEntry, ConfigEntryKind, IndexedCaRoots};

/// A mode's shared inputs.
pub(crate) trait Mode: Send + Sync + 'static {
    /// The CA roots.
    type Roots: Input<Value = Arc<IndexedCaRoots>> + 'static;
    /// One config entry (`None`: it does not exist).
    type Entry: Input<Value = Option<Arc<ConfigEntry>>> + 'static;
    /// Every config entry of a kind.
    type Entries: Input<Value = Arc<Vec<Arc<ConfigEntry>>>> + 'static;

    /// The datacenter this mode serves.
    fn datacenter(&self) -> &str;

    /// Follows the CA roots.
    fn roots(&self) -> Self::Roots;

    /// Follows the entry `kind`/`name`.
    fn config_entry(&self, kind: ConfigEntryKind, name: &str) -> Self::Entry;

    /// Follows every entry of `kind`.
    fn config_entries(&self, kind: ConfigEntryKind) -> Self::Entries;

    /// Follows every entry of `kind` as `token` may read them (none: the mode's own
    /// reader). A server reads its own state, whoever asks.
    fn config_entries_as(&self, kind: ConfigEntryKind, token: Option<&structs::Token>) -> Self::Entries {
        let _ = token;
        self.config_entries(kind)
    }

    /// Refuses a request for another datacenter than this mode's (`""`: its own): neither
    /// mode forwards requests to other datacenters yet.
    fn check_dc(&self, asked: &str) -> Result<(), DataSourceError> {
        let served = self.datacenter();
        if asked.is_empty() || asked == served {
            Ok(())
        } else {
            Err(DataSourceError::InvalidRequest(format!(
                "datacenter {asked:?} is not served here (only {served:?})"
            )))
        }
    }
}
