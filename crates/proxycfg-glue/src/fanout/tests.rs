//! The shared followers and their subscribers.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

#[tokio::test]
async fn one_task_per_key_stopped_when_its_last_watcher_goes() {
    let fanout: Fanout<&str, u32> = Fanout::new("test", TaskTracker::new());
    let started = Arc::new(AtomicUsize::new(0));
    let (stopped_tx, mut stopped_rx) = tokio::sync::mpsc::unbounded_channel();
    let follow = |key: &'static str| {
        let (started, stopped_tx) = (Arc::clone(&started), stopped_tx.clone());
        fanout.follow(&key, move |publish, stop| {
            started.fetch_add(1, Ordering::SeqCst);
            async move {
                publish.0.publish(Ok(7));
                stop.cancelled().await;
                let _ = stopped_tx.send(key);
            }
        })
    };
    let (a1, a2, b) = (follow("a"), follow("a"), follow("b"));
    assert_eq!(started.load(Ordering::SeqCst), 2, "one task for \"a\", one for \"b\"");
    drop(a1);
    tokio::task::yield_now().await;
    assert!(stopped_rx.try_recv().is_err(), "\"a\" still has a watcher");
    drop(a2);
    assert_eq!(stopped_rx.recv().await, Some("a"));
    // A later watch of "a" starts a fresh task.
    let a3 = follow("a");
    assert_eq!(started.load(Ordering::SeqCst), 3);
    let mut sub = Subscriber::new(a3);
    let value = std::future::poll_fn(|cx| sub.poll_value(cx)).await;
    assert_eq!(value, Some(Ok(7)));
    drop((sub, b));
}

/// Polls once with a waker that counts its wakes.
fn poll_counting<T: Clone>(sub: &mut Subscriber<T>, wakes: &Arc<Counter>) -> Poll<Option<Result<T, DataSourceError>>> {
    let waker = Waker::from(Arc::clone(wakes));
    sub.poll_value(&mut Context::from_waker(&waker))
}

#[derive(Default)]
struct Counter(AtomicUsize);

impl std::task::Wake for Counter {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn subscribers_get_the_latest_value_once_and_are_woken_for_the_next() {
    let fanout: Fanout<&str, u32> = Fanout::new("test", TaskTracker::new());
    let (publisher_tx, publisher_rx) = std::sync::mpsc::channel();
    let entry = fanout.follow(&"k", move |publish, stop| {
        publisher_tx.send(publish).unwrap();
        async move { stop.cancelled().await }
    });
    let publish = publisher_rx.recv().unwrap();
    let (early_wakes, late_wakes) = (Arc::new(Counter::default()), Arc::new(Counter::default()));
    let mut early = Subscriber::new(Arc::clone(&entry));
    assert!(poll_counting(&mut early, &early_wakes).is_pending(), "no value yet");
    assert!(
        poll_counting(&mut early, &early_wakes).is_pending(),
        "polled twice, one waker kept"
    );
    publish.0.publish(Ok(1));
    publish.0.publish(Ok(2));
    assert_eq!(
        early_wakes.0.load(Ordering::SeqCst),
        1,
        "woken once, by the first value"
    );
    assert_eq!(
        poll_counting(&mut early, &early_wakes),
        Poll::Ready(Some(Ok(2))),
        "the latest only"
    );
    assert!(poll_counting(&mut early, &early_wakes).is_pending(), "nothing new");

    // A subscriber that arrives later starts from the current value; a gone subscriber's
    // slot is reused.
    let mut late = Subscriber::new(Arc::clone(&entry));
    assert_eq!(poll_counting(&mut late, &late_wakes), Poll::Ready(Some(Ok(2))));
    drop(late);
    let mut again = Subscriber::new(Arc::clone(&entry));
    assert_eq!(
        entry.latest.inner.lock().wakers.len(),
        2,
        "the gone subscriber's slot reused"
    );
    assert_eq!(poll_counting(&mut again, &late_wakes), Poll::Ready(Some(Ok(2))));

    publish.0.publish(Err(DataSourceError::Unavailable("down".into())));
    assert_eq!(early_wakes.0.load(Ordering::SeqCst), 2);
    assert!(matches!(
        poll_counting(&mut early, &early_wakes),
        Poll::Ready(Some(Err(_)))
    ));
    assert!(poll_counting(&mut early, &early_wakes).is_pending());
    // The follower ends (the store closed): every subscriber is woken, and ends.
    drop(publish);
    assert_eq!(early_wakes.0.load(Ordering::SeqCst), 3);
    assert_eq!(poll_counting(&mut early, &early_wakes), Poll::Ready(None));
    assert!(
        matches!(poll_counting(&mut again, &late_wakes), Poll::Ready(Some(Err(_)))),
        "what was published before the end is still had"
    );
    assert_eq!(poll_counting(&mut again, &late_wakes), Poll::Ready(None));
}
