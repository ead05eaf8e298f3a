//! The pure formulas of the core, pinned: deterministic jitter (the
//! simulator's replays depend on it), backoff bounds and spread, and the
//! holder's local deadline.

use leasehold::core::{self, backoff_ms, local_deadline_ms, local_lapse_ms, mix64};
use leasehold::{DriftBound, JobId, QueuePolicy};
use std::collections::BTreeSet;

#[test]
fn mix64_is_splitmix64() {
    // Reference outputs of the SplitMix64 finalizer for the states 0 and
    // 0x9E3779B97F4A7C15 (its first two outputs from seed 0).
    assert_eq!(mix64(0), 0xE220_A839_7B1D_CDAF);
    assert_eq!(mix64(0x9E37_79B9_7F4A_7C15), 0x6E78_9E6A_A1B9_65F4);
}

fn policy(seed: u64) -> QueuePolicy {
    QueuePolicy {
        backoff_base_ms: 1000,
        backoff_max_ms: 60_000,
        jitter_seed: seed,
        quarantine_expiries: 0,
    }
}

#[test]
fn backoff_doubles_within_equal_jitter_bounds() {
    for seed in [0, 1, 42, u64::MAX] {
        for id in 1..50 {
            for attempts in 1..12u32 {
                let full = (1000u64 << (attempts - 1)).min(60_000);
                let b = backoff_ms(&policy(seed), JobId(id), attempts);
                assert!(
                    b >= full / 2 && b <= full,
                    "seed {seed} id {id} attempt {attempts}: {b} not in [{}, {full}]",
                    full / 2
                );
            }
        }
    }
    // Attempt counts far past 64 doublings saturate at the maximum.
    let b = backoff_ms(&policy(3), JobId(1), u32::MAX);
    assert!((30_000..=60_000).contains(&b));
    // A zero base means no backoff.
    let zero = QueuePolicy {
        backoff_base_ms: 0,
        ..policy(1)
    };
    assert_eq!(backoff_ms(&zero, JobId(1), 5), 0);
}

#[test]
fn backoff_jitter_spreads_and_depends_on_seed_job_and_attempt() {
    let values: BTreeSet<u64> = (1..200)
        .map(|id| backoff_ms(&policy(9), JobId(id), 1))
        .collect();
    assert!(
        values.len() > 150,
        "jobs retried together must spread out: {} distinct",
        values.len()
    );
    let mean = (1..2000)
        .map(|id| backoff_ms(&policy(9), JobId(id), 1))
        .sum::<u64>()
        / 1999;
    assert!(
        (700..=800).contains(&mean),
        "equal jitter averages 3/4 of the backoff: {mean}"
    );
    let by_seed: BTreeSet<u64> = (0..50)
        .map(|s| backoff_ms(&policy(s), JobId(5), 3))
        .collect();
    assert!(by_seed.len() > 40, "the seed matters");
    let a = backoff_ms(&policy(7), JobId(5), 3);
    let b = backoff_ms(&policy(7), JobId(5), 4);
    assert_ne!(
        a * 2,
        b,
        "attempts are mixed into the jitter, not just doubled"
    );
    // Pinned values: the same seed, job and attempt give the same delay in
    // every build (the simulator's traces depend on it).
    assert_eq!(
        [
            backoff_ms(&policy(42), JobId(7), 1),
            backoff_ms(&policy(42), JobId(7), 3),
            backoff_ms(&policy(0), JobId(1), 2)
        ],
        PINNED
    );
}

const PINNED: [u64; 3] = [814, 3004, 1825];

/// The latest local instant a store's slot can last: its store time left
/// from the answer's arrival, on a local clock up to `ppm` slower (divided
/// by `1 - ppm/1e6`, rounded up), plus the margin and 1 ms.
#[test]
fn local_lapse_stretches_the_store_time_by_a_slow_clock_and_adds_the_margin() {
    let d = DriftBound {
        ppm: 10_000,
        margin_ms: 5,
    };
    // 1,000 / 0.99 = 1,010.1…, rounded up.
    assert_eq!(local_lapse_ms(100, 1_000, d), 100 + 1_011 + 5 + 1);
    assert!(local_lapse_ms(100, 1_000, d) > local_deadline_ms(100, 1_000, d));
    let exact = DriftBound {
        ppm: 0,
        margin_ms: 0,
    };
    assert_eq!(local_lapse_ms(100, 1_000, exact), 1_101);
    // A clock allowed to stop (ppm at or past a million) and the ends of
    // time: saturated, never wrapped.
    let stopped = DriftBound {
        ppm: u32::MAX,
        margin_ms: 0,
    };
    assert_eq!(local_lapse_ms(0, 1, stopped), 1_000_001);
    assert_eq!(local_lapse_ms(u64::MAX - 1, core::MAX_TTL_MS, d), u64::MAX);
    assert_eq!(local_lapse_ms(1, u64::MAX, d), u64::MAX);
}

#[test]
fn local_deadline_subtracts_drift_and_margin() {
    let d = DriftBound {
        ppm: 10_000,
        margin_ms: 5,
    };
    assert_eq!(local_deadline_ms(100, 1000, d), 100 + 1000 - 10 - 5);
    // The drift allowance rounds up.
    let d = DriftBound {
        ppm: 1,
        margin_ms: 0,
    };
    assert_eq!(local_deadline_ms(0, 1000, d), 999);
    // Too short to be valid at all: the deadline is the send time.
    let d = DriftBound {
        ppm: 500_000,
        margin_ms: 1000,
    };
    assert_eq!(local_deadline_ms(50, 1000, d), 50);
    // No overflow at the ends of time.
    assert_eq!(
        local_deadline_ms(u64::MAX - 1, core::MAX_TTL_MS, DriftBound::default()),
        u64::MAX
    );
    let d = DriftBound {
        ppm: u32::MAX,
        margin_ms: 0,
    };
    assert_eq!(local_deadline_ms(7, u64::MAX, d), 7);
    // Either side of where `ttl * ppm` leaves 64 bits, the same rounding
    // as the exact 128-bit formula.
    for ppm in [1, 10_000, 999_999, 1_000_000, u32::MAX] {
        let edge = u64::MAX / u64::from(ppm);
        for ttl in [
            edge - 1,
            edge,
            edge.saturating_add(1),
            edge.saturating_add(2),
            1_000_001,
        ] {
            let drift = (u128::from(ttl) * u128::from(ppm)).div_ceil(1_000_000);
            let want = u128::from(ttl).saturating_sub(drift);
            let d = DriftBound { ppm, margin_ms: 0 };
            assert_eq!(
                u128::from(local_deadline_ms(0, ttl, d)),
                want,
                "ttl {ttl} ppm {ppm}"
            );
        }
    }
}
