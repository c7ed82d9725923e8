//! The dialing side: one task per peering this cluster established with a token, run by
//! the leading server only, reconnecting with back-off across the peer's servers.

use crate::acceptor::end;
use crate::grpc;
use crate::proto::{Open, Payload, ReplicationMessage};
use crate::session::{self, Context, Ended};
use catalog::{Op, PeeringOp};
use std::time::Duration;
use structs::peering::StoredPeering;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

/// The waits between attempts: the next server at once after a stream that was up broke,
/// then 250 ms doubling to 30 s.
const SCHEDULE: backoff_schedule::Schedule = backoff_schedule::Schedule {
    immediate: 1,
    first: Duration::from_millis(250),
    max: Duration::from_secs(30),
};

/// Whether this side dials `stored`: it established it, and it is neither deleted nor
/// terminated.
pub(crate) fn dials(stored: &StoredPeering) -> bool {
    stored.peering.is_dialer() && stored.peering.state.is_live() && stored.secrets.stream_active.is_some()
}

/// Keeps a stream of the peering `name` up until `stop`, the peering ends, or this side
/// stops dialing it.
pub(crate) async fn run(ctx: Context, name: String, stop: CancellationToken) {
    let mut attempt = 0u32;
    let mut next = 0usize;
    loop {
        let Some(stored) = ctx.store.read().peering(&name).filter(|p| dials(p)) else {
            return;
        };
        let routed =
            crate::routes::dial_addresses(&ctx.store.read(), &stored.peering.peer_server_addresses).and_then(|a| {
                if a.is_empty() {
                    Err("the peering has no server address to dial".to_owned())
                } else {
                    Ok(a)
                }
            });
        let addresses = match routed {
            Ok(addresses) => addresses,
            Err(error) => {
                ctx.tracker.failed(&name, error);
                attempt = attempt.saturating_add(1);
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(SCHEDULE.delay(attempt)) => {}
                }
                continue;
            }
        };
        let address = addresses[next % addresses.len()].clone();
        next += 1;
        match once(&ctx, &stored, &address, &stop).await {
            Ok(Ended::Cancelled | Ended::Deleted | Ended::Terminated) => return,
            Err((error, was_up)) => {
                if was_up {
                    attempt = 0;
                } else {
                    ctx.tracker.failed(&name, error.clone());
                    tracing::debug!(peer = %name, %address, %error, "cannot reach the peer");
                }
                attempt = attempt.saturating_add(1);
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(SCHEDULE.delay(attempt)) => {}
                }
            }
        }
    }
}

/// One stream through `address`; the error says whether the stream had been up.
async fn once(
    ctx: &Context,
    stored: &StoredPeering,
    address: &str,
    stop: &CancellationToken,
) -> Result<Ended, (String, bool)> {
    let name = &stored.peering.name;
    let fail = |e: String| (e, false);
    // The peer's roots: the token's at first, then what its stream sent (a rotation).
    let tls = crate::tls::DialTls {
        ca_pems: stored.peering.peer_ca_pems.clone(),
        server_name: stored.peering.peer_server_name.clone(),
    };
    let mut client = tokio::select! {
        () = stop.cancelled() => return Ok(Ended::Cancelled),
        c = grpc::connect(address, &tls) => c.map_err(fail)?,
    };
    let secret = stored.secrets.stream_active.clone().unwrap_or_default();
    let (tx, rx) = mpsc::channel(64);
    let open = Open {
        peer_id: stored.peering.peer_id.clone(),
        stream_secret: secret,
        datacenter: ctx.datacenter.clone(),
        known: session::known(&ctx.store.read(), name),
    };
    let _ = tx.send(ReplicationMessage::of(Payload::Open(open))).await;
    let opened = tokio::select! {
        () = stop.cancelled() => return Ok(Ended::Cancelled),
        r = grpc::open_stream(&mut client, ReceiverStream::new(rx)) => r,
    };
    let mut inbound = match opened {
        Ok(inbound) => inbound,
        Err(status) if status.code() == tonic::Code::Aborted => {
            tracing::info!(peer = %name, "the peer deleted the peering: it is terminated here");
            let op = Op::Peering(PeeringOp::Terminated { name: name.clone() });
            ctx.store.write(op).await.map_err(|e| fail(e.to_string()))?;
            return Ok(Ended::Terminated);
        }
        Err(status) => return Err(fail(format!("{address}: {}", status.message()))),
    };
    let first = tokio::time::timeout(Duration::from_secs(10), inbound.message())
        .await
        .map_err(|_| fail(format!("{address}: no answer to Open within 10s")))?
        .map_err(|s| fail(format!("{address}: {}", s.message())))?;
    let Some(ReplicationMessage {
        payload: Some(Payload::Opened(opened)),
    }) = first
    else {
        return Err(fail(format!("{address}: the peer did not take the stream")));
    };
    let handle = ctx.tracker.connected(name, stop);
    tracing::info!(peer = %name, %address, "peering stream open");
    let active = Op::Peering(PeeringOp::Active { name: name.clone() });
    if let Err(error) = ctx.store.write(active).await {
        tracing::warn!(peer = %name, %error, "cannot record the peering active");
    }
    let result = session::run(ctx, name, true, opened.known, tx, inbound, &handle).await;
    end(ctx, name, &handle, result.clone());
    result.map_err(|e| (e, true))
}
