//! Producers push jobs; workers run the real [`WorkerMachine`]: it decides
//! what to claim and when, which handler to start, when to renew, how
//! outcomes are batched, when the queue is drained. Around it the world
//! plays the handlers: each takes a random time, performs the job's side
//! effect at its end if the machine says the claim is still valid (L3 for
//! jobs, checked by the oracle), and reports success or failure.

use super::msg::{error_of, Answer, Line, Rep, Req};
use super::{RoleState, Sim};
use crate::plan::Canary;
use leasehold::client::machine::{
    StopWhy, WorkerAction, WorkerBreakage, WorkerConfig, WorkerMachine, WorkerReply, WorkerRequest,
};
use leasehold::core::job::Settle;
use leasehold::{JobId, JobRecord, JobSpec, StoreExt};
use rand::Rng;
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
struct Handler {
    work_end: u64,
    fails: bool,
}

#[derive(Debug, Clone)]
pub(super) struct WorkerState {
    machine: WorkerMachine,
    /// Running handlers by job and claim token. A handler the machine
    /// stopped for a loss or a shutdown runs on to its end and reports
    /// late, as a handler thread that cannot be interrupted does (by then
    /// the job may be claimed again, by this worker too).
    handlers: BTreeMap<(JobId, u64), Handler>,
    draining: bool,
}

impl WorkerState {
    /// A burst: claim now, whatever the idle backoff says.
    pub(super) fn wake_machine(&mut self, local: u64) {
        self.machine.wake(local);
    }
}

impl Sim<'_> {
    pub(super) fn new_worker(&mut self, p: usize, concurrency: usize) -> WorkerState {
        let rng = &mut self.procs[p].rng;
        let cfg = WorkerConfig {
            lease_ms: self.plan.lease_ms,
            concurrency,
            prefetch: rng.random_range(0..=2),
            batch_max: rng.random_range(1..=4),
            flush_delay_ms: rng.random_range(0..=5),
            idle_max_ms: 30,
            heartbeat_ms: 0,
            drain: false,
            drift: self.drift,
            seed: rng.random(),
            sample_ms: 0,
            // Schedulers look at the schedules at least this often.
            fire_ms: if self.plan.scenario == crate::plan::Scenario::Schedules {
                300
            } else {
                0
            },
        };
        let breakage = WorkerBreakage {
            drop_outcomes: self.plan.canary == Some(Canary::CompleterDropsOutcome),
        };
        let local = self.procs[p].clock.read(self.now);
        WorkerState {
            machine: WorkerMachine::new(cfg, local).with_breakage(breakage),
            handlers: BTreeMap::new(),
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
        let local = self.local(p);
        if self.healing
            && !self.worker(p).draining
            && self.producers_quiet()
            && self.plan.canary != Some(Canary::WorkerStopsClaiming)
        {
            // The heal phase: the one drain rule decides when to leave.
            let w = self.worker(p);
            w.draining = true;
            w.machine.set_drain(local, true);
        }
        self.worker(p).machine.handle_timeout(local);
        self.finish_handlers(p, local);
        self.act_worker(p);
        if self.procs[p].exited {
            return;
        }
        let w = self.worker(p);
        let mut next = w.machine.poll_timeout().unwrap_or(u64::MAX);
        for h in w.handlers.values() {
            next = next.min(h.work_end);
        }
        if next < u64::MAX {
            self.wake_at_local(p, next);
        }
    }

    /// Handlers whose work is done: the effect (if the claim is valid, as
    /// the real handle says), then the outcome to the machine.
    fn finish_handlers(&mut self, p: usize, local: u64) {
        let forked = self.procs[p].forked_child;
        let fork_ok = !forked || self.plan.canary == Some(Canary::ForkReusesHandle);
        let due: Vec<((JobId, u64), Handler)> = self
            .worker(p)
            .handlers
            .iter()
            .filter(|(_, h)| h.work_end <= local)
            .map(|(k, h)| (*k, h.clone()))
            .collect();
        for ((id, token), h) in due {
            self.worker(p).handlers.remove(&(id, token));
            let valid = fork_ok && self.worker(p).machine.is_valid(id, token, local);
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
                .machine
                .handler_done(local, id, token, result);
        }
    }

    /// Do what the machine asks.
    fn act_worker(&mut self, p: usize) {
        while let Some(action) = self.worker(p).machine.poll_action() {
            let local = self.local(p);
            match action {
                WorkerAction::Send(WorkerRequest::Claim { .. })
                    if self.healing && self.plan.canary == Some(Canary::WorkerStopsClaiming) =>
                {
                    // Broken on purpose: alive, renewing, settling, but the
                    // claim is never sent (and so never answered).
                    self.wake_in(p, 10);
                }
                WorkerAction::Send(request) => self.send_worker_request(p, request),
                WorkerAction::Start(record) => self.start_handler(p, local, &record),
                WorkerAction::Stop { id, why } => self.stop_handler(p, local, id, why),
                WorkerAction::Renewed { .. }
                | WorkerAction::Settled { .. }
                | WorkerAction::Sampled(_) => {}
                WorkerAction::Finished if self.healing && !self.queue_finished() => {
                    // Drained, but jobs delayed before their first attempt
                    // remain (the drain rule does not wait for them): like a
                    // cron job running `queue work --drain`, start again.
                    let concurrency = match self.plan.procs.get(p).map(|s| s.role) {
                        Some(crate::plan::Role::Worker { batch }) => batch,
                        _ => 1,
                    };
                    let mut fresh = self.new_worker(p, concurrency);
                    fresh.draining = true;
                    fresh.machine.set_drain(local, true);
                    *self.worker(p) = fresh;
                    self.wake_in(p, 20);
                    return;
                }
                WorkerAction::Finished | WorkerAction::Failed(_) => {
                    self.exit(p);
                    return;
                }
            }
        }
    }

    /// Send what the machine asks; B1 judges each settle as it leaves.
    fn send_worker_request(&mut self, p: usize, request: WorkerRequest) {
        let forked = self.procs[p].forked_child;
        if let (WorkerRequest::Settle { settles }, false) = (&request, forked) {
            // B1 judges what the client sends, when it sends it (a forked
            // child's sends are L5's business).
            let (t, owner) = (self.now, self.owner(p));
            for (id, token, settle) in settles {
                let verdict = match settle {
                    Settle::Complete | Settle::CompleteWith(_) => Some(true),
                    Settle::Fail(_) => Some(false),
                    Settle::Abandon { .. } => None,
                };
                let c = self.oracle.settle_sent(t, owner, id.0, *token, verdict);
                self.check(c);
            }
        }
        let req = match request {
            WorkerRequest::Claim { max } => Req::Claim { n: max },
            WorkerRequest::Heartbeat { claims } => Req::Heartbeats(claims),
            WorkerRequest::Settle { settles } => Req::Settles(settles),
            WorkerRequest::DrainCheck => Req::Drained,
            // Simulated workers never sample (`sample_ms` is 0).
            WorkerRequest::Sample => return,
            WorkerRequest::Fire => Req::Fire {
                wall_ms: self.wall(p),
            },
        };
        self.send(p, req);
    }

    /// A handler starts: it runs a random time and fails by chance.
    fn start_handler(&mut self, p: usize, local: u64, record: &JobRecord) {
        let gen = self.procs[p].gen;
        let token = record.claim.map_or(0, |c| c.token);
        self.note(Line::Note(format!(
            "p{p}.{gen} worker machine starts job {} (token {token})",
            record.id
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
            work_end: local + work_ms,
            fails: rng.random_range(0..1_000_000) < self.plan.fail_ppm,
        };
        self.worker(p).handlers.insert((record.id, token), handler);
    }

    /// The machine stops a handler: a cancelled one reports failure at
    /// once; one stopped for a loss or a shutdown runs on and reports late.
    fn stop_handler(&mut self, p: usize, local: u64, id: JobId, why: StopWhy) {
        let gen = self.procs[p].gen;
        self.note(Line::Note(format!(
            "p{p}.{gen} worker machine stops job {id}: {why:?}"
        )));
        if why != StopWhy::Cancelled {
            return;
        }
        let running = self
            .worker(p)
            .handlers
            .keys()
            .rev()
            .find(|(j, _)| *j == id)
            .copied();
        if let Some((_, token)) = running {
            self.worker(p).handlers.remove(&(id, token));
            let owner = self.owner(p);
            if !self.procs[p].forked_child {
                self.oracle.handler_reported(owner, id.0, token, false);
            }
            self.worker(p)
                .machine
                .handler_done(local, id, token, Err("cancelled".into()));
        }
    }

    pub(super) fn worker_reply(&mut self, p: usize, req: Req, rep: Rep) {
        let local = self.local(p);
        let reply = match (&req, rep) {
            (Req::Claim { .. }, Rep::Done(Answer::Jobs(r))) => WorkerReply::Claimed(r),
            (Req::Claim { .. }, rep) => WorkerReply::Claimed(Err(error_of(&rep))),
            (Req::Heartbeats(_), Rep::Done(Answer::Heartbeats(r))) => WorkerReply::Heartbeated(r),
            (Req::Heartbeats(_), rep) => WorkerReply::Heartbeated(Err(error_of(&rep))),
            (Req::Settles(_), Rep::Done(Answer::States(r))) => WorkerReply::Settled(r),
            (Req::Settles(_), rep) => WorkerReply::Settled(Err(error_of(&rep))),
            (Req::Drained, Rep::Done(Answer::Bool(r))) => WorkerReply::Drained(r),
            (Req::Drained, rep) => WorkerReply::Drained(Err(error_of(&rep))),
            (Req::Fire { wall_ms }, Rep::Done(Answer::Fired(r))) => {
                let wall_ms = *wall_ms;
                WorkerReply::Fired(r.map(|f| leasehold::client::machine::FireReport {
                    enqueued: f.enqueued.iter().filter(|e| e.3).count(),
                    next_in_ms: f.next_ms.map(|n| n.saturating_sub(wall_ms)),
                }))
            }
            (Req::Fire { .. }, rep) => WorkerReply::Fired(Err(error_of(&rep))),
            _ => return,
        };
        self.worker(p).machine.handle_reply(local, reply);
    }

    // ------------------------------------------------------------ producers

    pub(super) fn poll_producer(&mut self, p: usize) {
        let local = self.local(p);
        let RoleState::Producer { left, next_local } = self.procs[p].state else {
            return;
        };
        if left == 0 || self.healing || self.procs[p].forked_child {
            self.exit(p);
        } else if !self.procs[p].inflight.is_empty() {
            // One push at a time; the reply wakes it.
        } else if local >= next_local {
            let spec = self.random_spec(p);
            self.send(p, Req::Push(Box::new(spec)));
        } else {
            self.wake_at_local(p, next_local);
        }
    }

    pub(super) fn producer_reply(&mut self, p: usize, rep: Rep) {
        let local = self.local(p);
        let wait = self.procs[p].rng.random_range(0..=20);
        if let RoleState::Producer { left, next_local } = &mut self.procs[p].state {
            if matches!(rep, Rep::Done(Answer::Enqueued(Ok(_)))) {
                *left = left.saturating_sub(1);
            }
            *next_local = local + wait;
        }
    }

    fn random_spec(&mut self, p: usize) -> JobSpec {
        let rng = &mut self.procs[p].rng;
        JobSpec {
            priority: rng.random_range(-1..=2),
            delay_ms: if rng.random_bool(0.3) {
                rng.random_range(1..=200)
            } else {
                0
            },
            max_attempts: self.plan.max_attempts,
            unique_key: rng
                .random_bool(0.1)
                .then(|| format!("u{}", rng.random_range(0..3))),
            ..JobSpec::new(vec![rng.random::<u8>()])
        }
    }

    /// Whether every job of the queue is done, dead or cancelled (the
    /// world's own look at the store, not a process's).
    fn queue_finished(&mut self) -> bool {
        let policy = self.policy;
        self.clock.set(self.now);
        match self
            .store
            .txn(|tx| leasehold::core::job::stats(tx, super::QUEUE, &policy))
        {
            Ok(c) => {
                use leasehold::JobState::{Ready, Running, Scheduled};
                c.get(Ready) + c.get(Scheduled) + c.get(Running) == 0
            }
            Err(_) => false,
        }
    }

    /// Every producer has stopped and none of its pushes is still in the
    /// network (a worker that left earlier would strand them).
    pub(super) fn producers_quiet(&self) -> bool {
        let in_flight_bound = super::T0 + self.plan.duration_ms + 2 * self.plan.latency_ms.1 + 1;
        self.now >= in_flight_bound
            && self
                .procs
                .iter()
                .all(|pr| !matches!(pr.state, RoleState::Producer { .. }) || pr.exited || !pr.alive)
    }
}
