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
        _id: CorrelationId,
        _tx: EventSender<PreparedQueryResult>,
        _cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        Err(DataSourceError::InvalidRequest(format!(
            "prepared query {:?}: prepared queries are not supported",
            req.query
        )))
    }
}

/// Gateway services: gateways are not supported yet (the Manager refuses gateway kinds).
pub struct GatewayServicesUnsupported;

#[async_trait]
impl DataSource<GatewayServicesRequest> for GatewayServicesUnsupported {
    async fn notify(
        self: Arc<Self>,
        req: GatewayServicesRequest,
        _id: CorrelationId,
        _tx: EventSender<Arc<Vec<structs::GatewayService>>>,
        _cancel: CancellationToken,
    ) -> Result<(), DataSourceError> {
        Err(DataSourceError::InvalidRequest(format!(
            "gateway {:?}: gateways are not supported yet",
            req.gateway
        )))
    }
}
