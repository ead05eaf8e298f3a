//! The end of an attempt: complete (with or without a result), fail,
//! abandon, one at a time or a worker's batch ([`settle_many`]). Each is
//! decided on the loaded record (the claim checked: Q2) before anything
//! is written.
//!
//! A settle is idempotent: sent again after an answer that was lost (an
//! ambiguous commit), it finds its own outcome recorded and answers the
//! job's state, changing nothing ([`recorded`]). So a worker retries a
//! settle it got no answer to, instead of giving its claim up as lost.

use super::flow::{slot_freed, Configs};
use super::rules::{load, note, note_end, put, settle_failure};
use super::{JobId, JobRecord, JobState, QueuePolicy};
use crate::core::{check_text, HolderId, JobChange, JobTxn, Txn, MAX_PAYLOAD_BYTES};
use crate::error::Field;
use crate::error::{Error, Result};
use std::sync::Arc;

/// What a worker reports for one claimed job ([`settle_many`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    /// The handler succeeded: done ([`complete`]).
    Complete,
    /// The handler succeeded with a result, kept with the job
    /// ([`complete_with`]).
    CompleteWith(Arc<[u8]>),
    /// The handler failed with this reason ([`fail`]).
    Fail(String),
    /// Given back without an outcome ([`abandon`]).
    Abandon {
        /// Whether its handler ran.
        started: bool,
    },
}

/// Mark a claimed job done. Only the current, unexpired claim can (Q2).
pub fn complete(tx: &mut dyn Txn, id: JobId, holder: HolderId, token: u64) -> Result<()> {
    settle_one(
        tx,
        id,
        holder,
        token,
        &Settle::Complete,
        &QueuePolicy::default(),
    )
    .map(drop)
}

/// Mark a claimed job done, keeping `result` with it (at most
/// [`MAX_PAYLOAD_BYTES`], refused before anything changes). Only the
/// current, unexpired claim can (Q2).
pub fn complete_with(
    tx: &mut dyn Txn,
    id: JobId,
    holder: HolderId,
    token: u64,
    result: &[u8],
) -> Result<()> {
    check_result(result)?;
    let settle = Settle::CompleteWith(Arc::from(result));
    settle_one(tx, id, holder, token, &settle, &QueuePolicy::default()).map(drop)
}

/// A job result the store keeps: no larger than a payload.
pub fn check_result(result: &[u8]) -> Result<()> {
    if result.len() > MAX_PAYLOAD_BYTES {
        return Err(Error::invalid(
            Field::Result,
            format!("{} bytes is larger than {MAX_PAYLOAD_BYTES}", result.len()),
        ));
    }
    Ok(())
}

/// Report a failed attempt: the job is scheduled again after backoff, or
/// dead once out of attempts (keeping `reason`), or cancelled if a cancel
/// was requested. Returns the job's new state.
pub fn fail(
    tx: &mut dyn Txn,
    id: JobId,
    holder: HolderId,
    token: u64,
    reason: &str,
    policy: &QueuePolicy,
) -> Result<JobState> {
    check_text(Field::Reason, reason)?;
    settle_one(
        tx,
        id,
        holder,
        token,
        &Settle::Fail(reason.to_owned()),
        policy,
    )
}

/// Give a claimed job back without an outcome (a worker shutting down):
/// ready again at once, no backoff. A job whose handler never `started`
/// gets its attempt back; a started one keeps it counted, and is dead if
/// that was its last. A job asked to cancel is cancelled. Returns the job's
/// new state.
pub fn abandon(
    tx: &mut dyn Txn,
    id: JobId,
    holder: HolderId,
    token: u64,
    started: bool,
) -> Result<JobState> {
    let settle = Settle::Abandon { started };
    settle_one(tx, id, holder, token, &settle, &QueuePolicy::default())
}

fn settle_one(
    tx: &mut dyn Txn,
    id: JobId,
    holder: HolderId,
    token: u64,
    settle: &Settle,
    policy: &QueuePolicy,
) -> Result<JobState> {
    let tx = tx.jobs()?;
    let mut job = load(tx, id)?;
    if recorded(&job, token, settle) {
        return Ok(state_now(&job, tx.now_ms()));
    }
    settle_record(&mut job, holder, token, settle, tx.now_ms(), policy)?;
    put(tx, &job)?;
    note_settled(tx, &job, settle);
    let config = tx.queue_config(&job.queue)?;
    slot_freed(tx, &job, &config, false)?;
    Ok(job.state)
}

/// Whether `job` already shows the outcome `settle` of its claim `token`:
/// the claim has ended, no later claim was made (its token is the job's
/// last), and the job is where that settle leaves a job and an expiry of
/// the claim does not: done (only a complete makes a job done); failed
/// keeping the very reason; or, given back, ready, dead saying so, or
/// cancelled, without the "lease expired" an expiry writes. Only the
/// claim's holder knows its token. An expiry is never taken for a settle;
/// a settle may be missed (answered lost) where an earlier attempt's error
/// was itself an expiry's.
fn recorded(job: &JobRecord, token: u64, settle: &Settle) -> bool {
    let ended = job.last_token == token && job.claim.is_none_or(|c| c.token != token);
    let error = job.last_error.as_deref().unwrap_or("");
    let expired = error.starts_with(EXPIRED);
    ended
        && match settle {
            Settle::Complete | Settle::CompleteWith(_) => job.state == JobState::Done,
            Settle::Fail(reason) => job.state != JobState::Done && !expired && error == reason,
            Settle::Abandon { .. } => match job.state {
                JobState::Ready | JobState::Cancelled => !expired,
                JobState::Dead => error == ABANDONED_LAST,
                _ => false,
            },
        }
}

/// How every reason an expiry writes begins (`rules::expire`).
const EXPIRED: &str = "lease expired";

/// The state of a job whose claim has ended, as of `now_ms` (a retry whose
/// backoff has passed is ready, whether or not its queue was brought up to
/// date since), without writing.
fn state_now(job: &JobRecord, now_ms: u64) -> JobState {
    match job.state {
        JobState::Scheduled if job.run_at_ms <= now_ms => JobState::Ready,
        state => state,
    }
}

/// Why a job given back on its last attempt is dead.
const ABANDONED_LAST: &str = "abandoned by its worker on its last attempt";

/// Settle many claimed jobs of `holder` in one transaction (a worker's
/// completer batch): each is decided on its own, exactly as [`complete`],
/// [`fail`] or [`abandon`], so a lost claim (or an overlong reason) does
/// not stop the others. Returns each job's new state.
pub fn settle_many(
    tx: &mut dyn Txn,
    holder: HolderId,
    settles: &[(JobId, u64, Settle)],
    policy: &QueuePolicy,
) -> Result<Vec<Result<JobState>>> {
    let tx = tx.jobs()?;
    let now_ms = tx.now_ms();
    let ids: Vec<JobId> = settles.iter().map(|s| s.0).collect();
    let mut jobs = tx.jobs_by_id(&ids)?;
    let mut states = Vec::with_capacity(settles.len());
    let mut configs = Configs::default();
    for (id, token, settle) in settles {
        let checked = match settle {
            Settle::Fail(reason) => check_text(Field::Reason, reason),
            Settle::CompleteWith(result) => check_result(result),
            _ => Ok(()),
        };
        if let Err(e) = checked {
            states.push(Err(e));
            continue;
        }
        let Some(job) = jobs.iter_mut().find(|j| j.id == *id) else {
            states.push(Err(Error::NotFound(*id)));
            continue;
        };
        if recorded(job, *token, settle) {
            states.push(Ok(state_now(job, now_ms)));
            continue;
        }
        match settle_record(job, holder, *token, settle, now_ms, policy) {
            Ok(()) => {
                put(tx, job)?;
                note_settled(tx, job, settle);
                let config = configs.of(tx, &job.queue)?;
                slot_freed(tx, job, &config, false)?;
                states.push(Ok(job.state));
            }
            Err(e) => states.push(Err(e)),
        }
    }
    Ok(states)
}

/// Record a settled job's transitions: completed, or failed / given back
/// and where that left it.
fn note_settled(tx: &mut dyn JobTxn, job: &JobRecord, settle: &Settle) {
    match settle {
        Settle::Complete | Settle::CompleteWith(_) => note(tx, job, JobChange::Completed),
        Settle::Fail(_) => {
            note(tx, job, JobChange::Failed);
            note_end(tx, job, false);
        }
        Settle::Abandon { .. } => {
            note(tx, job, JobChange::Abandoned);
            if job.state.is_terminal() {
                note_end(tx, job, false);
            }
        }
    }
}

/// The rules of [`complete`], [`fail`] and [`abandon`] on a loaded record:
/// decided (the claim checked) before anything changes.
fn settle_record(
    job: &mut JobRecord,
    holder: HolderId,
    token: u64,
    settle: &Settle,
    now_ms: u64,
    policy: &QueuePolicy,
) -> Result<()> {
    job.check_claim(holder, token, now_ms)?;
    match settle {
        Settle::Complete => job.finish(JobState::Done, now_ms),
        Settle::CompleteWith(result) => {
            job.result = Some(result.clone());
            job.finish(JobState::Done, now_ms);
        }
        Settle::Fail(reason) => {
            job.last_error = Some(Arc::from(reason.as_str()));
            settle_failure(job, now_ms, now_ms, policy, false);
        }
        Settle::Abandon { .. } if job.cancel_requested => {
            job.finish(JobState::Cancelled, now_ms);
        }
        Settle::Abandon { started: false } => {
            job.attempts = job.attempts.saturating_sub(1);
            job.reschedule(now_ms, now_ms);
        }
        Settle::Abandon { started: true } if job.attempts >= job.max_attempts => {
            job.last_error = Some(Arc::from(ABANDONED_LAST));
            job.finish(JobState::Dead, now_ms);
        }
        Settle::Abandon { started: true } => job.reschedule(now_ms, now_ms),
    }
    Ok(())
}
