//! The async API (cargo feature `tokio`): the same leases, jobs and worker
//! loop as the sync [`crate::Client`], as futures and tokio tasks.
//!
//! # Design
//! Nothing here decides anything. The timing rules are the client
//! machines' ([`crate::client::machine`]): [`Client::acquire`] drives a
//! `HolderMachine`, a guard's keep-alive task follows the same step
//! function as the sync keep-alive thread, and [`Queue::work`] drives the
//! same `WorkerMachine` as [`crate::Queue::work`]. The stores are blocking,
//! so every store transaction runs on tokio's blocking pool
//! (`spawn_blocking`); a slow store never stalls the runtime's threads.
//! The exception is a store whose calls never wait
//! ([`crate::Store::runs_inline`]: the mem store, one short lock): its
//! calls run on the calling task, as the two thread hops would cost a
//! hundred times the call (a lease pair 62 µs through the pool, 2.2 µs
//! inline). Not the calls whose cost grows with the queue
//! ([`Queue::purge`], [`Queue::list`]): those go to the pool on every
//! store.
//!
//! - **Waiting parks no thread per waiter.** A waiting acquire sleeps on a
//!   tokio timer until the machine's next retry, or until the store
//!   announces a release. Those announcements come from one watcher per
//!   store handle and event (a blocking-pool thread in `Store::wait_epoch`,
//!   alive while someone listens), however many tasks and clients wait.
//! - **A guard's keep-alive is a task.** It renews on the machine's
//!   schedule; at the local deadline it declares the lease lost even while
//!   a renewal is still in flight. The loss is a future
//!   ([`LeaseGuard::lost`]) and a [`CancellationToken`]
//!   ([`LeaseGuard::cancellation`]) that work can `select!` on.
//!   [`LeaseGuard::release`] awaits the end of the keep-alive before it
//!   releases, so a renewal never outlives the release.
//! - **The worker's handlers are tasks.** A handler's future is dropped
//!   (cancelled) when its claim is lost, its job is cancelled or shutdown's
//!   grace runs out; see [`Queue::work`].
//!
//! # Example
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> leasehold::Result<()> {
//! use leasehold::{tokio::Client, JobSpec, LeaseOptions, MemStore, WorkOptions};
//! use std::time::Duration;
//!
//! let client = Client::new(leasehold::Client::new(MemStore::new()));
//! let guard = client.acquire("nightly-report", LeaseOptions::new(Duration::from_secs(10))).await?;
//! assert!(guard.is_valid());
//! guard.release().await?;
//!
//! let queue = client.queue("emails")?;
//! queue.push(&JobSpec::new(b"hello".to_vec())).await?;
//! let opts = WorkOptions { drain: true, concurrency: 4, ..WorkOptions::default() };
//! let report = queue
//!     .work(&opts, std::future::pending(), |job| async move {
//!         assert_eq!(job.payload(), b"hello");
//!         Ok(())
//!     })
//!     .await?;
//! assert_eq!(report.completed, 1);
//! # Ok(())
//! # }
//! ```

mod election;
mod guard;
mod job;
mod queue;
mod worker;

pub use election::Election;
pub use guard::LeaseGuard;
pub use job::ClaimedJob;
pub use queue::Queue;
pub use tokio_util::sync::CancellationToken;

use crate::client::acquire::{AcquireNext, Acquiring};
use crate::core::{lease::LeaseInfo, JobId, JobRecord, JobState};
use crate::error::Result;
use crate::store::{Store, Wake};
use crate::sync::{lock, Mutex};
use crate::LeaseOptions;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// An async handle on a store with one holder identity, made from a sync
/// [`crate::Client`] (its builder sets the store, holder, clock, drift and
/// policy). Cheap to clone; clones share the identity.
#[derive(Clone)]
pub struct Client {
    sync: crate::Client,
    wakes: Arc<Wakes>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("tokio::Client").field(&self.sync).finish()
    }
}

/// Run a blocking store call on tokio's blocking pool. A panic in it
/// resumes in the caller.
pub(crate) async fn blocking<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    joined(tokio::task::spawn_blocking(f)).await
}

/// Run `f`, a store call: on the calling task when the store's calls never
/// block ([`crate::Store::runs_inline`]: the mem store), else on the
/// blocking pool. Inline, it spends the task's cooperative budget, so a
/// loop of calls still yields now and then (to the task that releases the
/// lease it waits for, on a one-thread runtime).
pub(crate) async fn on_store<R: Send + 'static>(
    inline: bool,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    if inline {
        let r = f();
        tokio::task::coop::consume_budget().await;
        r
    } else {
        blocking(f).await
    }
}

/// What a task returned; a panic in it resumes in the caller.
pub(crate) async fn joined<R>(task: tokio::task::JoinHandle<R>) -> R {
    match task.await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The runtime is shutting down; nothing will poll us further.
        Err(_) => std::future::pending().await,
    }
}

/// Sleep `ms` milliseconds of local time (at least one).
pub(crate) async fn nap(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms.max(1))).await;
}

impl Client {
    /// The async face of `client`.
    pub fn new(client: crate::Client) -> Client {
        let wakes = Wakes::of(client.store());
        Client {
            sync: client,
            wakes,
        }
    }

    /// The sync client underneath (same identity and store).
    pub fn sync(&self) -> &crate::Client {
        &self.sync
    }

    /// This client's holder identity.
    pub fn holder(&self) -> &crate::Holder {
        self.sync.holder()
    }

    pub(crate) fn local_now(&self) -> crate::time::LocalMs {
        self.sync.local_now()
    }

    /// Whether its store's calls run on the calling task ([`on_store`]).
    pub(crate) fn inline(&self) -> bool {
        self.sync.store().runs_inline()
    }

    /// Run `f` with the sync client on the blocking pool, or inline
    /// ([`on_store`]).
    pub(crate) async fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&crate::Client) -> R + Send + 'static,
    ) -> R {
        let sync = self.sync.clone();
        on_store(self.inline(), move || f(&sync)).await
    }

    /// Try once to acquire `key`; [`crate::Error::Held`] if it is taken.
    pub async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<LeaseGuard> {
        self.acquire(key, LeaseOptions::new(ttl)).await
    }

    /// Acquire `key`, waiting up to `opts.wait` without holding a thread:
    /// the holder machine's jittered backoff on a timer, cut short when
    /// the store sees a release. The guard's keep-alive task starts at
    /// once. Semantics as [`crate::Client::acquire`].
    pub async fn acquire(&self, key: &str, opts: LeaseOptions) -> Result<LeaseGuard> {
        let mut acquiring = Acquiring::new(&self.sync, key, &opts)?;
        // Listen before the first attempt, so a release right after it is
        // not missed (a try-once acquire has nothing to wait for).
        let mut released = acquiring
            .waits()
            .then(|| self.wakes.subscribe(Wake::LeaseFreed));
        loop {
            while let Some(next) = acquiring.next() {
                match next {
                    AcquireNext::Send => {
                        let exec = acquiring.exec().clone();
                        // (Dropped unread, a cancelled acquire's answer
                        // takes back a mark the acquire made.)
                        let answer = on_store(self.inline(), move || exec.run()).await;
                        acquiring.reply(answer.take());
                    }
                    AcquireNext::Granted {
                        token,
                        renewed,
                        life,
                    } => {
                        let ttl_ms = acquiring.ttl_ms();
                        let key = acquiring.into_exec().key;
                        return Ok(LeaseGuard::start(self, key, token, ttl_ms, renewed, life));
                    }
                    AcquireNext::Failed(e) => return Err(e),
                }
            }
            let wait = acquiring.wait_ms();
            let woke = match &mut released {
                Some(rx) => tokio::select! {
                    _ = nap(wait) => false,
                    changed = rx.changed() => changed.is_ok(),
                },
                None => {
                    nap(wait).await;
                    false
                }
            };
            if woke {
                acquiring.wake();
            } else {
                acquiring.timeout();
            }
        }
    }

    /// The store's clock now (ms).
    pub async fn store_now(&self) -> Result<crate::StoreMs> {
        self.call(|c| c.store_now()).await
    }

    /// A wall-clock time as an instant of the store's clock (see
    /// [`crate::Client::store_time`]).
    pub async fn store_time(&self, at: std::time::SystemTime) -> Result<crate::StoreMs> {
        self.call(move |c| c.store_time(at)).await
    }

    /// Live holders of `key` and its token counter.
    pub async fn inspect(&self, key: &str) -> Result<LeaseInfo> {
        let key = key.to_owned();
        self.call(move |c| c.inspect(&key)).await
    }

    /// One job by id, as of the store's clock.
    pub async fn job(&self, id: JobId) -> Result<JobRecord> {
        self.call(move |c| c.job(id)).await
    }

    /// Cancel a job by id (see [`crate::Client::cancel_job`]).
    pub async fn cancel_job(&self, id: JobId) -> Result<JobState> {
        self.call(move |c| c.cancel_job(id)).await
    }

    /// Make a dead or cancelled job ready again, by id.
    pub async fn retry_job(&self, id: JobId) -> Result<()> {
        self.call(move |c| c.retry_job(id)).await
    }

    /// A handle on queue `name`.
    pub fn queue(&self, name: &str) -> Result<Queue> {
        Ok(Queue {
            client: self.clone(),
            sync: self.sync.queue(name)?,
        })
    }

    /// A receiver that changes whenever the store announces `wake`.
    pub(crate) fn subscribe(&self, wake: Wake) -> Subscription {
        self.wakes.subscribe(wake)
    }
}

/// The store's announcements (a release, a job made ready) for every task
/// of every client on one store handle: one watcher per event on the
/// blocking pool, started by the first listener and gone when the last
/// one is.
struct Wakes {
    store: Arc<dyn Store>,
    senders: Mutex<[Option<watch::Sender<u64>>; 2]>,
}

/// Longest a watcher sleeps in one wait: how long one lingers after its
/// last listener left if it missed its interruption (a race with the
/// start of its wait), or where the store cannot interrupt its waits
/// (a runtime's shutdown waits for it). Not a poll: a wait that times out
/// sends nothing.
const WATCH_WAIT: Duration = Duration::from_secs(5);

/// The same where the store cannot tell ([`Store::announces_changes`]):
/// it may not interrupt its waits either.
const WATCH_WAIT_UNANNOUNCED: Duration = Duration::from_millis(100);

/// A task's receiver of a store's announcements (it derefs to the
/// [`watch::Receiver`]). The last one dropped interrupts the watcher's
/// wait ([`Store::interrupt_waits`]), so the watcher ends at once rather
/// than wake now and then to see whether anyone still listens.
pub(crate) struct Subscription {
    rx: Option<watch::Receiver<u64>>,
    wakes: Arc<Wakes>,
    wake: Wake,
}

impl std::ops::Deref for Subscription {
    type Target = watch::Receiver<u64>;
    fn deref(&self) -> &Self::Target {
        self.rx
            .as_ref()
            .expect("a subscription's receiver lives until it is dropped")
    }
}

impl std::ops::DerefMut for Subscription {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.rx
            .as_mut()
            .expect("a subscription's receiver lives until it is dropped")
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let last = {
            // Under the lock the watcher reads the count with.
            let senders = lock(&self.wakes.senders);
            drop(self.rx.take());
            senders[self.wake.index()]
                .as_ref()
                .is_some_and(|tx| tx.receiver_count() == 0)
        };
        if last {
            self.wakes.store.interrupt_waits(self.wake);
        }
    }
}

/// The announcements of each store handle in use, by its address.
static ALL_WAKES: std::sync::Mutex<Vec<(usize, std::sync::Weak<Wakes>)>> =
    std::sync::Mutex::new(Vec::new());

impl Wakes {
    /// The announcements of `store`, shared by the clients that use it.
    fn of(store: &Arc<dyn Store>) -> Arc<Wakes> {
        let addr = Arc::as_ptr(store).cast::<()>() as usize;
        let mut all = lock(&ALL_WAKES);
        all.retain(|(_, w)| w.strong_count() > 0);
        if let Some(wakes) = all
            .iter()
            .find(|(a, _)| *a == addr)
            .and_then(|(_, w)| w.upgrade())
        {
            return wakes;
        }
        let wakes = Arc::new(Wakes {
            store: store.clone(),
            senders: Mutex::new([None, None]),
        });
        all.push((addr, Arc::downgrade(&wakes)));
        wakes
    }

    fn subscribe(self: &Arc<Self>, wake: Wake) -> Subscription {
        let mut senders = lock(&self.senders);
        let rx = match &senders[wake.index()] {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(self.store.epoch(wake));
                senders[wake.index()] = Some(tx);
                let me = Arc::clone(self);
                drop(tokio::task::spawn_blocking(move || me.watch(wake)));
                rx
            }
        };
        Subscription {
            rx: Some(rx),
            wakes: Arc::clone(self),
            wake,
        }
    }

    /// The watcher: wait for the store's epoch to move, tell the
    /// listeners; stop (under the lock a new listener takes) once none is
    /// left.
    fn watch(&self, wake: Wake) {
        loop {
            let epoch = {
                let mut senders = lock(&self.senders);
                match &senders[wake.index()] {
                    Some(tx) if tx.receiver_count() > 0 => *tx.borrow(),
                    _ => {
                        senders[wake.index()] = None;
                        return;
                    }
                }
            };
            let wait = if self.store.announces_changes() {
                WATCH_WAIT
            } else {
                WATCH_WAIT_UNANNOUNCED
            };
            if self.store.wait_epoch(wake, epoch, wait) {
                let now = self.store.epoch(wake);
                if let Some(tx) = &lock(&self.senders)[wake.index()] {
                    tx.send_replace(now);
                }
            }
        }
    }
}
