//! Restart back-off of managed daemons (Consul 1.4's schedule).

use backoff_schedule::Schedule;
use std::time::Duration;
use tokio::time::Instant;

/// Restart back-off constants (Consul 1.4's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Attempts made without waiting.
    pub immediate: u32,
    /// The longest wait between attempts.
    pub max_wait: Duration,
    /// A process that ran this long resets the attempt count.
    pub healthy_after: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            immediate: 3,
            max_wait: Duration::from_secs(60),
            healthy_after: Duration::from_secs(10),
        }
    }
}

impl RestartPolicy {
    /// The waits: `immediate` attempts at once, then 2 s doubling up to `max_wait`.
    fn schedule(&self) -> Schedule {
        Schedule {
            immediate: self.immediate,
            first: Duration::from_secs(2),
            max: self.max_wait,
        }
    }
}

/// The attempt counter of one daemon.
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: RestartPolicy,
    attempts: u32,
    last_start: Option<Instant>,
}

impl Backoff {
    /// A fresh counter.
    pub fn new(policy: RestartPolicy) -> Self {
        Self {
            policy,
            attempts: 0,
            last_start: None,
        }
    }

    /// Counts an attempt about to be made at `now` and returns how long to wait before it.
    /// The first start is attempt 1.
    pub fn next_attempt(&mut self, now: Instant) -> Duration {
        if self
            .last_start
            .is_some_and(|s| now.duration_since(s) >= self.policy.healthy_after)
        {
            self.attempts = 0;
        }
        self.attempts = self.attempts.saturating_add(1);
        self.policy.schedule().delay(self.attempts)
    }

    /// Records that the process started (or was adopted) at `at`.
    pub fn started(&mut self, at: Instant) {
        self.last_start = Some(at);
    }

    /// Attempts counted so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_schedule_is_three_immediate_then_doubling_seconds_capped_at_a_minute() {
        let t0 = Instant::now();
        let mut b = Backoff::new(RestartPolicy::default());
        let waits: Vec<u64> = (0..12)
            .map(|_| {
                let w = b.next_attempt(t0);
                b.started(t0);
                w.as_secs()
            })
            .collect();
        assert_eq!(waits, [0, 0, 0, 2, 4, 8, 16, 32, 60, 60, 60, 60]);
    }

    #[test]
    fn backoff_count_resets_after_ten_seconds_healthy() {
        let t0 = Instant::now();
        let mut b = Backoff::new(RestartPolicy::default());
        for _ in 0..5 {
            b.next_attempt(t0);
            b.started(t0);
        }
        // Ran 9.9 s: not healthy yet, the count goes on.
        assert_eq!(
            b.next_attempt(t0 + Duration::from_millis(9_900)),
            Duration::from_secs(8)
        );
        b.started(t0 + Duration::from_secs(10));
        // Ran 10 s since its start: back to an immediate attempt 1.
        assert_eq!(b.next_attempt(t0 + Duration::from_secs(20)), Duration::ZERO);
        assert_eq!(b.attempts(), 1);
    }
}
