//! Fork detection. Every handle (client, lease guard, claimed job, store
//! connection) carries a [`ForkGuard`] taken where it was created. In a
//! forked child the guard reports [`Error::Forked`], and handles' `Drop`
//! does nothing there, so a child never renews, releases or completes its
//! parent's lease or claim, nor closes its parent's connection (L5).
//!
//! Detection is two loads, cheap enough for every operation:
//! - a process-wide generation counter bumped by a `pthread_atfork` child
//!   handler (children made through libc's `fork`);
//! - on Linux, a word in a page the kernel gives every child zeroed
//!   (`MADV_WIPEONFORK`, Linux 4.14), however the child was made: also a raw
//!   `fork` or `clone` system call that skips the handlers. The first guard
//!   made in a process writes its pid there; a guard is at home while the
//!   word holds its pid. Where the page cannot be had (another OS, an older
//!   kernel), the strict checks compare pids with a system call instead.
//!
//! This is process-global state set across a fork, so it uses std's atomics
//! directly; loom cannot model `fork`.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Once, OnceLock};

static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);
static REGISTER: Once = Once::new();

extern "C" fn on_fork_child() {
    FORK_GENERATION.fetch_add(1, Ordering::SeqCst);
}

fn register() {
    REGISTER.call_once(|| {
        // SAFETY: the handler only performs an atomic increment, which is
        // async-signal-safe and allowed in an atfork child handler.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(on_fork_child)) };
        // A failed registration (ENOMEM) leaves the pid check in force.
        let _ = rc;
    });
}

/// The word the kernel zeroes in every child, if this system gives one.
fn home_word() -> Option<&'static AtomicU64> {
    static WORD: OnceLock<Option<&'static AtomicU64>> = OnceLock::new();
    *WORD.get_or_init(wiped_on_fork)
}

#[cfg(target_os = "linux")]
fn wiped_on_fork() -> Option<&'static AtomicU64> {
    // SAFETY: sysconf has no preconditions.
    let size = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
    // SAFETY: a fresh private anonymous mapping, aligned to a page, which
    // nothing else refers to; it is never unmapped once handed out, so the
    // reference lives as long as the process.
    unsafe {
        let page = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if page == libc::MAP_FAILED {
            return None;
        }
        if libc::madvise(page, size, libc::MADV_WIPEONFORK) != 0 {
            libc::munmap(page, size);
            return None;
        }
        Some(&*page.cast::<AtomicU64>())
    }
}

#[cfg(not(target_os = "linux"))]
fn wiped_on_fork() -> Option<&'static AtomicU64> {
    None
}

/// Remembers the process a handle was created in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForkGuard {
    generation: u64,
    pid: u32,
}

impl ForkGuard {
    /// A guard for the current process.
    pub fn new() -> Self {
        register();
        let pid = std::process::id();
        if let Some(word) = home_word() {
            // The first guard of this process (or of this child: the word
            // came zeroed) writes the pid; later ones find it there.
            let _ = word.compare_exchange(0, u64::from(pid), Ordering::AcqRel, Ordering::Acquire);
        }
        ForkGuard {
            generation: FORK_GENERATION.load(Ordering::SeqCst),
            pid,
        }
    }

    /// Whether we are still in the process that created the guard: no
    /// fork through libc since, and (where the kernel gives the
    /// wiped-on-fork word) no fork of any kind. Two atomic loads.
    pub fn is_origin(&self) -> bool {
        FORK_GENERATION.load(Ordering::Acquire) == self.generation
            && home_word().is_none_or(|w| w.load(Ordering::Acquire) == u64::from(self.pid))
    }

    /// [`ForkGuard::is_origin`], and where there is no wiped-on-fork word a
    /// pid comparison (a system call) as well: for the calls that release
    /// or settle, and `Drop`.
    pub fn is_origin_strict(&self) -> bool {
        self.is_origin() && (home_word().is_some() || std::process::id() == self.pid)
    }

    /// `Ok` in the creating process, [`Error::Forked`] elsewhere.
    pub fn check(&self) -> Result<()> {
        if self.is_origin() {
            Ok(())
        } else {
            Err(Error::Forked {
                created_pid: self.pid,
                current_pid: std::process::id(),
            })
        }
    }
}

impl ForkGuard {
    /// Like [`ForkGuard::check`], with the pid comparison of
    /// [`ForkGuard::is_origin_strict`]: for calls that release or settle.
    pub fn check_strict(&self) -> Result<()> {
        if self.is_origin_strict() {
            Ok(())
        } else {
            Err(Error::Forked {
                created_pid: self.pid,
                current_pid: std::process::id(),
            })
        }
    }
}

impl Default for ForkGuard {
    fn default() -> Self {
        Self::new()
    }
}
