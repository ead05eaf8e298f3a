//! What every worker-loop driver shares (the sync loop in `worker.rs`, the
//! tokio loop in `leasehold::tokio`): the [`WorkerMachine`] with the
//! records and handles of the jobs it holds ([`Session`]), and the store
//! transaction each of its requests stands for ([`Exec`]).
//!
//! A driver only moves things: it feeds the session local time, handler
//! results and wake-ups, runs [`Exec::run`] for each request (on whatever
//! thread suits it), and starts or stops handlers when
//! [`Session::next`] says so. The simulator is such a driver too, with
//! simulated handlers, network and store.
//!
//! # State
//! The record and the handle of every claim held (a job can be claimed
//! again before its old claim's outcome commits, so both are keyed by
//! claim: job and token), and the report.
//!
//! # Invariants
//! A handle exists exactly for the claims whose handler runs or ran and is
//! not settled yet; renewals, stops and the settled outcome reach the
//! handle and record of their own claim, never another claim of the job.

use super::job::{record_reports, ClaimedJob, ProgressBoard};
use super::machine::FireReport;
use super::machine::{
    ClaimId, JobOutcome, StopWhy, WorkerAction, WorkerConfig, WorkerMachine, WorkerReply,
    WorkerRequest,
};
use super::work_options::{WorkOptions, WorkReport};
use super::{ms_of, Client};
use crate::clock::Clock;
use crate::core::{self, HolderId, JobId, JobRecord, QueuePolicy};
use crate::error::{LostReason, Result};
use crate::hash::IdMap;
use crate::store::{FirstRead, Store, StoreExt};
use crate::time::{LocalMs, WallMs};
use std::sync::Arc;
use std::time::Duration;

/// The store side of the machine's requests: one transaction each, one
/// attempt (the machine decides what a transient error means). Cheap to
/// clone and `Send`, so a driver can run it off its own thread.
#[derive(Clone)]
pub struct Exec {
    store: Arc<dyn Store>,
    queue: Arc<str>,
    holder: HolderId,
    policy: QueuePolicy,
    lease_ms: u64,
    wall: Arc<dyn Clock>,
    /// The progress reports of the loop's jobs, sent with their renewal
    /// round or settle.
    board: ProgressBoard,
}

impl std::fmt::Debug for Exec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exec")
            .field("queue", &self.queue)
            .field("holder", &self.holder)
            .finish()
    }
}

impl Exec {
    /// The store side of `client`'s worker loop on `queue`, its claims
    /// leased for `lease_ms`.
    pub fn new(client: &Client, queue: &Arc<str>, lease_ms: u64) -> Exec {
        Exec {
            store: client.inner.store.clone(),
            queue: queue.clone(),
            holder: client.inner.holder.id,
            policy: client.inner.policy,
            lease_ms,
            wall: client.wall_clock().clone(),
            board: ProgressBoard::default(),
        }
    }

    /// The transaction `request` stands for, and its answer.
    pub fn run(&self, request: WorkerRequest) -> WorkerReply {
        let (queue, holder, lease_ms) = (&*self.queue, self.holder, self.lease_ms);
        let policy = &self.policy;
        let store = &self.store;
        match request {
            WorkerRequest::Claim { max } => {
                // Nothing claimed: when to look again, in the same
                // transaction (what it saw is what the hint is about).
                let first = FirstRead::Claim { queue, ready: max };
                let claimed = store.txn_reading("claim", Some(first), |tx| {
                    let jobs = core::job::claim(tx, queue, holder, lease_ms, max, policy)?;
                    let look = match jobs.is_empty() {
                        true => core::job::next_look(tx, queue)?,
                        false => core::job::NextLook::default(),
                    };
                    Ok((jobs, look))
                });
                match claimed {
                    Ok((jobs, look)) if jobs.is_empty() => WorkerReply::Idle {
                        next_change_in_ms: look.change_in_ms,
                        relook_in_ms: look.relook_in_ms,
                    },
                    other => WorkerReply::Claimed(other.map(|(jobs, _)| jobs)),
                }
            }
            WorkerRequest::Heartbeat { claims } => {
                let ids: Vec<JobId> = claims.iter().map(|c| c.0).collect();
                let renewed = self.board.send(claims.iter().copied(), |reports| {
                    store.txn_reading("heartbeat", Some(FirstRead::Jobs(&ids)), |tx| {
                        record_reports(tx, holder, reports)?;
                        core::job::heartbeat_many(tx, holder, &claims, lease_ms)
                    })
                });
                if let Ok(replies) = &renewed {
                    // A lost claim's reports will never be sent.
                    let lost = claims.iter().zip(replies).filter(|(_, r)| r.is_err());
                    self.board.forget(lost.map(|(c, _)| *c));
                }
                WorkerReply::Heartbeated(renewed)
            }
            WorkerRequest::Settle { settles } => {
                let ids = settles.iter().map(|s| (s.0, s.1));
                let first: Vec<JobId> = settles.iter().map(|s| s.0).collect();
                let settled = self.board.send(ids.clone(), |reports| {
                    store.txn_reading("settle", Some(FirstRead::Jobs(&first)), |tx| {
                        record_reports(tx, holder, reports)?;
                        core::job::settle_many(tx, holder, &settles, policy)
                    })
                });
                if settled.is_ok() {
                    // Settled or lost: whatever came since goes nowhere.
                    self.board.forget(ids);
                }
                WorkerReply::Settled(settled)
            }
            WorkerRequest::DrainCheck => WorkerReply::Drained(
                store.txn_as("drain_check", |tx| core::job::drained(tx, queue, policy)),
            ),
            WorkerRequest::Sample => WorkerReply::Sampled(
                store.txn_as("sample", |tx| core::job::stats(tx, queue, policy)),
            ),
            WorkerRequest::Fire => WorkerReply::Fired(self.fire()),
        }
    }

    /// Fire the queue's schedules at the wall clock's now.
    fn fire(&self) -> Result<FireReport> {
        let wall = WallMs::read(&*self.wall);
        let fired = self.store.txn_as("fire", |tx| {
            core::schedule::fire(tx, &self.queue, wall, &self.policy)
        });
        match fired {
            Ok(f) => Ok(FireReport {
                enqueued: f.enqueued.iter().filter(|e| e.3).count(),
                next_in_ms: f.next_ms.map(|n| n.saturating_sub(wall.ms())),
                jobs: f.enqueued,
            }),
            Err(e) => {
                tracing::warn!(target: "leasehold::schedule", queue = &*self.queue, error = %e, "firing schedules failed");
                Err(e)
            }
        }
    }
}

/// What the driver must do for the machine.
pub enum Next {
    /// Run this request ([`Exec::run`]) and feed the reply to
    /// [`Session::reply`].
    Send(WorkerRequest),
    /// Run the handler for this job.
    Start(Arc<ClaimedJob>),
    /// The handler of this claim should stop now, and why (its handle
    /// already says it may not act): a driver that can interrupt it does.
    Stop(
        #[cfg_attr(any(not(feature = "tokio"), loom), allow(dead_code))] ClaimId,
        #[allow(dead_code)] StopWhy,
    ),
    /// The loop is over.
    End(Result<WorkReport>),
}

/// Deliberately broken variants, for the simulator's canaries.
#[cfg(feature = "canaries")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SessionBreakage {
    /// Settle bookkeeping keyed by job alone (the bug of issue 23): a
    /// late outcome of an old claim removes the newest claim's handle and
    /// record, so renewals no longer reach its running handler.
    pub settle_by_job: bool,
}

/// The machine of one worker loop and the claims it holds.
pub struct Session {
    /// The worker loop's rules.
    pub machine: WorkerMachine,
    client: Client,
    lease_ms: u64,
    exec: Exec,
    /// Claims held, as claimed (for the handler and the observer), with
    /// the local instant of the claim's reply (for their run time).
    records: IdMap<ClaimId, (JobRecord, LocalMs)>,
    handles: IdMap<ClaimId, Arc<ClaimedJob>>,
    report: WorkReport,
    #[cfg(feature = "canaries")]
    breakage: SessionBreakage,
}

impl Session {
    /// A session of `client` on `queue` with `opts`, starting now.
    pub fn new(client: &Client, queue: &Arc<str>, opts: &WorkOptions) -> Session {
        let lease_ms = ms_of(opts.lease);
        // A draining worker waits for others' jobs to end, which nothing
        // announces: it polls (at most a second), to exit soon after.
        let announced = client.store().announces_changes() && !opts.drain;
        let cfg = WorkerConfig {
            lease_ms,
            concurrency: opts.concurrency.clamp(1, WorkOptions::MAX_CONCURRENCY),
            prefetch: opts.prefetch,
            batch_max: opts.batch.clamp(1, core::MAX_BATCH),
            flush_delay_ms: ms_of(opts.flush_delay),
            idle_max_ms: opts.idle_max_ms(announced),
            announced,
            heartbeat_ms: opts.heartbeat.map_or(0, ms_of),
            drain: opts.drain,
            drift: client.inner.drift,
            seed: client.jitter(u64::MAX),
            sample_ms: opts.sample.map_or(0, |d| ms_of(d).max(1)),
            fire_ms: opts.schedules.map_or(0, |d| ms_of(d).max(1)),
        };
        Session {
            machine: WorkerMachine::new(cfg, client.local_now()),
            client: client.clone(),
            lease_ms,
            exec: Exec::new(client, queue, lease_ms),
            records: IdMap::default(),
            handles: IdMap::default(),
            report: WorkReport::default(),
            #[cfg(feature = "canaries")]
            breakage: SessionBreakage::default(),
        }
    }

    /// The same session with a deliberate breakage (simulator canaries).
    #[cfg(feature = "canaries")]
    pub fn with_breakage(mut self, breakage: SessionBreakage) -> Self {
        self.breakage = breakage;
        self
    }

    /// The session as a forked child holds it (the simulator's fork): the
    /// same machine, records and report, copied; the handles rebuilt on
    /// `client` (the child's), shared with nothing of the parent's.
    #[cfg(feature = "canaries")]
    pub fn forked(&self, client: &Client) -> Session {
        let exec = Exec::new(client, &self.exec.queue, self.lease_ms);
        let handles = self
            .handles
            .iter()
            .map(|(claim, job)| {
                let deadline = self.machine.deadline(*claim).unwrap_or(LocalMs::ZERO);
                let copy = ClaimedJob::managed(
                    client.clone(),
                    job.record().clone(),
                    self.lease_ms,
                    deadline,
                    &exec.board,
                );
                (*claim, Arc::new(copy))
            })
            .collect();
        Session {
            machine: self.machine.clone(),
            client: client.clone(),
            lease_ms: self.lease_ms,
            exec,
            records: self.records.clone(),
            handles,
            report: self.report,
            breakage: self.breakage,
        }
    }

    /// The handle of `claim`, while its handler runs or ran and it is not
    /// settled.
    #[cfg(feature = "canaries")]
    pub fn handle(&self, claim: ClaimId) -> Option<&Arc<ClaimedJob>> {
        self.handles.get(&claim)
    }

    /// The local clock (ms).
    pub fn now(&self) -> LocalMs {
        self.client.local_now()
    }

    /// The store side, to run requests with.
    pub fn exec(&self) -> &Exec {
        &self.exec
    }

    /// The store answered a request (at the local instant of now).
    pub fn reply(&mut self, reply: WorkerReply) {
        let now = self.now();
        if let WorkerReply::Claimed(Ok(jobs)) = &reply {
            for job in jobs {
                self.records.insert(ClaimId::of(job), (job.clone(), now));
            }
        }
        self.machine.handle_reply(now, reply);
    }

    /// Do the machine's bookkeeping actions (renewed deadlines, recorded
    /// outcomes, handles that may no longer act) until one needs the
    /// driver; `None` when the machine has nothing more to do for now.
    pub fn next(&mut self, observe: &dyn Fn(&JobRecord, JobOutcome)) -> Option<Next> {
        while let Some(action) = self.machine.poll_action() {
            match action {
                WorkerAction::Send(request) => return Some(Next::Send(request)),
                WorkerAction::Start(record) => return Some(Next::Start(self.start(*record))),
                WorkerAction::Stop { claim, why } => {
                    if let Some(job) = self.handles.get(&claim) {
                        match why {
                            StopWhy::Lost(reason) => job.life.mark_lost(reason),
                            StopWhy::TimedOut => job.life.mark_lost(LostReason::TimedOut),
                            StopWhy::Cancelled => job.life.set_cancel(),
                            StopWhy::Shutdown => {
                                job.life.finish();
                            }
                        }
                    }
                    return Some(Next::Stop(claim, why));
                }
                WorkerAction::Renewed { claim, deadline } => {
                    if let Some(job) = self.handles.get(&claim) {
                        job.life.extend_to(deadline);
                    }
                }
                WorkerAction::Settled { claim, outcome } => {
                    self.report.count(outcome);
                    let claim = self.settled_key(claim);
                    self.handles.remove(&claim);
                    if let Some((record, claimed_at)) = self.records.remove(&claim) {
                        let ran = self.now().saturating_sub(claimed_at);
                        crate::observe::job_ran(&self.exec.queue, Duration::from_millis(ran));
                        observe(&record, outcome);
                    }
                }
                WorkerAction::Sampled(counts) => {
                    crate::observe::queue_depth(&self.exec.queue, &counts);
                }
                WorkerAction::Finished => return Some(Next::End(Ok(self.report))),
                WorkerAction::Failed(e) => return Some(Next::End(Err(e))),
            }
        }
        None
    }

    /// The loop has ended: every handle still out (its handler running,
    /// or its job started and not run) turns invalid, so its handler stops
    /// acting; nothing renews its claim any more.
    pub fn stop_running(&self) {
        for job in self.handles.values() {
            job.life.finish();
        }
    }

    /// The key a settled claim's bookkeeping is removed under: its own
    /// (under the canary, the newest claim of the same job, as when the
    /// session was keyed by job).
    fn settled_key(&self, claim: ClaimId) -> ClaimId {
        #[cfg(feature = "canaries")]
        if self.breakage.settle_by_job {
            let newest = self.records.keys().filter(|c| c.job == claim.job).max();
            return newest.copied().unwrap_or(claim);
        }
        claim
    }

    fn start(&mut self, record: JobRecord) -> Arc<ClaimedJob> {
        let claim = ClaimId::of(&record);
        let deadline = self.machine.deadline(claim).unwrap_or(LocalMs::ZERO);
        let job = Arc::new(ClaimedJob::managed(
            self.client.clone(),
            record,
            self.lease_ms,
            deadline,
            &self.exec.board,
        ));
        self.handles.insert(claim, job.clone());
        job
    }
}

#[cfg(test)]
mod tests {
    //! The session layer driven by hand through one exact sequence: a
    //! settle whose reply arrives after the same loop claimed the job again.
    use super::*;
    use crate::clock::ManualClock;
    use crate::core::JobSpec;
    use crate::store::MemStore;
    use std::cell::RefCell;

    /// Everything the driver would do, except requests held back by `hold`.
    fn pump(
        s: &mut Session,
        held: &mut Vec<WorkerRequest>,
        started: &mut Vec<Arc<ClaimedJob>>,
        observed: &RefCell<Vec<(crate::core::JobId, u64, JobOutcome)>>,
        hold: impl Fn(&WorkerRequest) -> bool,
    ) {
        let observe = |r: &JobRecord, o: JobOutcome| {
            let token = r.claim.map_or(0, |c| c.token);
            observed.borrow_mut().push((r.id, token, o));
        };
        while let Some(next) = s.next(&observe) {
            match next {
                Next::Send(request) if hold(&request) => held.push(request),
                Next::Send(request) => {
                    let reply = s.exec().run(request);
                    s.reply(reply);
                }
                Next::Start(job) => started.push(job),
                Next::Stop(..) => {}
                Next::End(end) => panic!("the loop ended: {:?}", end.err()),
            }
        }
    }

    #[test]
    fn a_late_settle_reply_leaves_the_new_claim_of_the_same_job_alone() {
        let (store_clock, local) = (ManualClock::new(1_000_000), ManualClock::new(5_000));
        let store = MemStore::with_clock(Arc::new(store_clock.clone()));
        let policy = QueuePolicy {
            backoff_base_ms: 1,
            backoff_max_ms: 1,
            ..QueuePolicy::default()
        };
        let client = Client::builder(store)
            .clock(Arc::new(local.clone()))
            .policy(policy)
            .build();
        let advance = |ms: u64| {
            store_clock.advance(ms);
            local.advance(ms);
        };
        let q: Arc<str> = Arc::from("q");
        let id = client
            .queue("q")
            .and_then(|queue| queue.push(&JobSpec::new("x")))
            .map(|o| o.id)
            .expect("push");
        let opts = WorkOptions {
            lease: Duration::from_millis(1_000),
            prefetch: 0,
            batch: 1,
            flush_delay: Duration::ZERO,
            idle_poll: Duration::from_millis(10),
            schedules: None,
            ..WorkOptions::default()
        };
        let mut s = Session::new(&client, &q, &opts);
        let (mut held, mut started) = (Vec::new(), Vec::new());
        let observed = RefCell::new(Vec::new());
        // Claim J (token 1) and start its handler.
        pump(&mut s, &mut held, &mut started, &observed, |_| false);
        let first = started.pop().expect("J started");
        assert_eq!((first.id(), first.token()), (id, 1));
        // The handler reports; the settle and every renewal stall.
        s.machine
            .handler_done(s.now(), ClaimId { job: id, token: 1 }, Ok(()));
        let stalled = |r: &WorkerRequest| {
            matches!(
                r,
                WorkerRequest::Settle { .. } | WorkerRequest::Heartbeat { .. }
            )
        };
        pump(&mut s, &mut held, &mut started, &observed, stalled);
        let settle = held
            .iter()
            .position(|r| matches!(r, WorkerRequest::Settle { .. }))
            .map(|i| held.remove(i))
            .expect("the settle was sent");
        // The claim runs out in the store; the same loop claims J again.
        for _ in 0..30 {
            advance(50);
            s.machine.handle_timeout(s.now());
            pump(&mut s, &mut held, &mut started, &observed, stalled);
            if !started.is_empty() {
                break;
            }
        }
        let second = started.pop().expect("J claimed again after its lease");
        assert_eq!((second.id(), second.token()), (id, 2));
        // Renewals flow again (the stalled round is answered); the old
        // settle's reply arrives: lost.
        for round in held.drain(..) {
            let reply = s.exec().run(round);
            s.reply(reply);
        }
        let reply = s.exec().run(settle);
        s.reply(reply);
        pump(&mut s, &mut held, &mut started, &observed, |_| false);
        assert_eq!(
            observed.borrow().as_slice(),
            [(id, 1, JobOutcome::Lost)],
            "the outcome observed is the old claim's, with the old claim's record"
        );
        // The new claim's handler keeps being renewed, well past one lease.
        for _ in 0..60 {
            advance(50);
            s.machine.handle_timeout(s.now());
            pump(&mut s, &mut held, &mut started, &observed, |_| false);
        }
        assert!(
            second.is_valid(),
            "the running handler of claim 2 stays valid while the loop renews it"
        );
        assert_eq!(observed.borrow().len(), 1, "claim 2 is still running");
        s.machine
            .handler_done(s.now(), ClaimId { job: id, token: 2 }, Ok(()));
        pump(&mut s, &mut held, &mut started, &observed, |_| false);
        assert_eq!(
            observed.borrow().last(),
            Some(&(id, 2, JobOutcome::Done)),
            "claim 2's outcome is observed with claim 2's record"
        );
    }
}
