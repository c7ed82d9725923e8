//! Restoring a snapshot into etcd. One etcd transaction holds at most `--max-txn-ops`
//! operations and `--max-request-bytes` bytes, far fewer than a catalog has rows, so a
//! restore is written in many transactions, bracketed by the restore marker
//! (`catalog/_restore`):
//!
//! 1. the marker is put (with the write guard, so every write planned before it fails its
//!    guard and, seeing the marker, is refused);
//! 2. every key the snapshot lacks is deleted and every row it has is put, in transactions
//!    that each apply only while the marker is still this restore's;
//! 3. the marker is deleted (with the guard).
//!
//! Every server's watch applies the transactions between 1 and 3 to a state of its own and
//! makes it current at 3 (see `apply.rs`): readers see the catalog before or after, and
//! writes are refused between. If the restoring server dies midway, the marker stays and
//! writes stay refused, loudly, until a restore is run again: the keys to delete are read
//! from etcd itself, so a second restore finishes what the first left, whichever snapshot
//! it restores.

use crate::apply::Applier;
use crate::config::EtcdConfig;
use crate::layout;
use crate::outage::etcd_err;
use crate::txn::{Tried, send};
use catalog::State;
use catalog::StoreError;
use catalog::WriteOutcome;
use catalog::snapshot::Snapshot;
use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};
use std::collections::HashSet;
use structs::Index;
use tracing::info;

/// Bytes of keys and values one transaction carries at most: under etcd's default
/// `--max-request-bytes` (1.5 MiB), with room for the request's framing.
const MAX_TXN_BYTES: usize = 1 << 20;

/// Writes `snapshot` as the whole catalog (see the module docs); answers with the index
/// the restored catalog is current at, on this server too.
pub(super) async fn restore(
    client: &Client,
    config: &EtcdConfig,
    applier: &Applier,
    snapshot: &Snapshot,
) -> Result<WriteOutcome, StoreError> {
    let prefix = config.catalog_prefix();
    // Every row of the snapshot, as the keys and values it is kept as.
    let mut puts = Vec::new();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    for change in State::default().restore_changes(snapshot.rows(), now_ms) {
        let (key, value) = layout::encode(&change).map_err(|source| StoreError::Encode { what: "a row", source })?;
        puts.push((key, value));
    }
    let wanted: HashSet<&str> = puts.iter().map(|(k, _)| k.as_str()).collect();
    let existing = catalog_keys(client, config).await?;
    // The CA and the bootstrap mark are never deleted (a snapshot without them keeps them).
    let keep = |k: &str| wanted.contains(k) || [layout::GUARD, layout::RESTORE, "ca", "acl/bootstrapped"].contains(&k);
    let mut ops: Vec<(String, Option<Vec<u8>>)> =
        existing.into_iter().filter(|k| !keep(k)).map(|k| (k, None)).collect();
    let deletes = ops.len();
    ops.extend(puts);

    let marker_key = format!("{prefix}{}", layout::RESTORE);
    let mut id = [0u8; 8];
    getrandom::fill(&mut id).map_err(|e| StoreError::Corrupt(format!("no randomness for the restore marker: {e}")))?;
    let marker = format!(
        "by {} at {}, id {}, snapshot {}",
        config.server_name,
        structs::Timestamp(std::time::SystemTime::now()),
        u64::from_le_bytes(id),
        snapshot.meta().id
    );
    info!(%marker, deletes, rows = ops.len() - deletes, "restoring a snapshot into etcd");
    let ours = || Compare::value(marker_key.clone(), CompareOp::Equal, marker.clone());
    let guard = || TxnOp::put(config.guard_key(), config.server_name.clone(), None);
    let begin = Txn::new().and_then([TxnOp::put(marker_key.clone(), marker.clone(), None), guard()]);
    run(client, config, begin, "starting the restore").await?;

    let per_txn = config.max_txn_ops.max(2) - 1;
    let mut rest = &ops[..];
    while !rest.is_empty() {
        let mut bytes = 0;
        let mut take = 0;
        for (k, v) in rest.iter().take(per_txn) {
            let size = k.len() + prefix.len() + v.as_ref().map_or(0, Vec::len);
            if take > 0 && bytes + size > MAX_TXN_BYTES {
                break;
            }
            bytes += size;
            take += 1;
        }
        let (chunk, after) = rest.split_at(take);
        rest = after;
        let then: Vec<TxnOp> = chunk
            .iter()
            .map(|(k, v)| match v {
                Some(v) => TxnOp::put(format!("{prefix}{k}"), v.clone(), None),
                None => TxnOp::delete(format!("{prefix}{k}"), None),
            })
            .collect();
        let txn = Txn::new().when([ours()]).and_then(then);
        if !run(client, config, txn, "writing the restored rows").await? {
            return Err(taken_over());
        }
    }
    let end = Txn::new()
        .when([ours()])
        .and_then([TxnOp::delete(marker_key.clone(), None), guard()]);
    let (succeeded, revision) = run_at(client, config, end, "finishing the restore").await?;
    if !succeeded {
        return Err(taken_over());
    }
    if !applier.caught_up(revision, config.request_timeout).await {
        return Err(StoreError::EtcdTimeout {
            what: format!("applying the restored catalog (revision {revision})"),
            after: config.request_timeout,
        });
    }
    info!(%revision, "snapshot restored into etcd");
    Ok(WriteOutcome {
        index: revision,
        applied: true,
    })
}

fn taken_over() -> StoreError {
    StoreError::RestoreInProgress("another restore took over this one; it finishes the catalog".into())
}

/// Every key under the catalog prefix (relative to it), read linearizably.
async fn catalog_keys(client: &Client, config: &EtcdConfig) -> Result<Vec<String>, StoreError> {
    let prefix = config.catalog_prefix();
    let mut kv = client.kv_client();
    let read = kv.get(prefix.clone(), Some(GetOptions::new().with_prefix().with_keys_only()));
    let resp = tokio::time::timeout(config.request_timeout, read)
        .await
        .map_err(|_| StoreError::EtcdTimeout {
            what: "listing the catalog's keys in etcd".into(),
            after: config.request_timeout,
        })?
        .map_err(etcd_err("listing the catalog's keys in etcd"))?;
    Ok(resp
        .kvs()
        .iter()
        .filter_map(|kv| kv.key().strip_prefix(prefix.as_bytes()))
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect())
}

/// Sends one transaction of the restore; whether its condition held.
async fn run(client: &Client, config: &EtcdConfig, txn: Txn, what: &str) -> Result<bool, StoreError> {
    run_at(client, config, txn, what).await.map(|(ok, _)| ok)
}

/// As [`run`], with the revision etcd answered at.
async fn run_at(client: &Client, config: &EtcdConfig, txn: Txn, what: &str) -> Result<(bool, Index), StoreError> {
    let mut kv = client.kv_client();
    let mut tried = Tried::default();
    let sent = tokio::time::timeout(
        config.request_timeout,
        send(&mut kv, txn, &config.guard_key(), &mut tried),
    )
    .await;
    match sent {
        Ok(Ok(resp)) => Ok((
            resp.succeeded(),
            Index(resp.header().map_or(0, |h| h.revision()) as u64),
        )),
        Ok(Err(source)) => Err(StoreError::Etcd {
            what: format!("{what} (etcd keeps the restore marker: run the restore again)"),
            source: Box::new(source),
        }),
        Err(_) => Err(StoreError::EtcdTimeout {
            what: format!("{what}: {} (run the restore again)", tried.cause()),
            after: config.request_timeout,
        }),
    }
}
