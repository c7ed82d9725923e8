//! An optional global limit on snapshot deliveries per second, shared by every State.

use parking_lot::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Deliveries allowed per second, with a burst allowance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Sustained deliveries per second (must be > 0).
    pub per_second: f64,
    /// Deliveries allowed back to back after a quiet period (at least 1).
    pub burst: u32,
}

/// A generic cell-rate limiter: each acquisition reserves the next free slot, so waiters are
/// served in order and nobody polls.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    interval: Duration,
    burst_span: Duration,
    next_free: Mutex<Option<Instant>>,
}

impl RateLimiter {
    pub(crate) fn new(limit: RateLimit) -> Self {
        let per_second = if limit.per_second.is_finite() && limit.per_second > 0.0 {
            limit.per_second
        } else {
            1.0
        };
        let interval = Duration::from_secs_f64(1.0 / per_second);
        Self {
            interval,
            burst_span: interval * limit.burst.max(1).saturating_sub(1),
            next_free: Mutex::new(None),
        }
    }

    /// Waits for this caller's slot.
    pub(crate) async fn acquire(&self) {
        let now = Instant::now();
        let slot = {
            let mut next = self.next_free.lock();
            let earliest = now.checked_sub(self.burst_span).unwrap_or(now);
            let slot = next.map_or(earliest, |n| n.max(earliest));
            *next = Some(slot + self.interval);
            slot
        };
        if slot > now {
            tokio::time::sleep_until(slot).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn spaces_acquisitions_after_the_burst() {
        let limiter = RateLimiter::new(RateLimit {
            per_second: 10.0,
            burst: 2,
        });
        let start = Instant::now();
        let mut times = Vec::new();
        for _ in 0..4 {
            limiter.acquire().await;
            times.push(Instant::now() - start);
        }
        let ms: Vec<u128> = times.iter().map(|d| d.as_millis()).collect();
        assert_eq!(ms, vec![0, 0, 100, 200]);
    }
}
