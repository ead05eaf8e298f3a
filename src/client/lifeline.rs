//! [`Lifeline`]: the shared validity record of one lease guard or claimed
//! job, and its keep-alive thread. The rules (the local deadline, when to
//! renew, what a reply means) are the [`Lifetime`] machine's; this is its
//! driver: a mutex around the machine, a thread that sleeps until the
//! machine's next timeout and performs the renewal it asks for, and the
//! loss callback, called exactly once.
//!
//! A renewal never revives a released lease or a settled claim: the store
//! only extends a live grant named by holder and token, and release waits
//! for the thread to stop before it writes.

use super::machine::{End, Lifetime};
use crate::clock::Clock;
use crate::error::{Error, LostReason, Result, Target};
use crate::fork::ForkGuard;
use crate::sync::{lock, thread, Condvar, Mutex, MutexGuard};
use crate::time::LocalMs;
use std::sync::Arc;

/// Called once when a lease or claim is lost.
pub(crate) type OnLost = Box<dyn FnOnce(Error) + Send>;

/// A renewal: given the local deadline (retry no later), renew; `Ok` says
/// whether a cancel was requested (jobs).
pub(crate) type RenewFn = Box<dyn FnMut(LocalMs) -> Result<bool> + Send>;

/// What a lifeline keeps alive, as [`Target`] names it in errors (built
/// only when one is made: a lease's key is shared, not copied per grant).
pub(crate) enum Owner {
    Lease { key: Arc<str>, token: u64 },
    Job(Target),
}

pub(crate) struct Lifeline {
    owner: Owner,
    state: Mutex<LineState>,
    wake: Condvar,
    /// Wakes a keep-alive task (the tokio driver) as `wake` wakes the thread.
    #[cfg(all(feature = "tokio", not(loom)))]
    pub(crate) notify: ::tokio::sync::Notify,
    pub(crate) fork: ForkGuard,
}

struct LineState {
    life: Lifetime,
    cancel_requested: bool,
    thread_running: bool,
    /// The keep-alive is a task its owner awaits: [`Lifeline::join`] must
    /// not block a thread the task may need.
    task: bool,
    thread: Option<thread::ThreadId>,
    on_lost: Option<OnLost>,
}

/// Clears `thread_running` when the keep-alive thread ends, even by panic,
/// so that `join` never waits forever.
struct RunningFlag(Arc<Lifeline>);

impl Drop for RunningFlag {
    fn drop(&mut self) {
        self.0.disarm();
    }
}

impl Lifeline {
    /// The record of `owner`'s grant, made in the process `fork` was
    /// taken in (its creator's: the client's guard, so no `getpid` per
    /// grant, and a fork since the client was made counts too).
    pub(crate) fn new(owner: Owner, life: Lifetime, fork: ForkGuard) -> Arc<Lifeline> {
        Arc::new(Lifeline {
            owner,
            state: Mutex::new(LineState {
                life,
                cancel_requested: false,
                thread_running: false,
                task: false,
                thread: None,
                on_lost: None,
            }),
            wake: Condvar::new(),
            #[cfg(all(feature = "tokio", not(loom)))]
            notify: ::tokio::sync::Notify::new(),
            fork,
        })
    }

    /// Valid in this process, not ended, before the local deadline.
    pub(crate) fn is_valid(&self, now: LocalMs) -> bool {
        // The fork check comes first: in a child, the mutex may have been
        // copied locked by a keep-alive thread that does not exist there.
        self.fork.is_origin() && lock(&self.state).life.is_valid(now)
    }

    pub(crate) fn deadline(&self) -> LocalMs {
        lock(&self.state).life.deadline()
    }

    /// Time left at `now_ms` before the local deadline (zero if not valid).
    pub(crate) fn remaining(&self, now: LocalMs) -> std::time::Duration {
        if !self.is_valid(now) {
            return std::time::Duration::ZERO;
        }
        std::time::Duration::from_millis(self.deadline().saturating_sub(now))
    }

    pub(crate) fn lost(&self) -> Option<LostReason> {
        if !self.fork.is_origin() {
            return None;
        }
        match lock(&self.state).life.end() {
            Some(End::Lost(reason)) => Some(reason),
            _ => None,
        }
    }

    pub(crate) fn cancel_requested(&self) -> bool {
        self.fork.is_origin() && lock(&self.state).cancel_requested
    }

    /// The key of the lease this lifeline keeps (its guard reads it here:
    /// one count on the key per grant, not two). A job's has none: empty.
    pub(crate) fn key(&self) -> &str {
        match &self.owner {
            Owner::Lease { key, .. } => key,
            Owner::Job(_) => "",
        }
    }

    /// What this lifeline keeps alive, as errors name it.
    pub(crate) fn target(&self) -> Target {
        match &self.owner {
            Owner::Lease { key, token } => Target::Lease {
                key: key.to_string(),
                token: *token,
            },
            Owner::Job(target) => target.clone(),
        }
    }

    pub(crate) fn lost_error(&self, reason: LostReason) -> Error {
        Error::Lost {
            target: self.target(),
            reason,
        }
    }

    /// Check the handle may act: same process (`strict`: also by pid, for
    /// calls that would release or settle), not finished, not lost.
    pub(crate) fn check_usable(&self, strict: bool) -> Result<()> {
        if strict {
            self.fork.check_strict()?;
        } else {
            self.fork.check()?;
        }
        let end = lock(&self.state).life.end();
        self.usable(end)
    }

    /// What a grant that ended so (or not at all) says to a call that
    /// would act on it.
    fn usable(&self, end: Option<End>) -> Result<()> {
        match end {
            Some(End::Finished) => Err(self.lost_error(LostReason::StaleToken)),
            Some(End::Lost(reason)) => Err(self.lost_error(reason)),
            None => Ok(()),
        }
    }

    /// Record a renewal's outcome: sent at `sent_at`, answered at `now`.
    /// `scheduled`: it was the keep-alive's own (in flight in the machine).
    pub(crate) fn record(&self, sent_at: LocalMs, now: LocalMs, outcome: &Result<bool>) {
        let mut st = lock(&self.state);
        let lost = match outcome {
            Ok(cancel) => {
                st.life.renewed(sent_at, now);
                st.cancel_requested |= *cancel;
                None
            }
            Err(Error::Lost { reason, .. }) => st.life.refused(sent_at, *reason),
            Err(_) => {
                st.life.renewal_failed(sent_at, now);
                st.life.handle_timeout(now)
            }
        };
        if let Some(reason) = lost {
            self.report_loss(st, reason);
        }
    }

    /// Seen lost by someone else (a worker loop's renewal round).
    pub(crate) fn mark_lost(&self, reason: LostReason) {
        let mut st = lock(&self.state);
        if let Some(reason) = st.life.mark_lost(reason) {
            self.report_loss(st, reason);
        }
    }

    /// Renewed by someone else: valid until `deadline` (local).
    pub(crate) fn extend_to(&self, deadline: LocalMs) {
        lock(&self.state).life.extend_to(deadline);
    }

    /// A cancel was requested (seen by a renewal).
    pub(crate) fn set_cancel(&self) {
        lock(&self.state).cancel_requested = true;
    }

    /// Declare the loss if the local deadline has passed; true once ended.
    fn check_deadline(
        &self,
        st: &mut MutexGuard<'_, LineState>,
        now: LocalMs,
    ) -> Option<LostReason> {
        st.life.handle_timeout(now)
    }

    fn report_loss(&self, mut st: MutexGuard<'_, LineState>, reason: LostReason) {
        crate::observe::lost(&self.target(), reason);
        let callback = st.on_lost.take();
        self.notify_all();
        drop(st);
        if let Some(callback) = callback {
            callback(self.lost_error(reason));
        }
    }

    /// [`Lifeline::check_usable`] (strictly) and [`Lifeline::finish`]
    /// under one lock, for a release, called once (its caller marks itself
    /// released first: a grant lost at its local deadline stays lost, so a
    /// second call would say to release it again): `Err` only in a forked
    /// child (then nothing is touched). The caller [`Lifeline::join`]s the keep-alive
    /// if [`Ending::keep_alive`] says one ran: none can start once the
    /// grant has ended.
    pub(crate) fn end_strict(&self) -> Result<Ending> {
        self.fork.check_strict()?;
        let mut st = lock(&self.state);
        let ended = st.life.end();
        let release = st.life.may_be_live_in_store();
        st.life.finish();
        st.on_lost = None;
        let keep_alive = st.thread_running;
        if keep_alive {
            self.notify_all();
        }
        drop(st);
        Ok(Ending {
            usable: self.usable(ended),
            release,
            keep_alive,
        })
    }

    /// Mark finished (released, completed, failed); stops the keep-alive.
    /// Returns false if it had ended already (lost or finished).
    pub(crate) fn finish(&self) -> bool {
        let mut st = lock(&self.state);
        let was_live = st.life.finish();
        st.on_lost = None;
        // Only a keep-alive (its nap) or a join of it waits on `wake`, and
        // both only while one runs: otherwise no futex call.
        if st.thread_running {
            self.notify_all();
        }
        was_live
    }

    fn notify_all(&self) {
        self.wake.notify_all();
        #[cfg(all(feature = "tokio", not(loom)))]
        self.notify.notify_one();
    }

    /// Wait until the keep-alive thread has exited (unless called from it;
    /// a keep-alive task is awaited by its owner instead).
    pub(crate) fn join(&self) {
        let mut st = lock(&self.state);
        // Most guards never start a keep-alive: no thread handle to fetch.
        if !st.thread_running || st.task || st.thread == Some(thread::current().id()) {
            return;
        }
        while st.thread_running {
            st = match self.wake.wait(st) {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
        }
    }

    /// Set the loss callback of a keep-alive about to start (`task`: a
    /// tokio task, awaited by its owner); false (and nothing set) if one
    /// runs already or the grant has ended.
    pub(crate) fn arm(&self, on_lost: OnLost, task: bool) -> bool {
        let mut st = lock(&self.state);
        if st.thread_running || st.life.end().is_some() {
            return false;
        }
        st.thread_running = true;
        st.task = task;
        st.on_lost = Some(on_lost);
        true
    }

    /// The keep-alive's next step at `now`: the one decision both drivers
    /// (the thread here, the tokio task) follow. A passed deadline is
    /// declared lost here (the callback runs), and a due renewal is marked
    /// sent.
    pub(crate) fn step(&self, now: LocalMs) -> Step {
        let mut st = lock(&self.state);
        if st.life.end().is_some() {
            return Step::Stop;
        }
        if let Some(reason) = self.check_deadline(&mut st, now) {
            self.report_loss(st, reason);
            return Step::Stop;
        }
        if st.life.renewal_due(now) {
            st.life.renewal_sent(now);
            return Step::Renew {
                sent_at: now,
                deadline: st.life.deadline(),
            };
        }
        Step::SleepUntil(st.life.poll_timeout().unwrap_or(now))
    }

    /// The keep-alive driver ended (by any path).
    pub(crate) fn disarm(&self) {
        let mut st = lock(&self.state);
        st.thread_running = false;
        st.thread = None;
        self.notify_all();
    }

    /// Start the thread that renews when the machine says, until the grant
    /// ends; `on_lost` is called once if it is lost.
    pub(crate) fn spawn_keep_alive(
        self: &Arc<Self>,
        clock: Arc<dyn Clock>,
        mut renew: RenewFn,
        on_lost: OnLost,
    ) -> Result<()> {
        if !self.arm(on_lost, false) {
            return Ok(());
        }
        let me = Arc::clone(self);
        let spawned = thread::Builder::new()
            .name("leasehold-keepalive".to_owned())
            .spawn(move || {
                lock(&me.state).thread = Some(thread::current().id());
                let flag = RunningFlag(Arc::clone(&me));
                me.keep_alive_loop(&*clock, &mut renew);
                drop(flag);
            });
        if let Err(e) = spawned {
            lock(&self.state).on_lost = None;
            self.disarm();
            return Err(Error::store(
                "starting the keep-alive thread",
                e.to_string(),
            ));
        }
        Ok(())
    }

    fn keep_alive_loop(&self, clock: &dyn Clock, renew: &mut RenewFn) {
        loop {
            let now = LocalMs::read(clock);
            match self.step(now) {
                Step::Stop => return,
                Step::Renew { sent_at, deadline } => {
                    let outcome = renew(deadline);
                    self.record(sent_at, LocalMs::read(clock), &outcome);
                }
                Step::SleepUntil(until) => {
                    let st = lock(&self.state);
                    // Checked under the lock `finish` takes: its wake-up
                    // cannot slip between the step and the nap.
                    if st.life.end().is_none() {
                        let nap =
                            std::time::Duration::from_millis(until.saturating_sub(now).max(1));
                        drop(crate::sync::nap(&self.wake, &self.state, st, nap));
                    }
                }
            }
        }
    }
}

/// What [`Lifeline::end_strict`] found.
pub(crate) struct Ending {
    /// What [`Lifeline::check_usable`] would have said: `Err` (lost, or
    /// ended already), to be reported; `Ok` when this call ended a live
    /// grant.
    pub(crate) usable: Result<()>,
    /// The store may still count the grant live: release it by token
    /// (live, or lost only at the local deadline).
    pub(crate) release: bool,
    /// A keep-alive was running: join it.
    pub(crate) keep_alive: bool,
}

/// What a keep-alive does next ([`Lifeline::step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// The grant ended (finished or lost): stop.
    Stop,
    /// Renew now, retrying no later than `deadline`; record the outcome
    /// with `sent_at`.
    Renew {
        /// When the renewal was sent (local ms).
        sent_at: LocalMs,
        /// The local deadline.
        deadline: LocalMs,
    },
    /// Nothing to do before this local instant.
    SleepUntil(LocalMs),
}
