//! A store whose transactions, while armed, wait at its door until a
//! second one arrives (or a second passes): two acquires that both got
//! past the client's own check meet in the store. And one that holds a
//! transaction back until the test lets it go ([`Valve`]).

#![allow(dead_code)] // each test binary uses some of these

use leasehold::core::Txn;
use leasehold::{MemStore, Store};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

pub struct Door {
    inner: MemStore,
    armed: AtomicBool,
    inside: Mutex<usize>,
    arrived: Condvar,
}

impl Door {
    /// An armed door over a fresh mem store.
    pub fn armed() -> Arc<Door> {
        Arc::new(Door {
            inner: MemStore::new(),
            armed: AtomicBool::new(true),
            inside: Mutex::new(0),
            arrived: Condvar::new(),
        })
    }

    /// Let every transaction through at once from now on.
    pub fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }
}

impl Store for Door {
    fn transact(
        &self,
        f: &mut dyn FnMut(&mut dyn Txn) -> leasehold::Result<()>,
    ) -> leasehold::Result<()> {
        if self.armed.load(Ordering::SeqCst) {
            let mut inside = self.inside.lock().unwrap();
            *inside += 1;
            self.arrived.notify_all();
            let _ = self
                .arrived
                .wait_timeout_while(inside, Duration::from_secs(1), |n| *n < 2)
                .unwrap();
        }
        self.inner.transact(f)
    }
    fn describe(&self) -> String {
        "door".into()
    }
}

/// A store that, once told to, holds the next transaction back until it
/// is let go: a request left in flight while the test looks around.
pub struct Valve {
    inner: MemStore,
    state: Mutex<(bool, bool)>, // (hold the next one, one is held)
    changed: Condvar,
}

impl Valve {
    pub fn new() -> Arc<Valve> {
        Arc::new(Valve {
            inner: MemStore::new(),
            state: Mutex::new((false, false)),
            changed: Condvar::new(),
        })
    }

    /// Hold the next transaction back until [`Valve::open`].
    pub fn hold_next(&self) {
        self.state.lock().unwrap().0 = true;
    }

    /// Wait until a transaction is held back (false after 5 s).
    pub fn wait_held(&self) -> bool {
        let state = self.state.lock().unwrap();
        let (state, _) = self
            .changed
            .wait_timeout_while(state, Duration::from_secs(5), |s| !s.1)
            .unwrap();
        state.1
    }

    /// Let the held transaction go.
    pub fn open(&self) {
        let mut state = self.state.lock().unwrap();
        *state = (false, false);
        self.changed.notify_all();
    }
}

impl Store for Valve {
    fn transact(
        &self,
        f: &mut dyn FnMut(&mut dyn Txn) -> leasehold::Result<()>,
    ) -> leasehold::Result<()> {
        let mut state = self.state.lock().unwrap();
        if state.0 && !state.1 {
            state.1 = true;
            self.changed.notify_all();
            let _state = self.changed.wait_while(state, |s| s.1).unwrap();
        } else {
            drop(state);
        }
        self.inner.transact(f)
    }
    fn describe(&self) -> String {
        "valve".into()
    }
}
