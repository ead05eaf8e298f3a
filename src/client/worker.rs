//! The sync worker loop: a thin driver of [`WorkerMachine`]. The calling
//! thread runs the machine; store threads run its transactions (a claim,
//! a renewal round, a settle batch and a drain check may be in flight at
//! once: the machine allows one of each; as many threads as the store
//! gains from, one on SQLite); `concurrency` handler threads run the
//! handler; a waker thread turns the store's "job ready" wake-ups into
//! [`WorkerMachine::wake`]. Every timing rule is the machine's. A hand-off
//! between these threads notifies only a thread that sleeps, after the
//! lock is let go.

use super::channel::{spawn_waker, Channel};
use super::job::ClaimedJob;
use super::machine::{ClaimId, HandlerOutcome, JobOutcome, WorkerReply, WorkerRequest};
use super::ms_of;
use super::queue::Queue;
use super::session::{Next, Session};
use crate::core::{self, JobRecord};
use crate::error::Result;
use crate::store::Wake;
use crate::sync::{lock, Condvar, Mutex};
use crate::time::LocalMs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Options of [`Queue::work`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkOptions {
    /// Lease of each claim; renewal rounds extend it.
    pub lease: Duration,
    /// Most jobs claimed per transaction, and most outcomes committed per
    /// transaction (default 128: with fast handlers a job pays mostly its
    /// share of each transaction's fixed cost; against 64, in one run, 8
    /// handlers did 16-20 % more jobs/s on PostgreSQL, 4-8 % on SQLite).
    /// A higher-priority job pushed meanwhile starts after the jobs already
    /// claimed: 512 made the loop faster (10 % on SQLite, 27 % on
    /// PostgreSQL) but such a job's start 2 to 5 times later (BENCHMARKS.md).
    pub batch: usize,
    /// Handlers running at once (threads).
    pub concurrency: usize,
    /// Jobs claimed ahead of a free handler (bounded prefetch).
    pub prefetch: usize,
    /// Return once the queue is drained ([`crate::core::job::drained`]: no
    /// job ready, running, or due, retries in backoff included).
    pub drain: bool,
    /// Longest sleep between claims when the queue is empty. A push, a
    /// retry or a job given back announced by the store (in any process:
    /// SQLite's and the file store's doorbell, PostgreSQL's NOTIFY) cuts
    /// it short, and an empty claim says when the queue next changes by
    /// time alone (a retry or a delayed job falls due, a claim runs out),
    /// which cuts it short too: polling is only the fallback (default 1 s).
    pub idle_poll: Duration,
    /// Longest an outcome waits for others to share its transaction.
    pub flush_delay: Duration,
    /// Renewal round interval (`None`: a third of the lease, at most a
    /// second, so a cancel reaches the handler within a second).
    pub heartbeat: Option<Duration>,
    /// After `stop`: how long running handlers may finish before their jobs
    /// are given back (to be retried) and [`ClaimedJob::is_valid`] turns false.
    pub shutdown_grace: Duration,
    /// Sample the queue's jobs per state this often for the
    /// `leasehold_queue_jobs` gauge (`None`: never; each sample is a
    /// transaction that counts the queue).
    pub sample: Option<Duration>,
    /// Fire the queue's schedules ([`Queue::schedule`]): each tick as it
    /// comes due, and a look at least this often for schedules added or
    /// changed elsewhere (`None`: this worker fires none).
    pub schedules: Option<Duration>,
}

impl WorkOptions {
    /// The most handlers a worker loop runs at once (a larger
    /// `concurrency` is taken as this).
    pub const MAX_CONCURRENCY: usize = 1024;
}

impl Default for WorkOptions {
    fn default() -> Self {
        WorkOptions {
            lease: Duration::from_secs(30),
            batch: 128,
            concurrency: 1,
            prefetch: 1,
            drain: false,
            idle_poll: Duration::from_secs(1),
            flush_delay: Duration::from_millis(1),
            heartbeat: None,
            shutdown_grace: Duration::from_secs(30),
            sample: None,
            schedules: Some(Duration::from_secs(5)),
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
    pub(crate) fn count(&mut self, outcome: JobOutcome) {
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

/// A handler's result: its claim and the outcome.
type Done = (ClaimId, HandlerOutcome);

/// What the driver is woken for.
#[derive(Default)]
struct Inbox {
    /// Handler results.
    done: Vec<Done>,
    /// The store's answers to the machine's requests.
    replies: Vec<WorkerReply>,
    /// The store announced a job made ready.
    woke: bool,
    /// The driver sleeps on the condvar: a delivery wakes it (and clears
    /// this, so that the deliveries before it runs make no system call).
    waiting: bool,
}

impl Inbox {
    fn is_empty(&self) -> bool {
        self.done.is_empty() && self.replies.is_empty() && !self.woke
    }
}

/// What the driver, the handler threads, the store threads and the waker
/// share.
struct Shared {
    inbox: Mutex<Inbox>,
    inbox_cv: Condvar,
    /// Jobs waiting for a handler thread.
    pool: Channel<Arc<ClaimedJob>>,
    /// Requests waiting for a store thread.
    requests: Channel<WorkerRequest>,
}

impl Shared {
    fn deliver(&self, f: impl FnOnce(&mut Inbox)) {
        let mut inbox = lock(&self.inbox);
        f(&mut inbox);
        let wake = std::mem::take(&mut inbox.waiting);
        // After the lock is let go: woken, the driver takes it at once.
        drop(inbox);
        if wake {
            self.inbox_cv.notify_one();
        }
    }
}

/// Most store threads: a claim, a renewal round, a settle batch and a
/// drain check or sample may be in flight at once (the machine allows one
/// of each); as many run as the store gains from
/// ([`Store::concurrent_txns`](crate::Store::concurrent_txns)), the rest
/// wait their turn in order (the tokio loop's limit too).
pub(crate) const STORE_THREADS: usize = 3;

/// How often an idle driver looks at the stop flag (it is a plain flag:
/// nothing wakes the driver when it is set).
const STOP_POLL_MS: u64 = 200;

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
        let shared = Arc::new(Shared {
            inbox: Mutex::new(Inbox::default()),
            inbox_cv: Condvar::new(),
            pool: Channel::new(),
            requests: Channel::new(),
        });
        let quit = Arc::new(AtomicBool::new(false));
        let threads = opts.concurrency.clamp(1, WorkOptions::MAX_CONCURRENCY);
        let driver = Driver::new(self, opts, &shared);
        let exec = driver.session.exec().clone();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| handler_thread(&shared, &handler));
            }
            let store_threads = self.client.store().concurrent_txns();
            for _ in 0..store_threads.clamp(1, STORE_THREADS) {
                s.spawn(|| {
                    while let Some(request) = shared.requests.pop() {
                        let reply = exec.run(request);
                        shared.deliver(|inbox| inbox.replies.push(reply));
                    }
                });
            }
            // Started last: started first, it made the one-handler loop
            // about 15 % slower (measured; thread placement on 2 cores).
            let waker = shared.clone();
            let woken = spawn_waker(
                self.client.store().clone(),
                Wake::JobReady,
                quit.clone(),
                move || waker.deliver(|inbox| inbox.woke = true),
            );
            let result = woken.and_then(|()| driver.run(stop, &observe));
            quit.store(true, Ordering::SeqCst);
            shared.pool.close();
            shared.requests.close();
            result
        })
    }
}

fn handler_thread(
    shared: &Shared,
    handler: &(impl Fn(&ClaimedJob) -> std::result::Result<(), String> + Sync),
) {
    while let Some(job) = shared.pool.pop() {
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(&job)));
        let result = run.unwrap_or_else(|payload| {
            let text = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(format!("the handler panicked: {text}"))
        });
        let outcome = match result {
            Ok(()) => HandlerOutcome::Completed(job.take_result()),
            Err(reason) => HandlerOutcome::Failed(reason),
        };
        let claim = ClaimId::of(job.record());
        shared.deliver(|inbox| inbox.done.push((claim, outcome)));
    }
}

struct Driver<'a> {
    opts: &'a WorkOptions,
    shared: &'a Shared,
    session: Session,
    stopping: bool,
}

impl<'a> Driver<'a> {
    fn new(queue: &'a Queue, opts: &'a WorkOptions, shared: &'a Shared) -> Self {
        Driver {
            opts,
            shared,
            session: Session::new(&queue.client, &queue.name, opts),
            stopping: false,
        }
    }

    fn run(
        mut self,
        stop: &AtomicBool,
        observe: &(impl Fn(&JobRecord, JobOutcome) + Sync),
    ) -> Result<WorkReport> {
        loop {
            let now = self.session.now();
            let machine = &mut self.session.machine;
            // The stop flag first: a handler that finished because of the
            // same shutdown must not free a slot for a queued job.
            if !self.stopping && stop.load(Ordering::SeqCst) {
                self.stopping = true;
                let grace = ms_of(self.opts.shutdown_grace);
                machine.shutdown(now, now.saturating_add(grace));
            }
            let inbox = std::mem::take(&mut *lock(&self.shared.inbox));
            for (claim, result) in inbox.done {
                machine.handler_done(now, claim, result);
            }
            if inbox.woke {
                machine.wake(now);
            }
            for reply in inbox.replies {
                self.session.reply(reply);
            }
            self.session.machine.handle_timeout(now);
            while let Some(next) = self.session.next(observe) {
                match next {
                    Next::Send(request) => self.shared.requests.push(request),
                    Next::Start(job) => self.shared.pool.push(job),
                    // The handler sees its handle turn invalid.
                    Next::Stop(..) => {}
                    Next::End(end) => return end,
                }
            }
            self.wait();
        }
    }

    /// Sleep until the machine's next timeout, a handler result or a
    /// store reply, at most [`STOP_POLL_MS`] (the stop flag is polled).
    fn wait(&self) {
        let now = self.session.now();
        let until = self.session.machine.poll_timeout().unwrap_or(LocalMs::MAX);
        let ms = until.saturating_sub(now).clamp(0, STOP_POLL_MS);
        if ms == 0 {
            return;
        }
        let mut inbox = lock(&self.shared.inbox);
        if !inbox.is_empty() {
            return;
        }
        inbox.waiting = true;
        let mut inbox = crate::sync::nap(
            &self.shared.inbox_cv,
            &self.shared.inbox,
            inbox,
            Duration::from_millis(ms),
        );
        inbox.waiting = false;
    }
}
