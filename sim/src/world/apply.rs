//! The store side: a request arrives, the store applies it (a lease
//! request through the real core; a worker's through the real `Exec` of
//! the session that sent it), or fails it transiently, or loses the reply
//! after commit; the reference model is stepped in lockstep, and the
//! oracle records what was granted, claimed, renewed and settled.

use super::msg::{Answer, Ev, Line, Rep, Req};
use super::{key_name, Sim, QUEUE};
use crate::model::Outcome;
use crate::oracle::Owner;
use crate::plan::Canary;
use leasehold::client::machine::{WorkerReply, WorkerRequest};
use leasehold::client::sim::Exec;
use leasehold::core::{self, job::Settle};
use leasehold::{Holder, HolderId, JobId, Store, StoreExt};
use rand::Rng;
use std::sync::Arc;

/// The model's normalized view of an answer (what the oracle compares and
/// the trace shows).
pub(super) fn outcome_of(answer: &Answer) -> Outcome {
    match answer {
        Answer::Grant(r) => Outcome::of(r, Outcome::grant),
        Answer::Unit(r) => Outcome::of(r, |()| Outcome::Ok),
        Answer::Enqueued(r) => Outcome::of(r, |o| Outcome::Enqueued {
            id: o.id.0,
            created: o.created,
        }),
        Answer::Worker(reply) => worker_outcome(reply),
    }
}

fn worker_outcome(reply: &WorkerReply) -> Outcome {
    let batch = |all: Vec<Outcome>| Outcome::Batch(all);
    match reply {
        WorkerReply::Claimed(r) => Outcome::of(r, |jobs| Outcome::claimed(jobs)),
        WorkerReply::Idle { .. } => Outcome::claimed(&[]),
        WorkerReply::Heartbeated(r) => Outcome::of(r, |all| {
            batch(
                all.iter()
                    .map(|r| Outcome::of(r, Outcome::heartbeat))
                    .collect(),
            )
        }),
        WorkerReply::Settled(r) => Outcome::of(r, |all| {
            batch(
                all.iter()
                    .map(|r| Outcome::of(r, |s| Outcome::State(*s)))
                    .collect(),
            )
        }),
        WorkerReply::Drained(r) => Outcome::of(r, |b| Outcome::Bool(*b)),
        WorkerReply::Fired(r) => Outcome::of(r, |f| {
            batch(
                f.jobs
                    .iter()
                    .map(|e| Outcome::Enqueued {
                        id: e.2 .0,
                        created: e.3,
                    })
                    .collect(),
            )
        }),
        WorkerReply::Sampled(r) => Outcome::of(r, |_| Outcome::Ok),
    }
}

impl Sim<'_> {
    /// A request arrives at the store (`rid` 0: nobody waits for a reply).
    pub(super) fn arrive(&mut self, p: usize, gen: u32, holder: HolderId, req: Req, rid: u64) {
        let healing = self.healing;
        // A stall: the rows the process's renewals and settles write are
        // locked elsewhere (claims, skipping locked rows, go on).
        let stalled = self.procs[p].stalled_until > self.now
            && matches!(
                &req,
                Req::Worker {
                    request: WorkerRequest::Heartbeat { .. } | WorkerRequest::Settle { .. },
                    ..
                }
            );
        let ppm = self.plan.transient_ppm;
        let drawn = (!stalled && !healing && ppm > 0).then(|| self.net.random_range(0..1_000_000));
        if stalled || drawn.is_some_and(|d| d < ppm) {
            // A quarter of the store's failures lose the commit and its
            // reply both (the connection dropped during COMMIT and the
            // server rolled back): the client cannot tell it from a commit
            // whose reply was lost.
            let (what, rep) = if drawn.is_some_and(|d| d < ppm / 4) {
                ("commit lost (nothing applied, reply lost)", Rep::Unknown)
            } else {
                ("transient error (nothing applied)", Rep::Transient)
            };
            self.note(Line::Apply(p, gen, req.to_string(), what.to_owned()));
            self.reply_later(p, gen, rid, rep);
            return;
        }
        self.clock.set(self.now);
        self.set_clocks(p);
        self.oracle.model.tick(self.now);
        let answer = self.apply((p, gen), holder, &req);
        let shown = format!("{:?}", outcome_of(&answer));
        self.note(Line::Apply(p, gen, req.to_string(), shown));
        if self.violation.is_some() {
            return;
        }
        let lost_reply = !healing
            && self.plan.ambiguous_ppm > 0
            && self.net.random_range(0..1_000_000) < self.plan.ambiguous_ppm;
        let rep = if lost_reply {
            Rep::Unknown
        } else {
            Rep::Done(answer)
        };
        self.reply_later(p, gen, rid, rep);
    }

    fn reply_later(&mut self, p: usize, gen: u32, rid: u64, rep: Rep) {
        if rid != 0 {
            let at = self.now + self.latency(p);
            self.push(at, Ev::Reply { p, gen, rid, rep });
        }
    }

    /// Apply `req` on the store and on the model, record it in the oracle,
    /// and compare the two outcomes.
    fn apply(&mut self, owner: Owner, holder: HolderId, req: &Req) -> Answer {
        let t = self.now;
        let (answer, expect, what) = match req {
            Req::Acquire { key } => self.apply_acquire(owner, holder, *key),
            Req::Renew { key, token } => self.apply_renew(owner, holder, *key, *token),
            Req::Release { key, token } => self.apply_release(owner, holder, *key, *token),
            Req::Push(spec) => {
                let policy = self.policy;
                let breakage = super::stores::Breakage {
                    unique_live_only: self.plan.canary == Some(Canary::UniqueForgetsFinished),
                    parents_look_done: self.plan.canary == Some(Canary::DependentReadyTooSoon),
                    ..Default::default()
                };
                let store: Arc<dyn Store> = match breakage.any() {
                    true => Arc::new(super::stores::BrokenStore {
                        inner: self.store.clone(),
                        breakage,
                    }),
                    false => self.store.clone(),
                };
                let r = store.txn(|tx| core::job::enqueue(tx, QUEUE, spec, &policy));
                let expect = self.oracle.model.enqueue(QUEUE, spec);
                (Answer::Enqueued(r), expect, "push".to_owned())
            }
            Req::Worker { exec, request } => self.apply_worker(owner, holder, exec, request),
        };
        if self.violation.is_none() {
            let c = self.oracle.compare(t, &what, &expect, &outcome_of(&answer));
            self.check(c);
        }
        if self.violation.is_none() {
            let c = self.released_in_store(t);
            self.check(c);
        }
        answer
    }

    /// D2: no job the model just decided is still waiting in the store
    /// while every job it names has ended there too (read raw: no rule
    /// runs, nothing is brought up to date or written, so the run goes on
    /// as it would without the look).
    fn released_in_store(&mut self, t: u64) -> Result<(), crate::oracle::Violation> {
        use leasehold::{JobId, JobState};
        for id in std::mem::take(&mut self.oracle.model.released) {
            let stuck = self.store.txn(|tx| {
                let tx = tx.jobs()?;
                let Some(job) = tx.job(JobId(id))? else {
                    return Ok(None);
                };
                if job.state != JobState::Waiting {
                    return Ok(None);
                }
                for &p in job.after.iter().flat_map(|a| a.iter()) {
                    if tx.job(p)?.is_some_and(|p| !p.state.is_terminal()) {
                        return Ok(None);
                    }
                }
                Ok(Some(job))
            });
            if let Ok(Some(job)) = stuck {
                let expect = self.oracle.model.job(id).map(|j| j.state);
                return Err(crate::oracle::Violation {
                    guarantee: "D2",
                    detail: format!(
                        "job {id} is still waiting though {:?} it runs after all ended (the model says {expect:?})",
                        job.after
                    ),
                    at_ms: t,
                });
            }
        }
        Ok(())
    }

    /// Under the fencing canary the store swaps in the current holder and
    /// token of a key, as a store that ignored them would behave.
    fn lease_swap(&self, key: usize, holder: HolderId, token: u64) -> (HolderId, u64) {
        if self.plan.canary != Some(Canary::IgnoresFencing) {
            return (holder, token);
        }
        let info = self
            .store
            .txn(|tx| core::lease::inspect(tx, &key_name(key)))
            .ok();
        match info.and_then(|i| i.holders.first().cloned()) {
            Some(hi) => (hi.holder.id, hi.token),
            None => (holder, token),
        }
    }

    /// The same for a job's current claim.
    fn job_swap(&self, job: JobId, holder: HolderId, token: u64) -> (HolderId, u64) {
        if self.plan.canary != Some(Canary::IgnoresFencing) {
            return (holder, token);
        }
        let policy = self.policy;
        let rec = self.store.txn(|tx| core::job::get(tx, job, &policy)).ok();
        match rec.and_then(|r| r.claim) {
            Some(c) => (c.holder, c.token),
            None => (holder, token),
        }
    }

    fn apply_acquire(
        &mut self,
        owner: Owner,
        holder: HolderId,
        key: usize,
    ) -> (Answer, Outcome, String) {
        let name = key_name(key);
        let limit = self.plan.keys[key];
        let (ttl, t) = (self.plan.ttl_ms, self.now);
        let h = Holder::new(holder);
        let r = self
            .store
            .txn(|tx| core::lease::acquire(tx, &name, &h, ttl, limit));
        let expect = self.oracle.model.acquire(&name, holder.0, ttl, limit);
        if let Ok(g) = &r {
            let c = self
                .oracle
                .grant(t, key, owner, g.token, g.expires_at_ms, g.renewed);
            self.check(c);
            if !g.renewed {
                self.election_granted(key);
            }
        }
        (Answer::Grant(r), expect, format!("acquire {name}"))
    }

    fn apply_renew(
        &mut self,
        owner: Owner,
        holder: HolderId,
        key: usize,
        token: u64,
    ) -> (Answer, Outcome, String) {
        let name = key_name(key);
        let (ttl, t) = (self.plan.ttl_ms, self.now);
        let (h, tok) = self.lease_swap(key, holder, token);
        let r = self
            .store
            .txn(|tx| core::lease::renew(tx, &name, h, tok, ttl));
        let expect = self.oracle.model.renew(&name, h.0, tok, ttl);
        if let Ok(g) = &r {
            let c = self.oracle.renewed(t, key, owner, token, g.expires_at_ms);
            self.check(c);
        }
        (Answer::Grant(r), expect, format!("renew {name}"))
    }

    fn apply_release(
        &mut self,
        owner: Owner,
        holder: HolderId,
        key: usize,
        token: u64,
    ) -> (Answer, Outcome, String) {
        let name = key_name(key);
        let t = self.now;
        let (h, tok) = self.lease_swap(key, holder, token);
        let r = self.store.txn(|tx| core::lease::release(tx, &name, h, tok));
        let expect = self.oracle.model.release(&name, h.0, tok);
        if r.is_ok() {
            let c = self.oracle.released(t, key, owner, token);
            self.check(c);
        }
        (Answer::Unit(r), expect, format!("release {name}"))
    }

    /// A worker session's request, run by its own `Exec` (on the canary's
    /// broken store, where there is one), beside the model; the oracle
    /// records what the store granted, renewed and settled.
    fn apply_worker(
        &mut self,
        owner: Owner,
        holder: HolderId,
        exec: &Exec,
        request: &WorkerRequest,
    ) -> (Answer, Outcome, String) {
        match request {
            WorkerRequest::Claim { max } => self.apply_claim(owner, holder, exec, *max),
            WorkerRequest::Heartbeat { claims } => {
                self.apply_heartbeats(owner, holder, exec, claims)
            }
            WorkerRequest::Settle { settles } => self.apply_settles(owner, holder, exec, settles),
            WorkerRequest::DrainCheck => {
                let reply = exec.run(WorkerRequest::DrainCheck);
                let expect = self.oracle.model.drained(QUEUE);
                (Answer::Worker(reply), expect, "drained".to_owned())
            }
            WorkerRequest::Fire => self.apply_fire(exec),
            WorkerRequest::Sample => {
                // Simulated workers never sample; nothing to compare.
                let answer = Answer::Worker(exec.run(WorkerRequest::Sample));
                let got = outcome_of(&answer);
                (answer, got, "sample".to_owned())
            }
        }
    }

    fn apply_claim(
        &mut self,
        owner: Owner,
        holder: HolderId,
        exec: &Exec,
        max: usize,
    ) -> (Answer, Outcome, String) {
        let (lease, t) = (self.plan.lease_ms, self.now);
        let reply = exec.run(WorkerRequest::Claim { max });
        if let WorkerReply::Claimed(Ok(jobs)) = &reply {
            let claimed: Vec<(u64, u64, u64)> = jobs
                .iter()
                .map(|j| {
                    let c = j.claim.map_or((0, 0), |c| (c.token, c.lease_until_ms));
                    (j.id.0, c.0, c.1)
                })
                .collect();
            let c = self.oracle.claimed(t, owner, &claimed);
            self.check(c);
        }
        let expect = self.oracle.model.claim(QUEUE, holder.0, lease, max);
        (Answer::Worker(reply), expect, "claim".to_owned())
    }

    fn apply_heartbeats(
        &mut self,
        owner: Owner,
        holder: HolderId,
        exec: &Exec,
        claims: &[(JobId, u64)],
    ) -> (Answer, Outcome, String) {
        let (lease, t) = (self.plan.lease_ms, self.now);
        let swapped: Vec<(HolderId, JobId, u64)> = claims
            .iter()
            .map(|&(id, tok)| {
                let (h, tok) = self.job_swap(id, holder, tok);
                (h, id, tok)
            })
            .collect();
        // Under the fencing canary the store sees the current tokens (and,
        // its transactions broken, takes anyone for the holder).
        let sent = swapped.iter().map(|&(_, id, tok)| (id, tok)).collect();
        let reply = exec.run(WorkerRequest::Heartbeat { claims: sent });
        let mut expect = Vec::new();
        for &(h, id, tok) in &swapped {
            expect.push(self.oracle.model.heartbeat(id.0, h.0, tok, lease));
        }
        if let WorkerReply::Heartbeated(Ok(replies)) = &reply {
            for (&(id, token), reply) in claims.iter().zip(replies) {
                if let Ok(hb) = reply {
                    let c = self
                        .oracle
                        .heartbeat(t, id.0, owner, token, hb.lease_until_ms);
                    self.check(c);
                }
            }
        }
        (
            Answer::Worker(reply),
            Outcome::Batch(expect),
            "heartbeats".to_owned(),
        )
    }

    fn apply_settles(
        &mut self,
        owner: Owner,
        holder: HolderId,
        exec: &Exec,
        settles: &[(JobId, u64, Settle)],
    ) -> (Answer, Outcome, String) {
        let t = self.now;
        let swapped: Vec<(JobId, u64, Settle, HolderId)> = settles
            .iter()
            .map(|(id, tok, s)| {
                let (h, tok) = self.job_swap(*id, holder, *tok);
                (*id, tok, s.clone(), h)
            })
            .collect();
        let sent = swapped
            .iter()
            .map(|(id, tok, s, _)| (*id, *tok, s.clone()))
            .collect();
        let reply = exec.run(WorkerRequest::Settle { settles: sent });
        let mut expect = Vec::new();
        for (id, tok, settle, h) in &swapped {
            let m = &mut self.oracle.model;
            expect.push(match settle {
                Settle::Complete => match m.complete(id.0, h.0, *tok, None) {
                    Outcome::Ok => Outcome::State(leasehold::JobState::Done),
                    other => other,
                },
                Settle::CompleteWith(result) => match m.complete(id.0, h.0, *tok, Some(result)) {
                    Outcome::Ok => Outcome::State(leasehold::JobState::Done),
                    other => other,
                },
                Settle::Fail(reason) => m.fail(id.0, h.0, *tok, reason),
                Settle::Abandon { started } => m.abandon(id.0, h.0, *tok, *started),
            });
        }
        if let WorkerReply::Settled(Ok(states)) = &reply {
            for ((id, token, settle), state) in settles.iter().zip(states) {
                if state.is_ok() {
                    let complete = matches!(settle, Settle::Complete | Settle::CompleteWith(_));
                    let c = self.oracle.settled(t, id.0, owner, *token, complete);
                    self.check(c);
                }
            }
        }
        (
            Answer::Worker(reply),
            Outcome::Batch(expect),
            "settles".to_owned(),
        )
    }
}
