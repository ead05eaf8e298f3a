//! The synchronization primitives everything shared between threads uses:
//! std's normally, loom's under `RUSTFLAGS="--cfg loom"` so the loom models
//! in `tests/loom.rs` explore every interleaving. Nothing else in the crate
//! names `std::sync` primitives or `std::thread` directly.

#[cfg(loom)]
pub use loom::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Condvar, Mutex, MutexGuard,
    },
    thread,
};

#[cfg(not(loom))]
pub use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Condvar, Mutex, MutexGuard,
    },
    thread,
};

/// Lock a mutex, recovering the data if a panicking thread poisoned it:
/// the records behind every mutex here are only changed by code that
/// decides before it writes, so a panic cannot leave them half-changed.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Sleep the current thread (a yield under loom, which has no time): the
/// one place drivers sleep (clippy.toml bans `std::thread::sleep`
/// elsewhere, so the core and the client machines never do).
#[allow(clippy::disallowed_methods)]
pub fn sleep(duration: std::time::Duration) {
    #[cfg(loom)]
    {
        let _ = duration;
        thread::yield_now();
    }
    #[cfg(not(loom))]
    thread::sleep(duration);
}

/// Wait on `condvar` (paired with `mutex`, whose guard is passed in) for at
/// most `timeout`: a nap that a notify cuts short. Under loom, which has no
/// time, a nap is a yield: the timeout may fire at any moment, which is what
/// a model must allow for.
pub fn nap<'a, T>(
    condvar: &Condvar,
    mutex: &'a Mutex<T>,
    guard: MutexGuard<'a, T>,
    timeout: std::time::Duration,
) -> MutexGuard<'a, T> {
    #[cfg(loom)]
    {
        let _ = (condvar, timeout);
        drop(guard);
        thread::yield_now();
        lock(mutex)
    }
    #[cfg(not(loom))]
    {
        let _ = mutex;
        match condvar.wait_timeout(guard, timeout) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        }
    }
}

/// A panic's payload, carried from the thread it happened on to the one
/// that resumes it.
pub type Panic = Box<dyn std::any::Any + Send>;

/// Run `f`, catching a panic. The drivers run store calls on threads (and
/// tasks) of their own and wait for the answer: a call that panicked sends
/// its panic instead, which the driver resumes where its caller sees it,
/// rather than waiting forever.
pub fn caught<R>(f: impl FnOnce() -> R) -> Result<R, Panic> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
}

/// What a panic said (its message, if it was text), for a failed job.
pub fn panic_text(payload: &Panic) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}
