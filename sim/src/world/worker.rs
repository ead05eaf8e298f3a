//! Workers run the real worker session ([`Session`]: the
//! [`WorkerMachine`](leasehold::client::machine::WorkerMachine), the
//! records and handles of the claims it holds, and [`Exec`], the store
//! side of its requests), as `Queue::work` and the tokio loop do. The world
//! only carries the session's requests to the store and back and plays the
//! handlers: each holds the handle the session gave it, takes a random
//! time, performs the job's side effect at its end if that handle says the
//! claim is still valid (L3 for jobs, checked by the oracle), and reports
//! success or failure. What the session reports (`observe`) is judged too
//! (B2), and the machine's invariants are checked after every event.

use super::msg::{error_of, Answer, Line, Rep, Req};
use super::stores::{Breakage, BrokenStore};
use super::{RoleState, Sim, QUEUE};
use crate::plan::Canary;
use leasehold::client::machine::{ClaimId, StopWhy, WorkerBreakage, WorkerRequest};
use leasehold::client::sim::{Exec, Next, Session, SessionBreakage};
use leasehold::core::job::Settle;
use leasehold::{
    ClaimedJob, Client, DriftBound, Holder, JobOutcome, JobRecord, LocalMs, ManualClock, Store,
    WorkOptions,
};
use rand::Rng;
use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

/// How the worker loop's failure of a job never started begins (F3).
const NEVER_STARTED: &str = "timed out before it started";

/// A process's clocks as its client reads them, set by the world to the
/// process's simulated readings before anything of it runs. They outlive
/// its incarnations: a request still in the network when it was killed
/// runs on them too.
#[derive(Debug, Clone)]
pub(super) struct ProcClocks {
    pub(super) local: ManualClock,
    pub(super) wall: ManualClock,
}

impl ProcClocks {
    pub(super) fn new() -> Self {
        ProcClocks {
            local: ManualClock::new(0),
            wall: ManualClock::new(0),
        }
    }
}

/// A running handler: the simulator's only part of a worker.
struct Handler {
    claim: ClaimId,
    job: Arc<ClaimedJob>,
    work_end: LocalMs,
    fails: bool,
}

pub(super) struct WorkerState {
    session: Session,
    client: Client,
    drift: DriftBound,
    clocks: ProcClocks,
    /// Handlers in start order. A handler the session stopped for a loss or
    /// a shutdown runs on to its end and reports late, as a handler thread
    /// that cannot be interrupted does (by then the job may be claimed
    /// again, by this worker too).
    handlers: Vec<Handler>,
    draining: bool,
}

impl std::fmt::Debug for WorkerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerState")
            .field("held", &self.session.machine.held())
            .field("handlers", &self.handlers.len())
            .finish()
    }
}

/// A fork: the child has a copy of everything, sharing nothing that can
/// change (its own clocks, client and handles).
impl Clone for WorkerState {
    fn clone(&self) -> Self {
        let clocks = ProcClocks::new();
        clocks
            .local
            .set(leasehold::Clock::now_ms(&self.clocks.local));
        clocks.wall.set(leasehold::Clock::now_ms(&self.clocks.wall));
        let client = worker_client(
            self.client.store().clone(),
            self.client.holder().clone(),
            &clocks,
            self.drift,
            *self.client.policy(),
        );
        let session = self.session.forked(&client);
        let handlers = self
            .handlers
            .iter()
            .map(|h| Handler {
                claim: h.claim,
                // A handle the session no longer has has ended: nothing
                // of it changes any more.
                job: session.handle(h.claim).unwrap_or(&h.job).clone(),
                work_end: h.work_end,
                fails: h.fails,
            })
            .collect();
        WorkerState {
            session,
            client,
            drift: self.drift,
            clocks,
            handlers,
            draining: self.draining,
        }
    }
}

impl WorkerState {
    /// A burst: claim now, whatever the idle backoff says.
    pub(super) fn wake_machine(&mut self, local: LocalMs) {
        self.session.machine.wake(local);
    }

    /// The clocks its client reads (a forked child's are its own).
    pub(super) fn clocks(&self) -> &ProcClocks {
        &self.clocks
    }
}

fn worker_client(
    store: Arc<dyn Store>,
    holder: Holder,
    clocks: &ProcClocks,
    drift: DriftBound,
    policy: leasehold::QueuePolicy,
) -> Client {
    Client::builder_shared(store)
        .holder(holder)
        .clock(Arc::new(clocks.local.clone()))
        .wall_clock(Arc::new(clocks.wall.clone()))
        .drift(drift)
        .policy(policy)
        .build()
}

impl Sim<'_> {
    pub(super) fn new_worker(&mut self, p: usize, concurrency: usize) -> WorkerState {
        let rng = &mut self.procs[p].rng;
        let opts = WorkOptions {
            lease: Duration::from_millis(self.plan.lease_ms),
            concurrency,
            prefetch: rng.random_range(0..=2),
            batch: rng.random_range(1..=4),
            flush_delay: Duration::from_millis(rng.random_range(0..=5)),
            // The world delivers no store announcements (only bursts
            // wake a worker), so an idle worker runs on this backstop and
            // the queue's next change by time: progress must not need
            // the announcements.
            idle_poll: Duration::from_millis(30),
            heartbeat: None,
            drain: false,
            sample: None,
            // Schedulers look at the schedules at least this often.
            schedules: (self.plan.scenario == crate::plan::Scenario::Schedules)
                .then(|| Duration::from_millis(300)),
            ..WorkOptions::default()
        };
        let canary = self.plan.canary;
        let breakage = Breakage {
            blind_claims: canary == Some(Canary::ClaimIgnoresLease),
            forget_schedules: canary == Some(Canary::SchedulerForgetsTicks),
            deaf_to_pause: canary == Some(Canary::ClaimIgnoresPause),
            blind_to_keys: canary == Some(Canary::ClaimIgnoresKeyLimit),
            forget_deadlines: canary == Some(Canary::RenewsPastDeadline),
            forget_starts: canary == Some(Canary::ClaimIgnoresRate),
            unique_live_only: false,
            forget_children: canary == Some(Canary::DependentsLeftWaiting),
            parents_look_done: false,
            careless: (canary == Some(Canary::IgnoresFencing)).then_some(self.procs[p].holder),
        };
        let store: Arc<dyn Store> = if breakage.any() {
            Arc::new(BrokenStore {
                inner: self.store.clone(),
                breakage,
            })
        } else {
            self.store.clone()
        };
        self.set_clocks(p);
        let clocks = self.procs[p].clocks.clone();
        let holder = Holder::new(self.procs[p].holder);
        let client = worker_client(store, holder, &clocks, self.drift, self.policy);
        let mut session =
            Session::new(&client, &Arc::from(QUEUE), &opts).with_breakage(SessionBreakage {
                settle_by_job: canary == Some(Canary::SettleKeyedByJob),
            });
        session.machine = session.machine.with_breakage(WorkerBreakage {
            drop_outcomes: canary == Some(Canary::CompleterDropsOutcome),
        });
        WorkerState {
            session,
            client,
            drift: self.drift,
            clocks,
            handlers: Vec::new(),
            draining: false,
        }
    }

    fn worker(&mut self, p: usize) -> &mut WorkerState {
        match &mut self.procs[p].state {
            RoleState::Worker(w) => w,
            _ => unreachable!("p{p} is a worker"),
        }
    }

    pub(super) fn poll_worker(&mut self, p: usize) {
        self.set_clocks(p);
        let local = self.local(p);
        if self.healing
            && !self.worker(p).draining
            && self.producers_quiet()
            && self.plan.canary != Some(Canary::WorkerStopsClaiming)
        {
            // The heal phase: the one drain rule decides when to leave.
            let w = self.worker(p);
            w.draining = true;
            w.session.machine.set_drain(local, true);
        }
        self.worker(p).session.machine.handle_timeout(local);
        self.finish_handlers(p, local);
        self.act_worker(p);
        if self.procs[p].exited || self.violation.is_some() {
            return;
        }
        if let Err(broken) = self.worker(p).session.machine.check(local) {
            let detail = format!("p{p}'s worker machine at local {local}: {broken}");
            return self.fail(self.violation_at("invariant", detail));
        }
        let w = self.worker(p);
        let mut next = w.session.machine.poll_timeout().unwrap_or(LocalMs::MAX);
        for h in &w.handlers {
            next = next.min(h.work_end);
        }
        if next < LocalMs::MAX {
            self.wake_at_local(p, next);
        }
    }

    /// Handlers whose work is done: the effect (if the claim is valid, as
    /// its handle says), then the outcome to the machine.
    fn finish_handlers(&mut self, p: usize, local: LocalMs) {
        let forked = self.procs[p].forked_child;
        let fork_ok = !forked || self.plan.canary == Some(Canary::ForkReusesHandle);
        let w = self.worker(p);
        let (due, running) = std::mem::take(&mut w.handlers)
            .into_iter()
            .partition(|h| h.work_end <= local);
        w.handlers = running;
        for h in due {
            let (id, token) = (h.claim.job, h.claim.token);
            let valid = fork_ok && h.job.is_valid();
            if !h.fails && valid {
                let owner = self.owner(p);
                let c = self.oracle.effect(self.now, id.0, owner, token);
                self.note(Line::Note(format!(
                    "p{p} performs job {id}'s effect with token {token}"
                )));
                if let Err(v) = c {
                    return self.fail(v);
                }
            }
            if valid && !forked {
                let owner = self.owner(p);
                self.oracle.handler_reported(owner, id.0, token, !h.fails);
            }
            let result = if h.fails {
                Err("handler failed".to_owned())
            } else {
                Ok(())
            };
            self.worker(p)
                .session
                .machine
                .handler_done(local, h.claim, result);
        }
    }

    /// Do what the session asks; judge what it reports (B2).
    fn act_worker(&mut self, p: usize) {
        let observed = RefCell::new(Vec::new());
        let observe = |record: &JobRecord, outcome: JobOutcome| {
            observed.borrow_mut().push((ClaimId::of(record), outcome));
        };
        loop {
            let next = self.worker(p).session.next(&observe);
            self.judge_reports(p, observed.take());
            let Some(next) = next else { return };
            let local = self.local(p);
            match next {
                Next::Send(WorkerRequest::Claim { .. })
                    if self.healing && self.plan.canary == Some(Canary::WorkerStopsClaiming) =>
                {
                    // Broken on purpose: alive, renewing, settling, but the
                    // claim is never sent (and so never answered).
                    self.wake_in(p, 10);
                }
                Next::Send(request) => self.send_worker_request(p, request),
                Next::Start(job) => self.start_handler(p, local, job),
                Next::Stop(claim, why) => self.stop_handler(p, local, claim, why),
                Next::End(Ok(_)) if self.healing && !self.queue_finished() => {
                    // Drained, but jobs delayed before their first attempt
                    // remain (the drain rule does not wait for them): like a
                    // cron job running `queue work --drain`, start again.
                    let concurrency = match self.plan.procs.get(p).map(|s| s.role) {
                        Some(crate::plan::Role::Worker { batch }) => batch,
                        _ => 1,
                    };
                    let mut fresh = self.new_worker(p, concurrency);
                    fresh.draining = true;
                    fresh.session.machine.set_drain(local, true);
                    *self.worker(p) = fresh;
                    self.wake_in(p, 20);
                    return;
                }
                Next::End(_) => {
                    self.exit(p);
                    return;
                }
            }
            if self.violation.is_some() {
                return;
            }
        }
    }

    /// B2: what the session reported to `observe` (a forked child's
    /// reports are its own business).
    fn judge_reports(&mut self, p: usize, reports: Vec<(ClaimId, JobOutcome)>) {
        if self.procs[p].forked_child {
            return;
        }
        let (t, owner) = (self.now, self.owner(p));
        for (claim, outcome) in reports {
            let c = self
                .oracle
                .outcome_reported(t, owner, claim.job.0, claim.token);
            self.note(Line::Note(format!(
                "p{p}.{} reports {claim}: {outcome:?}",
                owner.1
            )));
            self.check(c);
        }
    }

    /// Send what the session asks; B1 judges each settle as it leaves, B2
    /// that nothing is sent for a claim already reported.
    fn send_worker_request(&mut self, p: usize, request: WorkerRequest) {
        if !self.procs[p].forked_child {
            // B1 judges what the client sends, when it sends it (a forked
            // child's sends are L5's business).
            let (t, owner) = (self.now, self.owner(p));
            let claims: Vec<(u64, u64, Option<bool>)> = match &request {
                WorkerRequest::Settle { settles } => settles
                    .iter()
                    .map(|(id, token, settle)| {
                        let verdict = match settle {
                            Settle::Complete | Settle::CompleteWith(_) => Some(true),
                            // The loop's own verdict on a job whose run-time
                            // limit passed before a handler took it: no
                            // handler ran, so none reported (B1 spares it).
                            Settle::Fail(r) if r.starts_with(NEVER_STARTED) => None,
                            Settle::Fail(_) => Some(false),
                            Settle::Abandon { .. } => None,
                        };
                        (id.0, *token, verdict)
                    })
                    .collect(),
                WorkerRequest::Heartbeat { claims } => claims
                    .iter()
                    .map(|(id, token)| (id.0, *token, None))
                    .collect(),
                _ => Vec::new(),
            };
            let settling = matches!(request, WorkerRequest::Settle { .. });
            for (job, token, verdict) in claims {
                let c = self.oracle.sent_for_claim(t, owner, job, token);
                self.check(c);
                if settling {
                    let c = self.oracle.settle_sent(t, owner, job, token, verdict);
                    self.check(c);
                }
            }
        }
        let exec: Exec = self.worker(p).session.exec().clone();
        self.send(p, Req::Worker { exec, request });
    }

    /// A handler starts: it runs a random time and fails by chance.
    fn start_handler(&mut self, p: usize, local: LocalMs, job: Arc<ClaimedJob>) {
        let gen = self.procs[p].gen;
        let claim = ClaimId::of(job.record());
        self.note(Line::Note(format!(
            "p{p}.{gen} worker session starts {claim}"
        )));
        // One handler in ten is slow: it runs past its claim's lease, so
        // a renewal that fails meanwhile loses the claim while it runs.
        let work_max = self.plan.work_max_ms.max(1);
        let lease = self.plan.lease_ms;
        let rng = &mut self.procs[p].rng;
        let work_ms = if rng.random_bool(0.1) {
            rng.random_range(lease..=4 * lease)
        } else {
            rng.random_range(1..=work_max)
        };
        let handler = Handler {
            claim,
            job,
            work_end: local + work_ms,
            fails: rng.random_range(0..1_000_000) < self.plan.fail_ppm,
        };
        self.worker(p).handlers.push(handler);
    }

    /// The session stops a handler: a cancelled one reports failure at
    /// once (its handle says cancel requested); one stopped for a loss or
    /// a shutdown runs on and reports late. One stopped at its run-time
    /// limit runs on too, but its loop has reported the failure for it
    /// (B1 counts that report as the handler's).
    fn stop_handler(&mut self, p: usize, local: LocalMs, claim: ClaimId, why: StopWhy) {
        let gen = self.procs[p].gen;
        if why == StopWhy::TimedOut && !self.procs[p].forked_child {
            let owner = self.owner(p);
            self.oracle
                .handler_reported(owner, claim.job.0, claim.token, false);
        }
        let w = self.worker(p);
        let at = w.handlers.iter().position(|h| h.claim == claim);
        let cancelled = at.is_some_and(|i| w.handlers[i].job.cancel_requested());
        self.note(Line::Note(format!(
            "p{p}.{gen} worker session stops {claim}{}",
            if cancelled { ": cancelled" } else { "" }
        )));
        let Some(i) = at.filter(|_| cancelled) else {
            return;
        };
        self.worker(p).handlers.remove(i);
        let owner = self.owner(p);
        if !self.procs[p].forked_child {
            self.oracle
                .handler_reported(owner, claim.job.0, claim.token, false);
        }
        self.worker(p)
            .session
            .machine
            .handler_done(local, claim, Err("cancelled".into()));
    }

    pub(super) fn worker_reply(&mut self, p: usize, req: Req, rep: Rep) {
        let Req::Worker { request, .. } = req else {
            return;
        };
        let reply = match rep {
            Rep::Done(Answer::Worker(reply)) => reply,
            other => request.failed(error_of(&other)),
        };
        self.set_clocks(p);
        self.worker(p).session.reply(reply);
    }
}
