//! The [`WorkerMachine`](super::WorkerMachine)'s vocabulary: its
//! configuration, the requests it asks its driver to send and the replies
//! it is fed, the actions it asks for, and how a handler and a job end.

use crate::core::job::Settle;
use crate::core::{DriftBound, HeartbeatReply, JobId, JobRecord, JobState, StateCounts};
use crate::error::{Error, LostReason, Result};
use crate::time::LocalMs;
use std::sync::Arc;

/// One claim of a job: the job and the claim's fencing token. A job can be
/// claimed again (a new token) before the outcome of its old claim is
/// committed, so everything about a held job names the claim, never the
/// job alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimId {
    /// The job.
    pub job: JobId,
    /// The claim's fencing token.
    pub token: u64,
}

impl ClaimId {
    /// The claim a claimed record carries (token 0 if it carries none).
    pub fn of(record: &JobRecord) -> ClaimId {
        ClaimId {
            job: record.id,
            token: record.claim.map_or(0, |c| c.token),
        }
    }
}

impl std::fmt::Display for ClaimId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "job {} (token {})", self.job, self.token)
    }
}

/// What a handler returned for its job ([`super::WorkerMachine::handler_done`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandlerOutcome {
    /// It succeeded, with a result to keep with the job, if any.
    Completed(Option<Arc<[u8]>>),
    /// It failed, for this reason.
    Failed(String),
}

impl From<std::result::Result<(), String>> for HandlerOutcome {
    fn from(r: std::result::Result<(), String>) -> Self {
        match r {
            Ok(()) => HandlerOutcome::Completed(None),
            Err(reason) => HandlerOutcome::Failed(reason),
        }
    }
}

impl HandlerOutcome {
    /// What the completer sends for it: a reason too long for the store
    /// is cut ([`crate::client::fit_reason`]); a result too large for it
    /// fails the job, saying so (the loop cannot ask for a smaller one).
    pub(super) fn settle(self) -> Settle {
        match self {
            HandlerOutcome::Completed(None) => Settle::Complete,
            HandlerOutcome::Completed(Some(result)) => {
                match crate::core::job::check_result(&result) {
                    Ok(()) => Settle::CompleteWith(result),
                    Err(e) => Settle::Fail(format!("the handler's result was refused: {e}")),
                }
            }
            HandlerOutcome::Failed(reason) => {
                Settle::Fail(crate::client::fit_reason(&reason).into_owned())
            }
        }
    }
}

/// How one job ended in a worker loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobOutcome {
    /// Completed.
    Done,
    /// Reported failed; the job's state now: scheduled for a retry, dead,
    /// or cancelled (a cancel was requested while it ran).
    Failed(JobState),
    /// Given back by a shutting-down worker; the job's state now (ready,
    /// or dead if it was its last attempt, or cancelled).
    Abandoned(JobState),
    /// The claim was lost, or the outcome is unknown, before it was
    /// recorded; the store retries the job once its lease runs out.
    Lost,
}

/// How a worker loop runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerConfig {
    /// Lease of each claim.
    pub lease_ms: u64,
    /// Handlers running at once.
    pub concurrency: usize,
    /// Jobs claimed ahead of a free handler.
    pub prefetch: usize,
    /// Most jobs per claim and most outcomes per settle transaction.
    pub batch_max: usize,
    /// Longest an outcome waits for others to share its transaction.
    pub flush_delay_ms: u64,
    /// Longest idle wait between claims (a wake-up cuts it short).
    pub idle_max_ms: u64,
    /// The store announces every change an idle worker waits for, from
    /// every process ([`crate::Store::announces_changes`]): an empty claim
    /// waits `idle_max_ms` at once (or until the queue's next change by
    /// time) instead of ramping up from 1 ms, and a quiet worker looks at
    /// its schedules when woken and otherwise at most every `idle_max_ms`
    /// (not every `fire_ms`). Without it, waiting is polling.
    pub announced: bool,
    /// Renewal round interval (0: a third of the lease, at most a second).
    pub heartbeat_ms: u64,
    /// Finish once the queue is drained.
    pub drain: bool,
    /// The drift allowance of the local deadlines.
    pub drift: DriftBound,
    /// Seed of the jitter.
    pub seed: u64,
    /// Sample the queue's jobs per state this often (0: never), for the
    /// queue-depth gauges.
    pub sample_ms: u64,
    /// Fire the queue's schedules ([`crate::core::schedule::fire`]) at
    /// each tick they report, and at least this often (0: never).
    pub fire_ms: u64,
}

/// A request the driver sends to the store for the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerRequest {
    /// `core::job::claim` of up to `max` jobs.
    Claim {
        /// How many at most.
        max: usize,
    },
    /// `core::job::heartbeat_many` of these claims.
    Heartbeat {
        /// (job, token) of every job held.
        claims: Vec<(JobId, u64)>,
    },
    /// `core::job::settle_many` of these outcomes.
    Settle {
        /// (job, token, outcome).
        settles: Vec<(JobId, u64, Settle)>,
    },
    /// `core::job::drained`.
    DrainCheck,
    /// `core::job::stats` (a sample of the queue's depth).
    Sample,
    /// `core::schedule::fire` at the driver's wall clock.
    Fire,
}

impl WorkerRequest {
    /// The reply that says this request got no answer but `e` (a store
    /// that could not be reached, a reply lost in the network).
    pub fn failed(&self, e: Error) -> WorkerReply {
        match self {
            WorkerRequest::Claim { .. } => WorkerReply::Claimed(Err(e)),
            WorkerRequest::Heartbeat { .. } => WorkerReply::Heartbeated(Err(e)),
            WorkerRequest::Settle { .. } => WorkerReply::Settled(Err(e)),
            WorkerRequest::DrainCheck => WorkerReply::Drained(Err(e)),
            WorkerRequest::Sample => WorkerReply::Sampled(Err(e)),
            WorkerRequest::Fire => WorkerReply::Fired(Err(e)),
        }
    }
}

/// The store's answer to a request (one per request sent).
#[derive(Debug, Clone)]
pub enum WorkerReply {
    /// To [`WorkerRequest::Claim`].
    Claimed(Result<Vec<JobRecord>>),
    /// To [`WorkerRequest::Claim`], when it claimed nothing: when to
    /// look again ([`crate::core::job::NextLook`]). The next claim goes
    /// out by the sooner of the two, except a hint within a few
    /// milliseconds heard again and again, which backs off.
    Idle {
        /// Store milliseconds until the queue changes by time alone (a
        /// scheduled job falls due, a claim runs out), if anything is
        /// scheduled or running.
        next_change_in_ms: Option<u64>,
        /// Store milliseconds until a look that may see what another
        /// transaction was doing to rows this claim passed over, if any:
        /// a guess.
        relook_in_ms: Option<u64>,
    },
    /// To [`WorkerRequest::Heartbeat`], in the order sent.
    Heartbeated(Result<Vec<Result<HeartbeatReply>>>),
    /// To [`WorkerRequest::Settle`], in the order sent.
    Settled(Result<Vec<Result<JobState>>>),
    /// To [`WorkerRequest::DrainCheck`].
    Drained(Result<bool>),
    /// To [`WorkerRequest::Sample`].
    Sampled(Result<StateCounts>),
    /// To [`WorkerRequest::Fire`].
    Fired(Result<super::FireReport>),
}

/// Why a running handler must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopWhy {
    /// Its claim is lost: stop acting at once.
    Lost(LostReason),
    /// A cancel was requested: stop and report failure.
    Cancelled,
    /// The worker shut down and gave the job back.
    Shutdown,
    /// The job's run-time limit passed: stop at once (as on a loss); the
    /// machine reports the failure itself.
    TimedOut,
}

/// What the driver should do next.
#[derive(Debug, Clone)]
pub enum WorkerAction {
    /// Send this request to the store, then feed its answer back.
    Send(WorkerRequest),
    /// Run the handler for this job (a handler slot is now taken).
    Start(Box<JobRecord>),
    /// Tell the handler of this claim to stop.
    Stop {
        /// The claim.
        claim: ClaimId,
        /// Why.
        why: StopWhy,
    },
    /// The claim was renewed: valid until this local instant.
    Renewed {
        /// The claim.
        claim: ClaimId,
        /// Its new local deadline.
        deadline: LocalMs,
    },
    /// The claim's outcome is recorded (or known lost).
    Settled {
        /// The claim.
        claim: ClaimId,
        /// How it ended.
        outcome: JobOutcome,
    },
    /// The queue's jobs per state, as sampled.
    Sampled(StateCounts),
    /// The loop is over: drained, or shut down with everything settled.
    Finished,
    /// A store error retrying will not fix: the loop is over.
    Failed(Error),
}
