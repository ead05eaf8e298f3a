//! Injected clocks. The core never reads time; stores read a [`Clock`] once
//! per transaction and clients read one for their local deadlines.

use crate::sync::{Arc, AtomicU64, Ordering};
use std::fmt;

/// A source of milliseconds. Implementations must be cheap and thread-safe.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current reading, in milliseconds since the clock's own origin.
    fn now_ms(&self) -> u64;

    /// A reading for measuring how long a call has been retrying (the
    /// client's busy timeout), where no rule's safety depends on it: it
    /// may lag [`Clock::now_ms`] by a few milliseconds, count from another
    /// origin and stop while the machine is suspended, if that makes it
    /// cheaper. By default, [`Clock::now_ms`].
    fn retry_ms(&self) -> u64 {
        self.now_ms()
    }
}

/// Wall-clock time: milliseconds since the Unix epoch. It can step forward
/// or back (NTP, an operator); use it only where time must be shared
/// between machines.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    // The one place wall time is read (clippy.toml bans it elsewhere).
    #[allow(clippy::disallowed_methods)]
    fn now_ms(&self) -> u64 {
        let now = std::time::SystemTime::now();
        match now.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            Err(_) => 0,
        }
    }
}

/// Monotonic time: milliseconds since this clock was created. Immune to
/// wall-clock steps; the default for the in-memory store.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    /// `CLOCK_MONOTONIC`'s reading, in ms, when this clock was made.
    origin_ms: u64,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        MonotonicClock {
            origin_ms: read_ms(libc::CLOCK_MONOTONIC),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        read_ms(libc::CLOCK_MONOTONIC).saturating_sub(self.origin_ms)
    }
}

/// One of the kernel's clocks (`clock_gettime(2)`) in milliseconds; the
/// one place the client's and the stores' monotonic time is read (through
/// `libc`: `Instant`'s arithmetic costs more than the read, a few times a
/// lease pair).
fn read_ms(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1000).saturating_add(nanos / 1_000_000)
}

/// A clock that moves only when told to: for tests and the simulator.
/// Clones share the same reading.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now_ms: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        ManualClock {
            now_ms: Arc::new(AtomicU64::new(now_ms)),
        }
    }

    /// Set the reading (it may go backwards, to test clock steps).
    pub fn set(&self, now_ms: u64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }

    /// Move the reading forward by `delta_ms`.
    pub fn advance(&self, delta_ms: u64) {
        self.now_ms.fetch_add(delta_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

/// The machine's boot-time clock (`CLOCK_BOOTTIME`) in milliseconds:
/// monotonic, counting time spent suspended, and the same for every process
/// on the machine. Immune to wall-clock steps; it restarts at each boot,
/// which stores detect with [`boot_id`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BootClock;

impl Clock for BootClock {
    fn now_ms(&self) -> u64 {
        read_ms(libc::CLOCK_BOOTTIME)
    }

    /// `CLOCK_MONOTONIC_COARSE`: the kernel's last tick (a few ms behind;
    /// it stops while the machine is suspended), read without the
    /// hardware counter, at a fraction of the cost. A retried store call
    /// (a release, a renewal, a job's) reads it at its start and after
    /// each failure.
    fn retry_ms(&self) -> u64 {
        read_ms(libc::CLOCK_MONOTONIC_COARSE)
    }
}

/// This boot's identity (`/proc/sys/kernel/random/boot_id`), if the kernel
/// provides one.
#[doc(hidden)]
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}
