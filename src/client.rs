//! The ergonomic layer: a [`Client`] with a holder identity, lease guards
//! with local deadlines and keep-alive, queue handles, claimed jobs and a
//! worker loop.
//!
//! # Validity (L3)
//! A guard or claimed job is valid while all of these hold: it is used in
//! the process that created it (no fork since), it was not released,
//! completed or seen lost, and the holder's own monotonic clock is before
//! the local deadline: the instant the request was *sent*, plus the TTL,
//! minus the drift allowance ([`crate::core::local_deadline_ms`]).
//!
//! # Keep-alive
//! One mechanism (`Lifeline`) is behind both guards and claimed jobs: a
//! shared validity record plus an optional thread that renews about every
//! TTL/3 (with jitter), stops promptly on release, and reports loss exactly
//! once. A renewal never revives a released lease: the store only extends a
//! live slot named by holder and token, and release removes the slot.

use crate::clock::{BootClock, Clock};
use crate::core::{
    self, lease::LeaseInfo, DriftBound, EnqueueOutcome, Holder, HolderId, JobId, JobRecord,
    JobSpec, JobState, QueuePolicy, StateCounts,
};
use crate::error::{Error, LostReason, Result, Target};
use crate::fork::ForkGuard;
use crate::store::{Store, StoreExt, Wake};
use crate::sync::{lock, thread, AtomicBool, AtomicU64, Condvar, Mutex, MutexGuard, Ordering};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

struct ClientInner {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    holder: Holder,
    drift: DriftBound,
    policy: QueuePolicy,
    busy_timeout: Duration,
    jitter: AtomicU64,
    fork: ForkGuard,
    /// Keys this client holds through a live guard: a second acquire of one
    /// waits like any other contender instead of sharing the slot.
    held: Mutex<HashSet<String>>,
}

/// A handle on a store with one holder identity. Cheap to clone; clones
/// share the identity. Not usable in a forked child ([`Error::Forked`]).
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("store", &self.inner.store.describe())
            .field("holder", &self.inner.holder)
            .finish()
    }
}

/// Options of a [`Client`]; start from [`Client::builder`].
pub struct ClientBuilder {
    store: Arc<dyn Store>,
    clock: Option<Arc<dyn Clock>>,
    holder: Option<Holder>,
    drift: DriftBound,
    policy: QueuePolicy,
    busy_timeout: Duration,
}

impl ClientBuilder {
    /// The holder identity (default: a random UUID v4 labelled with host and pid).
    pub fn holder(mut self, holder: Holder) -> Self {
        self.holder = Some(holder);
        self
    }

    /// The clock for local deadlines (default: [`BootClock`], which keeps
    /// counting while the machine is suspended, so a suspended holder wakes
    /// up knowing its lease ran out).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The drift allowance for local deadlines.
    pub fn drift(mut self, drift: DriftBound) -> Self {
        self.drift = drift;
        self
    }

    /// The retry policy for jobs (backoff, quarantine).
    pub fn policy(mut self, policy: QueuePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// How long transient store errors are retried before [`Error::Busy`].
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Build the client.
    pub fn build(self) -> Client {
        let holder = self
            .holder
            .unwrap_or_else(|| Holder::new(random_holder_id()).labelled_default());
        let seed = (holder.id.0 as u64) ^ ((holder.id.0 >> 64) as u64);
        let mut policy = self.policy;
        if policy.jitter_seed == 0 {
            policy.jitter_seed = seed;
        }
        Client {
            inner: Arc::new(ClientInner {
                store: self.store,
                clock: self.clock.unwrap_or_else(|| Arc::new(BootClock)),
                holder,
                drift: self.drift,
                policy,
                busy_timeout: self.busy_timeout,
                jitter: AtomicU64::new(seed),
                fork: ForkGuard::new(),
                held: Mutex::new(HashSet::new()),
            }),
        }
    }
}

/// A fresh random holder id (UUID v4).
pub fn random_holder_id() -> HolderId {
    HolderId(uuid::Uuid::new_v4().as_u128())
}

impl Holder {
    /// This holder labelled `host:pid` (best effort).
    pub fn labelled_default(self) -> Holder {
        let label = format!("{}:{}", hostname(), std::process::id());
        Holder::with_label(self.id, &label).unwrap_or(self)
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for buf.len() bytes; gethostname NUL-terminates
    // on success when the name fits, and we stop at the first NUL anyway.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown-host".to_owned();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// How to acquire a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseOptions {
    /// Time to live; renewals extend it by the same amount.
    pub ttl: Duration,
    /// How many holders may hold the key at once (1: a mutex).
    pub limit: u32,
    /// How long to wait for the key when it is held (zero: try once).
    pub wait: Duration,
}

impl LeaseOptions {
    /// A mutex lease with this TTL, no waiting.
    pub fn new(ttl: Duration) -> Self {
        LeaseOptions {
            ttl,
            limit: 1,
            wait: Duration::ZERO,
        }
    }

    /// Allow up to `limit` holders at once.
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }

    /// Wait up to `wait` for the key.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }
}

impl Client {
    /// A client with default options over `store`.
    pub fn new(store: impl Store + 'static) -> Self {
        Self::builder(store).build()
    }

    /// Options for a client over `store`.
    pub fn builder(store: impl Store + 'static) -> ClientBuilder {
        Self::builder_shared(Arc::new(store))
    }

    /// Options for a client over a shared store.
    pub fn builder_shared(store: Arc<dyn Store>) -> ClientBuilder {
        ClientBuilder {
            store,
            clock: None,
            holder: None,
            drift: DriftBound::default(),
            policy: QueuePolicy::default(),
            busy_timeout: Duration::from_secs(5),
        }
    }

    /// This client's holder identity.
    pub fn holder(&self) -> &Holder {
        &self.inner.holder
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The job retry policy.
    pub fn policy(&self) -> &QueuePolicy {
        &self.inner.policy
    }

    fn local_now_ms(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    /// A jitter value in `0..span` (deterministic per client, never shared
    /// with the store's rules).
    fn jitter(&self, span: u64) -> u64 {
        let n = self.inner.jitter.fetch_add(1, Ordering::Relaxed);
        core::mix64(n) % span.max(1)
    }

    /// Run `f` in a store transaction, retrying transient store errors with
    /// jittered exponential backoff until the busy timeout (S1).
    fn run<R>(&self, f: impl FnMut(&mut dyn core::Txn) -> Result<R>) -> Result<R> {
        self.run_until(None, f)
    }

    /// [`Client::run`], but retrying no later than `until_local_ms` on the
    /// local clock (a renewal is pointless past the local deadline).
    fn run_until<R>(
        &self,
        until_local_ms: Option<u64>,
        mut f: impl FnMut(&mut dyn core::Txn) -> Result<R>,
    ) -> Result<R> {
        self.inner.fork.check()?;
        let start_ms = self.local_now_ms();
        let give_up_ms = start_ms
            .saturating_add(ms(self.inner.busy_timeout))
            .min(until_local_ms.unwrap_or(u64::MAX));
        let mut backoff_ms = 1u64;
        loop {
            match self.inner.store.txn(&mut f) {
                Err(e) if e.is_transient() => {
                    let now_ms = self.local_now_ms();
                    if now_ms >= give_up_ms {
                        return Err(Error::Busy {
                            waited_ms: now_ms.saturating_sub(start_ms),
                            last: Box::new(e),
                        });
                    }
                    let sleep_ms = (backoff_ms / 2 + self.jitter(backoff_ms / 2 + 1))
                        .min(give_up_ms - now_ms)
                        .max(1);
                    crate::sync::sleep(Duration::from_millis(sleep_ms));
                    backoff_ms = (backoff_ms * 2).min(100);
                }
                other => return other,
            }
        }
    }

    /// Try once to acquire `key`; [`Error::Held`] if it is taken.
    pub fn try_acquire(&self, key: &str, ttl: Duration) -> Result<LeaseGuard> {
        self.acquire(key, LeaseOptions::new(ttl))
    }

    /// Acquire `key`, waiting up to `opts.wait` (jittered backoff, woken
    /// early when the store sees a release). While a guard of this client
    /// holds the key, another acquire through this client waits like any
    /// other contender (two guards never share one grant).
    pub fn acquire(&self, key: &str, opts: LeaseOptions) -> Result<LeaseGuard> {
        self.inner.fork.check()?;
        core::check_key("key", key)?;
        let ttl_ms = ms(opts.ttl);
        let start_ms = self.local_now_ms();
        let wait_ms = ms(opts.wait);
        let mut backoff_ms = 1u64;
        loop {
            let epoch = self.inner.store.epoch(Wake::LeaseFreed);
            let attempt = if lock(&self.inner.held).contains(key) {
                // Held by another guard of ours: report it as held.
                self.inspect(key).and_then(|info| {
                    Err(Error::Held {
                        key: key.to_owned(),
                        holders: info.holders,
                    })
                })
            } else {
                let sent_at_ms = self.local_now_ms();
                let holder = &self.inner.holder;
                self.run(|tx| core::lease::acquire(tx, key, holder, ttl_ms, opts.limit))
                    .map(|grant| (grant, sent_at_ms))
            };
            match attempt {
                Ok((grant, sent_at_ms)) => {
                    let mut guard =
                        LeaseGuard::new(self.clone(), key, grant.token, ttl_ms, sent_at_ms);
                    guard.renewed = grant.renewed;
                    return Ok(guard);
                }
                Err(Error::Held { key, holders }) => {
                    let waited_ms = self.local_now_ms().saturating_sub(start_ms);
                    if waited_ms >= wait_ms {
                        return Err(Error::Held { key, holders });
                    }
                    let sleep_ms = (backoff_ms / 2 + self.jitter(backoff_ms / 2 + 1))
                        .min(wait_ms - waited_ms)
                        .max(1);
                    self.inner.store.wait_epoch(
                        Wake::LeaseFreed,
                        epoch,
                        Duration::from_millis(sleep_ms),
                    );
                    backoff_ms = (backoff_ms * 2).min(250);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The store's clock now (ms), the time its rules run on: convert a
    /// record's instants to wall-clock time from their distance to it.
    pub fn store_now_ms(&self) -> Result<u64> {
        self.run(|tx| Ok(tx.now_ms()))
    }

    /// Live holders of `key` and its token counter.
    pub fn inspect(&self, key: &str) -> Result<LeaseInfo> {
        self.run(|tx| core::lease::inspect(tx, key))
    }

    /// Renew a lease by key and token (for callers that keep the token
    /// themselves, like the CLI). Returns the grant with its store expiry.
    pub fn renew(&self, key: &str, token: u64, ttl: Duration) -> Result<core::Grant> {
        let id = self.inner.holder.id;
        self.run(|tx| core::lease::renew(tx, key, id, token, ms(ttl)))
    }

    /// Release a lease by key and token.
    pub fn release(&self, key: &str, token: u64) -> Result<()> {
        let id = self.inner.holder.id;
        self.run(|tx| core::lease::release(tx, key, id, token))
    }

    /// One job by id, as of the store's clock.
    pub fn job(&self, id: JobId) -> Result<JobRecord> {
        let policy = self.inner.policy;
        self.run(|tx| core::job::get(tx, id, &policy))
    }

    /// Cancel a job by id; returns its state afterwards (running means a
    /// cancel was requested, seen by its worker at the next heartbeat).
    pub fn cancel_job(&self, id: JobId) -> Result<JobState> {
        let policy = self.inner.policy;
        self.run(|tx| core::job::cancel(tx, id, &policy))
    }

    /// Make a dead or cancelled job ready again, by id.
    pub fn retry_job(&self, id: JobId) -> Result<()> {
        let policy = self.inner.policy;
        self.run(|tx| core::job::retry(tx, id, &policy))
    }

    /// A handle on queue `name`.
    pub fn queue(&self, name: &str) -> Result<Queue> {
        core::check_key("queue", name)?;
        Ok(Queue {
            client: self.clone(),
            name: Arc::from(name),
        })
    }
}

/// Deliberately broken variants for the loom models to reject (compiled
/// only under `--cfg loom`; see `tests/loom.rs`).
#[cfg(loom)]
pub mod loom_canary {
    use std::cell::Cell;

    std::thread_local! {
        /// Release (or settle) without waiting for the keep-alive thread;
        /// renew a lease by re-acquiring it and heartbeat a job by reading
        /// and writing it back in two transactions: the naive keep-alive
        /// that revives released leases and completed claims.
        pub static NAIVE_KEEP_ALIVE: Cell<bool> = const { Cell::new(false) };
    }

    /// Whether the naive keep-alive is on (on this model's thread).
    pub fn naive() -> bool {
        NAIVE_KEEP_ALIVE.with(Cell::get)
    }
}

/// Called once when a lease or claim is lost.
type OnLost = Box<dyn FnOnce(Error) + Send>;

/// Shared validity state of a guard or claimed job, and its keep-alive.
struct Lifeline {
    target: Target,
    state: Mutex<LifeState>,
    wake: Condvar,
    fork: ForkGuard,
}

#[derive(Default)]
struct LifeState {
    local_deadline_ms: u64,
    finished: bool,
    lost: Option<LostReason>,
    cancel_requested: bool,
    thread_running: bool,
    thread: Option<thread::ThreadId>,
    on_lost: Option<OnLost>,
}

/// A renewal: given the local deadline (retry no later), renew and report
/// the new local deadline.
type RenewFn = Box<dyn FnMut(u64) -> Result<RenewOk> + Send>;

struct RenewOk {
    local_deadline_ms: u64,
    cancel_requested: bool,
}

/// Clears `thread_running` when the keep-alive thread ends, even by panic,
/// so that `join` never waits forever.
struct RunningFlag(Arc<Lifeline>);

impl Drop for RunningFlag {
    fn drop(&mut self) {
        let mut st = lock(&self.0.state);
        st.thread_running = false;
        st.thread = None;
        self.0.wake.notify_all();
    }
}

impl Lifeline {
    fn new(target: Target, local_deadline_ms: u64) -> Arc<Lifeline> {
        Arc::new(Lifeline {
            target,
            state: Mutex::new(LifeState {
                local_deadline_ms,
                ..LifeState::default()
            }),
            wake: Condvar::new(),
            fork: ForkGuard::new(),
        })
    }

    fn is_valid(&self, now_ms: u64) -> bool {
        // The fork check comes first: in a child, the mutex may have been
        // copied locked by a keep-alive thread that does not exist there.
        if !self.fork.is_origin() {
            return false;
        }
        let st = lock(&self.state);
        !st.finished && st.lost.is_none() && now_ms < st.local_deadline_ms
    }

    fn lost_error(&self, reason: LostReason) -> Error {
        Error::Lost {
            target: self.target.clone(),
            reason,
        }
    }

    /// Check the handle may act: same process (`strict`: also by pid, for
    /// calls that would release or settle), not finished, not lost.
    fn check_usable(&self, strict: bool) -> Result<()> {
        if strict {
            self.fork.check_strict()?;
        } else {
            self.fork.check()?;
        }
        let st = lock(&self.state);
        if st.finished {
            return Err(self.lost_error(LostReason::StaleToken));
        }
        match st.lost {
            Some(reason) => Err(self.lost_error(reason)),
            None => Ok(()),
        }
    }

    /// Record the outcome of a renewal made by anyone (thread or caller).
    /// The first loss seen is reported to `on_lost`, exactly once.
    fn record(&self, outcome: &Result<RenewOk>, now_ms: u64) {
        let mut st = lock(&self.state);
        if st.finished || st.lost.is_some() {
            return;
        }
        let reason = match outcome {
            Ok(ok) => {
                st.local_deadline_ms = st.local_deadline_ms.max(ok.local_deadline_ms);
                st.cancel_requested |= ok.cancel_requested;
                return;
            }
            Err(Error::Lost { reason, .. }) => *reason,
            Err(_) if now_ms >= st.local_deadline_ms => LostReason::LocalDeadline,
            Err(_) => return,
        };
        self.mark_lost(st, reason);
    }

    /// Declare the loss if the local deadline has passed.
    fn check_deadline(&self, now_ms: u64) -> bool {
        let st = lock(&self.state);
        if st.finished || st.lost.is_some() {
            return true;
        }
        if now_ms < st.local_deadline_ms {
            return false;
        }
        self.mark_lost(st, LostReason::LocalDeadline);
        true
    }

    fn mark_lost(&self, mut st: MutexGuard<'_, LifeState>, reason: LostReason) {
        st.lost = Some(reason);
        let callback = st.on_lost.take();
        self.wake.notify_all();
        drop(st);
        if let Some(callback) = callback {
            callback(self.lost_error(reason));
        }
    }

    /// Mark finished (released, completed, failed); stops the keep-alive.
    /// Returns false if it was finished already.
    fn finish(&self) -> bool {
        let mut st = lock(&self.state);
        let was = st.finished;
        st.finished = true;
        st.on_lost = None;
        self.wake.notify_all();
        !was
    }

    /// Wait until the keep-alive thread has exited (unless called from it).
    fn join(&self) {
        let me = thread::current().id();
        let mut st = lock(&self.state);
        if st.thread == Some(me) {
            return;
        }
        while st.thread_running {
            st = match self.wake.wait(st) {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
        }
    }

    /// Start a thread that calls `renew` about every `interval_ms` (with
    /// jitter from `seed`) until finished or lost; declares the loss at the
    /// local deadline if renewals fail until then.
    fn spawn_keep_alive(
        self: &Arc<Self>,
        clock: Arc<dyn Clock>,
        interval_ms: u64,
        seed: u64,
        mut renew: RenewFn,
        on_lost: OnLost,
    ) -> Result<()> {
        {
            let mut st = lock(&self.state);
            if st.thread_running || st.finished || st.lost.is_some() {
                return Ok(());
            }
            st.thread_running = true;
            st.on_lost = Some(on_lost);
        }
        let me = Arc::clone(self);
        let spawned = thread::Builder::new()
            .name("leasehold-keepalive".to_owned())
            .spawn(move || {
                lock(&me.state).thread = Some(thread::current().id());
                let flag = RunningFlag(Arc::clone(&me));
                me.keep_alive_loop(&*clock, interval_ms, seed, &mut renew);
                drop(flag);
            });
        if let Err(e) = spawned {
            let mut st = lock(&self.state);
            st.thread_running = false;
            st.on_lost = None;
            return Err(Error::store(
                "starting the keep-alive thread",
                e.to_string(),
            ));
        }
        Ok(())
    }

    fn keep_alive_loop(&self, clock: &dyn Clock, interval_ms: u64, seed: u64, renew: &mut RenewFn) {
        let mut round = 0u64;
        let mut next_wait_ms = interval_ms;
        loop {
            // Jitter of +-10 % so that many holders do not renew in step.
            let span = (next_wait_ms / 5).max(1);
            let wait_ms = next_wait_ms - next_wait_ms / 10 + core::mix64(seed ^ round) % span;
            round += 1;
            let renew_at = clock.now_ms().saturating_add(wait_ms);
            // Sleep until the renewal is due, waking for release or at the
            // local deadline, whichever comes first.
            loop {
                let now = clock.now_ms();
                if self.check_deadline(now) {
                    return;
                }
                if now >= renew_at {
                    break;
                }
                let st = lock(&self.state);
                let until = renew_at.min(st.local_deadline_ms);
                let nap = Duration::from_millis(until.saturating_sub(now).max(1));
                drop(crate::sync::nap(&self.wake, &self.state, st, nap));
            }
            let deadline = lock(&self.state).local_deadline_ms;
            let outcome = renew(deadline);
            self.record(&outcome, clock.now_ms());
            next_wait_ms = match outcome {
                Ok(_) => interval_ms,
                // Transient trouble: retry sooner while the deadline allows.
                Err(_) => (interval_ms / 4).max(1),
            };
        }
    }
}

/// A held lease. Valid while [`LeaseGuard::is_valid`]; released on drop
/// (in the creating process only).
pub struct LeaseGuard {
    client: Client,
    key: String,
    token: u64,
    ttl_ms: u64,
    renewed: bool,
    life: Arc<Lifeline>,
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("ttl_ms", &self.ttl_ms)
            .finish()
    }
}

impl LeaseGuard {
    fn new(client: Client, key: &str, token: u64, ttl_ms: u64, sent_at_ms: u64) -> Self {
        let deadline = core::local_deadline_ms(sent_at_ms, ttl_ms, client.inner.drift);
        lock(&client.inner.held).insert(key.to_owned());
        let target = Target::Lease {
            key: key.to_owned(),
            token,
        };
        LeaseGuard {
            client,
            key: key.to_owned(),
            token,
            ttl_ms,
            renewed: false,
            life: Lifeline::new(target, deadline),
        }
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token: pass it to whatever the lease protects, which
    /// should reject tokens lower than the highest it has seen.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Whether the holder already held the key and the acquire extended
    /// that grant (same token) instead of making a new one: only possible
    /// for a holder id shared between processes, like `leasehold lock
    /// acquire --holder ID`.
    pub fn renewed(&self) -> bool {
        self.renewed
    }

    /// The TTL renewals use.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }

    /// Whether the holder may act now: same process, not released or lost,
    /// and before the local deadline on the holder's own clock. This is the
    /// check to make before every protected action.
    pub fn is_valid(&self) -> bool {
        self.life.is_valid(self.client.local_now_ms())
    }

    /// Time left before the local deadline (zero if not valid).
    pub fn remaining(&self) -> Duration {
        let now = self.client.local_now_ms();
        if !self.life.is_valid(now) {
            return Duration::ZERO;
        }
        let deadline = lock(&self.life.state).local_deadline_ms;
        Duration::from_millis(deadline.saturating_sub(now))
    }

    /// The loss seen by a renewal or keep-alive, if any.
    pub fn lost(&self) -> Option<LostReason> {
        if !self.life.fork.is_origin() {
            return None;
        }
        lock(&self.life.state).lost
    }

    fn renew_fn(&self) -> RenewFn {
        let client = self.client.clone();
        let key = self.key.clone();
        let (token, ttl_ms) = (self.token, self.ttl_ms);
        #[cfg(loom)]
        let naive = loom_canary::naive();
        Box::new(move |deadline| {
            let sent_at_ms = client.local_now_ms();
            let id = client.inner.holder.id;
            #[cfg(loom)]
            if naive {
                let holder = client.inner.holder.clone();
                client.run(|tx| core::lease::acquire(tx, &key, &holder, ttl_ms, 1))?;
                return Ok(RenewOk {
                    local_deadline_ms: deadline,
                    cancel_requested: false,
                });
            }
            client.run_until(Some(deadline), |tx| {
                core::lease::renew(tx, &key, id, token, ttl_ms)
            })?;
            Ok(RenewOk {
                local_deadline_ms: core::local_deadline_ms(sent_at_ms, ttl_ms, client.inner.drift),
                cancel_requested: false,
            })
        })
    }

    /// Renew now, extending the local deadline.
    pub fn renew(&self) -> Result<()> {
        self.life.check_usable(false)?;
        let deadline = lock(&self.life.state).local_deadline_ms;
        let outcome = (self.renew_fn())(deadline);
        self.life.record(&outcome, self.client.local_now_ms());
        outcome.map(|_| ())
    }

    /// Renew in a background thread about every TTL/3; `on_lost` is called
    /// once if the lease is lost (a refused renewal, or the local deadline
    /// reached while renewals failed). [`LeaseGuard::is_valid`] turns false
    /// at the local deadline whether or not the callback has run.
    pub fn keep_alive(&self, on_lost: impl FnOnce(Error) + Send + 'static) -> Result<()> {
        self.life.check_usable(false)?;
        self.life.spawn_keep_alive(
            self.client.inner.clock.clone(),
            (self.ttl_ms / 3).max(1),
            self.token ^ self.client.inner.holder.id.0 as u64,
            self.renew_fn(),
            Box::new(on_lost),
        )
    }

    /// Release the lease now and stop its keep-alive.
    pub fn release(self) -> Result<()> {
        self.release_inner()
    }

    /// Stop managing the lease without releasing it: it stays held in the
    /// store until its TTL runs out or someone releases it by token (what
    /// `leasehold lock acquire` does). Returns the key and the token.
    pub fn detach(self) -> (String, u64) {
        if self.life.fork.is_origin_strict() {
            self.life.finish();
            self.life.join();
            lock(&self.client.inner.held).remove(&self.key);
        }
        (self.key.clone(), self.token)
    }

    fn release_inner(&self) -> Result<()> {
        self.life.check_usable(true).or_else(|e| match e {
            Error::Lost { .. } => Ok(()),
            other => Err(other),
        })?;
        if !self.life.finish() {
            return Ok(());
        }
        #[cfg(loom)]
        let skip_join = loom_canary::naive();
        #[cfg(not(loom))]
        let skip_join = false;
        if !skip_join {
            self.life.join();
        }
        let id = self.client.inner.holder.id;
        let released = self
            .client
            .run(|tx| core::lease::release(tx, &self.key, id, self.token));
        lock(&self.client.inner.held).remove(&self.key);
        released
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        // In a forked child, do nothing: the lease is the parent's.
        if self.life.fork.is_origin_strict() {
            let _ = self.release_inner();
            lock(&self.client.inner.held).remove(&self.key);
        }
    }
}

/// A handle on one queue.
#[derive(Clone, Debug)]
pub struct Queue {
    client: Client,
    name: Arc<str>,
}

/// Options of [`Queue::work`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkOptions {
    /// Lease of each claim; heartbeats renew it about every third of it.
    pub lease: Duration,
    /// Jobs claimed per transaction by each worker thread.
    pub batch: usize,
    /// Jobs handled at once (worker threads).
    pub concurrency: usize,
    /// Return once the queue is drained ([`crate::core::job::drained`]: no
    /// job ready, running, or due, retries in backoff included).
    pub drain: bool,
    /// Longest sleep between claims when the queue is empty.
    pub idle_poll: Duration,
}

impl Default for WorkOptions {
    fn default() -> Self {
        WorkOptions {
            lease: Duration::from_secs(30),
            batch: 1,
            concurrency: 1,
            drain: false,
            idle_poll: Duration::from_millis(200),
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
    /// Jobs whose claim was lost (or whose outcome is unknown) before the
    /// outcome was recorded; the store retries them after their lease.
    pub lost: u64,
}

impl WorkReport {
    fn add(&mut self, other: WorkReport) {
        self.completed += other.completed;
        self.failed += other.failed;
        self.lost += other.lost;
    }
}

/// How one job ended in a worker loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobOutcome {
    /// Completed.
    Done,
    /// Reported failed; the job's state now: scheduled for a retry, dead,
    /// or cancelled (a cancel was requested while it ran).
    Failed(JobState),
    /// The claim was lost, or the outcome is unknown, before it was
    /// recorded; the store retries the job once its lease runs out.
    Lost,
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

/// What the threads of one worker loop share.
struct WorkShared {
    /// A thread hit an error it cannot go on with: everyone stops.
    halt: AtomicBool,
    /// A thread saw the queue drained: everyone stops.
    drained: AtomicBool,
}

impl Queue {
    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client behind this handle.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Enqueue a job.
    pub fn push(&self, spec: &JobSpec) -> Result<EnqueueOutcome> {
        let policy = self.client.inner.policy;
        self.client
            .run(|tx| core::job::enqueue(tx, &self.name, spec, &policy))
    }

    /// Claim the next ready job, if any, under a lease of `lease`.
    pub fn claim(&self, lease: Duration) -> Result<Option<ClaimedJob>> {
        Ok(self.claim_batch(1, lease)?.into_iter().next())
    }

    /// Claim up to `max` ready jobs in one transaction.
    pub fn claim_batch(&self, max: usize, lease: Duration) -> Result<Vec<ClaimedJob>> {
        let lease_ms = ms(lease);
        let holder = self.client.inner.holder.id;
        let policy = self.client.inner.policy;
        let sent_at_ms = self.client.local_now_ms();
        let jobs = self
            .client
            .run(|tx| core::job::claim(tx, &self.name, holder, lease_ms, max, &policy))?;
        let deadline = core::local_deadline_ms(sent_at_ms, lease_ms, self.client.inner.drift);
        Ok(jobs
            .into_iter()
            .map(|job| {
                let token = job.claim.map_or(0, |c| c.token);
                let target = Target::Job { id: job.id, token };
                ClaimedJob {
                    client: self.client.clone(),
                    token,
                    lease_ms,
                    job,
                    life: Lifeline::new(target, deadline),
                }
            })
            .collect())
    }

    /// Complete many claimed jobs in one transaction (group commit: one
    /// fsync for all). Each job's outcome is reported on its own: a lost
    /// claim does not stop the others.
    pub fn complete_many(&self, jobs: &[ClaimedJob]) -> Result<Vec<Result<()>>> {
        self.client.inner.fork.check_strict()?;
        let mut ready = Vec::with_capacity(jobs.len());
        for job in jobs {
            ready.push(job.life.check_usable(true).map(|()| {
                job.life.finish();
                job.life.join();
            }));
        }
        let holder = self.client.inner.holder.id;
        self.client.run(|tx| {
            Ok(jobs
                .iter()
                .zip(&ready)
                .map(|(job, ok)| match ok {
                    // A rule error decides before it writes, so the others
                    // in the transaction are unaffected.
                    Ok(()) => core::job::complete(tx, job.job.id, holder, job.token),
                    Err(e) => Err(Error::Lost {
                        target: job.life.target.clone(),
                        reason: match e {
                            Error::Lost { reason, .. } => *reason,
                            _ => LostReason::StaleToken,
                        },
                    }),
                })
                .collect())
        })
    }

    /// Jobs per state.
    pub fn stats(&self) -> Result<StateCounts> {
        let policy = self.client.inner.policy;
        self.client
            .run(|tx| core::job::stats(tx, &self.name, &policy))
    }

    /// Up to `limit` jobs after id `after`, optionally only in `state`.
    pub fn list(
        &self,
        state: Option<JobState>,
        after: JobId,
        limit: usize,
    ) -> Result<Vec<JobRecord>> {
        let policy = self.client.inner.policy;
        self.client
            .run(|tx| core::job::list(tx, &self.name, state, after, limit, &policy))
    }

    /// One job by id (see [`Client::job`]).
    pub fn get(&self, id: JobId) -> Result<JobRecord> {
        self.client.job(id)
    }

    /// Cancel a job (see [`Client::cancel_job`]).
    pub fn cancel(&self, id: JobId) -> Result<JobState> {
        self.client.cancel_job(id)
    }

    /// Retry a dead or cancelled job (see [`Client::retry_job`]).
    pub fn retry(&self, id: JobId) -> Result<()> {
        self.client.retry_job(id)
    }

    /// Delete terminal jobs that finished at least `older_than` ago.
    /// Returns how many were deleted.
    pub fn purge(&self, older_than: Duration) -> Result<u64> {
        const CHUNK: usize = 1000;
        let policy = self.client.inner.policy;
        let mut total = 0u64;
        loop {
            let n = self
                .client
                .run(|tx| core::job::purge(tx, &self.name, ms(older_than), CHUNK, &policy))?;
            total += n as u64;
            if n < CHUNK {
                return Ok(total);
            }
        }
    }

    /// Claim and run jobs until `stop` is set (or, with `drain`, until the
    /// queue is drained), `opts.concurrency` at a time. Every claimed job
    /// heartbeats in the background from the moment it is claimed; a job
    /// whose claim is no longer valid when its turn comes is skipped
    /// (counted as lost). The handler's `Ok` completes a job, `Err(reason)`
    /// fails it (a reason longer than the store takes is cut: [`fit_reason`]).
    pub fn work(
        &self,
        opts: &WorkOptions,
        stop: &std::sync::atomic::AtomicBool,
        handler: impl Fn(&ClaimedJob) -> std::result::Result<(), String> + Sync,
    ) -> Result<WorkReport> {
        self.work_with(opts, stop, handler, |_, _| {})
    }

    /// [`Queue::work`], calling `observe` with each job's outcome once it
    /// is recorded. Transient store trouble (busy, lost connections) is
    /// waited out; any other store error stops every thread and is returned.
    pub fn work_with(
        &self,
        opts: &WorkOptions,
        stop: &std::sync::atomic::AtomicBool,
        handler: impl Fn(&ClaimedJob) -> std::result::Result<(), String> + Sync,
        observe: impl Fn(&ClaimedJob, JobOutcome) + Sync,
    ) -> Result<WorkReport> {
        self.client.inner.fork.check()?;
        let shared = WorkShared {
            halt: AtomicBool::new(false),
            drained: AtomicBool::new(false),
        };
        let threads = opts.concurrency.clamp(1, 1024);
        let (handler, observe) = (&handler, &observe);
        let results: Vec<Result<WorkReport>> = std::thread::scope(|scope| {
            let spawned: Vec<_> = (0..threads)
                .map(|_| {
                    let shared = &shared;
                    std::thread::Builder::new()
                        .name("leasehold-worker".to_owned())
                        .spawn_scoped(scope, move || {
                            let r = self.work_thread(opts, stop, shared, handler, observe);
                            if r.is_err() {
                                shared.halt.store(true, Ordering::SeqCst);
                            }
                            r
                        })
                })
                .collect();
            spawned
                .into_iter()
                .map(|h| match h {
                    Ok(h) => h.join().unwrap_or_else(|_| {
                        shared.halt.store(true, Ordering::SeqCst);
                        Err(Error::store(
                            "running a worker thread",
                            "the handler panicked",
                        ))
                    }),
                    Err(e) => {
                        shared.halt.store(true, Ordering::SeqCst);
                        Err(Error::store("starting a worker thread", e.to_string()))
                    }
                })
                .collect()
        });
        let mut report = WorkReport::default();
        for r in results {
            report.add(r?);
        }
        Ok(report)
    }

    fn work_thread(
        &self,
        opts: &WorkOptions,
        stop: &std::sync::atomic::AtomicBool,
        shared: &WorkShared,
        handler: &(impl Fn(&ClaimedJob) -> std::result::Result<(), String> + Sync),
        observe: &(impl Fn(&ClaimedJob, JobOutcome) + Sync),
    ) -> Result<WorkReport> {
        let mut report = WorkReport::default();
        let mut idle_ms = 1u64;
        let store = &self.client.inner.store;
        let policy = self.client.inner.policy;
        let running = || {
            !stop.load(Ordering::SeqCst)
                && !shared.halt.load(Ordering::SeqCst)
                && !shared.drained.load(Ordering::SeqCst)
        };
        while running() {
            let epoch = store.epoch(Wake::JobReady);
            let jobs = match self.claim_batch(opts.batch.max(1), opts.lease) {
                Ok(jobs) => jobs,
                Err(e) if e.is_transient() || matches!(e, Error::Busy { .. }) => Vec::new(),
                Err(e) => return Err(e),
            };
            if jobs.is_empty() {
                if opts.drain {
                    let drained = self
                        .client
                        .run(|tx| core::job::drained(tx, &self.name, &policy));
                    match drained {
                        Ok(true) => {
                            shared.drained.store(true, Ordering::SeqCst);
                            break;
                        }
                        Ok(false) => {}
                        Err(e) if e.is_transient() || matches!(e, Error::Busy { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
                let cap = ms(opts.idle_poll).max(1);
                let sleep_ms = idle_ms / 2 + self.client.jitter(idle_ms / 2 + 1);
                // Woken early when a job becomes ready; polling stays the
                // fallback (scheduled jobs falling due, stores that cannot tell).
                store.wait_epoch(
                    Wake::JobReady,
                    epoch,
                    Duration::from_millis(sleep_ms.min(cap)),
                );
                idle_ms = (idle_ms * 2).min(cap);
                continue;
            }
            idle_ms = 1;
            for job in &jobs {
                job.heartbeat_in_background(|_| {})?;
            }
            for job in &jobs {
                if !job.is_valid() {
                    report.lost += 1;
                    observe(job, JobOutcome::Lost);
                    continue;
                }
                let recorded = match handler(job) {
                    Ok(()) => job.complete().map(|()| JobOutcome::Done),
                    Err(reason) => job.fail(&fit_reason(&reason)).map(JobOutcome::Failed),
                };
                let outcome = match recorded {
                    Ok(outcome) => outcome,
                    Err(e)
                        if e.is_lost() || e.is_ambiguous() || matches!(e, Error::Busy { .. }) =>
                    {
                        JobOutcome::Lost
                    }
                    Err(e) => return Err(e),
                };
                match outcome {
                    JobOutcome::Done => report.completed += 1,
                    JobOutcome::Failed(_) => report.failed += 1,
                    JobOutcome::Lost => report.lost += 1,
                }
                observe(job, outcome);
            }
        }
        Ok(report)
    }
}

/// A claimed job. Valid while [`ClaimedJob::is_valid`]; heartbeat to keep
/// it, then complete or fail it. Dropping it unfinished leaves the claim to
/// expire (the job is then retried).
pub struct ClaimedJob {
    client: Client,
    job: JobRecord,
    token: u64,
    lease_ms: u64,
    life: Arc<Lifeline>,
}

impl std::fmt::Debug for ClaimedJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimedJob")
            .field("id", &self.job.id)
            .field("token", &self.token)
            .field("attempt", &self.job.attempts)
            .finish()
    }
}

impl ClaimedJob {
    /// The job's id.
    pub fn id(&self) -> JobId {
        self.job.id
    }

    /// The claim's fencing token.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Which attempt this is (1 for the first).
    pub fn attempt(&self) -> u32 {
        self.job.attempts
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.job.payload
    }

    /// The record as claimed.
    pub fn record(&self) -> &JobRecord {
        &self.job
    }

    /// Whether the worker may still act on the job (see [`LeaseGuard::is_valid`]).
    pub fn is_valid(&self) -> bool {
        self.life.is_valid(self.client.local_now_ms())
    }

    /// Whether a heartbeat has seen a cancel request.
    pub fn cancel_requested(&self) -> bool {
        self.life.fork.is_origin() && lock(&self.life.state).cancel_requested
    }

    /// The loss seen by a heartbeat, if any.
    pub fn lost(&self) -> Option<LostReason> {
        if !self.life.fork.is_origin() {
            return None;
        }
        lock(&self.life.state).lost
    }

    fn renew_fn(&self) -> RenewFn {
        let client = self.client.clone();
        let (id, token, lease_ms) = (self.job.id, self.token, self.lease_ms);
        #[cfg(loom)]
        let naive = loom_canary::naive();
        Box::new(move |deadline| {
            let sent_at_ms = client.local_now_ms();
            let holder = client.inner.holder.id;
            #[cfg(loom)]
            if naive {
                // Read, then write back in a second transaction: a lost update.
                let mut job = client.run(|tx| core::job::get(tx, id, &QueuePolicy::default()))?;
                if let Some(c) = job.claim.as_mut() {
                    c.lease_until_ms += lease_ms;
                }
                client.run(|tx| tx.jobs()?.put_job(&job))?;
                return Ok(RenewOk {
                    local_deadline_ms: deadline,
                    cancel_requested: false,
                });
            }
            let reply = client.run_until(Some(deadline), |tx| {
                core::job::heartbeat(tx, id, holder, token, lease_ms)
            })?;
            Ok(RenewOk {
                local_deadline_ms: core::local_deadline_ms(
                    sent_at_ms,
                    lease_ms,
                    client.inner.drift,
                ),
                cancel_requested: reply.cancel_requested,
            })
        })
    }

    /// Extend the claim now. Returns whether a cancel was requested.
    pub fn heartbeat(&self) -> Result<bool> {
        self.life.check_usable(false)?;
        let deadline = lock(&self.life.state).local_deadline_ms;
        let outcome = (self.renew_fn())(deadline);
        self.life.record(&outcome, self.client.local_now_ms());
        outcome.map(|ok| ok.cancel_requested)
    }

    /// Heartbeat in a background thread about every third of the lease;
    /// `on_lost` is called once if the claim is lost.
    pub fn heartbeat_in_background(
        &self,
        on_lost: impl FnOnce(Error) + Send + 'static,
    ) -> Result<()> {
        self.life.check_usable(false)?;
        self.life.spawn_keep_alive(
            self.client.inner.clock.clone(),
            (self.lease_ms / 3).max(1),
            self.token ^ self.job.id.0,
            self.renew_fn(),
            Box::new(on_lost),
        )
    }

    fn settle<R>(&self, f: impl FnMut(&mut dyn core::Txn) -> Result<R>) -> Result<R> {
        self.life.check_usable(true)?;
        self.life.finish();
        #[cfg(loom)]
        let skip_join = loom_canary::naive();
        #[cfg(not(loom))]
        let skip_join = false;
        if !skip_join {
            self.life.join();
        }
        self.client.run(f)
    }

    /// Mark the job done (Q2: only with the current, unexpired claim).
    pub fn complete(&self) -> Result<()> {
        let holder = self.client.inner.holder.id;
        self.settle(|tx| core::job::complete(tx, self.job.id, holder, self.token))
    }

    /// Report the attempt failed; returns the job's new state (scheduled
    /// for a retry, dead, or cancelled). A reason the store would refuse
    /// (longer than [`crate::core::MAX_TEXT_BYTES`], or with NUL) is
    /// rejected with [`Error::Invalid`] before anything changes: the claim
    /// stays valid and heartbeating, so the caller can fail it again with a
    /// shorter reason ([`fit_reason`] makes one).
    pub fn fail(&self, reason: &str) -> Result<JobState> {
        core::check_text("reason", reason)?;
        let holder = self.client.inner.holder.id;
        let policy = self.client.inner.policy;
        self.settle(|tx| core::job::fail(tx, self.job.id, holder, self.token, reason, &policy))
    }
}

impl Drop for ClaimedJob {
    fn drop(&mut self) {
        // Stop the heartbeat; never settle the job implicitly, and never in
        // a forked child.
        if self.life.fork.is_origin_strict() {
            self.life.finish();
            self.life.join();
        }
    }
}
