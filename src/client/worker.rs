//! The sync worker loop: a thin driver of [`WorkerMachine`]. The calling
//! thread runs the machine and its store transactions (claims, renewal
//! rounds, settle batches, drain checks, one at a time); `concurrency`
//! handler threads run the handler; a waker thread turns the store's
//! "job ready" wake-ups into [`WorkerMachine::wake`]. Every timing rule is
//! the machine's.

use super::job::ClaimedJob;
use super::machine::{
    JobOutcome, StopWhy, WorkerAction, WorkerConfig, WorkerMachine, WorkerReply, WorkerRequest,
};
use super::queue::Queue;
use super::{ms_of, Client};
use crate::core::{self, JobId, JobRecord};
use crate::error::Result;
use crate::store::{StoreExt, Wake};
use crate::sync::{lock, Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Options of [`Queue::work`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkOptions {
    /// Lease of each claim; renewal rounds extend it.
    pub lease: Duration,
    /// Most jobs claimed per transaction, and most outcomes committed per
    /// transaction.
    pub batch: usize,
    /// Handlers running at once (threads).
    pub concurrency: usize,
    /// Jobs claimed ahead of a free handler (bounded prefetch).
    pub prefetch: usize,
    /// Return once the queue is drained ([`crate::core::job::drained`]: no
    /// job ready, running, or due, retries in backoff included).
    pub drain: bool,
    /// Longest sleep between claims when the queue is empty (a job made
    /// ready in this process, or announced by the store, cuts it short).
    pub idle_poll: Duration,
    /// Longest an outcome waits for others to share its transaction.
    pub flush_delay: Duration,
    /// Renewal round interval (`None`: a third of the lease, at most a
    /// second, so a cancel reaches the handler within a second).
    pub heartbeat: Option<Duration>,
    /// After `stop`: how long running handlers may finish before their jobs
    /// are given back (to be retried) and [`ClaimedJob::is_valid`] turns false.
    pub shutdown_grace: Duration,
}

impl Default for WorkOptions {
    fn default() -> Self {
        WorkOptions {
            lease: Duration::from_secs(30),
            batch: 64,
            concurrency: 1,
            prefetch: 1,
            drain: false,
            idle_poll: Duration::from_millis(200),
            flush_delay: Duration::from_millis(1),
            heartbeat: None,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// What a worker loop did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkReport {
    /// Jobs completed.
    pub completed: u64,
    /// Jobs reported failed.
    pub failed: u64,
    /// Jobs given back at shutdown.
    pub abandoned: u64,
    /// Jobs whose claim was lost (or whose outcome is unknown) before the
    /// outcome was recorded; the store retries them after their lease.
    pub lost: u64,
}

impl WorkReport {
    fn count(&mut self, outcome: JobOutcome) {
        match outcome {
            JobOutcome::Done => self.completed += 1,
            JobOutcome::Failed(_) => self.failed += 1,
            JobOutcome::Abandoned(_) => self.abandoned += 1,
            JobOutcome::Lost => self.lost += 1,
        }
    }
}

/// A failure reason as the store takes it: at most
/// [`crate::core::MAX_TEXT_BYTES`], without NUL. A longer one (a stack
/// trace, captured stderr) keeps its head and its tail around a marker
/// saying how much was cut: the worker loop cannot ask the handler for a
/// shorter one, and losing the job's outcome over its length would be worse.
pub fn fit_reason(reason: &str) -> std::borrow::Cow<'_, str> {
    let max = core::MAX_TEXT_BYTES;
    if reason.len() <= max && !reason.contains('\0') {
        return std::borrow::Cow::Borrowed(reason);
    }
    let clean = reason.replace('\0', "\u{fffd}");
    if clean.len() <= max {
        return std::borrow::Cow::Owned(clean);
    }
    let keep = (max - 64) / 2;
    let mut head = keep;
    while !clean.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = clean.len() - keep;
    while !clean.is_char_boundary(tail) {
        tail += 1;
    }
    std::borrow::Cow::Owned(format!(
        "{}\n[... {} bytes cut ...]\n{}",
        &clean[..head],
        tail - head,
        &clean[tail..]
    ))
}

type Done = (JobId, std::result::Result<(), String>);

/// What the driver, the handler threads and the waker share.
struct Shared {
    /// Handler results and wake-ups for the driver.
    inbox: Mutex<(Vec<Done>, bool)>,
    inbox_cv: Condvar,
    /// Jobs waiting for a handler thread; `true` once closed.
    pool: Mutex<(VecDeque<Arc<ClaimedJob>>, bool)>,
    pool_cv: Condvar,
    quit: AtomicBool,
}

impl Queue {
    /// Claim and run jobs until `stop` is set (or, with `drain`, until the
    /// queue is drained), `opts.concurrency` at a time. The handler's `Ok`
    /// completes a job, `Err(reason)` fails it (a reason longer than the
    /// store takes is cut: [`fit_reason`]); a panicking handler fails its
    /// job. Claims come in batches, outcomes are committed in batches, and
    /// every held job is renewed in one transaction per round; a handler
    /// checks [`ClaimedJob::is_valid`] before each protected action (false
    /// once the claim is lost, the job cancelled or given back).
    pub fn work(
        &self,
        opts: &WorkOptions,
        stop: &AtomicBool,
        handler: impl Fn(&ClaimedJob) -> std::result::Result<(), String> + Sync,
    ) -> Result<WorkReport> {
        self.work_with(opts, stop, handler, |_, _| {})
    }

    /// [`Queue::work`], calling `observe` with each job's outcome once it
    /// is recorded (or known lost). Transient store trouble is waited out;
    /// any other store error stops the loop and is returned. `work_with`
    /// returns once every handler call has returned.
    pub fn work_with(
        &self,
        opts: &WorkOptions,
        stop: &AtomicBool,
        handler: impl Fn(&ClaimedJob) -> std::result::Result<(), String> + Sync,
        observe: impl Fn(&JobRecord, JobOutcome) + Sync,
    ) -> Result<WorkReport> {
        self.client.inner.fork.check()?;
        let shared = Shared {
            inbox: Mutex::new((Vec::new(), false)),
            inbox_cv: Condvar::new(),
            pool: Mutex::new((VecDeque::new(), false)),
            pool_cv: Condvar::new(),
            quit: AtomicBool::new(false),
        };
        let threads = opts.concurrency.clamp(1, 1024);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| handler_thread(&shared, &handler));
            }
            s.spawn(|| waker_thread(&self.client, &shared));
            let result = Driver::new(self, opts, &shared).run(stop, &observe);
            shared.quit.store(true, Ordering::SeqCst);
            lock(&shared.pool).1 = true;
            shared.pool_cv.notify_all();
            result
        })
    }
}

fn handler_thread(
    shared: &Shared,
    handler: &(impl Fn(&ClaimedJob) -> std::result::Result<(), String> + Sync),
) {
    loop {
        let job = {
            let mut pool = lock(&shared.pool);
            loop {
                if let Some(job) = pool.0.pop_front() {
                    break job;
                }
                if pool.1 {
                    return;
                }
                pool = match shared.pool_cv.wait(pool) {
                    Ok(g) => g,
                    Err(p) => p.into_inner(),
                };
            }
        };
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(&job)));
        let result = run.unwrap_or_else(|payload| {
            let text = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(format!("the handler panicked: {text}"))
        });
        lock(&shared.inbox).0.push((job.id(), result));
        shared.inbox_cv.notify_all();
    }
}

/// Turns the store's "a job is ready" wake-ups into driver wake-ups.
fn waker_thread(client: &Client, shared: &Shared) {
    let store = client.store();
    while !shared.quit.load(Ordering::SeqCst) {
        let epoch = store.epoch(Wake::JobReady);
        if store.wait_epoch(Wake::JobReady, epoch, Duration::from_millis(50)) {
            lock(&shared.inbox).1 = true;
            shared.inbox_cv.notify_all();
        }
    }
}

struct Driver<'a> {
    queue: &'a Queue,
    opts: &'a WorkOptions,
    shared: &'a Shared,
    machine: WorkerMachine,
    /// Jobs held, as claimed (for the handler and the observer).
    records: HashMap<JobId, JobRecord>,
    handles: HashMap<JobId, Arc<ClaimedJob>>,
    report: WorkReport,
    stopping: bool,
}

impl<'a> Driver<'a> {
    fn new(queue: &'a Queue, opts: &'a WorkOptions, shared: &'a Shared) -> Self {
        let client = &queue.client;
        let cfg = WorkerConfig {
            lease_ms: ms_of(opts.lease),
            concurrency: opts.concurrency.clamp(1, 1024),
            prefetch: opts.prefetch,
            batch_max: opts.batch.clamp(1, core::MAX_BATCH),
            flush_delay_ms: ms_of(opts.flush_delay),
            idle_max_ms: ms_of(opts.idle_poll).max(1),
            heartbeat_ms: opts.heartbeat.map_or(0, ms_of),
            drain: opts.drain,
            drift: client.inner.drift,
            seed: client.jitter(u64::MAX),
        };
        Driver {
            queue,
            opts,
            shared,
            machine: WorkerMachine::new(cfg, client.local_now_ms()),
            records: HashMap::new(),
            handles: HashMap::new(),
            report: WorkReport::default(),
            stopping: false,
        }
    }

    fn now(&self) -> u64 {
        self.queue.client.local_now_ms()
    }

    fn run(
        mut self,
        stop: &AtomicBool,
        observe: &(impl Fn(&JobRecord, JobOutcome) + Sync),
    ) -> Result<WorkReport> {
        loop {
            let now = self.now();
            // The stop flag first: a handler that finished because of the
            // same shutdown must not free a slot for a queued job.
            if !self.stopping && stop.load(Ordering::SeqCst) {
                self.stopping = true;
                let grace = ms_of(self.opts.shutdown_grace);
                self.machine.shutdown(now, now.saturating_add(grace));
            }
            let (done, woke) = std::mem::take(&mut *lock(&self.shared.inbox));
            for (id, result) in done {
                self.machine.handler_done(now, id, result);
            }
            if woke {
                self.machine.wake(now);
            }
            self.machine.handle_timeout(now);
            if let Some(end) = self.act(observe) {
                return end;
            }
            self.wait();
        }
    }

    /// Do what the machine asks; `Some` once the loop is over.
    fn act(
        &mut self,
        observe: &(impl Fn(&JobRecord, JobOutcome) + Sync),
    ) -> Option<Result<WorkReport>> {
        while let Some(action) = self.machine.poll_action() {
            match action {
                WorkerAction::Send(request) => {
                    let reply = self.execute(request);
                    let now = self.now();
                    self.machine.handle_reply(now, reply);
                }
                WorkerAction::Start(record) => self.start(record),
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
                }
                WorkerAction::Renewed { id, deadline } => {
                    if let Some(job) = self.handles.get(&id) {
                        job.life.extend_to(deadline);
                    }
                }
                WorkerAction::Settled { id, outcome } => {
                    self.report.count(outcome);
                    self.handles.remove(&id);
                    if let Some(record) = self.records.remove(&id) {
                        observe(&record, outcome);
                    }
                }
                WorkerAction::Finished => return Some(Ok(self.report)),
                WorkerAction::Failed(e) => return Some(Err(e)),
            }
        }
        None
    }

    fn start(&mut self, record: JobRecord) {
        let id = record.id;
        let deadline = self.machine.deadline(id).unwrap_or(0);
        let client = self.queue.client.clone();
        let lease_ms = ms_of(self.opts.lease);
        let job = Arc::new(ClaimedJob::managed(client, record, lease_ms, deadline));
        self.handles.insert(id, job.clone());
        lock(&self.shared.pool).0.push_back(job);
        self.shared.pool_cv.notify_one();
    }

    /// One store transaction for the machine (one attempt: the machine
    /// decides what a transient error means).
    fn execute(&mut self, request: WorkerRequest) -> WorkerReply {
        let client = &self.queue.client;
        let (name, holder) = (&*self.queue.name, client.inner.holder.id);
        let policy = client.inner.policy;
        let lease_ms = ms_of(self.opts.lease);
        let store = client.store();
        match request {
            WorkerRequest::Claim { max } => {
                let r = store.txn(|tx| core::job::claim(tx, name, holder, lease_ms, max, &policy));
                if let Ok(jobs) = &r {
                    for job in jobs {
                        self.records.insert(job.id, job.clone());
                    }
                }
                WorkerReply::Claimed(r)
            }
            WorkerRequest::Heartbeat { claims } => WorkerReply::Heartbeated(
                store.txn(|tx| core::job::heartbeat_many(tx, holder, &claims, lease_ms)),
            ),
            WorkerRequest::Settle { settles } => WorkerReply::Settled(
                store.txn(|tx| core::job::settle_many(tx, holder, &settles, &policy)),
            ),
            WorkerRequest::DrainCheck => {
                WorkerReply::Drained(store.txn(|tx| core::job::drained(tx, name, &policy)))
            }
        }
    }

    /// Sleep until the machine's next timeout or a handler result, at most
    /// 50 ms (the stop flag is polled).
    fn wait(&self) {
        let now = self.now();
        let until = self.machine.poll_timeout().unwrap_or(u64::MAX);
        let ms = until.saturating_sub(now).clamp(0, 50);
        if ms == 0 {
            return;
        }
        let inbox = lock(&self.shared.inbox);
        if !inbox.0.is_empty() || inbox.1 {
            return;
        }
        drop(crate::sync::nap(
            &self.shared.inbox_cv,
            &self.shared.inbox,
            inbox,
            Duration::from_millis(ms),
        ));
    }
}
