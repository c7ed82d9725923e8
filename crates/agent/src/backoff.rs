//! Randomness for spreading work out, and the back-off used while no server answers.

use std::time::Duration;

/// A random number in `0..n` (0 when `n` is 0).
pub fn below(n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    fastrand::u64(0..n)
}

/// `d` minus up to `fraction` of itself, at random: periodic work of many agents spreads out
/// instead of arriving at the servers together.
pub fn jittered(d: Duration, fraction: f64) -> Duration {
    let span = (d.as_nanos() as f64 * fraction.clamp(0.0, 1.0)) as u64;
    d.saturating_sub(Duration::from_nanos(below(span)))
}

/// Exponential back-off: `base`, doubling per failure, capped at `max`, each step jittered by
/// up to a quarter; `reset` after a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    /// A back-off starting at `base` and never waiting longer than `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self { base, max, failures: 0 }
    }

    /// The wait before the next attempt after one more failure.
    pub fn next_delay(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let schedule = backoff_schedule::Schedule {
            immediate: 0,
            first: self.base,
            max: self.max,
        };
        jittered(schedule.delay(self.failures), 0.25)
    }

    /// Failures since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Back to the first step.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_with_bounded_jitter() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        let mut expected = [1u64, 2, 4, 8, 16, 30, 30].into_iter();
        for _ in 0..7 {
            let d = b.next_delay();
            let e = Duration::from_secs(expected.next().unwrap());
            assert!(d <= e && d >= e.mul_f64(0.75), "{d:?} vs {e:?}");
        }
        assert_eq!(b.failures(), 7);
        b.reset();
        assert!(b.next_delay() <= Duration::from_secs(1));
    }

    #[test]
    fn below_stays_below() {
        assert_eq!(below(0), 0);
        assert!((0..100).all(|_| below(3) < 3));
    }
}
