//! Wake-ups across the processes of one machine, for the stores that have
//! no server to announce them (SQLite, the file store): a *doorbell*, a
//! small file beside the store (`PATH-wake` beside a SQLite database,
//! `wake` in a lease directory) that every process opening the store maps
//! into its memory.
//!
//! # State
//! 64 bytes, zeroes when new. For each [`Wake`] `i`, two 32-bit words: the
//! event's epoch at byte `8 * i` and the number of sleepers at `8 * i + 4`.
//!
//! # Transitions
//! - **ring** (a transaction that raised `i` committed): the epoch goes up
//!   by one, then, if anyone sleeps, `FUTEX_WAKE` wakes every sleeper on
//!   the epoch's word.
//! - **wait** (with the epoch the caller read *before* it looked at the
//!   store): sleepers + 1; while the epoch is still the one read,
//!   `FUTEX_WAIT_BITSET` on its word until the timeout, under the
//!   process's bit; sleepers - 1.
//! - **interrupt** (a waiter of this process is ending): `FUTEX_WAKE_BITSET`
//!   of this process's bit, the epoch unchanged: its sleepers return and
//!   look again (or go).
//!
//! # Invariants
//! A ring is never missed by a waiter that read the epoch before the ring:
//! the ringer writes the epoch then reads the sleepers, the waiter writes
//! the sleepers then reads the epoch (both sequentially consistent), so
//! either the ringer sees the sleeper and wakes it, or the waiter sees the
//! new epoch and does not sleep; `FUTEX_WAIT` compares the word with the
//! epoch inside the kernel, atomically with going to sleep. The kernel
//! keys a futex on a shared file mapping by inode and offset, so every
//! process that maps the file sleeps on the same word.
//!
//! # Failure
//! Waking is an optimization, never a rule: callers re-check the store and
//! still poll. A process killed asleep leaves its sleeper count behind, so
//! ringers make a `FUTEX_WAKE` call nobody needed (harmless). A doorbell
//! that cannot be made (a read-only directory, a file another user owns)
//! leaves the store with in-process wake-ups only ([`Bell`]). The file is
//! written with zeroes before it is mapped, so the mapping never touches a
//! hole that a full disk could not fill.

// This module's job is shared memory and system calls beside a store.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use crate::core::Wake;
use crate::store::Epochs;
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Bytes of the doorbell file (two words per event, room to spare).
const SIZE: usize = 64;

/// A mapped doorbell file; see the module docs.
pub(crate) struct Doorbell {
    map: NonNull<AtomicU32>,
}

// SAFETY: the mapping is only ever accessed through atomics, and stays
// mapped until the doorbell is dropped.
unsafe impl Send for Doorbell {}
// SAFETY: as above.
unsafe impl Sync for Doorbell {}

impl std::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Doorbell").finish_non_exhaustive()
    }
}

impl Doorbell {
    /// Open (creating, zeroed, if needed) and map the doorbell at `path`.
    pub(crate) fn open(path: &Path) -> std::io::Result<Doorbell> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let fd = file.as_raw_fd();
        // One process zeroes a new file; the others wait for it (flock),
        // then find it long enough.
        // SAFETY: flock on a file descriptor we own.
        if unsafe { libc::flock(fd, libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let len = file.metadata()?.len();
        let zeroed = if len < SIZE as u64 {
            file.write_all_at(&[0; SIZE], 0)
        } else {
            Ok(())
        };
        // SAFETY: as above (closing the file would drop the lock anyway).
        unsafe { libc::flock(fd, libc::LOCK_UN) };
        zeroed?;
        // SAFETY: a shared mapping of SIZE bytes of a file that has them;
        // the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let map =
            NonNull::new(ptr.cast::<AtomicU32>()).ok_or_else(std::io::Error::last_os_error)?;
        Ok(Doorbell { map })
    }

    /// Word `n` of the mapping (`n < SIZE / 4`).
    fn word(&self, n: usize) -> &AtomicU32 {
        debug_assert!(n < SIZE / 4);
        // SAFETY: the mapping holds SIZE / 4 aligned 32-bit words (mmap
        // returns page-aligned memory) and lives as long as `self`.
        unsafe { &*self.map.as_ptr().add(n) }
    }

    fn epoch_word(&self, wake: Wake) -> &AtomicU32 {
        self.word(2 * wake.index())
    }

    fn sleepers(&self, wake: Wake) -> &AtomicU32 {
        self.word(2 * wake.index() + 1)
    }

    /// The epoch of `wake`: it changes whenever a process rings it.
    pub(crate) fn epoch(&self, wake: Wake) -> u64 {
        u64::from(self.epoch_word(wake).load(Ordering::SeqCst))
    }

    /// A committed transaction raised the events marked in `woke`.
    pub(crate) fn ring(&self, woke: [bool; 2]) {
        for wake in Wake::ALL {
            if !woke[wake.index()] {
                continue;
            }
            let word = self.epoch_word(wake);
            word.fetch_add(1, Ordering::SeqCst);
            if self.sleepers(wake).load(Ordering::SeqCst) > 0 {
                // Every sleeper, whatever its bit.
                futex(word, libc::FUTEX_WAKE, i32::MAX as u32, None, 0);
            }
        }
    }

    /// Wake this process's sleepers on `wake` with no event: they find
    /// the epoch unchanged and look again or go. Each process sleeps under
    /// a bit of its own ([`process_bit`]), so only this process's sleepers
    /// wake, and those of the processes that share its bit (one in 32).
    pub(crate) fn interrupt(&self, wake: Wake) {
        if self.sleepers(wake).load(Ordering::SeqCst) > 0 {
            futex(
                self.epoch_word(wake),
                libc::FUTEX_WAKE_BITSET,
                i32::MAX as u32,
                None,
                process_bit(),
            );
        }
    }

    /// Sleep until the epoch of `wake` differs from `epoch` or `timeout`
    /// passes; true if it differs.
    pub(crate) fn wait(&self, wake: Wake, epoch: u64, timeout: Duration) -> bool {
        let word = self.epoch_word(wake);
        // Epochs are 32-bit words: compare what the caller was given.
        let seen = epoch as u32;
        if word.load(Ordering::SeqCst) != seen {
            return true;
        }
        let sleepers = self.sleepers(wake);
        sleepers.fetch_add(1, Ordering::SeqCst);
        if word.load(Ordering::SeqCst) == seen {
            // One sleep: a signal or a spurious return ends it early, and
            // the caller looks again (waking is never a rule).
            // Under this process's bit, so that `interrupt` can wake it
            // alone.
            futex(
                word,
                libc::FUTEX_WAIT_BITSET,
                seen,
                Some(deadline(timeout)),
                process_bit(),
            );
        }
        sleepers.fetch_sub(1, Ordering::SeqCst);
        word.load(Ordering::SeqCst) != seen
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, unmapped once.
        unsafe { libc::munmap(self.map.as_ptr().cast(), SIZE) };
    }
}

/// This process's bit among a doorbell's sleepers (its pid modulo 32).
fn process_bit() -> u32 {
    1 << (std::process::id() % 32)
}

/// `timeout` from now on `CLOCK_MONOTONIC`: the absolute deadline that
/// `FUTEX_WAIT_BITSET` takes.
#[allow(clippy::unnecessary_cast)] // `time_t` and `c_long` are i32 on some targets
fn deadline(timeout: Duration) -> libc::timespec {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the current time into `now`, which outlives the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let nanos = i64::from(timeout.subsec_nanos()) + now.tv_nsec as i64;
    let secs = (now.tv_sec as i64)
        .saturating_add(i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX / 2))
        .saturating_add(nanos / 1_000_000_000);
    libc::timespec {
        tv_sec: secs as libc::time_t,
        tv_nsec: (nanos % 1_000_000_000) as libc::c_long,
    }
}

/// One `futex(2)` call on a word of a shared mapping (no private flag:
/// other processes wait on the same word); `bits` is the bitset of the
/// `_BITSET` operations.
fn futex(word: &AtomicU32, op: libc::c_int, val: u32, ts: Option<libc::timespec>, bits: u32) {
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a valid, aligned 32-bit word for the call's
    // duration; the deadline (absolute, for FUTEX_WAIT_BITSET) outlives it. The
    // result is ignored on purpose: a wake that fails or a wait that ends
    // early only makes the caller look again.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op,
            val,
            ts_ptr,
            std::ptr::null::<u32>(),
            bits,
        );
    }
}

/// How a store delivers its wake-ups: across processes through a doorbell
/// when it has one, else to its own process's waiters only.
#[derive(Debug)]
pub(crate) enum Bell {
    /// Every process that opened the store.
    Shared(Doorbell),
    /// This process only (other processes poll).
    Local(Epochs),
}

impl Bell {
    /// The doorbell at `path`, or in-process wake-ups if it cannot be made
    /// (a read-only directory, a file of another user).
    pub(crate) fn at(path: &Path) -> Bell {
        match Doorbell::open(path) {
            Ok(bell) => Bell::Shared(bell),
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "no doorbell: wake-ups stay in this process");
                Bell::Local(Epochs::default())
            }
        }
    }

    /// Whether other processes hear this bell.
    pub(crate) fn is_shared(&self) -> bool {
        matches!(self, Bell::Shared(_))
    }

    /// See [`Doorbell::ring`].
    pub(crate) fn ring(&self, woke: [bool; 2]) {
        match self {
            Bell::Shared(d) => d.ring(woke),
            Bell::Local(e) => e.raise(woke),
        }
    }

    /// See [`crate::Store::epoch`].
    pub(crate) fn epoch(&self, wake: Wake) -> u64 {
        match self {
            Bell::Shared(d) => d.epoch(wake),
            Bell::Local(e) => e.epoch(wake),
        }
    }

    /// See [`crate::Store::interrupt_waits`].
    pub(crate) fn interrupt(&self, wake: Wake) {
        match self {
            Bell::Shared(d) => d.interrupt(wake),
            Bell::Local(e) => e.interrupt(),
        }
    }

    /// See [`crate::Store::wait_epoch`].
    pub(crate) fn wait(&self, wake: Wake, epoch: u64, timeout: Duration) -> bool {
        match self {
            Bell::Shared(d) => d.wait(wake, epoch, timeout),
            Bell::Local(e) => e.wait(wake, epoch, timeout),
        }
    }
}
