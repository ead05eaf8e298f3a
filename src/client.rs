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
//! [`Lifeline`] is the one mechanism behind both guards and claimed jobs: a
//! shared validity record plus an optional thread that renews about every
//! TTL/3 (with jitter), stops promptly on release, and reports loss exactly
//! once. A renewal never revives a released lease: the store only extends a
//! live slot named by holder and token, and release removes the slot.

use crate::clock::{Clock, MonotonicClock};
use crate::core::{
    self, lease::LeaseInfo, DriftBound, EnqueueOutcome, Holder, HolderId, JobId, JobRecord,
    JobSpec, JobState, QueuePolicy, StateCounts,
};
use crate::error::{Error, LostReason, Result, Target};
use crate::fork::ForkGuard;
use crate::store::{Store, StoreExt};
use crate::sync::{lock, thread, AtomicBool, AtomicU64, Condvar, Mutex, Ordering};
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

    /// The clock for local deadlines (default: [`MonotonicClock`]).
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
                clock: self
                    .clock
                    .unwrap_or_else(|| Arc::new(MonotonicClock::new())),
                holder,
                drift: self.drift,
                policy,
                busy_timeout: self.busy_timeout,
                jitter: AtomicU64::new(seed),
                fork: ForkGuard::new(),
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
    fn run<R>(&self, what: &str, f: impl FnMut(&mut dyn core::Txn) -> Result<R>) -> Result<R> {
        self.inner.fork.check()?;
        let mut f = f;
        let start_ms = self.local_now_ms();
        let mut backoff_ms = 1u64;
        loop {
            match self.inner.store.txn(&mut f) {
                Err(e) if e.is_transient() => {
                    let waited_ms = self.local_now_ms().saturating_sub(start_ms);
                    if waited_ms >= ms(self.inner.busy_timeout) {
                        return Err(Error::Busy {
                            waited_ms,
                            last: Box::new(e),
                        });
                    }
                    let _ = what;
                    let sleep_ms = backoff_ms / 2 + self.jitter(backoff_ms / 2 + 1);
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
    /// early when the store sees a release). Re-acquiring a key this
    /// client already holds extends it (same token).
    pub fn acquire(&self, key: &str, opts: LeaseOptions) -> Result<LeaseGuard> {
        let ttl_ms = ms(opts.ttl);
        let start_ms = self.local_now_ms();
        let wait_ms = ms(opts.wait);
        let mut backoff_ms = 1u64;
        loop {
            let epoch = self.inner.store.lease_epoch();
            let sent_at_ms = self.local_now_ms();
            let holder = &self.inner.holder;
            match self.run("acquiring", |tx| {
                core::lease::acquire(tx, key, holder, ttl_ms, opts.limit)
            }) {
                Ok(grant) => {
                    return Ok(LeaseGuard::new(
                        self.clone(),
                        key,
                        grant.token,
                        ttl_ms,
                        sent_at_ms,
                    ))
                }
                Err(Error::Held { key, holders }) => {
                    let waited_ms = self.local_now_ms().saturating_sub(start_ms);
                    if waited_ms >= wait_ms {
                        return Err(Error::Held { key, holders });
                    }
                    let sleep_ms = (backoff_ms / 2 + self.jitter(backoff_ms / 2 + 1))
                        .min(wait_ms - waited_ms)
                        .max(1);
                    self.inner
                        .store
                        .wait_lease_epoch(epoch, Duration::from_millis(sleep_ms));
                    backoff_ms = (backoff_ms * 2).min(250);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Live holders of `key` and its token counter.
    pub fn inspect(&self, key: &str) -> Result<LeaseInfo> {
        self.run("inspecting", |tx| core::lease::inspect(tx, key))
    }

    /// Renew a lease by key and token (for callers that keep the token
    /// themselves, like the CLI). Returns the new store expiry.
    pub fn renew(&self, key: &str, token: u64, ttl: Duration) -> Result<core::Grant> {
        let id = self.inner.holder.id;
        self.run("renewing", |tx| {
            core::lease::renew(tx, key, id, token, ms(ttl))
        })
    }

    /// Release a lease by key and token.
    pub fn release(&self, key: &str, token: u64) -> Result<()> {
        let id = self.inner.holder.id;
        self.run("releasing", |tx| core::lease::release(tx, key, id, token))
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

/// Shared validity state of a guard or claimed job, and its keep-alive.
struct Lifeline {
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
}

/// What a renewal closure reports.
type RenewFn = Box<dyn FnMut() -> Result<RenewOk> + Send>;

struct RenewOk {
    local_deadline_ms: u64,
    cancel_requested: bool,
}

impl Lifeline {
    fn new(local_deadline_ms: u64) -> Arc<Lifeline> {
        Arc::new(Lifeline {
            state: Mutex::new(LifeState {
                local_deadline_ms,
                ..LifeState::default()
            }),
            wake: Condvar::new(),
            fork: ForkGuard::new(),
        })
    }

    fn is_valid(&self, now_ms: u64) -> bool {
        let st = lock(&self.state);
        self.fork.is_origin() && !st.finished && st.lost.is_none() && now_ms < st.local_deadline_ms
    }

    /// Check the handle may act: same process, not finished, not lost.
    fn check_usable(&self, target: impl FnOnce() -> Target) -> Result<()> {
        self.fork.check()?;
        let st = lock(&self.state);
        if st.finished {
            return Err(Error::Lost {
                target: target(),
                reason: LostReason::StaleToken,
            });
        }
        if let Some(reason) = st.lost {
            return Err(Error::Lost {
                target: target(),
                reason,
            });
        }
        Ok(())
    }

    /// Record the outcome of a renewal made by anyone (thread or caller).
    /// Returns true if this call is the one that first saw a loss.
    fn record(&self, outcome: &Result<RenewOk>, now_ms: u64) -> bool {
        let mut st = lock(&self.state);
        match outcome {
            Ok(ok) if !st.finished && st.lost.is_none() => {
                st.local_deadline_ms = ok.local_deadline_ms;
                st.cancel_requested |= ok.cancel_requested;
                false
            }
            Ok(_) => false,
            Err(Error::Lost { reason, .. }) if st.lost.is_none() && !st.finished => {
                st.lost = Some(*reason);
                self.wake.notify_all();
                true
            }
            Err(_) if st.lost.is_none() && !st.finished && now_ms >= st.local_deadline_ms => {
                st.lost = Some(LostReason::LocalDeadline);
                self.wake.notify_all();
                true
            }
            Err(_) => false,
        }
    }

    /// Mark finished (released, completed, failed); stops the keep-alive.
    /// Returns false if it was finished already.
    fn finish(&self) -> bool {
        let mut st = lock(&self.state);
        let was = st.finished;
        st.finished = true;
        self.wake.notify_all();
        !was
    }

    /// Wait until the keep-alive thread has exited.
    fn join(&self) {
        let mut st = lock(&self.state);
        while st.thread_running {
            st = match self.wake.wait(st) {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
        }
    }

    /// Start a thread that calls `renew` about every `interval_ms` (with
    /// jitter from `seed`) until finished or lost, and calls `on_lost` once
    /// on loss.
    fn spawn_keep_alive(
        self: &Arc<Self>,
        clock: Arc<dyn Clock>,
        interval_ms: u64,
        seed: u64,
        mut renew: RenewFn,
        on_lost: Box<dyn FnOnce(Error) + Send>,
    ) -> Result<()> {
        {
            let mut st = lock(&self.state);
            if st.thread_running || st.finished || st.lost.is_some() {
                return Ok(());
            }
            st.thread_running = true;
        }
        let me = Arc::clone(self);
        let spawned = thread::Builder::new()
            .name("leasehold-keepalive".to_owned())
            .spawn(move || {
                me.keep_alive_loop(&*clock, interval_ms, seed, &mut renew, on_lost);
                let mut st = lock(&me.state);
                st.thread_running = false;
                me.wake.notify_all();
            });
        if let Err(e) = spawned {
            lock(&self.state).thread_running = false;
            return Err(Error::store(
                "starting the keep-alive thread",
                e.to_string(),
            ));
        }
        Ok(())
    }

    fn keep_alive_loop(
        &self,
        clock: &dyn Clock,
        interval_ms: u64,
        seed: u64,
        renew: &mut RenewFn,
        on_lost: Box<dyn FnOnce(Error) + Send>,
    ) {
        let mut round = 0u64;
        let mut next_wait_ms = interval_ms;
        loop {
            {
                let st = lock(&self.state);
                if st.finished || st.lost.is_some() {
                    return;
                }
                // Jitter of +-10 % so that many holders do not renew in step.
                let span = (next_wait_ms / 5).max(1);
                let wait_ms = next_wait_ms - next_wait_ms / 10 + core::mix64(seed ^ round) % span;
                round += 1;
                let st = match self.wake.wait_timeout(st, Duration::from_millis(wait_ms)) {
                    Ok((g, _)) => g,
                    Err(p) => p.into_inner().0,
                };
                if st.finished || st.lost.is_some() {
                    return;
                }
            }
            let outcome = renew();
            let now_ms = clock.now_ms();
            let first_loss = self.record(&outcome, now_ms);
            match outcome {
                Ok(_) => next_wait_ms = interval_ms,
                Err(e) if first_loss => {
                    on_lost(e);
                    return;
                }
                Err(_) => {
                    // Transient trouble: retry sooner while the deadline allows.
                    next_wait_ms = (interval_ms / 4).max(1);
                }
            }
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
        LeaseGuard {
            client,
            key: key.to_owned(),
            token,
            ttl_ms,
            life: Lifeline::new(deadline),
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

    /// The TTL renewals use.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }

    /// Whether the holder may act now: same process, not released or lost,
    /// and before the local deadline on the holder's own clock.
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
        lock(&self.life.state).lost
    }

    fn target(&self) -> Target {
        Target::Lease {
            key: self.key.clone(),
            token: self.token,
        }
    }

    fn renew_fn(&self) -> RenewFn {
        let client = self.client.clone();
        let key = self.key.clone();
        let (token, ttl_ms) = (self.token, self.ttl_ms);
        Box::new(move || {
            let sent_at_ms = client.local_now_ms();
            let id = client.inner.holder.id;
            client.run("renewing", |tx| {
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
        self.life.check_usable(|| self.target())?;
        let outcome = (self.renew_fn())();
        self.life.record(&outcome, self.client.local_now_ms());
        outcome.map(|_| ())
    }

    /// Renew in a background thread about every TTL/3; `on_lost` is called
    /// once if the lease is lost (refused renewal, or the local deadline
    /// passed while renewals failed).
    pub fn keep_alive(&self, on_lost: impl FnOnce(Error) + Send + 'static) -> Result<()> {
        self.life.check_usable(|| self.target())?;
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

    fn release_inner(&self) -> Result<()> {
        self.life.fork.check()?;
        if !self.life.finish() {
            return Ok(());
        }
        self.life.join();
        let id = self.client.inner.holder.id;
        self.client.run("releasing", |tx| {
            core::lease::release(tx, &self.key, id, self.token)
        })
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        // In a forked child, do nothing: the lease is the parent's.
        if self.life.fork.is_origin_strict() {
            let _ = self.release_inner();
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
    /// Jobs claimed per transaction.
    pub batch: usize,
    /// Return once no job is ready or running.
    pub drain: bool,
    /// Longest sleep between claims when the queue is empty.
    pub idle_poll: Duration,
}

impl Default for WorkOptions {
    fn default() -> Self {
        WorkOptions {
            lease: Duration::from_secs(30),
            batch: 1,
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
    /// Jobs whose claim was lost before the outcome was recorded.
    pub lost: u64,
}

impl Queue {
    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Enqueue a job.
    pub fn push(&self, spec: &JobSpec) -> Result<EnqueueOutcome> {
        let policy = self.client.inner.policy;
        self.client.run("enqueueing", |tx| {
            core::job::enqueue(tx, &self.name, spec, &policy)
        })
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
        let jobs = self.client.run("claiming", |tx| {
            core::job::claim(tx, &self.name, holder, lease_ms, max, &policy)
        })?;
        let deadline = core::local_deadline_ms(sent_at_ms, lease_ms, self.client.inner.drift);
        Ok(jobs
            .into_iter()
            .map(|job| ClaimedJob {
                client: self.client.clone(),
                token: job.claim.map_or(0, |c| c.token),
                lease_ms,
                job,
                life: Lifeline::new(deadline),
            })
            .collect())
    }

    /// Jobs per state.
    pub fn stats(&self) -> Result<StateCounts> {
        let policy = self.client.inner.policy;
        self.client
            .run("counting", |tx| core::job::stats(tx, &self.name, &policy))
    }

    /// Up to `limit` jobs after id `after`, optionally only in `state`.
    pub fn list(
        &self,
        state: Option<JobState>,
        after: JobId,
        limit: usize,
    ) -> Result<Vec<JobRecord>> {
        let policy = self.client.inner.policy;
        self.client.run("listing", |tx| {
            core::job::list(tx, &self.name, state, after, limit, &policy)
        })
    }

    /// One job by id (any queue).
    pub fn get(&self, id: JobId) -> Result<JobRecord> {
        let policy = self.client.inner.policy;
        self.client
            .run("reading", |tx| core::job::get(tx, id, &policy))
    }

    /// Cancel a job; returns its state afterwards (running means a cancel
    /// was requested).
    pub fn cancel(&self, id: JobId) -> Result<JobState> {
        let policy = self.client.inner.policy;
        self.client
            .run("cancelling", |tx| core::job::cancel(tx, id, &policy))
    }

    /// Make a dead or cancelled job ready again.
    pub fn retry(&self, id: JobId) -> Result<()> {
        let policy = self.client.inner.policy;
        self.client
            .run("retrying", |tx| core::job::retry(tx, id, &policy))
    }

    /// Delete terminal jobs that finished at least `older_than` ago.
    /// Returns how many were deleted.
    pub fn purge(&self, older_than: Duration) -> Result<u64> {
        const CHUNK: usize = 1000;
        let policy = self.client.inner.policy;
        let mut total = 0u64;
        loop {
            let n = self.client.run("purging", |tx| {
                core::job::purge(tx, &self.name, ms(older_than), CHUNK, &policy)
            })?;
            total += n as u64;
            if n < CHUNK {
                return Ok(total);
            }
        }
    }

    /// Claim and run jobs until `stop` is set (or, with `drain`, until no
    /// job is ready or running). Each job gets a heartbeat thread; the
    /// handler's `Ok` completes it, `Err(reason)` fails it.
    pub fn work(
        &self,
        opts: &WorkOptions,
        stop: &AtomicBool,
        mut handler: impl FnMut(&ClaimedJob) -> std::result::Result<(), String>,
    ) -> Result<WorkReport> {
        let mut report = WorkReport::default();
        let mut idle_ms = 1u64;
        while !stop.load(Ordering::SeqCst) {
            let jobs = self.claim_batch(opts.batch.max(1), opts.lease)?;
            if jobs.is_empty() {
                if opts.drain {
                    let counts = self.stats()?;
                    if counts.get(JobState::Ready) == 0 && counts.get(JobState::Running) == 0 {
                        break;
                    }
                }
                let cap = ms(opts.idle_poll).max(1);
                let sleep_ms = idle_ms / 2 + self.client.jitter(idle_ms / 2 + 1);
                crate::sync::sleep(Duration::from_millis(sleep_ms.min(cap)));
                idle_ms = (idle_ms * 2).min(cap);
                continue;
            }
            idle_ms = 1;
            for job in jobs {
                job.heartbeat_in_background(|_| {})?;
                let outcome = handler(&job);
                let recorded = match outcome {
                    Ok(()) => job.complete().map(|()| &mut report.completed),
                    Err(reason) => job.fail(&reason).map(|_| &mut report.failed),
                };
                match recorded {
                    Ok(count) => *count += 1,
                    Err(e) if e.is_lost() => report.lost += 1,
                    Err(e) => return Err(e),
                }
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
        lock(&self.life.state).cancel_requested
    }

    fn target(&self) -> Target {
        Target::Job {
            id: self.job.id,
            token: self.token,
        }
    }

    fn renew_fn(&self) -> RenewFn {
        let client = self.client.clone();
        let (id, token, lease_ms) = (self.job.id, self.token, self.lease_ms);
        Box::new(move || {
            let sent_at_ms = client.local_now_ms();
            let holder = client.inner.holder.id;
            let reply = client.run("heartbeating", |tx| {
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
        self.life.check_usable(|| self.target())?;
        let outcome = (self.renew_fn())();
        self.life.record(&outcome, self.client.local_now_ms());
        outcome.map(|ok| ok.cancel_requested)
    }

    /// Heartbeat in a background thread about every third of the lease;
    /// `on_lost` is called once if the claim is lost.
    pub fn heartbeat_in_background(
        &self,
        on_lost: impl FnOnce(Error) + Send + 'static,
    ) -> Result<()> {
        self.life.check_usable(|| self.target())?;
        self.life.spawn_keep_alive(
            self.client.inner.clock.clone(),
            (self.lease_ms / 3).max(1),
            self.token ^ self.job.id.0,
            self.renew_fn(),
            Box::new(on_lost),
        )
    }

    fn settle<R>(&self, f: impl FnMut(&mut dyn core::Txn) -> Result<R>) -> Result<R> {
        self.life.check_usable(|| self.target())?;
        self.life.finish();
        self.life.join();
        self.client.run("settling", f)
    }

    /// Mark the job done (Q2: only with the current, unexpired claim).
    pub fn complete(&self) -> Result<()> {
        let holder = self.client.inner.holder.id;
        self.settle(|tx| core::job::complete(tx, self.job.id, holder, self.token))
    }

    /// Report the attempt failed; returns the job's new state (scheduled
    /// for a retry, dead, or cancelled).
    pub fn fail(&self, reason: &str) -> Result<JobState> {
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
