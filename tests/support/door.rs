//! A store whose transactions, while armed, wait at its door until a
//! second one arrives (or a second passes): two acquires that both got
//! past the client's own check meet in the store.

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
