//! Balancing xDS streams between servers that share one catalog (`-store etcd`).
//!
//! Each server's share is `ceil(proxies / servers × 1.1)` streams, `proxies` being the proxy
//! instances in the catalog (sidecars and gateways) and `servers` those registered in etcd.
//! A server holding more than its share for longer than a grace period ends the excess at
//! a paced rate (a tenth of it per second, at least one) with `RESOURCE_EXHAUSTED`, so those
//! proxies reconnect, to another server when their bootstrap lists several (`meshd connect
//! envoy -grpc-addr A,B,C`). The grace period (twice the lease TTL) lets a dead server's
//! registration expire first: streams that just failed over from it are not bounced back
//! and forth while the server count is still stale. New streams are never refused for
//! balance, only for `-xds-max-streams`.

use catalog::Store;
use std::time::Duration;
use structs::ServiceKind;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::info;
use xds::XdsServer;

/// How often the share is computed.
const TICK: Duration = Duration::from_secs(1);

/// A server's share of `proxies` streams among `servers` servers.
pub(crate) fn share(proxies: usize, servers: usize) -> usize {
    let servers = servers.max(1) as f64;
    (proxies as f64 / servers * 1.1).ceil() as usize
}

/// Streams to end this tick when `open` are held against a share of `limit`.
pub(crate) fn to_shed(open: usize, limit: usize) -> usize {
    let excess = open.saturating_sub(limit);
    if excess == 0 { 0 } else { excess.div_ceil(10).max(1) }
}

/// Runs until `stop`: every second, sheds what this server holds over its share (see the
/// module docs). Does nothing for a store without a cluster.
pub(crate) async fn run(store: Store, xds: XdsServer, grace: Duration, stop: CancellationToken) {
    let Some(cluster) = store.cluster().cloned() else {
        return;
    };
    let mut over_since: Option<Instant> = None;
    let mut shedding = false;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(TICK) => {}
        }
        let servers = cluster.status().servers.len();
        let proxies = store
            .read()
            .all_services()
            .filter(|(_, s)| s.kind != ServiceKind::Typical)
            .count();
        let (open, limit) = (xds.open_streams(), share(proxies, servers));
        let n = if servers < 2 { 0 } else { to_shed(open, limit) };
        if n == 0 {
            if shedding {
                info!(open, limit, "xDS streams back within this server's share");
            }
            (over_since, shedding) = (None, false);
            continue;
        }
        let since = *over_since.get_or_insert_with(Instant::now);
        if since.elapsed() < grace {
            continue;
        }
        if !shedding {
            info!(
                open,
                limit,
                proxies,
                servers,
                "this server holds more than its share of xDS streams: handing some to the others"
            );
            shedding = true;
        }
        xds.shed(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_is_a_tenth_over_an_even_split_and_excess_goes_a_tenth_at_a_time() {
        assert_eq!(share(1000, 3), 367);
        assert_eq!(share(30, 3), 11);
        assert_eq!(share(0, 3), 0);
        assert_eq!(share(10, 0), 11, "no registered server counts as one");
        assert_eq!(to_shed(367, 367), 0);
        assert_eq!(to_shed(368, 367), 1);
        assert_eq!(to_shed(500, 367), 14);
        assert_eq!(to_shed(3, 0), 1);
    }
}
