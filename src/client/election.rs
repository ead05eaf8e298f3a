//! Leader election for programs: [`Client::campaign`] runs an
//! [`ElectionMachine`] on a thread of its own and reports
//! [`LeaderEvent`]s; the leader's work gets a [`Leader`] handle (the
//! term's fencing token and its validity). The timing rules are the
//! machine's; [`ElectionSession`] is what the sync driver here and the
//! tokio driver (`leasehold::tokio`) share: the machine, the store side of
//! its requests, and what each of its events means for the leader's handle.

use super::acquire::mark_grant;
use super::channel::{spawn_waker, Channel};
use super::lifeline::{Lifeline, Owner};
use super::machine::{
    Deposed, ElectionAction, ElectionConfig, ElectionEvent, ElectionMachine, HolderReply,
    HolderRequest, Lifetime,
};
use super::{ms_of, Client, LeaseOptions};
use crate::core::{self, HolderInfo};
use crate::error::{LostReason, Result};
use crate::fork::ForkGuard;
use crate::store::{FirstRead, StoreExt, Wake};
use crate::sync::{caught, lock, thread, Mutex, Panic};
use crate::time::LocalMs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How to campaign ([`Client::campaign`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElectOptions {
    /// Each term's lease: renewed about every third of it while leading; a
    /// dead leader is replaced within about this long.
    pub ttl: Duration,
    /// Stop after the first term (lost or resigned) instead of campaigning
    /// again.
    pub once: bool,
}

impl ElectOptions {
    /// Campaign with terms of `ttl`, again and again.
    pub fn new(ttl: Duration) -> Self {
        ElectOptions { ttl, once: false }
    }

    /// Stop after the first term.
    pub fn once(mut self, once: bool) -> Self {
        self.once = once;
        self
    }
}

/// The leader's handle on its term: the fencing token to hand to whatever
/// leadership protects, and whether it may still act (L3: before the
/// term's local deadline, not deposed). Cheap to clone.
#[derive(Clone)]
pub struct Leader {
    client: Client,
    key: Arc<str>,
    token: u64,
    life: Arc<Lifeline>,
    #[cfg(all(feature = "tokio", not(loom)))]
    deposed: tokio_util::sync::CancellationToken,
}

impl std::fmt::Debug for Leader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leader")
            .field("key", &self.key)
            .field("token", &self.token)
            .finish()
    }
}

impl Leader {
    /// The election's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The term's fencing token: larger than every earlier leader's.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Whether the leader may act now: the term is not over and the local
    /// deadline (renewed by the election) has not passed. Check it before
    /// every protected action.
    pub fn is_valid(&self) -> bool {
        self.life.is_valid(self.client.local_now())
    }

    /// Time left before the local deadline (zero once not valid).
    pub fn remaining(&self) -> Duration {
        self.life.remaining(self.client.local_now())
    }

    /// How the term was lost, if it was (a resignation is not a loss).
    pub fn lost(&self) -> Option<LostReason> {
        self.life.lost()
    }

    /// Cancelled when the term ends (lost or resigned): for async work to
    /// `select!` on.
    #[cfg(all(feature = "tokio", not(loom)))]
    pub fn cancellation(&self) -> tokio_util::sync::CancellationToken {
        self.deposed.clone()
    }

    fn end(&self, why: Deposed) {
        match why {
            Deposed::Lost(reason) => self.life.mark_lost(reason),
            Deposed::Resigned => {
                self.life.finish();
            }
        }
        #[cfg(all(feature = "tokio", not(loom)))]
        self.deposed.cancel();
    }
}

/// What an election reports.
#[derive(Debug, Clone)]
pub enum LeaderEvent {
    /// This process leads: act through the handle while it is valid.
    Elected(Leader),
    /// This process no longer leads (once per term): stop acting.
    Deposed(Deposed),
    /// Another process leads (its holder id and label, token and expiry).
    NewLeader(HolderInfo),
}

/// What the driver must do for the election.
pub(crate) enum Next {
    /// Run this request ([`ElectionExec::run`]) and feed the reply back.
    Send(HolderRequest),
    /// Tell the application.
    Event(LeaderEvent),
    /// The election is over (resigned, once, or a store error).
    End(Result<()>),
}

/// The store side of an election's requests: one transaction each, one
/// attempt (the machine decides what an error means). `Send`, so a driver
/// may run it on another thread.
#[derive(Clone)]
pub(crate) struct ElectionExec {
    client: Client,
    key: Arc<str>,
    ttl_ms: u64,
}

impl ElectionExec {
    pub(crate) fn run(&self, request: HolderRequest) -> HolderReply {
        let (key, ttl_ms) = (&*self.key, self.ttl_ms);
        let id = self.client.holder().id;
        let store = self.client.store();
        match request {
            HolderRequest::Acquire => {
                HolderReply::Acquired(self.client.try_acquire_once(key, ttl_ms, 1))
            }
            HolderRequest::Renew { token } => HolderReply::Renewed(store.txn_reading(
                "renew",
                Some(FirstRead::Lease(key)),
                |tx| core::lease::renew(tx, key, id, token, ttl_ms),
            )),
            HolderRequest::Release { token } => HolderReply::Released(store.txn_reading(
                "release",
                Some(FirstRead::Lease(key)),
                |tx| core::lease::release(tx, key, id, token),
            )),
        }
    }
}

/// One campaigner's machine and its current term's handle.
pub(crate) struct ElectionSession {
    pub(crate) machine: ElectionMachine,
    exec: ElectionExec,
    current: Option<Leader>,
    /// The grant of this session that marks the key held by its client.
    marked: Option<u64>,
    done: bool,
}

impl ElectionSession {
    pub(crate) fn new(client: &Client, key: &str, opts: &ElectOptions) -> Result<Self> {
        let lease = client.holder_config(key, &LeaseOptions::new(opts.ttl))?;
        let cfg = ElectionConfig {
            lease,
            once: opts.once,
        };
        Ok(ElectionSession {
            machine: ElectionMachine::new(cfg, client.local_now()),
            exec: ElectionExec {
                client: client.clone(),
                key: Arc::from(key),
                ttl_ms: ms_of(opts.ttl),
            },
            current: None,
            marked: None,
            done: false,
        })
    }

    /// The local clock (ms).
    pub(crate) fn now(&self) -> LocalMs {
        self.exec.client.local_now()
    }

    /// The store side, to run requests with.
    pub(crate) fn exec(&self) -> &ElectionExec {
        &self.exec
    }

    /// The current term's handle, while leading.
    pub(crate) fn leader(&self) -> Option<Leader> {
        self.current.clone()
    }

    /// The store answered the request in flight (now). A grant marks the
    /// key held by this client ([`mark_grant`]) until the machine no
    /// longer holds it ([`ElectionSession::next`]).
    pub(crate) fn reply(&mut self, reply: HolderReply) {
        let now = self.now();
        let (reply, marked) = mark_grant(&self.exec.client, &self.exec.key, reply);
        self.marked = marked.or(self.marked);
        self.machine.handle_reply(now, reply);
        self.follow_deadline();
    }

    /// Time passed.
    pub(crate) fn timeout(&mut self) {
        let now = self.now();
        self.machine.handle_timeout(now);
        self.follow_deadline();
    }

    fn follow_deadline(&self) {
        if let (Some(leader), Some(deadline)) = (&self.current, self.machine.deadline()) {
            leader.life.extend_to(deadline);
        }
    }

    /// The election ends without its machine (a store call panicked):
    /// the current term ends as lost, as at its local deadline (nothing
    /// renews it any more; the store lets it lapse), and the key's mark is
    /// taken back, as at a term's end (an acquire of this client while the
    /// store still holds the grant extends it, `renewed()` true, as for
    /// any acquire by the grant's holder). The event to tell, if a term
    /// ended.
    pub(crate) fn abandon(&mut self) -> Option<LeaderEvent> {
        if let Some(token) = self.marked.take() {
            self.exec.client.unmark_held(&self.exec.key, token);
        }
        let why = Deposed::Lost(LostReason::LocalDeadline);
        self.current.take()?.end(why);
        Some(LeaderEvent::Deposed(why))
    }

    /// What the machine asks for next; `None` when nothing, for now.
    /// Once the machine holds no grant (its release answered, or the term
    /// ended without one), the key's mark is taken back: not at
    /// `Deposed`, while a release may still be on its way, when another
    /// acquire of this client would be given the grant being released.
    pub(crate) fn next(&mut self) -> Option<Next> {
        if let Some(token) = self.marked.filter(|_| !self.machine.holds_grant()) {
            self.marked = None;
            self.exec.client.unmark_held(&self.exec.key, token);
        }
        if let Some(action) = self.machine.poll_action() {
            return Some(match action {
                ElectionAction::Send(request) => Next::Send(request),
                ElectionAction::Event(event) => self.event(event),
            });
        }
        if self.machine.is_done() && !self.done {
            self.done = true;
            return Some(Next::End(Ok(())));
        }
        None
    }

    fn event(&mut self, event: ElectionEvent) -> Next {
        let client = &self.exec.client;
        match event {
            ElectionEvent::Elected { token } => {
                let deadline = self.machine.deadline().unwrap_or(LocalMs::ZERO);
                let target = Owner::Lease {
                    key: self.exec.key.clone(),
                    token,
                };
                let leader = Leader {
                    client: client.clone(),
                    key: self.exec.key.clone(),
                    token,
                    life: Lifeline::new(target, Lifetime::until(deadline), client.fork_guard()),
                    #[cfg(all(feature = "tokio", not(loom)))]
                    deposed: tokio_util::sync::CancellationToken::new(),
                };
                self.current = Some(leader.clone());
                Next::Event(LeaderEvent::Elected(leader))
            }
            ElectionEvent::Deposed(why) => {
                if let Some(leader) = self.current.take() {
                    leader.end(why);
                }
                Next::Event(LeaderEvent::Deposed(why))
            }
            ElectionEvent::Leader(info) => Next::Event(LeaderEvent::NewLeader(info)),
            ElectionEvent::Failed(e) => {
                self.done = true;
                Next::End(Err(e))
            }
        }
    }
}

/// What the application asks of a running election.
#[derive(Default)]
struct Commands {
    resign: bool,
    step_down: bool,
}

struct Shared {
    commands: Mutex<Commands>,
    leader: Mutex<Option<Leader>>,
    finished: AtomicBool,
    /// What wakes the election thread: replies, releases, commands.
    inbox: Channel<Delivery>,
}

impl Shared {
    /// Set a command and wake the election thread to act on it now.
    fn command(&self, set: impl FnOnce(&mut Commands)) {
        set(&mut lock(&self.commands));
        self.inbox.push(Delivery::Command);
    }
}

/// A running election ([`Client::campaign`]): its thread campaigns, leads
/// and campaigns again. Dropping it resigns.
pub struct Election {
    shared: Arc<Shared>,
    thread: Option<thread::JoinHandle<Result<()>>>,
    fork: ForkGuard,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("leader", &self.leader())
            .finish()
    }
}

impl Client {
    /// Campaign for leadership of `key`: at most one campaigner leads at a
    /// time, a dead leader is replaced about `opts.ttl` after its last
    /// renewal, and a resigning one at once. `on_event` runs on the
    /// election's thread for each [`LeaderEvent`] (keep it short: the
    /// leader's work belongs on a thread of its own, checking
    /// [`Leader::is_valid`] before each protected action). If `on_event`
    /// panics, the election resigns (a leader gives its term back), is
    /// told nothing more, and ends; [`Election::join`] or
    /// [`Election::resign`] resumes the panic. So does a store call that
    /// panics (a bug in a store), though nothing is given back then: the
    /// term ends at once, as lost (`Deposed(Lost(LocalDeadline))`, told to
    /// `on_event`), and the store lets its grant lapse.
    ///
    /// ```
    /// use leasehold::{Client, ElectOptions, LeaderEvent, MemStore};
    /// use std::time::Duration;
    ///
    /// let client = Client::new(MemStore::new());
    /// let election = client.campaign("scheduler", ElectOptions::new(Duration::from_secs(10)), |event| {
    ///     if let LeaderEvent::Elected(leader) = event {
    ///         println!("leading with token {}", leader.token());
    ///     }
    /// })?;
    /// while election.leader().is_none() {
    ///     std::thread::sleep(Duration::from_millis(5));
    /// }
    /// let leader = election.leader().expect("elected");
    /// assert!(leader.is_valid());
    /// election.resign()?; // the next campaigner takes over at once
    /// assert!(!leader.is_valid());
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    pub fn campaign(
        &self,
        key: &str,
        opts: ElectOptions,
        mut on_event: impl FnMut(LeaderEvent) + Send + 'static,
    ) -> Result<Election> {
        let mut session = ElectionSession::new(self, key, &opts)?;
        let shared = Arc::new(Shared {
            commands: Mutex::new(Commands::default()),
            leader: Mutex::new(None),
            finished: AtomicBool::new(false),
            inbox: Channel::new(),
        });
        let (me, client) = (shared.clone(), self.clone());
        let thread = thread::Builder::new()
            .name("leasehold-election".to_owned())
            .spawn(move || {
                let end = drive(&client, &mut session, &me, &mut on_event);
                *lock(&me.leader) = None;
                me.finished.store(true, Ordering::SeqCst);
                // A panic (of `on_event` or of a store call) reaches
                // whoever joins the election.
                end.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .map_err(|e| crate::Error::store("starting the election thread", e.to_string()))?;
        Ok(Election {
            shared,
            thread: Some(thread),
            fork: ForkGuard::new(),
        })
    }
}

/// What reaches the election thread.
enum Delivery {
    /// The store's answer to a request, or the call's panic.
    Reply(std::result::Result<HolderReply, Panic>),
    /// The store announced a release.
    Woke,
    /// The application set a command (resign, step down).
    Command,
}

/// The election thread: the machine's events and timeouts, and the
/// application's commands (each wakes it). Requests run on a store thread
/// of their own, so a store call that hangs never holds up a deadline: the
/// term ends on time, its handle and `on_event` told at once. A panic (of
/// `on_event` or of a store call) comes back as `Err`, once the store
/// thread is done.
fn drive(
    client: &Client,
    session: &mut ElectionSession,
    shared: &Arc<Shared>,
    on_event: &mut dyn FnMut(LeaderEvent),
) -> std::result::Result<Result<()>, Panic> {
    let requests: Channel<HolderRequest> = Channel::new();
    let exec = session.exec().clone();
    let woken = shared.clone();
    let waker = match spawn_waker(client.store().clone(), Wake::LeaseFreed, move || {
        woken.inbox.push(Delivery::Woke)
    }) {
        Ok(waker) => waker,
        Err(e) => return Ok(Err(e)),
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            while let Some(request) = requests.pop() {
                let reply = caught(|| exec.run(request));
                shared.inbox.push(Delivery::Reply(reply));
            }
        });
        let end = caught(|| campaign(session, shared, on_event, &requests, &shared.inbox));
        // Also after a panic: the store thread waits for requests until
        // the channel closes, and the scope for the store thread.
        drop(waker);
        requests.close();
        end
    })
}

fn campaign(
    session: &mut ElectionSession,
    shared: &Shared,
    on_event: &mut dyn FnMut(LeaderEvent),
    requests: &Channel<HolderRequest>,
    inbox: &Channel<Delivery>,
) -> Result<()> {
    let mut wait = Duration::ZERO;
    // A panic of `on_event`, resumed once the term it ended is given back.
    let mut panicked = None;
    loop {
        for delivery in inbox.drain_wait(wait) {
            match delivery {
                Delivery::Reply(Ok(reply)) => session.reply(reply),
                // A bug in the store: nothing more can be asked of it.
                // The term ends here, and the application is told.
                Delivery::Reply(Err(panic)) => {
                    if let Some(event) = session.abandon() {
                        *lock(&shared.leader) = None;
                        if panicked.is_none() {
                            let _ = caught(|| on_event(event));
                        }
                    }
                    std::panic::resume_unwind(panic)
                }
                Delivery::Woke => session.machine.handle_wake(session.now()),
                Delivery::Command => {}
            }
        }
        let commands = std::mem::take(&mut *lock(&shared.commands));
        let now = session.now();
        if commands.resign {
            session.machine.resign(now);
        } else if commands.step_down {
            session.machine.step_down(now);
        }
        session.timeout();
        while let Some(next) = session.next() {
            match next {
                Next::Send(request) => requests.push(request),
                Next::Event(event) => {
                    *lock(&shared.leader) = session.leader();
                    // The application's code failed: resign (a leader
                    // gives its term back), and tell it nothing more.
                    if panicked.is_none() {
                        panicked = caught(|| on_event(event)).err();
                        if panicked.is_some() {
                            session.machine.resign(session.now());
                        }
                    }
                }
                Next::End(end) => match panicked {
                    Some(panic) => std::panic::resume_unwind(panic),
                    None => return end,
                },
            }
        }
        let now = session.now();
        let until = session.machine.poll_timeout().unwrap_or(LocalMs::MAX);
        wait = Duration::from_millis(until.saturating_sub(now).clamp(1, 1_000));
    }
}

impl Election {
    /// The current term's handle, while this process leads.
    pub fn leader(&self) -> Option<Leader> {
        lock(&self.shared.leader).clone()
    }

    /// Whether the election is over (resigned, `once` and the term ended,
    /// a store error, or a panic: [`Election::join`] returns or resumes
    /// it).
    pub fn is_finished(&self) -> bool {
        self.shared.finished.load(Ordering::SeqCst)
    }

    /// End the current term (the key is released, so another campaigner
    /// may take it at once) and campaign again.
    pub fn step_down(&self) {
        self.shared.command(|c| c.step_down = true);
    }

    /// Stop campaigning; a leader releases the key first, so the next
    /// leader takes over at once. Returns once the election's thread is
    /// done (once the release is answered).
    pub fn resign(mut self) -> Result<()> {
        self.shared.command(|c| c.resign = true);
        self.join_thread()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    /// Wait for the election to end by itself (`once`, or a store error),
    /// or by a panic of `on_event` or of a store call, which is resumed
    /// here.
    pub fn join(mut self) -> Result<()> {
        self.join_thread()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    /// How the election's thread ended, or its panic.
    fn join_thread(&mut self) -> std::result::Result<Result<()>, Panic> {
        if !self.fork.is_origin_strict() {
            // A forked child has no election thread: the campaign is the
            // parent's.
            std::mem::forget(self.thread.take());
            return Ok(Err(self.fork.check_strict().err().unwrap_or(
                crate::Error::Forked {
                    created_pid: 0,
                    current_pid: std::process::id(),
                },
            )));
        }
        self.thread
            .take()
            .map_or(Ok(Ok(())), thread::JoinHandle::join)
    }
}

impl Drop for Election {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.shared.command(|c| c.resign = true);
            // Its panic (of `on_event`, or of a store call) was reported
            // when it happened; resumed in a drop it could abort the
            // process (a drop while unwinding).
            let _ = self.join_thread();
        }
    }
}
