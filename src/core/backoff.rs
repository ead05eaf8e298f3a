//! [`Backoff`]: the one exponential backoff every retry uses: a job's next
//! attempt ([`crate::core::job::backoff_ms`]), an acquire waiting for a
//! held key, the worker loop's idle claims and settle retries, a failed
//! schedule fire, a transaction retried after a transient store error, and
//! the SQLite store's waits for its write lock.
//!
//! # Rule
//! The `n`-th wait (from 0) is drawn from `[d/2, d]` where
//! `d = min(base * 2^n, cap)` ("equal jitter": never less than half the
//! ceiling, so retries spread without collapsing to zero), the draw
//! deterministic in the seed and `n`. Units are the caller's (milliseconds
//! in the client, microseconds in the SQLite busy handler).
//!
//! # Invariants
//! `wait(n) <= wait ceiling(n) <= cap`; ceilings never decrease with `n`;
//! the same seed and `n` give the same wait.

use super::mix64;

/// Exponential backoff with equal jitter; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: u64,
    cap: u64,
    seed: u64,
    attempt: u32,
}

impl Backoff {
    /// Waits starting at `base`, doubling, never above `cap`, jittered
    /// from `seed`.
    pub const fn new(base: u64, cap: u64, seed: u64) -> Self {
        Backoff {
            base,
            cap,
            seed,
            attempt: 0,
        }
    }

    /// The ceiling of the `n`-th wait: `min(base * 2^n, cap)`.
    pub fn ceiling(&self, n: u32) -> u64 {
        self.base.saturating_mul(1u64 << n.min(63)).min(self.cap)
    }

    /// The `n`-th wait: drawn from `[ceiling/2, ceiling]` by the seed.
    pub fn wait(&self, n: u32) -> u64 {
        let ceiling = self.ceiling(n);
        let half = ceiling / 2;
        half + mix64(self.seed ^ (u64::from(n) + 1)) % (ceiling - half + 1)
    }

    /// The next wait, counted: each call waits (about) twice as long as the
    /// one before, up to the cap.
    pub fn next_wait(&mut self) -> u64 {
        let wait = self.wait(self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        wait
    }

    /// Start again from the first wait (after a success).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// Waits drawn since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_within_equal_jitter_up_to_the_cap() {
        for seed in 0..200 {
            let mut b = Backoff::new(10, 1_000, seed);
            for n in 0..12 {
                let ceiling = (10u64 << n).min(1_000);
                assert_eq!(b.ceiling(n), ceiling);
                let w = b.next_wait();
                assert!(
                    (ceiling / 2..=ceiling).contains(&w),
                    "seed {seed} n {n}: {w} outside [{}, {ceiling}]",
                    ceiling / 2
                );
                assert_eq!(w, b.wait(n), "the same seed and n, the same wait");
            }
            assert_eq!(b.attempts(), 12);
            b.reset();
            assert_eq!(b.attempts(), 0);
            assert!(b.next_wait() <= 10, "reset starts again from the base");
        }
    }

    #[test]
    fn jitter_spreads_across_seeds_and_attempts() {
        let b = |seed| Backoff::new(1_000, 1_000, seed);
        let waits: std::collections::BTreeSet<u64> = (0..100).map(|s| b(s).wait(3)).collect();
        assert!(waits.len() > 50, "seeds spread: {} distinct", waits.len());
        let per_n: std::collections::BTreeSet<u64> = (0..40).map(|n| b(7).wait(n)).collect();
        assert!(
            per_n.len() > 20,
            "attempts spread: {} distinct",
            per_n.len()
        );
        let low = (0..1_000).filter(|&s| b(s).wait(0) < 750).count();
        assert!((350..650).contains(&low), "both halves of the range: {low}");
    }

    #[test]
    fn extremes_saturate_without_overflow() {
        let b = Backoff::new(u64::MAX / 2, u64::MAX, 1);
        assert_eq!(b.ceiling(63), u64::MAX);
        assert!(b.wait(200) >= u64::MAX / 2);
        let zero = Backoff::new(0, 0, 1);
        assert_eq!(zero.wait(5), 0);
        let capped = Backoff::new(100, 10, 1);
        assert_eq!(capped.ceiling(0), 10, "the cap bounds even the first wait");
        let mut b = Backoff::new(1, 4, 9);
        b.attempt = u32::MAX;
        assert!(b.next_wait() <= 4);
        assert_eq!(b.attempts(), u32::MAX);
    }
}
