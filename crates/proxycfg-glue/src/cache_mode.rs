//! Agent mode's inputs: agent-cache entries. Every watch of the same key shares one entry (one
//! blocking query at a server); see `docs/agent.md` for the cache itself.

use crate::derive::{Changed, Input};
use crate::mode::Mode;
use agent_cache::AgentCaches;
use agent_cache::cache::{CacheWatch, Fetched};
use agent_cache::types::{ConfigEntriesKey, ConfigEntryKey, RootsKey};
use proxycfg::DataSourceError;
use std::sync::Arc;
use structs::{ConfigEntry, ConfigEntryKind, IndexedCaRoots};

/// Agent mode: the agent's caches every cache data source reads.
pub(crate) struct AgentCache {
    pub(crate) caches: AgentCaches,
}

/// One cache entry as an input.
pub(crate) struct CacheInput<V> {
    watch: CacheWatch<V>,
    latest: Option<Fetched<V>>,
}

impl<V> CacheInput<V> {
    pub(crate) fn new(watch: CacheWatch<V>) -> Self {
        Self { watch, latest: None }
    }
}

/// A failed fetch as a State shows it: the servers' 403 stays "permission denied".
fn source_error(e: agent_cache::cache::FetchError) -> DataSourceError {
    match e {
        agent_cache::cache::FetchError::PermissionDenied(m) => DataSourceError::PermissionDenied(m),
        agent_cache::cache::FetchError::Unavailable(m) => DataSourceError::Unavailable(m),
        e @ agent_cache::cache::FetchError::ShuttingDown => DataSourceError::Unavailable(e.to_string()),
    }
}

impl<V: Clone + Send + Sync> Input for CacheInput<V> {
    type Value = V;

    async fn changed(&mut self) -> Changed {
        // `None`: the cache shut down, the watch ends.
        match self.watch.next().await? {
            Ok(fetched) => {
                self.latest = Some(fetched);
                Some(Ok(()))
            }
            Err(e) => Some(Err(source_error(e))),
        }
    }

    fn latest(&self) -> Option<V> {
        self.latest.as_ref().map(|f| f.value.clone())
    }

    fn versions(&self, into: &mut Vec<u64>) {
        into.push(self.latest.as_ref().map_or(0, |f| f.index));
    }
}

impl Mode for AgentCache {
    type Roots = CacheInput<Arc<IndexedCaRoots>>;
    type Entry = CacheInput<Option<Arc<ConfigEntry>>>;
    type Entries = CacheInput<Arc<Vec<Arc<ConfigEntry>>>>;

    fn datacenter(&self) -> &str {
        self.caches.datacenter()
    }

    fn roots(&self) -> Self::Roots {
        CacheInput::new(self.caches.roots.watch(&RootsKey))
    }

    fn config_entry(&self, kind: ConfigEntryKind, name: &str) -> Self::Entry {
        let key = ConfigEntryKey {
            kind,
            name: name.to_owned(),
        };
        CacheInput::new(self.caches.config_entry.watch(&key))
    }

    fn config_entries(&self, kind: ConfigEntryKind) -> Self::Entries {
        self.config_entries_as(kind, None)
    }

    fn config_entries_as(&self, kind: ConfigEntryKind, token: Option<&structs::Token>) -> Self::Entries {
        let key = ConfigEntriesKey {
            kind,
            token: token.cloned(),
        };
        CacheInput::new(self.caches.config_entries.watch(&key))
    }
}
