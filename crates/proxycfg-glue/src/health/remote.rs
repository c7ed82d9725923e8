//! Another datacenter's instances in server mode: a blocking query at a server of that
//! datacenter (the federation states name them), followed for as long as some proxy watches.
//! A sidecar whose upstream reaches another datacenter directly (`MeshGateway.Mode` none)
//! needs them; an agent asks its own servers instead, which relay (`?dc=`).

use crate::derive::{Changed, Input};
use catalog::federation::Federation;
use proxycfg::DataSourceError;
use std::sync::Arc;
use std::time::Duration;
use structs::{CheckServiceNode, Token};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

/// The instances.
type Nodes = Arc<Vec<CheckServiceNode>>;

/// How long one blocking query waits at the other datacenter.
const WAIT: Duration = Duration::from_secs(300);

/// What the follower last learned: a generation (each answer or failure bumps it) and it.
type Latest = (u64, Result<Nodes, DataSourceError>);

/// The input: the follower's answers; the follower stops when this is dropped.
pub(super) struct RemoteHealth {
    rx: watch::Receiver<Option<Latest>>,
    latest: Option<(u64, Nodes)>,
    _follower: AbortOnDropHandle<()>,
}

impl RemoteHealth {
    /// Follows `path` (a health path) in datacenter `dc`, with `token` (none: anonymous).
    pub(super) fn new(fed: Arc<Federation>, dc: String, path: String, token: Option<Token>) -> Self {
        let (tx, rx) = watch::channel(None);
        let follower = tokio::spawn(follow(fed, dc, path, token, tx));
        Self {
            rx,
            latest: None,
            _follower: AbortOnDropHandle::new(follower),
        }
    }
}

impl Input for RemoteHealth {
    type Value = Nodes;

    async fn changed(&mut self) -> Changed {
        self.rx.changed().await.ok()?;
        let (generation, result) = self.rx.borrow_and_update().clone()?;
        match result {
            Ok(nodes) => {
                self.latest = Some((generation, nodes));
                Some(Ok(()))
            }
            Err(e) => Some(Err(e)),
        }
    }

    fn latest(&self) -> Option<Nodes> {
        self.latest.as_ref().map(|(_, n)| Arc::clone(n))
    }

    fn versions(&self, into: &mut Vec<u64>) {
        into.push(self.latest.as_ref().map_or(0, |(g, _)| *g));
    }
}

/// The follower: answers and failures sent as they come; failures retried after 1 s,
/// doubling to 30 s.
async fn follow(
    fed: Arc<Federation>,
    dc: String,
    path: String,
    token: Option<Token>,
    tx: watch::Sender<Option<Latest>>,
) {
    let (mut index, mut failures, mut generation) = (0u64, 0u32, 0u64);
    let mut send = |result: Result<Nodes, DataSourceError>| {
        generation += 1;
        tx.send_replace(Some((generation, result)));
    };
    loop {
        if fed.servers_of(&dc).is_empty() {
            send(Err(DataSourceError::Unavailable(format!(
                "datacenter {dc:?} is not known to this server (no federation state names it)"
            ))));
        }
        let servers = fed.servers_known(&dc).await;
        let answer = match fed.peer_ca() {
            Some(ca) => api_client::Servers::with_ca(&servers, ca).map_err(|e| e.to_string()),
            None => Ok(api_client::Servers::new(&servers)),
        };
        let answer = match answer {
            Ok(api) => api
                .get_blocking_as(token.as_ref(), &path, index, WAIT)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        let decoded = answer.and_then(|b| {
            let nodes: Vec<CheckServiceNode> = match &b.body {
                Some(body) => structs::json::from_slice(body).map_err(|e| format!("decoding the answer: {e}"))?,
                None => Vec::new(),
            };
            Ok((b.index, nodes))
        });
        match decoded {
            Ok((at, nodes)) => {
                failures = 0;
                // An index that went backwards (the other datacenter's servers restarted
                // without their state): start over.
                let moved = at != index;
                index = if at < index { 0 } else { at.max(1) };
                if moved {
                    send(Ok(Arc::new(nodes)));
                }
            }
            Err(e) => {
                send(Err(DataSourceError::Unavailable(format!(
                    "GET {path} in datacenter {dc:?}: {e}"
                ))));
                failures = failures.saturating_add(1);
                let backoff = Duration::from_secs(1 << failures.min(5)).min(Duration::from_secs(30));
                tokio::time::sleep(backoff).await;
            }
        }
    }
}
