//! The token-continuity rule across a failover (issue 29 §2), as a model:
//! a primary grants leases and claims; an asynchronous standby holds the
//! state of some earlier instant (the grants after it are lost with the
//! primary); the standby is promoted and grants on. Every token it grants
//! a key or a job is above every token the primary granted it, lost or
//! not — because promotion raises the store's token floor
//! (`core::lease::promoted_floor`, what PostgreSQL's fence sets on a new
//! timeline). Without the promotion the same histories repeat tokens: the
//! model catches that (the last test), so it can fail.
//!
//! The real servers (two PostgreSQL clusters, a primary killed, a standby
//! promoted) are in `tests/failover.rs`.

use leasehold::{Client, JobSpec, ManualClock, MemStore};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone)]
enum Op {
    /// Acquire key `k` for `ttl` ms (refused while held: no token).
    Acquire(u8, u64),
    /// Push a job to the queue.
    Push,
    /// Claim a job for `lease` ms and complete it (`true`) or leave it
    /// running (its claim runs out and it is claimed again).
    Claim(u64, bool),
    /// Let time pass.
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..3, 1u64..50).prop_map(|(k, t)| Op::Acquire(k, t)),
        Just(Op::Push),
        (1u64..50, any::<bool>()).prop_map(|(l, c)| Op::Claim(l, c)),
        (1u64..60).prop_map(Op::Advance),
    ]
}

/// Tokens granted, per key (`k0`) or job (`j7`).
type Granted = BTreeMap<String, Vec<u64>>;

fn apply(store: &Arc<MemStore>, clock: &ManualClock, ops: &[Op], granted: &mut Granted) {
    let client = Client::builder_shared(store.clone())
        .clock(Arc::new(clock.clone()))
        .build();
    let queue = client.queue("q").unwrap();
    for op in ops {
        match op {
            Op::Acquire(k, ttl) => {
                let key = format!("k{k}");
                if let Ok(guard) = client.try_acquire(&key, Duration::from_millis(*ttl)) {
                    granted.entry(key).or_default().push(guard.token());
                    // Held on: its expiry frees the key, not a release.
                    std::mem::forget(guard);
                }
            }
            Op::Push => {
                queue.push(&JobSpec::new("x")).unwrap();
            }
            Op::Claim(lease, complete) => {
                if let Some(job) = queue.claim(Duration::from_millis(*lease)).unwrap() {
                    granted
                        .entry(format!("j{}", job.id()))
                        .or_default()
                        .push(job.token());
                    if *complete {
                        job.complete().unwrap();
                    } else {
                        std::mem::forget(job);
                    }
                }
            }
            Op::Advance(ms) => clock.advance(*ms),
        }
    }
}

/// Run the history; the first token the promoted standby granted that the
/// primary had granted before (or below one it had), if any.
fn repeated(before: &[Op], lost: &[Op], after: &[Op], promote: bool) -> Option<String> {
    let clock = ManualClock::new(1_000_000);
    let primary = Arc::new(MemStore::with_clock(Arc::new(clock.clone())));
    let mut on_primary = Granted::new();
    apply(&primary, &clock, before, &mut on_primary);
    let standby = Arc::new(primary.standby_copy());
    apply(&primary, &clock, lost, &mut on_primary);
    if promote {
        standby.promote();
    }
    let mut on_standby = Granted::new();
    apply(&standby, &clock, after, &mut on_standby);
    for (name, tokens) in &on_standby {
        let old_max = on_primary.get(name).and_then(|t| t.iter().max()).copied();
        for pair in tokens.windows(2) {
            if pair[1] <= pair[0] {
                return Some(format!("{name}: {} after {}", pair[1], pair[0]));
            }
        }
        if let (Some(first), Some(old)) = (tokens.first(), old_max) {
            if *first <= old {
                return Some(format!(
                    "{name}: {first} granted again (the primary reached {old})"
                ));
            }
        }
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_promoted_standby_never_grants_a_token_the_primary_granted(
        before in prop::collection::vec(op(), 0..30),
        lost in prop::collection::vec(op(), 1..30),
        after in prop::collection::vec(op(), 1..30),
    ) {
        let found = repeated(&before, &lost, &after, true);
        prop_assert!(found.is_none(), "{}", found.unwrap_or_default());
    }
}

#[test]
fn without_the_promotion_the_model_sees_tokens_repeat() {
    // A grant lost with the primary, then the same key granted again.
    let lease = repeated(
        &[Op::Acquire(0, 5), Op::Advance(10)],
        &[Op::Acquire(0, 5), Op::Advance(10)],
        &[Op::Acquire(0, 5)],
        false,
    );
    assert!(lease.is_some_and(|r| r.starts_with("k0")));
    // A claim lost with the primary, then the job claimed again.
    let job = repeated(
        &[Op::Push],
        &[Op::Claim(5, false), Op::Advance(10)],
        &[Op::Claim(5, true)],
        false,
    );
    assert!(job.is_some_and(|r| r.starts_with('j')));
    // And with it, neither repeats.
    assert_eq!(
        repeated(
            &[Op::Acquire(0, 5), Op::Advance(10), Op::Push],
            &[
                Op::Acquire(0, 5),
                Op::Advance(10),
                Op::Claim(5, false),
                Op::Advance(10)
            ],
            &[Op::Acquire(0, 5), Op::Claim(5, true)],
            true,
        ),
        None
    );
}
