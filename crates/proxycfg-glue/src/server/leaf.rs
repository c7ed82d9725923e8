//! The leaf watch of a server-mode proxy: a subscriber of the shared CA roots, with a
//! renewal timer of its own.

use super::Shared;
use crate::fanout::Follow;
use proxycfg::DataSourceError;
use proxycfg::data_sources::{CaRootsRequest, LeafRequest};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

/// One leaf watch: the certificate again whenever the CA roots change (the shared roots
/// follower), and when it is due for renewal (the store reissues it then).
pub(super) struct LeafWatch {
    roots: crate::fanout::Subscriber<Arc<structs::IndexedCaRoots>>,
    /// When to ask again, once a certificate was had.
    renew: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    shared: Arc<Shared>,
    req: LeafRequest,
}

impl LeafWatch {
    pub(super) fn new(shared: &Arc<Shared>, req: LeafRequest) -> Result<Self, DataSourceError> {
        let roots = shared.follow_roots(&CaRootsRequest {
            datacenter: req.datacenter.clone(),
        })?;
        Ok(Self {
            roots: crate::fanout::Subscriber::new(roots),
            renew: None,
            shared: Arc::clone(shared),
            req,
        })
    }
}

impl Follow for LeafWatch {
    type Item = Arc<structs::IssuedCert>;

    fn poll_follow(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Self::Item, DataSourceError>>> {
        let mut due = match self.roots.poll_value(cx) {
            // The store closed: the watch ends.
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Ready(Some(_)) => true,
            Poll::Pending => false,
        };
        if let Some(renew) = &mut self.renew {
            due |= renew.as_mut().poll(cx).is_ready();
        }
        if !due {
            return Poll::Pending;
        }
        let result = self
            .shared
            .store
            .leaf_with_sans(&self.req.service, &self.req.dns_sans)
            .map_err(|e| DataSourceError::Unavailable(e.to_string()));
        if let Ok(cert) = &result {
            let due = cert.renew_at() + Duration::from_secs(1);
            let wait = due.duration_since(SystemTime::now()).unwrap_or(Duration::from_secs(1));
            let at = tokio::time::Instant::now() + wait;
            match &mut self.renew {
                Some(renew) => renew.as_mut().reset(at),
                None => self.renew = Some(Box::pin(tokio::time::sleep_until(at))),
            }
        }
        Poll::Ready(Some(result))
    }
}
