//! Job rules (Q1-Q5): enqueue, claim, heartbeat, complete, fail, expire,
//! cancel, retry, purge, stats and list.
//!
//! See the [module docs of `core`](super) for the state machine. Each
//! operation reads what it needs, decides, and only then writes, so a rule
//! error changes nothing.

use super::{
    check_key, check_text, expiry_ms, mix64, HolderId, JobQuery, Txn, MAX_ATTEMPTS, MAX_BATCH,
    MAX_PAYLOAD_BYTES, MAX_TTL_MS,
};
use crate::error::{Error, LostReason, Result, Target};
use std::cmp::Reverse;
use std::fmt;
use std::sync::Arc;

/// A job's id: unique in the store and increasing in enqueue order (the
/// FIFO tie-break of claim order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct JobId(pub u64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JobState {
    /// Claimable now.
    Ready,
    /// Waiting for its `run_at_ms` (a delay or a retry backoff).
    Scheduled,
    /// Claimed by a worker whose claim has not been seen to expire.
    Running,
    /// Completed (terminal).
    Done,
    /// Out of attempts or quarantined (terminal; `retry` revives it).
    Dead,
    /// Cancelled (terminal).
    Cancelled,
}

impl JobState {
    /// All states, in the order of [`StateCounts`].
    pub const ALL: [JobState; 6] = [
        JobState::Ready,
        JobState::Scheduled,
        JobState::Running,
        JobState::Done,
        JobState::Dead,
        JobState::Cancelled,
    ];

    /// Done, dead or cancelled.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Done | JobState::Dead | JobState::Cancelled)
    }

    /// The lower-case name used in output and in stores.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Ready => "ready",
            JobState::Scheduled => "scheduled",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Dead => "dead",
            JobState::Cancelled => "cancelled",
        }
    }

    /// Parse [`JobState::as_str`]'s output.
    pub fn parse(text: &str) -> Result<Self> {
        JobState::ALL
            .into_iter()
            .find(|s| s.as_str() == text)
            .ok_or_else(|| {
                Error::invalid(
                    "state",
                    format!(
                        "{text:?} is not one of ready, scheduled, running, done, dead, cancelled"
                    ),
                )
            })
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A running job's claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// The worker that claimed it.
    pub holder: HolderId,
    /// The claim's fencing token (per job, increasing with every claim).
    pub token: u64,
    /// First instant (store clock) at which the claim is expired.
    pub lease_until_ms: u64,
}

/// The stored state of one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRecord {
    /// Its id.
    pub id: JobId,
    /// The queue it belongs to.
    pub queue: Arc<str>,
    /// Opaque bytes for the worker.
    pub payload: Arc<[u8]>,
    /// Higher runs first.
    pub priority: i32,
    /// Not claimable before this instant (store clock).
    pub run_at_ms: u64,
    /// When it was enqueued.
    pub created_at_ms: u64,
    /// Attempts allowed before it is dead.
    pub max_attempts: u32,
    /// Claims so far (counted at claim).
    pub attempts: u32,
    /// Claims that ended by lease expiry (counted apart from failures).
    pub expiries: u32,
    /// The token of the latest claim.
    pub last_token: u64,
    /// Where it is.
    pub state: JobState,
    /// Set exactly when `state` is running.
    pub claim: Option<Claim>,
    /// A cancel arrived while it was running.
    pub cancel_requested: bool,
    /// Why the latest attempt failed.
    pub last_error: Option<Arc<str>>,
    /// Deduplication key among the queue's non-terminal jobs.
    pub unique_key: Option<Arc<str>>,
    /// When it reached a terminal state.
    pub finished_at_ms: Option<u64>,
}

/// The sort key of claim order (Q5): priority descending, then earlier
/// `run_at_ms`, then lower id (FIFO).
pub type ClaimRank = (Reverse<i32>, u64, JobId);

impl JobRecord {
    /// Its position in claim order.
    pub fn rank(&self) -> ClaimRank {
        (Reverse(self.priority), self.run_at_ms, self.id)
    }

    fn finish(&mut self, state: JobState, now_ms: u64) {
        debug_assert!(state.is_terminal());
        self.state = state;
        self.claim = None;
        self.finished_at_ms = Some(now_ms);
    }

    fn reschedule(&mut self, run_at_ms: u64, now_ms: u64) {
        self.claim = None;
        self.run_at_ms = run_at_ms;
        self.state = if run_at_ms <= now_ms {
            JobState::Ready
        } else {
            JobState::Scheduled
        };
    }

    /// Check that `holder`/`token` names this job's unexpired claim.
    fn check_claim(&self, holder: HolderId, token: u64, now_ms: u64) -> Result<Claim> {
        let reason = match self.claim {
            Some(c) if self.state == JobState::Running && c.token == token => {
                if c.holder != holder {
                    LostReason::NotHolder
                } else if now_ms >= c.lease_until_ms {
                    LostReason::Expired
                } else {
                    return Ok(c);
                }
            }
            _ => LostReason::StaleToken,
        };
        Err(Error::Lost {
            target: Target::Job { id: self.id, token },
            reason,
        })
    }
}

/// What to enqueue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec {
    /// Opaque bytes for the worker (at most [`MAX_PAYLOAD_BYTES`]).
    pub payload: Vec<u8>,
    /// Higher runs first.
    pub priority: i32,
    /// Run no earlier than this long after enqueue.
    pub delay_ms: u64,
    /// Run no earlier than this instant (store clock); overrides `delay_ms`.
    /// An instant in the past means now.
    pub run_at_ms: Option<u64>,
    /// Attempts allowed (1..=[`MAX_ATTEMPTS`]).
    pub max_attempts: u32,
    /// A second enqueue with the key of a live (non-terminal) job returns
    /// that job instead of creating one.
    pub unique_key: Option<String>,
}

impl Default for JobSpec {
    fn default() -> Self {
        JobSpec {
            payload: Vec::new(),
            priority: 0,
            delay_ms: 0,
            run_at_ms: None,
            max_attempts: 3,
            unique_key: None,
        }
    }
}

impl JobSpec {
    /// A job with this payload and default options.
    pub fn new(payload: impl Into<Vec<u8>>) -> Self {
        JobSpec {
            payload: payload.into(),
            ..JobSpec::default()
        }
    }
}

/// Retry policy of a queue: backoff after a failure or expiry, and the
/// crash-loop quarantine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePolicy {
    /// Backoff after the first failed attempt; doubles per attempt.
    pub backoff_base_ms: u64,
    /// Longest backoff.
    pub backoff_max_ms: u64,
    /// Seed of the backoff jitter (deterministic per job and attempt).
    pub jitter_seed: u64,
    /// A job whose claims expired this many times is dead ("crash loop"),
    /// even with attempts left. 0 turns quarantine off.
    pub quarantine_expiries: u32,
}

impl Default for QueuePolicy {
    fn default() -> Self {
        QueuePolicy {
            backoff_base_ms: 1_000,
            backoff_max_ms: 3_600_000,
            jitter_seed: 0,
            quarantine_expiries: 5,
        }
    }
}

/// The backoff before the attempt after `attempts` failed ones: exponential
/// (`base * 2^(attempts-1)`, capped at `max`), with "equal jitter" drawn
/// deterministically from the seed, the job and the attempt: a value in
/// `[d/2, d]`.
pub fn backoff_ms(policy: &QueuePolicy, id: JobId, attempts: u32) -> u64 {
    let shift = attempts.saturating_sub(1).min(63);
    let full = policy
        .backoff_base_ms
        .saturating_mul(1u64 << shift)
        .min(policy.backoff_max_ms);
    let half = full / 2;
    let span = full - half;
    let roll = mix64(policy.jitter_seed ^ mix64(id.0) ^ u64::from(attempts));
    half + roll % (span + 1)
}

/// What [`enqueue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnqueueOutcome {
    /// The new job, or the live job that already had the unique key.
    pub id: JobId,
    /// False when an existing job was returned.
    pub created: bool,
}

/// What a heartbeat tells the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatReply {
    /// The claim's new expiry (store clock).
    pub lease_until_ms: u64,
    /// Someone asked to cancel the job: the worker should stop and call fail.
    pub cancel_requested: bool,
}

/// Jobs per state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StateCounts(pub [u64; 6]);

impl StateCounts {
    /// The count of one state.
    pub fn get(&self, state: JobState) -> u64 {
        self.0[state.index()]
    }

    /// Add `delta` to one state's count.
    pub fn add(&mut self, state: JobState, delta: i64) {
        let slot = &mut self.0[state.index()];
        *slot = slot.saturating_add_signed(delta);
    }

    /// All jobs.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

fn check_queue(queue: &str) -> Result<()> {
    check_key("queue", queue)
}

fn check_batch(max: usize) -> Result<()> {
    if max == 0 || max > MAX_BATCH {
        return Err(Error::invalid(
            "batch",
            format!("{max} is outside 1..={MAX_BATCH}"),
        ));
    }
    Ok(())
}

fn load(tx: &mut dyn Txn, id: JobId) -> Result<JobRecord> {
    tx.job(id)?.ok_or(Error::NotFound(id))
}

/// Load a job as of the store's clock: if its claim expired or its
/// `run_at_ms` passed, its queue is brought up to date first.
fn load_fresh(tx: &mut dyn Txn, id: JobId, policy: &QueuePolicy) -> Result<JobRecord> {
    let job = load(tx, id)?;
    let now_ms = tx.now_ms();
    let stale = match (job.state, job.claim) {
        (JobState::Running, Some(c)) => c.lease_until_ms <= now_ms,
        (JobState::Scheduled, _) => job.run_at_ms <= now_ms,
        _ => false,
    };
    if !stale {
        return Ok(job);
    }
    maintain(tx, &job.queue, policy)?;
    load(tx, id)
}

/// Add a job to `queue`, or return the live job with the same unique key.
pub fn enqueue(
    tx: &mut dyn Txn,
    queue: &str,
    spec: &JobSpec,
    policy: &QueuePolicy,
) -> Result<EnqueueOutcome> {
    check_queue(queue)?;
    if spec.payload.len() > MAX_PAYLOAD_BYTES {
        return Err(Error::invalid(
            "payload",
            format!(
                "{} bytes is larger than {MAX_PAYLOAD_BYTES}",
                spec.payload.len()
            ),
        ));
    }
    if spec.max_attempts == 0 || spec.max_attempts > MAX_ATTEMPTS {
        return Err(Error::invalid(
            "max_attempts",
            format!("{} is outside 1..={MAX_ATTEMPTS}", spec.max_attempts),
        ));
    }
    if let Some(key) = &spec.unique_key {
        check_text("unique_key", key)?;
        if key.is_empty() {
            return Err(Error::invalid("unique_key", "must not be empty"));
        }
    }
    let now_ms = tx.now_ms();
    let run_at_ms = match spec.run_at_ms {
        Some(at) => {
            let latest = now_ms.saturating_add(MAX_TTL_MS);
            if at > latest {
                return Err(Error::invalid(
                    "run_at",
                    format!("{at} ms is more than a year after now ({now_ms} ms)"),
                ));
            }
            at.max(now_ms)
        }
        None if spec.delay_ms == 0 => now_ms,
        None => expiry_ms("delay", now_ms, spec.delay_ms)?,
    };
    if let Some(key) = &spec.unique_key {
        if let Some(id) = tx.live_unique(queue, key)? {
            // The holder of the key may have just expired into a terminal
            // state, or (in a store whose lookup does not lock) finished and
            // been purged since the lookup.
            match load_fresh(tx, id, policy) {
                Ok(job) if !job.state.is_terminal() => {
                    return Ok(EnqueueOutcome { id, created: false });
                }
                Ok(_) | Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    let id = tx.next_job_id()?;
    let mut job = JobRecord {
        id,
        queue: Arc::from(queue),
        payload: Arc::from(spec.payload.as_slice()),
        priority: spec.priority,
        run_at_ms,
        created_at_ms: now_ms,
        max_attempts: spec.max_attempts,
        attempts: 0,
        expiries: 0,
        last_token: 0,
        state: JobState::Ready,
        claim: None,
        cancel_requested: false,
        last_error: None,
        unique_key: spec.unique_key.as_deref().map(Arc::from),
        finished_at_ms: None,
    };
    job.reschedule(run_at_ms, now_ms);
    tx.put_job(&job)?;
    Ok(EnqueueOutcome { id, created: true })
}

/// Bring `queue` up to date with the store's clock: running jobs whose
/// claim expired are rescheduled or dead (an expiry is an attempt already
/// counted at claim), and scheduled jobs that are due become ready. Every
/// operation that reads claimable or running jobs calls it first, so no job
/// is ever seen running past its lease.
pub fn maintain(tx: &mut dyn Txn, queue: &str, policy: &QueuePolicy) -> Result<()> {
    const CHUNK: usize = 256;
    let now_ms = tx.now_ms();
    let mut ids = Vec::new();
    for query in [JobQuery::Expired { now_ms }, JobQuery::Due { now_ms }] {
        loop {
            ids.clear();
            tx.scan(queue, query, CHUNK, &mut ids)?;
            for &id in &ids {
                let mut job = load(tx, id)?;
                match query {
                    JobQuery::Expired { .. } => expire(&mut job, now_ms, policy),
                    _ => job.state = JobState::Ready,
                }
                tx.put_job(&job)?;
            }
            if ids.len() < CHUNK {
                break;
            }
        }
    }
    Ok(())
}

/// A claim that ran out is settled as of the instant it expired, not the
/// instant someone noticed, so a job's state is a function of time alone,
/// whenever `maintain` happens to run.
fn expire(job: &mut JobRecord, now_ms: u64, policy: &QueuePolicy) {
    let expired_at_ms = job.claim.map_or(now_ms, |c| c.lease_until_ms);
    job.expiries = job.expiries.saturating_add(1);
    let quarantined = policy.quarantine_expiries > 0 && job.expiries >= policy.quarantine_expiries;
    job.last_error = Some(Arc::from(
        if quarantined && job.attempts < job.max_attempts {
            "lease expired (crash loop: quarantined)"
        } else {
            "lease expired"
        },
    ));
    settle_failure(job, expired_at_ms, now_ms, policy, quarantined);
}

/// After a failed or expired attempt (ending at `at_ms`): cancelled if a
/// cancel was asked, dead without attempts left (or when quarantined), else
/// scheduled after backoff.
fn settle_failure(
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
/// of `lease_ms`, in claim order. Returns the claimed records (state
/// running, with their claim).
pub fn claim(
    tx: &mut dyn Txn,
    queue: &str,
    holder: HolderId,
    lease_ms: u64,
    max: usize,
    policy: &QueuePolicy,
) -> Result<Vec<JobRecord>> {
    check_queue(queue)?;
    check_batch(max)?;
    let now_ms = tx.now_ms();
    let lease_until_ms = expiry_ms("lease", now_ms, lease_ms)?;
    tx.will_claim(queue, max);
    maintain(tx, queue, policy)?;
    let mut ids = Vec::with_capacity(max.min(64));
    tx.scan(queue, JobQuery::Ready, max, &mut ids)?;
    let mut claimed = Vec::with_capacity(ids.len());
    for id in ids {
        let mut job = load(tx, id)?;
        let token = job
            .last_token
            .checked_add(1)
            .ok_or_else(|| Error::store(format!("claiming job {id}"), "token counter exhausted"))?;
        job.last_token = token;
        job.attempts = job.attempts.saturating_add(1);
        job.state = JobState::Running;
        job.claim = Some(Claim {
            holder,
            token,
            lease_until_ms,
        });
        tx.put_job(&job)?;
        claimed.push(job);
    }
    Ok(claimed)
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
    let now_ms = tx.now_ms();
    let lease_until_ms = expiry_ms("lease", now_ms, lease_ms)?;
    let mut job = load(tx, id)?;
    let mut claim = job.check_claim(holder, token, now_ms)?;
    // Never shorten: the worker's earlier local deadline relies on it.
    claim.lease_until_ms = claim.lease_until_ms.max(lease_until_ms);
    job.claim = Some(claim);
    tx.put_job(&job)?;
    Ok(HeartbeatReply {
        lease_until_ms: claim.lease_until_ms,
        cancel_requested: job.cancel_requested,
    })
}

/// Mark a claimed job done. Only the current, unexpired claim can (Q2).
pub fn complete(tx: &mut dyn Txn, id: JobId, holder: HolderId, token: u64) -> Result<()> {
    let now_ms = tx.now_ms();
    let mut job = load(tx, id)?;
    job.check_claim(holder, token, now_ms)?;
    job.finish(JobState::Done, now_ms);
    tx.put_job(&job)?;
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
    check_text("reason", reason)?;
    let now_ms = tx.now_ms();
    let mut job = load(tx, id)?;
    job.check_claim(holder, token, now_ms)?;
    job.last_error = Some(Arc::from(reason));
    settle_failure(&mut job, now_ms, now_ms, policy, false);
    tx.put_job(&job)?;
    Ok(job.state)
}

/// Cancel a job: a waiting job is cancelled at once; a running one gets a
/// cancel request its worker sees at the next heartbeat. Returns the job's
/// state after the call.
pub fn cancel(tx: &mut dyn Txn, id: JobId, policy: &QueuePolicy) -> Result<JobState> {
    let now_ms = tx.now_ms();
    let mut job = load_fresh(tx, id, policy)?;
    match job.state {
        JobState::Ready | JobState::Scheduled => job.finish(JobState::Cancelled, now_ms),
        JobState::Running => job.cancel_requested = true,
        state => {
            return Err(Error::InvalidState {
                id,
                state,
                action: "cancel",
            })
        }
    }
    tx.put_job(&job)?;
    Ok(job.state)
}

/// Make a dead or cancelled job ready again with a fresh attempt budget.
pub fn retry(tx: &mut dyn Txn, id: JobId, policy: &QueuePolicy) -> Result<()> {
    let now_ms = tx.now_ms();
    let mut job = load_fresh(tx, id, policy)?;
    if !matches!(job.state, JobState::Dead | JobState::Cancelled) {
        return Err(Error::InvalidState {
            id,
            state: job.state,
            action: "retry (only dead or cancelled jobs can be retried)",
        });
    }
    if let Some(key) = &job.unique_key {
        let holder = match tx.live_unique(&job.queue, key)? {
            Some(other) if !load_fresh(tx, other, policy)?.state.is_terminal() => Some(other),
            _ => None,
        };
        if let Some(other) = holder {
            return Err(Error::invalid(
                "unique_key",
                format!("job {other} already holds unique key {key:?}"),
            ));
        }
    }
    job.attempts = 0;
    job.expiries = 0;
    job.cancel_requested = false;
    job.finished_at_ms = None;
    job.reschedule(now_ms, now_ms);
    tx.put_job(&job)?;
    Ok(())
}

/// Delete up to `limit` terminal jobs of `queue` that finished at least
/// `older_than_ms` ago. Returns how many were deleted.
pub fn purge(
    tx: &mut dyn Txn,
    queue: &str,
    older_than_ms: u64,
    limit: usize,
    policy: &QueuePolicy,
) -> Result<usize> {
    check_queue(queue)?;
    check_batch(limit)?;
    maintain(tx, queue, policy)?;
    let cutoff_ms = tx.now_ms().saturating_sub(older_than_ms);
    let mut ids = Vec::new();
    tx.scan(queue, JobQuery::FinishedBy { cutoff_ms }, limit, &mut ids)?;
    for &id in &ids {
        tx.delete_job(id)?;
    }
    Ok(ids.len())
}

/// The one drain rule (`Queue::work` with `drain`, `queue work --drain`):
/// a queue is drained once no job is ready, running or due, where a retry
/// waiting out its backoff counts as due. A job delayed before its first
/// attempt does not hold a draining worker.
pub fn drained(tx: &mut dyn Txn, queue: &str, policy: &QueuePolicy) -> Result<bool> {
    let counts = stats(tx, queue, policy)?;
    if counts.get(JobState::Ready) > 0 || counts.get(JobState::Running) > 0 {
        return Ok(false);
    }
    let mut retrying = Vec::new();
    tx.scan(queue, JobQuery::Retrying, 1, &mut retrying)?;
    Ok(retrying.is_empty())
}

/// Jobs of `queue` per state, after [`maintain`].
pub fn stats(tx: &mut dyn Txn, queue: &str, policy: &QueuePolicy) -> Result<StateCounts> {
    check_queue(queue)?;
    maintain(tx, queue, policy)?;
    tx.counts(queue)
}

/// Up to `limit` jobs of `queue` after id `after`, optionally in one state,
/// after [`maintain`].
pub fn list(
    tx: &mut dyn Txn,
    queue: &str,
    state: Option<JobState>,
    after: JobId,
    limit: usize,
    policy: &QueuePolicy,
) -> Result<Vec<JobRecord>> {
    check_queue(queue)?;
    check_batch(limit)?;
    maintain(tx, queue, policy)?;
    tx.list(queue, state, after, limit)
}

/// One job's record, as of the store's clock.
pub fn get(tx: &mut dyn Txn, id: JobId, policy: &QueuePolicy) -> Result<JobRecord> {
    load_fresh(tx, id, policy)
}
