//! The cache core against a scripted fetcher, under paused time.
#![allow(clippy::unwrap_used)]

use super::*;
use std::collections::VecDeque;

/// Answers each fetch with the next scripted result; with none left, blocks forever (a
/// blocking query that never returns). Records every call's index and time.
#[derive(Default)]
struct Scripted {
    answers: Mutex<VecDeque<Result<Fetched<u32>, FetchError>>>,
    calls: Mutex<Vec<(u64, Instant)>>,
    /// Values at or above this are stale (`CacheType::stale`).
    stale_from: Option<u32>,
}

impl Scripted {
    fn with(answers: Vec<Result<Fetched<u32>, FetchError>>) -> Self {
        Self {
            answers: Mutex::new(answers.into()),
            calls: Mutex::new(Vec::new()),
            stale_from: None,
        }
    }
}

impl CacheType for Arc<Scripted> {
    type Request = &'static str;
    type Value = u32;

    async fn fetch(&self, _: &&'static str, min_index: u64) -> Result<Fetched<u32>, FetchError> {
        self.calls.lock().push((min_index, Instant::now()));
        let next = self.answers.lock().pop_front();
        match next {
            Some(answer) => answer,
            None => std::future::pending().await,
        }
    }

    fn stale(&self, value: &u32) -> bool {
        self.stale_from.is_some_and(|from| *value >= from)
    }
}

fn ok(value: u32, index: u64) -> Result<Fetched<u32>, FetchError> {
    Ok(Fetched { value, index })
}

/// Reads `w` until it holds the value fetched at `index` (watchers get the latest value, so
/// they may skip intermediate ones); returns the values seen.
async fn until_index(w: &mut CacheWatch<u32>, index: u64) -> Vec<u32> {
    let mut seen = Vec::new();
    loop {
        let f = w.next().await.unwrap().unwrap();
        seen.push(f.value);
        if f.index == index {
            return seen;
        }
    }
}

fn cache(s: &Arc<Scripted>, config: CacheConfig) -> Cache<Arc<Scripted>> {
    Cache::new(Arc::clone(s), config, CancellationToken::new())
}

#[tokio::test(start_paused = true)]
async fn watchers_of_one_key_share_one_fetcher_and_follow_its_index() {
    let s = Arc::new(Scripted::with(vec![ok(10, 5), ok(11, 7)]));
    let c = cache(&s, CacheConfig::default());
    let mut a = c.watch(&"roots");
    let mut b = c.watch(&"roots");
    assert_eq!(until_index(&mut a, 7).await.last(), Some(&11));
    assert_eq!(until_index(&mut b, 7).await.last(), Some(&11));
    tokio::task::yield_now().await;
    let indexes: Vec<u64> = s.calls.lock().iter().map(|(i, _)| *i).collect();
    assert_eq!(
        indexes,
        [0, 5, 7],
        "first at 0 (never blocks), then each answer's index"
    );
    assert_eq!(c.metrics().hits.load(Relaxed), 1);
    assert_eq!(c.metrics().entries.load(Relaxed), 1);
    c.shutdown().await;
    assert_eq!(c.metrics().entries.load(Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn an_index_that_goes_backwards_starts_over() {
    let s = Arc::new(Scripted::with(vec![ok(1, 50), ok(2, 20), ok(3, 21)]));
    let c = cache(&s, CacheConfig::default());
    let mut w = c.watch(&"health");
    assert_eq!(until_index(&mut w, 21).await.last(), Some(&3));
    tokio::task::yield_now().await;
    let indexes: Vec<u64> = s.calls.lock().iter().map(|(i, _)| *i).collect();
    assert_eq!(
        indexes,
        [0, 50, 0, 21],
        "after 20 < 50 the next fetch asks from the start"
    );
}

#[tokio::test(start_paused = true)]
async fn an_answer_at_index_0_is_kept_as_1() {
    let s = Arc::new(Scripted::with(vec![ok(1, 0), ok(2, 4)]));
    let c = cache(&s, CacheConfig::default());
    let mut w = c.watch(&"services");
    assert_eq!(until_index(&mut w, 4).await.last(), Some(&2));
    tokio::task::yield_now().await;
    let indexes: Vec<u64> = s.calls.lock().iter().map(|(i, _)| *i).collect();
    assert_eq!(indexes, [0, 1, 4], "the next fetch after an answer at 0 blocks at 1");
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_and_keep_the_last_good_value() {
    let fail = || Err(FetchError::Unavailable("connection refused".into()));
    let s = Arc::new(Scripted::with(vec![fail(), ok(7, 3), fail(), fail(), fail(), ok(8, 4)]));
    let config = CacheConfig {
        first_backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(3),
        ..CacheConfig::default()
    };
    let c = cache(&s, config);
    let start = Instant::now();
    let mut w = c.watch(&"leaf");
    assert!(w.next().await.unwrap().is_err(), "a first fetch that fails is reported");
    assert_eq!(w.next().await.unwrap().unwrap().value, 7);
    // Three failures later the good value is still what watchers have; then the new one.
    assert_eq!(w.next().await.unwrap().unwrap().value, 8);
    let times: Vec<u64> = s
        .calls
        .lock()
        .iter()
        .map(|(_, at)| at.duration_since(start).as_secs())
        .collect();
    // The last fetch is the blocking query parked after the success at 7 s.
    assert_eq!(
        times,
        [0, 1, 1, 2, 4, 7, 7],
        "1 s, then doubling to the 3 s cap, reset by a success"
    );
    assert_eq!(c.metrics().errors.load(Relaxed), 4);
    assert_eq!(c.metrics().fetches.load(Relaxed), 7);
}

#[tokio::test(start_paused = true)]
async fn a_failure_is_reported_once_the_last_good_value_is_stale() {
    let fail = || Err(FetchError::Unavailable("the server refused the CSR".into()));
    // Values from 100 on are stale.
    let s = Arc::new(Scripted {
        stale_from: Some(100),
        ..Scripted::with(vec![ok(1, 3), fail(), ok(100, 4), fail(), fail(), ok(2, 5)])
    });
    let c = cache(&s, CacheConfig::default());
    let mut w = c.watch(&"leaf");
    let mut seen = Vec::new();
    loop {
        let next = w.next().await.unwrap();
        let done = matches!(next, Ok(Fetched { value: 2, .. }));
        seen.push(next.map(|f| f.value).map_err(|e| e.message().to_owned()));
        if done {
            break;
        }
    }
    assert_eq!(seen.first(), Some(&Ok(1)), "{seen:?}");
    let errors: Vec<usize> = (0..seen.len()).filter(|i| seen[*i].is_err()).collect();
    // The failure behind a fresh value stays hidden; behind a stale one it shows, once.
    assert_eq!(errors.len(), 1, "{seen:?}");
    assert_eq!(seen.last(), Some(&Ok(2)));
}

#[tokio::test(start_paused = true)]
async fn fetches_of_a_key_are_at_least_the_minimum_interval_apart() {
    let s = Arc::new(Scripted::with(vec![ok(1, 1), ok(2, 2), ok(3, 3)]));
    let config = CacheConfig {
        min_interval: Duration::from_millis(500),
        ..CacheConfig::default()
    };
    let c = cache(&s, config);
    let start = Instant::now();
    let mut w = c.watch(&"chain");
    until_index(&mut w, 3).await;
    let times: Vec<u128> = s
        .calls
        .lock()
        .iter()
        .map(|(_, at)| at.duration_since(start).as_millis())
        .collect();
    assert_eq!(times, [0, 500, 1000]);
}

#[tokio::test(start_paused = true)]
async fn an_unwatched_entry_lives_for_the_ttl_then_goes() {
    let s = Arc::new(Scripted::with(vec![ok(1, 1), ok(9, 9)]));
    let config = CacheConfig {
        ttl: Duration::from_secs(60),
        ..CacheConfig::default()
    };
    let c = cache(&s, config);
    let mut w = c.watch(&"roots");
    w.next().await.unwrap().unwrap();
    drop(w);
    // Within the TTL a new watcher finds the entry warm (no new fetcher).
    tokio::time::sleep(Duration::from_secs(30)).await;
    let mut again = c.watch(&"roots");
    assert_eq!(
        again.next().await.unwrap().unwrap().value,
        9,
        "the same entry's latest value"
    );
    assert_eq!(c.metrics().hits.load(Relaxed), 1);
    drop(again);
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(c.metrics().entries.load(Relaxed), 0, "expired after the TTL");
    assert!(c.inner.entries.lock().is_empty());
    let fetches = s.calls.lock().len();
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(s.calls.lock().len(), fetches, "its fetcher stopped");
}
