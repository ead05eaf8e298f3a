//! The job rules (Q1-Q5). Every public operation takes the whole
//! transaction and opens its job side once ([`Txn::jobs`]); a rule error
//! is decided before anything is written.

use super::deps;
use super::flow::{claim_limited, slot_freed};
use super::rate::{unpark_due, QUEUE_BUCKET};
use super::{
    backoff_ms, Claim, HeartbeatReply, JobCursor, JobId, JobRecord, JobState, QueueConfig,
    QueuePolicy, StateCounts,
};
use crate::core::{
    check_count, check_key, expiry_ms, Event, HolderId, JobChange, JobQuery, JobTxn, Txn, Wake,
};
use crate::error::Field;
use crate::error::{Error, Result};
use std::sync::Arc;

/// Expired and due jobs handled per read while bringing a queue up to date
/// (a store sending a claim's first read early renders it with this).
pub(crate) const CHUNK: usize = 256;

pub(super) fn check_queue(queue: &str) -> Result<()> {
    check_key(Field::Queue, queue)
}

pub(super) fn load(tx: &mut dyn JobTxn, id: JobId) -> Result<JobRecord> {
    tx.job(id)?.ok_or(Error::NotFound(id))
}

/// Write a job back; a job that is ready now wakes idle workers, and a
/// job that ended decides the jobs waiting for it (`deps`).
pub(super) fn put(tx: &mut dyn JobTxn, job: &JobRecord) -> Result<()> {
    put_released(tx, job).map(drop)
}

/// [`put`], returning the jobs that its ending made ready (`deps`).
fn put_released(tx: &mut dyn JobTxn, job: &JobRecord) -> Result<Vec<JobRecord>> {
    let mut released = Vec::new();
    if job.has_children && job.state.is_terminal() {
        let written = deps::release(tx, job, &mut released)?;
        tx.put_job(&written)?;
    } else {
        tx.put_job(job)?;
    }
    if wakes_idle(job.state) {
        tx.journal().wake(Wake::JobReady);
    }
    Ok(released)
}

/// Whether a job written in `state` changes the plan of idle workers
/// ([`Wake::JobReady`]): it is claimable now, or at a time they may not
/// know (a scheduled job's `run_at`).
pub(super) fn wakes_idle(state: JobState) -> bool {
    matches!(state, JobState::Ready | JobState::Scheduled)
}

/// Record that `job` made the transition `change` (see [`Event`]).
pub(super) fn note(tx: &mut dyn JobTxn, job: &JobRecord, change: JobChange) {
    let journal = tx.journal();
    if !journal.is_recording() {
        return;
    }
    journal.note(Event::Job {
        queue: job.queue.clone(),
        id: job.id,
        token: job.last_token,
        attempt: job.attempts,
        change,
    });
}

/// Record where an attempt's end (a failure, an expiry, a give-back) left
/// `job`: another attempt after a delay, dead (quarantined: by a crash
/// loop), or cancelled.
pub(super) fn note_end(tx: &mut dyn JobTxn, job: &JobRecord, quarantined: bool) {
    let now_ms = tx.now_ms();
    let change = match job.state {
        JobState::Scheduled | JobState::Ready => JobChange::Retried {
            delay_ms: job.run_at_ms.saturating_sub(now_ms),
        },
        JobState::Dead if quarantined => JobChange::Quarantined,
        JobState::Dead => JobChange::Dead,
        JobState::Cancelled => JobChange::Cancelled,
        JobState::Running | JobState::Done | JobState::Waiting => return,
    };
    note(tx, job, change);
}

/// Load a job as of the store's clock: if its claim expired or its
/// `run_at_ms` passed, its queue is brought up to date first; a waiting
/// job, through the jobs it waits for.
pub(super) fn load_fresh(
    tx: &mut dyn JobTxn,
    id: JobId,
    policy: &QueuePolicy,
) -> Result<JobRecord> {
    load_fresh_as(tx, id, policy, true)
}

/// [`load_fresh`], except that a waiting job is taken as stored (`deep`
/// false): what a push naming it needs, since a waiting job it links to
/// passes its own ending on when that is written.
pub(super) fn load_fresh_as(
    tx: &mut dyn JobTxn,
    id: JobId,
    policy: &QueuePolicy,
    deep: bool,
) -> Result<JobRecord> {
    let job = load(tx, id)?;
    let now_ms = tx.now_ms();
    let stale = match job.state {
        // A waiting job is as fresh as the jobs it waits for, and theirs:
        // one of them may have ended by time alone (its claim ran out),
        // which decides it once written. Each stale one's queue is
        // brought up to date (once), walking up without recursion.
        JobState::Waiting if deep => {
            let mut refreshed: Vec<Arc<str>> = Vec::new();
            for parent in deps::ancestors(tx, &job)? {
                if stale_by_time(&parent, now_ms) && !refreshed.contains(&parent.queue) {
                    refresh(tx, &parent.queue, policy, 0)?;
                    refreshed.push(parent.queue);
                }
            }
            return load(tx, id);
        }
        _ => stale_by_time(&job, now_ms),
    };
    if !stale {
        return Ok(job);
    }
    refresh(tx, &job.queue, policy, 0)?;
    load(tx, id)
}

/// Whether time alone changed `job` since it was written (its claim ran
/// out, or it fell due): its queue must be brought up to date to see it.
fn stale_by_time(job: &JobRecord, now_ms: u64) -> bool {
    match (job.state, job.claim) {
        (JobState::Running, Some(c)) => c.lease_until_ms <= now_ms,
        (JobState::Scheduled, _) => job.run_at_ms <= now_ms,
        _ => false,
    }
}

/// Bring `queue` up to date with the store's clock: running jobs whose
/// claim expired are rescheduled or dead (an expiry is an attempt already
/// counted at claim), and scheduled jobs that are due become ready. Returns
/// up to `ready_max` claimable jobs in claim order: the ready jobs read
/// with the first chunk, merged with those this call made ready, which is
/// exactly the head of the ready index once the queue is up to date.
/// A paused queue (F2) answers no claimable jobs, after being brought up
/// to date all the same. Also returns the queue's settings when
/// `ready_max > 0` (read with the first chunk; else the default).
pub(super) fn refresh(
    tx: &mut dyn JobTxn,
    queue: &str,
    policy: &QueuePolicy,
    ready_max: usize,
) -> Result<(Vec<JobRecord>, QueueConfig)> {
    let now_ms = tx.now_ms();
    let mut ready = Vec::new();
    let for_claim = ready_max > 0;
    let mut ready_max = ready_max;
    let mut config = QueueConfig::default();
    let mut first = true;
    loop {
        let read = tx.pending(queue, now_ms, CHUNK, if first { ready_max } else { 0 })?;
        let more = read.expired.len() >= CHUNK || read.due.len() >= CHUNK;
        if first {
            if read.config.paused {
                ready_max = 0;
            }
            ready = read.ready;
            // A claim read the settings; others read them when a slot
            // frees (an expiry), to unpark and wake (F1).
            config = match ready_max {
                0 if !read.expired.is_empty() => tx.queue_config(queue)?,
                _ => read.config,
            };
            first = false;
        }
        for mut job in read.expired {
            let quarantined = expire(&mut job, now_ms, policy);
            // Jobs its ending released may be claimable now too.
            let released = put_released(tx, &job)?;
            ready.extend(released.into_iter().filter(|r| *r.queue == *queue));
            note(tx, &job, JobChange::Expired);
            note_end(tx, &job, quarantined);
            // A job its slot unparked is claimable too.
            ready.extend(slot_freed(tx, &job, &config, for_claim)?);
            if job.state == JobState::Ready {
                ready.push(job);
            }
        }
        for mut job in read.due {
            job.state = JobState::Ready;
            put(tx, &job)?;
            ready.push(job);
        }
        // Keep only the head after each chunk: memory stays within one
        // chunk plus `ready_max` however long the backlog (`maintain`'s
        // `ready_max` of 0 keeps nothing).
        ready.sort_by_key(JobRecord::rank);
        ready.truncate(ready_max);
        if !more {
            break;
        }
    }
    Ok((ready, config))
}

/// Bring `queue` up to date with the store's clock (see `refresh`). Every
/// operation that reads claimable or running jobs does this first, so no
/// job is ever seen running past its lease.
pub fn maintain(tx: &mut dyn Txn, queue: &str, policy: &QueuePolicy) -> Result<()> {
    check_queue(queue)?;
    refresh(tx.jobs()?, queue, policy, 0).map(drop)
}

/// A claim that ran out is settled as of the instant it expired, not the
/// instant someone noticed, so a job's state is a function of time alone,
/// whenever `maintain` happens to run. Returns whether it was quarantined.
fn expire(job: &mut JobRecord, now_ms: u64, policy: &QueuePolicy) -> bool {
    let expired_at_ms = job.claim.map_or(now_ms, |c| c.lease_until_ms);
    job.expiries = job.expiries.saturating_add(1);
    let quarantined = policy.quarantine_expiries > 0 && job.expiries >= policy.quarantine_expiries;
    job.last_error = Some(Arc::from(
        if quarantined && job.attempts < job.max_attempts {
            "lease expired (crash loop: quarantined)"
        } else {
            job.expiry_reason()
        },
    ));
    settle_failure(job, expired_at_ms, now_ms, policy, quarantined);
    quarantined
}

/// After a failed or expired attempt (ending at `at_ms`): cancelled if a
/// cancel was asked, dead without attempts left (or when quarantined), else
/// scheduled after backoff.
pub(super) fn settle_failure(
    job: &mut JobRecord,
    at_ms: u64,
    now_ms: u64,
    policy: &QueuePolicy,
    quarantined: bool,
) {
    if job.cancel_requested {
        job.finish(JobState::Cancelled, at_ms);
    } else if quarantined || job.attempts >= job.max_attempts {
        job.finish(JobState::Dead, at_ms);
    } else {
        let delay = backoff_ms(policy, job.id, job.attempts);
        job.reschedule(at_ms.saturating_add(delay), now_ms);
    }
}

/// Claim up to `max` ready jobs of `queue` for `holder`, each under a lease
/// of `lease_ms`, in claim order, within the queue's limits (F1: none
/// starts where its queue or its key is full; see `flow`). Returns the
/// claimed records (state running, with their claim).
pub fn claim(
    tx: &mut dyn Txn,
    queue: &str,
    holder: HolderId,
    lease_ms: u64,
    max: usize,
    policy: &QueuePolicy,
) -> Result<Vec<JobRecord>> {
    let tx = tx.jobs()?;
    check_queue(queue)?;
    check_count(Field::Batch, max)?;
    let now_ms = tx.now_ms();
    let lease_until_ms = expiry_ms(Field::Lease, now_ms, lease_ms)?;
    let (mut jobs, config) = refresh(tx, queue, policy, max)?;
    if let (Some(rate), false) = (config.limits.per_key_rate, config.paused) {
        unpark_due(tx, queue, rate, &mut jobs, max)?;
    }
    if config.limits.any() && !jobs.is_empty() {
        return claim_limited(tx, queue, config.limits, max, jobs, holder, lease_until_ms);
    }
    for job in &mut jobs {
        start(tx, job, holder, lease_until_ms)?;
    }
    Ok(jobs)
}

/// Start a ready job: its next token, an attempt counted, running under a
/// claim of `holder` until `lease_until_ms`.
pub(super) fn start(
    tx: &mut dyn JobTxn,
    job: &mut JobRecord,
    holder: HolderId,
    lease_until_ms: u64,
) -> Result<()> {
    // Above the job's last token and the store's floor (see `lease`).
    let token = job
        .last_token
        .max(tx.token_floor())
        .checked_add(1)
        .ok_or_else(|| {
            Error::store(
                format!("claiming job {}", job.id),
                "token counter exhausted",
            )
        })?;
    let now_ms = tx.now_ms();
    // A run-time limit counts from the claim; the lease never passes it.
    let deadline_ms = job.timeout_ms.map(|t| now_ms.saturating_add(t));
    job.last_token = token;
    job.attempts = job.attempts.saturating_add(1);
    job.state = JobState::Running;
    job.progress = None;
    job.claim = Some(Claim {
        holder,
        token,
        lease_until_ms: deadline_ms.map_or(lease_until_ms, |d| d.min(lease_until_ms)),
        deadline_ms,
    });
    tx.put_job(job)?;
    let wait_ms = now_ms.saturating_sub(job.run_at_ms.max(job.created_at_ms));
    note(tx, job, JobChange::Claimed { wait_ms });
    Ok(())
}

/// Extend a claim to `now + lease_ms`; tells the worker if a cancel was
/// requested.
pub fn heartbeat(
    tx: &mut dyn Txn,
    id: JobId,
    holder: HolderId,
    token: u64,
    lease_ms: u64,
) -> Result<HeartbeatReply> {
    let tx = tx.jobs()?;
    let lease_until_ms = expiry_ms(Field::Lease, tx.now_ms(), lease_ms)?;
    let mut job = load(tx, id)?;
    let reply = heartbeat_record(&mut job, holder, token, tx.now_ms(), lease_until_ms)?;
    tx.put_job(&job)?;
    note(tx, &job, JobChange::Heartbeat);
    Ok(reply)
}

fn heartbeat_record(
    job: &mut JobRecord,
    holder: HolderId,
    token: u64,
    now_ms: u64,
    lease_until_ms: u64,
) -> Result<HeartbeatReply> {
    let mut claim = job.check_claim(holder, token, now_ms)?;
    // Never past the job's deadline (F3); never shorter: the worker's
    // earlier local deadline relies on it.
    let until = claim
        .deadline_ms
        .map_or(lease_until_ms, |d| d.min(lease_until_ms));
    claim.lease_until_ms = claim.lease_until_ms.max(until);
    job.claim = Some(claim);
    Ok(HeartbeatReply {
        lease_until_ms: claim.lease_until_ms,
        cancel_requested: job.cancel_requested,
    })
}

/// Heartbeat many claims of `holder` in one transaction (a worker's
/// renewal round): each is decided on its own, exactly as [`heartbeat`],
/// so a lost claim does not stop the others.
pub fn heartbeat_many(
    tx: &mut dyn Txn,
    holder: HolderId,
    claims: &[(JobId, u64)],
    lease_ms: u64,
) -> Result<Vec<Result<HeartbeatReply>>> {
    let tx = tx.jobs()?;
    let now_ms = tx.now_ms();
    let lease_until_ms = expiry_ms(Field::Lease, now_ms, lease_ms)?;
    let ids: Vec<JobId> = claims.iter().map(|c| c.0).collect();
    let mut jobs = tx.jobs_by_id(&ids)?;
    let mut replies = Vec::with_capacity(claims.len());
    for &(id, token) in claims {
        let Some(job) = jobs.iter_mut().find(|j| j.id == id) else {
            replies.push(Err(Error::NotFound(id)));
            continue;
        };
        let reply = heartbeat_record(job, holder, token, now_ms, lease_until_ms);
        if reply.is_ok() {
            tx.put_job(job)?;
            note(tx, job, JobChange::Heartbeat);
        }
        replies.push(reply);
    }
    Ok(replies)
}

/// When an idle worker whose claim came back empty claims again at the
/// latest ([`next_look`]), in store milliseconds from now; a wake-up may
/// come first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NextLook {
    /// Until `queue` changes by time alone: the earliest scheduled job
    /// falls due, the earliest running claim runs out, or a rate limit
    /// allows a start again (F4). `None` if none of these comes. Kept to
    /// the millisecond: a retry waiting out its backoff, a delayed job, a
    /// dead worker's job or a job held back by a rate starts when it can,
    /// without the worker polling for it.
    pub change_in_ms: Option<u64>,
    /// [`OVERLAP_RELOOK_MS`] when the claim passed over rows another
    /// transaction holds: a ready job ([`JobTxn::skipped_locked`]), or a
    /// job already due or a claim already run out that the claim would
    /// otherwise have taken. That transaction's change (a claim that may
    /// run out, a job it leaves ready) is not in what this one read. A
    /// guess, not a due time: a worker that keeps hearing it backs off (a
    /// row may be held for hours).
    pub relook_in_ms: Option<u64>,
}

/// When an idle worker looks at `queue` again after an empty claim in
/// this transaction ([`NextLook`]); nothing by time alone if the queue is
/// paused (F2: resuming wakes the workers). Three reads (five where rows
/// at or before now were passed over), and one per rate set.
pub fn next_look(tx: &mut dyn Txn, queue: &str) -> Result<NextLook> {
    check_queue(queue)?;
    let tx = tx.jobs()?;
    let limits = match tx.queue_config(queue)? {
        c if c.paused => return Ok(NextLook::default()),
        c => c.limits,
    };
    let now_ms = tx.now_ms();
    // A rate's next allowance (F4): the queue's own, and the earliest
    // instant a key's parked jobs wake.
    let mut allowed = None;
    if let Some(rate) = limits.rate {
        allowed = tx
            .rate_log(queue, QUEUE_BUCKET)?
            .next_allowance(rate, now_ms);
    }
    if limits.per_key_rate.is_some() {
        let wake = tx.rate_wakes(queue, u64::MAX, 1)?.first().map(|w| w.1);
        allowed = allowed.into_iter().chain(wake).min();
    }
    // The first instant of `state`'s order after now. A row at or before
    // now is one the claim passed over: it is held, and what comes after
    // it is read past it.
    let mut passed_over = tx.skipped_locked();
    let mut first_after = |tx: &mut dyn JobTxn, state, at: fn(&JobRecord) -> Option<u64>| {
        let first = tx.page(queue, state, None, 1, 0)?;
        let first = first.first().and_then(|p| at(&p.job));
        if first.is_none_or(|t| t > now_ms) {
            return Ok(first);
        }
        passed_over = true;
        let past = JobCursor {
            priority: 0,
            at_ms: now_ms,
            id: JobId(u64::MAX),
        };
        let next = tx.page(queue, state, Some(past), 1, 0)?;
        Ok::<_, Error>(next.first().and_then(|p| at(&p.job)))
    };
    let due = first_after(tx, JobState::Scheduled, |j| Some(j.run_at_ms))?;
    let runs_out = first_after(tx, JobState::Running, |j| j.claim.map(|c| c.lease_until_ms))?;
    let at = due.into_iter().chain(runs_out).chain(allowed).min();
    Ok(NextLook {
        change_in_ms: at.map(|at| at.saturating_sub(now_ms)),
        relook_in_ms: passed_over.then_some(OVERLAP_RELOOK_MS),
    })
}

/// How soon (store ms) an idle worker looks again when its claim passed
/// over rows another open transaction held ([`NextLook::relook_in_ms`]):
/// about as long as a claim's transaction takes to commit.
pub const OVERLAP_RELOOK_MS: u64 = 10;

/// The one drain rule (`Queue::work` with `drain`, `queue work --drain`):
/// a queue is drained once no job is ready, running or due, where a retry
/// waiting out its backoff counts as due. A job delayed before its first
/// attempt does not hold a draining worker. After bringing the queue up to
/// date, a few indexed reads of at most one job each (ready, running,
/// retrying): never a count of the queue's history (counting 200,000 finished jobs took a draining worker
/// 20 ms per look, and it looks until its last outcomes commit).
pub fn drained(tx: &mut dyn Txn, queue: &str, policy: &QueuePolicy) -> Result<bool> {
    let tx = tx.jobs()?;
    check_queue(queue)?;
    refresh(tx, queue, policy, 0)?;
    for state in [JobState::Ready, JobState::Running] {
        if !tx.page(queue, state, None, 1, 0)?.is_empty() {
            return Ok(false);
        }
    }
    let mut retrying = Vec::new();
    tx.scan(queue, JobQuery::Retrying, 1, &mut retrying)?;
    Ok(retrying.is_empty())
}

/// Jobs of `queue` per state, after bringing it up to date.
pub fn stats(tx: &mut dyn Txn, queue: &str, policy: &QueuePolicy) -> Result<StateCounts> {
    let tx = tx.jobs()?;
    check_queue(queue)?;
    refresh(tx, queue, policy, 0)?;
    tx.counts(queue)
}

/// Up to `limit` jobs of `queue` after id `after`, optionally in one state,
/// after bringing it up to date.
pub fn list(
    tx: &mut dyn Txn,
    queue: &str,
    state: Option<JobState>,
    after: JobId,
    limit: usize,
    policy: &QueuePolicy,
) -> Result<Vec<JobRecord>> {
    let tx = tx.jobs()?;
    check_queue(queue)?;
    check_count(Field::Batch, limit)?;
    refresh(tx, queue, policy, 0)?;
    tx.list(queue, state, after, limit)
}

/// One job's record, as of the store's clock.
pub fn get(tx: &mut dyn Txn, id: JobId, policy: &QueuePolicy) -> Result<JobRecord> {
    load_fresh(tx.jobs()?, id, policy)
}
