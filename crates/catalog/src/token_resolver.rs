//! The server's [`acl::TokenResolver`]: tokens resolved against the store's current state,
//! and ACL changes learnt from one follower of the store's ACL index.

use crate::acl::Resolver;
use crate::keys::IndexKey;
use crate::store::Store;
use acl::{BoxFuture, ResolveError, Resolved, Token, TokenResolver};
use std::sync::Arc;
use tokio::sync::watch;
use tracing::Instrument;

/// Resolves tokens against a store (see the module docs).
#[derive(Debug, Clone)]
pub struct StoreTokens {
    store: Store,
    resolver: Arc<Resolver>,
    /// Bumped by the follower on every move of the ACL index: every waiter holds a receiver
    /// (a few bytes) rather than a blocking wait of its own.
    changes: watch::Sender<u64>,
}

impl StoreTokens {
    /// The resolver over `store`; its follower of the ACL index runs on `tasks` and ends
    /// when the store closes or releases its waiters at shutdown.
    pub fn start(store: Store, resolver: Arc<Resolver>, tasks: &tokio_util::task::TaskTracker) -> Self {
        let changes = watch::Sender::new(0u64);
        if resolver.enabled() {
            let (follow, tx) = (store.clone(), changes.clone());
            tasks.spawn(follow_acl_index(follow, tx).instrument(tracing::info_span!("acl_index_follower")));
        }
        Self {
            store,
            resolver,
            changes,
        }
    }

    /// The catalog's resolver (for reads that already hold a state).
    pub fn resolver(&self) -> &Arc<Resolver> {
        &self.resolver
    }
}

/// Bumps `tx` on every move of the store's ACL index, until the store closes.
async fn follow_acl_index(store: Store, tx: watch::Sender<u64>) {
    let key = IndexKey::Acl;
    let mut at = store.read().index_of(&key);
    loop {
        let state = store.wait(&key, at, std::time::Duration::from_secs(600)).await;
        if store.is_closed() {
            return;
        }
        let now = state.index_of(&key);
        if now != at {
            at = now;
            tx.send_modify(|n| *n += 1);
        }
    }
}

impl TokenResolver for StoreTokens {
    fn enabled(&self) -> bool {
        self.resolver.enabled()
    }

    fn resolve(&self, token: Option<&Token>) -> BoxFuture<'_, Result<Resolved, ResolveError>> {
        let resolved = self.resolver.resolve(&self.store.read(), token);
        Box::pin(std::future::ready(resolved))
    }

    fn changed(&self) -> BoxFuture<'static, ()> {
        let mut rx = self.changes.subscribe();
        Box::pin(async move {
            if rx.changed().await.is_err() {
                // No more changes can come (the server is going).
                std::future::pending::<()>().await;
            }
        })
    }
}
