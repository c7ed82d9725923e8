//! Sending one etcd transaction through leader changes and outages: retried while etcd
//! says to try again, given up once etcd has had no leader for about one election; and what
//! went wrong, for the caller's error. The writer and the snapshot restore send through it.

use etcd_client::{GetOptions, Txn};
use std::time::Duration;

/// Whether a transaction that failed with `e` may simply be sent again: the member could
/// not be reached or its connection broke or was cancelled (another may take it), or it has
/// no leader now
/// (an election is under way; [`send`] gives up once that lasts [`NO_LEADER_GRACE`]). A transaction that did commit
/// despite an error is harmless to send again: its guard no longer matches, and the batch is
/// planned again on the state that includes it.
fn retriable(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => match status.code() {
            // etcd's "try again or elsewhere": no leader, leader changed, not reachable.
            tonic::Code::Unavailable => true,
            // A connection to a member that just died breaks under the request.
            tonic::Code::Unknown => status.message().contains("transport error"),
            tonic::Code::Cancelled => true,
            _ => false,
        },
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

/// Whether etcd answered that it has no leader (an election, or quorum lost).
fn no_leader(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(status) if status.message().contains("leader"))
}

/// How long a write keeps trying while etcd answers "no leader": about one election (etcd's
/// default election timeout is 1 s), so a leader change is ridden out while a lost quorum
/// fails the write soon after etcd notices it, not after the whole request timeout.
const NO_LEADER_GRACE: Duration = Duration::from_secs(1);

/// How often etcd is asked whether it has a leader while an attempt waits for its answer.
const LEADER_PROBE_EVERY: Duration = Duration::from_millis(200);

/// How long one attempt at a transaction may take before it is sent again: a proposal
/// caught in a leader's failure waits in etcd for several seconds, while a new attempt
/// reaches the new leader.
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(1500);

/// Sends a transaction, again while it fails in a way [`retriable`] allows or gets no
/// answer within [`ATTEMPT_TIMEOUT`] (the caller bounds the whole with its timeout), but
/// gives up once etcd has had no leader for [`NO_LEADER_GRACE`]: a proposal sent just
/// before quorum was lost gets no answer at all, so meanwhile etcd is asked (see
/// [`leaderless`]). `tried` keeps what went wrong for the caller's report: the last error,
/// whether an attempt went unanswered (etcd may still commit it), and whether it gave up
/// for want of a leader.
pub(super) async fn send(
    kv: &mut etcd_client::KvClient,
    txn: Txn,
    probe_key: &str,
    tried: &mut Tried,
) -> Result<etcd_client::TxnResponse, etcd_client::Error> {
    let leaderless = leaderless(kv.clone(), probe_key.to_owned());
    tokio::pin!(leaderless);
    loop {
        let attempt = tokio::time::timeout(ATTEMPT_TIMEOUT, kv.txn(txn.clone()));
        let answer = tokio::select! {
            a = attempt => a,
            e = &mut leaderless => {
                // The attempt in flight is abandoned, not withdrawn.
                tried.unanswered = true;
                tried.no_leader = true;
                return Err(e);
            }
        };
        match answer {
            Err(_) => tried.unanswered = true,
            Ok(Err(e)) if retriable(&e) => {
                tried.last_error = Some(e.to_string());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(other) => return other,
        }
    }
}

/// Resolves, with etcd's error, once every member that answers has said it has no leader
/// for [`NO_LEADER_GRACE`]. Asks with a serializable read (answered by the member itself,
/// refused without a leader as the client requires one), so it answers while quorum is lost;
/// members that cannot be reached tell nothing, and any answer from a member with a leader
/// starts the count again.
async fn leaderless(mut kv: etcd_client::KvClient, key: String) -> etcd_client::Error {
    let mut since: Option<tokio::time::Instant> = None;
    loop {
        tokio::time::sleep(LEADER_PROBE_EVERY).await;
        let probe = kv.get(key.clone(), Some(GetOptions::new().with_serializable()));
        match tokio::time::timeout(LEADER_PROBE_EVERY, probe).await {
            Ok(Err(e)) if no_leader(&e) => {
                let first = *since.get_or_insert_with(tokio::time::Instant::now);
                if first.elapsed() >= NO_LEADER_GRACE {
                    return e;
                }
            }
            Ok(Ok(_)) => since = None,
            _ => {}
        }
    }
}

/// What went wrong with the attempts at one transaction.
#[derive(Default)]
pub(super) struct Tried {
    last_error: Option<String>,
    unanswered: bool,
    /// Gave up: etcd kept answering that it has no leader.
    pub(super) no_leader: bool,
}

impl Tried {
    /// Why the write failed, for the 500: the cause, and whether it may still apply.
    pub(super) fn cause(&self) -> String {
        match &self.last_error {
            Some(e) => format!("{}: {e}", self.cause_without_error()),
            None => self.cause_without_error(),
        }
    }

    /// [`Tried::cause`] without etcd's last error (the caller adds it).
    pub(super) fn cause_without_error(&self) -> String {
        let why = "etcd did not commit the write (no quorum?)";
        if self.unanswered {
            format!("{why}; it was not acknowledged, but etcd may still apply it if it commits it later")
        } else {
            why.to_owned()
        }
    }
}
