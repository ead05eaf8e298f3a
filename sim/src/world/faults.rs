//! Faults (kill, pause, fork, burst, clock steps, boundary probes, store
//! stalls, latency spikes, the queue paused or limited), the
//! heal phase, and the checks at the end of a run: every key acquirable
//! (L4), every job finished and the counts agreeing with the model (Q3),
//! every handler's outcome sent (B1).

use super::msg::{Ev, Line, Req};
use super::{key_name, RoleState, Sim, QUEUE, T0};
use crate::oracle::Violation;
use crate::plan::{Fault, Role};
use leasehold::client::machine::WorkerRequest;
use leasehold::client::sim::Exec;
use leasehold::core;
use leasehold::{Holder, HolderId, JobId, JobState, StoreExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

impl Sim<'_> {
    pub(super) fn fault(&mut self, fault: Fault) {
        self.note(Line::Fault(fault.to_string()));
        match fault {
            Fault::Kill {
                proc,
                restart_after_ms,
            } => self.kill(proc, restart_after_ms),
            Fault::Pause { proc, for_ms } => {
                let now = self.now;
                let pr = &mut self.procs[proc];
                if !pr.alive || pr.exited || pr.paused_until.is_some() {
                    return;
                }
                pr.paused_until = Some(now + for_ms);
                pr.pause_id += 1;
                let pause = pr.pause_id;
                self.push(now + for_ms, Ev::Resume { p: proc, pause });
            }
            Fault::Fork { proc } => self.fork(proc),
            Fault::Burst => self.burst(),
            Fault::ClockStep { proc, delta_ms } => {
                self.procs[proc].clock.step_ms += delta_ms;
            }
            Fault::Boundary => self.probe_boundary(),
            Fault::Stall { proc, for_ms } => {
                let until = self.now + for_ms;
                let pr = &mut self.procs[proc];
                pr.stalled_until = pr.stalled_until.max(until);
            }
            Fault::Slow {
                proc,
                for_ms,
                extra_ms,
            } => self.procs[proc].slow = (self.now + for_ms, extra_ms),
            Fault::TornWrite { proc, at_byte } => self.torn_write(proc, at_byte),
            Fault::PauseQueue => self.pause_queue(true),
            Fault::ResumeQueue => self.pause_queue(false),
            Fault::SetLimits {
                concurrency,
                per_key,
                rate,
                per_key_rate,
            } => self.limit_queue(
                leasehold::Limits::none()
                    .with_concurrency(concurrency)
                    .with_per_key(per_key)
                    .with_rate(rate)
                    .with_per_key_rate(per_key_rate),
            ),
        }
    }

    /// Process `proc` dies writing a renewal of a lease it holds, its slot
    /// torn after `at_byte` bytes (on the file store; elsewhere nothing
    /// happens). Nothing of the renewal may count: the model is not
    /// stepped, and whatever reads the record next is judged as ever.
    fn torn_write(&mut self, proc: usize, at_byte: usize) {
        let owner = self.owner(proc);
        let pr = &self.procs[proc];
        if !pr.alive || pr.exited || pr.paused_until.is_some() || pr.forked_child {
            return;
        }
        if !self.store.describe().starts_with("file:") {
            self.note(Line::Note(
                "torn write: not a file store, nothing torn".into(),
            ));
            return;
        }
        let Some((key, token)) = self.oracle.live_grant_of(owner, self.now) else {
            return;
        };
        self.clock.set(self.now);
        let holder = self.procs[proc].holder;
        let ttl = self.plan.ttl_ms;
        leasehold::store::file::torn::arm(at_byte);
        let r = self
            .store
            .txn(|tx| core::lease::renew(tx, &key_name(key), holder, token, ttl));
        let torn = !leasehold::store::file::torn::disarm();
        self.note(Line::Note(format!(
            "p{proc} renewal of key-{key} token {token} torn after {at_byte} bytes: {}",
            match &r {
                Ok(_) => "written whole".to_owned(),
                Err(e) => e.to_string(),
            }
        )));
        if torn {
            self.kill(proc, self.plan.ttl_ms);
        }
    }

    /// An operator pauses or resumes the queue, beside the model; the
    /// oracle holds every claim meanwhile to F2.
    pub(super) fn pause_queue(&mut self, paused: bool) {
        self.clock.set(self.now);
        let got = self
            .store
            .txn(|tx| core::job::set_paused(tx, QUEUE, paused));
        let expect = self.oracle.model.set_paused(QUEUE, paused);
        let got = crate::model::Outcome::of(&got, |&b| crate::model::Outcome::Bool(b));
        let what = if paused { "pause" } else { "resume" };
        let c = self.oracle.compare(self.now, what, &expect, &got);
        self.check(c);
        self.oracle.queue_paused(paused);
    }

    /// An operator replaces the queue's limits, beside the model; the
    /// oracle holds every claim from now on to F1.
    fn limit_queue(&mut self, limits: leasehold::Limits) {
        self.clock.set(self.now);
        let got = self
            .store
            .txn(|tx| core::job::set_limits(tx, QUEUE, limits));
        let expect = self.oracle.model.set_limits(QUEUE, limits);
        let got = crate::model::Outcome::of(&got, |&b| crate::model::Outcome::Bool(b));
        let c = self.oracle.compare(self.now, "limit", &expect, &got);
        self.check(c);
        self.oracle.queue_limited(limits);
    }

    pub(super) fn kill(&mut self, proc: usize, restart_after_ms: u64) {
        let owner = self.owner(proc);
        let pr = &mut self.procs[proc];
        if !pr.alive || pr.exited {
            return;
        }
        pr.alive = false;
        pr.gen += 1;
        pr.inflight.clear();
        pr.deferred.clear();
        pr.paused_until = None;
        // What it had in memory (unsent outcomes) dies with it.
        self.oracle.forget(owner);
        self.push(self.now + restart_after_ms, Ev::Restart { p: proc });
    }

    fn fork(&mut self, proc: usize) {
        let parent = self.procs[proc].clone();
        if !parent.alive || parent.exited || parent.paused_until.is_some() {
            return;
        }
        let mut child = parent;
        child.forked_child = true;
        child.inflight.clear();
        child.deferred.clear();
        child.clocks = match &child.state {
            // Its copy of the session reads its own copies of the clocks.
            RoleState::Worker(w) => w.clocks().clone(),
            _ => super::worker::ProcClocks::new(),
        };
        let child_idx = self.procs.len();
        // The child keeps the parent's handles (same owner in the oracle's
        // eyes is exactly what must never act).
        child.rng = StdRng::seed_from_u64(self.plan.seed ^ 0xF0F0 ^ child_idx as u64);
        self.procs.push(child);
        self.note(Line::Note(format!("p{proc} forked into p{child_idx}")));
        self.wake_in(child_idx, 0);
    }

    /// Every idle worker and holder issues its next request so that it
    /// lands at one instant.
    fn burst(&mut self) {
        let at = self.now + self.plan.latency_ms.0;
        for p in 0..self.procs.len() {
            let pr = &self.procs[p];
            if !pr.alive || pr.exited || pr.paused_until.is_some() {
                continue;
            }
            let local = self.local(p);
            match &mut self.procs[p].state {
                RoleState::Worker(w) => w.wake_machine(local),
                RoleState::Holder(h) if h.idle() => h.acquire_now(),
                RoleState::Campaigner(_) => self.campaign_now(p),
                _ => continue,
            }
            self.procs[p].burst_at = Some(at);
            self.poll(p);
            self.procs[p].burst_at = None;
        }
    }

    /// Land operations exactly at one ms before, at, and one ms after the
    /// next expiry in the store.
    fn probe_boundary(&mut self) {
        self.prober_gen += 1;
        let prober = self.procs.len() - 1;
        let policy = self.policy;
        self.clock.set(self.now);
        let mut target: Option<(u64, Req)> = None;
        for key in 0..self.plan.keys.len() {
            let name = key_name(key);
            if let Ok(info) = self.store.txn(|tx| core::lease::inspect(tx, &name)) {
                if let Some(h) = info.holders.iter().min_by_key(|h| h.expires_at_ms) {
                    if target.as_ref().is_none_or(|(t, _)| h.expires_at_ms < *t) {
                        target = Some((h.expires_at_ms, Req::Acquire { key }));
                    }
                }
            }
        }
        let running = self
            .store
            .txn(|tx| core::job::list(tx, QUEUE, Some(JobState::Running), JobId(0), 100, &policy));
        if let Ok(running) = running {
            let first = running
                .iter()
                .filter_map(|j| j.claim)
                .min_by_key(|c| c.lease_until_ms);
            if let Some(c) = first {
                if target.as_ref().is_none_or(|(t, _)| c.lease_until_ms < *t) {
                    let request = WorkerRequest::Claim { max: 1 };
                    let exec = self.prober_exec();
                    target = Some((c.lease_until_ms, Req::Worker { exec, request }));
                }
            }
        }
        let Some((at, req)) = target else {
            return;
        };
        let holder = self.prober_holder();
        for t in [at.saturating_sub(1), at, at + 1] {
            if t >= self.now {
                let gen = self.procs[prober].gen;
                let ev = Ev::Arrive {
                    p: prober,
                    gen,
                    holder,
                    req: req.clone(),
                    rid: 0,
                };
                self.push(t, ev);
            }
        }
    }

    /// The prober's holder id (a new one for each probe).
    fn prober_holder(&self) -> HolderId {
        HolderId(0xB0B0_0000 + u128::from(self.prober_gen))
    }

    /// The store side of the prober's claims: a real `Exec` of a client
    /// with the next probe's holder id.
    fn prober_exec(&self) -> Exec {
        let client = leasehold::Client::builder_shared(self.store.clone())
            .holder(Holder::new(self.prober_holder()))
            .policy(self.policy)
            .build();
        Exec::new(&client, &std::sync::Arc::from(QUEUE), self.plan.lease_ms)
    }

    pub(super) fn restart(&mut self, p: usize) {
        let role = self.plan.procs.get(p).map(|s| s.role);
        let Some(role) = role else { return };
        if self.procs[p].alive {
            return;
        }
        let identity = HolderId(self.procs[p].rng.random());
        let pr = &mut self.procs[p];
        pr.alive = true;
        pr.exited = false;
        pr.holder = identity;
        pr.inflight.clear();
        self.procs[p].state = self.fresh_state(p, role);
        self.note(Line::Note(format!(
            "p{p}.{} restarts with a new identity",
            self.procs[p].gen
        )));
        self.wake_in(p, 0);
    }

    pub(super) fn resume(&mut self, p: usize) {
        let pr = &mut self.procs[p];
        if pr.paused_until.is_none() {
            return;
        }
        pr.paused_until = None;
        let deferred = std::mem::take(&mut pr.deferred);
        self.note(Line::Note(format!("p{p} resumes")));
        for ev in deferred {
            self.push(self.now, ev);
        }
        self.wake_in(p, 0);
    }

    pub(super) fn heal(&mut self) {
        self.healing = true;
        self.note(Line::Note(
            "heal: faults stop; holders finish; workers drain".into(),
        ));
        if self.oracle.model.paused.iter().any(|q| q == QUEUE) {
            self.pause_queue(false);
        }
        for p in 0..self.procs.len() {
            // Faults stop: latency spikes too.
            self.procs[p].slow = (0, 0);
            if self.procs[p].paused_until.is_some() {
                self.resume(p);
            }
            if !self.procs[p].alive && p < self.plan.procs.len() {
                self.restart(p);
            }
            self.wake_in(p, 0);
        }
        // Rates in force slow the drain (F4): the liveness check waits for
        // what they allow, no longer.
        self.heal_deadline = self.heal_deadline.max(self.now + self.job_bound());
        self.heal_wall = self.slowest_worker_wall();
        if self.plan.scenario == crate::plan::Scenario::Election {
            self.heal_election();
        }
    }

    /// Liveness after the heal phase: every key acquirable (L4) and every
    /// job finished (Q3); the model and the store agree on the counts;
    /// every handler's outcome was sent (B1).
    pub(super) fn final_checks(&mut self) {
        let long = self.plan.ttl_ms.max(self.plan.lease_ms);
        let at = self.now;
        let procs = &self.procs;
        let alive = |(p, gen): (usize, u32)| procs[p].alive && procs[p].gen == gen;
        if let Err(v) = self.oracle.unsent(at, alive) {
            return self.fail(v);
        }
        self.final_election_checks();
        if self.plan.scenario == crate::plan::Scenario::Schedules {
            self.final_tick_checks();
        }
        if self.violation.is_some() {
            return;
        }
        self.now = self.now.max(T0 + self.plan.duration_ms) + long + 1;
        self.clock.set(self.now);
        self.oracle.model.tick(self.now);
        let healer = Holder::new(HolderId(0xFEED));
        for (key, &limit) in self.plan.keys.iter().enumerate() {
            let name = key_name(key);
            let r = self
                .store
                .txn(|tx| core::lease::acquire(tx, &name, &healer, 1, limit));
            if let Err(e) = r {
                let detail = format!("{name} not acquirable after the heal phase: {e}");
                return self.fail(self.violation_at("L4", detail));
            }
        }
        let has_jobs = self
            .plan
            .procs
            .iter()
            .any(|p| matches!(p.role, Role::Producer { .. } | Role::Worker { .. }));
        if has_jobs {
            self.final_job_checks();
        }
    }

    pub(super) fn violation_at(&self, guarantee: &'static str, detail: String) -> Violation {
        Violation {
            guarantee,
            detail,
            at_ms: self.now,
        }
    }

    fn final_job_checks(&mut self) {
        let policy = self.policy;
        let counts = match self.store.txn(|tx| core::job::stats(tx, QUEUE, &policy)) {
            Ok(c) => c,
            Err(e) => return self.fail(self.violation_at("S1", format!("stats failed: {e}"))),
        };
        let model = self.oracle.model.counts(QUEUE);
        if counts.0 != model {
            let detail = format!(
                "store counts {:?} differ from the model's {model:?}",
                counts.0
            );
            return self.fail(self.violation_at("Q3", detail));
        }
        let unfinished = counts.get(JobState::Ready)
            + counts.get(JobState::Scheduled)
            + counts.get(JobState::Running)
            + counts.get(JobState::Waiting);
        if unfinished > 0 {
            let detail = format!(
                "{unfinished} jobs not done, dead or cancelled after the heal phase ({counts:?})"
            );
            self.fail(self.violation_at("Q3", detail));
        }
    }
}
