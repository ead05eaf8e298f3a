//! [`Channel`]: a closable queue between a driver's threads (requests to
//! store threads, jobs to handler threads, replies back), and
//! [`spawn_waker`], the thread that turns a store's announcements into
//! deliveries.

use crate::store::{Store, Wake};
use crate::sync::{lock, nap, thread, Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Longest a waker thread sleeps in one wait where the store announces
/// changes: how long one that missed its interruption (a race with the
/// start of its wait) lingers after its driver ended. Not a poll: a wait
/// that times out delivers nothing.
const WAKER_WAIT: Duration = Duration::from_secs(10);

/// The same where the store cannot tell ([`Store::announces_changes`]):
/// it may not interrupt its waits either, and its waiters poll anyway.
const WAKER_WAIT_UNANNOUNCED: Duration = Duration::from_secs(1);

/// The thread [`spawn_waker`] started. Dropping this stops it: it is told
/// at once ([`Store::interrupt_waits`]) and ends without delivering.
pub(crate) struct WakerThread {
    quit: Arc<AtomicBool>,
    store: Arc<dyn Store>,
    wake: Wake,
}

impl Drop for WakerThread {
    fn drop(&mut self) {
        self.quit.store(true, Ordering::SeqCst);
        self.store.interrupt_waits(self.wake);
    }
}

/// Call `deliver` whenever `store` announces `wake`, on a thread of its
/// own, until the returned handle is dropped. Detached, so that a driver
/// that stops never waits for the thread (it ends when interrupted, at
/// worst after [`WAKER_WAIT`], holding its store handle until then):
/// `Queue::work --drain` and `elect --once` return as soon as they are
/// done. It wakes only when `wake` is announced (or interrupted), so an
/// idle driver's waker costs nothing.
pub(crate) fn spawn_waker(
    store: Arc<dyn Store>,
    wake: Wake,
    deliver: impl Fn() + Send + 'static,
) -> crate::error::Result<WakerThread> {
    let quit = Arc::new(AtomicBool::new(false));
    let handle = WakerThread {
        quit: quit.clone(),
        store: store.clone(),
        wake,
    };
    // Read here, before the driver's first look at the store (not on the
    // thread, which may start after it): a change between the two is
    // delivered. Then the epoch last delivered, read before the delivery:
    // a change committed while the driver acts on it moves the epoch past
    // it, and the next wait returns at once.
    let mut epoch = store.epoch(wake);
    thread::Builder::new()
        .name("leasehold-waker".to_owned())
        .spawn(move || {
            let wait = if store.announces_changes() {
                WAKER_WAIT
            } else {
                WAKER_WAIT_UNANNOUNCED
            };
            while !quit.load(Ordering::SeqCst) {
                if store.wait_epoch(wake, epoch, wait) {
                    epoch = store.epoch(wake);
                    if !quit.load(Ordering::SeqCst) {
                        deliver();
                    }
                }
            }
        })
        .map(|_| handle)
        .map_err(|e| crate::Error::store("starting the waker thread", e.to_string()))
}

/// A closable queue between threads. A push wakes a sleeping popper only
/// when none is already on its way, and a popper that takes an item and
/// leaves others behind passes the wake-up on: a batch of pushes costs a
/// wake-up per popper that is needed, not one per item, and an item is
/// never left while a popper sleeps (every item left behind has a popper
/// on its way or awake: the one that left it, or one it woke).
pub struct Channel<T> {
    state: Mutex<ChannelState<T>>,
    cv: Condvar,
}

struct ChannelState<T> {
    items: VecDeque<T>,
    closed: bool,
    /// Poppers waiting on the condvar.
    sleepers: usize,
    /// Of those, how many were woken and have not run yet.
    woken: usize,
}

impl<T> ChannelState<T> {
    /// Count a sleeper woken, unless every sleeper is already: whether to
    /// notify one (after the lock is let go, so that the sleeper does not
    /// wake only to wait for it).
    fn wake_one(&mut self) -> bool {
        let wake = self.sleepers > self.woken;
        self.woken += usize::from(wake);
        wake
    }
}

impl<T> Channel<T> {
    /// An empty, open channel.
    pub fn new() -> Self {
        Channel {
            state: Mutex::new(ChannelState {
                items: VecDeque::new(),
                closed: false,
                sleepers: 0,
                woken: 0,
            }),
            cv: Condvar::new(),
        }
    }

    /// Queue `item`, waking a popper if none is on its way.
    pub fn push(&self, item: T) {
        let mut state = lock(&self.state);
        state.items.push_back(item);
        let wake = state.woken == 0 && state.wake_one();
        drop(state);
        if wake {
            self.cv.notify_one();
        }
    }

    /// The next item, waiting for one; `None` once closed.
    pub fn pop(&self) -> Option<T> {
        let mut state = lock(&self.state);
        loop {
            if let Some(item) = state.items.pop_front() {
                #[cfg(loom)]
                let silent = super::loom_canary::silent_pop();
                #[cfg(not(loom))]
                let silent = false;
                let wake = !state.items.is_empty() && !silent && state.wake_one();
                drop(state);
                if wake {
                    self.cv.notify_one();
                }
                return Some(item);
            }
            if state.closed {
                return None;
            }
            state.sleepers += 1;
            state = match self.cv.wait(state) {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            state.sleepers -= 1;
            // A spurious return (std's condvar may make one; loom's does
            // not) counts as a wake-up: at worst the next push wakes one
            // sleeper more than it needed.
            state.woken = state.woken.saturating_sub(1);
        }
    }

    /// Queue `item` and take the oldest item in one step, for a popper
    /// that pushes work it would pop at once: order is kept (the oldest
    /// goes first) and nobody is woken (the count of items is unchanged,
    /// so every item left has the popper it had).
    pub fn swap(&self, item: T) -> T {
        let mut state = lock(&self.state);
        match state.items.pop_front() {
            Some(oldest) => {
                state.items.push_back(item);
                oldest
            }
            None => item,
        }
    }

    /// Close: poppers get what is queued, then `None`.
    pub fn close(&self) {
        lock(&self.state).closed = true;
        self.cv.notify_all();
    }

    /// Everything queued, waiting up to `timeout` for something when
    /// nothing is (empty once closed, or when the wait runs out).
    pub fn drain_wait(&self, timeout: Duration) -> Vec<T> {
        let mut state = lock(&self.state);
        if state.items.is_empty() && !state.closed && !timeout.is_zero() {
            state.sleepers += 1;
            state = nap(&self.cv, &self.state, state, timeout);
            state.sleepers -= 1;
            state.woken = state.woken.saturating_sub(1);
        }
        state.items.drain(..).collect()
    }
}
