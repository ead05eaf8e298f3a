//! Fork detection. Every handle (client, lease guard, claimed job, store
//! connection) carries a [`ForkGuard`] taken where it was created. In a
//! forked child the guard reports [`Error::Forked`], and handles' `Drop`
//! does nothing there, so a child never renews, releases or completes its
//! parent's lease or claim, nor closes its parent's connection (L5).
//!
//! Detection is a process-wide generation counter bumped by a
//! `pthread_atfork` child handler: one atomic load per check, cheap enough
//! for every operation. `Drop` also compares pids, which catches a child made
//! by a raw `fork` syscall that skips the handlers. The counter is process-global state set from a fork handler,
//! so it uses std's atomics directly; loom cannot model `fork`.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

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
        ForkGuard {
            generation: FORK_GENERATION.load(Ordering::SeqCst),
            pid: std::process::id(),
        }
    }

    /// Whether we are still in the process that created the guard (no
    /// fork through libc since). One atomic load.
    pub fn is_origin(&self) -> bool {
        FORK_GENERATION.load(Ordering::Acquire) == self.generation
    }

    /// [`ForkGuard::is_origin`] plus a pid comparison (a system call): for
    /// `Drop` and other cold paths.
    pub fn is_origin_strict(&self) -> bool {
        self.is_origin() && std::process::id() == self.pid
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
