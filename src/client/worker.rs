//! The sync worker loop: a thin driver of [`WorkerMachine`]. The machine
//! sits behind one lock and whichever thread has news steps it: a handler
//! thread its handler's result (and it takes the next job the machine
//! starts, so a fast job costs no thread switch), a store thread the
//! answer to a request, the calling thread (the driver) a due timer, the
//! stop flag or a wake-up (a [`Stop`] that can wake the driver does so
//! when set, even from `observe`; a plain flag is looked at every 200 ms
//! while idle). Store threads run the machine's transactions (a claim, a
//! renewal round, a settle batch and a drain check may be in flight at
//! once: the machine allows one of each; as many threads as the store
//! gains from, one on SQLite); `concurrency` handler threads run
//! the handler; a waker thread turns the store's "job ready" wake-ups
//! into [`WorkerMachine::wake`]. Every timing rule is the machine's. A
//! hand-off between these threads notifies only a thread that sleeps,
//! after the lock is let go.
//!
//! The end: once a step ends the loop (the machine's end, or a panic of a
//! step or a store call), nothing steps it again ([`Core::over`]), what
//! the ending step sent and started is dropped, the requests still queued
//! are dropped, not sent (a claim sent then would take jobs nobody runs;
//! an outcome not yet committed is lost, and its job runs again once its
//! claim runs out), and no queued job starts. (A request a store thread
//! took, or a job a handler thread took, just before the end was already
//! on its way.)
//! After a panic, every handle still out turns invalid, so a handler
//! still running stops ([`Session::stop_running`]). `work` returns once
//! every handler has returned.
//!
//! Measured with 8 no-op handlers on SQLite (BENCHMARKS.md): with one
//! driver thread that every result went through, the loop made 1.2 thread
//! switches and 1.9 futex calls per job; stepped where the news is, 0.08
//! and 0.18, and the store thread is the one left busy.

use super::channel::{spawn_waker, Channel};
use super::job::ClaimedJob;
use super::machine::{ClaimId, HandlerOutcome, JobOutcome, WorkerRequest};
use super::ms_of;
use super::queue::Queue;
use super::session::{Next, Session};
use super::stop::Stop;
#[cfg(doc)]
use super::stop::StopSignal;
#[cfg(doc)]
use super::work_options::fit_reason;
use super::work_options::{WorkOptions, WorkReport};
use crate::core::JobRecord;
use crate::error::Result;
use crate::store::Wake;
use crate::sync::{caught, lock, panic_text, Condvar, Mutex, Panic};
use crate::time::LocalMs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The loop's state, stepped by whichever thread has news: a handler
/// thread with its handler's result, a store thread with a reply, the
/// driver (the calling thread) when a timer is due, a wake-up came or
/// the stop flag may be set. Stepping where the news is, instead of
/// handing it to one driver thread, spares a fast job two thread
/// switches: its handler thread records the outcome and takes the next
/// job itself.
struct Core {
    session: Session,
    /// Shutdown begun (the stop flag seen).
    stopping: bool,
    /// The store announced a job made ready (the waker thread sets this:
    /// it outlives the loop's borrows, so it cannot step).
    woke: bool,
    /// The stop flag woke the driver (its waker sets this): it steps to
    /// look at the flag.
    nudged: bool,
    /// When the sleeping driver wakes by itself (`None`: it is awake). A
    /// step that arms an earlier timer or ends the loop wakes it.
    driver_until: Option<LocalMs>,
    /// The loop has ended (or a step panicked): nothing steps it again.
    over: bool,
    /// How the loop ended, once a step found out, for the driver.
    end: Option<Result<WorkReport>>,
    /// A panic of a step (`observe` is the user's code in it) or of a
    /// store call, on any thread, resumed by the driver.
    panic: Option<Panic>,
    /// What a step sends and starts, handed on after it (kept between
    /// steps, empty, so that a step allocates nothing for them).
    sends: Vec<WorkerRequest>,
    starts: Vec<Arc<ClaimedJob>>,
}

impl Core {
    /// Count the driver as woken: whether it slept (then notify it, after
    /// letting go of the lock).
    fn rouse(&mut self) -> bool {
        self.driver_until.take().is_some()
    }
}

/// What the driver shares with the waker thread.
struct Hub {
    core: Mutex<Core>,
    driver_cv: Condvar,
    /// The stop flag woke the loop from inside a step of this same thread
    /// (`observe` set it, or a [`Stop`] woke from `is_set`), which holds
    /// the core's lock: the step turns it into [`Core::nudged`] before it
    /// lets go.
    stop_pending: AtomicBool,
}

thread_local! {
    /// The [`Hub`] (its address) whose core this thread holds locked in
    /// [`Shared::step`], 0 if none.
    static STEPPING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl Hub {
    /// Wake the driver if it sleeps, after `news` marks why.
    fn rouse(&self, news: impl FnOnce(&mut Core)) {
        let mut core = lock(&self.core);
        news(&mut core);
        let rouse = core.rouse();
        drop(core);
        if rouse {
            self.driver_cv.notify_one();
        }
    }

    /// This hub's address, as [`STEPPING`] holds it.
    fn address(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }
}

/// The driver's waker for a [`Stop`] that can wake it.
struct StopWake(Arc<Hub>);

impl std::task::Wake for StopWake {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        let hub = &self.0;
        if STEPPING.with(std::cell::Cell::get) == hub.address() {
            // This thread holds the core's lock (set from `observe`):
            // taking it again would never return.
            hub.stop_pending.store(true, Ordering::Relaxed);
        } else {
            hub.rouse(|core| core.nudged = true);
        }
    }
}

/// Marks this thread as stepping `hub` while it lives (see [`STEPPING`]).
struct Stepping;

impl Stepping {
    fn enter(hub: &Hub) -> Stepping {
        STEPPING.with(|s| s.set(hub.address()));
        Stepping
    }
}

impl Drop for Stepping {
    fn drop(&mut self) {
        STEPPING.with(|s| s.set(0));
    }
}

/// Takes the loop's waker off its stop flag when the loop ends, however
/// it ends.
struct Watch<'a> {
    stop: &'a dyn Stop,
    waker: std::task::Waker,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.stop.unwatch(&self.waker);
    }
}

/// What the driver, the handler threads and the store threads share.
struct Shared<'a, O> {
    hub: Arc<Hub>,
    /// Jobs waiting for a handler thread.
    pool: Channel<Arc<ClaimedJob>>,
    /// Requests waiting for a store thread.
    requests: Channel<WorkerRequest>,
    stop: &'a dyn Stop,
    /// The stop flag wakes the driver when set: no need to look at it.
    stop_wakes: bool,
    grace_ms: u64,
    observe: &'a O,
    /// [`Core::over`], read without the lock: set by the step that ends
    /// the loop, before that step's thread takes anything more.
    ended: AtomicBool,
}

/// Most store threads: a claim, a renewal round, a settle batch and a
/// drain check or sample may be in flight at once (the machine allows one
/// of each); as many run as the store gains from
/// ([`Store::concurrent_txns`](crate::Store::concurrent_txns)), the rest
/// wait their turn in order (the tokio loop's limit too).
pub(crate) const STORE_THREADS: usize = 3;

/// How often an idle driver looks at a stop flag that cannot wake it (a
/// plain [`AtomicBool`]).
const STOP_POLL_MS: u64 = 200;

/// The longest the driver sleeps when nothing (no timer of the machine,
/// no stop flag to look at) wakes it sooner: a backstop for what its nap
/// does not follow (a system suspend, which the nap's clock does not
/// count and the local clock does; a manual clock), not a rule: the
/// default `idle_poll`'s length, so an idle loop sleeps undisturbed
/// until its backstop claim (a timer in hand, a renewal of a held job, is
/// never more than a second away).
const IDLE_NAP_MS: u64 = 30_000;

impl Queue {
    /// Claim and run jobs until `stop` is set (or, with `drain`, until the
    /// queue is drained), `opts.concurrency` at a time. A [`StopSignal`]
    /// (or any [`Stop`] that can wake the loop) is acted on the moment it
    /// is set, and an idle loop sleeps until its next claim or the signal;
    /// a plain [`AtomicBool`] is looked at every 200 ms while the loop is
    /// idle. The handler's `Ok`
    /// completes a job, `Err(reason)` fails it (a reason longer than the
    /// store takes is cut: [`fit_reason`]); a panicking handler fails its
    /// job. Claims come in batches, outcomes are committed in batches, and
    /// every held job is renewed in one transaction per round; a handler
    /// checks [`ClaimedJob::is_valid`] before each protected action (false
    /// once the claim is lost, the job cancelled or given back).
    pub fn work(
        &self,
        opts: &WorkOptions,
        stop: &dyn Stop,
        handler: impl Fn(&ClaimedJob) -> std::result::Result<(), String> + Sync,
    ) -> Result<WorkReport> {
        self.work_with(opts, stop, handler, |_, _| {})
    }

    /// [`Queue::work`], calling `observe` with each job's outcome once it
    /// is recorded (or known lost), on whichever of the loop's threads
    /// learnt it, one call at a time. Transient store trouble is waited
    /// out; any other store error stops the loop and is returned.
    /// `work_with` returns once every handler call has returned; a panic
    /// of `observe`, or of a store call (a bug in a store), stops the loop
    /// and is resumed on the calling thread. A loop that has stopped sends
    /// none of its queued requests to the store (an outcome not committed
    /// yet is not recorded: its job runs again once its claim runs out,
    /// and `observe` is not called for it) and starts no queued job (what
    /// a thread took just before the end was already on its way). One stopped by
    /// a panic also turns the handles of the handlers still running
    /// invalid ([`ClaimedJob::is_valid`]); after a store error they stay
    /// valid to their claims' local deadlines (nothing renews them), so a
    /// job near its end may finish.
    pub fn work_with(
        &self,
        opts: &WorkOptions,
        stop: &dyn Stop,
        handler: impl Fn(&ClaimedJob) -> std::result::Result<(), String> + Sync,
        observe: impl Fn(&JobRecord, JobOutcome) + Sync,
    ) -> Result<WorkReport> {
        self.client.inner.fork.check()?;
        let session = Session::new(&self.client, &self.name, opts);
        let exec = session.exec().clone();
        let hub = Arc::new(Hub {
            core: Mutex::new(Core {
                session,
                stopping: false,
                woke: false,
                nudged: false,
                driver_until: None,
                over: false,
                end: None,
                panic: None,
                sends: Vec::new(),
                starts: Vec::new(),
            }),
            driver_cv: Condvar::new(),
            stop_pending: AtomicBool::new(false),
        });
        let watch = Watch {
            stop,
            waker: std::sync::Arc::new(StopWake(hub.clone())).into(),
        };
        let stop_wakes = stop.watch(&watch.waker);
        let shared = Shared {
            hub: hub.clone(),
            pool: Channel::new(),
            requests: Channel::new(),
            stop,
            stop_wakes,
            grace_ms: ms_of(opts.shutdown_grace),
            observe: &observe,
            ended: AtomicBool::new(false),
        };
        let threads = opts.concurrency.clamp(1, WorkOptions::MAX_CONCURRENCY);
        let ended = std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| handler_thread(&shared, &handler));
            }
            let store_threads = self.client.store().concurrent_txns();
            for _ in 0..store_threads.clamp(1, STORE_THREADS) {
                s.spawn(|| {
                    while let Some(request) = shared.requests.pop() {
                        if shared.ended.load(Ordering::SeqCst) {
                            continue;
                        }
                        // A store call that panicked ends the loop like a
                        // step that panicked: the driver resumes it.
                        let reply = caught(|| exec.run(request));
                        shared.step(false, |session, _| match reply {
                            Ok(reply) => session.reply(reply),
                            Err(panic) => std::panic::resume_unwind(panic),
                        });
                    }
                });
            }
            // Started last: started first, it made the one-handler loop
            // about 15 % slower (measured; thread placement on 2 cores).
            let woken = spawn_waker(self.client.store().clone(), Wake::JobReady, move || {
                hub.rouse(|core| core.woke = true)
            });
            let ended = match woken {
                // The waker stops (interrupted) as the driver returns.
                Ok(_waker) => shared.drive(),
                Err(e) => Ok(Err(e)),
            };
            shared.ended.store(true, Ordering::SeqCst);
            if ended.is_err() {
                lock(&shared.hub.core).session.stop_running();
            }
            shared.pool.close();
            shared.requests.close();
            ended
        });
        ended.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }
}

/// Run `handler` on `job`: its outcome (a panic fails the job).
fn run_handler(
    handler: &(impl Fn(&ClaimedJob) -> std::result::Result<(), String> + Sync),
    job: &ClaimedJob,
) -> HandlerOutcome {
    let result = caught(|| handler(job))
        .unwrap_or_else(|payload| Err(format!("the handler panicked: {}", panic_text(&payload))));
    match result {
        Ok(()) => HandlerOutcome::Completed(job.take_result()),
        Err(reason) => HandlerOutcome::Failed(reason),
    }
}

/// Run jobs until the pool closes; after each, record its outcome and
/// take the next job the machine starts, if any, without a hand-off.
fn handler_thread<O: Fn(&JobRecord, JobOutcome) + Sync>(
    shared: &Shared<'_, O>,
    handler: &(impl Fn(&ClaimedJob) -> std::result::Result<(), String> + Sync),
) {
    let mut next = shared.next_job();
    while let Some(job) = next {
        if shared.ended.load(Ordering::SeqCst) {
            // Taken as the loop ended: not run.
            break;
        }
        let outcome = run_handler(handler, &job);
        let claim = ClaimId::of(job.record());
        drop(job);
        next = shared
            .step(true, |session, now| {
                session.machine.handler_done(now, claim, outcome)
            })
            .or_else(|| shared.next_job());
    }
}

impl<O: Fn(&JobRecord, JobOutcome) + Sync> Shared<'_, O> {
    /// The next job from the pool, waiting for one; `None` once the pool
    /// closes. A job queued when the loop ended is dropped, not run.
    fn next_job(&self) -> Option<Arc<ClaimedJob>> {
        while let Some(job) = self.pool.pop() {
            if !self.ended.load(Ordering::SeqCst) {
                return Some(job);
            }
        }
        None
    }

    /// Feed the machine `event` at the local now (read under the lock, so
    /// every thread's steps see time in order), after the stop flag and
    /// any wake-up, then do what it says: requests go to the store
    /// threads, started jobs to the handler threads (with `keep`, the
    /// caller, a handler thread, takes the oldest waiting one), the end
    /// and a panic (of `observe`, or of the step itself) to the driver.
    /// The driver is woken when it must act sooner than it planned.
    /// Nothing is stepped once the loop has ended.
    fn step(
        &self,
        keep: bool,
        event: impl FnOnce(&mut Session, LocalMs),
    ) -> Option<Arc<ClaimedJob>> {
        let mut guard = lock(&self.hub.core);
        // Only a stop that wakes the driver can wake it from this step.
        let stepping = self.stop_wakes.then(|| Stepping::enter(&self.hub));
        let core = &mut *guard;
        if core.over {
            return None;
        }
        // What the step sends and starts, handed on only if it did not
        // end the loop.
        let mut sends = std::mem::take(&mut core.sends);
        let mut starts = std::mem::take(&mut core.starts);
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let now = core.session.now();
            let machine = &mut core.session.machine;
            // The stop flag first: a handler that finished because of the
            // same shutdown must not free a slot for a queued job.
            if !core.stopping && self.stop.is_set() {
                core.stopping = true;
                machine.shutdown(now, now.saturating_add(self.grace_ms));
            }
            if std::mem::take(&mut core.woke) {
                machine.wake(now);
            }
            event(&mut core.session, now);
            core.session.machine.handle_timeout(now);
            while let Some(next) = core.session.next(self.observe) {
                match next {
                    Next::Send(request) => sends.push(request),
                    Next::Start(job) => starts.push(job),
                    // The handler sees its handle turn invalid.
                    Next::Stop(..) => {}
                    Next::End(end) => return Some(end),
                }
            }
            None
        }));
        match stepped {
            Ok(end) => core.end = end,
            Err(panic) => core.panic = Some(panic),
        }
        core.over = core.end.is_some() || core.panic.is_some();
        let mut kept = None;
        if core.over {
            self.ended.store(true, Ordering::SeqCst);
            sends.clear();
            starts.clear();
        } else {
            for request in sends.drain(..) {
                self.requests.push(request);
            }
            for job in starts.drain(..) {
                if keep && kept.is_none() {
                    kept = Some(self.pool.swap(job));
                } else {
                    self.pool.push(job);
                }
            }
        }
        (core.sends, core.starts) = (sends, starts);
        let sooner = |until| {
            core.over
                || core
                    .session
                    .machine
                    .poll_timeout()
                    .is_some_and(|t| t < until)
        };
        // A stop set during the step, on this thread (so read in program
        // order, no fence needed): the driver looks.
        let stopped = self.hub.stop_pending.load(Ordering::Relaxed)
            && self.hub.stop_pending.swap(false, Ordering::Relaxed);
        core.nudged |= stopped;
        let rouse = (stopped || core.driver_until.is_some_and(sooner)) && core.rouse();
        drop(stepping);
        drop(guard);
        if rouse {
            self.hub.driver_cv.notify_one();
        }
        kept
    }

    /// The calling thread's part: step when a timer is due, a wake-up
    /// came or the stop flag was set (a flag that cannot wake the driver
    /// is looked at every [`STOP_POLL_MS`]), sleep otherwise (at most
    /// [`IDLE_NAP_MS`]); return how the loop ended, or the panic that
    /// ended it (resumed by the caller once the threads are done).
    fn drive(&self) -> std::thread::Result<Result<WorkReport>> {
        loop {
            self.step(false, |_, _| {});
            let mut core = lock(&self.hub.core);
            if let Some(panic) = core.panic.take() {
                return Err(panic);
            }
            if let Some(end) = core.end.take() {
                return Ok(end);
            }
            if core.woke || std::mem::take(&mut core.nudged) {
                continue;
            }
            let now = core.session.now();
            let until = core.session.machine.poll_timeout().unwrap_or(LocalMs::MAX);
            let most = if self.stop_wakes {
                IDLE_NAP_MS
            } else {
                STOP_POLL_MS
            };
            let ms = until.saturating_sub(now).min(most);
            if ms == 0 {
                continue;
            }
            core.driver_until = Some(now.saturating_add(ms));
            let mut core = crate::sync::nap(
                &self.hub.driver_cv,
                &self.hub.core,
                core,
                Duration::from_millis(ms),
            );
            core.driver_until = None;
        }
    }
}
