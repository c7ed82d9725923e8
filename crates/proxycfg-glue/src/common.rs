//! Data sources both families share: what neither serves yet is an error the proxy shows.

use async_trait::async_trait;
use proxycfg::data_sources::*;
use proxycfg::{CorrelationId, DataSource, DataSourceError, EventSender};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Prepared queries are not served (either family): a watch of one is an error.
pub struct PreparedQueriesUnsupported;

#[async_trait]
impl DataSource<PreparedQueryRequest> for PreparedQueriesUnsupported {
    async fn notify(
        self: Arc<Self>,
        req: PreparedQueryRequest,
        id: CorrelationId,
        tx: EventSender<PreparedQueryResult>,
        cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        let error = DataSourceError::InvalidRequest(format!(
            "prepared query {:?}: prepared queries are not supported",
            req.query
        ));
        proxycfg::forward::refuse(id, tx, error, cancel).await
    }
}

/// `value`, unless it equals the last value this watch sent (kept in `last`): a change the
/// proxy cannot see is not sent, so it builds nothing.
pub(crate) fn unless_unchanged<T: PartialEq>(last: &mut Option<Arc<T>>, value: &Arc<T>) -> Option<Arc<T>> {
    if last.as_ref().is_some_and(|l| l == value) {
        return None;
    }
    *last = Some(Arc::clone(value));
    Some(Arc::clone(value))
}
