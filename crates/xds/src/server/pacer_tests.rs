//! The setup pacer: bursts, spacing, and refusals that take no slot (paused time).

use super::*;

fn pacer(rate: f64, burst: u32) -> Pacer {
    Pacer::new(&Admission {
        max_streams: 10,
        setup_rate: rate,
        setup_burst: burst,
    })
}

#[tokio::test(start_paused = true)]
async fn a_burst_goes_at_once_then_streams_are_spaced_by_the_rate() {
    let p = pacer(10.0, 3);
    let now = Instant::now();
    for _ in 0..3 {
        assert_eq!(p.slot(MAX_SETUP_WAIT), Some(now));
    }
    assert_eq!(p.slot(MAX_SETUP_WAIT), Some(now + Duration::from_millis(100)));
    assert_eq!(p.slot(MAX_SETUP_WAIT), Some(now + Duration::from_millis(200)));
}

#[tokio::test(start_paused = true)]
async fn a_refused_stream_takes_no_slot() {
    // 10 per second, no burst, at most 1 s of queue: 10 streams are queued, the rest are
    // refused however many come, and once the queue drains new streams are served.
    let p = pacer(10.0, 1);
    let now = Instant::now();
    let max = Duration::from_secs(1);
    let queued = (0..100).filter_map(|_| p.slot(max)).collect::<Vec<_>>();
    assert_eq!(queued.len(), 11, "{queued:?}");
    assert_eq!(*queued.last().unwrap(), now + max);
    // The refusals did not move the schedule: half a second on, five slots are free.
    tokio::time::advance(Duration::from_millis(500)).await;
    let after = (0..100).filter_map(|_| p.slot(max)).count();
    assert_eq!(after, 5);
}
