//! [`WorkerMachine`]: one process's worker loop: which jobs to claim and
//! when, whose handler to start, when to renew them all, when to give up
//! on one, how outcomes are batched, when the queue is drained, how it
//! shuts down. The sync loop (`Queue::work`), the tokio worker and the
//! simulator drive this same machine.
//!
//! # State
//! The held jobs, each `Queued` (claimed ahead, handler not started),
//! `Running` (its handler runs) or `Reported` (its outcome waits in the
//! completer or is being committed), each with its [`Lifetime`] (the local
//! deadline); the completer (outcomes not yet sent) and when it flushes;
//! the request of each kind in flight (claim, renewal round, settle, drain
//! check); the idle backoff; the shutdown deadline.
//!
//! # Rules
//! - **Claim** while fewer than `concurrency + ahead` jobs are queued or
//!   running, up to `batch_max` per transaction, one claim in flight: at
//!   once when a handler slot is free and nothing is queued, else once at
//!   least half of that room is free (so that claims come in batches). An
//!   empty claim backs off (jittered, doubling up to `idle_max_ms`); a
//!   wake-up (a job became ready) cuts the backoff short.
//! - **Prefetch adapts**: `ahead` starts at `prefetch`. A claim that came
//!   back full while handlers ran out of work during its round trip (the
//!   loop is waiting on claims, not on handlers) doubles it, up to
//!   `batch_max`; a claim that came back short (the queue is running dry)
//!   resets it to `prefetch`. Slow handlers never starve during a claim, so
//!   they never make a worker hoard jobs another process could run.
//! - **Start** queued jobs in claim order while fewer than `concurrency`
//!   run, if still valid.
//! - **Renew** every held job in one transaction per round (about every
//!   `heartbeat_ms`, by default a third of the lease and at most a second,
//!   so a cancel is seen within a second); a refused renewal or a passed
//!   local deadline loses the job (its handler is told to stop); a cancel
//!   request stops its handler.
//! - **Settle** outcomes in batches: a flush when the completer holds
//!   `batch_max` outcomes, when `flush_delay_ms` passed since the first, or
//!   at once when no handler runs or waits to (nothing else is coming).
//!   Every outcome a handler reports is sent exactly once, unless the
//!   process dies.
//! - **Drain**: with `drain`, once a claim finds nothing and nothing is
//!   held, ask the store ([`crate::core::job::drained`]); finish if drained.
//! - **Sample** the queue's jobs per state every `sample_ms` (if set), one
//!   request in flight, for the queue-depth gauges.
//! - **Fire** the queue's schedules (if `fire_ms` is set) when the next
//!   tick is due and at least every `fire_ms`, one request in flight
//!   (`FireTimer`); jobs it enqueued are claimed at once. Not after
//!   shutdown.
//! - **Shutdown**: stop claiming, give queued jobs back at once, let running
//!   handlers finish until the deadline, then give theirs back (counted as
//!   attempts) and tell them to stop; finish once everything is settled.
//!
//! # Invariants
//! A job is in exactly one phase; at most `concurrency` run; a job's
//! handler is started at most once per claim and only while its claim is
//! locally valid; nothing is claimed after shutdown; every reported
//! outcome reaches one settle request.

use super::lifetime::Lifetime;
pub use super::worker_io::{
    HandlerOutcome, JobOutcome, StopWhy, WorkerAction, WorkerConfig, WorkerReply, WorkerRequest,
};
use crate::core::job::Settle;
use crate::core::{mix64, JobId, JobRecord};
use crate::error::{Error, LostReason};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// A claimed job whose outcome is not yet reported: queued (claimed ahead
/// of a free handler) or running.
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub(super) record: JobRecord,
    pub(super) token: u64,
    pub(super) life: Lifetime,
    pub(super) running: bool,
    pub(super) cancel_seen: bool,
}

/// Deliberately broken variants, for the simulator's canaries.
#[cfg(feature = "canaries")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkerBreakage {
    /// The completer loses every fourth outcome it is given.
    pub drop_outcomes: bool,
}

/// One process's worker loop; see the module docs.
#[derive(Debug, Clone)]
pub struct WorkerMachine {
    pub(super) cfg: WorkerConfig,
    /// Queued and running jobs, by id (one claim per job at a time).
    pub(super) jobs: BTreeMap<JobId, Held>,
    pub(super) queued: VecDeque<JobId>,
    pub(super) running: usize,
    /// Outcomes reported and not yet committed, by (job, token): a job may
    /// be claimed again (a new token) before the reply for its old claim's
    /// outcome arrives.
    pub(super) reported: BTreeSet<(JobId, u64)>,
    pub(super) completer: Vec<(JobId, u64, Settle)>,
    pub(super) flush_at: Option<u64>,
    pub(super) settle_sent: Option<Vec<(JobId, u64, Settle)>>,
    pub(super) settle_backoff_ms: u64,
    pub(super) claim_sent: Option<u64>,
    /// How many the claim in flight asked for.
    pub(super) claim_asked: usize,
    /// Handler slots that freed with nothing queued while it was in flight.
    pub(super) starved: usize,
    /// Jobs claimed ahead of a free handler (adapts; see the module docs).
    pub(super) ahead: usize,
    pub(super) next_claim: u64,
    pub(super) idle_ms: u64,
    pub(super) round_sent: Option<(u64, Vec<(JobId, u64)>)>,
    pub(super) next_round: u64,
    pub(super) drain_sent: bool,
    pub(super) sample_sent: bool,
    pub(super) next_sample: u64,
    pub(super) shutdown_at: Option<u64>,
    pub(super) fire: super::scheduler::FireTimer,
    pub(super) over: bool,
    pub(super) rounds: u64,
    pub(super) out: VecDeque<WorkerAction>,
    #[cfg(feature = "canaries")]
    pub(super) breakage: WorkerBreakage,
    #[cfg(feature = "canaries")]
    pub(super) outcomes: u64,
}

impl WorkerMachine {
    /// A worker loop starting at local instant `now` (it claims at once).
    pub fn new(mut cfg: WorkerConfig, now: u64) -> Self {
        cfg.concurrency = cfg.concurrency.max(1);
        cfg.batch_max = cfg.batch_max.max(1);
        if cfg.heartbeat_ms == 0 {
            cfg.heartbeat_ms = super::lifetime::renew_every(cfg.lease_ms).min(1_000);
        }
        let mut m = WorkerMachine {
            cfg,
            jobs: BTreeMap::new(),
            queued: VecDeque::new(),
            running: 0,
            reported: BTreeSet::new(),
            completer: Vec::new(),
            flush_at: None,
            settle_sent: None,
            settle_backoff_ms: 1,
            claim_sent: None,
            claim_asked: 0,
            starved: 0,
            ahead: cfg.prefetch,
            next_claim: now,
            idle_ms: 1,
            round_sent: None,
            next_round: u64::MAX,
            drain_sent: false,
            sample_sent: false,
            next_sample: now,
            shutdown_at: None,
            fire: super::scheduler::FireTimer::new(cfg.fire_ms, now),
            over: false,
            rounds: 0,
            out: VecDeque::new(),
            #[cfg(feature = "canaries")]
            breakage: WorkerBreakage::default(),
            #[cfg(feature = "canaries")]
            outcomes: 0,
        };
        m.step(now);
        m
    }

    /// The same machine with a deliberate breakage (simulator canaries).
    #[cfg(feature = "canaries")]
    pub fn with_breakage(mut self, breakage: WorkerBreakage) -> Self {
        self.breakage = breakage;
        self
    }

    /// The next thing to do, if any.
    pub fn poll_action(&mut self) -> Option<WorkerAction> {
        self.out.pop_front()
    }

    /// When [`WorkerMachine::handle_timeout`] should be called next.
    pub fn poll_timeout(&self) -> Option<u64> {
        if self.over {
            return None;
        }
        let mut t = u64::MAX;
        if self.claim_sent.is_none() && self.may_claim() && self.claim_wanted() {
            t = t.min(self.next_claim);
        }
        if self.round_sent.is_none() && !self.round_claims().is_empty() {
            t = t.min(self.next_round);
        }
        if let (Some(at), None) = (self.flush_at, &self.settle_sent) {
            t = t.min(at);
        }
        if self.cfg.sample_ms > 0 && !self.sample_sent {
            t = t.min(self.next_sample);
        }
        if let (Some(at), true) = (self.fire.poll_timeout(), self.may_claim()) {
            t = t.min(at);
        }
        for h in self.jobs.values() {
            t = t.min(h.life.deadline());
        }
        if let Some(at) = self.shutdown_at {
            if self.running > 0 {
                t = t.min(at);
            }
        }
        (t < u64::MAX).then_some(t)
    }

    /// Whether the loop is over.
    pub fn is_finished(&self) -> bool {
        self.over
    }

    /// Jobs held: claimed, and not yet settled.
    pub fn held(&self) -> usize {
        self.jobs.len() + self.reported.len()
    }

    /// The local deadline of a queued or running job.
    pub fn deadline(&self, id: JobId) -> Option<u64> {
        self.jobs.get(&id).map(|h| h.life.deadline())
    }

    /// Whether the handler of `id`'s claim `token` may act at `now` (a
    /// handler of an older claim of the same job may not).
    pub fn is_valid(&self, id: JobId, token: u64, now: u64) -> bool {
        self.jobs
            .get(&id)
            .is_some_and(|h| h.token == token && h.running && h.life.is_valid(now))
    }

    pub(super) fn may_claim(&self) -> bool {
        !self.over && self.shutdown_at.is_none()
    }

    fn room(&self) -> usize {
        (self.cfg.concurrency + self.ahead).saturating_sub(self.running + self.queued.len())
    }

    /// Whether a claim should go out (time permitting): a free handler
    /// slot with nothing queued, or at least half the room free.
    fn claim_wanted(&self) -> bool {
        let room = self.room();
        let hungry = self.running < self.cfg.concurrency && self.queued.is_empty();
        room > 0 && (hungry || 2 * room >= self.cfg.concurrency + self.ahead)
    }

    pub(super) fn jitter(&mut self, span: u64) -> u64 {
        self.rounds += 1;
        mix64(self.cfg.seed ^ self.rounds.rotate_left(17)) % span.max(1)
    }

    /// Every claim a renewal round carries: held jobs, and outcomes not yet
    /// committed (their claims must outlive a slow settle).
    fn round_claims(&self) -> Vec<(JobId, u64)> {
        let mut claims: Vec<(JobId, u64)> =
            self.jobs.iter().map(|(id, h)| (*id, h.token)).collect();
        claims.extend(self.reported.iter().copied());
        claims
    }

    /// Time passed to `now`.
    pub fn handle_timeout(&mut self, now: u64) {
        if self.over {
            return;
        }
        self.expire(now);
        if self.shutdown_at.is_some_and(|at| now >= at) {
            self.give_back_running(now);
        }
        self.step(now);
    }

    /// A job became ready somewhere: claim without waiting out the backoff.
    pub fn wake(&mut self, now: u64) {
        if self.may_claim() {
            self.next_claim = self.next_claim.min(now);
            self.idle_ms = 1;
            self.step(now);
        }
    }

    /// Switch the drain rule on or off (the simulator's heal phase).
    pub fn set_drain(&mut self, now: u64, drain: bool) {
        self.cfg.drain = drain;
        self.step(now);
    }

    /// Stop claiming; queued jobs are given back at once; running handlers
    /// have until `deadline` (local), then their jobs are given back too.
    pub fn shutdown(&mut self, now: u64, deadline: u64) {
        if self.over || self.shutdown_at.is_some() {
            return;
        }
        self.shutdown_at = Some(deadline);
        while let Some(id) = self.queued.pop_front() {
            self.report(id, Settle::Abandon { started: false }, now);
        }
        if now >= deadline {
            self.give_back_running(now);
        }
        self.step(now);
    }

    fn give_back_running(&mut self, now: u64) {
        let running: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(_, h)| h.running)
            .map(|(id, _)| *id)
            .collect();
        for id in running {
            self.out.push_back(WorkerAction::Stop {
                id,
                why: StopWhy::Shutdown,
            });
            self.running -= 1;
            self.report(id, Settle::Abandon { started: true }, now);
        }
        self.flush_at = Some(now);
    }

    /// The handler of `id`'s claim `token` finished at `now`: `Ok`
    /// completes the job, `Err(reason)` fails it (a reason too long for
    /// the store is cut, [`crate::client::fit_reason`]). Ignored for a
    /// claim no longer held: a handler stopped for a loss may report long
    /// after, when the job is claimed again (by this worker, too).
    pub fn handler_done(
        &mut self,
        now: u64,
        id: JobId,
        token: u64,
        result: impl Into<HandlerOutcome>,
    ) {
        self.expire(now);
        if !self
            .jobs
            .get(&id)
            .is_some_and(|h| h.running && h.token == token)
        {
            return;
        }
        self.running -= 1;
        if self.queued.is_empty() && self.claim_sent.is_some() {
            self.starved += 1;
        }
        self.report(id, result.into().settle(), now);
        self.step(now);
    }

    /// The job's outcome goes to the completer (its claim is renewed until
    /// the outcome is committed).
    pub(super) fn report(&mut self, id: JobId, settle: Settle, now: u64) {
        let Some(h) = self.jobs.remove(&id) else {
            return;
        };
        #[cfg(feature = "canaries")]
        {
            self.outcomes += 1;
            if self.breakage.drop_outcomes && self.outcomes % 4 == 0 {
                return;
            }
        }
        self.reported.insert((id, h.token));
        self.completer.push((id, h.token, settle));
        let at = now.saturating_add(self.cfg.flush_delay_ms);
        self.flush_at = Some(self.flush_at.map_or(at, |f| f.min(at)));
    }

    /// Local deadlines: a queued or running job whose deadline passed is
    /// lost (its handler is told). A reported outcome is still sent (the
    /// store decides).
    pub(super) fn expire(&mut self, now: u64) {
        let lost: Vec<(JobId, LostReason)> = self
            .jobs
            .iter_mut()
            .filter_map(|(id, h)| h.life.handle_timeout(now).map(|r| (*id, r)))
            .collect();
        for (id, reason) in lost {
            self.lose(id, reason);
        }
    }

    pub(super) fn lose(&mut self, id: JobId, reason: LostReason) {
        let Some(h) = self.jobs.remove(&id) else {
            return;
        };
        if h.running {
            self.running -= 1;
            self.out.push_back(WorkerAction::Stop {
                id,
                why: StopWhy::Lost(reason),
            });
        } else {
            self.queued.retain(|q| *q != id);
        }
        self.out.push_back(WorkerAction::Settled {
            id,
            outcome: JobOutcome::Lost,
        });
    }

    /// Do whatever is due at `now`.
    pub(super) fn step(&mut self, now: u64) {
        if self.over {
            return;
        }
        self.start_queued(now);
        self.maybe_flush(now);
        self.maybe_renew(now);
        self.maybe_claim(now);
        self.maybe_sample(now);
        if self.may_claim() && self.fire.take_due(now) {
            self.out.push_back(WorkerAction::Send(WorkerRequest::Fire));
        }
        self.maybe_finish();
    }

    fn maybe_sample(&mut self, now: u64) {
        if self.cfg.sample_ms == 0 || self.sample_sent || now < self.next_sample {
            return;
        }
        self.sample_sent = true;
        self.out
            .push_back(WorkerAction::Send(WorkerRequest::Sample));
    }

    fn start_queued(&mut self, now: u64) {
        while self.running < self.cfg.concurrency && self.shutdown_at.is_none() {
            let Some(id) = self.queued.pop_front() else {
                break;
            };
            let Some(h) = self.jobs.get_mut(&id) else {
                continue;
            };
            if !h.life.is_valid(now) {
                self.lose(id, LostReason::LocalDeadline);
                continue;
            }
            h.running = true;
            self.running += 1;
            self.out.push_back(WorkerAction::Start(h.record.clone()));
        }
    }

    fn maybe_flush(&mut self, now: u64) {
        if self.settle_sent.is_some() || self.completer.is_empty() {
            return;
        }
        // Nothing else is coming soon: no handler runs and none is about to.
        let idle = self.running == 0 && self.queued.is_empty();
        let due = self.flush_at.is_some_and(|at| now >= at);
        if !(idle || due || self.completer.len() >= self.cfg.batch_max) {
            return;
        }
        let n = self.completer.len().min(self.cfg.batch_max);
        let settles: Vec<(JobId, u64, Settle)> = self.completer.drain(..n).collect();
        self.settle_sent = Some(settles.clone());
        self.flush_at = if self.completer.is_empty() {
            None
        } else {
            Some(now)
        };
        self.out
            .push_back(WorkerAction::Send(WorkerRequest::Settle { settles }));
    }

    fn maybe_renew(&mut self, now: u64) {
        if self.round_sent.is_some() || now < self.next_round {
            return;
        }
        let claims = self.round_claims();
        if claims.is_empty() {
            self.next_round = u64::MAX;
            return;
        }
        self.round_sent = Some((now, claims.clone()));
        self.out
            .push_back(WorkerAction::Send(WorkerRequest::Heartbeat { claims }));
    }

    fn maybe_claim(&mut self, now: u64) {
        if !self.may_claim() || self.claim_sent.is_some() || now < self.next_claim {
            return;
        }
        if !self.claim_wanted() {
            return;
        }
        self.claim_sent = Some(now);
        let max = self.room().min(self.cfg.batch_max);
        self.claim_asked = max;
        self.starved = 0;
        self.out
            .push_back(WorkerAction::Send(WorkerRequest::Claim { max }));
    }

    pub(super) fn quiet(&self) -> bool {
        self.jobs.is_empty()
            && self.reported.is_empty()
            && self.completer.is_empty()
            && self.settle_sent.is_none()
            && self.claim_sent.is_none()
    }

    fn maybe_finish(&mut self) {
        if self.shutdown_at.is_some() && self.quiet() {
            self.over = true;
            self.out.push_back(WorkerAction::Finished);
        }
    }

    pub(super) fn fail(&mut self, e: Error) {
        if !self.over {
            self.over = true;
            self.out.push_back(WorkerAction::Failed(e));
        }
    }

    pub(super) fn next_round_after(&mut self, from: u64) -> u64 {
        let every = self.cfg.heartbeat_ms;
        let span = (every / 5).max(1);
        from.saturating_add(every - every / 10 + self.jitter(span))
    }
}
