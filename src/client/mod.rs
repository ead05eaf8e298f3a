//! The ergonomic layer: a [`Client`] with a holder identity, lease guards
//! with local deadlines and keep-alive, queue handles, claimed jobs and the
//! worker loop.
//!
//! The timing rules (the local deadline, when to renew, the acquire
//! backoff, the worker loop's claims, renewal rounds, batching, drain and
//! shutdown) are sans-IO state machines in [`machine`]; everything here
//! drives them: [`Client::acquire`] drives a [`machine::HolderMachine`],
//! the keep-alive threads drive a [`machine::Lifetime`], and
//! [`Queue::work`] drives a [`machine::WorkerMachine`].
//!
//! # Validity (L3)
//! A guard or claimed job is valid while all of these hold: it is used in
//! the process that created it (no fork since), it was not released,
//! completed or seen lost, and the holder's own monotonic clock is before
//! the local deadline: the instant the request was *sent*, plus the TTL,
//! minus the drift allowance ([`crate::core::local_deadline_ms`]).

pub(crate) mod acquire;
mod channel;
pub(crate) mod election;
pub(crate) mod guard;
pub(crate) mod job;
pub(crate) mod lifeline;
// The sans-IO machines: the project's own drivers, the simulator and the
// machine tests drive them (no API promise).
#[doc(hidden)]
pub mod machine;
mod queue;
pub(crate) mod session;
mod stop;
mod work_options;
mod worker;

/// The worker session as the simulator drives it (cargo feature
/// `canaries`, the simulator's: not part of the API).
#[cfg(feature = "canaries")]
#[doc(hidden)]
pub mod sim {
    pub use super::session::{Exec, Next, Session, SessionBreakage};
}

use acquire::HeldKeys;
pub use election::{ElectOptions, Election, Leader, LeaderEvent};
pub use guard::LeaseGuard;
pub use job::ClaimedJob;
pub use machine::Deposed;
pub use machine::JobOutcome;
pub use queue::Queue;
pub use stop::{Stop, StopSignal};
pub use work_options::{fit_reason, WorkOptions, WorkReport};
#[cfg(all(feature = "tokio", not(loom)))]
pub(crate) use worker::STORE_THREADS;

use crate::clock::{BootClock, Clock, SystemClock};
use crate::core::{
    self, lease::LeaseInfo, DriftBound, Holder, HolderId, JobId, JobRecord, JobState, QueuePolicy,
};
use crate::error::Field;
use crate::error::{Error, Result};
use crate::fork::ForkGuard;
use crate::store::{Store, StoreExt};
use crate::sync::{lock, AtomicU64, Mutex, Ordering};
use crate::time::{LocalMs, StoreMs, WallMs};
use std::sync::Arc;
use std::time::Duration;

/// Longest wait between two tries of a transaction refused by a transient
/// store error.
const RETRY_CAP_MS: u64 = 100;

/// Milliseconds of a duration, saturating.
pub(crate) fn ms_of(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

struct ClientInner {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    /// Wall-clock time (Unix ms), for schedules' ticks.
    wall: Arc<dyn Clock>,
    holder: Holder,
    drift: DriftBound,
    policy: QueuePolicy,
    busy_timeout: Duration,
    jitter: AtomicU64,
    fork: ForkGuard,
    /// Keys this client holds through a live guard (or leader), each with
    /// its grant's token: a second acquire of one waits like any other
    /// contender instead of sharing the grant ([`Client::mark_held`]).
    held: Mutex<HeldKeys>,
    /// How many keys `held` has, written under its lock after each change:
    /// an acquire's check skips the lock while this client holds nothing.
    held_count: AtomicU64,
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
    wall: Option<Arc<dyn Clock>>,
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

    /// The wall clock schedules' ticks are read on (Unix ms; default:
    /// [`SystemClock`]).
    pub fn wall_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.wall = Some(clock);
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
                wall: self.wall.unwrap_or_else(|| Arc::new(SystemClock)),
                holder,
                drift: self.drift,
                policy,
                busy_timeout: self.busy_timeout,
                jitter: AtomicU64::new(seed),
                fork: ForkGuard::new(),
                held: Mutex::new(HeldKeys::default()),
                held_count: AtomicU64::new(0),
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
            wall: None,
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

    /// The local clock now (deadlines, renewal schedules, timers).
    pub(crate) fn local_now(&self) -> LocalMs {
        LocalMs(self.inner.clock.now_ms())
    }

    /// The wall clock (Unix ms) schedules' ticks are read on.
    pub(crate) fn wall_clock(&self) -> &Arc<dyn Clock> {
        &self.inner.wall
    }

    /// A jitter value in `0..span` (deterministic per client, never shared
    /// with the store's rules).
    pub(crate) fn jitter(&self, span: u64) -> u64 {
        let n = self.inner.jitter.fetch_add(1, Ordering::Relaxed);
        let x = core::mix64(n);
        // A machine's seed takes the whole range: `x % u64::MAX` without
        // the division.
        match span {
            u64::MAX if x == u64::MAX => 0,
            u64::MAX => x,
            span => x % span.max(1),
        }
    }

    /// Run `f` in a store transaction, retrying transient store errors with
    /// jittered exponential backoff until the busy timeout (S1).
    pub(crate) fn run<R>(
        &self,
        op: &'static str,
        f: impl FnMut(&mut dyn core::Txn) -> Result<R>,
    ) -> Result<R> {
        self.run_until(op, None, None, f)
    }

    /// [`Client::run`], telling the store what `f` reads first
    /// ([`crate::FirstRead`]).
    pub(crate) fn run_reading<R>(
        &self,
        op: &'static str,
        first: crate::FirstRead<'_>,
        f: impl FnMut(&mut dyn core::Txn) -> Result<R>,
    ) -> Result<R> {
        self.run_until(op, None, Some(first), f)
    }

    /// [`Client::run`], but retrying no later than `until` on the
    /// local clock (a renewal is pointless past the local deadline).
    /// The busy timeout counts from the call's start on the clock's
    /// [`Clock::retry_ms`]; `until` is read on the local clock, only once
    /// a transaction failed.
    pub(crate) fn run_until<R>(
        &self,
        op: &'static str,
        until: Option<LocalMs>,
        first: Option<crate::FirstRead<'_>>,
        mut f: impl FnMut(&mut dyn core::Txn) -> Result<R>,
    ) -> Result<R> {
        self.inner.fork.check()?;
        let clock = &self.inner.clock;
        let start_ms = clock.retry_ms();
        let busy_ms = ms_of(self.inner.busy_timeout);
        // The jitter is drawn only once a transaction failed (most never do).
        let mut backoff: Option<core::Backoff> = None;
        loop {
            match self.inner.store.txn_reading(op, first, &mut f) {
                Err(e) if e.is_transient() => {
                    let waited_ms = clock.retry_ms().saturating_sub(start_ms);
                    let left_ms = busy_ms.saturating_sub(waited_ms).min(match until {
                        Some(until) => until.saturating_sub(self.local_now()),
                        None => u64::MAX,
                    });
                    let backoff = backoff.get_or_insert_with(|| {
                        core::Backoff::new(1, RETRY_CAP_MS, self.jitter(u64::MAX))
                    });
                    if left_ms == 0 {
                        return Err(Error::Busy {
                            waited_ms,
                            last: Box::new(e),
                        });
                    }
                    let sleep_ms = backoff.next_wait().min(left_ms).max(1);
                    crate::sync::sleep(Duration::from_millis(sleep_ms));
                }
                other => return other,
            }
        }
    }

    /// The local clock deadlines are kept on.
    #[cfg_attr(any(not(feature = "tokio"), loom), allow(dead_code))] // the tokio drivers (not built under loom)
    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The process this client was made in.
    pub(crate) fn fork_guard(&self) -> ForkGuard {
        self.inner.fork
    }

    /// Fail with [`Error::Forked`] in a forked child.
    #[cfg_attr(any(not(feature = "tokio"), loom), allow(dead_code))] // the tokio drivers (not built under loom)
    pub(crate) fn check_fork(&self) -> Result<()> {
        self.inner.fork.check()
    }

    /// One acquire, or the refusal a second guard of this client meets
    /// while one holds the key. A mark whose grant the store no longer
    /// holds gives way (the grant ran out there while its guard lived on,
    /// past its local deadline): the acquire then gets a new grant, with a
    /// larger token. A grant that extended a slot of this holder is marked
    /// here ([`Client::claim_extended`]).
    pub(crate) fn try_acquire_once(
        &self,
        key: &str,
        ttl_ms: u64,
        limit: u32,
    ) -> Result<core::Grant> {
        let marked = match self.holds_any() {
            true => lock(&self.inner.held).live.get(key).copied(),
            false => None,
        };
        if let Some(token) = marked {
            let info = self.inspect(key)?;
            let me = self.inner.holder.id;
            if info
                .holders
                .iter()
                .any(|h| h.holder.id == me && h.token == token)
            {
                return Err(Error::Held {
                    key: key.to_owned(),
                    holders: info.holders,
                });
            }
            self.unmark_held(key, token);
        }
        let holder = &self.inner.holder;
        let first = Some(crate::FirstRead::Lease(key));
        // A slot found gone is released by now: the next try makes a
        // new grant (or extends a slot another guard of this client got
        // meanwhile, and is refused by its mark).
        let mut tries = 0;
        loop {
            let grant = self.inner.store.txn_reading("acquire", first, |tx| {
                core::lease::acquire(tx, key, holder, ttl_ms, limit)
            })?;
            if !grant.renewed {
                return Ok(grant);
            }
            tries += 1;
            match self.claim_extended(key, grant)? {
                Some(grant) => return Ok(grant),
                None if tries < 3 => continue,
                None => {
                    return Err(Error::transient(
                        format!("acquiring {key:?}"),
                        "the grant this acquire extended was released meanwhile",
                    ))
                }
            }
        }
    }

    /// The store's clock now, the time its rules run on: convert a
    /// record's instants to wall-clock time from their distance to it.
    pub fn store_now(&self) -> Result<StoreMs> {
        self.run("now", |tx| Ok(StoreMs(tx.now_ms())))
    }

    /// A wall-clock time as an instant of the store's clock (for a job's
    /// [`JobSpec::run_at`](crate::JobSpec::run_at): "at 18:00"), through
    /// one reading of each: the store's now plus the time from this
    /// client's wall clock's now to `at` (a time in the past comes out as
    /// far in the store's past).
    pub fn store_time(&self, at: std::time::SystemTime) -> Result<StoreMs> {
        let store_now = self.store_now()?;
        let wall_now = WallMs::read(&*self.inner.wall);
        let at_ms = match at.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => ms_of(d),
            Err(_) => 0,
        };
        Ok(if at_ms >= wall_now.ms() {
            store_now.saturating_add(at_ms - wall_now.ms())
        } else {
            store_now.saturating_sub_ms(wall_now.ms() - at_ms)
        })
    }

    /// Live holders of `key` and its token counter.
    pub fn inspect(&self, key: &str) -> Result<LeaseInfo> {
        self.run("inspect", |tx| core::lease::inspect(tx, key))
    }

    /// Renew a lease by key and token (for callers that keep the token
    /// themselves, like the CLI). Returns the grant with its store expiry.
    pub fn renew(&self, key: &str, token: u64, ttl: Duration) -> Result<core::Grant> {
        let id = self.inner.holder.id;
        self.run_reading("renew", crate::FirstRead::Lease(key), |tx| {
            core::lease::renew(tx, key, id, token, ms_of(ttl))
        })
    }

    /// Release a lease by key and token.
    pub fn release(&self, key: &str, token: u64) -> Result<()> {
        self.release_grant(key, token, false)
    }

    /// End this client's grant `token` of `key` (a guard's end): release
    /// it by token if `release` (in one attempt if `once`), then take back
    /// the client's mark on the key, however the release went: its next
    /// acquire asks the store. (If the release went unanswered and the
    /// store still holds the grant, that acquire extends it: the same
    /// token, `renewed()` true, as for any acquire by the grant's holder.)
    pub(crate) fn end_grant(&self, key: &str, token: u64, release: bool, once: bool) -> Result<()> {
        let released = match release {
            true => self.release_grant(key, token, once),
            false => Ok(()),
        };
        self.unmark_held(key, token);
        released
    }

    /// [`Client::release`], retrying transient store errors up to the busy
    /// timeout, or trying `once` (a guard lost at its local deadline, most
    /// often because the store is out of reach, frees its grant if it can,
    /// without making its caller wait).
    pub(crate) fn release_grant(&self, key: &str, token: u64, once: bool) -> Result<()> {
        let id = self.inner.holder.id;
        let first = Some(crate::FirstRead::Lease(key));
        let until = once.then_some(LocalMs::ZERO);
        self.run_until("release", until, first, |tx| {
            core::lease::release(tx, key, id, token)
        })
    }

    /// One job by id, as of the store's clock.
    pub fn job(&self, id: JobId) -> Result<JobRecord> {
        let policy = self.inner.policy;
        self.run("get", |tx| core::job::get(tx, id, &policy))
    }

    /// Cancel a job by id; returns its state afterwards (running means a
    /// cancel was requested, seen by its worker at the next heartbeat).
    pub fn cancel_job(&self, id: JobId) -> Result<JobState> {
        let policy = self.inner.policy;
        self.run("cancel", |tx| core::job::cancel(tx, id, &policy))
    }

    /// Make a dead or cancelled job ready again, by id.
    pub fn retry_job(&self, id: JobId) -> Result<()> {
        let policy = self.inner.policy;
        self.run("retry", |tx| core::job::retry(tx, id, &policy))
    }

    /// A handle on queue `name`.
    pub fn queue(&self, name: &str) -> Result<Queue> {
        core::check_key(Field::Queue, name)?;
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

    std::thread_local! {
        /// A [`Channel`] popper that takes an item and leaves others
        /// behind wakes nobody: the lost wake-up its rule prevents.
        pub static SILENT_POP: Cell<bool> = const { Cell::new(false) };
    }

    /// Whether the silent pop is on.
    pub fn silent_pop() -> bool {
        SILENT_POP.with(Cell::get)
    }

    /// The worker loop's queue between threads, for its model.
    pub use super::channel::Channel;
}
