//! The async worker loop: a thin driver of the same `WorkerMachine` as the
//! sync loop (through the shared `Session`). The loop's task runs the
//! machine and sends its requests to the blocking pool, as many
//! at once as the store gains from ([`crate::Store::concurrent_txns`]: a
//! claim, a renewal round and a settle batch may overlap, the machine
//! allows one of each in flight); each
//! handler is a task of its own, cancelled (its future dropped) when the
//! machine stops its job; the store's "job ready" announcements arrive
//! through the client's watcher.

use super::{nap, ClaimedJob, Queue};
use crate::client::machine::{ClaimId, HandlerOutcome, JobOutcome, WorkerReply};
use crate::client::session::{Next, Session};
use crate::client::{ms_of, WorkOptions, WorkReport, STORE_THREADS};
use crate::core::JobRecord;
use crate::error::Result;
use crate::store::Wake;
use crate::sync::{caught, panic_text, Panic};
use crate::time::LocalMs;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;

/// A handler's result: its claim and the outcome.
type Done = (ClaimId, HandlerOutcome);

impl Queue {
    /// Claim and run jobs until `shutdown` resolves (or, with
    /// `opts.drain`, until the queue is drained), up to `opts.concurrency`
    /// handlers at once, each a task. The handler's `Ok` completes its
    /// job, `Err(reason)` fails it (a reason the store would refuse is cut:
    /// [`crate::fit_reason`]); a panicking handler fails its job. Claims,
    /// renewals and outcomes are batched as in [`crate::Queue::work`].
    ///
    /// A handler's future is dropped, and its token
    /// ([`ClaimedJob::cancellation`]) cancelled, when its claim is lost or
    /// its job cancelled. After `shutdown`: no more claims; running
    /// handlers have `opts.shutdown_grace` to finish, then their futures
    /// are dropped and their jobs given back (retried by another worker).
    /// Returns once every handler task has ended. A store call that panics
    /// (a bug in a store) stops the loop, and its panic resumes here. A
    /// loop that stops (a panic, or a store error) stops its running
    /// handlers, and sends no request still waiting for its turn (after a
    /// store error, one that got its turn as the failing call ended may
    /// still go).
    pub async fn work<F, Fut>(
        &self,
        opts: &WorkOptions,
        shutdown: impl Future<Output = ()> + Send,
        handler: F,
    ) -> Result<WorkReport>
    where
        F: Fn(ClaimedJob) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), String>> + Send + 'static,
    {
        self.work_with(opts, shutdown, handler, |_, _| {}).await
    }

    /// [`Queue::work`], calling `observe` with each job's outcome once it
    /// is recorded (or known lost).
    pub async fn work_with<F, Fut>(
        &self,
        opts: &WorkOptions,
        shutdown: impl Future<Output = ()> + Send,
        handler: F,
        observe: impl Fn(&JobRecord, JobOutcome) + Send + Sync,
    ) -> Result<WorkReport>
    where
        F: Fn(ClaimedJob) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), String>> + Send + 'static,
    {
        self.client.sync.check_fork()?;
        let mut driver = Driver {
            queue: self,
            session: Session::new(&self.client.sync, &self.sync.name, opts),
            handler: Arc::new(handler),
            running: HashMap::new(),
            tasks: JoinSet::new(),
            done: mpsc::unbounded_channel(),
            replies: mpsc::unbounded_channel(),
            turns: Arc::new(Semaphore::new(
                self.client
                    .sync
                    .store()
                    .concurrent_txns()
                    .clamp(1, STORE_THREADS),
            )),
        };
        let end = driver.run(opts, shutdown, &observe).await;
        // Normally every handler has reported; after a store error (or a
        // store call's panic) some may run still: stop them and wait. No
        // request still waiting for its turn goes to the store.
        driver.turns.close();
        driver.session.stop_running();
        for job in driver.running.values() {
            job.stop();
        }
        while driver.tasks.join_next().await.is_some() {}
        end.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }
}

/// The store's answer to a request, or the call's panic.
type Answer = std::result::Result<WorkerReply, Panic>;

struct Driver<'q, F> {
    queue: &'q Queue,
    session: Session,
    handler: Arc<F>,
    /// Handles of the claims whose handler runs, to stop them.
    running: HashMap<ClaimId, ClaimedJob>,
    tasks: JoinSet<()>,
    done: (mpsc::UnboundedSender<Done>, mpsc::UnboundedReceiver<Done>),
    replies: (
        mpsc::UnboundedSender<Answer>,
        mpsc::UnboundedReceiver<Answer>,
    ),
    /// Store requests running at once: a request waits for a permit (the
    /// order among waiting requests is not kept; none depends on another's).
    turns: Arc<Semaphore>,
}

/// A loop whose future is dropped (cancelled) sends no request still
/// waiting for its turn either.
impl<F> Drop for Driver<'_, F> {
    fn drop(&mut self) {
        self.turns.close();
    }
}

impl<F, Fut> Driver<'_, F>
where
    F: Fn(ClaimedJob) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<(), String>> + Send + 'static,
{
    /// Drive the machine until the loop ends, or until a store call
    /// panics (`Err`: its panic).
    async fn run(
        &mut self,
        opts: &WorkOptions,
        shutdown: impl Future<Output = ()> + Send,
        observe: &(dyn Fn(&JobRecord, JobOutcome) + Send + Sync),
    ) -> std::result::Result<Result<WorkReport>, Panic> {
        let mut ready = self.queue.client.subscribe(Wake::JobReady);
        let mut shutdown = std::pin::pin!(shutdown);
        let mut stopping = false;
        loop {
            let now = self.session.now();
            while let Ok((claim, result)) = self.done.1.try_recv() {
                self.handler_done(now, claim, result);
            }
            while let Ok(reply) = self.replies.1.try_recv() {
                self.session.reply(reply?);
            }
            self.session.machine.handle_timeout(now);
            while let Some(next) = self.session.next(observe) {
                match next {
                    // Requests of different kinds may overlap (one of each
                    // in flight), as many at once as `turns` allows.
                    Next::Send(request) => {
                        let exec = self.session.exec().clone();
                        let replies = self.replies.0.clone();
                        let turns = self.turns.clone();
                        drop(tokio::spawn(async move {
                            if let Ok(turn) = turns.clone().acquire_owned().await {
                                drop(tokio::task::spawn_blocking(move || {
                                    if turns.is_closed() {
                                        return;
                                    }
                                    let answer = caught(|| exec.run(request));
                                    // A panic ends the loop: the requests
                                    // waiting for this turn are not sent.
                                    if answer.is_err() {
                                        turns.close();
                                    }
                                    let _ = replies.send(answer);
                                    drop(turn);
                                }));
                            }
                        }));
                    }
                    Next::Start(job) => self.start(ClaimedJob::new(&self.queue.client, job)),
                    Next::Stop(claim, _) => {
                        if let Some(job) = self.running.get(&claim) {
                            job.stop();
                        }
                    }
                    Next::End(end) => return Ok(end),
                }
            }
            let now = self.session.now();
            let until = self.session.machine.poll_timeout().unwrap_or(LocalMs::MAX);
            if until <= now {
                continue;
            }
            // At most a minute: nothing is lost by looking again.
            let nap_ms = until.saturating_sub(now).min(60_000);
            tokio::select! {
                _ = nap(nap_ms) => {}
                Some((claim, result)) = self.done.1.recv() => {
                    self.handler_done(self.session.now(), claim, result);
                }
                Some(reply) = self.replies.1.recv() => self.session.reply(reply?),
                changed = ready.changed() => {
                    if changed.is_ok() {
                        self.session.machine.wake(self.session.now());
                    } else {
                        ready = self.queue.client.subscribe(Wake::JobReady);
                    }
                }
                _ = &mut shutdown, if !stopping => {
                    stopping = true;
                    let now = self.session.now();
                    let grace = ms_of(opts.shutdown_grace);
                    self.session.machine.shutdown(now, now.saturating_add(grace));
                }
            }
        }
    }

    fn handler_done(&mut self, now: LocalMs, claim: ClaimId, result: HandlerOutcome) {
        self.running.remove(&claim);
        self.session.machine.handler_done(now, claim, result);
    }

    /// Run the handler on `job` in a task of its own; its result (or its
    /// panic, or its cancellation) comes back on the channel.
    fn start(&mut self, job: ClaimedJob) {
        let claim = ClaimId::of(job.record());
        self.running.insert(claim, job.clone());
        let handler = self.handler.clone();
        let done = self.done.0.clone();
        self.tasks.spawn(async move {
            let stop = job.cancellation();
            let sync = job.sync_job().clone();
            let mut run = tokio::spawn(handler(job));
            let result = tokio::select! {
                joined = &mut run => match joined {
                    Ok(result) => result,
                    Err(e) if e.is_panic() => Err(format!("the handler panicked: {}", panic_text(&e.into_panic()))),
                    Err(_) => Err("the handler task was cancelled".to_owned()),
                },
                _ = stop.cancelled() => {
                    run.abort();
                    let _ = run.await;
                    Err("the handler was stopped: its claim was lost, its job cancelled, or the worker shut down".to_owned())
                }
            };
            let outcome = match result {
                Ok(()) => HandlerOutcome::Completed(sync.take_result()),
                Err(reason) => HandlerOutcome::Failed(reason),
            };
            let _ = done.send((claim, outcome));
        });
    }
}
