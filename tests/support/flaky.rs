//! A store that fails transiently a given number of times, then works.
//! (`Arc<Flaky>` is a store too, so tests can change the count later.)

#![allow(dead_code)] // each test binary uses some of this

use leasehold::core::Txn;
use leasehold::{Error, LostReason, MemStore, Store};
use std::sync::atomic::{AtomicUsize, Ordering};

pub struct Flaky {
    pub inner: MemStore,
    pub failures_left: AtomicUsize,
}

impl Flaky {
    /// Over `inner`, failing the next `failures` transactions.
    pub fn new(inner: MemStore, failures: usize) -> Flaky {
        Flaky {
            inner,
            failures_left: AtomicUsize::new(failures),
        }
    }

    /// Fail every transaction from now on (`true`) or none (`false`).
    pub fn failing(&self, on: bool) {
        let n = if on { usize::MAX } else { 0 };
        self.failures_left.store(n, Ordering::SeqCst);
    }
}

impl Store for Flaky {
    fn transact(
        &self,
        f: &mut dyn FnMut(&mut dyn Txn) -> leasehold::Result<()>,
    ) -> leasehold::Result<()> {
        if self
            .failures_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Error::transient("testing", "SQLITE_BUSY (injected)"));
        }
        self.inner.transact(f)
    }
    fn describe(&self) -> String {
        "flaky".into()
    }
}

/// Whether `r` reports a loss at the local deadline (what a guard lost
/// while the store was out of reach says when released).
pub fn lost_at_the_deadline<T>(r: &leasehold::Result<T>) -> bool {
    matches!(
        r,
        Err(Error::Lost {
            reason: LostReason::LocalDeadline,
            ..
        })
    )
}

/// A store whose transactions panic while `armed` (a bug in a store, or in
/// something it calls): the drivers must not hang waiting for an answer
/// that never comes.
pub struct Panicky {
    pub inner: MemStore,
    pub armed: std::sync::atomic::AtomicBool,
    /// [`Panicky::arm_once_gated`]: the next transaction waits for
    /// [`Panicky::open_gate`], then panics; the ones after it work.
    once: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    gate: std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>,
    /// Transactions begun after the one-shot panic.
    pub after_panic: AtomicUsize,
    panicked: std::sync::atomic::AtomicBool,
    /// A transaction armed by `arm_once_gated` waits at the gate.
    at_gate: std::sync::atomic::AtomicBool,
}

impl Panicky {
    pub fn new(inner: MemStore) -> Panicky {
        Panicky {
            inner,
            armed: std::sync::atomic::AtomicBool::new(false),
            once: std::sync::Mutex::new(None),
            gate: std::sync::Mutex::new(None),
            after_panic: AtomicUsize::new(0),
            panicked: std::sync::atomic::AtomicBool::new(false),
            at_gate: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// The next transaction waits until [`Panicky::open_gate`] and then
    /// panics; later ones work (so whatever runs after it is seen).
    pub fn arm_once_gated(&self) {
        let (tx, rx) = std::sync::mpsc::channel();
        *self.gate.lock().unwrap() = Some(tx);
        *self.once.lock().unwrap() = Some(rx);
    }

    /// Wait (up to 10 s, else panic) until a transaction armed by
    /// [`Panicky::arm_once_gated`] waits at the gate.
    pub fn wait_at_gate(&self) {
        let since = std::time::Instant::now();
        while !self.at_gate.load(Ordering::SeqCst) {
            let waited = since.elapsed();
            assert!(waited.as_secs() < 10, "nothing reached the gate");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    pub fn open_gate(&self) {
        if let Some(tx) = self.gate.lock().unwrap().take() {
            let _ = tx.send(());
        }
    }
}

impl Store for Panicky {
    fn transact(
        &self,
        f: &mut dyn FnMut(&mut dyn Txn) -> leasehold::Result<()>,
    ) -> leasehold::Result<()> {
        assert!(
            !self.armed.load(Ordering::SeqCst),
            "the store panicked (injected)"
        );
        if self.panicked.load(Ordering::SeqCst) {
            self.after_panic.fetch_add(1, Ordering::SeqCst);
        }
        let once = self.once.lock().unwrap().take();
        if let Some(gate) = once {
            self.at_gate.store(true, Ordering::SeqCst);
            let _ = gate.recv();
            self.at_gate.store(false, Ordering::SeqCst);
            self.panicked.store(true, Ordering::SeqCst);
            panic!("the store panicked once (injected)");
        }
        self.inner.transact(f)
    }
    fn describe(&self) -> String {
        "panicky".into()
    }
}

/// Run `f` on a thread of its own and say how it ended within `limit`:
/// `Some(Ok)` returned, `Some(Err(message))` panicked, `None` still running
/// (a hang: the thread is left behind).
pub fn ends_within<R: Send + 'static>(
    limit: std::time::Duration,
    f: impl FnOnce() -> R + Send + 'static,
) -> Option<Result<R, String>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
            p.downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default()
        });
        let _ = tx.send(r);
    });
    rx.recv_timeout(limit).ok()
}
