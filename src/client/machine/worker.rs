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
//!   empty claim backs off ([`Backoff`], doubling up to `idle_max_ms`;
//!   where the store announces every change, `announced`, it waits
//!   `idle_max_ms` at once), never past the queue's next change by time
//!   or a relook (rows another transaction holds), except that a hint
//!   within `SOON_MS` heard again and again backs off (`soon_floor_ms`);
//!   a wake-up (a job became ready, or the queue's plan moved earlier)
//!   cuts the wait short, and one that came while a claim was in flight
//!   makes an empty answer claim again at once. A claim answered
//!   after its local deadline (sent during a store stall) is given back at
//!   once, unstarted, costing no attempt.
//! - **Prefetch adapts**: `ahead` starts at `prefetch`. A claim that came
//!   back full while handlers ran out of work during its round trip (the
//!   loop is waiting on claims, not on handlers) doubles it, up to twice
//!   `batch_max` (a claim goes out once half the room is free: at this
//!   cap it asks for a whole batch; at `batch_max` it asked for half of
//!   one, and each job paid twice its share of a transaction's fixed
//!   cost); a claim that came back short (the queue is running dry)
//!   resets it to `prefetch`. Slow handlers never starve during a claim, so
//!   they never make a worker hoard jobs another process could run.
//! - **Start** queued jobs in claim order while fewer than `concurrency`
//!   run, if still valid; a queued job whose local deadline passed is
//!   given back unstarted.
//! - **Renew** every held job in one transaction per round (about every
//!   `heartbeat_ms`, by default a third of the lease and at most a second,
//!   so a cancel is seen within a second); a refused renewal or a passed
//!   local deadline loses the job (its handler is told to stop); a cancel
//!   request stops its handler.
//! - **Time out** (F3): a job with a run-time limit is held no longer
//!   than its claim's send time plus the limit, less the drift allowance
//!   (its [`Lifetime`] is capped there, renewals notwithstanding): then its
//!   handler is told to stop ([`StopWhy::TimedOut`]) and the attempt fails
//!   saying so, while the store still holds the claim (the store's own
//!   deadline, counted from the claim, comes later); one never started is
//!   given back.
//! - **Settle** outcomes in batches: a flush when the completer holds
//!   `batch_max` outcomes, when `flush_delay_ms` passed since the first, or
//!   at once when no handler runs or waits to (nothing else is coming); a
//!   batch without an answer (a transient error, or an ambiguous commit:
//!   a settle is idempotent) is sent again after a backoff.
//!   Every outcome a handler reports is sent until the store answers it
//!   (unless the process dies), and reported once.
//! - **Drain**: with `drain`, once a claim finds nothing and nothing is
//!   held, ask the store ([`crate::core::job::drained`]); finish if drained.
//! - **Sample** the queue's jobs per state every `sample_ms` (if set), one
//!   request in flight, for the queue-depth gauges.
//! - **Fire** the queue's schedules (if `fire_ms` is set) when the next
//!   tick is due and at least every `fire_ms` (while quiet on a store that
//!   announces changes, every `idle_max_ms` if longer), one request in
//!   flight (`FireTimer`); a wake-up makes a quiet worker fire at once
//!   and a busy one within `fire_ms`; jobs it enqueued are claimed at
//!   once. Not after shutdown.
//! - **Shutdown**: stop claiming, give queued jobs back at once, let running
//!   handlers finish until the deadline, then give theirs back (counted as
//!   attempts) and tell them to stop; finish once everything is settled.
//!
//! Everything about a held job names its claim ([`ClaimId`]: job and
//! token): a job can be claimed again (a new token) before the outcome of
//! its old claim commits.
//!
//! # Timers
//! One table ([`Timer`], quinn-proto's shape): whether each timer is armed,
//! and when, is decided in one place (`WorkerMachine::timer`);
//! `poll_timeout` is the earliest armed one and `step` fires each one due.
//!
//! # Invariants
//! Checked after every step ([`WorkerMachine::check`]; in debug builds by
//! the machine itself, in the simulator by the world after each event). A
//! claim is in exactly one phase (queued, running, reported); `running`
//! counts the running jobs and is at most `concurrency`; the queue holds
//! exactly the held jobs not started; every outcome waiting in the
//! completer or in flight is a reported claim, in one of the two; at most
//! one request of each kind is in flight (and a wake-up kept for a claim
//! only while one is); after shutdown nothing is queued; and no timer is
//! left due (everything due at `now` was done).

use super::lifetime::{renewal_wait, Lifetime};
pub use super::worker_io::{
    ClaimId, HandlerOutcome, JobOutcome, StopWhy, WorkerAction, WorkerConfig, WorkerReply,
    WorkerRequest,
};
use crate::core::job::Settle;
use crate::core::{mix64, Backoff, JobId, JobRecord};
use crate::error::Error;
use crate::time::LocalMs;
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
    /// When the job's run-time limit passes, on this clock (its claim's
    /// send time plus the limit, less the drift allowance); `life` never
    /// runs past it.
    pub(super) timeout_at: Option<LocalMs>,
}

impl Held {
    pub(super) fn claim(&self) -> ClaimId {
        ClaimId {
            job: self.record.id,
            token: self.token,
        }
    }
}

/// The machine's timers, in the order `step` fires them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    /// The earliest local deadline of a held job.
    Deadline,
    /// The end of the shutdown grace, while handlers run.
    Shutdown,
    /// The completer's flush (or its retry after a transient error).
    Flush,
    /// The next renewal round.
    Round,
    /// The next claim (while one is wanted).
    Claim,
    /// The next queue-depth sample.
    Sample,
    /// The next schedule fire.
    Fire,
}

impl Timer {
    /// How many of [`Timer::ALL`] fire before queued jobs are started:
    /// the deadlines and the shutdown grace (a slot a lost handler freed
    /// is filled in the same step; none is after shutdown).
    pub(super) const BEFORE_START: usize = 2;

    pub(super) const ALL: [Timer; 7] = [
        Timer::Deadline,
        Timer::Shutdown,
        Timer::Flush,
        Timer::Round,
        Timer::Claim,
        Timer::Sample,
        Timer::Fire,
    ];
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
    /// Outcomes reported and not yet committed, by claim: a job may be
    /// claimed again (a new token) before the reply for its old claim's
    /// outcome arrives.
    pub(super) reported: BTreeSet<ClaimId>,
    pub(super) completer: Vec<(ClaimId, Settle)>,
    /// When the completer flushes (while it holds outcomes).
    pub(super) flush_at: LocalMs,
    /// Not before this: a batch without an answer waits.
    pub(super) settle_retry_at: LocalMs,
    pub(super) settle_backoff: Backoff,
    pub(super) settle_sent: Option<Vec<(ClaimId, Settle)>>,
    pub(super) claim_sent: Option<LocalMs>,
    /// The last claim answered found nothing (the drain rule's premise).
    pub(super) last_claim_empty: bool,
    /// How many the claim in flight asked for.
    pub(super) claim_asked: usize,
    /// Handler slots that freed with nothing queued while it was in flight.
    pub(super) starved: usize,
    /// Jobs claimed ahead of a free handler (adapts; see the module docs).
    pub(super) ahead: usize,
    pub(super) next_claim: LocalMs,
    pub(super) idle: Backoff,
    /// Empty claims in a row whose answer said to look again almost at
    /// once (`SOON_MS`), for each of the answer's two hints (the queue's
    /// next change by time, the relook): past a few, that hint backs off
    /// (`soon_floor_ms`).
    pub(super) soon_hints: [u32; 2],
    /// A wake-up came while a claim was in flight: the claim may have read
    /// the queue before the change it announces, so an empty answer claims
    /// again at once instead of waiting.
    pub(super) rewake: bool,
    pub(super) round_sent: Option<(LocalMs, Vec<(JobId, u64)>)>,
    pub(super) next_round: LocalMs,
    pub(super) drain_sent: bool,
    pub(super) sample_sent: bool,
    pub(super) next_sample: LocalMs,
    pub(super) shutdown_at: Option<LocalMs>,
    pub(super) fire: super::scheduler::FireTimer,
    pub(super) over: bool,
    pub(super) rounds: u64,
    pub(super) out: VecDeque<WorkerAction>,
    #[cfg(feature = "canaries")]
    pub(super) breakage: WorkerBreakage,
    #[cfg(feature = "canaries")]
    pub(super) outcomes: u64,
}

/// Longest wait before a settle batch refused by a transient error is sent
/// again.
const SETTLE_RETRY_CAP_MS: u64 = 100;

impl WorkerMachine {
    /// A worker loop starting at local instant `now` (it claims at once).
    pub fn new(mut cfg: WorkerConfig, now: LocalMs) -> Self {
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
            flush_at: now,
            settle_retry_at: LocalMs::ZERO,
            settle_backoff: Backoff::new(1, SETTLE_RETRY_CAP_MS, mix64(cfg.seed ^ 0x5e77)),
            settle_sent: None,
            claim_sent: None,
            last_claim_empty: false,
            claim_asked: 0,
            starved: 0,
            ahead: cfg.prefetch,
            next_claim: now,
            idle: Backoff::new(
                if cfg.announced { cfg.idle_max_ms } else { 1 },
                cfg.idle_max_ms.max(1),
                mix64(cfg.seed ^ 0x1d1e),
            ),
            rewake: false,
            soon_hints: [0; 2],
            round_sent: None,
            next_round: LocalMs::MAX,
            drain_sent: false,
            sample_sent: false,
            next_sample: now,
            shutdown_at: None,
            fire: super::scheduler::FireTimer::new(cfg.fire_ms, now, cfg.seed),
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

    /// When [`WorkerMachine::handle_timeout`] should be called next: the
    /// earliest armed timer.
    pub fn poll_timeout(&self) -> Option<LocalMs> {
        if self.over {
            return None;
        }
        Timer::ALL.into_iter().filter_map(|t| self.timer(t)).min()
    }

    /// When `timer` fires, if it is armed: the one place that says.
    pub(super) fn timer(&self, timer: Timer) -> Option<LocalMs> {
        match timer {
            Timer::Deadline => self.jobs.values().map(|h| h.life.deadline()).min(),
            Timer::Shutdown => self.shutdown_at.filter(|_| self.running > 0),
            Timer::Flush => {
                if self.settle_sent.is_some() || self.completer.is_empty() {
                    return None;
                }
                // Nothing else is coming soon: no handler runs and none is
                // about to; or the batch is full.
                let idle = self.running == 0 && self.queued.is_empty();
                let full = self.completer.len() >= self.cfg.batch_max;
                let at = if idle || full {
                    LocalMs::ZERO
                } else {
                    self.flush_at
                };
                Some(at.max(self.settle_retry_at))
            }
            Timer::Round => {
                let held = !(self.jobs.is_empty() && self.reported.is_empty());
                (held && self.round_sent.is_none()).then_some(self.next_round)
            }
            Timer::Claim => (self.claim_sent.is_none() && self.may_claim() && self.claim_wanted())
                .then_some(self.next_claim),
            Timer::Sample => {
                (self.cfg.sample_ms > 0 && !self.sample_sent).then_some(self.next_sample)
            }
            Timer::Fire => self.fire.poll_timeout().filter(|_| self.may_claim()),
        }
    }

    fn on_timer(&mut self, timer: Timer, now: LocalMs) {
        match timer {
            Timer::Deadline => self.expire(now),
            Timer::Shutdown => self.give_back_running(now),
            Timer::Flush => self.flush(now),
            Timer::Round => self.renew_round(now),
            Timer::Claim => self.send_claim(now),
            Timer::Sample => {
                self.sample_sent = true;
                self.send(WorkerRequest::Sample);
            }
            Timer::Fire => {
                self.fire.sent(now);
                self.send(WorkerRequest::Fire);
            }
        }
    }

    /// Whether the loop is over.
    pub fn is_finished(&self) -> bool {
        self.over
    }

    /// Jobs held: claimed, and not yet settled.
    pub fn held(&self) -> usize {
        self.jobs.len() + self.reported.len()
    }

    /// The local deadline of a queued or running claim.
    pub fn deadline(&self, claim: ClaimId) -> Option<LocalMs> {
        self.jobs
            .get(&claim.job)
            .filter(|h| h.token == claim.token)
            .map(|h| h.life.deadline())
    }

    /// Whether the handler of `claim` may act at `now` (a handler of an
    /// older claim of the same job may not).
    pub fn is_valid(&self, claim: ClaimId, now: LocalMs) -> bool {
        self.jobs
            .get(&claim.job)
            .is_some_and(|h| h.token == claim.token && h.running && h.life.is_valid(now))
    }

    pub(super) fn may_claim(&self) -> bool {
        !self.over && self.shutdown_at.is_none()
    }

    fn room(&self) -> usize {
        (self.cfg.concurrency + self.ahead).saturating_sub(self.running + self.queued.len())
    }

    /// Whether a claim should go out (time permitting): a free handler
    /// slot with nothing queued, or at least half the room free (either
    /// means some room: `concurrency` is at least 1).
    fn claim_wanted(&self) -> bool {
        let room = self.room();
        let hungry = self.running < self.cfg.concurrency && self.queued.is_empty();
        hungry || 2 * room >= self.cfg.concurrency + self.ahead
    }

    pub(super) fn send(&mut self, request: WorkerRequest) {
        self.out.push_back(WorkerAction::Send(request));
    }

    /// Time passed to `now`.
    pub fn handle_timeout(&mut self, now: LocalMs) {
        self.step(now);
    }

    /// A job became ready somewhere: claim without waiting out the backoff.
    pub fn wake(&mut self, now: LocalMs) {
        if self.may_claim() {
            self.next_claim = self.next_claim.min(now);
            self.idle.reset();
            self.rewake |= self.claim_sent.is_some();
            // A schedule may have been put: a quiet worker looks now, a
            // busy one within `fire_ms`.
            let look = if self.quiet() {
                now
            } else {
                now.saturating_add(self.cfg.fire_ms)
            };
            self.fire.hurry(look);
            self.step(now);
        }
    }

    /// Switch the drain rule on or off (the simulator's heal phase).
    pub fn set_drain(&mut self, now: LocalMs, drain: bool) {
        self.cfg.drain = drain;
        self.step(now);
    }

    /// Stop claiming; queued jobs are given back at once; running handlers
    /// have until `deadline` (local), then their jobs are given back too.
    pub fn shutdown(&mut self, now: LocalMs, deadline: LocalMs) {
        if self.over || self.shutdown_at.is_some() {
            return;
        }
        self.shutdown_at = Some(deadline);
        while let Some(id) = self.queued.pop_front() {
            self.report(id, Settle::Abandon { started: false }, now);
        }
        self.step(now);
    }

    /// Do whatever is due at `now`: every timer due, in [`Timer::ALL`]'s
    /// order, with queued jobs started once deadlines and the shutdown
    /// grace are seen to.
    pub(super) fn step(&mut self, now: LocalMs) {
        if self.over {
            return;
        }
        let (first, rest) = Timer::ALL.split_at(Timer::BEFORE_START);
        for &timer in first {
            self.fire_if_due(timer, now);
        }
        self.start_queued(now);
        for &timer in rest {
            self.fire_if_due(timer, now);
        }
        self.maybe_finish();
        super::debug_assert_holds("worker", now, || self.check(now));
    }

    fn fire_if_due(&mut self, timer: Timer, now: LocalMs) {
        if self.timer(timer).is_some_and(|at| now >= at) {
            self.on_timer(timer, now);
        }
    }

    fn start_queued(&mut self, now: LocalMs) {
        while self.running < self.cfg.concurrency && self.shutdown_at.is_none() {
            let Some(id) = self.queued.pop_front() else {
                break;
            };
            let Some(h) = self.jobs.get_mut(&id) else {
                continue;
            };
            if !h.life.is_valid(now) {
                self.report(id, Settle::Abandon { started: false }, now);
                continue;
            }
            h.running = true;
            self.running += 1;
            self.out
                .push_back(WorkerAction::Start(Box::new(h.record.clone())));
        }
    }

    fn flush(&mut self, now: LocalMs) {
        let n = self.completer.len().min(self.cfg.batch_max);
        let batch: Vec<(ClaimId, Settle)> = self.completer.drain(..n).collect();
        let settles = batch
            .iter()
            .map(|(c, s)| (c.job, c.token, s.clone()))
            .collect();
        self.settle_sent = Some(batch);
        // The rest (if any) goes as soon as this batch is answered.
        self.flush_at = now;
        self.send(WorkerRequest::Settle { settles });
    }

    /// Every claim a renewal round carries: held jobs, and outcomes not yet
    /// committed (their claims must outlive a slow settle).
    fn renew_round(&mut self, now: LocalMs) {
        let mut claims: Vec<(JobId, u64)> =
            self.jobs.iter().map(|(id, h)| (*id, h.token)).collect();
        claims.extend(self.reported.iter().map(|c| (c.job, c.token)));
        self.round_sent = Some((now, claims.clone()));
        self.send(WorkerRequest::Heartbeat { claims });
    }

    fn send_claim(&mut self, now: LocalMs) {
        let max = self.room().min(self.cfg.batch_max);
        self.claim_sent = Some(now);
        self.claim_asked = max;
        self.starved = 0;
        self.send(WorkerRequest::Claim { max });
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

    /// The next renewal round after one sent (or a first claim) at `from`.
    pub(super) fn next_round_after(&mut self, from: LocalMs) -> LocalMs {
        self.rounds += 1;
        let draw = mix64(self.cfg.seed ^ self.rounds.rotate_left(17));
        from.saturating_add(renewal_wait(self.cfg.heartbeat_ms, draw))
    }
}
