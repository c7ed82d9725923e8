//! Prepared queries: neither mode serves them yet, so a watch of one is an error its proxy
//! shows (in its status and metrics) rather than a watch that silently never answers.

use proxycfg::data_sources::{PreparedQueryRequest, PreparedQueryResult};
use proxycfg::{CorrelationId, DataSource, DataSourceError, EventSender, WatchFuture};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Prepared queries are not served (either mode): a watch of one is an error.
pub struct PreparedQueriesUnsupported;

impl DataSource<PreparedQueryRequest> for PreparedQueriesUnsupported {
    fn notify<'w>(
        self: Arc<Self>,
        req: PreparedQueryRequest,
        id: CorrelationId,
        tx: EventSender<PreparedQueryResult>,
        cancel: CancellationToken,
    ) -> WatchFuture<'w>
    where
        Self: 'w,
    {
        let error = DataSourceError::InvalidRequest(format!(
            "prepared query {:?}: prepared queries are not supported",
            req.query
        ));
        Box::pin(proxycfg::forward::refuse(id, tx, error, cancel))
    }
}
