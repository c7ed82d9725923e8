//! The tracker on its own: the versions it reports per type, and stuck detection at its real
//! thresholds (10 s, 30 s) in paused time.

use super::*;
use crate::resources::{CLUSTER, ENDPOINT};
use tokio_util::sync::CancellationToken;

fn sent<'r>(type_url: &'r str, nonce: &'r str, resources: &[(&'r str, &'r str)], removed: &'r [String]) -> Sent<'r> {
    Sent {
        type_url,
        nonce,
        version: "",
        resources: resources.to_vec(),
        removed,
        replaces: false,
    }
}

fn type_status(tracker: &Tracker, type_url: &str) -> TypeStatus {
    let report = tracker.report();
    report[0]
        .types
        .iter()
        .find(|t| t.type_url == type_url)
        .cloned()
        .unwrap_or_else(|| panic!("no {type_url} in {report:?}"))
}

/// Delta: a type's version is the digest of what the stream holds after each response, the
/// same however it got there; the version acknowledged is the one of the response the ACK
/// answers.
#[test]
fn a_delta_types_version_is_the_digest_of_the_resources_sent() {
    let one = Arc::new(Tracker::default());
    let a = one.open("delta", "web");
    a.view.sent(sent(CLUSTER, "1", &[("a", "1"), ("b", "1")], &[]));
    let first = type_status(&one, CLUSTER).last_sent.unwrap().version;
    assert_eq!(first.len(), 32);
    a.view.answered(CLUSTER, "1", None);
    let acked = type_status(&one, CLUSTER).last_acked.unwrap();
    assert_eq!((acked.nonce.as_str(), acked.version.as_str()), ("1", first.as_str()));
    // b changes, a goes, c comes: in two responses.
    a.view.sent(sent(CLUSTER, "2", &[("b", "2")], &["a".to_owned()]));
    a.view.sent(sent(CLUSTER, "3", &[("c", "1")], &[]));
    let now = type_status(&one, CLUSTER);
    assert_eq!(now.last_acked.unwrap().version, first, "not yet acknowledged");
    let version = now.last_sent.unwrap().version;
    assert_ne!(version, first);

    // Another stream sent the same set at once has the same version.
    let other = Arc::new(Tracker::default());
    let b = other.open("delta", "web");
    b.view.sent(sent(CLUSTER, "1", &[("c", "1"), ("b", "2")], &[]));
    assert_eq!(type_status(&other, CLUSTER).last_sent.unwrap().version, version);
    // Resending a resource unchanged keeps the version.
    b.view.sent(sent(CLUSTER, "2", &[("c", "1")], &[]));
    assert_eq!(type_status(&other, CLUSTER).last_sent.unwrap().version, version);
    // An ACK of the later response answers the earlier one too.
    a.view.answered(CLUSTER, "3", None);
    let acked = type_status(&one, CLUSTER).last_acked.unwrap();
    assert_eq!((acked.nonce.as_str(), acked.version), ("3", version));
    assert_eq!(type_status(&one, CLUSTER).pending, 0);
}

/// SotW: the versions are the responses' own.
#[test]
fn a_sotw_types_version_is_its_version_info() {
    let tracker = Arc::new(Tracker::default());
    let s = tracker.open("sotw", "web");
    s.view.sent(Sent {
        type_url: ENDPOINT,
        nonce: "1",
        version: "v-one",
        resources: vec![("a", "1")],
        removed: &[],
        replaces: true,
    });
    s.view.answered(ENDPOINT, "1", None);
    let t = type_status(&tracker, ENDPOINT);
    assert_eq!(t.last_sent.unwrap().version, "v-one");
    assert_eq!(t.last_acked.unwrap().version, "v-one");
}

/// Moves paused time to `at` after `start` in steps of 100 ms, letting the scan run after
/// each (so that it ticks exactly every 500 ms, as in real time).
async fn run_until(start: Instant, at: Duration) {
    while start.elapsed() < at {
        tokio::time::advance(Duration::from_millis(100)).await;
        tokio::task::yield_now().await;
    }
    assert_eq!(start.elapsed(), at);
}

/// A tracker scanning for stuck streams, and one stream it has just seen a push on.
struct Pushed {
    tracker: Arc<Tracker>,
    metrics: Arc<XdsMetrics>,
    stop: CancellationToken,
    /// When the push was sent.
    start: Instant,
    stream: ViewGuard,
}

async fn pushed() -> Pushed {
    let tracker = Arc::new(Tracker::default());
    let metrics = Arc::new(XdsMetrics::default());
    let stop = CancellationToken::new();
    tracker.start_scanning(Arc::clone(&metrics), stop.clone());
    // The scan's first sleep starts now.
    tokio::task::yield_now().await;
    let start = Instant::now();
    let stream = tracker.open("delta", "web");
    stream.view.sent(sent(CLUSTER, "1", &[("a", "1")], &[]));
    Pushed {
        tracker,
        metrics,
        stop,
        start,
        stream,
    }
}

/// A push left unanswered: not flagged at 9.9 s, flagged (and counted, once) at 10 s, not
/// reset at 29.9 s, told to reset (and counted, once) at 30 s.
#[tokio::test(start_paused = true)]
async fn an_unanswered_push_is_flagged_at_10_s_and_reset_at_30_s() {
    let Pushed {
        tracker,
        metrics,
        stop,
        start,
        stream,
    } = pushed().await;
    let stuck = || tracker.report()[0].stuck;
    let reset_asked = || futures_util::FutureExt::now_or_never(stream.view.reset.notified()).is_some();

    run_until(start, Duration::from_millis(9_900)).await;
    assert!(!stuck(), "not flagged at 9.9 s");
    assert_eq!(metrics.streams_stuck(), 0);

    run_until(start, STUCK_AFTER).await;
    assert!(stuck(), "flagged at 10 s");
    assert_eq!(metrics.streams_stuck(), 1);

    run_until(start, Duration::from_millis(29_900)).await;
    assert_eq!(metrics.streams_stuck(), 1, "counted once");
    assert_eq!(metrics.streams_stuck_reset(), 0);
    assert!(!reset_asked(), "not reset at 29.9 s");

    run_until(start, RESET_AFTER).await;
    assert_eq!(metrics.streams_stuck_reset(), 1);
    assert!(reset_asked(), "told to reset at 30 s");

    run_until(start, Duration::from_secs(32)).await;
    assert_eq!(metrics.streams_stuck_reset(), 1, "counted once while the stream ends");
    stop.cancel();
}

/// An answer before 10 s: never flagged.
#[tokio::test(start_paused = true)]
async fn a_push_answered_at_9_9_s_is_not_flagged() {
    let Pushed {
        tracker,
        metrics,
        stop,
        start,
        stream,
    } = pushed().await;
    run_until(start, Duration::from_millis(9_900)).await;
    stream.view.answered(CLUSTER, "1", None);
    run_until(start, Duration::from_secs(40)).await;
    assert!(!tracker.report()[0].stuck);
    assert_eq!((metrics.streams_stuck(), metrics.streams_stuck_reset()), (0, 0));
    stop.cancel();
}
