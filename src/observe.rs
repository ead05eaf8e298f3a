//! Observability: `tracing` spans and events, and `metrics` counters,
//! histograms and gauges. Nothing here decides anything: the rules record
//! their transitions as [`Event`]s in a transaction's journal, and this
//! module reports them once the transaction has committed
//! ([`crate::store::StoreExt::txn`]); the client reports what only it
//! sees (a loss, a handler's run time, the queue depths a worker samples).
//!
//! Without a `tracing` subscriber or a `metrics` recorder installed,
//! [`active`] is false and nothing is recorded or reported: a transaction
//! then allocates nothing for its events.
//!
//! # Metrics
//! | name | kind | labels |
//! |---|---|---|
//! | `leasehold_lease_transitions_total` | counter | `transition` (granted, renewed, released, expired, lost) |
//! | `leasehold_job_transitions_total` | counter | `queue`, `transition` (enqueued, claimed, heartbeat, completed, failed, expired, retried, dead, quarantined, cancelled, abandoned) |
//! | `leasehold_schedule_ticks_total` | counter | `queue`, `transition` (enqueued, caught_up, skipped) |
//! | `leasehold_transaction_seconds` | histogram | `op`, `outcome` (ok, error) |
//! | `leasehold_job_wait_seconds` | histogram | `queue`: claimable to claimed |
//! | `leasehold_job_run_seconds` | histogram | `queue`: claimed to settled, as the worker saw it |
//! | `leasehold_queue_jobs` | gauge | `queue`, `state`: sampled by workers |
//!
//! # Tracing
//! One span per store transaction (`leasehold.txn`, with `op`), one event
//! per transition (targets `leasehold::lease` and `leasehold::job`, with
//! `key`, `holder`, `token` / `queue`, `job_id`, `token`, `attempt`).
//! Levels: renewals and heartbeats are TRACE/DEBUG, grants, releases and
//! job progress DEBUG or INFO, losses, expiries, dead and quarantined jobs
//! WARN.

use crate::core::schedule::TickChange;
use crate::core::{Event, HolderId, JobChange, JobState, LeaseChange, StateCounts};
use crate::error::{LostReason, Target};
use std::sync::Arc;
use std::time::Duration;

/// Whether anyone listens: a `tracing` subscriber that takes some level,
/// or a `metrics` recorder. (`metrics` has no "is a recorder installed"
/// call; its no-op recorder is the only zero-sized one in practice, and a
/// recorder that keeps anything is not zero-sized.)
pub(crate) fn active() -> bool {
    tracing::level_filters::LevelFilter::current() != tracing::level_filters::LevelFilter::OFF
        || metrics::with_recorder(|r| std::mem::size_of_val(r) != 0)
}

/// Report the transitions of a committed transaction.
pub(crate) fn committed(events: &[Event]) {
    for event in events {
        match event {
            Event::Lease {
                key,
                holder,
                token,
                change,
            } => lease(key, *holder, *token, *change),
            Event::Job {
                queue,
                id,
                token,
                attempt,
                change,
            } => job(queue, id.0, *token, *attempt, *change),
            Event::Tick {
                queue,
                schedule,
                tick_ms,
                change,
            } => tick(queue, schedule, *tick_ms, *change),
        }
    }
}

fn lease(key: &str, holder: HolderId, token: u64, change: LeaseChange) {
    let name = change.name();
    macro_rules! ev {
        ($level:ident, $($field:tt)*) => {
            tracing::$level!(target: "leasehold::lease", key, holder = %holder, token, $($field)*)
        };
    }
    match change {
        LeaseChange::Granted { ttl_ms } => ev!(info, ttl_ms, "lease granted"),
        LeaseChange::Renewed { ttl_ms } => ev!(debug, ttl_ms, "lease renewed"),
        LeaseChange::Released => ev!(info, "lease released"),
        LeaseChange::Expired => ev!(warn, "lease expired"),
    }
    metrics::counter!("leasehold_lease_transitions_total", "transition" => name).increment(1);
}

fn job(queue: &Arc<str>, job_id: u64, token: u64, attempt: u32, change: JobChange) {
    let q: &str = queue;
    macro_rules! ev {
        ($level:ident, $($field:tt)*) => {
            tracing::$level!(target: "leasehold::job", queue = q, job_id, token, attempt, $($field)*)
        };
    }
    match change {
        JobChange::Enqueued => ev!(debug, "job enqueued"),
        JobChange::Claimed { wait_ms } => {
            ev!(debug, wait_ms, "job claimed");
            metrics::histogram!("leasehold_job_wait_seconds", "queue" => queue.clone())
                .record(wait_ms as f64 / 1000.0);
        }
        JobChange::Heartbeat => ev!(trace, "job heartbeat"),
        JobChange::Completed => ev!(debug, "job completed"),
        JobChange::Failed => ev!(info, "job failed"),
        JobChange::Expired => ev!(warn, "job claim expired"),
        JobChange::Retried { delay_ms } => ev!(info, delay_ms, "job retried"),
        JobChange::Dead => ev!(warn, "job dead"),
        JobChange::Quarantined => ev!(warn, "job quarantined (crash loop)"),
        JobChange::Cancelled => ev!(info, "job cancelled"),
        JobChange::Abandoned => ev!(info, "job abandoned by its worker"),
        JobChange::Released => ev!(debug, "job released: the jobs it waited for ended"),
    }
    metrics::counter!(
        "leasehold_job_transitions_total",
        "queue" => queue.clone(),
        "transition" => change.name()
    )
    .increment(1);
}

fn tick(queue: &Arc<str>, schedule: &str, tick_ms: u64, change: TickChange) {
    let q: &str = queue;
    let tick = crate::core::schedule::tick_text(tick_ms);
    match change {
        TickChange::Enqueued { id, catch_up } => {
            tracing::info!(target: "leasehold::schedule", queue = q, schedule, tick, job_id = id.0, catch_up, "schedule tick enqueued");
        }
        TickChange::Skipped => {
            tracing::warn!(target: "leasehold::schedule", queue = q, schedule, tick, "schedule ticks missed and skipped");
        }
    }
    metrics::counter!(
        "leasehold_schedule_ticks_total",
        "queue" => queue.clone(),
        "transition" => change.name()
    )
    .increment(1);
}

/// The span of one store transaction.
pub(crate) fn txn_span(op: &'static str) -> tracing::span::EnteredSpan {
    tracing::debug_span!("leasehold.txn", op).entered()
}

/// When a measured operation started (real time, for latency metrics
/// only; never an input to a rule).
pub(crate) struct Started(std::time::Instant);

impl Started {
    #[allow(clippy::disallowed_methods)] // a latency measurement, not a rule's clock
    pub(crate) fn now() -> Started {
        Started(std::time::Instant::now())
    }
}

/// A store transaction that started at `started` ended.
pub(crate) fn transaction(op: &'static str, started: Started, ok: bool) {
    let elapsed = started.0.elapsed();
    let outcome = if ok { "ok" } else { "error" };
    metrics::histogram!("leasehold_transaction_seconds", "op" => op, "outcome" => outcome)
        .record(elapsed.as_secs_f64());
    if !ok {
        tracing::debug!(target: "leasehold::store", op, elapsed_ms = elapsed.as_millis() as u64, "transaction failed");
    }
}

/// A holder saw its lease or job claim lost.
pub(crate) fn lost(target: &Target, reason: LostReason) {
    match target {
        Target::Lease { key, token } => {
            tracing::warn!(target: "leasehold::lease", key, token, reason = %reason, "lease lost");
            metrics::counter!("leasehold_lease_transitions_total", "transition" => "lost")
                .increment(1);
        }
        Target::Job { id, token } => {
            tracing::warn!(target: "leasehold::job", job_id = id.0, token, reason = %reason, "job claim lost");
        }
    }
}

/// A worker settled a job it held for `run`.
pub(crate) fn job_ran(queue: &Arc<str>, run: Duration) {
    metrics::histogram!("leasehold_job_run_seconds", "queue" => queue.clone())
        .record(run.as_secs_f64());
}

/// A worker sampled its queue's jobs per state.
pub(crate) fn queue_depth(queue: &Arc<str>, counts: &StateCounts) {
    for state in JobState::ALL {
        metrics::gauge!(
            "leasehold_queue_jobs",
            "queue" => queue.clone(),
            "state" => state.as_str()
        )
        .set(counts.get(state) as f64);
    }
}
