//! The conformance suite: written once, run against every `Store`.
//!
//! Each case drives the pure rules (`leasehold::core`) through a store whose
//! clock is a `ManualClock`, so boundary instants are exact. A store joins
//! the suite with one line: `conformance_cases!(|clock| make_store(clock));`
//! in `main.rs`.

use leasehold::core::{self, lease::LeaseInfo, JobQuery, Txn};
use leasehold::{
    Error, Holder, HolderId, JobId, JobRecord, JobSpec, JobState, LostReason, ManualClock,
    QueuePolicy, StateCounts, Store, StoreExt,
};
use std::sync::Arc;

/// Builds a fresh, empty store on the given clock.
pub type Make = dyn Fn(&ManualClock) -> Arc<dyn Store>;

pub const T0: u64 = 1_000_000;

pub struct World {
    pub store: Arc<dyn Store>,
    pub clock: ManualClock,
    pub policy: QueuePolicy,
}

pub fn holder(n: u128) -> Holder {
    Holder::with_label(HolderId(n), &format!("h{n}")).unwrap()
}

impl World {
    pub fn new(make: &Make) -> World {
        let clock = ManualClock::new(T0);
        World {
            store: make(&clock),
            clock,
            policy: QueuePolicy {
                backoff_base_ms: 100,
                backoff_max_ms: 10_000,
                jitter_seed: 7,
                quarantine_expiries: 0,
            },
        }
    }

    pub fn at(&self, now_ms: u64) {
        self.clock.set(now_ms);
    }

    pub fn tx<R>(
        &self,
        f: impl FnMut(&mut dyn Txn) -> leasehold::Result<R>,
    ) -> leasehold::Result<R> {
        self.store.txn(f)
    }

    pub fn acquire(
        &self,
        key: &str,
        h: u128,
        ttl: u64,
        limit: u32,
    ) -> leasehold::Result<core::Grant> {
        let holder = holder(h);
        self.tx(|tx| core::lease::acquire(tx, key, &holder, ttl, limit))
    }

    pub fn renew(
        &self,
        key: &str,
        h: u128,
        token: u64,
        ttl: u64,
    ) -> leasehold::Result<core::Grant> {
        self.tx(|tx| core::lease::renew(tx, key, HolderId(h), token, ttl))
    }

    pub fn release(&self, key: &str, h: u128, token: u64) -> leasehold::Result<()> {
        self.tx(|tx| core::lease::release(tx, key, HolderId(h), token))
    }

    pub fn inspect(&self, key: &str) -> LeaseInfo {
        self.tx(|tx| core::lease::inspect(tx, key)).unwrap()
    }

    pub fn push(&self, queue: &str, spec: JobSpec) -> JobId {
        self.tx(|tx| core::job::enqueue(tx, queue, &spec, &QueuePolicy::default()))
            .unwrap()
            .id
    }

    pub fn claim(&self, queue: &str, h: u128, lease: u64, max: usize) -> Vec<JobRecord> {
        let policy = self.policy;
        self.tx(|tx| core::job::claim(tx, queue, HolderId(h), lease, max, &policy))
            .unwrap()
    }

    pub fn claim_one(&self, queue: &str, h: u128, lease: u64) -> JobRecord {
        let mut jobs = self.claim(queue, h, lease, 1);
        assert_eq!(jobs.len(), 1, "expected one claimable job");
        jobs.remove(0)
    }

    pub fn complete(&self, job: &JobRecord, h: u128) -> leasehold::Result<()> {
        let token = job.claim.unwrap().token;
        self.tx(|tx| core::job::complete(tx, job.id, HolderId(h), token))
    }

    pub fn fail(&self, job: &JobRecord, h: u128, reason: &str) -> leasehold::Result<JobState> {
        let token = job.claim.unwrap().token;
        let policy = self.policy;
        self.tx(|tx| core::job::fail(tx, job.id, HolderId(h), token, reason, &policy))
    }

    pub fn get(&self, id: JobId) -> JobRecord {
        let policy = self.policy;
        self.tx(|tx| core::job::get(tx, id, &policy)).unwrap()
    }

    pub fn stats(&self, queue: &str) -> StateCounts {
        let policy = self.policy;
        self.tx(|tx| core::job::stats(tx, queue, &policy)).unwrap()
    }

    pub fn list(&self, queue: &str, state: Option<JobState>) -> Vec<JobRecord> {
        let policy = self.policy;
        self.tx(|tx| core::job::list(tx, queue, state, JobId(0), 10_000, &policy))
            .unwrap()
    }

    /// Everything observable about the given keys and queues, for
    /// "nothing changed" checks.
    pub fn snapshot(&self, keys: &[&str], queues: &[&str]) -> String {
        let mut out = String::new();
        for key in keys {
            out += &format!("{key}: {:?}\n", self.inspect(key).holders);
            out += &format!("{key} last: {}\n", self.inspect(key).last_token);
        }
        for q in queues {
            out += &format!("{q}: {:?}\n", self.stats(q));
            for job in self.list(q, None) {
                out += &format!("{job:?}\n");
            }
        }
        out
    }
}

fn lost_reason<T: std::fmt::Debug>(r: leasehold::Result<T>) -> LostReason {
    match r {
        Err(Error::Lost { reason, .. }) => reason,
        other => panic!("expected Lost, got {other:?}"),
    }
}

fn counts(
    ready: u64,
    scheduled: u64,
    running: u64,
    done: u64,
    dead: u64,
    cancelled: u64,
) -> StateCounts {
    StateCounts([ready, scheduled, running, done, dead, cancelled, 0])
}

mod batches;
mod deps;
mod flow;
mod jobs;
mod leases;
mod limits;
mod listing;
mod progress;
mod rates;
mod schedules;
mod unique;
pub use batches::*;
pub use deps::*;
pub use flow::*;
pub use jobs::*;
pub use leases::*;
pub use limits::*;
pub use listing::*;
pub use progress::*;
pub use rates::*;
pub use schedules::*;
pub use unique::*;

/// Generates one `#[test]` per lease case for a store factory. With
/// `@guard GUARD;` first, each case runs only when `GUARD()` is true (a
/// store that needs a server prints why it skips).
#[macro_export]
macro_rules! conformance_lease_cases {
    (@guard $guard:expr; $make:expr) => {
        $crate::conformance_cases!(@cases $guard, $make;
            lease_exclusive_then_released, lease_expiry_boundary, lease_renew_and_reacquire,
            lease_identity_checks, lease_counting, lease_limit_belongs_to_the_key,
            lease_inspect_creates_nothing,
            lease_hostile_keys, txn_lease_rolls_back_on_error, txn_rolls_back_each_of_many_leases, store_clock_never_goes_back,
            lease_list_shows_live_holders_only, lease_list_pages_through_every_key
        );
    };
    ($make:expr) => {
        $crate::conformance_lease_cases!(@guard || true; $make);
    };
}

/// Generates one `#[test]` per case (leases and jobs) for a store factory
/// (`@guard` as in [`conformance_lease_cases`]).
#[macro_export]
macro_rules! conformance_cases {
    (@guard $guard:expr; $make:expr) => {
        $crate::conformance_lease_cases!(@guard $guard; $make);
        $crate::conformance_cases!(@cases $guard, $make;
            txn_rolls_back_on_error,
            job_claim_order, job_priority_beats_earlier_run_at, job_lifecycle_complete,
            job_heartbeat_extends_claim, job_expiry_counts_attempt, job_quarantine_crash_loop,
            job_claim_after_expiry_takes_only_ready_jobs,
            job_fail_backoff_then_dead, job_cancel_and_retry,
            job_retry_takes_exactly_the_retryable_states, job_unique_key, job_batch_claim,
            job_purge, job_list_pages_and_filters, job_drain_rule, job_scans_are_ordered,
            job_unique_key_freed_by_a_final_expiry, job_batch_heartbeat_and_settle,
            job_time_driven_changes_are_complete_and_visible, job_hostile_queue_names,
            job_queues_are_listed, job_pages_follow_each_states_index_order,
            job_summary_counts_oldest_ready_and_finished_per_interval,
            job_summary_settles_expired_claims_and_refuses_bad_options,
            job_next_change_is_the_first_due_or_expiry, job_pages_list_empty_payloads,
            job_settle_again_finds_its_own_outcome,
            queue_pause_starts_nothing_until_resumed, queue_pause_checks_its_input_and_rolls_back,
            queue_concurrency_limit_holds_across_holders, queue_per_key_limit_runs_one_per_key,
            queue_per_key_slot_frees_on_expiry_and_cancel, queue_per_key_slot_frees_in_a_settle_batch,
            queue_limits_raised_or_cleared_free_waiting_jobs, queue_blocked_key_backlog_is_set_aside,
            queue_limits_check_their_input_and_roll_back, job_timeout_caps_the_claim_and_its_renewals,
            queue_rate_holds_per_sliding_window, queue_per_key_rate_parks_and_wakes_a_key,
            queue_rates_and_concurrency_hold_together, queue_rates_check_their_input_and_roll_back,
            queue_idle_rate_buckets_are_purged,
            job_unique_for_blocks_within_the_period_whatever_the_state,
            job_unique_states_say_which_states_block, job_unique_options_check_their_input,
            job_progress_is_fenced_kept_and_cleared_by_a_new_claim,
            job_after_waits_until_every_named_job_is_done,
            job_after_a_failed_parent_cancels_its_waiters,
            job_after_checks_its_input_and_blocks_its_unique_key,
            job_after_chains_end_in_one_transaction, job_push_many_is_all_or_nothing_in_order
        );
        $crate::conformance_cases!(@cases $guard, $make;
            schedule_put_list_remove, schedule_fires_each_tick_once,
            schedule_missed_ticks_skipped_or_caught_up, schedule_cron_in_a_time_zone,
            schedule_bad_input_changes_nothing, schedule_txn_rolls_back,
            schedule_jobs_follow_the_template_but_not_its_key_or_delay
        );
    };
    (@cases $guard:expr, $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let run: fn() -> bool = $guard;
                if !run() {
                    return;
                }
                let make: &$crate::suite::Make = &$make;
                $crate::suite::$case(make);
            }
        )*
    };
    ($make:expr) => {
        $crate::conformance_cases!(@guard || true; $make);
    };
}
