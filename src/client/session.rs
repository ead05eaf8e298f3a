//! What every worker-loop driver shares (the sync loop in `worker.rs`, the
//! tokio loop in `leasehold::tokio`): the [`WorkerMachine`] with the
//! records and handles of the jobs it holds ([`Session`]), and the store
//! transaction each of its requests stands for ([`Exec`]).
//!
//! A driver only moves things: it feeds the session local time, handler
//! results and wake-ups, runs [`Exec::run`] for each request (on whatever
//! thread suits it), and starts or stops handlers when
//! [`Session::next`] says so.

use super::job::ClaimedJob;
use super::machine::FireReport;
use super::machine::{
    JobOutcome, StopWhy, WorkerAction, WorkerConfig, WorkerMachine, WorkerReply, WorkerRequest,
};
use super::worker::{WorkOptions, WorkReport};
use super::{ms_of, Client};
use crate::clock::Clock;
use crate::core::{self, HolderId, JobId, JobRecord, QueuePolicy};
use crate::error::Result;
use crate::store::{Store, StoreExt};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// The store side of the machine's requests: one transaction each, one
/// attempt (the machine decides what a transient error means). Cheap to
/// clone and `Send`, so a driver can run it off its own thread.
#[derive(Clone)]
pub(crate) struct Exec {
    store: Arc<dyn Store>,
    queue: Arc<str>,
    holder: HolderId,
    policy: QueuePolicy,
    lease_ms: u64,
    wall: Arc<dyn Clock>,
}

impl Exec {
    /// The transaction `request` stands for, and its answer.
    pub(crate) fn run(&self, request: WorkerRequest) -> WorkerReply {
        let (queue, holder, lease_ms) = (&*self.queue, self.holder, self.lease_ms);
        let policy = &self.policy;
        let store = &self.store;
        match request {
            WorkerRequest::Claim { max } => WorkerReply::Claimed(store.txn_as("claim", |tx| {
                core::job::claim(tx, queue, holder, lease_ms, max, policy)
            })),
            WorkerRequest::Heartbeat { claims } => {
                WorkerReply::Heartbeated(store.txn_as("heartbeat", |tx| {
                    core::job::heartbeat_many(tx, holder, &claims, lease_ms)
                }))
            }
            WorkerRequest::Settle { settles } => {
                WorkerReply::Settled(store.txn_as("settle", |tx| {
                    core::job::settle_many(tx, holder, &settles, policy)
                }))
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
        let wall_ms = self.wall.now_ms();
        let fired = self.store.txn_as("fire", |tx| {
            core::schedule::fire(tx, &self.queue, wall_ms, &self.policy)
        });
        match fired {
            Ok(f) => Ok(FireReport {
                enqueued: f.enqueued.iter().filter(|e| e.3).count(),
                next_in_ms: f.next_ms.map(|n| n.saturating_sub(wall_ms)),
            }),
            Err(e) => {
                tracing::warn!(target: "leasehold::schedule", queue = &*self.queue, error = %e, "firing schedules failed");
                Err(e)
            }
        }
    }
}

/// What the driver must do for the machine.
pub(crate) enum Next {
    /// Run this request ([`Exec::run`]) and feed the reply to
    /// [`Session::reply`].
    Send(WorkerRequest),
    /// Run the handler for this job.
    Start(Arc<ClaimedJob>),
    /// The handler of this job should stop now (its handle already says
    /// it may not act): a driver that can interrupt it does.
    Stop(#[cfg_attr(any(not(feature = "tokio"), loom), allow(dead_code))] JobId),
    /// The loop is over.
    End(Result<WorkReport>),
}

/// The machine of one worker loop and the jobs it holds.
pub(crate) struct Session {
    pub(crate) machine: WorkerMachine,
    client: Client,
    lease_ms: u64,
    exec: Exec,
    /// Jobs held, as claimed (for the handler and the observer), with
    /// the local instant of the claim's reply (for their run time).
    records: HashMap<JobId, (JobRecord, u64)>,
    handles: HashMap<JobId, Arc<ClaimedJob>>,
    report: WorkReport,
}

impl Session {
    /// A session of `client` on `queue` with `opts`, starting now.
    pub(crate) fn new(client: &Client, queue: &Arc<str>, opts: &WorkOptions) -> Session {
        let lease_ms = ms_of(opts.lease);
        let cfg = WorkerConfig {
            lease_ms,
            concurrency: opts.concurrency.clamp(1, 1024),
            prefetch: opts.prefetch,
            batch_max: opts.batch.clamp(1, core::MAX_BATCH),
            flush_delay_ms: ms_of(opts.flush_delay),
            idle_max_ms: ms_of(opts.idle_poll).max(1),
            heartbeat_ms: opts.heartbeat.map_or(0, ms_of),
            drain: opts.drain,
            drift: client.inner.drift,
            seed: client.jitter(u64::MAX),
            sample_ms: opts.sample.map_or(0, |d| ms_of(d).max(1)),
            fire_ms: opts.schedules.map_or(0, |d| ms_of(d).max(1)),
        };
        Session {
            machine: WorkerMachine::new(cfg, client.local_now_ms()),
            client: client.clone(),
            lease_ms,
            exec: Exec {
                store: client.inner.store.clone(),
                queue: queue.clone(),
                holder: client.inner.holder.id,
                policy: client.inner.policy,
                lease_ms,
                wall: client.wall_clock().clone(),
            },
            records: HashMap::new(),
            handles: HashMap::new(),
            report: WorkReport::default(),
        }
    }

    /// The local clock (ms).
    pub(crate) fn now(&self) -> u64 {
        self.client.local_now_ms()
    }

    /// The store side, to run requests with.
    pub(crate) fn exec(&self) -> &Exec {
        &self.exec
    }

    /// The store answered a request (at the local instant of now).
    pub(crate) fn reply(&mut self, reply: WorkerReply) {
        let now = self.now();
        if let WorkerReply::Claimed(Ok(jobs)) = &reply {
            for job in jobs {
                self.records.insert(job.id, (job.clone(), now));
            }
        }
        self.machine.handle_reply(now, reply);
    }

    /// Do the machine's bookkeeping actions (renewed deadlines, recorded
    /// outcomes, handles that may no longer act) until one needs the
    /// driver; `None` when the machine has nothing more to do for now.
    pub(crate) fn next(&mut self, observe: &dyn Fn(&JobRecord, JobOutcome)) -> Option<Next> {
        while let Some(action) = self.machine.poll_action() {
            match action {
                WorkerAction::Send(request) => return Some(Next::Send(request)),
                WorkerAction::Start(record) => return Some(Next::Start(self.start(record))),
                WorkerAction::Stop { id, why } => {
                    if let Some(job) = self.handles.get(&id) {
                        match why {
                            StopWhy::Lost(reason) => job.life.mark_lost(reason),
                            StopWhy::Cancelled => job.life.set_cancel(),
                            StopWhy::Shutdown => {
                                job.life.finish();
                            }
                        }
                    }
                    return Some(Next::Stop(id));
                }
                WorkerAction::Renewed { id, deadline } => {
                    if let Some(job) = self.handles.get(&id) {
                        job.life.extend_to(deadline);
                    }
                }
                WorkerAction::Settled { id, outcome } => {
                    self.report.count(outcome);
                    self.handles.remove(&id);
                    if let Some((record, claimed_at)) = self.records.remove(&id) {
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

    fn start(&mut self, record: JobRecord) -> Arc<ClaimedJob> {
        let id = record.id;
        let deadline = self.machine.deadline(id).unwrap_or(0);
        let job = Arc::new(ClaimedJob::managed(
            self.client.clone(),
            record,
            self.lease_ms,
            deadline,
        ));
        self.handles.insert(id, job.clone());
        job
    }
}
