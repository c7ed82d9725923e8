//! Exponential back-off, written once for every retry loop in meshd: restarting Envoy
//! epochs and managed daemons, and retrying servers that do not answer.
//!
//! A [`Schedule`] says how long to wait before attempt `n`: nothing for the first
//! `immediate` attempts, then `first`, doubling each attempt, never more than `max`. What to
//! count as an attempt and when to start counting again is the caller's.

use std::time::Duration;

/// How long to wait before each attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// Attempts made without waiting.
    pub immediate: u32,
    /// The wait before the first attempt after the immediate ones.
    pub first: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Schedule {
    /// The wait before attempt `attempt` (the first attempt is 1).
    pub fn delay(&self, attempt: u32) -> Duration {
        if attempt <= self.immediate {
            return Duration::ZERO;
        }
        let doublings = attempt - self.immediate - 1;
        let factor = 1u32.checked_shl(doublings).unwrap_or(u32::MAX);
        self.first.saturating_mul(factor).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immediate_attempts_then_doubling_up_to_the_cap() {
        let s = Schedule {
            immediate: 3,
            first: Duration::from_secs(2),
            max: Duration::from_secs(60),
        };
        let waits: Vec<u64> = (1..=10).map(|n| s.delay(n).as_secs()).collect();
        assert_eq!(waits, [0, 0, 0, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(s.delay(u32::MAX), Duration::from_secs(60), "no overflow");
    }

    #[test]
    fn without_immediate_attempts_the_first_waits_first() {
        let s = Schedule {
            immediate: 0,
            first: Duration::from_millis(200),
            max: Duration::MAX,
        };
        assert_eq!(s.delay(1), Duration::from_millis(200));
        assert_eq!(s.delay(4), Duration::from_millis(1600));
    }
}
