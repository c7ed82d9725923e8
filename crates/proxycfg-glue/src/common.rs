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
