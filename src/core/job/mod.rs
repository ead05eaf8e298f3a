//! Jobs: the records ([`JobRecord`], [`JobState`], [`Claim`]), what to
//! enqueue ([`JobSpec`]), the retry policy ([`QueuePolicy`], [`backoff_ms`]),
//! a queue's stored settings (`flow`: [`QueueConfig`], pause and resume,
//! concurrency limits; `rate`: rate limits), and the rules over them
//! (Q1-Q5, F1-F4; `enqueue`: one job or a batch; `rules`: claim, heartbeat,
//! expire, stats, list; `operator`: cancel, retry, purge; `settle`: complete, fail,
//! abandon, one at a time or a worker's batch), and what people look at
//! (`view`: queues, pages of jobs, summaries).
//!
//! See the [module docs of `core`](super) for the state machine. Each
//! operation reads what it needs, decides, and only then writes, so a rule
//! error changes nothing.

mod deps;
mod enqueue;
mod flow;
mod operator;
mod progress;
mod rate;
mod rules;
mod settle;
mod unique;
mod view;

pub use deps::MAX_AFTER;
pub use enqueue::*;
pub use flow::*;
pub use operator::*;
pub use progress::{record_progress, Progress, MAX_PROGRESS_MESSAGE};
pub use rate::{Rate, RateLog, MAX_RATE, MAX_WINDOW_MS, QUEUE_BUCKET};
pub use rules::*;
pub use settle::*;
pub use unique::{StateSet, UNIQUE_READ};
pub(crate) use view::check_after_key;
pub use view::{
    page, queues, summary, JobCursor, JobPeek, QueueSummary, SummaryOptions, BUCKETS_MAX,
    PRIORITY_BANDS_MAX,
};

use super::{mix64, HolderId};
use crate::error::Field;
use crate::error::{Error, LostReason, Result, Target};
use crate::time::StoreMs;
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
    Ready = 0,
    /// Waiting for its `run_at_ms` (a delay or a retry backoff).
    Scheduled = 1,
    /// Claimed by a worker whose claim has not been seen to expire.
    Running = 2,
    /// Completed (terminal).
    Done = 3,
    /// Out of attempts or quarantined (terminal; `retry` revives it).
    Dead = 4,
    /// Cancelled (terminal).
    Cancelled = 5,
    /// Waiting for the jobs it named ([`JobSpec::after`]) to end: ready
    /// (or scheduled) once they all did (see `deps`).
    Waiting = 6,
}

impl JobState {
    /// All states, in the order of [`StateCounts`] (their codes').
    pub const ALL: [JobState; 7] = [
        JobState::Ready,
        JobState::Scheduled,
        JobState::Running,
        JobState::Done,
        JobState::Dead,
        JobState::Cancelled,
        JobState::Waiting,
    ];

    /// Done, dead or cancelled.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Done | JobState::Dead | JobState::Cancelled)
    }

    /// Dead or cancelled: what [`retry`] makes ready again (a done job
    /// stays done; a live one is not retried but waits or runs).
    pub fn is_retryable(self) -> bool {
        matches!(self, JobState::Dead | JobState::Cancelled)
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
            JobState::Waiting => "waiting",
        }
    }

    /// Parse [`JobState::as_str`]'s output.
    pub fn parse(text: &str) -> Result<Self> {
        JobState::ALL
            .into_iter()
            .find(|s| s.as_str() == text)
            .ok_or_else(|| {
                let names = JobState::ALL.map(JobState::as_str).join(", ");
                Error::invalid(Field::State, format!("{text:?} is not one of {names}"))
            })
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The state's code in stores: 0 ready, 1 scheduled, 2 running, 3 done,
    /// 4 dead, 5 cancelled, 6 waiting (the order of [`StateCounts`]): the
    /// terminal states are 3 to 5, the live ones 0 to 2 and 6. Every store
    /// writes and reads these, and indexes by them.
    #[doc(hidden)]
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The state a stored code names; `None` for a code no state has (a
    /// row written by a newer leasehold, or damaged): the store reports it
    /// as an error naming the row, never guesses.
    #[doc(hidden)]
    pub fn from_code(code: i64) -> Option<JobState> {
        usize::try_from(code)
            .ok()
            .and_then(|i| JobState::ALL.get(i).copied())
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
    /// For a job with a run-time limit ([`JobRecord::timeout_ms`]): the
    /// instant (store clock) it passes, counted from the claim. The claim's
    /// lease never reaches past it, and no renewal extends it (F3).
    pub deadline_ms: Option<u64>,
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
    /// What its handler returned when it completed, if anything (at most
    /// [`MAX_PAYLOAD_BYTES`](super::MAX_PAYLOAD_BYTES)).
    pub result: Option<Arc<[u8]>>,
    /// Its concurrency key: what its queue's per-key limit counts
    /// ([`Limits::per_key`]).
    pub key: Option<Arc<str>>,
    /// Its run-time limit: each attempt ends this long after its claim at
    /// the latest (F3).
    pub timeout_ms: Option<u64>,
    /// Ready but set aside by a claim because its key was at its queue's
    /// per-key limit: out of claim order until a job of its key leaves
    /// running (see `flow`). Only ever set on a ready job.
    pub parked: bool,
    /// The jobs it was pushed after ([`JobSpec::after`]), if any.
    pub after: Option<Arc<[JobId]>>,
    /// It runs once they all ended, however ([`JobSpec::after_any`]).
    pub after_any: bool,
    /// How many of them it still waits for (set while waiting).
    pub waiting_on: u32,
    /// Some job waits for it: its end is looked up for them.
    pub has_children: bool,
    /// What its current (or last) attempt's handler last reported
    /// ([`record_progress`]); a new claim starts without.
    pub progress: Option<Progress>,
}

/// The sort key of claim order (Q5): priority descending, then earlier
/// `run_at_ms`, then lower id (FIFO).
#[doc(hidden)]
pub type ClaimRank = (Reverse<i32>, u64, JobId);

/// A ready job of queue `q` (payload `x`, one attempt of three made,
/// token 1): the record unit tests vary with `..sample_job(id)`.
#[cfg(test)]
pub(crate) fn sample_job(id: u64) -> JobRecord {
    JobRecord {
        id: JobId(id),
        queue: Arc::from("q"),
        payload: Arc::from(&b"x"[..]),
        priority: 0,
        run_at_ms: 0,
        created_at_ms: 0,
        max_attempts: 3,
        attempts: 1,
        expiries: 0,
        last_token: 1,
        state: JobState::Ready,
        claim: None,
        cancel_requested: false,
        last_error: None,
        unique_key: None,
        finished_at_ms: None,
        result: None,
        key: None,
        parked: false,
        timeout_ms: None,
        progress: None,
        after: None,
        after_any: false,
        waiting_on: 0,
        has_children: false,
    }
}

impl JobRecord {
    /// Its position in claim order.
    #[doc(hidden)]
    pub fn rank(&self) -> ClaimRank {
        (Reverse(self.priority), self.run_at_ms, self.id)
    }

    pub(super) fn finish(&mut self, state: JobState, now_ms: u64) {
        debug_assert!(state.is_terminal());
        self.state = state;
        self.claim = None;
        self.parked = false;
        self.finished_at_ms = Some(now_ms);
    }

    pub(super) fn reschedule(&mut self, run_at_ms: u64, now_ms: u64) {
        self.claim = None;
        self.run_at_ms = run_at_ms;
        self.state = if run_at_ms <= now_ms {
            JobState::Ready
        } else {
            JobState::Scheduled
        };
    }

    /// The reason a claim that ran out writes: an expiry, or the job's
    /// run-time limit reached (the claim ran out at its deadline). Both
    /// begin "lease expired", which no settle writes.
    pub(super) fn expiry_reason(&self) -> &'static str {
        match self.claim {
            Some(c) if c.deadline_ms.is_some_and(|d| c.lease_until_ms >= d) => {
                "lease expired at the job's deadline (timed out)"
            }
            _ => "lease expired",
        }
    }

    /// Check that `holder`/`token` names this job's unexpired claim.
    pub(super) fn check_claim(&self, holder: HolderId, token: u64, now_ms: u64) -> Result<Claim> {
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
    /// Opaque bytes for the worker (at most [`MAX_PAYLOAD_BYTES`](super::MAX_PAYLOAD_BYTES)).
    pub payload: Vec<u8>,
    /// Higher runs first.
    pub priority: i32,
    /// Run no earlier than this long after enqueue.
    pub delay_ms: u64,
    /// Run no earlier than this instant of the store's clock; overrides
    /// `delay_ms`. An instant in the past means now. A wall-clock time
    /// becomes one through [`crate::Client::store_time`].
    pub run_at: Option<StoreMs>,
    /// Attempts allowed (1..=[`MAX_ATTEMPTS`](super::MAX_ATTEMPTS)).
    pub max_attempts: u32,
    /// A second enqueue with the key of a live (non-terminal) job returns
    /// that job instead of creating one (which jobs block it:
    /// `unique_for` and `unique_states`).
    pub unique_key: Option<String>,
    /// With a unique key: a job with the key pushed within this period
    /// before now blocks the push, whatever its state (unless
    /// `unique_states` says which). At most a year.
    pub unique_for: Option<std::time::Duration>,
    /// With a unique key: the states in which a job with the key blocks
    /// the push (default: ready, scheduled and running; with
    /// `unique_for`, every state).
    pub unique_states: Option<StateSet>,
    /// Its concurrency key: a queue's per-key limit ([`Limits::per_key`])
    /// counts the running jobs that share it (a customer, a tenant, a
    /// repository), so at most that many of them run at once.
    pub key: Option<String>,
    /// Jobs it runs after (`--after`): it waits until all of them are done,
    /// and ends cancelled if one ends dead or cancelled (unless
    /// `after_any`). Only jobs that exist can be named (at most
    /// [`MAX_AFTER`]).
    pub after: Vec<JobId>,
    /// With `after`: run once they all ended, whatever the ending.
    pub after_any: bool,
    /// Its run-time limit, distinct from the claim's lease: an attempt
    /// still running this long after its claim is stopped by its worker and
    /// fails saying so, and the store renews no claim past it, so a stuck
    /// attempt's claim ends there even if its worker is gone (F3). At most
    /// a year.
    pub timeout: Option<std::time::Duration>,
}

impl Default for JobSpec {
    fn default() -> Self {
        JobSpec {
            payload: Vec::new(),
            priority: 0,
            delay_ms: 0,
            run_at: None,
            max_attempts: 3,
            unique_key: None,
            unique_for: None,
            unique_states: None,
            key: None,
            after: Vec::new(),
            after_any: false,
            timeout: None,
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
    let seed = policy.jitter_seed ^ mix64(id.0);
    crate::core::Backoff::new(policy.backoff_base_ms, policy.backoff_max_ms, seed)
        .wait(attempts.saturating_sub(1))
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
pub struct StateCounts(pub [u64; 7]);

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
