//! The accepting side: a peer that holds this cluster's token exchanges its secret, then
//! opens streams with the stream secret.

use crate::grpc::{Handler, Outbound};
use crate::proto::{ExchangeSecretRequest, ExchangeSecretResponse, Opened, Payload, ReplicationMessage};
use crate::session::{self, Context, Ended};
use catalog::{Op, PeeringOp, WriteError};
use std::time::Duration;
use structs::peering::{PeeringRemote, PeeringState};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long a new stream may take to send its `Open`.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// Answers a peer's calls on this server.
#[derive(Debug)]
pub struct Acceptor {
    pub(crate) ctx: Context,
    pub(crate) tasks: TaskTracker,
    pub(crate) stop: CancellationToken,
}

fn status_of(error: WriteError) -> tonic::Status {
    match error {
        WriteError::Forbidden(why) => tonic::Status::permission_denied(why),
        WriteError::NotFound(why) => tonic::Status::not_found(why),
        WriteError::Invalid(why) => tonic::Status::invalid_argument(why.to_string()),
        other => tonic::Status::unavailable(other.to_string()),
    }
}

#[async_trait::async_trait]
impl Handler for Acceptor {
    async fn exchange(&self, request: ExchangeSecretRequest) -> Result<ExchangeSecretResponse, tonic::Status> {
        let stream_secret = catalog::ca::new_uuid().map_err(|e| tonic::Status::internal(e.to_string()))?;
        self.ctx
            .store
            .write(Op::Peering(PeeringOp::Exchange {
                id: request.peer_id,
                establishment: request.establishment_secret,
                stream: stream_secret.clone(),
            }))
            .await
            .map_err(status_of)?;
        Ok(ExchangeSecretResponse { stream_secret })
    }

    async fn stream(&self, mut inbound: tonic::Streaming<ReplicationMessage>) -> Result<Outbound, tonic::Status> {
        let first = tokio::time::timeout(OPEN_TIMEOUT, inbound.message())
            .await
            .map_err(|_| tonic::Status::deadline_exceeded("no Open within 10s"))??;
        let Some(ReplicationMessage {
            payload: Some(Payload::Open(open)),
        }) = first
        else {
            return Err(tonic::Status::invalid_argument("the first message must be Open"));
        };
        let stored = self
            .ctx
            .store
            .read()
            .peering_by_id(&open.peer_id)
            .ok_or_else(|| tonic::Status::not_found(format!("no peering has id {:?}", open.peer_id)))?;
        let name = stored.peering.name.clone();
        if matches!(stored.peering.state, PeeringState::Deleting | PeeringState::Terminated) {
            return Err(tonic::Status::aborted("the peering was deleted"));
        }
        self.ctx
            .store
            .write(Op::Peering(PeeringOp::Open {
                id: open.peer_id.clone(),
                secret: open.stream_secret.clone(),
                remote: PeeringRemote {
                    partition: "default".into(),
                    datacenter: open.datacenter.clone(),
                },
            }))
            .await
            .map_err(status_of)?;
        let (tx, rx) = mpsc::channel(64);
        let opened = Opened {
            datacenter: self.ctx.datacenter.clone(),
            known: session::known(&self.ctx.store.read(), &name),
        };
        let _ = tx.send(ReplicationMessage::of(Payload::Opened(opened))).await;
        let handle = self.ctx.tracker.connected(&name, &self.stop);
        tracing::info!(peer = %name, "peering stream accepted");
        let ctx = self.ctx.clone();
        self.tasks.spawn(async move {
            let result = session::run(&ctx, &name, false, open.known, tx, inbound, &handle).await;
            end(&ctx, &name, &handle, result);
        });
        Ok(Box::pin(ReceiverStream::new(rx).map(Ok)))
    }
}

/// Records how a stream ended.
pub(crate) fn end(ctx: &Context, name: &str, handle: &crate::tracker::StreamHandle, result: Result<Ended, String>) {
    match result {
        Ok(Ended::Cancelled) => ctx.tracker.disconnected(name, handle, None),
        Ok(Ended::Terminated | Ended::Deleted) => {
            tracing::info!(peer = %name, "peering stream ended: the peering was deleted");
            ctx.tracker.disconnected(name, handle, None);
        }
        Err(error) => {
            tracing::warn!(peer = %name, %error, "peering stream ended");
            ctx.tracker.disconnected(name, handle, Some(error));
        }
    }
}
