//! [`Stop`]: what tells a sync worker loop ([`Queue::work`]) to stop, and
//! [`StopSignal`], the stop flag that wakes the loops watching it.
//!
//! # State
//! A [`StopSignal`]: the flag (false until [`StopSignal::set`], then true
//! for good) and the wakers of the loops watching it.
//!
//! # Transitions
//! - **watch** (a loop starts): its waker joins the list.
//! - **set**: the flag turns true, then every waker in the list is woken
//!   (outside the list's lock).
//! - **unwatch** (a loop ends): its waker leaves the list.
//!
//! # Invariants
//! A loop that watches never misses the stop: it reads the flag at every
//! step after it joined the list, and `set` writes the flag before it
//! reads the list, so either the loop's next look sees the flag or `set`
//! finds its waker. A loop that cannot watch (a plain [`AtomicBool`]) has
//! to look: it wakes every 200 ms while idle to do so. A loop on a
//! [`StopSignal`] sleeps until its own timers (the idle claim, every
//! [`WorkOptions::idle_poll`](super::WorkOptions::idle_poll) at most;
//! and at most 30 s apart, a backstop for a system suspend), the store's
//! announcements or the signal wake it.
//!
//! [`Queue::work`]: super::Queue::work

use crate::sync::{lock, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Waker;

/// What tells a sync worker loop ([`Queue::work`](super::Queue::work)) to
/// stop. A plain [`AtomicBool`] is looked at every 200 ms while the loop
/// is idle; a [`StopSignal`] wakes the loop when it is set, so the loop
/// acts on it at once and an idle loop wakes only for its own work.
///
/// Implement it for your own shutdown source:
/// - `is_set` must stay true once it turned true, and be cheap: the loop
///   calls it at every step, holding its own lock;
/// - a `watch` that returns true promises to wake `waker` once `is_set`
///   turns true, from any thread (a wake from inside `is_set`, or from the
///   loop's `observe`, is allowed);
/// - `unwatch` forgets the waker that `watch` was given (the same
///   [`Waker::data`]).
pub trait Stop: Sync {
    /// Whether the loop should stop (begin its shutdown).
    fn is_set(&self) -> bool;

    /// Wake `waker` (`wake_by_ref`) once [`Stop::is_set`] turns true, and
    /// return true; or return false if this flag wakes nobody (the loop
    /// then looks at it every 200 ms). The loop reads `is_set` after this
    /// call, so a flag set meanwhile need not wake it.
    fn watch(&self, waker: &Waker) -> bool {
        let _ = waker;
        false
    }

    /// Forget `waker` (the loop that watched has ended).
    fn unwatch(&self, waker: &Waker) {
        let _ = waker;
    }
}

impl Stop for AtomicBool {
    fn is_set(&self) -> bool {
        self.load(Ordering::SeqCst)
    }
}

/// A reference or an `Arc` stops as what it points to (so `&flag` and
/// `&arc` of either kind pass where a `&dyn Stop` is asked for, as a
/// `&AtomicBool` did before).
macro_rules! forward_stop {
    ($($ty:ty where [$($bound:tt)+]);+) => {$(
        impl<S: $($bound)+> Stop for $ty {
            fn is_set(&self) -> bool {
                (**self).is_set()
            }
            fn watch(&self, waker: &Waker) -> bool {
                (**self).watch(waker)
            }
            fn unwatch(&self, waker: &Waker) {
                (**self).unwatch(waker)
            }
        }
    )+};
}

forward_stop!(&S where [Stop + ?Sized]; std::sync::Arc<S> where [Stop + Send + ?Sized]);

/// A stop flag that wakes the worker loops watching it: set it (from any
/// thread, once or more) and every loop given it begins its shutdown at
/// once, where a loop given a plain [`AtomicBool`] notices within 200 ms.
/// Not for a signal handler (`set` takes a lock): set it from the thread
/// that watches for signals.
///
/// ```
/// use leasehold::{Client, MemStore, StopSignal, WorkOptions};
///
/// let client = Client::new(MemStore::new());
/// let queue = client.queue("emails")?;
/// let stop = StopSignal::new();
/// std::thread::scope(|s| {
///     let worker = s.spawn(|| queue.work(&WorkOptions::default(), &stop, |_job| Ok(())));
///     stop.set(); // e.g. on SIGTERM
///     worker.join().unwrap()
/// })?;
/// # Ok::<(), leasehold::Error>(())
/// ```
pub struct StopSignal {
    set: AtomicBool,
    watchers: Mutex<Vec<Waker>>,
}

impl StopSignal {
    /// A signal not yet set.
    pub fn new() -> Self {
        StopSignal {
            set: AtomicBool::new(false),
            watchers: Mutex::new(Vec::new()),
        }
    }

    /// Set the flag (for good) and wake every loop watching it.
    pub fn set(&self) {
        self.set.store(true, Ordering::SeqCst);
        let watchers = std::mem::take(&mut *lock(&self.watchers));
        for waker in watchers {
            waker.wake();
        }
    }

    /// Whether [`StopSignal::set`] was called.
    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }
}

impl Default for StopSignal {
    fn default() -> Self {
        StopSignal::new()
    }
}

impl std::fmt::Debug for StopSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StopSignal")
            .field("set", &self.is_set())
            .field("watchers", &lock(&self.watchers).len())
            .finish()
    }
}

impl Stop for StopSignal {
    fn is_set(&self) -> bool {
        StopSignal::is_set(self)
    }

    fn watch(&self, waker: &Waker) -> bool {
        let mut watchers = lock(&self.watchers);
        // Set already: the loop's next look sees it, nothing to keep.
        if !self.is_set() {
            watchers.push(waker.clone());
        }
        true
    }

    fn unwatch(&self, waker: &Waker) {
        // Each loop's waker has its own data pointer (`will_wake` may
        // also say false for a clone of the same waker).
        lock(&self.watchers).retain(|w| !std::ptr::eq(w.data(), waker.data()));
    }
}
