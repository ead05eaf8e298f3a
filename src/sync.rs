//! The synchronization primitives everything shared between threads uses:
//! std's normally, loom's under `RUSTFLAGS="--cfg loom"` so the loom models
//! in `tests/loom.rs` explore every interleaving. Nothing else in the crate
//! names `std::sync` primitives or `std::thread` directly.

#[cfg(loom)]
pub use loom::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Condvar, Mutex, MutexGuard,
    },
    thread,
};

#[cfg(not(loom))]
pub use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
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

/// Sleep the current thread (a yield under loom, which has no time).
pub fn sleep(duration: std::time::Duration) {
    #[cfg(loom)]
    {
        let _ = duration;
        thread::yield_now();
    }
    #[cfg(not(loom))]
    thread::sleep(duration);
}
