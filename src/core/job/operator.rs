//! What an operator does to jobs (`leasehold queue cancel`, `retry`,
//! `purge`, the dashboard's buttons): cancel one, give a dead or cancelled
//! one a fresh start, delete the old finished ones, under the queue's
//! rules: a cancel passes on a concurrency slot its job held (F1), a retry
//! keeps a unique key unique (U1) and waits again for the jobs it names
//! (D1).

use super::flow::slot_freed;
use super::rate::MAX_WINDOW_MS;
use super::rules::{check_queue, load_fresh, note, put, refresh};
use super::{deps, unique, JobId, JobState, QueuePolicy};
use crate::core::{check_count, JobChange, JobQuery, Txn};
use crate::error::Field;
use crate::error::{Error, Result};

/// Cancel a job: a waiting job is cancelled at once; a running one gets a
/// cancel request its worker sees at the next heartbeat. Returns the job's
/// state after the call.
pub fn cancel(tx: &mut dyn Txn, id: JobId, policy: &QueuePolicy) -> Result<JobState> {
    let tx = tx.jobs()?;
    let now_ms = tx.now_ms();
    let mut job = load_fresh(tx, id, policy)?;
    let held_a_slot = job.state == JobState::Ready && !job.parked && job.key.is_some();
    match job.state {
        JobState::Ready | JobState::Scheduled | JobState::Waiting => {
            job.finish(JobState::Cancelled, now_ms);
        }
        JobState::Running => job.cancel_requested = true,
        state => {
            return Err(Error::InvalidState {
                id,
                state,
                action: "cancel",
            })
        }
    }
    put(tx, &job)?;
    if job.state == JobState::Cancelled {
        note(tx, &job, JobChange::Cancelled);
    }
    if held_a_slot {
        // It may have been its key's one claimable job (F1's liveness).
        let config = tx.queue_config(&job.queue)?;
        slot_freed(tx, &job, &config, false)?;
    }
    Ok(job.state)
}

/// Make a dead or cancelled job ready again with a fresh attempt budget.
pub fn retry(tx: &mut dyn Txn, id: JobId, policy: &QueuePolicy) -> Result<()> {
    let tx = tx.jobs()?;
    let now_ms = tx.now_ms();
    let mut job = load_fresh(tx, id, policy)?;
    if !job.state.is_retryable() {
        return Err(Error::InvalidState {
            id,
            state: job.state,
            action: "retry (only dead or cancelled jobs can be retried)",
        });
    }
    if let Some(key) = job.unique_key.clone() {
        if let Some(other) = unique::live_holder(tx, &job.queue, &key, id, policy)? {
            return Err(Error::invalid(
                Field::UniqueKey,
                format!("job {other} already holds unique key {key:?}"),
            ));
        }
    }
    job.attempts = 0;
    job.expiries = 0;
    job.cancel_requested = false;
    job.finished_at_ms = None;
    job.reschedule(now_ms, now_ms);
    // A retried job waits again for the jobs it names that are not done.
    if let Some(ids) = job.after.clone() {
        let after = deps::After {
            ids: &ids,
            any: job.after_any,
            gone_ended: true,
        };
        deps::link(tx, &mut job, after, policy)?;
    }
    put(tx, &job)?;
    note(tx, &job, JobChange::Retried { delay_ms: 0 });
    Ok(())
}

/// Delete up to `limit` terminal jobs of `queue` that finished at least
/// `older_than_ms` ago, and up to `limit` rate buckets idle for longer
/// than any window. Returns how many jobs were deleted.
pub fn purge(
    tx: &mut dyn Txn,
    queue: &str,
    older_than_ms: u64,
    limit: usize,
    policy: &QueuePolicy,
) -> Result<usize> {
    let tx = tx.jobs()?;
    check_queue(queue)?;
    check_count(Field::Batch, limit)?;
    refresh(tx, queue, policy, 0)?;
    let cutoff_ms = tx.now_ms().saturating_sub(older_than_ms);
    let mut ids = Vec::new();
    tx.scan(queue, JobQuery::FinishedBy { cutoff_ms }, limit, &mut ids)?;
    for &id in &ids {
        tx.delete_job(id)?;
    }
    // Rate buckets no window can count any more (F4's windows are at most
    // a week): the keys that came and went leave nothing behind.
    let idle_ms = tx.now_ms().saturating_sub(MAX_WINDOW_MS);
    tx.forget_idle_rates(queue, idle_ms, limit)?;
    Ok(ids.len())
}
